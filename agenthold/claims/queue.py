"""Shared claims and the queue of waits that claim: the rows behind ``mode="shared"`` and
``Coordinator.wait(..., claim=True)``, read and written inside the Coordinator's transactions.

Decisions behind it:
- A shared hold is a row of ``claim_shares`` per resource and agent; the resource's ``claims``
  row keeps the fencing version (each shared claim and release adds one, as any other) and the
  last outcome, with no holder. So every exclusive check in claim_rows reads as before, and an
  exclusive claim adds one look at the shares in its way, by the same coverage rules (the name
  itself, covering and covered directories and globs, other names of the same file).
- A wait that claims is a row of ``claim_waiters``; its ``seq``, given under the claims lock,
  is its place in the queue. Every claim write first serves the queue (``Coordinator._serve``):
  in arrival order, each live waiter that could claim now, and conflicts with no older waiter
  still in line, is granted. A release hands off in its own transaction; a holder's lease that
  ends is served by the next write, or by the waiters, who wake at that lease end.
- A new claim is busy behind a queued waiter it conflicts with (an exclusive one on either
  side), so a stream of new readers never starves a queued writer, and nobody jumps the line.
- A waiter is live while its ``until`` (the database's clock) is ahead, its agent's lease
  has not ended, and it is still listening: each look of the wait pushes ``alive_until``
  (``LIVENESS`` seconds ahead; a wait looks at least every ``LIVENESS / 3``), so the row of a
  process that was killed, lost its connection or left on an error dies within ``LIVENESS``.
  The others are skipped and removed by the next pass. A wait that ends, by answer, cancel or
  closed connection, removes its own row; one that times out keeps its place for its agent's
  next wait for ``LIVENESS`` seconds (``park``), handed nothing meanwhile.
- A claim handed to a row that nobody reads in time (its waiter died after its last look, or
  answered with an error) is given back by the next pass, as a cancelled wait gives back its
  own (``give_back``): nobody holds a claim it was never told of. A row whose agent's principal
  is no longer known (its token revoked) is dropped the same way.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from agenthold.claims.names import Resource
from agenthold.claims.patterns import Pattern, ancestors, overlaps
from agenthold.claims.records import (
    ClaimInfo,
    ClaimResult,
    Holder,
    Previous,
    StatusResult,
    WaitProbe,
    WaitResult,
    check_agent_id,
    check_mode,
)
from agenthold.claims.rows import TOP, Fetch, blocking, claim_info, own, pattern_of
from agenthold.claims.schema import _ACTIVITY, _EVENT_MODE, _FREE, resource_topic, write_rows
from agenthold.store import InvalidInputError, Topic, utc_iso

Target = Resource | Pattern
# Seconds a queued row stays alive past its waiter's last look. The waiter looks again at least
# every LIVENESS / 3, so a live one is never dropped for being slow to renew; a dead one holds
# its place (or a claim handed to it) for at most this long.
LIVENESS = 10.0
PrincipalLive = Callable[[str], bool]  # whether a principal (by name) may still call

_INSERT = (
    "INSERT INTO claims (resource, uri, holder, claimed_at, version, file_id, scope) "
    "VALUES (?, ?, ?, ?, 1, ?, ?)"
)
_TAKE = (
    "UPDATE claims SET holder = ?, claimed_at = ?, version = ?, uri = ?, file_id = ?, scope = ? "
    "WHERE resource = ?"
)
_BUMP = "UPDATE claims SET version = ? WHERE resource = ?"
_SHARE = (
    "INSERT INTO claim_shares (resource, agent_id, uri, claimed_at, scope, file_id) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_UNSHARE_ALL = "DELETE FROM claim_shares WHERE resource = ?"
_UNSHARE = "DELETE FROM claim_shares WHERE resource = ? AND agent_id = ?"
# The same columns as claim_schema._CLAIM_ROW (so claim_info reads them), for shared holds.
_SHARE_ROW = (
    "SELECT s.resource, s.uri, s.agent_id, s.claimed_at, c.version, c.last_outcome, "
    "c.last_holder, c.last_outcome_at, c.moved_to, a.name, a.model, a.lease_ends_at, "
    "a.lease_end_outcome, s.scope FROM claim_shares AS s JOIN claims AS c ON "
    "c.resource = s.resource LEFT JOIN agents AS a ON a.agent_id = s.agent_id "
)
_WAITER_ROW = (
    "SELECT w.seq, w.resource, w.uri, w.scope, w.file_id, w.agent_id, w.mode, w.since, w.until, "
    "w.granted, w.alive_until, w.granted_as, w.prev_outcome, w.prev_holder, w.prev_at, "
    "w.prev_moved_to, a.name, a.lease_ends_at, a.principal FROM claim_waiters AS w "
    "LEFT JOIN agents AS a ON a.agent_id = w.agent_id "
)


class Batch:
    """The rows a claim or release (of one resource or a set) writes, one statement per table,
    in an order that keeps every event after the row it reports."""

    def __init__(self) -> None:
        self.inserts: list[tuple[Any, ...]] = []
        self.updates: list[tuple[Any, ...]] = []
        self.bumps: list[tuple[Any, ...]] = []
        self.frees: list[tuple[Any, ...]] = []
        self.shares: list[tuple[Any, ...]] = []
        self.unshare_all: list[tuple[Any, ...]] = []
        self.unshare: list[tuple[Any, ...]] = []
        self.events: list[tuple[Any, ...]] = []
        self.keys: list[str] = []
        self.released: dict[str, int] = {}  # key: the version its release gave it

    def run(self, conn: Any, changed: list[Topic]) -> None:
        for sql, rows in ((_INSERT, self.inserts), (_TAKE, self.updates), (_BUMP, self.bumps),
                          (_FREE, self.frees), (_UNSHARE_ALL, self.unshare_all),
                          (_UNSHARE, self.unshare), (_SHARE, self.shares),
                          (_EVENT_MODE, self.events)):  # fmt: skip
            if not rows:
                continue
            if sql.startswith("DELETE"):  # write_rows knows INSERT and UPDATE only
                conn.executemany(sql, rows)
            else:
                write_rows(conn, sql, rows)  # one statement per table
        changed.extend(resource_topic(k) for k in self.keys)


# --------------------------------------------------------------------------------------------
# Shared holds
# --------------------------------------------------------------------------------------------


def shares_in_way(
    fetch: Fetch, target: Target, now: float, agent_id: str | None = None
) -> list[ClaimInfo]:
    """Live shared holds of agents other than ``agent_id`` (None: of anyone) that an exclusive
    claim of ``target`` would conflict with: on the name itself, on another name of the same
    file, and covering, covered or overlapping patterns."""
    rows = fetch(_SHARE_ROW + "WHERE s.resource = ?", (target.key,))
    if isinstance(target, Pattern):
        rows += fetch(
            _SHARE_ROW + "WHERE s.resource >= ? AND s.resource < ?",
            (target.scope, target.scope + TOP),
        )
        above = ancestors(target.scope)
    else:
        above = ancestors(target.key) if target.kind == "file" else []
    if above:
        marks = ", ".join("?" * len(above))
        rows += fetch(_SHARE_ROW + f"WHERE s.scope IN ({marks})", tuple(above))
    aliases = []
    if isinstance(target, Resource) and target.file_id is not None:
        aliases = fetch(
            _SHARE_ROW + "WHERE s.file_id = ? AND s.resource != ?", (target.file_id, target.key)
        )
    found: dict[tuple[str, str], ClaimInfo] = {}
    for row, alias in [(r, False) for r in rows] + [(r, True) for r in aliases]:
        info = dataclasses.replace(claim_info(row, now), mode="shared")
        assert info.holder is not None or info.state == "free"
        if info.state != "claimed" or info.holder == agent_id:
            continue
        assert info.holder is not None
        if (info.resource, info.holder) in found or not _hits(target, info, alias):
            continue
        found[(info.resource, info.holder)] = info
    # by name, then oldest reader first
    return sorted(found.values(), key=lambda i: (i.resource, i.claimed_at or "", i.holder or ""))


def _hits(target: Target, info: ClaimInfo, alias: bool) -> bool:
    if alias:  # counts only while the name it was taken under still leads to the file
        try:
            found = os.stat(info.resource.removeprefix("file://"))
        except (OSError, ValueError):
            return False
        return isinstance(target, Resource) and target.file_id == f"{found.st_dev}:{found.st_ino}"
    if info.resource == target.key:
        return True
    if info.scope is None:
        return isinstance(target, Pattern) and target.covers(info.resource)
    if isinstance(target, Pattern):
        return overlaps(target, pattern_of(info))
    return pattern_of(info).covers(target.key)


def own_share(fetch: Fetch, key: str, agent_id: str) -> bool:
    """Whether ``agent_id`` holds a shared claim on ``key`` (its lease is checked by the caller:
    every write renews it first, and releases what lapsed)."""
    return bool(
        fetch("SELECT 1 FROM claim_shares WHERE resource = ? AND agent_id = ?", (key, agent_id))
    )


def release_share(
    batch: Batch,
    version: int,
    key: str,
    uri: str,
    agent_id: str,
    outcome: str,
    moved_to: str | None,
    at: str,
    principal: str | None,
) -> None:
    """Queue the release of ``agent_id``'s shared hold on ``key`` (at the new ``version``)."""
    batch.frees.append((version, outcome, agent_id, at, moved_to, key))
    batch.unshare.append((key, agent_id))
    batch.events.append(
        (at, agent_id, "released", key, uri, outcome, moved_to, version, principal, "shared")
    )
    batch.keys.append(key)
    batch.released[key] = version


