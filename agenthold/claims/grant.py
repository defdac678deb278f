"""Deciding and writing inside a claim transaction: whether a claim may be granted, the rows a
grant or a release writes, the releases a lapsed lease implies, and serving the queue of waits
that claim. Every function runs under the claims lock (``Coordinator`` takes it).

Decisions behind it:
- One decision for every claim, whoever asks: a caller's ``claim_many`` and the queue's hand-off
  both go through ``may_claim`` and ``grant_claim``, so a hand-off obeys the same rules
  (coverage, modes, the fencing version).
- The queue is served oldest first: a wait is granted when it may claim now and conflicts with
  no older wait still in line; a caller's own claim is busy behind the waits it would jump.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agenthold.claims.names import Resource
from agenthold.claims.patterns import Pattern
from agenthold.claims.queue import (
    LIVENESS,
    Batch,
    PrincipalLive,
    Queued,
    drop_shares,
    mark_granted,
    own_share,
    previous_of,
    queued_in_way,
    release_share,
    shares_in_way,
    waiting,
)
from agenthold.claims.records import (
    LAPSE_OUTCOMES,
    ClaimInfo,
    ClaimResult,
    NotHolderError,
    Previous,
    ReleaseResult,
)
from agenthold.claims.rows import Fetch, Plan, Prefetched, blocking, claim_info, fetch_in, own
from agenthold.claims.schema import _CLAIM_ROW, _EVENT, _FREE, resource_topic
from agenthold.store import Topic, utc_iso


def may_claim(
    fetch: Fetch,
    target: Resource | Pattern,
    agent_id: str,
    now: float,
    ahead: Prefetched | None = None,
    mode: str = "exclusive",
    queue: Sequence[Queued] = (),
    shares: bool = True,
) -> tuple[ClaimResult, ClaimInfo | None]:
    """Whether ``agent_id`` may claim ``target`` in ``mode`` now ("claimed": it may; nothing
    written), and the target's own claim row. ``queue``: the waits it may not jump."""
    info = own(fetch, target, now) if ahead is None else ahead.own_of(target, now)
    if (info is not None and info.holder == agent_id) or (
        shares and mode == "shared" and own_share(fetch, target.key, agent_id)
    ):
        assert info is not None
        return ClaimResult("already_claimed", info.uri, info.version), info
    in_way = in_way_of(fetch, target, agent_id, now, mode, info, ahead, shares)
    jumped = queued_in_way(queue, target, mode, agent_id)
    if in_way or jumped:
        uri = in_way[0].uri if in_way and in_way[0].resource == target.key else target.uri
        conflicts = tuple(c.held(c.uri if c.uri != uri else None) for c in in_way)
        conflicts += tuple(w.holder(uri) for w in jumped)
        result = ClaimResult("busy", uri, holder=conflicts[0], conflicts=conflicts)
        return result, info
    return ClaimResult("claimed", target.uri), info


def in_way_of(
    fetch: Fetch,
    target: Resource | Pattern,
    agent_id: str,
    now: float,
    mode: str,
    info: ClaimInfo | None,
    ahead: Prefetched | None = None,
    shares: bool = True,
) -> list[ClaimInfo]:
    """The live claims of others that a claim of ``target`` in ``mode`` conflicts with."""
    in_way = [info] if info is not None and info.state == "claimed" else []
    in_way += blocking(fetch, target, now, agent_id, ahead)
    if shares and mode == "exclusive":
        in_way += shares_in_way(fetch, target, now, agent_id)
    return in_way


def grant_claim(
    conn: Any,
    batch: Batch,
    target: Resource | Pattern,
    info: ClaimInfo | None,
    agent_id: str,
    at: str,
    principal: str | None,
    mode: str = "exclusive",
    shares: bool = True,
) -> ClaimResult:
    """Queue the rows that grant ``target`` to ``agent_id`` (``info``: its claim row, checked
    by may_claim) and return the grant, with its fencing version."""
    file_id = target.file_id if isinstance(target, Resource) else None
    scope = target.scope if isinstance(target, Pattern) else None
    shared = mode == "shared"
    if info is None:
        version = 1
        holder = (None, None) if shared else (agent_id, at)
        batch.inserts.append((target.key, target.uri, *holder, file_id, scope))
    else:
        version = info.version
        lapsed = info.state == "free" and info.last_outcome in LAPSE_OUTCOMES
        if lapsed and held_row(conn, target.key):  # the lease lapsed: record it first
            version += 1
            record_lapse(conn, info, version)
        version += 1
        if shared:
            batch.bumps.append((version, target.key))
        else:
            batch.updates.append((agent_id, at, version, target.uri, file_id, scope, target.key))
    if shared:
        batch.shares.append((target.key, agent_id, target.uri, at, scope, file_id))
    elif shares:  # what is left of shared holds on it is the agent's own, or lapsed
        batch.unshare_all.append((target.key,))
    batch.events.append((at, agent_id, "claimed", target.key, target.uri, None, None, version,
                         principal, "shared" if shared else None))  # fmt: skip
    batch.keys.append(target.key)
    previous = None if info is None else info.previous()
    return ClaimResult("claimed", target.uri, version, previous)


