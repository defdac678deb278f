"""Resource claims: agents, exclusive and shared claims on files, directories and globs, leases,
fencing versions and the FIFO queue of waits, in the same database as the state store.

This face is the room's public API. Names load on first use, so that a module of the room (the
edit hook reads only patterns, names and the schema) does not pay for the whole Coordinator.
"""

from __future__ import annotations

from agenthold.lazy import loader

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:
    from agenthold.claims.coordinator import (
        AGENT_ID_RE,
        CLAIMS_SCHEMA,
        LAPSE_OUTCOMES,
        MAX_AGENT_NAME,
        MAX_MODEL,
        MAX_PURPOSE,
        MAX_SET,
        OUTCOMES,
        Agent,
        ClaimInfo,
        ClaimResult,
        ClaimSetResult,
        Coordinator,
        ForeignAgentError,
        Holder,
        NotHolderError,
        Previous,
        Registration,
        ReleaseResult,
        ReleaseSetResult,
        StatusResult,
        UnknownAgentError,
        WaitProbe,
        WaitResult,
        waited,
    )

__all__ = [
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

_LAZY = {
    "AGENT_ID_RE": "agenthold.claims.coordinator",
    "CLAIMS_SCHEMA": "agenthold.claims.coordinator",
    "LAPSE_OUTCOMES": "agenthold.claims.coordinator",
    "MAX_AGENT_NAME": "agenthold.claims.coordinator",
    "MAX_MODEL": "agenthold.claims.coordinator",
    "MAX_PURPOSE": "agenthold.claims.coordinator",
    "MAX_SET": "agenthold.claims.coordinator",
    "OUTCOMES": "agenthold.claims.coordinator",
    "Agent": "agenthold.claims.coordinator",
    "ClaimInfo": "agenthold.claims.coordinator",
    "ClaimResult": "agenthold.claims.coordinator",
    "ClaimSetResult": "agenthold.claims.coordinator",
    "Coordinator": "agenthold.claims.coordinator",
    "ForeignAgentError": "agenthold.claims.coordinator",
    "Holder": "agenthold.claims.coordinator",
    "NotHolderError": "agenthold.claims.coordinator",
    "Previous": "agenthold.claims.coordinator",
    "Registration": "agenthold.claims.coordinator",
    "ReleaseResult": "agenthold.claims.coordinator",
    "ReleaseSetResult": "agenthold.claims.coordinator",
    "StatusResult": "agenthold.claims.coordinator",
    "UnknownAgentError": "agenthold.claims.coordinator",
    "WaitProbe": "agenthold.claims.coordinator",
    "WaitResult": "agenthold.claims.coordinator",
    "waited": "agenthold.claims.coordinator",
}


__getattr__ = loader(__name__, _LAZY)