def drop_shares(conn: Any, changed: list[Topic], agent_id: str, outcome: str, at: str) -> list[str]:
    """Release every shared hold of ``agent_id`` with ``outcome`` (a lapse, or release_all);
    returns their URIs."""
    rows = conn.execute(
        "SELECT s.resource, s.uri, c.version FROM claim_shares AS s JOIN claims AS c ON "
        "c.resource = s.resource WHERE s.agent_id = ?",
        (agent_id,),
    ).fetchall()
    batch = Batch()
    for key, uri, version in rows:
        release_share(batch, version + 1, key, uri, agent_id, outcome, None, at, None)
    batch.run(conn, changed)
    return [uri for _, uri, _ in rows]


def shared_status(
    fetch: Fetch, target: Target, now: float, version: int | None
) -> tuple[StatusResult, list[ClaimInfo]] | None:
    """``target`` held shared (through its own name or a pattern): the status naming every
    reader (``holders``), and their holds; None if no reader is in its way."""
    held = shares_in_way(fetch, target, now)
    if not held:
        return None
    holders = tuple(h.held(h.uri if h.resource != target.key else None) for h in held)
    status = StatusResult(
        "claimed", target.uri, version, holder=holders[0], mode="shared", holders=holders
    )
    return status, held


# --------------------------------------------------------------------------------------------
# The queue
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Queued:
    """A wait with claim, in line: what it waits for, for whom, and until when."""

    seq: int
    target: Target
    agent_id: str
    mode: str
    since: str
    until: float  # when it changes: its deadline, or (parked) the end of its kept place
    name: str | None
    principal: str | None
    parked: bool = False  # timed out, its place kept for its agent's next wait (``park``)

    def holder(self, asked: str) -> Holder:
        held_as = None if self.target.uri == asked else self.target.uri
        return Holder(self.agent_id, self.name, None, self.since, None, held_as, self.mode, True)


