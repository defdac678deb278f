"""The messages tool set: the AgentMsgs MCP tools over messages.MessageBus, with the wording
agents read (descriptions, replies, hints) and the worker loop they teach.

Decisions behind it:
- Agents are named by name (``agent_name``, ``sender_name``), as in AgentMsgs; a claims agent_id
  from agenthold_register works there too and stands for the agent of its registered name, so an
  agent that claims and messages keeps one identity. Names are created on first use by the tools
  that add a participant (create_thread, join_thread) and by create_agent.
- agenthold_wait_messages holds no thread: it polls once, then sleeps on the change feed
  (``App.wait_for``) until the thread gets a message, with progress notifications like the
  claims wait. It compares with the caller's after_seq, not with anything read before.
- Every reply is a JSON object with a ``status``; a bad argument or an unknown thread, agent or
  participant is an isError result whose hint says what to call instead.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agenthold.bus.messagebus import MessageBus
from agenthold.bus.records import (
    DEFAULT_POLL_LIMIT,
    MAX_POLL_LIMIT,
    ForeignBusAgentError,
    MessagePage,
    NameTakenError,
    NotParticipantError,
    ReadState,
    UnknownThreadError,
    past_the_end,
    thread_id_of,
    unknown_thread,
)
from agenthold.bus.schema import thread_topic
from agenthold.claims.records import UnknownAgentError
from agenthold.identity.principals import ForbiddenError, require_thread
from agenthold.serve.toolkit import (
    MAX_REPLY_BYTES,
    PAGE_BYTES,
    WAIT_TIMEOUT,
    App,
    Param,
    Reply,
    ToolCall,
    ToolError,
    ToolSpec,
    fit_page,
)

MESSAGES_NAMES = frozenset(
    {"agenthold_create_agent", "agenthold_delete_account", "agenthold_create_thread",
     "agenthold_join_thread", "agenthold_leave_thread", "agenthold_thread_info",
     "agenthold_thread_status", "agenthold_append", "agenthold_poll", "agenthold_has_unread",
     "agenthold_mark_read", "agenthold_wait_messages"}
)  # fmt: skip

THREAD_ID = Param("thread_id", "string", "")  # the names say it all: see Param.schema
AGENT_NAME = Param("agent_name", "string", "")
AFTER_SEQ = Param("after_seq", "integer", "your cursor", False, 0, minimum=0)
# No default in the schema: a poll that names its page size asks for that many messages, up
# to the 16 MiB every reply may be; one that does not gets DEFAULT_POLL_LIMIT, cut to a page of
# PAGE_BYTES that any host accepts. (No max_bytes: the set's tool list stays under 6 KB.)
LIMIT = Param(
    "limit", "integer", f"page size; default {DEFAULT_POLL_LIMIT}", False, minimum=1,
    maximum=MAX_POLL_LIMIT,
)  # fmt: skip
CONTENT = Param("content", "string", "")

# What an agent is told to do about a library error, in tool names (the library's own hints
# name the bus's methods); the server uses these for calls of this set's tools.
ERROR_HINTS: dict[type[Exception], str] = {
    UnknownAgentError: "Call agenthold_create_agent with the name first.",
    UnknownThreadError: (
        "Check the thread id, and that you use the same database; agenthold_create_thread "
        "makes a new one."
    ),
    NotParticipantError: "Add the agent with agenthold_join_thread first.",
    ForeignBusAgentError: (
        "Act only as agents you made with this token (agenthold_create_agent); pick another "
        "name for yourself."
    ),
}


@dataclass(frozen=True)
class NamesParam(Param):
    """A list of agent names (JSON Schema: an array of strings)."""

    def schema(self) -> dict[str, Any]:
        return {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 2,
            "description": self.description,
        }

    def check(self, tool: str, value: Any) -> Any:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ToolError(
                f"{self.name} must be an array of agent names (strings)",
                f'Call {tool} again with {self.name} like ["lead", "worker-1"].',
            )
        return value


def page_reply(page: MessagePage, thread_id: str, budget: int = PAGE_BYTES) -> Reply:
    """A page of messages as a tool replies it: cut to ``budget`` bytes of JSON (at least one
    message), ``more`` and ``next_after_seq`` saying where to read on."""
    reply: Reply = {"status": "ok", "thread_id": thread_id, "messages": [m.to_dict() for m in page]}

    def finish(reply: Reply, kept: int) -> Reply:
        cut = kept < len(page)
        reply["more"] = page.more or cut
        reply["next_after_seq"] = page[kept - 1].seq if cut else page.next_after_seq
        return reply

    return fit_page(reply, "messages", budget, finish)


def state_reply(state: ReadState) -> Reply:
    return {"status": "ok", **state.to_dict()}


class MessageHandlers:
    """The handlers of the messages tools, over one application's bus. Each passes the caller's
    principal (``call.by``) to the bus, which refuses another caller's agents, and checks the
    thread scopes of a principal that has any before it reads or writes a thread."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.bus: MessageBus = app.bus

    async def in_scope(self, call: ToolCall, thread_id: str, *, write: bool) -> None:
        """ForbiddenError unless the caller's thread scopes cover the thread (by its name, or
        its id if it has none). Callers without thread scopes pay nothing."""
        principal = call.principal
        if principal is None or principal.scopes.thread_read is None:
            return  # thread-write scopes imply thread-read ones, so both are unlimited here
        thread = await self.app.read(self.bus.get_thread, thread_id)
        if thread is None:
            raise unknown_thread(thread_id_of(thread_id))
        require_thread(principal, thread.name or thread.id, write=write)

    async def create_agent(self, call: ToolCall) -> Reply:
        def run(name: str) -> Reply:
            try:  # one insert decides: of two callers racing for a name, one is told created
                agent = self.bus.create_agent(name, principal=call.by)
            except NameTakenError:
                agent = self.bus.get_or_create_agent(name, principal=call.by)
                return {"status": "existing", **agent.to_dict()}
            return {"status": "created", **agent.to_dict()}

        reply: Reply = await self.app.write(run, call.args["name"])
        return reply

    async def delete_account(self, call: ToolCall) -> Reply:
        agent = await self.app.write(
            functools.partial(self.bus.delete_agent, principal=call.by), call.args["agent_id"]
        )
        return {"status": "deleted", **agent.to_dict()}

    async def create_thread(self, call: ToolCall) -> Reply:
        name, principal = call.args["name"], call.principal
        if principal is not None and principal.scopes.thread_write is not None:
            if name is None:
                raise ForbiddenError(
                    "thread-write:*",
                    "its thread scopes cover named threads only; give the thread a name they match",
                )
            require_thread(principal, name, write=True)
        create = functools.partial(self.bus.create_thread_by_names, name=name, principal=call.by)
        thread = await self.app.write(create, call.args["participant_names"])
        return {"status": "created", **thread.to_dict()}

    async def join_thread(self, call: ToolCall) -> Reply:
        await self.in_scope(call, call.args["thread_id"], write=True)

        def run(thread_id: str, name: str) -> Reply:
            # one transaction: a join that fails (an unknown thread) makes no agent
            thread = self.bus.join_thread(thread_id, name, principal=call.by, create=True)
            return {"status": "joined", **thread.to_dict()}

        reply: Reply = await self.app.write(run, call.args["thread_id"], call.args["agent_name"])
        return reply

    async def leave_thread(self, call: ToolCall) -> Reply:
        a = call.args
        await self.in_scope(call, a["thread_id"], write=True)
        leave = functools.partial(self.bus.leave_thread, principal=call.by)
        thread = await self.app.write(leave, a["thread_id"], a["agent_name"])
        return {"status": "left", **thread.to_dict()}

    async def thread_info(self, call: ToolCall) -> Reply:
        tid = call.args["thread_id"]
        await self.in_scope(call, tid, write=False)
        info = await self.app.read(self.bus.get_thread_info, tid)
        if info is None:
            raise ToolError(
                f"unknown thread {tid!r}: no thread has this id in this database",
                "Check the thread id, and that this server uses the database the thread was "
                "created in; agenthold_create_thread makes a new one.",
                "unknown_thread",
            )
        return {"status": "ok", **info.to_dict()}

    async def thread_status(self, call: ToolCall) -> Reply:
        a = call.args
        await self.in_scope(call, a["thread_id"], write=False)
        read = functools.partial(self.bus.get_thread_read_state, principal=call.by)
        state = await self.app.read(read, a["thread_id"], a["agent_name"])
        if state is None:
            return await self.thread_info(call)  # the unknown-thread error
        return state_reply(state)

    async def append(self, call: ToolCall) -> Reply:
        a = call.args
        await self.in_scope(call, a["thread_id"], write=True)
        append = functools.partial(self.bus.append, principal=call.by)
        message = await self.app.write(append, a["thread_id"], a["sender_name"], a["content"])
        return {"status": "appended", "thread_id": message.thread_id, **message.to_dict()}

    async def poll(self, call: ToolCall) -> Reply:
        a = call.args
        await self.in_scope(call, a["thread_id"], write=False)
        if a["limit"] is None:
            limit, budget = DEFAULT_POLL_LIMIT, PAGE_BYTES
        else:  # asked for: as many as fit in the 16 MiB every reply is held to
            limit, budget = a["limit"], MAX_REPLY_BYTES
        poll = functools.partial(self.bus.poll, limit=limit, max_bytes=budget)
        page = await self.app.read(poll, a["thread_id"], a["after_seq"])
        return page_reply(page, a["thread_id"], budget)

    async def has_unread(self, call: ToolCall) -> Reply:
        a = call.args
        await self.in_scope(call, a["thread_id"], write=False)
        check = functools.partial(self.bus.has_unread, principal=call.by)
        unread = await self.app.read(check, a["thread_id"], a["agent_name"])
        return {"status": "ok", "thread_id": a["thread_id"], "has_unread": unread}

    async def mark_read(self, call: ToolCall) -> Reply:
        a = call.args
        await self.in_scope(call, a["thread_id"], write=False)  # reading includes marking read
        mark = functools.partial(self.bus.mark_read, principal=call.by)
        state = await self.app.write(mark, a["thread_id"], a["agent_name"], a["seq"])
        return state_reply(state)

    async def wait_messages(self, call: ToolCall) -> Reply:
        a = call.args
        tid, after, timeout = a["thread_id"], a["after_seq"], a["timeout_seconds"]
        await self.in_scope(call, tid, write=False)
        start = time.monotonic()
        topics = [thread_topic(tid)]
        looked = False

        poll = functools.partial(self.bus.poll, max_bytes=PAGE_BYTES)

        async def look() -> tuple[Reply | None, Iterable[tuple[str, ...]], float | None]:
            nonlocal looked
            page = await self.app.read(poll, tid, after)
            if not page and not looked:  # before it waits: a seq past the end never comes
                info = await self.app.read(self.bus.get_thread_info, tid)  # (as mark_read
                if info is not None and after > info.last_seq:  # says, refused at once)
                    raise past_the_end(info.thread_id, after, info.last_seq)
            looked = True
            if not page:
                return None, topics, None
            reply = page_reply(page, tid)
            return {**reply, "elapsed_seconds": round(time.monotonic() - start, 3)}, topics, None

        async def give_up() -> Reply:
            reply, _, _ = await look()
            return reply or {
                "status": "timeout",
                "thread_id": tid,
                "after_seq": after,
                "elapsed_seconds": round(time.monotonic() - start, 3),
                "hint": "No new message yet. Do other work, or call agenthold_wait_messages "
                "again with the same after_seq.",
            }

        progress = call.progress(timeout, f"a message after seq {after}")
        return await self.app.wait_for(look, give_up, timeout, progress)


