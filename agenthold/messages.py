"""``agenthold.messages``, kept importable: the message bus lives in :mod:`agenthold.bus`."""

from __future__ import annotations

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
