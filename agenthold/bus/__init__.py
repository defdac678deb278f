"""The message bus (the AgentMsgs design): named agents, threads of participants, ordered messages
and read cursors. This face is the room's public API; names load on first use.
"""

from __future__ import annotations

from agenthold.lazy import loader

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:
    from agenthold.bus.messagebus import (
        DEFAULT_POLL_LIMIT,
        MAX_AGENT_NAME,
        MAX_POLL_LIMIT,
        SCHEMA_VERSION,
        BusAgent,
        ForeignBusAgentError,
        Message,
        MessageBus,
        MessagePage,
        NameTakenError,
        NotParticipantError,
        ReadState,
        Thread,
        ThreadInfo,
        TooFewParticipantsError,
        UnknownThreadError,
    )

__all__ = [
    "DEFAULT_POLL_LIMIT",
    "MAX_AGENT_NAME",
    "MAX_POLL_LIMIT",
    "SCHEMA_VERSION",
    "BusAgent",
    "ForeignBusAgentError",
    "Message",
    "MessageBus",
    "MessagePage",
    "NameTakenError",
    "NotParticipantError",
    "ReadState",
    "Thread",
    "ThreadInfo",
    "TooFewParticipantsError",
    "UnknownThreadError",
]

_LAZY = {
    "DEFAULT_POLL_LIMIT": "agenthold.bus.messagebus",
    "MAX_AGENT_NAME": "agenthold.bus.messagebus",
    "MAX_POLL_LIMIT": "agenthold.bus.messagebus",
    "SCHEMA_VERSION": "agenthold.bus.messagebus",
    "BusAgent": "agenthold.bus.messagebus",
    "ForeignBusAgentError": "agenthold.bus.messagebus",
    "Message": "agenthold.bus.messagebus",
    "MessageBus": "agenthold.bus.messagebus",
    "MessagePage": "agenthold.bus.messagebus",
    "NameTakenError": "agenthold.bus.messagebus",
    "NotParticipantError": "agenthold.bus.messagebus",
    "ReadState": "agenthold.bus.messagebus",
    "Thread": "agenthold.bus.messagebus",
    "ThreadInfo": "agenthold.bus.messagebus",
    "TooFewParticipantsError": "agenthold.bus.messagebus",
    "UnknownThreadError": "agenthold.bus.messagebus",
}


__getattr__ = loader(__name__, _LAZY)
