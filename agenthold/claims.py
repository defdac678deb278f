"""Agents and resource claims, in the same database as the state store.

An agent registers once and gets an unguessable id. Before changing a resource it claims it;
afterwards it releases it with an honest outcome (modified, created, deleted, moved), which the
next claimant is told. Decisions behind it:
- Claims live in their own tables (``agents``, ``claims``, ``claim_events``), so no state-store
  write can forge or steal one. Each claim or release is one short transaction with one event row.
- A resource's ``version`` is a fencing token: it grows by one with every claim and release, also
  across expiry takeovers, and is never reused.
- One liveness mechanism: a lease per agent, stored in the database. With a claim TTL, every call
  that names the agent pushes its lease to now + TTL; a connection that ends cuts the lease to a
  grace period (``end_lease``). A claim whose holder's lease has ended is free, and every process
  agrees on it because the end time is stored. Nothing ties an agent to one connection: clients
  that start a new server process for every call keep their agent and claims.
- A lapsed lease is turned into real releases (outcome ``expired`` or ``abandoned``) the next time
  anything writes to those claims, so an agent that comes back late never silently regains them.
- Waiting is pushed through the store's change feed, like ``StateStore.watch``.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from agenthold.store import (
    MAX_WAIT_SECONDS,
    AgentholdError,
    ChangeSource,
    Component,
    InvalidInputError,
    StateStore,
    Topic,
    check_seconds,
    check_text,
    read_events,
    utc_iso,
    wait_until,
)
from agenthold.uris import Resolver, Resource

__all__ = [
    "OUTCOMES",
    "Agent",
    "ClaimInfo",
    "Coordinator",
    "ForeignAgentError",
    "NotHolderError",
    "UnknownAgentError",
    "WaitProbe",
]

Outcome = Literal["released", "modified", "created", "deleted", "moved"]
OUTCOMES: tuple[str, ...] = ("released", "modified", "created", "deleted", "moved")
LAPSE_OUTCOMES = ("expired", "abandoned")  # what a lease that ended means for its claims

MAX_AGENT_NAME = 128
MAX_MODEL = 128
MAX_PURPOSE = 1024
AGENT_ID_RE = re.compile(r"agent-[0-9a-f]{8,64}")
# Seconds: a last-seen time or lease end that would move by less than this (a lease end: by
# less than a quarter of the TTL, if that is shorter) is not rewritten, to spare writes.
RENEW_EVERY = 1.0

HINTS: dict[str, str] = {
    "modified": "The previous holder modified this resource: read it again before you change it.",
    "created": "The previous holder created this resource: read it before you change it.",
    "deleted": (
        "The previous holder deleted this resource: check whether it exists before you act on it."
    ),
    "moved": (
        "The previous holder moved this resource to {moved_to}: work on the new location "
        "(claim it) instead."
    ),
    "abandoned": (
        "The previous holder disconnected while holding this resource and did not come back: "
        "its work may be unfinished, so check the resource before you rely on it."
    ),
    "expired": (
        "The previous holder's claim expired (it made no call within the claim TTL): its work "
        "may be unfinished, so check the resource before you rely on it."
    ),
}
BUSY_HINT = (
    "Another agent holds this resource. Work on a different resource, or call agenthold_wait "
    "to be told when it is released, then claim it again."
)
TIMEOUT_HINT = (
    "The resource was not released within the timeout. Work on something else, or call "
    "agenthold_wait again with a longer timeout."
)


class UnknownAgentError(InvalidInputError):
    """The agent id was never registered here, or its agent was removed after a long idle time."""

    hint = "Call agenthold_register to get an agent_id, then use it in every call."


class ForeignAgentError(AgentholdError):
    """A caller named an agent that another principal registered. The message names neither
    the other principal nor anything about the agent."""

    hint = (
        "Use an agent_id that agenthold_register gave you, with the same token; register to "
        "get one."
    )

    def __init__(self, agent_id: str) -> None:
        super().__init__(
            f"agent_id {agent_id} belongs to another caller: only the caller that registered an "
            "agent may act as it; nothing was changed"
        )


class NotHolderError(InvalidInputError):
    """An agent tried to release a claim that another agent holds."""

    hint = "Only the holder can release a claim. Call agenthold_status to see who holds it."


@dataclass(frozen=True, slots=True)
class Agent:
    """A registered agent. ``lease_ends_at`` is unix time, or None for a lease without end."""

    agent_id: str
    name: str
    model: str
    purpose: str
    registered_at: str
    last_seen_at: str
    lease_ends_at: float | None
    lease_end_outcome: str | None
    principal: str | None = None  # the caller it was registered through, if a token said

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "agent_id": self.agent_id,
            "name": self.name,
            "model": self.model,
            "purpose": self.purpose,
            "registered_at": self.registered_at,
            "last_seen_at": self.last_seen_at,
            "lease_ends_at": None if self.lease_ends_at is None else utc_iso(self.lease_ends_at),
            "lease_end_outcome": self.lease_end_outcome,
        }
        if self.principal is not None:
            d["principal"] = self.principal
        return d


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    """A resource's claim state as of now. ``state`` is "claimed" or "free"; a claim whose
    holder's lease has ended is "free" with last_outcome "expired" or "abandoned"."""

    resource: str
    uri: str
    state: Literal["claimed", "free"]
    version: int
    holder: str | None
    holder_name: str | None
    holder_model: str | None
    claimed_at: str | None
    lease_ends_at: float | None
    last_outcome: str | None
    last_holder: str | None
    last_outcome_at: str | None
    moved_to: str | None

    def previous(self) -> dict[str, Any]:
        """The previous-outcome fields of a reply: empty unless the last holder left an outcome
        worth knowing (anything but a plain "released")."""
        if self.state != "free" or self.last_outcome in (None, "released"):
            return {}
        outcome = self.last_outcome
        assert outcome is not None
        fields: dict[str, Any] = {
            "previous_outcome": outcome,
            "previous_holder": self.last_holder,
            "previous_outcome_at": self.last_outcome_at,
        }
        if outcome == "moved":
            fields["moved_to"] = self.moved_to
        fields["hint"] = HINTS[outcome].format(moved_to=self.moved_to)
        return fields

    def to_dict(self) -> dict[str, Any]:
        return {
            "resource": self.uri,
            "state": self.state,
            "version": self.version,
            "held_by": self.holder,
            "agent_name": self.holder_name,
            "agent_model": self.holder_model,
            "claimed_at": self.claimed_at,
            "lease_ends_at": None if self.lease_ends_at is None else utc_iso(self.lease_ends_at),
            "last_outcome": self.last_outcome,
            "last_holder": self.last_holder,
            "last_outcome_at": self.last_outcome_at,
            "moved_to": self.moved_to,
        }