def _target_of(key: str, uri: str, scope: str | None, file_id: str | None) -> Target:
    if scope is not None:
        return Pattern.from_key(uri, key, scope)
    if uri.startswith("file://"):
        workspace, path = uri[len("file://") :].split("/", 1)
        return Resource(uri, key, "file", workspace, path, file_id)
    return Resource(uri, key, "custom", None, None)


def enqueue(
    conn: Any,
    target: Target,
    agent_id: str,
    mode: str,
    now: float,
    until: float,
    liveness: float = LIVENESS,
) -> int:
    """Put a wait for ``target`` at the end of the queue, alive for ``liveness`` seconds unless
    it looks again (``renew``), or give it back the place its agent's last wait for the same
    target and mode kept (``park``); returns its seq."""
    kept = conn.execute(
        "SELECT seq FROM claim_waiters WHERE agent_id = ? AND resource = ? AND mode = ? AND "
        "granted IS NULL AND until < ? AND alive_until >= ? ORDER BY seq LIMIT 1",
        (agent_id, target.key, mode, now, now),
    ).fetchone()
    if kept is not None:  # its last wait timed out a moment ago: it takes its place back
        conn.execute(
            "UPDATE claim_waiters SET until = ?, alive_until = ? WHERE seq = ?",
            (until, now + liveness, kept[0]),
        )
        return int(kept[0])
    scope = target.scope if isinstance(target, Pattern) else None
    file_id = target.file_id if isinstance(target, Resource) else None
    row = conn.execute(
        "INSERT INTO claim_waiters (resource, uri, scope, file_id, agent_id, mode, since, until, "
        "alive_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
        (target.key, target.uri, scope, file_id, agent_id, mode, utc_iso(now), until,
         now + liveness),
    ).fetchone()  # fmt: skip
    return int(row[0])


