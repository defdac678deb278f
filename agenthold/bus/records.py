"""The message bus's records, errors, limits and argument checks (messagebus.py uses them).

They live apart from the bus itself so that the bus module holds one thing, its storage and
operations, and so that the MCP tools can name the records and errors without the SQL. Records
are frozen dataclasses with ``to_dict()``, like the store's; every error is a ValueError
subclass (InvalidInputError) whose ``hint`` says what to do, and whose message carries the
AgentMsgs wording ("need >=2 participants", "agent name taken", "sender not in thread").
What a bus agent is (``BusAgent``, its name rule, ForeignBusAgentError) is the agent registry's,
agenthold.identity.agents, which claims share; the names are kept here for the bus's callers.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agenthold.identity.agents import (
    MAX_AGENT_NAME,
    BusAgent,
    ForeignBusAgentError,
    UnknownAgentError,
    bus_agent_of,
    check_bus_name,
)
from agenthold.store import InvalidInputError, check_int, check_text

__all__ = [
    "DEFAULT_POLL_LIMIT",
    "MAX_AGENT_NAME",
    "MAX_POLL_LIMIT",
    "MAX_THREAD_NAME",
    "AgentRef",
    "BusAgent",
    "ForeignBusAgentError",
    "Message",
    "MessagePage",
    "NameTakenError",
    "NotParticipantError",
    "ReadState",
    "Thread",
    "ThreadInfo",
    "ThreadRef",
    "TooFewParticipantsError",
    "UnknownThreadError",
    "check_content",
    "check_limit",
    "check_name",
    "check_thread_name",
    "check_uuid",
]

MAX_THREAD_NAME = 128  # a thread's optional name, which thread scopes match
DEFAULT_POLL_LIMIT = 100  # messages one poll or wait returns unless told otherwise
MAX_POLL_LIMIT = 1000  # the most one poll returns; read longer threads in pages


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class UnknownThreadError(InvalidInputError):
    """No thread has this id in this database."""

    hint = "Check the thread id, and that you use the same database; create_thread makes a new one."


class NameTakenError(InvalidInputError):
    """create_agent was given a name another agent has."""

    hint = "Use get_or_create_agent to reuse the agent with that name."


class NotParticipantError(InvalidInputError):
    """The agent is not a participant of the thread."""

    hint = "Add the agent with join_thread first."


class TooFewParticipantsError(InvalidInputError):
    """A thread needs at least two distinct participants."""

    hint = "Create the thread with at least two different agent names."


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Thread:
    """A thread and its participants (in the order they joined); ``name`` if it was given one."""

    id: str
    participants: tuple[BusAgent, ...]
    created_at: str
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"thread_id": self.id}
        if self.name is not None:
            d["name"] = self.name
        d["participants"] = [a.name for a in self.participants]
        d["created_at"] = self.created_at
        return d


@dataclass(frozen=True, slots=True)
class Message:
    """One message. ``seq`` is its place in the thread: 1, 2, 3… without gaps."""

    thread_id: str
    seq: int
    sender: BusAgent
    content: str
    created_at: str
    principal: str | None = None  # who sent it, as a token said (None: no authentication)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "seq": self.seq,
            "sender": self.sender.name,
            "sender_id": self.sender.id,
            "content": self.content,
            "created_at": self.created_at,
        }
        if self.principal is not None:
            d["principal"] = self.principal
        return d


class MessagePage(tuple[Message, ...]):
    """The messages a poll returned, in sequence order (a tuple), and ``more``: whether
    messages past the last one remain (poll again after ``next_after_seq``)."""

    # frozen like the other records: nothing can be set once made (see __setattr__)
    _more: bool
    _next: int

    def __new__(cls, messages: Iterable[Message], more: bool, after_seq: int) -> MessagePage:
        page = super().__new__(cls, messages)
        object.__setattr__(page, "_more", more)
        object.__setattr__(page, "_next", page[-1].seq if page else after_seq)
        return page

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a MessagePage is read-only; {name!r} cannot be set")

    def __reduce__(self) -> tuple[type[MessagePage], tuple[tuple[Message, ...], bool, int]]:
        return (MessagePage, (tuple(self), self.more, self.next_after_seq))  # copy, pickle

    @property
    def more(self) -> bool:
        return self._more

    @property
    def next_after_seq(self) -> int:
        return self._next


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A thread's activity: participants, message count, newest message and when it was."""

    thread_id: str
    participants: tuple[BusAgent, ...]
    created_at: str
    message_count: int
    last_seq: int
    latest_message: Message | None
    latest_activity_at: str  # the newest message's time, or the thread's creation
    name: str | None = None
    # The principal (token) that created it, None for a trusted caller's. Not in to_dict: an
    # agent is not told who the other callers are; the inspector shows it to the operator.
    created_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"thread_id": self.thread_id}
        if self.name is not None:
            d["name"] = self.name
        return d | {
            "participants": [a.name for a in self.participants],
            "created_at": self.created_at,
            "message_count": self.message_count,
            "last_seq": self.last_seq,
            "latest_message": None
            if self.latest_message is None
            else self.latest_message.to_dict(),
            "latest_activity_at": self.latest_activity_at,
        }


