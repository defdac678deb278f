"""Reading claims: rows into records, and the live claims that stand in a resource's way.

Decisions behind it:
- Every lookup takes a ``fetchall(sql, args)``, so one code path reads inside a write
  transaction (a claim deciding), in a snapshot (a status of several resources) or with plain
  reads (a waiter's look).
- What stands in the way of a file: its own claim, a claim on another name of the same file (a
  hard link) and any directory or glob claim that covers it. Of a pattern: its own claim, every
  claim it covers and every pattern it overlaps (agenthold.claims.patterns). Found through indexes:
  a file's ancestor directories, a pattern's key range.
- A claim whose holder's lease has ended is free here, whatever the row says; the next write
  records the lapse (``Coordinator._record_lapse``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agenthold.claims.index import HeldPatterns
from agenthold.claims.names import Resolver, Resource, Walk
from agenthold.claims.patterns import (
    Pattern,
    ancestors,
    covers_file,
    held_pattern,
    is_pattern,
    overlaps,
    parse_pattern,
    resolve_target,
)
from agenthold.claims.records import OUTCOMES, ClaimInfo, ForeignAgentError
from agenthold.claims.schema import (
    _ALIASES,
    _CLAIM_ROW,
    _HELD_UNDER,
    _LOOK_ROW,
    _PATTERN_KEYS_AT,
    _PATTERNS_AT,
)
from agenthold.store import InvalidInputError, utc_iso

Fetch = Callable[[str, tuple[Any, ...]], list[Any]]
Target = Resource | Pattern
TOP = "\U0010ffff"  # sorts after every character: [k, k + TOP) is every key that starts with k


def fetch_in(conn: Any) -> Fetch:
    """A Fetch that reads inside the transaction or snapshot ``conn``."""

    def fetch(sql: str, args: tuple[Any, ...]) -> list[Any]:
        return list(conn.execute(sql, args).fetchall())

    return fetch


def claim_info(row: Any, now: float) -> ClaimInfo:
    (key, uri, holder, claimed_at, version, outcome, last_holder, outcome_at, moved_to) = row[:9]
    name, model, lease_end, lease_outcome, scope = row[9:14]
    if holder is not None and (name is None or (lease_end is not None and lease_end <= now)):
        # the holder's lease has ended (or its agent row is gone): the claim is free
        return ClaimInfo(
            key, uri, "free", version, None, None, None, None, None,
            lease_outcome or "abandoned", holder,
            utc_iso(lease_end) if lease_end is not None else claimed_at, None, scope,
        )  # fmt: skip
    return ClaimInfo(
        key, uri, "claimed" if holder else "free", version, holder, name, model, claimed_at,
        lease_end, outcome, last_holder, outcome_at, moved_to, scope,
    )  # fmt: skip


def own(fetchall: Fetch, target: Target, now: float) -> ClaimInfo | None:
    """The claim row of ``target`` itself, or None if it was never claimed."""
    rows = fetchall(_CLAIM_ROW + "WHERE c.resource = ?", (target.key,))
    return claim_info(rows[0], now) if rows else None


@dataclass
class Prefetched:
    """The rows a set of targets needs, read in one statement instead of two or three per
    target: their own claim rows (and those of ``extra`` keys), and, ``blockers`` unless false,
    the held patterns at any of their files' ancestors and the held claims on other names of
    their files (rows are 15 columns here: ``_LOOK_ROW``, the file id last). ``held``, if
    given, names the patterns that may cover the files instead of a read of them."""

    own: dict[str, Any]
    above: list[Any]
    by_file: dict[str, list[Any]]

    @classmethod
    def read(
        cls,
        fetchall: Fetch,
        targets: Sequence[Target],
        extra: Sequence[str] = (),
        *,
        blockers: bool = True,
        held: HeldPatterns | None = None,
    ) -> Prefetched:
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
                    covering = covering_keys(fetchall, dirs, [t.key for t in files])
        wanted = set(keys)
        keys = tuple(dict.fromkeys([*keys, *covering]))  # the patterns' rows, read whole
        sql = _look_statement(len(keys), len(ids))
        own: dict[str, Any] = {}
        above: list[Any] = []
        by_file: dict[str, list[Any]] = {}
        at = set(covering)
        for row in fetchall(sql, keys + ids):
            # a row may answer several of the conditions
            if row[0] in wanted:
                own[row[0]] = row
            if row[2] is not None and row[0] in at:
                above.append(row)
            if row[2] is not None and row[14] is not None:
                by_file.setdefault(row[14], []).append(row)
        return cls(own, above, by_file)

    def own_of(self, target: Target, now: float) -> ClaimInfo | None:
        row = self.own.get(target.key)
        return None if row is None else claim_info(row, now)


@functools.lru_cache(maxsize=256)
def _look_statement(keys: int, ids: int) -> str:
    """Prefetched's statement for ``keys`` claim keys and ``ids`` file ids."""
    sql = _LOOK_ROW + f"WHERE c.resource IN ({', '.join('?' * keys)})"
    if ids:
        sql += f" OR (c.holder IS NOT NULL AND c.file_id IN ({', '.join('?' * ids)}))"
    return sql