def park(conn: Any, seq: int, now: float, keep: float) -> None:
    """The wait ``seq`` timed out: keep its place in line for ``keep`` seconds, for its agent's
    next wait (``enqueue``). Parked, it is handed nothing (nobody listens for it), but the waits
    behind it stay behind it; unclaimed, it dies like any row nobody renews."""
    conn.execute(
        "UPDATE claim_waiters SET until = ?, alive_until = ? WHERE seq = ? AND granted IS NULL",
        (now - 1.0, now + keep, seq),  # past its deadline: parked, not live (see waiting)
    )


def renew(conn: Any, seq: int, alive_until: float) -> None:
    """Keep the wait ``seq`` alive until ``alive_until``: its waiter is still listening."""
    conn.execute(
        "UPDATE claim_waiters SET alive_until = ? WHERE seq = ? AND granted IS NULL",
        (alive_until, seq),
    )


class Activity(NamedTuple):
    """Whether any wait is in the queue, whether any shared hold exists (lapsed or not), and the
    token of the held patterns (agenthold.claims.index): a claim write looks at the queue or the
    shares only when there is something to see."""

    waits: bool
    shares: bool
    patterns: str | None


def activity_of(row: Sequence[Any]) -> Activity:
    """The Activity in the three ``_ACTIVITY`` columns of ``row``."""
    waits, shares, patterns = row
    return Activity(bool(waits), bool(waits) or bool(shares), patterns)  # a hand-off may share


def activity(conn: Any) -> Activity:
    """The Activity as of now, inside a claim write."""
    return activity_of(conn.execute("SELECT " + _ACTIVITY).fetchone())


def check_wait_to_claim(agent_id: object, mode: object) -> None:
    """A wait with claim needs the agent to claim for, and a mode."""
    if agent_id is None:
        raise InvalidInputError(
            "a wait with claim needs agent_id: the agent the claim is handed to"
        )
    check_agent_id(agent_id)
    check_mode(mode)