def held_row(conn: Any, key: str) -> bool:
    """Whether the row still names a holder (a lapse not yet recorded as a release)."""
    row = conn.execute("SELECT holder FROM claims WHERE resource = ?", (key,)).fetchone()
    return row is not None and row[0] is not None


def release_one(
    conn: Any,
    batch: Batch,
    ahead: Prefetched,
    plan: Plan,
    agent_id: str,
    now: float,
    at: str,
    principal: str | None,
    shares: bool = True,
) -> ReleaseResult:
    res, named = plan.res, plan.named
    if res.key in batch.released:  # named twice in one set: released once
        return ReleaseResult("already_free", res.uri, batch.released[res.key])
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
    if row[2] == agent_id and row[9] is not None and (row[11] is None or row[11] > now):
        # held by this agent, its lease live (claim_info's test): the common case, written
        # without building the claim's record
        version, outcome, moved_to = row[4] + 1, plan.outcome, plan.moved_to
        batch.frees.append((version, outcome, agent_id, at, moved_to, res.key))
        batch.events.append(
            (at, agent_id, "released", res.key, res.uri, outcome, moved_to, version,
             principal, None)
        )  # fmt: skip
        batch.keys.append(res.key)
        batch.released[res.key] = version
        return ReleaseResult("released", row[1], version, outcome, moved_to or None)
    info = claim_info(row, now)  # not a live claim of this agent's
    if shares and info.holder is None and own_share(fetch_in(conn), res.key, agent_id):
        version = info.version + 1
        release_share(batch, version, res.key, info.uri, agent_id, plan.outcome,
                      plan.moved_to, at, principal)  # fmt: skip
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


def serve(
    conn: Any,
    changed: list[Topic],
    now: float,
    live: PrincipalLive | None = None,
    liveness: float = LIVENESS,
) -> list[Queued]:
    """Grant what can be granted to the waits in the queue, oldest first: one that conflicts
    with an older wait still in line stays; a grant is kept for its waiter to read for
    ``liveness`` seconds. ``live``: whether a waiter's principal may still call (see
    claim_queue.waiting). Returns the waits still in line."""
    queue = waiting(conn, changed, now, live)
    if not queue:
        return queue
    fetch, at, left = fetch_in(conn), utc_iso(now), list[Queued]()
    for w in queue:
        if not w.parked and not queued_in_way(left, w.target, w.mode, w.agent_id):
            result, info = may_claim(fetch, w.target, w.agent_id, now, mode=w.mode)
            if result.status != "busy":
                if result.status == "claimed":
                    batch = Batch()
                    result = grant_claim(conn, batch, w.target, info, w.agent_id, at,
                                         w.principal, w.mode)  # fmt: skip
                    batch.run(conn, changed)
                mark_granted(conn, w.seq, result, previous_of(info), now + liveness)
                continue
        left.append(w)
    return left


def release_lapsed(conn: Any, changed: list[Topic], agent_id: str) -> None:
    """Write the releases of every claim and shared hold of ``agent_id``, whose lease ended."""
    rows = conn.execute(_CLAIM_ROW + "WHERE c.holder = ?", (agent_id,)).fetchall()
    for row in rows:
        info = claim_info(row, float("inf"))  # as if now were past any lease end
        record_lapse(conn, info, info.version + 1)
        changed.append(resource_topic(info.resource))
    ended = conn.execute(
        "SELECT lease_ends_at, lease_end_outcome FROM agents WHERE agent_id = ?", (agent_id,)
    ).fetchone()
    if ended is not None and ended[0] is not None:
        drop_shares(conn, changed, agent_id, ended[1] or "abandoned", utc_iso(ended[0]))


def record_lapse(conn: Any, info: ClaimInfo, version: int) -> None:
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


def small_renewal(
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
