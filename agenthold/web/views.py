"""What the live page shows, read from one database without ever writing to it.

Decisions behind it:
- The database is opened as the inspector opens it (``StateStore(target, read_only=True)``: a
  ``mode=ro`` connection with ``query_only`` on SQLite, a read-only transaction mode on
  PostgreSQL), so the page cannot write, create, migrate or clean up anything.
- Every fact comes through the library's own reads (``Coordinator``, ``StateStore``,
  ``MessageBus``) and the inspector's record shapes; this module holds no SQL, so it speaks
  both backends and follows their schemas.
- Everything returned is plain JSON (dicts, lists, strings, numbers). Instants stored by the
  database are sent as seconds on the database's clock together with ``now`` read from that
  same clock, so the browser counts leases down by the difference, never by its own clock.
- The event log is paged by the ids of its three append-only tables (claim events, state
  history, messages): a page takes up to ``limit`` rows of each below the cursors given, merges
  them in time order as the inspector does and keeps the newest ``limit``. A filter by agent or
  resource is passed to the library's reads, so a page of a filtered log of 100,000 events is
  one indexed read per table, never a scan in Python.
- A caller known by a token (``principal``) sees the namespaces, keys and writes its read
  scopes allow and the threads its thread-read scopes allow; claims and agents are shown to
  every caller the page lets in (they are the point of the page).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agenthold.bus.messagebus import MessageBus
from agenthold.claims.coordinator import Coordinator
from agenthold.claims.names import Resolver
from agenthold.inspect.commands import Inspector
from agenthold.inspect.tables import flagged
from agenthold.store import AgentholdError, InvalidInputError, StateStore

if TYPE_CHECKING:
    from agenthold.claims.names import Workspace
    from agenthold.claims.records import ClaimInfo
    from agenthold.claims.rows import Queued
    from agenthold.identity.principals import Principal

PAGE = 200  # events in one page of the log
MAX_PAGE = 1000
COVERED_SHOWN = 50  # files drawn under one directory or glob claim
WALK_LIMIT = 2000  # directory entries looked at on disk for one pattern claim
HISTORY_SHOWN = 50
MAX_WHAT = 300  # characters of an event's description sent to the page

__all__ = ["PAGE", "View", "WebInputError"]


class WebInputError(InvalidInputError):
    """A bad query (a cursor that is not a number, an unknown resource...): a 400 reply."""


class View:
    """One read-only database and the pages' reads of it."""

    def __init__(self, target: str, workspaces: Sequence[Workspace] = ()) -> None:
        self.store = StateStore(target, read_only=True)
        try:
            resolver = Resolver(workspaces) if workspaces else None
            self.coordinator = Coordinator(self.store, resolver)
            self.bus = MessageBus(self.store)
            self.inspector = Inspector(self.store, as_json=True)
        except BaseException:  # pragma: no cover - the store refused nothing above
            self.store.close()
            raise

    def close(self) -> None:
        self.store.close()

    # -- the overview: everything but the log ------------------------------------------------

    def overview(self, principal: Principal | None = None) -> dict[str, Any]:
        """Agents, claims (with their queues and covered files), namespaces and threads, as
        ``principal`` may see them."""
        coordinator = self.coordinator
        now = self.store.db.now()
        held = coordinator.list_claims() + coordinator.shares()
        queue = coordinator.queue()
        counts: dict[str, int] = {}
        for info in held:
            counts[info.holder or ""] = counts.get(info.holder or "", 0) + 1
        agents = []
        for agent in coordinator.list_agents():
            end = agent.lease_ends_at
            agents.append(
                {
                    **agent.to_dict(),
                    "lease_end": end,
                    "lease_state": "none" if end is None else "active" if end > now else "ended",
                    "claims_held": counts.get(agent.agent_id, 0),
                    "waiting": sum(1 for w in queue if w.agent_id == agent.agent_id),
                }
            )
        known = [i.resource for i in coordinator.list_claims(include_free=True) if i.scope is None]
        claims = [self.claim_record(i, queue, known, now) for i in held]
        claims.sort(key=lambda c: (c["resource"], c["mode"], c["claimed_at"] or ""))
        found = {
            "now": now,
            "database": self.store.path,
            "agents": agents,
            "claims": claims,
            "queue": [queued_record(w) for w in queue],
            "namespaces": self.namespaces(None),
            "threads": self.threads(None),
        }
        return found if principal is None else self.scoped(found, principal)

    def claim_record(
        self, info: ClaimInfo, queue: Sequence[Queued], known: Sequence[str], now: float
    ) -> dict[str, Any]:
        from agenthold.claims.rows import conflict, pattern_of

        target = self.coordinator.target(info.uri) if info.scope is None else pattern_of(info)
        behind = [w for w in queue if conflict(w.target, w.mode, target, info.mode)]
        record: dict[str, Any] = {
            "resource": info.uri,
            "kind": "file" if info.uri.startswith("file://") else "custom",
            "mode": info.mode,
            "holder": info.holder,
            "holder_name": info.holder_name,
            "version": info.version,
            "claimed_at": info.claimed_at,
            "lease_end": info.lease_ends_at,
            "queue": [w.seq for w in behind],
            "covers": [],
        }
        if info.scope is not None:
            pattern = pattern_of(info)
            record["kind"] = pattern.kind
            record["covers"] = covered_files(pattern, known)
        return record

    def scoped(self, overview: dict[str, Any], principal: Principal) -> dict[str, Any]:
        """``overview`` as ``principal`` may see it: its namespaces and threads only."""
        return {
            **overview,
            "namespaces": [
                n for n in overview["namespaces"] if may_read(principal, n["namespace"])
            ],
            "threads": [
                t
                for t in overview["threads"]
                if may_read_thread(principal, t["name"] or t["thread_id"])
            ],
        }

    # -- one resource: why a claim of it is refused ------------------------------------------

    def why(self, resource: str, mode: str = "exclusive") -> dict[str, Any]:
        """Every claim and wait in line that stands in the way of a claim of ``resource``."""
        now = self.store.db.now()
        try:
            found = self.coordinator.in_the_way(resource, mode)
        except InvalidInputError as exc:
            raise WebInputError(str(exc)) from None
        target = found.target
        claims = []
        for info in found.claims:
            reason = "holds it" if info.resource == target.key else "covers or overlaps it"
            if info.mode == "shared" and mode == "exclusive":
                reason = "reads it (shared)" if info.resource == target.key else reason
            claims.append(
                {
                    "resource": info.uri,
                    "mode": info.mode,
                    "holder": info.holder,
                    "holder_name": info.holder_name,
                    "version": info.version,
                    "claimed_at": info.claimed_at,
                    "lease_end": info.lease_ends_at,
                    "why": reason,
                }
            )
        state = self.coordinator.info(target)
        return {
            "now": now,
            "resource": target.uri,
            "mode": mode,
            "free": not found.claims and not found.queue,
            "version": None if state is None else state.version,
            "last": None if state is None else state.to_dict(),
            "claims": claims,
            "queue": [queued_record(w) for w in found.queue],
        }

    # -- namespaces, keys, history ----------------------------------------------------------

    def namespaces(self, principal: Principal | None) -> list[dict[str, Any]]:
        return [n for n in self.store.namespace_summaries() if may_read(principal, n["namespace"])]

    def keys(self, namespace: str, principal: Principal | None) -> list[dict[str, Any]]:
        self.check_namespace(namespace, principal)
        return flagged(lambda d: self.store.list_keys(namespace, damaged=d), namespace=namespace)

    def history(
        self, namespace: str, key: str, principal: Principal | None
    ) -> list[dict[str, Any]]:
        self.check_namespace(namespace, principal)
        try:
            self.inspector.check_key(namespace, key)
        except AgentholdError as exc:
            raise WebInputError(str(exc)) from None
        return flagged(
            lambda d: self.store.history(namespace, key, HISTORY_SHOWN, damaged=d),
            event_type="write",
        )

    def check_namespace(self, namespace: str, principal: Principal | None) -> None:
        if not may_read(principal, namespace):
            raise WebInputError(f"this token may not read namespace {namespace!r}")
        try:
            self.inspector.check_namespace(namespace)
        except AgentholdError as exc:
            raise WebInputError(str(exc)) from None

    # -- the message bus -------------------------------------------------------------------

    def threads(self, principal: Principal | None) -> list[dict[str, Any]]:
        records = []
        for thread in self.bus.find_threads():
            if not may_read_thread(principal, thread.name or thread.id):
                continue
            info = self.bus.get_thread_info(thread.id)
            if info is None:  # pragma: no cover - deleted between the two reads
                continue
            unread = []
            for member in info.participants:
                state = self.bus.get_thread_read_state(thread.id, member)
                if state is not None:
                    unread.append({"name": member.name, "unread": state.unread_count})
            records.append(
                {
                    "thread_id": info.thread_id,
                    "name": info.name,
                    "message_count": info.message_count,
                    "participants": unread,
                    "last_activity_at": info.latest_activity_at,
                }
            )
        return records

    # -- the event log ---------------------------------------------------------------------

    def positions(self) -> list[Any]:
        """Where the log ends now: the cursors from which ``new_events`` follows it."""
        with self.store.db.snapshot() as conn:
            return [
                self.store.read_log(conn, None, limit=1)[1],
                self.coordinator.read_log(conn, limit=1)[1],
                self.bus.read_log(conn, limit=1)[1],
            ]

    def new_events(self, positions: list[Any]) -> list[dict[str, Any]]:
        """The events committed after ``positions``, which move past them."""
        with self.store.db.snapshot() as conn:
            state, positions[0] = self.store.read_log(conn, None, after=positions[0])
            claims, positions[1] = self.coordinator.read_log(conn, after=positions[1])
            appends, positions[2] = self.bus.read_log(conn, after=positions[2])
            names = self.coordinator.agent_names(conn)
        return self.merged(state, claims, appends, names)

    def page(
        self,
        before: Sequence[int | None] = (None, None, None),
        limit: int = PAGE,
        agent: str | None = None,
        resource: str | None = None,
        principal: Principal | None = None,
    ) -> dict[str, Any]:
        """A page of the log, newest last: up to ``limit`` events older than the cursors
        ``before`` (ids of state history, claim events, messages), with ``agent`` (a name or
        id) or ``resource`` (NAMESPACE or NAMESPACE/KEY of a namespace ever written, else a
        resource as agents name it) among those it names, if given."""
        names = self.coordinator.agent_names()
        ids = [a for a, n in names.items() if agent in (a, n)] if agent else []
        namespace = key = uri = None
        if resource is not None:
            namespace, _, key = resource.partition("/")
            if "://" in resource or not self.is_namespace(namespace):
                namespace = key = None
                try:  # a resource as agents name it: a URI, or a path in a workspace
                    uri = self.coordinator.target(resource).uri
                except InvalidInputError as exc:
                    raise WebInputError(f"resource: {exc}") from None
        read: list[list[Any]] = [[], [], []]
        with self.store.db.snapshot() as conn:
            if uri is None:
                read[0] = self.store.read_log(
                    conn, namespace, writer=agent, limit=limit, before=before[0]
                )[0]
            if (agent is None or ids) and namespace is None:
                read[1] = self.coordinator.read_log(
                    conn, agents=ids, uri=uri, limit=limit, before=before[1]
                )[0]
            if resource is None:
                read[2] = self.bus.read_log(conn, sender=agent, limit=limit, before=before[2])[0]
        state = [r for r in read[0] if not key or r[2] == key]
        events = self.merged(state, read[1], read[2], names)
        more = len(events) > limit or any(len(rows) == limit for rows in read)
        events = events[-limit:]
        cursors: list[int] = []
        for slot, rows in enumerate((state, read[1], read[2])):
            shown = [int(e["id"][1:]) for e in events if e["id"][0] == "scm"[slot]]
            if shown:
                cursors.append(min(shown))
            elif rows:  # all older than this page: the next page starts where this one did
                cursors.append(max(int(r[0]) for r in rows) + 1)
            elif slot == 0 and read[0]:  # rows of other keys only: skip them
                cursors.append(min(int(r[0]) for r in read[0]))
            else:
                cursors.append(0)  # nothing older in this table
        visible = [e for e in events if self.visible(e, principal)]
        # the filter as resolved, for the page to apply to the events it is sent live
        applied = {"agent": agent, "uri": uri, "namespace": namespace, "key": key or None}
        return {"events": visible, "before": cursors, "more": more, "filter": applied}

    def is_namespace(self, name: str) -> bool:
        try:
            return self.store.was_written(name)
        except InvalidInputError:
            return False

    def merged(
        self, state: list[Any], claims: list[Any], appends: list[Any], names: dict[str, str]
    ) -> list[dict[str, Any]]:
        """The rows of the three tables as the inspector's log records, in its time order,
        each with an ``id`` (s, c or m and the row's id) and the ``what`` the log shows."""
        events = self.inspector.events(state, claims, names, appends)
        keys = sorted(
            [((r[6], 0, r[0]), f"s{r[0]}") for r in state]
            + [((r[1], 1, r[0]), f"c{r[0]}") for r in claims]
            + [((r[6], 2, r[0]), f"m{r[0]}") for r in appends]
        )
        for event, (_, event_id) in zip(events, keys, strict=True):
            event["id"] = event_id
            what = self.inspector.log_row(event)[4]
            event["what"] = what if len(what) <= MAX_WHAT else what[: MAX_WHAT - 1] + "…"
            event["value"] = None  # the log shows "what"; a key's page shows whole values
        return events

    def visible(self, event: dict[str, Any], principal: Principal | None) -> bool:
        if principal is None:
            return True
        if event["namespace"] is not None:
            return may_read(principal, event["namespace"])
        if event["thread_id"] is not None:
            return self.thread_visible(principal, event["thread_id"])
        return True

    def thread_visible(self, principal: Principal, thread_id: str) -> bool:
        thread = self.bus.get_thread(thread_id)
        return thread is not None and may_read_thread(principal, thread.name or thread.id)


