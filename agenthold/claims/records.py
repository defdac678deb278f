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

import re
from dataclasses import dataclass
from typing import Any, Literal

from agenthold.store import AgentholdError, InvalidInputError, Topic, utc_iso

__all__ = [
    "LAPSE_OUTCOMES",
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
    "Registration",
    "ReleaseResult",
    "ReleaseSetResult",
    "StatusResult",
    "UnknownAgentError",
    "WaitProbe",
    "WaitResult",
    "check_agent_id",
    "check_mode",
    "unknown_agent",
]

Outcome = Literal["released", "modified", "created", "deleted", "moved"]
Mode = Literal["exclusive", "shared"]
MODES: tuple[str, ...] = ("exclusive", "shared")
OUTCOMES: tuple[str, ...] = ("released", "modified", "created", "deleted", "moved")
LAPSE_OUTCOMES = ("expired", "abandoned")  # what a lease that ended means for its claims

MAX_AGENT_NAME = 128
MAX_MODEL = 128
MAX_PURPOSE = 1024
AGENT_ID_RE = re.compile(r"agent-[0-9a-f]{8,64}")


class UnknownAgentError(InvalidInputError):
    """The agent id was never registered here, or its agent was removed after a long idle time."""

    hint = (
        "Register the agent (Coordinator.register) to get an agent_id, then use it in every call."
    )


class ForeignAgentError(AgentholdError):
    """A caller named an agent that another principal registered. The message names neither
    the other principal nor anything about the agent."""

    hint = "Use an agent_id that was registered by the same principal; register to get one."

    def __init__(self, agent_id: str) -> None:
        super().__init__(
            f"agent_id {agent_id} belongs to another caller: only the caller that registered an "
            "agent may act as it; nothing was changed"
        )


class NotHolderError(InvalidInputError):
    """An agent tried to release a claim that another agent holds: ``held_by``, whose
    agent_id it is."""

    hint = "Only the holder can release a claim; Coordinator.status tells who holds it."

    def __init__(self, message: str, *, held_by: str) -> None:
        super().__init__(message)
        self.held_by = held_by


@dataclass(frozen=True, slots=True)
class Agent:
    """A registered agent. ``lease_ends_at`` is unix time, or None for a lease without end."""

    agent_id: str
    name: str
    model: str
    purpose: str
    registered_at: str
    last_seen_at: str
    lease_ends_at: float | None
    lease_end_outcome: str | None
    principal: str | None = None  # the caller it was registered through, if a token said

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "agent_id": self.agent_id,
            "name": self.name,
            "model": self.model,
            "purpose": self.purpose,
            "registered_at": self.registered_at,
            "last_seen_at": self.last_seen_at,
            "lease_ends_at": None if self.lease_ends_at is None else utc_iso(self.lease_ends_at),
            "lease_end_outcome": self.lease_end_outcome,
        }
        if self.principal is not None:
            d["principal"] = self.principal
        return d


@dataclass(frozen=True, slots=True)
class Registration:
    """A new agent: its id, to pass to every later call."""

    agent_id: str
    name: str
    model: str
    registered_at: str
    purpose: str = ""
    status: Literal["registered"] = "registered"


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
    queued: bool = False  # not a holder: a wait with claim, ahead in the queue (claim_queue)


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
    scope: str | None = None  # a directory or glob claim's directory key (claim_match)
    mode: str = "exclusive"  # "shared": a shared hold (claim_queue), one of possibly many

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


def check_mode(mode: object) -> str:
    if mode not in MODES:
        raise InvalidInputError(f"mode must be 'exclusive' or 'shared', got {mode!r}")
    return str(mode)


def check_agent_id(agent_id: object) -> str:
    if not isinstance(agent_id, str):
        raise UnknownAgentError(
            "agent_id must be a string that registering an agent gave, got "
            f"{type(agent_id).__name__}"
        )
    if not AGENT_ID_RE.fullmatch(agent_id):
        shown = agent_id if len(agent_id) <= 60 else agent_id[:60] + "…"
        raise UnknownAgentError(
            f"{shown!r} is not an agent_id: ids look like 'agent-1a2b3c4d5e6f7a8b' and come "
            "from registering an agent"
        )
    return agent_id


def unknown_agent(agent_id: str) -> AgentholdError:
    return UnknownAgentError(
        f"unknown agent_id {agent_id!r}: it was never registered with this database, or it "
        "was removed after a long idle time; register again"
    )
