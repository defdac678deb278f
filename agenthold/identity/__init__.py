"""Who is calling and what an agent is: principals with their tokens and scopes (principals.py,
standard library only, so ``agenthold token ...`` never imports mcp), and the agent registry
that claims and the bus share (agents.py). This face is the room's public API; names load on
first use, so a command that reads tokens does not load the registry, nor the other way round.
``digest`` is the form a token is kept in a token file (bench/perf/http_bench.py writes one).
"""

from __future__ import annotations

from agenthold.lazy import loader

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:
    from agenthold.identity.agents import (
        AGENT_ID_RE,
        MAX_AGENT_NAME,
        Agent,
        BusAgent,
        ForeignAgentError,
        ForeignBusAgentError,
        Registration,
        UnknownAgentError,
        check_agent_id,
    )
    from agenthold.identity.principals import (
        ALL_ACCESS,
        SHARED,
        TOOL_SETS,
        AuthFileError,
        Principal,
        Scopes,
        TokenTable,
        digest,
    )

__all__ = [
    "AGENT_ID_RE",
    "ALL_ACCESS",
    "MAX_AGENT_NAME",
    "SHARED",
    "TOOL_SETS",
    "Agent",
    "AuthFileError",
    "BusAgent",
    "ForeignAgentError",
    "ForeignBusAgentError",
    "Principal",
    "Registration",
    "Scopes",
    "TokenTable",
    "UnknownAgentError",
    "check_agent_id",
    "digest",
]

_LAZY = {
    "AGENT_ID_RE": "agenthold.identity.agents",
    "MAX_AGENT_NAME": "agenthold.identity.agents",
    "Agent": "agenthold.identity.agents",
    "BusAgent": "agenthold.identity.agents",
    "ForeignAgentError": "agenthold.identity.agents",
    "ForeignBusAgentError": "agenthold.identity.agents",
    "Registration": "agenthold.identity.agents",
    "UnknownAgentError": "agenthold.identity.agents",
    "check_agent_id": "agenthold.identity.agents",
    "ALL_ACCESS": "agenthold.identity.principals",
    "SHARED": "agenthold.identity.principals",
    "TOOL_SETS": "agenthold.identity.principals",
    "AuthFileError": "agenthold.identity.principals",
    "Principal": "agenthold.identity.principals",
    "Scopes": "agenthold.identity.principals",
    "TokenTable": "agenthold.identity.principals",
    "digest": "agenthold.identity.principals",
}


__getattr__ = loader(__name__, _LAZY)