def queued_record(w: Queued) -> dict[str, Any]:
    return {
        "seq": w.seq,
        "resource": w.target.uri,
        "agent_id": w.agent_id,
        "name": w.name,
        "mode": w.mode,
        "since": w.since,
        "until": w.until,
    }


def covered_files(pattern: Any, known: Sequence[str]) -> list[str]:
    """The files a directory or glob claim covers: those ever claimed, and those on disk under
    its directory (a bounded walk), as URIs, sorted; at most COVERED_SHOWN."""
    keys = {k for k in known if pattern.covers(k)}
    root = pattern.scope.removeprefix("file://")
    if pattern.scope.startswith("file://") and os.path.isdir(root):
        seen, stack = 0, [root]
        while stack and seen < WALK_LIMIT and len(keys) < COVERED_SHOWN * 4:
            try:
                entries = list(os.scandir(stack.pop()))
            except OSError:
                continue
            for entry in sorted(entries, key=lambda e: e.name):
                seen += 1
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif pattern.covers("file://" + entry.path):
                    keys.add("file://" + entry.path)
    tail = pattern.key[len(pattern.scope) :]
    base = pattern.uri[: len(pattern.uri) - len(tail)] if tail else pattern.uri
    return sorted(base + k[len(pattern.scope) :] for k in keys)[:COVERED_SHOWN]


def may_read(principal: Principal | None, namespace: str) -> bool:
    return principal is None or principal.scopes.may_read(namespace)


def may_read_thread(principal: Principal | None, thread: str) -> bool:
    return principal is None or principal.scopes.may_read_thread(thread)