def messages_tools(app: App) -> list[ToolSpec]:
    h = MessageHandlers(app)

    def spec(
        name: str, title: str, text: str, params: tuple[Param, ...], handler: Any, hints: str = ""
    ) -> ToolSpec:
        """``hints``: r(ead-only), d(estructive), i(dempotent)."""
        return ToolSpec(
            name,
            title,
            text,
            params,
            read_only="r" in hints,
            destructive="d" in hints,
            idempotent="i" in hints or "r" in hints,
            handler=handler,
            compact=True,  # keeps the set under 6 KB; every reply is still structured
        )

    seq = Param("seq", "integer", "the seq of the last message you processed", minimum=0)
    return [
        spec(
            "agenthold_create_agent",
            "Get or create your agent",
            "Loop step 1: get your agent by name, created on first use ('created' or "
            "'existing', with agent_id). An agent_id from agenthold_register works as the name.",
            (Param("name", "string", ""),),
            h.create_agent,
            "i",
        ),
        spec(
            "agenthold_delete_account",
            "Delete an agent",
            "Delete an agent (agent_id or name) and its cursors; its messages stay.",
            (Param("agent_id", "string", ""),),
            h.delete_account,
            "d",
        ),
        spec(
            "agenthold_create_thread",
            "Create a thread",
            "A new thread of two or more agents by name (new names become agents). Give its "
            "thread_id to the others.",
            (
                NamesParam("participant_names", "json", ""),
                Param("name", "string", "unique; thread scopes match it", required=False),
            ),
            h.create_thread,
        ),
        spec(
            "agenthold_join_thread",
            "Join a thread",
            "Join as agent_name; earlier messages count as unread for you.",
            (THREAD_ID, AGENT_NAME),
            h.join_thread,
            "i",
        ),
        spec(
            "agenthold_leave_thread",
            "Leave a thread",
            "Leave as agent_name; your cursor goes.",
            (THREAD_ID, AGENT_NAME),
            h.leave_thread,
            "d",
        ),
        spec(
            "agenthold_thread_info",
            "Thread info",
            "Participants, message_count, last_seq, latest_message.",
            (THREAD_ID,),
            h.thread_info,
            "r",
        ),
        spec(
            "agenthold_thread_status",
            "Your cursor",
            "Loop step 3: your cursor (the last seq you marked read) and unread counts.",
            (THREAD_ID, AGENT_NAME),
            h.thread_status,
            "r",
        ),
        spec(
            "agenthold_append",
            "Send a message",
            "Send content to a thread you are in, as sender_name; replies with its seq.",
            (THREAD_ID, Param("sender_name", "string", ""), CONTENT),
            h.append,
        ),
        spec(
            "agenthold_poll",
            "Read messages",
            "Loop step 4: the messages after after_seq (your cursor), oldest first. If more is "
            "true, poll again after next_after_seq.",
            (THREAD_ID, AFTER_SEQ, LIMIT),
            h.poll,
            "r",
        ),
        spec(
            "agenthold_has_unread",
            "Any unread?",
            "Whether messages follow your cursor.",
            (THREAD_ID, AGENT_NAME),
            h.has_unread,
            "r",
        ),
        spec(
            "agenthold_mark_read",
            "Mark read",
            "Loop step 5, after processing: move your cursor forward to seq.",
            (THREAD_ID, AGENT_NAME, seq),
            h.mark_read,
            "i",
        ),
        spec(
            "agenthold_wait_messages",
            "Wait for messages",
            "Loop step 6: block until a message after after_seq arrives, then reply like "
            "agenthold_poll; 'timeout' if none comes in time. Wait only when you have nothing "
            "else to do.",
            (THREAD_ID, AFTER_SEQ, WAIT_TIMEOUT),
            h.wait_messages,
            "r",
        ),
    ]


def instructions() -> str:
    """What a messages server tells every client: the worker loop."""
    return (
        "Message bus worker loop: 1. agenthold_create_agent (your name). 2. Get the thread_id "
        "from its creator, or agenthold_create_thread. 3. agenthold_thread_status: your cursor. "
        "4. agenthold_poll after it. 5. Process, then agenthold_mark_read the last seq. "
        "6. agenthold_wait_messages after it; go to 4."
    )
