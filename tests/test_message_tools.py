"""The messages tool set over MCP: a real ``mcp.Client`` in-process and over stdio, two server
processes on one database, the worker loop the descriptions teach, and a clear error for every
bad call. Replies are checked by ``support.reply_of`` (one strict-JSON text equal to the
structured content, a status, isError exactly for errors, with a message and a hint). The
contract tests (marked ``backends``) run on a SQLite file and on PostgreSQL; the rest, which are
about SQLite files or the catalogue, on SQLite alone.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from support import STARTUP, child_env, coordinator_at, in_process_client, reply_of

from agenthold.messages import MessageBus
from agenthold.serve.message_tools import MESSAGES_NAMES
from agenthold.store import StateStore

pytestmark = pytest.mark.anyio
DELETE = "agenthold_delete_account"
MAX_CATALOGUE_BYTES = 6000  # under 6 KB however a KB is counted


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    return reply_of(await client.call_tool(tool, arguments))


@asynccontextmanager
async def served(
    tmp_path: Path, tools: str = "messages", db: str | None = None
) -> AsyncIterator[tuple[Any, Client]]:
    """An in-process server on ``db`` (a SQLite file or a PostgreSQL URL; default: a file)."""
    with StateStore(db or tmp_path / "state.db") as store:
        async with in_process_client(coordinator_at(store, tmp_path), tools=tools) as pair:
            yield pair


def stdio(db: Path | str, root: Path, tools: str = "messages") -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "agenthold",
            "--db",
            str(db),
            "--workspace",
            f"default={root}",
            "--tools",
            tools,
        ],
        cwd=str(root),
        env=child_env(),
    )


@asynccontextmanager
async def connected(params: StdioServerParameters) -> AsyncIterator[Client]:
    async with Client(params, read_timeout_seconds=STARTUP) as client:  # type: ignore[arg-type]
        yield client


async def test_the_tools_are_the_spec_s_with_our_prefix_and_fit_in_6_kb(tmp_path: Path) -> None:
    async with served(tmp_path) as (_, client):
        listed = await client.list_tools()
        names = [t.name for t in listed.tools]
        assert set(names) == MESSAGES_NAMES
        spec_tools = {"create_agent", "delete_account", "create_thread", "join_thread",
                      "thread_info", "thread_status", "append", "poll", "has_unread"}  # fmt: skip
        assert {f"agenthold_{t}" for t in spec_tools} <= set(names)
        # as the wire carries them (compact JSON), without the result's protocol envelope
        tools = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools]
        catalogue = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
        instructions = client.instructions or ""
        size = len(catalogue.encode()) + len(json.dumps(instructions).encode())
        assert size < MAX_CATALOGUE_BYTES, size
        assert "agenthold_mark_read" in instructions and "agenthold_wait_messages" in instructions
        for tool in listed.tools:
            assert tool.annotations is not None and tool.annotations.open_world_hint is False
        append = next(t for t in listed.tools if t.name == "agenthold_append")
        assert append.input_schema["required"] == ["thread_id", "sender_name", "content"]


@pytest.mark.backends
async def test_the_worker_loop_over_mcp(tmp_path: Path, db_url: str) -> None:
    async with served(tmp_path, db=db_url) as (_, client):
        created = await call(client, "agenthold_create_agent", name="worker-1")
        assert created["status"] == "created" and uuid.UUID(created["agent_id"])
        again = await call(client, "agenthold_create_agent", name="worker-1")
        assert again == {**created, "status": "existing"}
        thread = await call(
            client, "agenthold_create_thread", participant_names=["lead", "worker-1"]
        )
        assert thread["status"] == "created" and thread["participants"] == ["lead", "worker-1"]
        tid = thread["thread_id"]
        sent = await call(
            client, "agenthold_append", thread_id=tid, sender_name="lead", content="task 1"
        )
        assert (sent["status"], sent["seq"], sent["sender"]) == ("appended", 1, "lead")
        state = await call(client, "agenthold_thread_status", thread_id=tid, agent_name="worker-1")
        assert (state["status"], state["cursor"], state["unread_count"]) == ("ok", 0, 1)
        assert state["unread_from_others_count"] == 1
        unread = await call(client, "agenthold_has_unread", thread_id=tid, agent_name="worker-1")
        assert unread["has_unread"] is True
        page = await call(client, "agenthold_poll", thread_id=tid, after_seq=state["cursor"])
        assert [m["content"] for m in page["messages"]] == ["task 1"]
        assert (page["more"], page["next_after_seq"]) == (False, 1)
        marked = await call(
            client, "agenthold_mark_read", thread_id=tid, agent_name="worker-1", seq=1
        )
        assert (marked["cursor"], marked["unread_count"]) == (1, 0)
        unread = await call(client, "agenthold_has_unread", thread_id=tid, agent_name="worker-1")
        assert unread["has_unread"] is False
        info = await call(client, "agenthold_thread_info", thread_id=tid)
        assert (info["message_count"], info["latest_message"]["content"]) == (1, "task 1")
        joined = await call(client, "agenthold_join_thread", thread_id=tid, agent_name="worker-2")
        assert joined["participants"] == ["lead", "worker-1", "worker-2"]
        left = await call(client, "agenthold_leave_thread", thread_id=tid, agent_name="worker-2")
        assert (left["status"], left["participants"]) == ("left", ["lead", "worker-1"])
        gone = await call(client, "agenthold_delete_account", agent_id=created["agent_id"])
        assert (gone["status"], gone["name"]) == ("deleted", "worker-1")


@pytest.mark.backends
async def test_wait_messages_is_woken_by_an_append_and_reports_progress(
    tmp_path: Path, db_url: str
) -> None:
    async with served(tmp_path, db=db_url) as (app, client):
        app.progress_every = 0.05
        tid = (await call(client, "agenthold_create_thread", participant_names=["a", "b"]))[
            "thread_id"
        ]
        seen: list[tuple[float, float | None, str | None]] = []

        async def note(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        got: dict[str, Any] = {}

        async def waiter() -> None:
            result = await client.call_tool(
                "agenthold_wait_messages",
                {"thread_id": tid, "after_seq": 0, "timeout_seconds": 20},
                progress_callback=note,
            )
            got.update(reply_of(result))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(0.3)
            await call(client, "agenthold_append", thread_id=tid, sender_name="a", content="hi")
        assert got["status"] == "ok" and [m["content"] for m in got["messages"]] == ["hi"]
        assert 0.2 < got["elapsed_seconds"] < 10
        assert seen and seen[0][1] == 20 and "a message after seq 0" in (seen[0][2] or "")
        timeout = await call(
            client, "agenthold_wait_messages", thread_id=tid, after_seq=1, timeout_seconds=0.1
        )
        assert (timeout["status"], timeout["after_seq"]) == ("timeout", 1) and timeout["hint"]
        at_once = await call(
            client, "agenthold_wait_messages", thread_id=tid, after_seq=0, timeout_seconds=5
        )
        assert at_once["status"] == "ok" and at_once["elapsed_seconds"] < 1


@pytest.mark.backends
async def test_wait_messages_past_the_threads_end_is_an_error_at_once_as_mark_read_is(
    tmp_path: Path, db_url: str
) -> None:
    """A wait after a seq the thread has not reached would wait its whole timeout for a
    message that can never be the next one; it is refused at once, naming the last seq, as
    mark_read past the end is. At the end itself a wait still waits."""
    async with served(tmp_path, db=db_url) as (_, client):
        tid = (await call(client, "agenthold_create_thread", participant_names=["a", "b"]))[
            "thread_id"
        ]
        for n in range(2):
            await call(client, "agenthold_append", thread_id=tid, sender_name="a", content=f"{n}")
        started = time.monotonic()
        waited = await call(
            client, "agenthold_wait_messages", thread_id=tid, after_seq=5, timeout_seconds=60
        )
        assert time.monotonic() - started < 30  # at once, not after the 60 s timeout
        assert waited["status"] == "error" and "ends at seq 2" in waited["message"], waited
        assert "0 to 2" in waited["hint"]
        marked = await call(client, "agenthold_mark_read", thread_id=tid, agent_name="b", seq=5)
        assert marked["status"] == "error" and "ends at seq 2" in marked["message"]
        at_end = await call(
            client, "agenthold_wait_messages", thread_id=tid, after_seq=2, timeout_seconds=0.2
        )
        assert at_end["status"] == "timeout"  # the next message may still come
        behind = await call(
            client, "agenthold_wait_messages", thread_id=tid, after_seq=1, timeout_seconds=5
        )
        assert [m["seq"] for m in behind["messages"]] == [2]


@pytest.mark.parametrize(
    ("tool", "arguments", "fragment"),
    [
        ("agenthold_create_thread", {"participant_names": ["solo"]}, "need >=2 participants"),
        ("agenthold_create_thread", {"participant_names": "a,b"}, "an array of agent names"),
        ("agenthold_create_thread", {"participant_names": [1, 2]}, "an array of agent names"),
        ("agenthold_append", {"sender_name": "carol", "content": "x"}, "sender not in thread"),
        ("agenthold_append", {"sender_name": "a", "content": ""}, "must not be empty"),
        ("agenthold_append", {"sender_name": "nobody", "content": "x"}, "unknown agent"),
        ("agenthold_poll", {"after_seq": -1}, "after_seq must be at least 0"),
        ("agenthold_poll", {"after_seq": 2**63}, "after_seq must be at most"),
        ("agenthold_wait_messages", {"after_seq": 2**63}, "after_seq must be at most"),
        ("agenthold_poll", {"limit": 5000}, "limit must be from 1 to 1000"),
        ("agenthold_wait_messages", {"timeout_seconds": 301}, "timeout_seconds must be"),
        ("agenthold_mark_read", {"agent_name": "a", "seq": 9}, "ends at seq 0"),
        ("agenthold_mark_read", {"agent_name": "carol", "seq": 0}, "agent not in thread"),
        ("agenthold_thread_status", {"agent_name": "carol"}, "agent not in thread"),
        ("agenthold_delete_account", {"agent_id": "nope"}, "unknown agent"),
        ("agenthold_create_agent", {"name": "agent-0123456789abcdef"}, "no claims agent"),
        ("agenthold_create_agent", {"name": "a\nb"}, "control character"),
        ("agenthold_poll", {"surprise": 1}, "does not take 'surprise'"),
        ("agenthold_poll", {"thread_id": "not-a-uuid"}, "thread_id must be a UUID"),
        ("agenthold_create_thread", {}, "needs the argument 'participant_names'"),
        ("agenthold_append", {"sender_name": "a", "content": 7}, "content must be a string"),
        ("agenthold_append", {"sender_name": "a", "content": "a\x00b"}, "NUL"),
        ("agenthold_join_thread", {"agent_name": ""}, "agent name"),
        ("agenthold_leave_thread", {"agent_name": "carol"}, "agent not in thread"),
        ("agenthold_has_unread", {"agent_name": "nobody"}, "unknown agent"),
        ("agenthold_has_unread", {"agent_name": "carol"}, "agent not in thread"),
        ("agenthold_mark_read", {"agent_name": "a", "seq": -1}, "seq must be at least 0"),
        ("agenthold_mark_read", {"agent_name": "a"}, "needs the argument 'seq'"),
        ("agenthold_wait_messages", {"after_seq": "1"}, "after_seq must be an integer"),
        ("agenthold_thread_info", {"thread_id": 5}, "thread_id must be a string"),
    ],
)
@pytest.mark.backends
async def test_bad_calls_are_errors_with_a_hint(
    tmp_path: Path, db_url: str, tool: str, arguments: dict[str, Any], fragment: str
) -> None:
    async with served(tmp_path, db=db_url) as (_, client):
        tid = (await call(client, "agenthold_create_thread", participant_names=["a", "b"]))[
            "thread_id"
        ]
        await call(client, "agenthold_create_agent", name="carol")
        if tool not in (
            "agenthold_create_thread",
            "agenthold_create_agent",
            "agenthold_delete_account",
        ):
            arguments = {"thread_id": tid, **arguments}
        reply = reply_of(await client.call_tool(tool, arguments))
        assert reply["status"] == "error" and fragment in reply["message"], reply


@pytest.mark.parametrize(
    "tool",
    ["agenthold_thread_info", "agenthold_poll", "agenthold_wait_messages", "agenthold_join_thread"],
)
@pytest.mark.backends
async def test_an_unknown_thread_is_an_error_naming_it(
    tmp_path: Path, db_url: str, tool: str
) -> None:
    async with served(tmp_path, db=db_url) as (app, client):
        tid = str(uuid.uuid4())
        arguments: dict[str, Any] = {"thread_id": tid}
        if tool == "agenthold_join_thread":
            arguments["agent_name"] = "x"
        reply = reply_of(await client.call_tool(tool, arguments))
        assert reply["status"] == "error" and tid in reply["message"], reply
        assert "database" in reply["hint"]
        status = reply_of(
            await client.call_tool("agenthold_thread_status", {"thread_id": tid, "agent_name": "x"})
        )
        assert status["status"] == "error" and "unknown thread" in status["message"]
        assert app.bus.get_agent("x") is None  # nothing was made


@pytest.mark.backends
async def test_standard_and_messages_combine(tmp_path: Path, db_url: str) -> None:
    async with served(tmp_path, "standard,messages", db=db_url) as (_, client):
        names = {t.name for t in (await client.list_tools()).tools}
        assert names >= MESSAGES_NAMES and "agenthold_claim" in names
        instructions = client.instructions or ""
        assert "agenthold_register" in instructions and "agenthold_wait_messages" in instructions
        agent_id = (await call(client, "agenthold_register", name="worker-7"))["agent_id"]
        tid = (await call(client, "agenthold_create_thread", participant_names=[agent_id, "lead"]))[
            "thread_id"
        ]
        sent = await call(
            client, "agenthold_append", thread_id=tid, sender_name=agent_id, content="claimed it"
        )
        assert sent["sender"] == "worker-7"  # one identity: the claims agent is the bus agent


async def test_a_standard_server_does_not_make_the_bus_tables(tmp_path: Path) -> None:
    async with served(tmp_path, "standard") as (_, client):
        names = {t.name for t in (await client.list_tools()).tools}
        assert not names & MESSAGES_NAMES
        reply = reply_of(await client.call_tool("agenthold_poll", {"thread_id": "x"}))
        assert reply["status"] == "error" and "messages" in reply["hint"]
    with StateStore(tmp_path / "state.db", read_only=True) as store:
        assert (
            store.db.fetchone("SELECT count(*) FROM sqlite_master WHERE name LIKE 'msg%'")[0] == 0
        )


@pytest.mark.backends
@pytest.mark.usefixtures("stdio_path")  # also as two sessions of one warm server
async def test_over_stdio_two_servers_on_one_database_wake_each_other(
    tmp_path: Path, db_url: str
) -> None:
    db = db_url
    async with connected(stdio(db, tmp_path)) as one, connected(stdio(db, tmp_path)) as two:
        tid = (await call(one, "agenthold_create_thread", participant_names=["a", "b"]))[
            "thread_id"
        ]
        got: dict[str, Any] = {}

        async def waiter() -> None:
            got.update(
                await call(
                    two, "agenthold_wait_messages", thread_id=tid, after_seq=0, timeout_seconds=30
                )
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(0.5)
            sent_at = time.monotonic()
            await call(one, "agenthold_append", thread_id=tid, sender_name="a", content="ping")
        assert got["status"] == "ok" and got["messages"][0]["content"] == "ping"
        assert time.monotonic() - sent_at < 10
        info = await call(two, "agenthold_thread_info", thread_id=tid)
        assert info["message_count"] == 1
    with MessageBus(db, read_only=True) as bus:
        assert [m.content for m in bus.poll(tid)] == ["ping"]


@pytest.mark.backends
async def test_of_two_servers_racing_to_create_one_agent_exactly_one_is_told_created(
    tmp_path: Path, db_url: str
) -> None:
    """Two servers (each its own store and writer) create the same names at once: for each
    name one reply says created and the other existing, with the same agent."""
    with StateStore(db_url) as first, StateStore(db_url) as second:
        async with (
            in_process_client(coordinator_at(first, tmp_path), tools="messages") as (_, one),
            in_process_client(coordinator_at(second, tmp_path), tools="messages") as (_, two),
        ):

            async def create(client: Client, name: str, into: list[dict[str, Any]]) -> None:
                into.append(await call(client, "agenthold_create_agent", name=name))

            for i in range(15):
                replies: list[dict[str, Any]] = []
                async with anyio.create_task_group() as tg:
                    tg.start_soon(create, one, f"racer-{i}", replies)
                    tg.start_soon(create, two, f"racer-{i}", replies)
                assert sorted(r["status"] for r in replies) == ["created", "existing"], replies
                assert replies[0]["agent_id"] == replies[1]["agent_id"]


async def test_an_in_memory_bus_over_stdio_serves_its_process_only(tmp_path: Path) -> None:
    """AgentMsgs' --in-memory is --db :memory:: the threads live as long as the server and no
    other server sees them. (Cold only: a database in memory never has a warm server.)"""
    async with connected(stdio(":memory:", tmp_path)) as one:
        tid = (await call(one, "agenthold_create_thread", participant_names=["a", "b"]))[
            "thread_id"
        ]
        await call(one, "agenthold_append", thread_id=tid, sender_name="a", content="hi")
        page = await call(one, "agenthold_poll", thread_id=tid, after_seq=0)
        assert [m["content"] for m in page["messages"]] == ["hi"]
        async with connected(stdio(":memory:", tmp_path)) as two:
            other = await call(two, "agenthold_thread_info", thread_id=tid)
            assert other["status"] == "error" and "thread" in other["message"]
    assert not list(tmp_path.glob("*.db"))  # nothing was written to a file
