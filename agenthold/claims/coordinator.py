"""Agents and resource claims, in the same database as the state store.

An agent registers once and gets an unguessable id. Before changing a resource it claims it;
afterwards it releases it with an honest outcome (modified, created, deleted, moved), which the
next claimant is told. Decisions behind it:
- Claims live in their own tables (``claims``, ``claim_events``), so no state-store write can
  forge or steal one. Each claim or release is one short transaction with one event row. Who an
  agent is, its id and its owner are the agent registry's (agenthold.identity.agents, which the
  bus shares); its lease is the Coordinator's, kept in the registry's ``agents`` row.
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
- A claim names a file, a custom resource, a directory (``src/api/``) or a glob
  (``src/**/*.py``; agenthold.claims.patterns); what stands in its way is read by
  agenthold.claims.rows.
  Several at once are one transaction under the same lock as every claim write, so sets in any
  order never deadlock and are granted whole or not at all.
- Shared claims (many readers, no writer) and the queue of waits that claim: every claim write
  serves that queue first, in arrival order.
- Every write is one ``ClaimWrite`` (agenthold.claims.write): the transaction, its database time
  and its settings in one object, whose methods decide and write; this class checks what a call
  names (agenthold.claims.targets), opens the write and shapes the answer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from agenthold.claims.index import HeldPatterns
from agenthold.claims.names import Resolver, Resource, Walk
from agenthold.claims.patterns import Pattern
from agenthold.claims.records import (
    AGENT_ID_RE,
    LAPSE_OUTCOMES,
    MAX_AGENT_NAME,
    MAX_MODEL,
    MAX_PURPOSE,
    OUTCOMES,
    Agent,
    ClaimInfo,
    ClaimResult,
    ClaimSetResult,
    ForeignAgentError,
    Holder,
    NotHolderError,
    Previous,
    QueueLook,
    Registration,
    ReleaseResult,
    ReleaseSetResult,
    StatusResult,
    Unheard,
    UnknownAgentError,
    WaitProbe,
    WaitResult,
    check_agent_id,
    check_mode,
    claim_waited,
    make_claim_result,
    unknown_agent,
    waited,
)
from agenthold.claims.rows import (
    ClaimRows,
    InTheWay,
    PrincipalLive,
    Queued,
    claim_info,
    fetch_in,
    queued_in_way,
)
from agenthold.claims.schema import (
    CLAIM_CHANGES,
    CLAIM_ROW,
    CLAIMS_LOCK,
    CLAIMS_SCHEMA,
    EVENT_BY,
    agent_topic,
    resource_topic,
)
from agenthold.claims.targets import (
    MAX_SET,
    Plan,
    plan_release,
    plan_releases,
    target_of,
    targets_of,
)
from agenthold.claims.write import LIVENESS, ClaimWrite
from agenthold.identity.agents import (
    AGENT_NAMES,
    AGENT_ROW_BY_ID,
    AGENT_ROWS,
    add_agent,
    check_registration,
    new_agent_id,
)
from agenthold.store import (
    MAX_WAIT_SECONDS,
    InvalidInputError,
    StateStore,
    Topic,
    check_seconds,
    read_events,
    utc_iso,
    wait_until,
)

__all__ = [  # the records and schema are re-exported: agenthold.claims.coordinator names them all
    "AGENT_ID_RE",
    "CLAIMS_SCHEMA",
    "LAPSE_OUTCOMES",
    "MAX_AGENT_NAME",
    "MAX_MODEL",
    "MAX_PURPOSE",
    "MAX_SET",
    "OUTCOMES",
    "Agent",
    "ClaimInfo",
    "ClaimResult",
    "ClaimSetResult",
    "Coordinator",
    "ForeignAgentError",
    "Holder",
    "NotHolderError",
    "Previous",
    "Registration",
    "ReleaseResult",
    "ReleaseSetResult",
    "StatusResult",
    "UnknownAgentError",
    "WaitProbe",
    "WaitResult",
    "waited",
]

# Seconds: a last-seen time or lease end that would move by less than this (a lease end: by
# less than a quarter of the TTL, if that is shorter) is not rewritten, to spare writes.
RENEW_EVERY = 1.0


class Coordinator:
    """Register agents, claim and release resources, check and wait for them.

    ``resolver`` turns what agents type into canonical resources (by default: one workspace
    named "default" at the current directory). ``claim_ttl`` (seconds, or None for no expiry)
    is how long an agent's claims survive without a call that names the agent.
    """

    def __init__(
        self,
        store: StateStore,
        resolver: Resolver | None = None,
        claim_ttl: float | None = None,
    ) -> None:
        self.store = store
        self.db = store.db
        self.resolver = resolver if resolver is not None else Resolver()
        if claim_ttl is not None:
            claim_ttl = check_seconds("claim_ttl", claim_ttl, maximum=10 * 365 * 86400)
            if claim_ttl <= 0:
                raise InvalidInputError(
                    f"claim_ttl must be a positive number of seconds, got {claim_ttl}"
                )
        self.claim_ttl = claim_ttl
        # Seconds a queued wait stays alive past its last look (agenthold.claims.write.LIVENESS).
        self.waiter_liveness = LIVENESS
        # Whether a principal (by name) may still call: set by a server with a token file, so
        # that the queue hands no claim to a waiter whose token was revoked (None: all may).
        self.principal_live: PrincipalLive | None = None
        self._held: HeldPatterns | None = None  # the held patterns, as the last claim saw them
        # read-only, a database that only a store ever used has no claims tables: nothing to read
        self._tables = self.db.ensure(CLAIMS_SCHEMA, required=False) > 0
        if self._tables:  # a source the change feed cannot read would stop it for every table
            self.db.add_change_source(CLAIM_CHANGES)

    @property
    def registry(self) -> Resolver:
        """``resolver`` under 0.10's name (its WorkspaceRegistry is a Resolver); read-only."""
        return self.resolver

    # -- agents --------------------------------------------------------------------------------

    def register(
        self,
        name: str,
        model: str = "",
        purpose: str = "",
        *,
        principal: str | None = None,
        host: str | None = None,
    ) -> Registration:
        """Register an agent and return its new ``agent_id``. ``principal`` (the
        caller, as a token names it) is who the agent belongs to from then on; ``host`` the
        process its client runs in, where a stdio server can tell (agenthold.hooks)."""
        check_registration(name, model, purpose)
        agent_id = new_agent_id()
        with self.db.write() as (conn, changed):
            now = self.db.serialize(conn, CLAIMS_LOCK)
            at = utc_iso(now)
            lease = None if self.claim_ttl is None else now + self.claim_ttl
            add_agent(
                conn,
                agent_id,
                name,
                model,
                purpose,
                at,
                lease_ends_at=lease,
                lease_end_outcome=None if lease is None else "expired",  # a lease left to end
                principal=principal,
                host=host,
            )
            conn.execute(
                EVENT_BY,
                (at, agent_id, "registered", None, None, None, None, None, principal),
            )
            changed.append(agent_topic(agent_id))
        return Registration(agent_id, name, model, at, purpose)

    def agent(self, agent_id: str) -> Agent:
        """Return a registered agent; UnknownAgentError if there is none with this id."""
        check_agent_id(agent_id)
        if not self._tables:
            raise unknown_agent(agent_id)
        row = self.db.fetchone(AGENT_ROW_BY_ID, (agent_id,))
        if row is None:
            raise unknown_agent(agent_id)
        return Agent(*row)

    def agent_names(self, conn: Any = None) -> dict[str, str]:
        """The name of every registered agent, by id (read in the snapshot ``conn`` if given)."""
        sql = AGENT_NAMES
        if not self._tables:
            return {}
        return dict(conn.execute(sql).fetchall() if conn is not None else self.db.fetchall(sql))

    def read_log(
        self, conn: Any, *, agents: Sequence[str] = (), uri: str | None = None, **window: Any
    ) -> tuple[list[Any], Any]:
        """Claim events ``(id, at, agent_id, event, uri, outcome, moved_to, version)`` in the
        snapshot ``conn``, oldest first: the last ``limit`` (``after`` None; below id ``before``,
        if given), or those committed after ``after``; and the position to follow from
        (``window``: after, limit, before). ``agents`` (ids) and ``uri`` keep their own."""
        if not self._tables:
            return [], window.get("after")
        where = [f"agent_id IN ({', '.join('?' * len(agents))})"] if agents else []
        where += ["uri = ?"] * (uri is not None)
        columns = "id, at, agent_id, event, uri, outcome, moved_to, version, principal"
        params = (*agents, *([uri] if uri is not None else []))
        return read_events(
            self.db,
            conn,
            "claim_events",
            columns,
            **window,
            where=" AND ".join(where),
            params=params,
        )

    def list_agents(self) -> list[Agent]:
        """Every registered agent, oldest registration first."""
        if not self._tables:
            return []
        return [Agent(*r) for r in self.db.fetchall(AGENT_ROWS)]

    # -- claims --------------------------------------------------------------------------------

    def target(
        self, resource: str | Resource | Pattern, walk: Walk | None = None
    ) -> Resource | Pattern:
        """What ``resource`` names: a file or custom resource, or a directory or glob."""
        return target_of(self.resolver, resource, walk)

    def claim(
        self,
        resource: str | Resource | Pattern,
        agent_id: str,
        *,
        mode: str = "exclusive",
        principal: str | None = None,
    ) -> ClaimResult:
        """Claim ``resource`` (a path, URI, directory ``d/`` or glob) for ``agent_id``:
        "claimed", "already_claimed" or "busy". ``mode`` "shared" lets other readers hold it
        too, while nobody holds it exclusively.

        With ``principal`` (the caller, as a token names it), ForeignAgentError unless the agent
        was registered through that principal; None is a trusted caller."""
        target = self.target(resource)
        check_agent_id(agent_id)
        check_mode(mode)
        return self._claim([target], agent_id, mode, principal, one=True)[1][0]

    def claim_many(
        self,
        resources: Sequence[str | Resource | Pattern],
        agent_id: str,
        *,
        mode: str = "exclusive",
        principal: str | None = None,
    ) -> ClaimSetResult:
        """Claim every one of ``resources`` for ``agent_id`` in one transaction, or none: the
        set is "claimed" or "busy". Every claim write holds one lock, so sets listed in any
        order by any number of agents never deadlock and never half-succeed."""
        targets = self._targets(resources)
        check_agent_id(agent_id)
        check_mode(mode)
        status, results = self._claim(targets, agent_id, mode, principal)
        return ClaimSetResult(status, results)

    def _claim(
        self,
        targets: list[Resource | Pattern],
        agent_id: str,
        mode: str,
        principal: str | None,
        *,
        one: bool = False,
    ) -> tuple[Literal["claimed", "busy"], tuple[ClaimResult, ...]]:
        """claim_many of checked ``targets``: its status and results. ``one``: a single target,
        whose common case (an exclusive claim of a file or custom resource that nothing else
        stands near: no wait, no shared hold, no pattern above it, no other name of its file
        held) is decided from its own row, as the general path would decide it."""
        with self.db.write() as (conn, changed):
            w = self._begin(conn, changed)
            w.check_owner(agent_id, principal)
            # its rows and all in their way, read with the agent's lease, at once
            found, ahead = w.touch_and_look(agent_id, targets, held=self._held)
            if (
                one
                and ahead is not None
                and not found.shares  # no wait either (a wait counts as a share here)
                and not ahead.above
                and mode == "exclusive"
                and not w.changed
            ):
                target = targets[0]
                if isinstance(target, Resource) and not _aliased(ahead.by_file, target):
                    row = ahead.own.get(target.key)
                    info = None if row is None else claim_info(row, w.now)
                    if info is not None and info.holder == agent_id:
                        return "claimed", (
                            make_claim_result("already_claimed", info.uri, info.version),
                        )
                    if info is None or info.state != "claimed":
                        result = w.grant(target, info, agent_id, principal, mode, False)
                        w.flush()
                        return "claimed", (result,)
            waits = found.waits
            queue = w.serve() if waits else []
            if w.changed:  # a lapse or a hand-off was written: what it changed counts
                found, ahead = w.activity(), None
            shares = found.shares
            held = self._held = w.patterns(found.patterns, self._held)
            if ahead is None:  # read again: the index or the rows changed
                ahead = w.rows.prefetch(targets, held=held)
            looks = [w.may_claim(t, agent_id, ahead, mode, queue, shares) for t in targets]
            if any(r.status == "busy" for r, _ in looks):
                return "busy", tuple(
                    ClaimResult("available", r.resource) if r.status == "claimed" else r
                    for r, _ in looks
                )
            results = tuple(
                r if r.status == "already_claimed" else w.grant(t, info, agent_id, principal,
                                                                mode, shares)
                for t, (r, info) in zip(targets, looks, strict=True)
            )  # fmt: skip
            w.flush()
            if waits and (told := [t.key for t, (r, _) in zip(targets, looks, strict=True)
                                   if r.status == "already_claimed"]):  # fmt: skip
                w.adopt(agent_id, told)  # a claim its own wait was handed: now heard of
        return "claimed", results

    def _targets(self, resources: Sequence[str | Resource | Pattern]) -> list[Resource | Pattern]:
        return targets_of(self.resolver, resources)

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
        plan = plan_release(self.resolver, resource, outcome, moved_to)
        check_agent_id(agent_id)
        return self._release([plan], agent_id, principal)[0]

    def release_many(
        self,
        releases: Sequence[tuple[str, str] | tuple[str, str, str | None]],
        agent_id: str,
        *,
        principal: str | None = None,
    ) -> ReleaseSetResult:
        """Release several claims in one transaction: ``releases`` are (resource, outcome) or
        (resource, outcome, moved_to). All are released or, on any error (NotHolderError...),
        none is."""
        plans = plan_releases(self.resolver, releases)
        check_agent_id(agent_id)
        return ReleaseSetResult(self._release(plans, agent_id, principal))

    def _release(
        self, plans: list[Plan], agent_id: str, principal: str | None
    ) -> tuple[ReleaseResult, ...]:
        with self.db.write() as (conn, changed):
            w = self._begin(conn, changed)
            w.check_owner(agent_id, principal)
            named = [p.named.key for p in plans]  # each name as written too: see ClaimWrite.release
            res = [p.res for p in plans]
            (waits, shares, _), ahead = w.touch_and_look(agent_id, res, named, blockers=False)
            if ahead is None or w.changed:  # a lapse was released: read its rows again
                ahead = w.rows.prefetch(res, named, blockers=False)
            results = tuple(w.release(plan, ahead, agent_id, principal, shares) for plan in plans)
            w.flush()
            if waits:
                w.serve()  # hand what was freed to the queue, oldest first
        return results

    def status(self, resource: str | Resource | Pattern) -> StatusResult:
        """Whether ``resource`` is "available" (with what the last holder left) or "claimed"
        (by its own claim, or one that covers or overlaps it: ``holder.held_as`` names it)."""
        return self._rows().look(self.target(resource))[0]

    def status_many(
        self, resources: Sequence[str | Resource | Pattern]
    ) -> tuple[StatusResult, ...]:
        """The status of each of ``resources``, all read in one snapshot; claims nothing."""
        targets = self._targets(resources)
        if not self._tables:
            return tuple(StatusResult("available", t.uri) for t in targets)
        with self.db.snapshot() as conn:
            # the database's clock, as a single status reads it: leases are judged alike by
            # hosts whose clocks disagree
            rows = ClaimRows(fetch_in(conn), self.db.now())
            return tuple(rows.look(t)[0] for t in targets)

    def _rows(self) -> ClaimRows:
        """The claims as plain reads see them now (none before the claims tables exist)."""
        if not self._tables:
            return ClaimRows(lambda sql, args: [], self.db.now())
        return ClaimRows(self.db.fetchall, self.db.now())

    def info(self, resource: Resource | Pattern) -> ClaimInfo | None:
        """The claim state of a resolved resource, or None if it was never claimed."""
        return self._rows().own(resource)

    def list_claims(self, *, include_free: bool = False) -> list[ClaimInfo]:
        """Current claims (or every resource ever claimed), sorted by URI."""
        if not self._tables:
            return []
        now = self.db.now()
        where = "" if include_free else "WHERE c.holder IS NOT NULL "
        infos = [claim_info(r, now) for r in self.db.fetchall(CLAIM_ROW + where + "ORDER BY c.uri")]
        return infos if include_free else [i for i in infos if i.state == "claimed"]

    def queue(self) -> list[Queued]:
        """The waits that claim, in line, oldest first (a read: dead ones are skipped)."""
        return self._rows().queue()

    def shares(self) -> list[ClaimInfo]:
        """Every live shared hold, by resource, oldest reader first."""
        return self._rows().shares()

    def in_the_way(self, resource: str | Resource | Pattern, mode: str = "exclusive") -> InTheWay:
        """Every live claim and wait in line that would refuse a new agent's claim of
        ``resource`` in ``mode`` now; writes nothing."""
        target = self.target(resource)
        return self._rows().in_the_way(target, check_mode(mode))

    # -- waiting -------------------------------------------------------------------------------

    def probe(self, resource: Resource | Pattern) -> WaitProbe:
        """Look at ``resource`` once on behalf of a waiter (see ``wait``): its status, and the
        topics to listen to (the resource, the claims that hold it and their holders' leases)."""
        status, held = self._rows().look(resource)
        topics = {resource_topic(resource.key)}
        for info in held:
            assert info.holder is not None
            topics.update((resource_topic(info.resource), agent_topic(info.holder)))
        ends = [i.lease_ends_at for i in held if i.lease_ends_at is not None]
        # A claim handed to a queued wait is held by its agent before the waiter reads it; if
        # the waiter is dead, only a claim write gives it back (ClaimWrite.serve). A waiter
        # that only reads looks again when the grant's time to be read ends, and says so.
        unread = [
            float(row[0])
            for i in held
            if self._tables
            for row in self.db.fetchall(
                "SELECT min(alive_until) FROM claim_waiters WHERE resource = ? AND "
                "agent_id = ? AND granted IS NOT NULL AND granted_as = 'claimed'",
                (i.resource, i.holder),
            )
            if row[0] is not None
        ]
        now = self.db.now()
        return WaitProbe(
            status,
            frozenset(topics),
            min(ends + unread, default=None),
            unheard=any(end < now for end in unread),
        )

    def serve_queue(self) -> None:
        """One claim write that only serves the queue: claims handed to waits nobody read in
        time go back and go to the next in line (see ``probe``'s ``unheard``)."""
        with self.db.write() as (conn, changed):
            w = self._begin(conn, changed)
            w.serve()

    def wait(
        self,
        resource: str | Resource | Pattern,
        timeout: float,
        *,
        agent_id: str | None = None,
        claim: bool = False,
        mode: str = "exclusive",
        principal: str | None = None,
    ) -> WaitResult:
        """Block until ``resource`` is free ("available", with what the last holder left) or
        ``timeout`` seconds pass ("timeout", naming the holder).

        With ``claim``, ``agent_id`` joins the resource's queue instead: the oldest waiter is
        handed the claim (in ``mode``) as soon as it can be granted ("claimed", with the
        fencing version and what the last holder did). A wait that ends unanswered leaves."""
        res = self.target(resource)
        seconds = check_seconds("timeout", timeout, maximum=MAX_WAIT_SECONDS)
        if claim:
            return self._wait_to_claim(res, seconds, agent_id, mode, principal)
        if agent_id is not None or mode != "exclusive":
            raise InvalidInputError("agent_id and mode are for a wait with claim=True")
        start = time.monotonic()
        last: list[WaitProbe] = []

        def look() -> tuple[WaitResult | None, frozenset[Topic], float | None]:
            probe = self.probe(res)
            if probe.unheard:  # a claim handed to a dead waiter is in the way: it goes back
                self.serve_queue()
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

    def _wait_to_claim(
        self,
        res: Resource | Pattern,
        seconds: float,
        agent_id: str | None,
        mode: str,
        principal: str | None,
    ) -> WaitResult:
        if agent_id is None:
            raise InvalidInputError(
                "a wait with claim needs agent_id: the agent the claim is handed to"
            )
        check_agent_id(agent_id)
        check_mode(mode)
        start, seq, seen = time.monotonic(), None, None

        def look() -> tuple[QueueLook | None, frozenset[Topic], float | None]:
            nonlocal seq, seen
            left = max(0.0, seconds - (time.monotonic() - start))
            step = self.queue_look(res, agent_id, mode, seq, left, principal=principal)
            seq, seen = step.seq, step.result
            if step.result is not None or not step.in_line:
                return step, step.topics, None
            return None, step.topics, step.wake_at

        try:
            step = wait_until(self.db, look, seconds, {resource_topic(res.key)})
        except BaseException:  # the caller hears of no claim: one handed meanwhile goes back
            if seq is not None:
                self.leave_queue(seq, Unheard(res, agent_id, mode, principal, seen))
            raise
        got = step.result if step is not None else None if seq is None else self.leave_queue(seq)
        if got is not None:
            return claim_waited(got, time.monotonic() - start)
        return waited(res, self.probe(res), time.monotonic() - start)

    def queue_look(
        self,
        target: Resource | Pattern,
        agent_id: str,
        mode: str,
        seq: int | None,
        seconds: float,
        *,
        principal: str | None = None,
    ) -> QueueLook:
        """One look of a wait with claim (see ``wait``), in one write: join the queue (``seq``
        None: for ``seconds``) or check the place ``seq``, serve the queue, and say whether this
        wait was granted, or what to listen to until the next look."""
        with self.db.write() as (conn, changed):
            w = self._begin(conn, changed)
            now = w.now
            w.check_owner(agent_id, principal)
            if seq is not None:
                lease = w.conn.execute(
                    "SELECT lease_ends_at, principal FROM agents WHERE agent_id = ?", (agent_id,)
                ).fetchone()
                in_line, got = w.handed(seq)
                if got is not None:
                    return QueueLook(seq, got)
                live = self.principal_live
                if (
                    lease is None
                    or (lease[0] is not None and lease[0] <= now)
                    or (not in_line and lease[1] is not None and live is not None
                        and not live(lease[1]))
                ):  # fmt: skip
                    w.leave(seq)  # its agent's lease ended (or principal went): skipped
                    return QueueLook(seq, None, in_line=False)
                if in_line:
                    w.renew(seq)  # still listening
                else:  # dropped for looking late (its row's liveness passed, say on a loaded
                    seq = None  # machine): with time left, the wait joins the line again

            w.touch(agent_id)
            if seq is None:
                seq = w.enqueue(target, agent_id, check_mode(mode), now + seconds)
            queue = w.serve()
            _, got = w.handed(seq)
            if got is not None:
                return QueueLook(seq, got)
            # what stands in its way, and the older waits it is behind, are listened to
            infos = w.rows.in_way_of(target, agent_id, mode, w.rows.own(target))
            ahead = queued_in_way(queue, target, mode, agent_id, before=seq)
            topics = {resource_topic(target.key)}
            topics.update(resource_topic(i.resource) for i in infos)
            topics.update(agent_topic(i.holder) for i in infos if i.holder is not None)
            topics.update(resource_topic(w.target.key) for w in ahead)
            topics.update(agent_topic(w.agent_id) for w in ahead)
            ends = [i.lease_ends_at for i in infos if i.lease_ends_at is not None]
            ends += [w.until for w in ahead]
            ends.append(now + self.waiter_liveness / 3)  # look again in time to stay alive
            if self.claim_ttl is not None:  # look again in time to renew its own lease
                ends.append(now + self.claim_ttl / 2)
            return QueueLook(seq, None, True, frozenset(topics), min(ends, default=None))

    def leave_queue(self, seq: int, unheard: Unheard | None = None) -> ClaimResult | None:
        """End a wait with claim that timed out: the claim it was handed meanwhile, if any,
        which its agent then holds; else its place in line is kept ``waiter_liveness`` seconds
        for the agent's next wait for the same target (ClaimWrite.park). With ``unheard``,
        nobody will read the wait's answer (it was cancelled): it leaves the queue, a claim it
        was handed is given back, and the waits behind it are served, in the same
        transaction."""
        with self.db.write() as (conn, changed):
            w = self._begin(conn, changed)
            if unheard is not None:
                w.give_back(unheard, w.leave(seq))
                got = None
            else:
                _, got = w.handed(seq)
                if got is None:  # timed out: its place is kept for a moment (ClaimWrite.park)
                    w.park(seq)
            if got is None:
                w.serve()  # the waits behind it may go now
            return got

    # -- leases --------------------------------------------------------------------------------

    def end_lease(self, agent_id: str, grace: float, outcome: str = "abandoned") -> None:
        """End ``agent_id``'s lease ``grace`` seconds from now unless it acts again first; then
        its claims are free with ``outcome``. A lease that already ends sooner is kept, and an
        agent that is gone (never registered, or reaped) is left alone."""
        check_agent_id(agent_id)
        grace = check_seconds("grace", grace, maximum=10 * 365 * 86400)
        if outcome not in LAPSE_OUTCOMES:
            raise InvalidInputError(f"outcome must be 'abandoned' or 'expired', got {outcome!r}")
        with self.db.write() as (conn, changed):
            w = self._begin(conn, changed)
            w.end_lease(agent_id, grace, outcome)

    def release_all(self, agent_id: str, outcome: str = "abandoned") -> list[str]:
        """Release every claim ``agent_id`` holds with ``outcome``; returns their URIs (none for
        an agent that is gone: cleaning up is idempotent)."""
        check_agent_id(agent_id)
        if outcome not in OUTCOMES + LAPSE_OUTCOMES or outcome == "moved":
            raise InvalidInputError(f"release_all cannot use outcome {outcome!r}")
        with self.db.write() as (conn, changed):
            w = self._begin(conn, changed)
            released = w.release_all(agent_id, outcome)
            w.serve(self.db.now())
        return released

    def reap_idle_agents(self, older_than: float) -> list[str]:
        """Remove agents that hold no live claim and made no call for ``older_than`` seconds;
        their ids stop working. Claims they let lapse are released first. Returns the ids."""
        older_than = check_seconds("older_than", older_than, maximum=10 * 365 * 86400)
        with self.db.write() as (conn, changed):
            w = self._begin(conn, changed)
            # last_seen_at is only rewritten once it is RENEW_EVERY old: allow for that lag, so
            # that no agent is ever reaped before older_than has passed since its last call (0
            # means "every agent not in a call right now", so it needs no allowance)
            return w.reap(utc_iso(w.now - older_than - (RENEW_EVERY if older_than else 0)))

    # -- a claim write --------------------------------------------------------------------------

    def _begin(self, conn: Any, changed: list[Topic]) -> ClaimWrite:
        """A claim write in the write transaction ``conn``: it takes the claims lock, and reads
        the database's clock once the lock is held (a wait for it may cross a lease end, and
        every host must judge leases by the same clock)."""
        now = self.db.serialize(conn, CLAIMS_LOCK)
        return ClaimWrite(
            conn, changed, now, claim_ttl=self.claim_ttl, renew_every=RENEW_EVERY,
            liveness=self.waiter_liveness, live=self.principal_live,
        )  # fmt: skip


def _aliased(by_file: dict[str, list[Any]], target: Resource) -> bool:
    """Whether a held claim on another name of ``target``'s file was read (``Prefetched``)."""
    if not by_file or target.file_id is None:
        return False
    return any(row[0] != target.key for row in by_file.get(target.file_id, ()))
