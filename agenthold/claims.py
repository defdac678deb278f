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
import secrets
import time
from collections.abc import Callable
from typing import Any

from agenthold.claim_schema import (
    _AGENT_ROW,
    _ALIASES,
    _CLAIM_ROW,
    _EVENT,
    _EVENT_BY,
    _FREE,
    CLAIM_CHANGES,
    CLAIMS_LOCK,
    CLAIMS_SCHEMA,
    agent_topic,
    resource_topic,
)
from agenthold.claim_types import (
    AGENT_ID_RE,
    LAPSE_OUTCOMES,
    MAX_AGENT_NAME,
    MAX_MODEL,
    MAX_PURPOSE,
    OUTCOMES,
    Agent,
    ClaimInfo,
    ClaimResult,
    ForeignAgentError,
    Holder,
    NotHolderError,
    Previous,
    Registration,
    ReleaseResult,
    StatusResult,
    UnknownAgentError,
    WaitProbe,
    WaitResult,
)
from agenthold.store import (
    MAX_WAIT_SECONDS,
    AgentholdError,
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

__all__ = [  # the records and schema are re-exported: agenthold.claims names them all
    "AGENT_ID_RE",
    "CLAIMS_SCHEMA",
    "LAPSE_OUTCOMES",
    "MAX_AGENT_NAME",
    "MAX_MODEL",
    "MAX_PURPOSE",
    "OUTCOMES",
    "Agent",
    "ClaimInfo",
    "ClaimResult",
    "Coordinator",
    "ForeignAgentError",
    "Holder",
    "NotHolderError",
    "Previous",
    "Registration",
    "ReleaseResult",
    "StatusResult",
    "UnknownAgentError",
    "WaitProbe",
    "WaitResult",
]

# Seconds: a last-seen time or lease end that would move by less than this (a lease end: by
# less than a quarter of the TTL, if that is shorter) is not rewritten, to spare writes.
RENEW_EVERY = 1.0


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


def _busy(uri: str, holder: ClaimInfo) -> ClaimResult:
    """A claim of ``uri`` while ``holder`` holds it (under another name, a hard link of the
    same file, when the holder's ``held_as`` is set)."""
    return ClaimResult("busy", uri, holder=holder.held(holder.uri if holder.uri != uri else None))


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
        self.db.add_change_source(CLAIM_CHANGES)

    # -- agents --------------------------------------------------------------------------------

    def register(
        self, name: str, model: str = "", purpose: str = "", *, principal: str | None = None
    ) -> Registration:
        """Register an agent and return its new ``agent_id``. ``principal`` (the
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
        return Registration(agent_id, name, model, at)

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
    ) -> ClaimResult:
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
                return ClaimResult("claimed", res.uri, 1)
            assert info is not None
            if info.holder == agent_id:
                return ClaimResult("already_claimed", info.uri, info.version)
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
        return ClaimResult("claimed", res.uri, version, info.previous())

    def release(
        self,
        resource: str,
        agent_id: str,
        outcome: str = "released",
        moved_to: str | None = None,
        *,
        principal: str | None = None,
    ) -> ReleaseResult:
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
                return ReleaseResult("not_found", res.uri)
            info = _claim_info(row, now)
            if info.holder != agent_id:
                if info.state == "claimed":
                    raise NotHolderError(
                        f"{info.uri} is held by {info.holder} ({info.holder_name}), not by "
                        f"{agent_id}; only the holder can release it"
                    )
                ended = None
                if info.last_holder == agent_id and info.last_outcome in LAPSE_OUTCOMES:
                    assert info.last_outcome is not None
                    ended = Previous(info.last_outcome, agent_id, info.last_outcome_at)
                return ReleaseResult("already_free", info.uri, info.version, ended=ended)
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
        return ReleaseResult("released", info.uri, version, outcome, target_uri or None)

    def status(self, resource: str | Resource) -> StatusResult:
        """Whether ``resource`` is "available" (with what the last holder left) or "claimed"."""
        res = resource if isinstance(resource, Resource) else self.resolver.resolve(resource)
        return self._look(res)[0]

    def _look(self, res: Resource) -> tuple[StatusResult, ClaimInfo | None]:
        """The status of ``res`` and the live claim that holds it (None if it is free)."""
        info = self.info(res)
        if info is None or info.state == "free":
            alias = _alias(self.db.fetchall, res, time.time())
            if alias is None:
                previous = None if info is None else info.previous()
                return StatusResult("available", res.uri, previous=previous), None
            info = alias
        if info.resource != res.key:
            held_as = StatusResult("claimed", res.uri, info.version, holder=info.held(info.uri))
            return held_as, info
        return StatusResult("claimed", info.uri, info.version, holder=info.held()), info

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
        """Look at ``resource`` once on behalf of a waiter (see ``wait``): its status, and the
        topics to listen to (the resource, the claim it is held under and its holder's lease)."""
        status, held = self._look(resource)
        topics = {resource_topic(resource.key)}
        if held is not None:
            assert held.holder is not None
            topics.update((resource_topic(held.resource), agent_topic(held.holder)))
        return WaitProbe(status, frozenset(topics))

    def wait(self, resource: str | Resource, timeout: float) -> WaitResult:
        """Block until ``resource`` is free ("available", with what the last holder left) or
        ``timeout`` seconds pass ("timeout", naming the holder)."""
        res = resource if isinstance(resource, Resource) else self.resolver.resolve(resource)
        seconds = check_seconds("timeout", timeout, maximum=MAX_WAIT_SECONDS)
        start = time.monotonic()
        last: list[WaitProbe] = []

        def look() -> tuple[WaitResult | None, frozenset[Topic], float | None]:
            probe = self.probe(res)
            last[:] = [probe]
            if probe.available:
                return waited(res, probe, time.monotonic() - start), probe.topics, None
            # a new holder: its lease is listened to as well, and the waiter looks again,
            # since the lease may have been cut between the look and the subscription
            return None, probe.topics, probe.lease_ends_at

        found: WaitResult | None = wait_until(self.db, look, seconds, {resource_topic(res.key)})
        if found is not None:
            return found
        return waited(res, last[0], time.monotonic() - start)

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


def waited(resource: Resource, probe: WaitProbe, elapsed: float) -> WaitResult:
    """The result of a wait for ``resource`` that ends with ``probe``, its last look."""
    status, elapsed = probe.status, round(elapsed, 3)
    if status.status == "available":
        return WaitResult("available", status.resource, elapsed, status.previous)
    return WaitResult("timeout", resource.uri, elapsed, holder=status.holder)


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