@dataclass(frozen=True, slots=True)
class WaitProbe:
    """One look at a resource for a waiter: the ``available`` reply (without elapsed time) if
    it is free, else who holds it, when that holder's lease ends, and the topics to listen to."""

    available: dict[str, Any] | None
    holder: str | None
    holder_name: str | None
    lease_ends_at: float | None
    topics: frozenset[Topic]


def resource_topic(key: str) -> Topic:
    return ("r", key)


def agent_topic(agent_id: str) -> Topic:
    return ("a", agent_id)


def _event_topics(row: tuple[Any, ...]) -> Iterable[Topic]:
    _, resource, agent_id = row
    return (resource_topic(resource),) if resource else (agent_topic(agent_id),)


CLAIMS_LOCK = ("claims",)  # every claim write holds it: claims take turns, on any engine

_SQLITE_V1 = """
    -- An agent's lease ends at lease_ends_at (unix seconds; NULL = no end);
    -- lease_end_outcome says what its end means.
    CREATE TABLE agents (
        agent_id           TEXT PRIMARY KEY,
        name               TEXT NOT NULL,
        model              TEXT NOT NULL,
        purpose            TEXT NOT NULL,
        registered_at      TEXT NOT NULL,
        last_seen_at       TEXT NOT NULL,
        lease_ends_at      REAL,
        lease_end_outcome  TEXT
    );

    -- One row per resource ever claimed. version is the fencing token: it grows by one with
    -- every claim and release and is never reused.
    CREATE TABLE claims (
        resource         TEXT PRIMARY KEY,
        uri              TEXT    NOT NULL,
        holder           TEXT,
        claimed_at       TEXT,
        version          INTEGER NOT NULL,
        last_outcome     TEXT,
        last_holder      TEXT,
        last_outcome_at  TEXT,
        moved_to         TEXT
    );
    CREATE INDEX claims_by_holder ON claims (holder) WHERE holder IS NOT NULL;

    -- Registrations, claims, releases and lease ends, append-only, for audit and the inspector.
    CREATE TABLE claim_events (
        id        INTEGER PRIMARY KEY,
        at        TEXT    NOT NULL,
        agent_id  TEXT    NOT NULL,
        event     TEXT    NOT NULL,
        resource  TEXT,
        uri       TEXT,
        outcome   TEXT,
        moved_to  TEXT,
        version   INTEGER
    );
"""