def covering_keys(fetchall: Fetch, dirs: Sequence[str], files: Sequence[str]) -> list[str]:
    """The keys of the held patterns at ``dirs`` (the files' ancestors) that cover any of
    ``files``: matched on key and scope alone, so the rows of the many that cover none of them
    are never read whole."""
    rows = fetchall(_PATTERN_KEYS_AT.format(marks=", ".join("?" * len(dirs))), tuple(dirs))
    return [k for k, scope in rows if any(covers_file(k, scope, f) for f in files)]


def pattern_of(info: ClaimInfo) -> Pattern:
    assert info.scope is not None
    return held_pattern(info.uri, info.resource, info.scope)


def blocking(
    fetchall: Fetch,
    target: Target,
    now: float,
    agent_id: str | None = None,
    prefetched: Prefetched | None = None,
) -> list[ClaimInfo]:
    """Live claims of agents other than ``agent_id`` (None: of anyone) that stand in the way of
    ``target``, besides its own claim: aliases, covering patterns, covered or overlapping
    claims. Oldest key first, none twice."""
    rows: list[Any] = []
    if isinstance(target, Pattern):
        rows += fetchall(_HELD_UNDER, (target.scope, target.scope + TOP))
        above = ancestors(target.scope)
        rows += fetchall(_PATTERNS_AT.format(marks=", ".join("?" * len(above))), tuple(above))
    elif target.kind == "file" and prefetched is not None:
        rows = prefetched.above  # a superset: covers() keeps the patterns above this file
    elif target.kind == "file":
        covering = covering_keys(fetchall, ancestors(target.key), [target.key])
        if covering:
            marks = ", ".join("?" * len(covering))
            rows += fetchall(_CLAIM_ROW + f"WHERE c.resource IN ({marks})", tuple(covering))
    found: dict[str, ClaimInfo] = {}
    file = target.key if isinstance(target, Resource) else None
    for row in rows:
        # rows are claim_info's: key, uri, holder, ..., scope (13); a file is covered by few of
        # the patterns above it, so those that do not cover it are passed over first, cheaply
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
            same = fetchall(_ALIASES, (target.file_id, target.key))
        alias = _alias(same, target, now, agent_id)
        if alias is not None:
            found.setdefault(alias.resource, alias)
    return [found[k] for k in sorted(found)]


def _alias(
    rows: Sequence[Any], resource: Resource, now: float, agent_id: str | None
) -> ClaimInfo | None:
    """Of ``rows`` (held claims on other names that recorded ``resource``'s file), a live claim
    by another agent than ``agent_id``.

    A claim records its file's device and inode; it counts only while the name it was taken
    under still leads to that file, so a deleted file whose inode is reused blocks nothing."""
    for row in rows:
        info = claim_info(row, now)
        if info.state != "claimed" or info.holder == agent_id:
            continue
        try:
            found = os.stat(info.resource.removeprefix("file://"))
        except (OSError, ValueError):
            continue
        if f"{found.st_dev}:{found.st_ino}" == resource.file_id:
            return info
    return None


