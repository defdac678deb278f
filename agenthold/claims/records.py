"""The records and errors of agenthold.claims.coordinator: what a Coordinator returns and raises.

Decisions behind it:
- Every call returns a frozen dataclass, as the state store does, with the facts only: no
  reply wording and no hint that names a tool. The MCP tool layer (``claim_tools``) turns a
  result into the reply an agent reads; a Python caller reads the fields.
- A ``status`` string names what happened, with the same values the tools reply with, so that
  code written against either reads alike.
- Unix times are floats; ISO texts are UTC strings, as stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agenthold.identity.agents import (
    AGENT_ID_RE,
    MAX_AGENT_NAME,
    MAX_MODEL,
    MAX_PURPOSE,
    Agent,
    ForeignAgentError,
    Registration,
    UnknownAgentError,
    check_agent_id,
    unknown_agent,
)
from agenthold.store import InvalidInputError, Topic, utc_iso

if TYPE_CHECKING:
    from agenthold.claims.names import Resource
    from agenthold.claims.patterns import Pattern

__all__ = [  # the agent's names are the registry's (agenthold.identity.agents), named here too
    "AGENT_ID_RE",
    "LAPSE_OUTCOMES",
    "MAX_AGENT_NAME",
    "MAX_MODEL",
    "MAX_PURPOSE",
    "MODES",
    "OUTCOMES",
    "Agent",
    "ClaimInfo",
    "ClaimResult",
    "ClaimSetResult",
    "ForeignAgentError",
    "Holder",
    "NotHolderError",
    "Previous",
    "QueueLook",
    "Registration",
    "ReleaseResult",
    "ReleaseSetResult",
    "StatusResult",
    "Unheard",
    "UnknownAgentError",
    "WaitProbe",
    "WaitResult",
    "check_agent_id",
    "check_mode",
    "claim_waited",
    "make_claim_info",
    "make_claim_result",
    "make_release_result",
    "unknown_agent",
    "waited",
]

Outcome = Literal["released", "modified", "created", "deleted", "moved"]
Mode = Literal["exclusive", "shared"]
MODES: tuple[str, ...] = ("exclusive", "shared")
OUTCOMES: tuple[str, ...] = ("released", "modified", "created", "deleted", "moved")
LAPSE_OUTCOMES = ("expired", "abandoned")  # what a lease that ended means for its claims


class NotHolderError(InvalidInputError):
    """An agent tried to release a claim that another agent holds: ``held_by``, whose
    agent_id it is."""

    hint = "Only the holder can release a claim; Coordinator.status tells who holds it."

    def __init__(self, message: str, *, held_by: str) -> None:
        super().__init__(message)
        self.held_by = held_by


@dataclass(frozen=True, slots=True)
class Previous:
    """What the last holder of a free resource did with it, when that is worth knowing (any
    outcome but a plain "released"): modified, created, deleted, moved (to ``moved_to``),
    or expired / abandoned (its lease ended)."""

    outcome: str
    holder: str | None
    at: str | None
    moved_to: str | None = None


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a claim. ``held_as`` is the URI the claim was taken under when that is
    another name of the asked-for file (a hard link) or a claim that covers it."""

    agent_id: str
    name: str | None
    model: str | None
    claimed_at: str | None
    lease_ends_at: float | None
    held_as: str | None = None
    mode: str = "exclusive"  # "shared": one of possibly many readers
    queued: bool = False  # not a holder: a wait with claim, ahead in the queue


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
    scope: str | None = None  # a directory or glob claim's directory key (claims.patterns)
    mode: str = "exclusive"  # "shared": a shared hold, one of possibly many

    def previous(self) -> Previous | None:
        """What the last holder left, if the resource is free and it is worth knowing."""
        if self.state != "free" or self.last_outcome in (None, "released"):
            return None
        assert self.last_outcome is not None
        moved_to = self.moved_to if self.last_outcome == "moved" else None
        return Previous(self.last_outcome, self.last_holder, self.last_outcome_at, moved_to)

    def held(self, held_as: str | None = None) -> Holder:
        """The holder of a claimed resource."""
        assert self.holder is not None
        return Holder(
            self.holder,
            self.holder_name,
            self.holder_model,
            self.claimed_at,
            self.lease_ends_at,
            held_as,
            self.mode,
        )

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
class ClaimResult:
    """A claim's outcome. ``status``: "claimed" (``version`` is the fencing token, ``previous``
    what the last holder left), "already_claimed" (the agent held it already) or "busy"
    (``holder`` holds it; nothing was granted)."""

    status: Literal["claimed", "already_claimed", "busy", "available"]
    resource: str  # the canonical URI
    version: int | None = None
    previous: Previous | None = None
    holder: Holder | None = None
    conflicts: tuple[Holder, ...] = ()  # every claim that makes it busy (holder is the first)


@dataclass(frozen=True, slots=True)
class ClaimSetResult:
    """A claim of several resources at once: all were granted ("claimed") or none ("busy").
    Each of ``results`` says how that one stands: "claimed" or "already_claimed" in a granted
    set; "busy" (with its holder) or "available" (free, but not granted) in a refused one."""

    status: Literal["claimed", "busy"]
    results: tuple[ClaimResult, ...]


# Every claim and release builds these. A frozen dataclass's __init__ sets each field through
# object.__setattr__; setting the slots directly builds the same object in half the time (as
# agenthold.db.records does for the store's records).
_new = object.__new__
_INFO_SETTERS = tuple(ClaimInfo.__dict__[name].__set__ for name in ClaimInfo.__slots__)
_RESULT_SETTERS = tuple(ClaimResult.__dict__[name].__set__ for name in ClaimResult.__slots__)