_POSTGRES_V1 = """
    CREATE TABLE agents (
        agent_id           TEXT COLLATE "C" PRIMARY KEY,
        name               TEXT NOT NULL,
        model              TEXT NOT NULL,
        purpose            TEXT NOT NULL,
        registered_at      TEXT COLLATE "C" NOT NULL,
        last_seen_at       TEXT COLLATE "C" NOT NULL,
        lease_ends_at      DOUBLE PRECISION,
        lease_end_outcome  TEXT
    );
    CREATE TABLE claims (
        resource         TEXT COLLATE "C" PRIMARY KEY,
        uri              TEXT COLLATE "C" NOT NULL,
        holder           TEXT COLLATE "C",
        claimed_at       TEXT,
        version          BIGINT NOT NULL,
        last_outcome     TEXT,
        last_holder      TEXT,
        last_outcome_at  TEXT,
        moved_to         TEXT
    );
    CREATE INDEX claims_by_holder ON claims (holder) WHERE holder IS NOT NULL;
    -- xid: see the store's state_history (the feed reads by writing transaction).
    CREATE TABLE claim_events (
        id        BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        at        TEXT    NOT NULL,
        agent_id  TEXT    NOT NULL,
        event     TEXT    NOT NULL,
        resource  TEXT,
        uri       TEXT,
        outcome   TEXT,
        moved_to  TEXT,
        version   BIGINT,
        xid       XID8    NOT NULL DEFAULT pg_current_xact_id()
    );
    CREATE INDEX claim_events_by_xid ON claim_events (xid);
"""

# The device and inode ("dev:ino") of a claimed file that existed when it was claimed, so that a
# claim through one hard link is seen through the others (agenthold.uris).
_V2 = """
    ALTER TABLE claims ADD COLUMN file_id TEXT;
    CREATE INDEX claims_by_file ON claims (file_id) WHERE file_id IS NOT NULL;
"""

# The principal (the caller a token names, agenthold.principals) an agent belongs to and that
# made each claim event; NULL where no token said who called.
_V3 = """
    ALTER TABLE agents ADD COLUMN principal TEXT;
    ALTER TABLE claim_events ADD COLUMN principal TEXT;
"""

CLAIMS_SCHEMA = Component(
    "claims", {"sqlite": (_SQLITE_V1, _V2, _V3), "postgresql": (_POSTGRES_V1, _V2, _V3)}
)

CLAIM_CHANGES = ChangeSource(
    name="claims",
    max_sql="SELECT max(id) FROM claim_events",
    since_sql="SELECT id, resource, agent_id FROM claim_events WHERE id > ? ORDER BY id",
    topics=_event_topics,
)

_CLAIM_ROW = (
    "SELECT c.resource, c.uri, c.holder, c.claimed_at, c.version, c.last_outcome, "
    "c.last_holder, c.last_outcome_at, c.moved_to, a.name, a.model, a.lease_ends_at, "
    "a.lease_end_outcome FROM claims AS c LEFT JOIN agents AS a ON a.agent_id = c.holder "
)
# Held claims on other names of one file (hard links): see _alias.
_ALIASES = _CLAIM_ROW + "WHERE c.file_id = ? AND c.resource != ? AND c.holder IS NOT NULL"
_AGENT_ROW = (
    "SELECT agent_id, name, model, purpose, registered_at, last_seen_at, lease_ends_at, "
    "lease_end_outcome, principal FROM agents "
)
_EVENT = (
    "INSERT INTO claim_events (at, agent_id, event, resource, uri, outcome, moved_to, version) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_EVENT_BY = (
    "INSERT INTO claim_events (at, agent_id, event, resource, uri, outcome, moved_to, version, "
    "principal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_FREE = (
    "UPDATE claims SET holder = NULL, claimed_at = NULL, version = ?, last_outcome = ?, "
    "last_holder = ?, last_outcome_at = ?, moved_to = ? WHERE resource = ?"
)


def _alias(
    fetchall: Callable[[str, tuple[Any, ...]], list[Any]],
    resource: Resource,
    now: float,
    agent_id: str | None = None,
) -> ClaimInfo | None:
    """A live claim by another agent (not ``agent_id``) on another name of ``resource``'s file.

    A claim records its file's device and inode; it counts only while the name it was taken
    under still leads to that file, so a deleted file whose inode is reused blocks nothing."""
    if resource.file_id is None:
        return None
    for row in fetchall(_ALIASES, (resource.file_id, resource.key)):
        info = _claim_info(row, now)
        if info.state != "claimed" or info.holder == agent_id:
            continue
        try:
            found = os.stat(info.resource.removeprefix("file://"))
        except (OSError, ValueError):
            continue
        if f"{found.st_dev}:{found.st_ino}" == resource.file_id:
            return info
    return None


def _claim_info(row: Any, now: float) -> ClaimInfo:
    (key, uri, holder, claimed_at, version, outcome, last_holder, outcome_at, moved_to) = row[:9]
    name, model, lease_end, lease_outcome = row[9:]
    if holder is not None and (name is None or (lease_end is not None and lease_end <= now)):
        # the holder's lease has ended (or its agent row is gone): the claim is free
        return ClaimInfo(
            key, uri, "free", version, None, None, None, None, None,
            lease_outcome or "abandoned", holder,
            utc_iso(lease_end) if lease_end is not None else claimed_at, None,
        )  # fmt: skip
    return ClaimInfo(
        key, uri, "claimed" if holder else "free", version, holder, name, model, claimed_at,
        lease_end, outcome, last_holder, outcome_at, moved_to,
    )  # fmt: skip


