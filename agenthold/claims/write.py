"""A claim write in progress (``ClaimWrite``): one transaction under the claims lock, with its
connection, its database time, the rows it has yet to write and the topics it changed, and the
decisions every claim write makes: the caller's lease, the queue served first, whether a claim
may be granted, the rows of grants and releases, the releases a lapsed lease implies.

Decisions behind it:
- One decision for every claim, whoever asks: a caller's ``claim_many`` and the queue's hand-off
  both go through ``may_claim`` and ``grant``, so a hand-off obeys the same rules (coverage,
  modes, the fencing version).
- Reading is its ``rows`` (agenthold.claims.rows.ClaimRows), reading inside this transaction at
  this write's ``now``; nothing is passed from call to call by hand.
- The rows of a grant or release are gathered and written one statement per table at
  ``flush``, in an order that keeps every event after the row it reports; a lapse, read while
  deciding, is written at once (the decision that follows counts it).
- The queue is served oldest first: a wait is granted when it may claim now and conflicts with
  no older wait still in line; a caller's own claim is busy behind the waits it would jump. A
  wait is live while its waiter keeps looking (``alive_until``), its agent's lease holds and its
  principal may still call; a claim handed to a wait nobody reads in time goes back
  (``give_back``): nobody holds a claim it was never told of.
- Shared holds are rows of ``claim_shares``; the resource's ``claims`` row keeps the fencing
  version (each shared claim and release adds one) and the last outcome, with no holder.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from agenthold.claims.index import HeldPatterns, held_patterns
from agenthold.claims.names import Resource
from agenthold.claims.patterns import Pattern
from agenthold.claims.records import (
    LAPSE_OUTCOMES,
    ClaimInfo,
    ClaimResult,
    NotHolderError,
    Previous,
    ReleaseResult,
    Unheard,
    make_claim_result,
    make_release_result,
    unknown_agent,
)
from agenthold.claims.rows import (
    ClaimRows,
    Prefetched,
    PrincipalLive,
    Queued,
    Target,
    claim_info,
    queued,
    queued_in_way,
    target_of_row,
)
from agenthold.claims.schema import (
    ACTIVITY,
    BUMP,
    CLAIM_ROW,
    EVENT,
    EVENT_MODE,
    FREE,
    INSERT,
    LOOK_COLUMNS,
    SHARE,
    TAKE,
    TOUCH,
    UNSHARE,
    UNSHARE_ALL,
    WAITER_ROW,
    agent_topic,
    resource_topic,
    write_rows,
)
from agenthold.claims.targets import Plan
from agenthold.identity.agents import check_owner
from agenthold.store import Topic, utc_iso

__all__ = ["LIVENESS", "Activity", "ClaimWrite"]

# Seconds a queued row stays alive past its waiter's last look. The waiter looks again at least
# every LIVENESS / 3, so a live one is never dropped for being slow to renew; a dead one holds
# its place (or a claim handed to it) for at most this long.
LIVENESS = 10.0


class Activity(NamedTuple):
    """Whether any wait is in the queue, whether any shared hold exists (lapsed or not), and the
    token of the held patterns (agenthold.claims.index): a claim write looks at the queue or the
    shares only when there is something to see."""

    waits: bool
    shares: bool
    patterns: str | None


def _activity_of(row: Sequence[Any]) -> Activity:
    waits, shares, patterns = row
    return Activity(bool(waits), bool(waits) or bool(shares), patterns)  # a hand-off may share


# The order a write's gathered rows are written in: claim rows before their shares and events.
_WRITE_ORDER = (INSERT, TAKE, BUMP, FREE, UNSHARE_ALL, UNSHARE, SHARE, EVENT_MODE)
_RANK = {sql: n for n, sql in enumerate(_WRITE_ORDER)}


class ClaimWrite:
    """A claim write in progress: ``conn`` is its transaction, under the claims lock, ``now``
    its database time, ``changed`` the topics it changed (notified after the commit).

    ``claim_ttl``, ``renew_every``, ``liveness`` and ``live`` are the Coordinator's settings:
    the lease a call renews, the least move of a last-seen time or lease end worth a write, how
    long a wait lives past its last look, and whether a principal may still call."""

    __slots__ = (
        "_keys", "_pending", "_released", "at", "changed", "claim_ttl", "conn", "live",
        "liveness", "now", "renew_every", "rows",
    )  # fmt: skip

    def __init__(
        self,
        conn: Any,
        changed: list[Topic],
        now: float,
        *,
        claim_ttl: float | None = None,
        renew_every: float = 1.0,
        liveness: float = LIVENESS,
        live: PrincipalLive | None = None,
    ) -> None:
        self.conn = conn
        self.changed = changed
        self.now = now
        self.at = utc_iso(now)
        self.claim_ttl = claim_ttl
        self.renew_every = renew_every
        self.liveness = liveness
        self.live = live
        self.rows = ClaimRows(self._fetch, now)
        self._pending: dict[str, list[tuple[Any, ...]]] = {}  # rows still to write, by statement
        self._keys: list[str] = []  # the resources they change
        self._released: dict[str, int] = {}  # key: the version its release gave it

    def _fetch(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        return self.conn.execute(sql, args).fetchall()  # type: ignore[no-any-return]

    def _add(self, sql: str, row: tuple[Any, ...]) -> None:
        """Gather ``row`` for the single-row statement ``sql``, written at ``flush``."""
        rows = self._pending.get(sql)
        if rows is None:
            self._pending[sql] = [row]
        else:
            rows.append(row)

    def flush(self) -> None:
        """Write the rows gathered so far, one statement per table, in an order that keeps every
        event after the row it reports, and count their topics."""
        pending, conn = self._pending, self.conn
        if pending:
            for sql in sorted(pending, key=_RANK.__getitem__) if len(pending) > 1 else pending:
                rows = pending[sql]
                if len(rows) == 1:
                    conn.execute(sql, rows[0])
                elif sql.startswith("DELETE"):  # write_rows knows INSERT and UPDATE only
                    conn.executemany(sql, rows)
                else:
                    write_rows(conn, sql, rows)  # one statement per table
            pending.clear()
        if self._keys:
            self.changed.extend([resource_topic(k) for k in self._keys])
            self._keys.clear()
        self._released.clear()

    # -- the caller -----------------------------------------------------------------------------

    def check_owner(self, agent_id: str, principal: str | None) -> None:
        """ForeignAgentError if ``principal`` is not who ``agent_id`` belongs to (None: trusted).
        An unknown agent passes here; the call that follows says it is unknown."""
        check_owner(self.conn, agent_id, principal)  # the registry knows who owns an agent

    def touch(self, agent_id: str) -> Activity:
        """Check that ``agent_id`` exists and renew its lease (and last-seen time). If its lease
        had already ended, its claims are released as lapsed first, so they stay free. Returns
        the Activity read with the lease, before any of that was written."""
        return self._renew(agent_id, self.conn.execute(TOUCH, (agent_id,)).fetchone())[0]

    def touch_and_look(
        self,
        agent_id: str,
        targets: Sequence[Target],
        extra: Sequence[str] = (),
        *,
        blockers: bool = True,
        held: HeldPatterns | None = None,
    ) -> tuple[Activity, Prefetched | None]:
        """``touch``, reading in the same statement the rows ``rows.prefetch`` reads for
        ``targets`` (``held``: the index of the held patterns the last write kept). The rows are
        returned only while touching changed nothing they say (no lapse was released) and the
        index still holds (the token read is its own); else None: read them again, after
        ``patterns``."""
        if blockers and held is None:  # the patterns above the files would need a read first
            return self.touch(agent_id), None
        look = self.rows.look_for(targets, extra, blockers=blockers, held=held)
        rows = self.conn.execute(_touch_look(look.condition), (*look.args, agent_id)).fetchall()
        found, lapsed = self._renew(agent_id, rows[0] if rows else None)
        if lapsed or (held is not None and found.patterns != held.token):
            return found, None
        return found, look.sort([r[6:] for r in rows if r[6] is not None])

    def _renew(self, agent_id: str, row: Sequence[Any] | None) -> tuple[Activity, bool]:
        """``touch``, given the agent's ``TOUCH`` row; also whether its lease had lapsed."""
        conn, now, ttl, every = self.conn, self.now, self.claim_ttl, self.renew_every
        if row is None:
            raise unknown_agent(agent_id)
        last_seen, lease_end, lease_outcome = row[:3]
        found = _activity_of(row[3:6])
        lapsed = lease_end is not None and lease_end <= now
        if lapsed:
            self.release_lapsed(agent_id)
        new_end = None if ttl is None else now + ttl
        new_outcome = None if new_end is None else "expired"
        if (
            not lapsed
            and lease_outcome == new_outcome
            and (lease_end == new_end or _small_renewal(lease_end, new_end, ttl, every))
            and _seen_since(last_seen, now - every)
        ):
            return found, lapsed  # renewed a moment ago
        conn.execute(
            "UPDATE agents SET last_seen_at = ?, lease_ends_at = ?, lease_end_outcome = ? "
            "WHERE agent_id = ?",
            (self.at, new_end, new_outcome, agent_id),
        )
        if not lapsed and new_end is not None and (lease_end is None or new_end < lease_end):
            # A shorter TTL than the last renewal's (processes may differ): tell waiters, which
            # sleep until the holder's lease end they last saw.
            conn.execute(
                EVENT, (self.at, agent_id, "lease_ends", None, None, "expired", None, None)
            )
            self.changed.append(agent_topic(agent_id))
        return found, lapsed

    def activity(self) -> Activity:
        """The Activity as of now, in this write (after what it wrote so far)."""
        return _activity_of(self.conn.execute("SELECT " + ACTIVITY).fetchone())

    def patterns(self, token: str | None, kept: HeldPatterns | None) -> HeldPatterns | None:
        """The index of the held patterns for the token ``token`` read in this write: ``kept``
        if it was built for the same token (agenthold.claims.index)."""
        return held_patterns(self.conn, token, kept)

    # -- deciding -------------------------------------------------------------------------------

    def may_claim(
        self,
        target: Target,
        agent_id: str,
        ahead: Prefetched | None = None,
        mode: str = "exclusive",
        queue: Sequence[Queued] = (),
        shares: bool = True,
    ) -> tuple[ClaimResult, ClaimInfo | None]:
        """Whether ``agent_id`` may claim ``target`` in ``mode`` now ("claimed": it may; nothing
        written), and the target's own claim row. ``queue``: the waits it may not jump;
        ``shares`` false: no shared hold exists to look at."""
        rows, now = self.rows, self.now
        info = rows.own(target) if ahead is None else ahead.own_of(target, now)
        if (info is not None and info.holder == agent_id) or (
            shares and mode == "shared" and rows.own_share(target.key, agent_id)
        ):
            assert info is not None
            return make_claim_result("already_claimed", info.uri, info.version), info
        in_way = rows.in_way_of(target, agent_id, mode, info, ahead, shares)
        jumped = queued_in_way(queue, target, mode, agent_id) if queue else []
        if in_way or jumped:
            uri = in_way[0].uri if in_way and in_way[0].resource == target.key else target.uri
            conflicts = tuple(c.held(c.uri if c.uri != uri else None) for c in in_way)
            conflicts += tuple(w.holder(uri) for w in jumped)
            result = ClaimResult("busy", uri, holder=conflicts[0], conflicts=conflicts)
            return result, info
        return make_claim_result("claimed", target.uri), info

    # -- grants and releases --------------------------------------------------------------------

    def grant(
        self,
        target: Target,
        info: ClaimInfo | None,
        agent_id: str,
        principal: str | None,
        mode: str = "exclusive",
        shares: bool = True,
    ) -> ClaimResult:
        """Gather the rows that grant ``target`` to ``agent_id`` (``info``: its claim row,
        checked by may_claim) and return the grant, with its fencing version."""
        at = self.at
        file_id = target.file_id if isinstance(target, Resource) else None
        scope = target.scope if isinstance(target, Pattern) else None
        shared = mode == "shared"
        if info is None:
            version = 1
            holder = (None, None) if shared else (agent_id, at)
            self._add(INSERT, (target.key, target.uri, *holder, file_id, scope))
        else:
            version = info.version
            lapsed = info.state == "free" and info.last_outcome in LAPSE_OUTCOMES
            if lapsed and self._held_row(target.key):  # the lease lapsed: record it first
                version += 1
                self.record_lapse(info, version)
            version += 1
            if shared:
                self._add(BUMP, (version, target.key))
            else:
                self._add(TAKE, (agent_id, at, version, target.uri, file_id, scope, target.key))
        if shared:
            self._add(SHARE, (target.key, agent_id, target.uri, at, scope, file_id))
        elif shares:  # what is left of shared holds on it is the agent's own, or lapsed
            self._add(UNSHARE_ALL, (target.key,))
        self._add(EVENT_MODE, (at, agent_id, "claimed", target.key, target.uri, None, None, version,
                             principal, "shared" if shared else None))  # fmt: skip
        self._keys.append(target.key)
        previous = None if info is None else info.previous()
        return make_claim_result("claimed", target.uri, version, previous)

    def _held_row(self, key: str) -> bool:
        """Whether the row still names a holder (a lapse not yet recorded as a release)."""
        row = self.conn.execute("SELECT holder FROM claims WHERE resource = ?", (key,)).fetchone()
        return row is not None and row[0] is not None

    def release(
        self, plan: Plan, ahead: Prefetched, agent_id: str, principal: str | None,
        shares: bool = True,
    ) -> ReleaseResult:  # fmt: skip
        """Gather the rows of the release ``plan`` by ``agent_id`` (``ahead``: the rows of its
        names, as written and as resolved) and return its result."""
        res, named = plan.res, plan.named
        if res.key in self._released:  # named twice in one set: released once
            return ReleaseResult("already_free", res.uri, self._released[res.key])
        row = ahead.own.get(res.key)
        if named.key != res.key and (row is None or row[2] != agent_id):
            # The name became a symbolic link after this agent claimed it: release the
            # claim taken under the name as written.
            held = ahead.own.get(named.key)
            if held is not None and held[2] == agent_id:
                res, row = named, held
        if plan.refused is not None and (row is None or row[2] != agent_id):
            raise plan.refused
        if row is None:
            return ReleaseResult("not_found", res.uri)
        at = self.at
        if row[2] == agent_id and row[9] is not None and (row[11] is None or row[11] > self.now):
            # held by this agent, its lease live (claim_info's test): the common case, written
            # without building the claim's record
            version, outcome, moved_to = row[4] + 1, plan.outcome, plan.moved_to
            self._add(FREE, (version, outcome, agent_id, at, moved_to, res.key))
            self._add(EVENT_MODE,
                (at, agent_id, "released", res.key, res.uri, outcome, moved_to, version,
                 principal, None)
            )  # fmt: skip
            self._keys.append(res.key)
            self._released[res.key] = version
            return make_release_result("released", row[1], version, outcome, moved_to or None)
        info = claim_info(row, self.now)  # not a live claim of this agent's
        if shares and info.holder is None and self.rows.own_share(res.key, agent_id):
            version = info.version + 1
            self._release_share(version, res.key, info.uri, agent_id, plan.outcome,
                                plan.moved_to, principal)  # fmt: skip
            return ReleaseResult("released", info.uri, version, plan.outcome, plan.moved_to)
        if info.state == "claimed":
            assert info.holder is not None
            raise NotHolderError(
                f"{info.uri} is held by {info.holder} ({info.holder_name}), not by "
                f"{agent_id}; only the holder can release it",
                held_by=info.holder,
            )
        ended = None
        if info.last_holder == agent_id and info.last_outcome in LAPSE_OUTCOMES:
            assert info.last_outcome is not None
            ended = Previous(info.last_outcome, agent_id, info.last_outcome_at)
        return ReleaseResult("already_free", info.uri, info.version, ended=ended)

    def _release_share(
        self, version: int, key: str, uri: str, agent_id: str, outcome: str,
        moved_to: str | None, principal: str | None, at: str | None = None,
    ) -> None:  # fmt: skip
        """Gather the release of ``agent_id``'s shared hold on ``key`` (at the new ``version``)."""
        at = at or self.at
        self._add(FREE, (version, outcome, agent_id, at, moved_to, key))
        self._add(UNSHARE, (key, agent_id))
        self._add(
            EVENT_MODE,
            (at, agent_id, "released", key, uri, outcome, moved_to, version, principal, "shared"),
        )
        self._keys.append(key)
        self._released[key] = version

    def release_all(self, agent_id: str, outcome: str) -> list[str]:
        """Release every claim and shared hold ``agent_id`` holds with ``outcome``; returns
        their URIs, sorted."""
        rows = self.conn.execute(
            "SELECT resource, uri, version FROM claims WHERE holder = ? ORDER BY uri",
            (agent_id,),
        ).fetchall()
        for key, uri, version in rows:
            self.conn.execute(FREE, (version + 1, outcome, agent_id, self.at, None, key))
            self.conn.execute(
                EVENT, (self.at, agent_id, "released", key, uri, outcome, None, version + 1)
            )
            self.changed.append(resource_topic(key))
        shared = self._drop_shares(agent_id, outcome, self.at)
        return sorted([uri for _, uri, _ in rows] + shared)

    def _drop_shares(self, agent_id: str, outcome: str, at: str) -> list[str]:
        """Release every shared hold of ``agent_id`` with ``outcome`` (a lapse, or release_all);
        returns their URIs."""
        rows = self.conn.execute(
            "SELECT s.resource, s.uri, c.version FROM claim_shares AS s JOIN claims AS c ON "
            "c.resource = s.resource WHERE s.agent_id = ?",
            (agent_id,),
        ).fetchall()
        for key, uri, version in rows:
            self._release_share(version + 1, key, uri, agent_id, outcome, None, None, at)
        self.flush()
        return [uri for _, uri, _ in rows]

    # -- leases ---------------------------------------------------------------------------------

    def release_lapsed(self, agent_id: str) -> None:
        """Write the releases of every claim and shared hold of ``agent_id``, whose lease ended."""
        conn = self.conn
        for row in conn.execute(CLAIM_ROW + "WHERE c.holder = ?", (agent_id,)).fetchall():
            info = claim_info(row, float("inf"))  # as if now were past any lease end
            self.record_lapse(info, info.version + 1)
            self.changed.append(resource_topic(info.resource))
        ended = conn.execute(
            "SELECT lease_ends_at, lease_end_outcome FROM agents WHERE agent_id = ?", (agent_id,)
        ).fetchone()
        if ended is not None and ended[0] is not None:
            self._drop_shares(agent_id, ended[1] or "abandoned", utc_iso(ended[0]))

    def record_lapse(self, info: ClaimInfo, version: int) -> None:
        """Write the release that a lapsed lease implies (outcome "expired" or "abandoned")."""
        outcome, holder, at = info.last_outcome, info.last_holder, info.last_outcome_at
        self.conn.execute(FREE, (version, outcome, holder, at, None, info.resource))
        self.conn.execute(
            EVENT, (at, holder, "released", info.resource, info.uri, outcome, None, version)
        )

    def end_lease(self, agent_id: str, grace: float, outcome: str) -> None:
        """End ``agent_id``'s lease ``grace`` seconds from now, unless it already ends sooner
        or the agent is gone."""
        row = self.conn.execute(
            "SELECT lease_ends_at FROM agents WHERE agent_id = ?", (agent_id,)
        ).fetchone()
        if row is None or (row[0] is not None and row[0] <= self.now + grace):
            return  # an agent that is gone has no lease to end
        self.conn.execute(
            "UPDATE agents SET lease_ends_at = ?, lease_end_outcome = ? WHERE agent_id = ?",
            (self.now + grace, outcome, agent_id),
        )
        self.conn.execute(EVENT, (self.at, agent_id, "lease_ends", None, None, outcome, None, None))
        self.changed.append(agent_topic(agent_id))

    def reap(self, cutoff: str) -> list[str]:
        """Remove the agents last seen before ``cutoff`` that hold no live claim, releasing
        what they let lapse first; returns their ids."""
        conn, now, reaped = self.conn, self.now, []
        idle = conn.execute(
            "SELECT agent_id, lease_ends_at FROM agents WHERE last_seen_at < ?", (cutoff,)
        ).fetchall()
        for agent_id, lease_end in idle:
            lapsed = lease_end is not None and lease_end <= now
            held = conn.execute(
                "SELECT (SELECT count(*) FROM claims WHERE holder = ?) + "
                "(SELECT count(*) FROM claim_shares WHERE agent_id = ?)",
                (agent_id, agent_id),
            ).fetchone()[0]
            if held and not lapsed:
                continue
            if held:
                self.release_lapsed(agent_id)
            conn.execute("DELETE FROM agents WHERE agent_id = ?", (agent_id,))
            conn.execute(EVENT, (self.at, agent_id, "reaped", None, None, None, None, None))
            self.changed.append(agent_topic(agent_id))
            reaped.append(agent_id)
        return reaped

    # -- the queue ------------------------------------------------------------------------------

    def serve(self, now: float | None = None) -> list[Queued]:
        """Grant what can be granted to the waits in the queue, oldest first, as of ``now``
        (None: this write's): one that conflicts with an older wait still in line stays; a grant
        is kept for its waiter to read for ``liveness`` seconds. Returns the waits still in
        line."""
        if now is not None and now != self.now:  # judged at another time: a write of its own
            other = ClaimWrite(
                self.conn, self.changed, now, claim_ttl=self.claim_ttl,
                renew_every=self.renew_every, liveness=self.liveness, live=self.live,
            )  # fmt: skip
            return other.serve()
        queue = self._waiting()
        if not queue:
            return queue
        left: list[Queued] = []
        for w in queue:
            if not w.parked and not queued_in_way(left, w.target, w.mode, w.agent_id):
                result, info = self.may_claim(w.target, w.agent_id, mode=w.mode)
                if result.status != "busy":
                    if result.status == "claimed":
                        result = self.grant(w.target, info, w.agent_id, w.principal, w.mode)
                        self.flush()
                    self._mark_granted(w.seq, result, _previous_of(info))
                    continue
            left.append(w)
        return left

    def _waiting(self) -> list[Queued]:
        """The live waits not yet granted, oldest first (one due now still counts: a wait of 0
        seconds gets its one look), parked ones (timed out, their place kept) included. Dead
        ones are removed: no longer renewed by their waiter (``alive_until``), their agent's
        lease ended or their agent gone, or their agent's principal no longer ``live``. A
        granted row nobody came to read in time (or whose principal is gone) gives its claim
        back (``give_back``) and is removed."""
        now, live = self.now, self.live
        live_rows: list[Queued] = []
        dead: list[tuple[int]] = []
        for row in self.conn.execute(WAITER_ROW + "ORDER BY w.seq").fetchall():
            if row[9] is not None:  # granted
                seq, key, uri, scope, file_id, agent_id, mode, _since, until, granted = row[:10]
                alive_until, granted_as, p_outcome, p_holder, p_at, p_moved = row[10:16]
                principal = row[18]
                alive = until if alive_until is None else alive_until
                revoked = principal is not None and live is not None and not live(principal)
                if alive < now or revoked:  # handed a claim, and its waiter never came for it
                    target = target_of_row(key, uri, scope, file_id)
                    previous = None if p_outcome is None else Previous(p_outcome, p_holder, p_at,
                                                                       p_moved)  # fmt: skip
                    got = ClaimResult(granted_as, uri, int(granted), previous)
                    self.give_back(Unheard(target, agent_id, mode, principal), got)
                    dead.append((seq,))
                continue
            found = queued(row, now, live)
            if found is None:
                dead.append((row[0],))
            else:
                live_rows.append(found)
        if dead:
            self.conn.executemany("DELETE FROM claim_waiters WHERE seq = ?", dead)
        return live_rows

    def _mark_granted(self, seq: int, result: ClaimResult, previous: Previous | None) -> None:
        """Record that the wait ``seq`` was handed its claim (``result``), for its waiter to
        read within ``liveness`` seconds (then it goes back: see ``_waiting``)."""
        p = previous or Previous("", None, None)
        self.conn.execute(
            "UPDATE claim_waiters SET granted = ?, granted_as = ?, prev_outcome = ?, "
            "prev_holder = ?, prev_at = ?, prev_moved_to = ?, alive_until = ? WHERE seq = ?",
            (result.version, result.status, p.outcome or None, p.holder, p.at, p.moved_to,
             self.now + self.liveness, seq),
        )  # fmt: skip

    def enqueue(self, target: Target, agent_id: str, mode: str, until: float) -> int:
        """Put a wait for ``target`` at the end of the queue, alive for ``liveness`` seconds
        unless it looks again (``renew``), or give it back the place its agent's last wait for
        the same target and mode kept (``park``); returns its seq."""
        conn, now = self.conn, self.now
        kept = conn.execute(
            "SELECT seq FROM claim_waiters WHERE agent_id = ? AND resource = ? AND mode = ? AND "
            "granted IS NULL AND until < ? AND alive_until >= ? ORDER BY seq LIMIT 1",
            (agent_id, target.key, mode, now, now),
        ).fetchone()
        if kept is not None:  # its last wait timed out a moment ago: it takes its place back
            conn.execute(
                "UPDATE claim_waiters SET until = ?, alive_until = ? WHERE seq = ?",
                (until, now + self.liveness, kept[0]),
            )
            return int(kept[0])
        scope = target.scope if isinstance(target, Pattern) else None
        file_id = target.file_id if isinstance(target, Resource) else None
        row = conn.execute(
            "INSERT INTO claim_waiters (resource, uri, scope, file_id, agent_id, mode, since, "
            "until, alive_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
            (target.key, target.uri, scope, file_id, agent_id, mode, self.at, until,
             now + self.liveness),
        ).fetchone()  # fmt: skip
        return int(row[0])

    def park(self, seq: int) -> None:
        """The wait ``seq`` timed out: keep its place in line for ``liveness`` seconds, for its
        agent's next wait (``enqueue``). Parked, it is handed nothing (nobody listens for it),
        but the waits behind it stay behind it; unclaimed, it dies like any row nobody renews."""
        self.conn.execute(
            "UPDATE claim_waiters SET until = ?, alive_until = ? WHERE seq = ? AND granted IS NULL",
            (self.now - 1.0, self.now + self.liveness, seq),  # past its deadline: parked
        )

    def renew(self, seq: int) -> None:
        """Keep the wait ``seq`` alive ``liveness`` seconds more: its waiter is still listening."""
        self.conn.execute(
            "UPDATE claim_waiters SET alive_until = ? WHERE seq = ? AND granted IS NULL",
            (self.now + self.liveness, seq),
        )

    def adopt(self, agent_id: str, keys: Sequence[str]) -> None:
        """The agent's own claim of ``keys`` was just told "already_claimed": a claim its queued
        wait was handed is now one it has heard of, so that wait, cancelled, gives nothing
        back."""
        marks = ", ".join("?" * len(keys))
        self.conn.execute(
            "UPDATE claim_waiters SET granted_as = 'already_claimed' WHERE agent_id = ? AND "
            f"granted IS NOT NULL AND resource IN ({marks})",
            (agent_id, *keys),
        )

    def handed(self, seq: int) -> tuple[bool, ClaimResult | None]:
        """Whether the wait ``seq`` is still in the queue, and its claim if it was granted (the
        row is then removed: the waiter has read it)."""
        row = self.conn.execute(
            "SELECT uri, granted, granted_as, prev_outcome, prev_holder, prev_at, prev_moved_to "
            "FROM claim_waiters WHERE seq = ?",
            (seq,),
        ).fetchone()
        if row is None:
            return False, None
        uri, version, status, outcome, holder, at, moved_to = row
        if version is None:
            return True, None
        self.conn.execute("DELETE FROM claim_waiters WHERE seq = ?", (seq,))
        previous = None if outcome is None else Previous(outcome, holder, at, moved_to)
        return True, ClaimResult(status, uri, int(version), previous)

    def leave(self, seq: int) -> ClaimResult | None:
        """Take the wait ``seq`` out of the queue; its claim if it was granted meanwhile."""
        _, got = self.handed(seq)
        self.conn.execute("DELETE FROM claim_waiters WHERE seq = ?", (seq,))
        return got

    def give_back(self, unheard: Unheard, got: ClaimResult | None) -> None:
        """Release the claim the queue handed to an unheard wait (``got``, read from its row just
        now, or ``unheard.got``): an agent that was never told of a claim must not hold it until
        its lease ends. It cannot have acted on it, so the release says "released", and the
        resource keeps what the holder before it left (the grant's ``previous``), which is what
        the next holder needs to hear; the version still grows. A claim the agent held before it
        waited ("already_claimed") stays, and so does one no longer held as granted (lapsed,
        released)."""
        got = got or unheard.got
        if got is None or got.status != "claimed":
            return
        target, agent_id, shared = unheard.target, unheard.agent_id, unheard.mode == "shared"
        row = self.conn.execute(
            "SELECT holder, version FROM claims WHERE resource = ?", (target.key,)
        ).fetchone()
        if row is None:
            return
        if shared:  # other readers move the version on: the agent's own hold is what counts
            held = self.rows.own_share(target.key, agent_id)
        else:
            held = row[0] == agent_id and row[1] == got.version
        if not held:
            return
        if shared:
            self._add(UNSHARE, (target.key, agent_id))
        version, p = row[1] + 1, got.previous or Previous("", None, None)
        self._add(FREE, (version, p.outcome or None, p.holder, p.at, p.moved_to, target.key))
        self._add(EVENT_MODE, (self.at, agent_id, "released", target.key, target.uri, "released",
                             None, version, unheard.principal,
                             "shared" if shared else None))  # fmt: skip
        self._keys.append(target.key)
        self.flush()