def waiting(
    conn: Any, changed: list[Topic], now: float, live: PrincipalLive | None = None
) -> list[Queued]:
    """The live waits not yet granted, oldest first (one due now still counts: a wait of 0
    seconds gets its one look), parked ones (timed out, their place kept) included. Dead ones
    are removed: no longer renewed by their waiter (``alive_until``), their agent's lease ended
    or their agent gone, or their agent's principal no longer ``live``. A granted row nobody
    came to read in time (or whose principal is gone) gives its claim back (``give_back``) and
    is removed."""
    live_rows: list[Queued] = []
    dead: list[tuple[int]] = []
    for row in conn.execute(_WAITER_ROW + "ORDER BY w.seq").fetchall():
        if row[9] is not None:  # granted
            seq, key, uri, scope, file_id, agent_id, mode, _since, until, granted = row[:10]
            alive_until, granted_as, p_outcome, p_holder, p_at, p_moved = row[10:16]
            principal = row[18]
            alive = until if alive_until is None else alive_until
            revoked = principal is not None and live is not None and not live(principal)
            if alive < now or revoked:  # handed a claim, and its waiter never came for it
                target = _target_of(key, uri, scope, file_id)
                previous = None if p_outcome is None else Previous(p_outcome, p_holder, p_at,
                                                                   p_moved)  # fmt: skip
                got = ClaimResult(granted_as, uri, int(granted), previous)
                give_back(conn, changed, Unheard(target, agent_id, mode, principal), got,
                          utc_iso(now))  # fmt: skip
                dead.append((seq,))
            continue
        found = _queued(row, now, live)
        if found is None:
            dead.append((row[0],))
        else:
            live_rows.append(found)
    if dead:
        conn.executemany("DELETE FROM claim_waiters WHERE seq = ?", dead)
    return live_rows


def _queued(row: Sequence[Any], now: float, live: PrincipalLive | None = None) -> Queued | None:
    """A ``_WAITER_ROW`` not yet granted as a wait in line (parked, its place kept, included), or
    None when it is dead: no longer renewed by its waiter (``alive_until``), its agent's lease
    ended or its agent gone, or its agent's principal no longer ``live``."""
    seq, key, uri, scope, file_id, agent_id, mode, since, until = row[:9]
    alive_until = row[10]
    name, lease_end, principal = row[16:]
    alive = until if alive_until is None else alive_until
    revoked = principal is not None and live is not None and not live(principal)
    if alive < now or revoked or name is None or (lease_end is not None and lease_end <= now):
        return None
    parked = until < now  # its wait timed out; alive: its place is kept (``park``)
    target = _target_of(key, uri, scope, file_id)
    return Queued(seq, target, agent_id, mode, since, alive if parked else until, name, principal,
                  parked)  # fmt: skip


def conflict(a: Target, a_mode: str, b: Target, b_mode: str) -> bool:
    """Whether claims of ``a`` and ``b`` (in those modes, by two agents) cannot both be held."""
    if a_mode == b_mode == "shared":
        return False
    if isinstance(a, Pattern) and isinstance(b, Pattern):
        return a.key == b.key or overlaps(a, b)
    if isinstance(a, Pattern):
        return a.covers(b.key)
    if isinstance(b, Pattern):
        return b.covers(a.key)
    return a.key == b.key or (a.file_id is not None and a.file_id == b.file_id)


def queued_in_way(
    queue: Sequence[Queued], target: Target, mode: str, agent_id: str, before: int | None = None
) -> list[Queued]:
    """The waits in ``queue`` (before seq ``before``, if given) of other agents that a claim of
    ``target`` in ``mode`` by ``agent_id`` would jump."""
    return [
        w
        for w in queue
        if w.agent_id != agent_id
        and (before is None or w.seq < before)
        and conflict(w.target, w.mode, target, mode)
    ]