def _busy(uri: str, holder: ClaimInfo) -> dict[str, Any]:
    """The reply to a claim of ``uri`` while ``holder`` holds it (under another name, a hard
    link of the same file, when ``held_as`` is in the reply)."""
    reply = {
        "status": "busy",
        "resource": uri,
        "held_by": holder.holder,
        "agent_name": holder.holder_name,
        "claimed_at": holder.claimed_at,
        "hint": BUSY_HINT,
    }
    if holder.uri != uri:
        reply["held_as"] = holder.uri
    return reply


class Coordinator:
    """Register agents, claim and release resources, check and wait for them.

    ``resolver`` turns what agents type into canonical resources (by default: one workspace
    named "default" at the current directory). ``claim_ttl`` (seconds, or None for no expiry)
    is how long an agent's claims survive without a call that names the agent.
    """

    def __init__(
        self,
        store: StateStore,
        *,
        resolver: Resolver | None = None,
        claim_ttl: float | None = None,
    ) -> None:
        self.store = store
        self.db = store.db
        self.resolver = resolver if resolver is not None else Resolver()
        if claim_ttl is not None:
            claim_ttl = check_seconds("claim_ttl", claim_ttl, maximum=10 * 365 * 86400)
            if claim_ttl <= 0:
                raise InvalidInputError(f"claim_ttl must be more than 0 seconds, got {claim_ttl}")
        self.claim_ttl = claim_ttl
        # read-only, a database that only a store ever used has no claims tables: nothing to read
        self._tables = self.db.ensure(CLAIMS_SCHEMA, required=False) > 0
        if self._tables:  # a source the change feed cannot read would stop it for every table
            self.db.add_change_source(CLAIM_CHANGES)

    # -- agents --------------------------------------------------------------------------------

    def register(
        self, name: str, model: str = "", purpose: str = "", *, principal: str | None = None
    ) -> dict[str, Any]:
        """Register an agent; returns the reply with its new ``agent_id``. ``principal`` (the
        caller, as a token names it) is who the agent belongs to from then on."""
        check_text("name", name, MAX_AGENT_NAME)
        if model:
            check_text("model", model, MAX_MODEL)
        elif not isinstance(model, str):
            raise InvalidInputError(f"model must be a string, got {type(model).__name__}")
        if purpose:
            check_text("purpose", purpose, MAX_PURPOSE)
        elif not isinstance(purpose, str):
            raise InvalidInputError(f"purpose must be a string, got {type(purpose).__name__}")
        agent_id = "agent-" + secrets.token_hex(8)
        with self.db.write() as (conn, changed):
            now = self.db.serialize(conn, CLAIMS_LOCK)
            at = utc_iso(now)
            lease = None if self.claim_ttl is None else now + self.claim_ttl
            conn.execute(
                "INSERT INTO agents (agent_id, name, model, purpose, registered_at, "
                "last_seen_at, lease_ends_at, lease_end_outcome, principal) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    agent_id,
                    name,
                    model,
                    purpose,
                    at,
                    at,
                    lease,
                    None if lease is None else "expired",
                    principal,
                ),
            )
            conn.execute(
                _EVENT_BY,
                (at, agent_id, "registered", None, None, None, None, None, principal),
            )
            changed.append(agent_topic(agent_id))
        reply: dict[str, Any] = {
            "status": "registered",
            "agent_id": agent_id,
            "name": name,
            "registered_at": at,
        }
        if model:
            reply["model"] = model
        return reply

    def agent(self, agent_id: str) -> Agent:
        """Return a registered agent; UnknownAgentError if there is none with this id."""
        _check_agent_id(agent_id)
        if not self._tables:
            raise _unknown(agent_id)
        row = self.db.fetchone(_AGENT_ROW + "WHERE agent_id = ?", (agent_id,))
        if row is None:
            raise _unknown(agent_id)
        return Agent(*row)

    def agent_names(self, conn: Any = None) -> dict[str, str]:
        """The name of every registered agent, by id (read in the snapshot ``conn`` if given)."""
        sql = "SELECT agent_id, name FROM agents"
        if not self._tables:
            return {}
        return dict(conn.execute(sql).fetchall() if conn is not None else self.db.fetchall(sql))

    def read_log(
        self, conn: Any, *, after: Any = None, limit: int | None = None
    ) -> tuple[list[Any], Any]:
        """Claim events ``(id, at, agent_id, event, uri, outcome, moved_to, version)`` in the
        snapshot ``conn``, oldest first: the last ``limit`` (``after`` None), or those
        committed after ``after``; and the position to follow from."""
        if not self._tables:
            return [], after
        return read_events(
            self.db,
            conn,
            "claim_events",
            "id, at, agent_id, event, uri, outcome, moved_to, version, principal",
            after=after,
            limit=limit,
        )

    def list_agents(self) -> list[Agent]:
        """Every registered agent, oldest registration first."""
        if not self._tables:
            return []
        return [Agent(*r) for r in self.db.fetchall(_AGENT_ROW + "ORDER BY registered_at")]

    # -- claims --------------------------------------------------------------------------------

    def claim(
        self, resource: str | Resource, agent_id: str, *, principal: str | None = None
    ) -> dict[str, Any]:
        """Claim ``resource`` for ``agent_id``: "claimed", "already_claimed" or "busy".

        With ``principal`` (the caller, as a token names it), ForeignAgentError unless the agent
        was registered through that principal; None is a trusted caller."""
        res = resource if isinstance(resource, Resource) else self.resolver.resolve(resource)
        _check_agent_id(agent_id)
        with self.db.write() as (conn, changed):
            # the database's clock, read once the lock is held: a wait for it may cross a
            # lease end, and every host must judge leases by the same clock
            now = self.db.serialize(conn, CLAIMS_LOCK)
            at = utc_iso(now)
            _check_owner(conn, agent_id, principal)
            self._touch(conn, changed, agent_id, now)
            row = conn.execute(_CLAIM_ROW + "WHERE c.resource = ?", (res.key,)).fetchone()
            info = None if row is None else _claim_info(row, now)
            if info is None or info.state == "free":
                alias = _alias(
                    lambda sql, args: conn.execute(sql, args).fetchall(), res, now, agent_id
                )
                if alias is not None:
                    return _busy(res.uri, alias)
            if row is None:
                conn.execute(
                    "INSERT INTO claims (resource, uri, holder, claimed_at, version, file_id) "
                    "VALUES (?, ?, ?, ?, 1, ?)",
                    (res.key, res.uri, agent_id, at, res.file_id),
                )
                conn.execute(
                    _EVENT_BY,
                    (at, agent_id, "claimed", res.key, res.uri, None, None, 1, principal),
                )
                changed.append(resource_topic(res.key))
                return {"status": "claimed", "resource": res.uri, "version": 1}
            assert info is not None
            if info.holder == agent_id:
                return {"status": "already_claimed", "resource": info.uri, "version": info.version}
            if info.state == "claimed":
                return _busy(info.uri, info)
            version = info.version
            if row[2] is not None:  # the holder's lease lapsed: record that release first
                version += 1
                self._record_lapse(conn, info, version)
            version += 1
            conn.execute(
                "UPDATE claims SET holder = ?, claimed_at = ?, version = ?, uri = ?, file_id = ? "
                "WHERE resource = ?",
                (agent_id, at, version, res.uri, res.file_id, res.key),
            )
            conn.execute(
                _EVENT_BY,
                (at, agent_id, "claimed", res.key, res.uri, None, None, version, principal),
            )
            changed.append(resource_topic(res.key))
        return {"status": "claimed", "resource": res.uri, "version": version, **info.previous()}

    def release(
        self,
        resource: str,
        agent_id: str,
        outcome: str = "released",
        moved_to: str | None = None,
        *,
        principal: str | None = None,
    ) -> dict[str, Any]:
        """Release ``agent_id``'s claim on ``resource`` with ``outcome``: "released",
        "already_free" or "not_found". NotHolderError if another agent holds it;
        ForeignAgentError if ``principal`` is given and the agent is not its own."""
        if outcome not in OUTCOMES:
            raise InvalidInputError(
                f"outcome must be one of {', '.join(OUTCOMES)}; got {outcome!r}"
            )
        named = self.resolver.resolve(resource, follow_links=False)
        refused: InvalidInputError | None = None
        try:
            res = self.resolver.resolve(resource)
        except InvalidInputError as exc:  # a link that appeared after the claim leads out
            res, refused = named, exc
        _check_agent_id(agent_id)
        target: Resource | None = None
        if outcome == "moved":
            if moved_to is None or moved_to == "":
                raise InvalidInputError(
                    "outcome 'moved' needs moved_to: the resource's new path or URI"
                )
            target = self.resolver.resolve(moved_to)
            if target.key == res.key:
                raise InvalidInputError(
                    f"moved_to {moved_to!r} is the released resource itself; give the new location"
                )
        elif moved_to not in (None, ""):
            raise InvalidInputError(
                f"moved_to is only for outcome 'moved' (the outcome given is {outcome!r})"
            )
        with self.db.write() as (conn, changed):
            now = self.db.serialize(conn, CLAIMS_LOCK)
            at = utc_iso(now)
            _check_owner(conn, agent_id, principal)
            self._touch(conn, changed, agent_id, now)
            row = conn.execute(_CLAIM_ROW + "WHERE c.resource = ?", (res.key,)).fetchone()
            if named.key != res.key and (row is None or row[2] != agent_id):
                # The name became a symbolic link after this agent claimed it: release the
                # claim taken under the name as written.
                held = conn.execute(_CLAIM_ROW + "WHERE c.resource = ?", (named.key,)).fetchone()
                if held is not None and held[2] == agent_id:
                    res, row = named, held
            if refused is not None and (row is None or row[2] != agent_id):
                raise refused
            if row is None:
                return {
                    "status": "not_found",
                    "resource": res.uri,
                    "hint": "No agent ever claimed this resource, so there is nothing to release.",
                }
            info = _claim_info(row, now)
            if info.holder != agent_id:
                if info.state == "claimed":
                    raise NotHolderError(
                        f"{info.uri} is held by {info.holder} ({info.holder_name}), not by "
                        f"{agent_id}; only the holder can release it"
                    )
                reply = {"status": "already_free", "resource": info.uri, "version": info.version}
                if info.last_holder == agent_id and info.last_outcome in LAPSE_OUTCOMES:
                    reply["hint"] = (
                        f"Your claim ended ({info.last_outcome}) at {info.last_outcome_at} "
                        "before this release; claim the resource again before you change it."
                    )
                else:
                    reply["hint"] = "The resource is not claimed; there is nothing to release."
                return reply
            version = info.version + 1
            target_uri = target.uri if target else None
            conn.execute(_FREE, (version, outcome, agent_id, at, target_uri, res.key))
            conn.execute(
                _EVENT_BY,
                (
                    at, agent_id, "released", res.key, res.uri, outcome, target_uri, version,
                    principal,
                ),
            )  # fmt: skip
            changed.append(resource_topic(res.key))
        reply = {"status": "released", "resource": info.uri, "version": version, "outcome": outcome}
        if target_uri:
            reply["moved_to"] = target_uri
        return reply

    def status(self, resource: str) -> dict[str, Any]:
        """Whether ``resource`` is "available" (with the previous outcome) or "claimed"."""
        res = self.resolver.resolve(resource)
        info = self.info(res)
        if info is None or info.state == "free":
            alias = _alias(self.db.fetchall, res, time.time())
            if alias is None:
                return {
                    "status": "available",
                    "resource": res.uri,
                    **(info.previous() if info else {}),
                }
            info = alias
        reply = {
            "status": "claimed",
            "resource": res.uri if info.resource != res.key else info.uri,
            "held_by": info.holder,
            "agent_name": info.holder_name,
            "agent_model": info.holder_model,
            "claimed_at": info.claimed_at,
            "version": info.version,
        }
        if info.resource != res.key:
            reply["held_as"] = info.uri
        if info.lease_ends_at is not None:
            reply["lease_ends_at"] = utc_iso(info.lease_ends_at)
        return reply

    def info(self, resource: Resource) -> ClaimInfo | None:
        """The claim state of a resolved resource, or None if it was never claimed."""
        if not self._tables:
            return None
        row = self.db.fetchone(_CLAIM_ROW + "WHERE c.resource = ?", (resource.key,))
        return None if row is None else _claim_info(row, self.db.now())

    def list_claims(self, *, include_free: bool = False) -> list[ClaimInfo]:
        """Current claims (or every resource ever claimed), sorted by URI."""
        if not self._tables:
            return []
        now = self.db.now()
        where = "" if include_free else "WHERE c.holder IS NOT NULL "
        infos = [
            _claim_info(r, now) for r in self.db.fetchall(_CLAIM_ROW + where + "ORDER BY c.uri")
        ]
        return infos if include_free else [i for i in infos if i.state == "claimed"]

    # -- waiting -------------------------------------------------------------------------------

    def probe(self, resource: Resource) -> WaitProbe:
        """Look at ``resource`` once on behalf of a waiter (see ``wait``)."""
        info = self.info(resource)
        topics = {resource_topic(resource.key)}
        if info is None or info.state == "free":
            alias = _alias(self.db.fetchall, resource, time.time())
            if alias is None:
                reply = {"status": "available", "resource": resource.uri}
                reply.update(info.previous() if info else {})
                return WaitProbe(reply, None, None, None, frozenset(topics))
            info = alias
            topics.add(resource_topic(alias.resource))
        assert info.holder is not None
        topics.add(agent_topic(info.holder))
        return WaitProbe(None, info.holder, info.holder_name, info.lease_ends_at, frozenset(topics))

    def wait(self, resource: str, timeout: float) -> dict[str, Any]:
        """Block until ``resource`` is free ("available", with ``elapsed_seconds`` and the
        previous outcome) or ``timeout`` seconds pass ("timeout", naming the holder)."""
        res = self.resolver.resolve(resource)
        seconds = check_seconds("timeout", timeout, maximum=MAX_WAIT_SECONDS)
        start = time.monotonic()
        last: list[WaitProbe] = []

        def look() -> tuple[dict[str, Any] | None, frozenset[Topic], float | None]:
            probe = self.probe(res)
            last[:] = [probe]
            if probe.available is not None:
                elapsed = round(time.monotonic() - start, 3)
                return {**probe.available, "elapsed_seconds": elapsed}, probe.topics, None
            # a new holder: its lease is listened to as well, and the waiter looks again,
            # since the lease may have been cut between the look and the subscription
            return None, probe.topics, probe.lease_ends_at

        found: dict[str, Any] | None = wait_until(self.db, look, seconds, {resource_topic(res.key)})
        if found is not None:
            return found
        return timeout_reply(res, last[0], round(time.monotonic() - start, 3))

    # -- leases --------------------------------------------------------------------------------

    def end_lease(self, agent_id: str, grace: float, outcome: str = "abandoned") -> None:
        """End ``agent_id``'s lease ``grace`` seconds from now unless it acts again first; then
        its claims are free with ``outcome``. A lease that already ends sooner is kept, and an
        agent that is gone (never registered, or reaped) is left alone."""
        _check_agent_id(agent_id)
        grace = check_seconds("grace", grace, maximum=10 * 365 * 86400)
        if outcome not in LAPSE_OUTCOMES:
            raise InvalidInputError(f"outcome must be 'abandoned' or 'expired', got {outcome!r}")
        with self.db.write() as (conn, changed):
            now = self.db.serialize(conn, CLAIMS_LOCK)
            row = conn.execute(
                "SELECT lease_ends_at FROM agents WHERE agent_id = ?", (agent_id,)
            ).fetchone()
            if row is None or (row[0] is not None and row[0] <= now + grace):
                return  # an agent that is gone has no lease to end
            conn.execute(
                "UPDATE agents SET lease_ends_at = ?, lease_end_outcome = ? WHERE agent_id = ?",
                (now + grace, outcome, agent_id),
            )
            conn.execute(
                _EVENT, (utc_iso(now), agent_id, "lease_ends", None, None, outcome, None, None)
            )
            changed.append(agent_topic(agent_id))

    def release_all(self, agent_id: str, outcome: str = "abandoned") -> list[str]:
        """Release every claim ``agent_id`` holds with ``outcome``; returns their URIs (none for
        an agent that is gone: cleaning up is idempotent)."""
        _check_agent_id(agent_id)
        if outcome not in OUTCOMES + LAPSE_OUTCOMES or outcome == "moved":
            raise InvalidInputError(f"release_all cannot use outcome {outcome!r}")
        with self.db.write() as (conn, changed):
            at = utc_iso(self.db.serialize(conn, CLAIMS_LOCK))
            rows = conn.execute(
                "SELECT resource, uri, version FROM claims WHERE holder = ? ORDER BY uri",
                (agent_id,),
            ).fetchall()
            for key, uri, version in rows:
                conn.execute(_FREE, (version + 1, outcome, agent_id, at, None, key))
                conn.execute(
                    _EVENT, (at, agent_id, "released", key, uri, outcome, None, version + 1)
                )
                changed.append(resource_topic(key))
        return [uri for _, uri, _ in rows]

    def reap_idle_agents(self, older_than: float) -> list[str]:
        """Remove agents that hold no live claim and made no call for ``older_than`` seconds;
        their ids stop working. Claims they let lapse are released first. Returns the ids."""
        older_than = check_seconds("older_than", older_than, maximum=10 * 365 * 86400)
        reaped: list[str] = []
        with self.db.write() as (conn, changed):
            now = self.db.serialize(conn, CLAIMS_LOCK)
            # last_seen_at is only rewritten once it is RENEW_EVERY old: allow for that lag, so
            # that no agent is ever reaped before older_than has passed since its last call (0
            # means "every agent not in a call right now", so it needs no allowance)
            cutoff = utc_iso(now - older_than - (RENEW_EVERY if older_than else 0))
            idle = conn.execute(
                "SELECT agent_id, lease_ends_at FROM agents WHERE last_seen_at < ?", (cutoff,)
            ).fetchall()
            for agent_id, lease_end in idle:
                lapsed = lease_end is not None and lease_end <= now
                held = conn.execute(
                    "SELECT count(*) FROM claims WHERE holder = ?", (agent_id,)
                ).fetchone()[0]
                if held and not lapsed:
                    continue
                if held:
                    self._release_lapsed(conn, changed, agent_id)
                conn.execute("DELETE FROM agents WHERE agent_id = ?", (agent_id,))
                conn.execute(
                    _EVENT, (utc_iso(now), agent_id, "reaped", None, None, None, None, None)
                )
                changed.append(agent_topic(agent_id))
                reaped.append(agent_id)
        return reaped

    # -- inside a write transaction ------------------------------------------------------------

    def _touch(self, conn: Any, changed: list[Topic], agent_id: str, now: float) -> None:
        """Check that ``agent_id`` exists and renew its lease (and last-seen time). If its lease
        had already ended, its claims are released as lapsed first, so they stay free."""
        row = conn.execute(
            "SELECT last_seen_at, lease_ends_at, lease_end_outcome FROM agents WHERE agent_id = ?",
            (agent_id,),
        ).fetchone()
        if row is None:
            raise _unknown(agent_id)
        last_seen, lease_end, lease_outcome = row
        lapsed = lease_end is not None and lease_end <= now
        if lapsed:
            self._release_lapsed(conn, changed, agent_id)
        new_end = None if self.claim_ttl is None else now + self.claim_ttl
        new_outcome = None if new_end is None else "expired"
        if (
            not lapsed
            and lease_outcome == new_outcome
            and (lease_end == new_end or _close(lease_end, new_end, self.claim_ttl))
            and last_seen >= utc_iso(now - RENEW_EVERY)
        ):
            return  # renewed a moment ago
        conn.execute(
            "UPDATE agents SET last_seen_at = ?, lease_ends_at = ?, lease_end_outcome = ? "
            "WHERE agent_id = ?",
            (utc_iso(now), new_end, new_outcome, agent_id),
        )
        if not lapsed and new_end is not None and (lease_end is None or new_end < lease_end):
            # A shorter TTL than the last renewal's (processes may differ): tell waiters, which
            # sleep until the holder's lease end they last saw.
            conn.execute(
                _EVENT, (utc_iso(now), agent_id, "lease_ends", None, None, "expired", None, None)
            )
            changed.append(agent_topic(agent_id))

    def _release_lapsed(self, conn: Any, changed: list[Topic], agent_id: str) -> None:
        rows = conn.execute(_CLAIM_ROW + "WHERE c.holder = ?", (agent_id,)).fetchall()
        for row in rows:
            info = _claim_info(row, float("inf"))  # as if now were past any lease end
            self._record_lapse(conn, info, info.version + 1)
            changed.append(resource_topic(info.resource))

    def _record_lapse(self, conn: Any, info: ClaimInfo, version: int) -> None:
        """Write the release that a lapsed lease implies (outcome "expired" or "abandoned")."""
        conn.execute(
            _FREE,
            (
                version,
                info.last_outcome,
                info.last_holder,
                info.last_outcome_at,
                None,
                info.resource,
            ),
        )
        conn.execute(
            _EVENT,
            (
                info.last_outcome_at,
                info.last_holder,
                "released",
                info.resource,
                info.uri,
                info.last_outcome,
                None,
                version,
            ),
        )