@functools.lru_cache(maxsize=256)
def _touch_look(condition: str) -> str:
    """One statement of ``TOUCH`` and the Prefetched read of ``condition``: the agent's row (6
    columns) beside each claim row the condition picks (``LOOK_ROW``'s 15), or beside NULLs
    when it picks none; the parameters are the condition's, then the agent id. A flat join:
    cheaper for SQLite than the two statements, where a subquery in the join costs more."""
    return (
        f"SELECT t.last_seen_at, t.lease_ends_at, t.lease_end_outcome, {ACTIVITY}, "
        f"{LOOK_COLUMNS} FROM agents AS t LEFT JOIN claims AS c ON ({condition}) "
        "LEFT JOIN agents AS a ON a.agent_id = c.holder WHERE t.agent_id = ?"
    )


def _previous_of(info: ClaimInfo | None) -> Previous | None:
    """What the last holder of a resource did, a plain release included (a hand-off says it)."""
    if info is None or info.last_outcome is None:
        return None
    moved_to = info.moved_to if info.last_outcome == "moved" else None
    return Previous(info.last_outcome, info.last_holder, info.last_outcome_at, moved_to)


def _seen_since(last_seen: str, since: float) -> bool:
    """Whether the stored time ``last_seen`` is at or after ``since``: compared as seconds, the
    text parsed once (an agent's last-seen time changes once a second at most), rather than
    formatting ``since`` on every call; a text that does not parse is compared as text."""
    seconds = _seconds_of(last_seen)
    return last_seen >= utc_iso(since) if seconds is None else seconds >= since


@functools.lru_cache(maxsize=1024)
def _seconds_of(at: str) -> float | None:
    try:
        moment = datetime.fromisoformat(at)
    except (TypeError, ValueError):
        return None
    return None if moment.tzinfo is None else moment.timestamp()  # naive: not ours to guess


def _small_renewal(
    old_end: float | None, new_end: float | None, ttl: float | None, every: float
) -> bool:
    """Whether a lease renewal would move the end too little to be worth a write: less than
    ``every`` seconds, and less than a quarter of the TTL, so a short TTL is still renewed in
    time."""
    return (
        old_end is not None
        and new_end is not None
        and ttl is not None
        and 0 <= new_end - old_end < min(every, ttl / 4)
    )
