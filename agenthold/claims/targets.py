"""What a call names, checked before its transaction: the targets of a claim, a status or a
wait, and the plans of a set of releases.

Decisions behind it:
- Everything that can be refused without the database is refused here, before the claims lock
  is taken: the shape of the list, each resource's spelling, a release's outcome and moved_to.
- A set is resolved with one ``Walk``: the files of a set often share their directories, each
  of which is looked at on disk once.
- A release keeps both the name as written and as resolved: a claim taken before a symbolic
  link appeared is released under the name it was taken on (``ClaimWrite.release``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agenthold.claims.names import Resolver, Resource, Walk
from agenthold.claims.patterns import Pattern, is_pattern, parse_pattern, resolve_target
from agenthold.claims.records import OUTCOMES
from agenthold.store import InvalidInputError

__all__ = ["MAX_SET", "Plan", "plan_release", "plan_releases", "target_of", "targets_of"]


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