def _close(old_end: float | None, new_end: float | None, ttl: float | None) -> bool:
    """Whether a lease renewal would move the end too little to be worth a write: less than
    RENEW_EVERY, and less than a quarter of the TTL, so a short TTL is still renewed in time."""
    return (
        old_end is not None
        and new_end is not None
        and ttl is not None
        and 0 <= new_end - old_end < min(RENEW_EVERY, ttl / 4)
    )


def timeout_reply(resource: Resource, probe: WaitProbe, elapsed: float) -> dict[str, Any]:
    """The reply of a wait that timed out while ``probe.holder`` held the resource."""
    return {
        "status": "timeout",
        "resource": resource.uri,
        "held_by": probe.holder,
        "agent_name": probe.holder_name,
        "elapsed_seconds": elapsed,
        "hint": TIMEOUT_HINT,
    }


def _check_agent_id(agent_id: object) -> str:
    if not isinstance(agent_id, str):
        raise UnknownAgentError(
            f"agent_id must be a string from agenthold_register, got {type(agent_id).__name__}"
        )
    if not AGENT_ID_RE.fullmatch(agent_id):
        shown = agent_id if len(agent_id) <= 60 else agent_id[:60] + "…"
        raise UnknownAgentError(
            f"{shown!r} is not an agent_id: ids look like 'agent-1a2b3c4d5e6f7a8b' and come "
            "from agenthold_register"
        )
    return agent_id


def _check_owner(conn: Any, agent_id: str, principal: str | None) -> None:
    """ForeignAgentError if ``principal`` is not who ``agent_id`` belongs to (None: trusted).
    An unknown agent passes here; the call that follows says it is unknown."""
    if principal is None:
        return
    row = conn.execute("SELECT principal FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
    if row is not None and row[0] != principal:
        raise ForeignAgentError(agent_id)


def _unknown(agent_id: str) -> AgentholdError:
    return UnknownAgentError(
        f"unknown agent_id {agent_id!r}: it was never registered with this database, or it "
        "was removed after a long idle time; register again"
    )