def check_owner(conn: Any, agent_id: str, principal: str | None) -> None:
    """ForeignAgentError if ``principal`` is not who ``agent_id`` belongs to (None: trusted).
    An unknown agent passes here; the call that follows says it is unknown."""
    if principal is None:
        return
    row = conn.execute("SELECT principal FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
    if row is not None and row[0] != principal:
        raise ForeignAgentError(agent_id)


@dataclass(frozen=True, slots=True)
class Plan:
    """A release, checked before its transaction: the claim under the name as written
    (``named``) and as resolved (``res``), and the error to raise if only ``named`` is held."""

    named: Resource | Pattern
    res: Resource | Pattern
    refused: InvalidInputError | None
    outcome: str
    moved_to: str | None


def plan_release(
    resolver: Resolver,
    resource: str,
    outcome: str = "released",
    moved_to: str | None = None,
    *,
    walk: Walk | None = None,
) -> Plan:
    """Check a release's arguments before its transaction (``walk``: see Resolver.resolve)."""
    if outcome not in OUTCOMES:
        raise InvalidInputError(f"outcome must be one of {', '.join(OUTCOMES)}; got {outcome!r}")
    refused: InvalidInputError | None = None
    named: Resource | Pattern
    res: Resource | Pattern
    if is_pattern(resource):
        named = res = parse_pattern(resolver, resource)
    else:
        named, followed = resolver.resolve_both(resource, walk=walk)
        if isinstance(followed, InvalidInputError):  # a link made after the claim leads out
            res, refused = named, followed
        else:
            res = followed
    target: Resource | Pattern | None = None
    if outcome == "moved":
        if moved_to is None or moved_to == "":
            raise InvalidInputError(
                "outcome 'moved' needs moved_to: the resource's new path or URI"
            )
        target = resolve_target(resolver, moved_to)
        if target.key == res.key:
            raise InvalidInputError(
                f"moved_to {moved_to!r} is the released resource itself; give the new location"
            )
    elif moved_to not in (None, ""):
        raise InvalidInputError(
            f"moved_to is only for outcome 'moved' (the outcome given is {outcome!r})"
        )
    return Plan(named, res, refused, outcome, None if target is None else target.uri)


MAX_SET = 100  # resources one call may claim, release or look at together


def target_of(
    resolver: Resolver, resource: str | Resource | Pattern, walk: Walk | None = None
) -> Resource | Pattern:
    """What ``resource`` names: a file or custom resource, or a directory or glob."""
    if isinstance(resource, (Resource, Pattern)):
        return resource
    return resolve_target(resolver, resource, walk)


def targets_of(
    resolver: Resolver, resources: Sequence[str | Resource | Pattern]
) -> list[Resource | Pattern]:
    """What a set of resources names, each once (checked: a list of 1 to MAX_SET)."""
    if isinstance(resources, str) or not isinstance(resources, Sequence):
        raise InvalidInputError("resources must be a list of paths, URIs, directories or globs")
    if not 1 <= len(resources) <= MAX_SET:
        raise InvalidInputError(
            f"resources must list 1 to {MAX_SET} resources, got {len(resources)}"
        )
    unique: dict[str, Resource | Pattern] = {}
    walk = Walk() if len(resources) > 1 else None  # the directories the files share
    for resource in resources:
        found = target_of(resolver, resource, walk)
        unique.setdefault(found.key, found)  # one spelling of a resource counts once
    return list(unique.values())


def plan_releases(
    resolver: Resolver, releases: Sequence[tuple[str, str] | tuple[str, str, str | None]]
) -> list[Plan]:
    """The checked plans of a set of releases, (resource, outcome[, moved_to]) each."""
    if isinstance(releases, str) or not isinstance(releases, Sequence):
        raise InvalidInputError("releases must be a list of (resource, outcome[, moved_to])")
    if not 1 <= len(releases) <= MAX_SET:
        raise InvalidInputError(f"resources must list 1 to {MAX_SET} releases, got {len(releases)}")
    plans = []
    walk = Walk() if len(releases) > 1 else None  # the directories the files share
    for item in releases:
        # a tuple is checked first: isinstance of an abstract Sequence costs more
        listed = type(item) is tuple or (not isinstance(item, str) and isinstance(item, Sequence))
        if not listed or not 2 <= len(item) <= 3:
            raise InvalidInputError(
                f"each release is (resource, outcome) or (resource, outcome, moved_to), "
                f"got {item!r}"
            )
        plans.append(plan_release(resolver, *item, walk=walk))
    return plans