def make_claim_info(
    resource: str,
    uri: str,
    state: Literal["claimed", "free"],
    version: int,
    holder: str | None,
    holder_name: str | None,
    holder_model: str | None,
    claimed_at: str | None,
    lease_ends_at: float | None,
    last_outcome: str | None,
    last_holder: str | None,
    last_outcome_at: str | None,
    moved_to: str | None,
    scope: str | None = None,
) -> ClaimInfo:
    """``ClaimInfo(...)`` of these fields (mode "exclusive"), built without its __init__."""
    info: ClaimInfo = _new(ClaimInfo)
    s = _INFO_SETTERS
    s[0](info, resource)
    s[1](info, uri)
    s[2](info, state)
    s[3](info, version)
    s[4](info, holder)
    s[5](info, holder_name)
    s[6](info, holder_model)
    s[7](info, claimed_at)
    s[8](info, lease_ends_at)
    s[9](info, last_outcome)
    s[10](info, last_holder)
    s[11](info, last_outcome_at)
    s[12](info, moved_to)
    s[13](info, scope)
    s[14](info, "exclusive")
    return info


def make_claim_result(
    status: Literal["claimed", "already_claimed", "busy", "available"],
    resource: str,
    version: int | None = None,
    previous: Previous | None = None,
) -> ClaimResult:
    """``ClaimResult(status, resource, version, previous)``, built without its __init__."""
    result: ClaimResult = _new(ClaimResult)
    s = _RESULT_SETTERS
    s[0](result, status)
    s[1](result, resource)
    s[2](result, version)
    s[3](result, previous)
    s[4](result, None)
    s[5](result, ())
    return result


@dataclass(frozen=True, slots=True)
class ReleaseSetResult:
    """A release of several resources at once, in one transaction: each one's result."""

    results: tuple[ReleaseResult, ...]
    status: Literal["released"] = "released"


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    """A release's outcome. ``status``: "released" (with the new ``version``), "already_free"
    (nothing held it; ``ended`` says so if it was the agent's own claim that lapsed) or
    "not_found" (no agent ever claimed it)."""

    status: Literal["released", "already_free", "not_found"]
    resource: str
    version: int | None = None
    outcome: str | None = None
    moved_to: str | None = None
    ended: Previous | None = None  # the caller's own claim lapsed before the release


_RELEASE_SETTERS = tuple(ReleaseResult.__dict__[name].__set__ for name in ReleaseResult.__slots__)


def make_release_result(
    status: Literal["released", "already_free", "not_found"],
    resource: str,
    version: int | None,
    outcome: str | None,
    moved_to: str | None,
) -> ReleaseResult:
    """``ReleaseResult(status, resource, version, outcome, moved_to)``, without its __init__."""
    result: ReleaseResult = _new(ReleaseResult)
    s = _RELEASE_SETTERS
    s[0](result, status)
    s[1](result, resource)
    s[2](result, version)
    s[3](result, outcome)
    s[4](result, moved_to)
    s[5](result, None)
    return result


@dataclass(frozen=True, slots=True)
class StatusResult:
    """A resource as of now: "available" (with ``previous``, if worth knowing) or "claimed"
    (by ``holder``, at fencing ``version``; ``mode`` "shared": ``holders`` are every reader)."""

    status: Literal["available", "claimed"]
    resource: str
    version: int | None = None
    previous: Previous | None = None
    holder: Holder | None = None
    mode: str = "exclusive"
    holders: tuple[Holder, ...] = ()


@dataclass(frozen=True, slots=True)
class WaitResult:
    """A wait's end: "available" (with ``previous``) or "timeout" (``holder`` still holds it);
    a wait with claim may end "claimed" or "already_claimed" (at fencing ``version``, with
    ``previous``: what the last holder did, a plain release included)."""

    status: Literal["available", "timeout", "claimed", "already_claimed"]
    resource: str
    elapsed_seconds: float
    previous: Previous | None = None
    holder: Holder | None = None
    version: int | None = None


@dataclass(frozen=True, slots=True)
class WaitProbe:
    """One look at a resource for a waiter: its status, and the topics to listen to (the
    resource, and its holder's lease if it is held)."""

    status: StatusResult
    topics: frozenset[Topic]
    lease_ends_at: float | None = None  # the soonest lease end of the claims in the way
    # a claim in the way was handed to a queued wait whose waiter did not read it in time:
    # a write that serves the queue (Coordinator.serve_queue) gives it back
    unheard: bool = False

    @property
    def available(self) -> bool:
        return self.status.status == "available"


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


@dataclass(frozen=True, slots=True)
class Unheard:
    """A wait with claim whose caller will never read its answer (cancelled, interrupted, its
    connection closed), as the caller knows it: what it waited for, for whom, in what mode, and
    the claim a look already read for it (``got``), whose answer was lost on the way."""

    target: Resource | Pattern
    agent_id: str
    mode: str
    principal: str | None = None
    got: ClaimResult | None = None


def waited(resource: Resource | Pattern, probe: WaitProbe, elapsed: float) -> WaitResult:
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


def check_mode(mode: object) -> str:
    if mode not in MODES:
        raise InvalidInputError(f"mode must be 'exclusive' or 'shared', got {mode!r}")
    return str(mode)