def mark_granted(
    conn: Any, seq: int, result: ClaimResult, previous: Previous | None, read_by: float
) -> None:
    """Record that the wait ``seq`` was handed its claim (``result``), for its waiter to read
    by ``read_by`` (then it goes back: see ``waiting``)."""
    p = previous or Previous("", None, None)
    conn.execute(
        "UPDATE claim_waiters SET granted = ?, granted_as = ?, prev_outcome = ?, prev_holder = ?, "
        "prev_at = ?, prev_moved_to = ?, alive_until = ? WHERE seq = ?",
        (
            result.version,
            result.status,
            p.outcome or None,
            p.holder,
            p.at,
            p.moved_to,
            read_by,
            seq,
        ),
    )


def adopt(conn: Any, agent_id: str, keys: Sequence[str]) -> None:
    """The agent's own claim of ``keys`` was just told "already_claimed": a claim its queued
    wait was handed is now one it has heard of, so that wait, cancelled, gives nothing back."""
    marks = ", ".join("?" * len(keys))
    conn.execute(
        "UPDATE claim_waiters SET granted_as = 'already_claimed' WHERE agent_id = ? AND "
        f"granted IS NOT NULL AND resource IN ({marks})",
        (agent_id, *keys),
    )


def handed(conn: Any, seq: int) -> tuple[bool, ClaimResult | None]:
    """Whether the wait ``seq`` is still in the queue, and its claim if it was granted (the row
    is then removed: the waiter has read it)."""
    row = conn.execute(
        "SELECT uri, granted, granted_as, prev_outcome, prev_holder, prev_at, prev_moved_to "
        "FROM claim_waiters WHERE seq = ?",
        (seq,),
    ).fetchone()
    if row is None:
        return False, None
    uri, version, status, outcome, holder, at, moved_to = row
    if version is None:
        return True, None
    conn.execute("DELETE FROM claim_waiters WHERE seq = ?", (seq,))
    previous = None if outcome is None else Previous(outcome, holder, at, moved_to)
    return True, ClaimResult(status, uri, int(version), previous)


def leave(conn: Any, seq: int) -> ClaimResult | None:
    """Take the wait ``seq`` out of the queue; its claim if it was granted meanwhile."""
    _, got = handed(conn, seq)
    conn.execute("DELETE FROM claim_waiters WHERE seq = ?", (seq,))
    return got


@dataclass(frozen=True, slots=True)
class Unheard:
    """A wait with claim whose caller will never read its answer (cancelled, interrupted, its
    connection closed), as the caller knows it: what it waited for, for whom, in what mode, and
    the claim a look already read for it (``got``), whose answer was lost on the way."""

    target: Target
    agent_id: str
    mode: str
    principal: str | None = None
    got: ClaimResult | None = None


def give_back(
    conn: Any, changed: list[Topic], unheard: Unheard, got: ClaimResult | None, at: str
) -> None:
    """Release the claim the queue handed to an unheard wait (``got``, read from its row just
    now, or ``unheard.got``): an agent that was never told of a claim must not hold it until its
    lease ends. It cannot have acted on it, so the release says "released", and the resource
    keeps what the holder before it left (the grant's ``previous``), which is what the next
    holder needs to hear; the version still grows. A claim the agent held before it waited
    ("already_claimed") stays, and so does one no longer held as granted (lapsed, released)."""
    got = got or unheard.got
    if got is None or got.status != "claimed":
        return
    target, agent_id, shared = unheard.target, unheard.agent_id, unheard.mode == "shared"
    row = conn.execute(
        "SELECT holder, version FROM claims WHERE resource = ?", (target.key,)
    ).fetchone()
    if row is None:
        return
    if shared:  # other readers move the version on: the agent's own hold is what counts
        held = own_share(lambda sql, args: conn.execute(sql, args).fetchall(), target.key,
                         agent_id)  # fmt: skip
    else:
        held = row[0] == agent_id and row[1] == got.version
    if not held:
        return
    batch = Batch()
    if shared:
        batch.unshare.append((target.key, agent_id))
    version, p = row[1] + 1, got.previous or Previous("", None, None)
    batch.frees.append((version, p.outcome or None, p.holder, p.at, p.moved_to, target.key))
    batch.events.append((at, agent_id, "released", target.key, target.uri, "released", None,
                         version, unheard.principal, "shared" if shared else None))  # fmt: skip
    batch.keys.append(target.key)
    batch.run(conn, changed)