@dataclass(frozen=True, slots=True)
class ReadState:
    """An agent's place in a thread: its cursor, the thread's last sequence, and how many
    messages after the cursor there are (from anyone, and from agents other than itself)."""

    thread_id: str
    agent: BusAgent
    cursor: int
    last_seq: int
    unread_count: int
    unread_from_others_count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "agent_name": self.agent.name,
            "cursor": self.cursor,
            "last_seq": self.last_seq,
            "unread_count": self.unread_count,
            "unread_from_others_count": self.unread_from_others_count,
        }


AgentRef = BusAgent | str  # a record, a name, a UUID, or a claims agent id (its name)
ThreadRef = str | uuid.UUID | Thread

# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def check_uuid(what: str, value: object) -> str:
    """Return the canonical text of a UUID given as text or uuid.UUID, else raise."""
    if type(value) is str and _CANONICAL_UUID.fullmatch(value):
        return value  # the fast path: the form this module hands out
    if isinstance(value, uuid.UUID):
        return str(value)
    text = check_text(what, value, 64)
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        raise InvalidInputError(
            f"{what} must be a UUID like '123e4567-e89b-12d3-a456-426614174000', got {text!r}"
        ) from None
    return str(parsed)


check_name = check_bus_name  # the registry's rule: the store's, and no claims agent id


def check_content(value: object, max_bytes: int) -> str:
    """Return ``value`` if it is non-empty text within ``max_bytes`` UTF-8 bytes. Newlines and
    tabs are fine; NUL and lone surrogates are not (no database stores them faithfully)."""
    if not isinstance(value, str):
        raise InvalidInputError(f"content must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidInputError("content must not be empty")
    if "\x00" in value:
        raise InvalidInputError("content contains a NUL character; remove it or encode it")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInputError(
            "content holds a lone surrogate (it is not valid Unicode)"
        ) from None
    if size > max_bytes:
        raise InvalidInputError(
            f"content is {size:,} bytes as UTF-8; the limit is {max_bytes:,} bytes; "
            "split it into several messages or store it with the state store and send its key"
        )
    return value


def check_thread_name(value: object) -> str | None:
    """A thread's optional name: None, or text by the store's rules for names."""
    return None if value is None else check_text("thread name", value, MAX_THREAD_NAME)


def thread_id_of(value: object) -> str:
    """The id of a thread given as its record, a UUID or its text."""
    if isinstance(value, Thread):
        return value.id
    return check_uuid("thread_id", value)


def unknown_thread(thread_id: str) -> UnknownThreadError:
    return UnknownThreadError(
        f"unknown thread {thread_id!r}: no thread has this id in this database"
    )


def past_the_end(thread_id: str, after_seq: int, last_seq: int) -> InvalidInputError:
    """A wait for a message after ``after_seq`` on a thread that ends before it: no message
    would ever be the next one (seqs go 1, 2, ...), so it is refused at once, as marking such
    a seq read is."""
    error = InvalidInputError(
        f"cannot wait for a message after seq {after_seq}: thread {thread_id!r} ends at seq "
        f"{last_seq}; wait after the seq of the last message you processed"
    )
    error.hint = f"Pass an after_seq from 0 to {last_seq}: the last seq you processed."
    return error


def unknown_agent(what: str) -> UnknownAgentError:
    error = UnknownAgentError(
        f"unknown agent {what}: no bus agent has this name or id in this database"
    )
    error.hint = "Call get_or_create_agent with the name first."
    return error


# Polls build many records. A frozen dataclass's __init__ sets every field through
# object.__setattr__; setting the slots directly builds the same object in half the time.
_new = object.__new__
_set_tid, _set_seq, _set_sender, _set_content, _set_at, _set_principal = (
    Message.__dict__[n].__set__
    for n in ("thread_id", "seq", "sender", "content", "created_at", "principal")
)
agent_of = bus_agent_of  # a BusAgent from an (agent_id, name) row


def message_of(thread_id: str, row: Any) -> Message:
    """A Message from a (seq, sender_id, sender_name, content, created_at, principal) row."""
    seq, sender_id, sender_name, content, at, principal = row
    message: Message = _new(Message)
    _set_tid(message, thread_id)
    _set_seq(message, seq)
    _set_sender(message, agent_of((sender_id, sender_name)))
    _set_content(message, content)
    _set_at(message, at)
    _set_principal(message, principal)
    return message


def check_limit(limit: object) -> int:
    """A poll's page size: 1 to MAX_POLL_LIMIT."""
    value = check_int("limit", limit, minimum=1)
    if value > MAX_POLL_LIMIT:
        raise InvalidInputError(
            f"limit must be at most {MAX_POLL_LIMIT}, got {value}; read long threads in pages "
            "(poll again after the last seq you got)"
        )
    return value
