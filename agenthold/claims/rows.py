"""Reading claims: rows into records, and what stands in a resource's way, as one transaction, a
snapshot or plain reads see it (``ClaimRows``).

Decisions behind it:
- A ``ClaimRows`` is a reading function (``fetch(sql, args)``) and the database time ``now``
  the leases are judged by, so one code path reads inside a claim write (deciding), in a
  snapshot (a status of several resources) or with plain reads (a waiter's look, the web page,
  the edit hook). The reader never writes: a dead wait or a lapsed claim it passes over is
  removed or recorded by the next claim write (agenthold.claims.write).
- What stands in the way of a file: its own claim, a claim on another name of the same file (a
  hard link) and any directory or glob claim that covers it. Of a pattern: its own claim, every
  claim it covers and every pattern it overlaps (agenthold.claims.patterns). Found through indexes:
  a file's ancestor directories, a pattern's key range. Shared holds in the way of an exclusive
  claim follow the same coverage rules.
- A claim whose holder's lease has ended is free here, whatever the row says.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agenthold.claims.index import HeldPatterns
from agenthold.claims.names import Resource
from agenthold.claims.patterns import Pattern, ancestors, covers_file, held_pattern, overlaps
from agenthold.claims.records import ClaimInfo, Holder, StatusResult, make_claim_info
from agenthold.claims.schema import (
    ALIASES,
    CLAIM_ROW,
    HELD_UNDER,
    LOOK_ROW,
    PATTERN_KEYS_AT,
    PATTERNS_AT,
    SHARE_ROW,
    WAITER_ROW,
)
from agenthold.store import utc_iso

__all__ = [
    "TOP",
    "ClaimRows",
    "Fetch",
    "InTheWay",
    "Look",
    "Prefetched",
    "Queued",
    "Target",
    "claim_info",
    "conflict",
    "fetch_in",
    "pattern_of",
    "queued_in_way",
]

Fetch = Callable[[str, tuple[Any, ...]], list[Any]]
Target = Resource | Pattern
TOP = "\U0010ffff"  # sorts after every character: [k, k + TOP) is every key that starts with k
PrincipalLive = Callable[[str], bool]  # whether a principal (by name) may still call


def fetch_in(conn: Any) -> Fetch:
    """A Fetch that reads inside the transaction or snapshot ``conn``."""

    def fetch(sql: str, args: tuple[Any, ...]) -> list[Any]:
        return conn.execute(sql, args).fetchall()  # type: ignore[no-any-return]

    return fetch


def claim_info(row: Any, now: float) -> ClaimInfo:
    (key, uri, holder, claimed_at, version, outcome, last_holder, outcome_at, moved_to) = row[:9]
    name, model, lease_end, lease_outcome, scope = row[9:14]
    if holder is not None and (name is None or (lease_end is not None and lease_end <= now)):
        # the holder's lease has ended (or its agent row is gone): the claim is free
        return make_claim_info(
            key, uri, "free", version, None, None, None, None, None,
            lease_outcome or "abandoned", holder,
            utc_iso(lease_end) if lease_end is not None else claimed_at, None, scope,
        )  # fmt: skip
    return make_claim_info(
        key, uri, "claimed" if holder else "free", version, holder, name, model, claimed_at,
        lease_end, outcome, last_holder, outcome_at, moved_to, scope,
    )  # fmt: skip


def pattern_of(info: ClaimInfo) -> Pattern:
    assert info.scope is not None
    return held_pattern(info.uri, info.resource, info.scope)


@dataclass
class Prefetched:
    """The rows a set of targets needs, read in one statement instead of two or three per
    target: their own claim rows (and those of ``extra`` keys), and, ``blockers`` unless false,
    the held patterns at any of their files' ancestors and the held claims on other names of
    their files (rows are 15 columns here: ``LOOK_ROW``, the file id last)."""

    own: dict[str, Any]
    above: list[Any]
    by_file: dict[str, list[Any]]

    def own_of(self, target: Target, now: float) -> ClaimInfo | None:
        row = self.own.get(target.key)
        return None if row is None else claim_info(row, now)


class Look:
    """A Prefetched read to run: its condition on ``claims AS c`` (``LOOK_ROW``'s) and its
    parameters, and how its rows are sorted:
    ``wanted``, the keys whose own rows are asked for, ``covering``, the keys of the patterns
    that may cover the files, and whether file ids were asked for too."""

    __slots__ = ("args", "condition", "covering", "ids", "wanted")

    def __init__(
        self, condition: str, args: tuple[str, ...], wanted: tuple[str, ...], covering: list[str],
        ids: bool,
    ) -> None:  # fmt: skip
        self.condition, self.args, self.wanted = condition, args, wanted
        self.covering, self.ids = covering, ids

    def sort(self, rows: Sequence[Any]) -> Prefetched:
        """The Prefetched of ``rows``, those ``sql`` read (``LOOK_ROW``'s 15 columns)."""
        own: dict[str, Any] = {}
        above: list[Any] = []
        by_file: dict[str, list[Any]] = {}
        if not self.covering and not self.ids:  # the common case: only the rows asked for
            for row in rows:
                own[row[0]] = row
            return Prefetched(own, above, by_file)
        wanted, at = set(self.wanted), set(self.covering)
        for row in rows:
            # a row may answer several of the conditions
            if row[0] in wanted:
                own[row[0]] = row
            if row[2] is not None:
                if row[0] in at:
                    above.append(row)
                if row[14] is not None:
                    by_file.setdefault(row[14], []).append(row)
        return Prefetched(own, above, by_file)


@functools.lru_cache(maxsize=256)
def _look_condition(keys: int, ids: int) -> str:
    """The condition of Prefetched's read for ``keys`` claim keys and ``ids`` file ids."""
    condition = f"c.resource IN ({', '.join('?' * keys)})"
    if ids:
        condition += f" OR (c.holder IS NOT NULL AND c.file_id IN ({', '.join('?' * ids)}))"
    return condition


@functools.lru_cache(maxsize=256)
def _look_statement(condition: str) -> str:
    return LOOK_ROW + "WHERE " + condition


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


def target_of_row(key: str, uri: str, scope: str | None, file_id: str | None) -> Target:
    """The target a row of claim_waiters names (its resource, uri, scope and file_id)."""
    if scope is not None:
        return Pattern.from_key(uri, key, scope)
    if uri.startswith("file://"):
        workspace, path = uri[len("file://") :].split("/", 1)
        return Resource(uri, key, "file", workspace, path, file_id)
    return Resource(uri, key, "custom", None, None)


def queued(row: Sequence[Any], now: float, live: PrincipalLive | None = None) -> Queued | None:
    """A ``WAITER_ROW`` not yet granted as a wait in line (parked, its place kept, included), or
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
    target = target_of_row(key, uri, scope, file_id)
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


@dataclass(frozen=True, slots=True)
class InTheWay:
    """What stands in the way of a claim of ``target`` in ``mode`` right now: the live claims
    (its own, aliases, covering, covered and overlapping ones, the shared holds an exclusive
    claim conflicts with) and the waits in line it would have to queue behind."""

    target: Target
    mode: str
    claims: tuple[ClaimInfo, ...]
    queue: tuple[Queued, ...]


class ClaimRows:
    """The claims as ``fetch`` reads them, leases judged at ``now`` (database time)."""

    __slots__ = ("fetch", "now")

    def __init__(self, fetch: Fetch, now: float) -> None:
        self.fetch = fetch
        self.now = now

    # -- a target's own row, and the rows of a set at once --------------------------------------

    def own(self, target: Target) -> ClaimInfo | None:
        """The claim row of ``target`` itself, or None if it was never claimed."""
        rows = self.fetch(CLAIM_ROW + "WHERE c.resource = ?", (target.key,))
        return claim_info(rows[0], self.now) if rows else None

    def prefetch(
        self,
        targets: Sequence[Target],
        extra: Sequence[str] = (),
        *,
        blockers: bool = True,
        held: HeldPatterns | None = None,
    ) -> Prefetched:
        """The Prefetched rows of ``targets``; ``held``, if given, names the patterns that may
        cover the files instead of a read of them."""
        look = self.look_for(targets, extra, blockers=blockers, held=held)
        return look.sort(self.fetch(_look_statement(look.condition), look.args))

    def look_for(
        self,
        targets: Sequence[Target],
        extra: Sequence[str] = (),
        *,
        blockers: bool = True,
        held: HeldPatterns | None = None,
    ) -> Look:
        """The statement ``prefetch`` runs for ``targets`` (for a caller that runs it as part
        of another: ClaimWrite.touch_and_look) and how its rows are sorted."""
        if len(targets) == 1 and (not extra or (len(extra) == 1 and extra[0] == targets[0].key)):
            one = targets[0]
            keys: tuple[str, ...] = (one.key,)  # the common case: one name
            if blockers and held is not None and not held.scopes and isinstance(one, Resource):
                # no pattern is held: the rows of its own name, and of its file's other names
                if one.kind != "file" or one.file_id is None:
                    return Look(_look_condition(1, 0), keys, keys, [], False)
                return Look(_look_condition(1, 1), (one.key, one.file_id), keys, [], True)
        else:
            keys = tuple(dict.fromkeys([*(t.key for t in targets), *extra]))
        ids: tuple[str, ...] = ()
        covering: list[str] = []
        if blockers:
            files = [t for t in targets if isinstance(t, Resource) and t.kind == "file"]
            ids = tuple(dict.fromkeys(t.file_id for t in files if t.file_id is not None))
            if held is not None:  # the held patterns, kept while the database's are the same
                covering = held.covering([t.key for t in files])
            else:
                # the files of a set often share their directories: each is listed once
                parents = dict.fromkeys(t.key[: t.key.rfind("/") + 1] for t in files)
                dirs = tuple(dict.fromkeys(a for p in parents for a in ancestors(p)))
                if dirs:
                    covering = self.covering_keys(dirs, [t.key for t in files])
        wanted = keys
        if covering:
            keys = tuple(dict.fromkeys([*keys, *covering]))  # the patterns' rows, read whole
        return Look(_look_condition(len(keys), len(ids)), keys + ids, wanted, covering, bool(ids))

    def covering_keys(self, dirs: Sequence[str], files: Sequence[str]) -> list[str]:
        """The keys of the held patterns at ``dirs`` (the files' ancestors) that cover any of
        ``files``: matched on key and scope alone, so the rows of the many that cover none of
        them are never read whole."""
        rows = self.fetch(PATTERN_KEYS_AT.format(marks=", ".join("?" * len(dirs))), tuple(dirs))
        return [k for k, scope in rows if any(covers_file(k, scope, f) for f in files)]

    # -- what stands in the way -----------------------------------------------------------------

    def blocking(
        self, target: Target, agent_id: str | None = None, prefetched: Prefetched | None = None
    ) -> list[ClaimInfo]:
        """Live claims of agents other than ``agent_id`` (None: of anyone) that stand in the way
        of ``target``, besides its own claim: aliases, covering patterns, covered or overlapping
        claims. Oldest key first, none twice."""
        fetch, now = self.fetch, self.now
        rows: list[Any] = []
        if isinstance(target, Pattern):
            rows += fetch(HELD_UNDER, (target.scope, target.scope + TOP))
            above = ancestors(target.scope)
            rows += fetch(PATTERNS_AT.format(marks=", ".join("?" * len(above))), tuple(above))
        elif target.kind == "file" and prefetched is not None:
            rows = prefetched.above  # a superset: covers() keeps the patterns above this file
        elif target.kind == "file":
            covering = self.covering_keys(ancestors(target.key), [target.key])
            if covering:
                marks = ", ".join("?" * len(covering))
                rows += fetch(CLAIM_ROW + f"WHERE c.resource IN ({marks})", tuple(covering))
        found: dict[str, ClaimInfo] = {}
        file = target.key if isinstance(target, Resource) else None
        for row in rows:
            # rows are claim_info's: key, uri, holder, ..., scope (13); a file is covered by few
            # of the patterns above it, so those that do not cover it are passed over first
            if row[2] is None or (
                file is not None and row[13] is not None and not covers_file(row[0], row[13], file)
            ):
                continue
            info = claim_info(row, now)
            if (
                info.resource == target.key
                or info.resource in found
                or info.state != "claimed"
                or info.holder == agent_id
            ):
                continue
            if info.scope is None:
                hit = isinstance(target, Pattern) and target.covers(info.resource)
            elif isinstance(target, Pattern):
                hit = overlaps(target, pattern_of(info))
            else:
                hit = True  # covers_file said so above
            if hit:
                found[info.resource] = info
        if isinstance(target, Resource) and target.file_id is not None:
            if prefetched is not None:
                same = [r for r in prefetched.by_file.get(target.file_id, ()) if r[0] != target.key]
            else:
                same = fetch(ALIASES, (target.file_id, target.key))
            alias = self._alias(same, target, agent_id)
            if alias is not None:
                found.setdefault(alias.resource, alias)
        return [found[k] for k in sorted(found)]

    def _alias(
        self, rows: Sequence[Any], resource: Resource, agent_id: str | None
    ) -> ClaimInfo | None:
        """Of ``rows`` (held claims on other names that recorded ``resource``'s file), a live
        claim by another agent than ``agent_id``.

        A claim records its file's device and inode; it counts only while the name it was taken
        under still leads to that file, so a deleted file whose inode is reused blocks nothing."""
        for row in rows:
            info = claim_info(row, self.now)
            if info.state != "claimed" or info.holder == agent_id:
                continue
            try:
                found = os.stat(info.resource.removeprefix("file://"))
            except (OSError, ValueError):
                continue
            if f"{found.st_dev}:{found.st_ino}" == resource.file_id:
                return info
        return None

    def in_way_of(
        self,
        target: Target,
        agent_id: str,
        mode: str,
        info: ClaimInfo | None,
        ahead: Prefetched | None = None,
        shares: bool = True,
    ) -> list[ClaimInfo]:
        """The live claims of others that a claim of ``target`` in ``mode`` conflicts with
        (``info``: its own row; ``shares`` false: no shared hold exists to look at)."""
        in_way = [info] if info is not None and info.state == "claimed" else []
        in_way += self.blocking(target, agent_id, ahead)
        if shares and mode == "exclusive":
            in_way += self.shares_in_way(target, agent_id)
        return in_way

    # -- shared holds ---------------------------------------------------------------------------

    def shares_in_way(self, target: Target, agent_id: str | None = None) -> list[ClaimInfo]:
        """Live shared holds of agents other than ``agent_id`` (None: of anyone) that an
        exclusive claim of ``target`` would conflict with: on the name itself, on another name of
        the same file, and covering, covered or overlapping patterns."""
        fetch = self.fetch
        rows = fetch(SHARE_ROW + "WHERE s.resource = ?", (target.key,))
        if isinstance(target, Pattern):
            rows += fetch(
                SHARE_ROW + "WHERE s.resource >= ? AND s.resource < ?",
                (target.scope, target.scope + TOP),
            )
            above = ancestors(target.scope)
        else:
            above = ancestors(target.key) if target.kind == "file" else []
        if above:
            marks = ", ".join("?" * len(above))
            rows += fetch(SHARE_ROW + f"WHERE s.scope IN ({marks})", tuple(above))
        aliases = []
        if isinstance(target, Resource) and target.file_id is not None:
            aliases = fetch(
                SHARE_ROW + "WHERE s.file_id = ? AND s.resource != ?", (target.file_id, target.key)
            )
        found: dict[tuple[str, str], ClaimInfo] = {}
        for row, alias in [(r, False) for r in rows] + [(r, True) for r in aliases]:
            info = dataclasses.replace(claim_info(row, self.now), mode="shared")
            assert info.holder is not None or info.state == "free"
            if info.state != "claimed" or info.holder == agent_id:
                continue
            assert info.holder is not None
            if (info.resource, info.holder) in found or not _hits(target, info, alias):
                continue
            found[(info.resource, info.holder)] = info
        # by name, then oldest reader first
        return sorted(
            found.values(), key=lambda i: (i.resource, i.claimed_at or "", i.holder or "")
        )

    def own_share(self, key: str, agent_id: str) -> bool:
        """Whether ``agent_id`` holds a shared claim on ``key`` (its lease is checked by the
        caller: every write renews it first, and releases what lapsed)."""
        return bool(
            self.fetch(
                "SELECT 1 FROM claim_shares WHERE resource = ? AND agent_id = ?", (key, agent_id)
            )
        )

    def shares(self) -> list[ClaimInfo]:
        """Every live shared hold, by resource, then oldest reader first."""
        rows = self.fetch(SHARE_ROW + "ORDER BY s.resource, s.claimed_at, s.agent_id", ())
        infos = (dataclasses.replace(claim_info(row, self.now), mode="shared") for row in rows)
        return [i for i in infos if i.state == "claimed"]

    # -- the queue, read only -------------------------------------------------------------------

    def queue(self) -> list[Queued]:
        """The waits in line, oldest first, as a claim write finds them, but read only: the dead
        ones are passed over, not removed (the next claim write removes them)."""
        rows = self.fetch(WAITER_ROW + "ORDER BY w.seq", ())
        found = (queued(row, self.now) for row in rows if row[9] is None)
        return [w for w in found if w is not None]

    def in_the_way(self, target: Target, mode: str) -> InTheWay:
        """Every claim and wait in line that would refuse a claim of ``target`` in ``mode`` by a
        new agent now (one read: nothing is written)."""
        info = self.own(target)
        claims = [info] if info is not None and info.state == "claimed" else []
        claims += self.blocking(target)
        if mode == "exclusive":
            claims += self.shares_in_way(target)
        queue = [w for w in self.queue() if conflict(w.target, w.mode, target, mode)]
        return InTheWay(target, mode, tuple(claims), tuple(queue))

    # -- a status -------------------------------------------------------------------------------

    def look(self, target: Target) -> tuple[StatusResult, list[ClaimInfo]]:
        """The status of ``target`` and the live claims that hold it (none if it is free)."""
        info = self.own(target)
        if info is not None and info.state == "claimed":
            return StatusResult("claimed", info.uri, info.version, holder=info.held()), [info]
        in_way = self.blocking(target)
        if not in_way:
            held = self.shares_in_way(target)
            if held:  # held shared, through its own name or a pattern: every reader is named
                version = None if info is None else info.version
                holders = tuple(h.held(h.uri if h.resource != target.key else None) for h in held)
                status = StatusResult(
                    "claimed", target.uri, version, holder=holders[0], mode="shared",
                    holders=holders,
                )  # fmt: skip
                return status, held
            previous = None if info is None else info.previous()
            return StatusResult("available", target.uri, previous=previous), []
        first = in_way[0]
        held_by = StatusResult("claimed", target.uri, first.version, holder=first.held(first.uri))
        return held_by, in_way


def _hits(target: Target, info: ClaimInfo, alias: bool) -> bool:
    """Whether the shared hold ``info`` stands in the way of an exclusive claim of ``target``
    (``alias``: it was found on another name of the same file)."""
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