def previous_of(info: ClaimInfo | None) -> Previous | None:
    """What the last holder of a resource did, a plain release included (a hand-off says it)."""
    if info is None or info.last_outcome is None:
        return None
    moved_to = info.moved_to if info.last_outcome == "moved" else None
    return Previous(info.last_outcome, info.last_holder, info.last_outcome_at, moved_to)


def waited(resource: Target, probe: WaitProbe, elapsed: float) -> WaitResult:
    """The result of a wait for ``resource`` that ends with ``probe``, its last look."""
    status, elapsed = probe.status, round(elapsed, 3)
    if status.status == "available":
        return WaitResult("available", status.resource, elapsed, status.previous)
    return WaitResult("timeout", resource.uri, elapsed, holder=status.holder)


def claim_waited(result: ClaimResult, elapsed: float) -> WaitResult:
    """The result of a wait with claim that was granted ``result``."""
    status: Literal["claimed", "already_claimed"] = (
        "already_claimed" if result.status == "already_claimed" else "claimed"
    )
    return WaitResult(
        status, result.resource, round(elapsed, 3), result.previous, version=result.version
    )


@dataclass(frozen=True, slots=True)
class QueueLook:
    """One look of a wait with claim: its seq, the claim if it was granted, whether it is
    still in line (False: it was removed, its agent's lease having ended), and what to listen
    to until the next look."""

    seq: int
    result: ClaimResult | None
    in_line: bool = True
    topics: frozenset[Topic] = frozenset()
    wake_at: float | None = None


# --------------------------------------------------------------------------------------------
# Read-only views: what a reader that never writes (the web page) is shown
# --------------------------------------------------------------------------------------------


def live_queue(fetch: Fetch, now: float) -> list[Queued]:
    """The waits in line, oldest first, as ``waiting`` finds them, but read only: the dead ones
    are passed over, not removed (the next claim write removes them)."""
    rows = fetch(_WAITER_ROW + "ORDER BY w.seq", ())
    found = (_queued(row, now) for row in rows if row[9] is None)
    return [w for w in found if w is not None]


def live_shares(fetch: Fetch, now: float) -> list[ClaimInfo]:
    """Every live shared hold, by resource, then oldest reader first."""
    rows = fetch(_SHARE_ROW + "ORDER BY s.resource, s.claimed_at, s.agent_id", ())
    infos = (dataclasses.replace(claim_info(row, now), mode="shared") for row in rows)
    return [i for i in infos if i.state == "claimed"]


@dataclass(frozen=True, slots=True)
class InTheWay:
    """What stands in the way of a claim of ``target`` in ``mode`` right now: the live claims
    (its own, aliases, covering, covered and overlapping ones, the shared holds an exclusive
    claim conflicts with) and the waits in line it would have to queue behind."""

    target: Target
    mode: str
    claims: tuple[ClaimInfo, ...]
    queue: tuple[Queued, ...]


def in_the_way(fetch: Fetch, target: Target, mode: str, now: float) -> InTheWay:
    """Every claim and wait in line that would refuse a claim of ``target`` in ``mode`` by a
    new agent now (one read: nothing is written)."""
    info = own(fetch, target, now)
    claims = [info] if info is not None and info.state == "claimed" else []
    claims += blocking(fetch, target, now)
    if mode == "exclusive":
        claims += shares_in_way(fetch, target, now)
    queue = [w for w in live_queue(fetch, now) if conflict(w.target, w.mode, target, mode)]
    return InTheWay(target, mode, tuple(claims), tuple(queue))
