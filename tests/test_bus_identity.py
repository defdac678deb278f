"""Who is calling, for the message bus: over real HTTP on 127.0.0.1 with several principals and
both protocol eras, a principal acts only as its own bus agents (every tool that names one as
"you": sender_name, agent_name, agent_id, and a claims agent_id given as a name), agents that
were only named as participants are adopted by the first caller that acts as them, messages
record the principal, thread scopes limit which threads a principal may read and post to, and
tools/list shows the messages tools only to principals that may call them."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from support import TokenServer, child_env, flagged_call, token_server, tools_seen

from agenthold.claims.names import Resolver, Workspace
from agenthold.serve.message_tools import MESSAGES_NAMES

# slow: every test serves HTTP or MCP in process, about a second each; the fast lane leaves them out
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ERAS = ["auto", "legacy"]
SCOPED = {
    "alice": None,
    "bob": None,
    "standard-only": ["tools:standard"],
    "bus-only": ["tools:messages"],
    "team-a": ["tools:messages", "thread-write:team-a/*", "thread-read:news"],
}


@contextlib.asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[TokenServer]:
    resolver = Resolver([Workspace("repo", str(tmp_path))])
    async with token_server(tmp_path, SCOPED, tools="standard,messages", resolver=resolver) as s:
        yield s


call = flagged_call


async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    failed, reply = await call(client, tool, **arguments)
    assert not failed, reply
    return reply


def bus_tables(db: Path) -> list[list[tuple[Any, ...]]]:
    """Every row of every bus table: what a refused call must leave as it was."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("msg_agents", "msg_threads", "msg_participants", "msg_messages")
        ]


def assert_foreign(refused: tuple[bool, dict[str, Any]]) -> None:
    is_error, reply = refused
    assert is_error and reply["error"] == "forbidden", reply
    assert "belongs to another caller" in reply["message"], reply
    assert "nothing was changed" in reply["message"]
    assert "alice" not in str(reply)  # no hint of whose agent it is (alice owns them all)


def assert_forbidden(refused: tuple[bool, dict[str, Any]], scope: str) -> None:
    is_error, reply = refused
    assert is_error and reply["error"] == "forbidden", reply
    assert scope in reply["message"], reply
    assert reply["hint"]


# --------------------------------------------------------------------------------------------
# Binding: a bus agent belongs to its caller
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_no_message_tool_acts_as_another_principals_agent(tmp_path: Path, mode: str) -> None:
    async with serving(tmp_path) as server:
        async with server.client("alice", mode) as alice:
            mine = await ok(alice, "agenthold_create_agent", name="helper-bot")
            thread = await ok(
                alice, "agenthold_create_thread", participant_names=["helper-bot", "bystander"]
            )
            tid = thread["thread_id"]
            await ok(
                alice, "agenthold_append", thread_id=tid, sender_name="helper-bot", content="1"
            )
        before = bus_tables(server.db)
        as_alice: list[tuple[str, dict[str, Any]]] = [
            ("agenthold_create_agent", {"name": "helper-bot"}),
            ("agenthold_delete_account", {"agent_id": mine["agent_id"]}),
            ("agenthold_delete_account", {"agent_id": "helper-bot"}),
            ("agenthold_join_thread", {"thread_id": tid, "agent_name": "helper-bot"}),
            ("agenthold_leave_thread", {"thread_id": tid, "agent_name": "helper-bot"}),
            ("agenthold_append", {"thread_id": tid, "sender_name": "helper-bot", "content": "x"}),
            ("agenthold_append", {"thread_id": tid, "sender_name": mine["agent_id"],
                                  "content": "x"}),
            ("agenthold_mark_read", {"thread_id": tid, "agent_name": "helper-bot", "seq": 1}),
            ("agenthold_thread_status", {"thread_id": tid, "agent_name": "helper-bot"}),
            ("agenthold_has_unread", {"thread_id": tid, "agent_name": "helper-bot"}),
        ]  # fmt: skip
        for intruder in ("bob", "shared", "bus-only"):
            async with server.client(intruder, mode) as other:
                for tool, arguments in as_alice:
                    assert_foreign(await call(other, tool, **arguments))
        assert bus_tables(server.db) == before  # nothing changed, not even an adoption
        async with server.client("alice", "legacy" if mode == "auto" else "auto") as alice:
            state = await ok(
                alice, "agenthold_mark_read", thread_id=tid, agent_name="helper-bot", seq=1
            )
            assert state["cursor"] == 1  # the owner, from another session and era


@pytest.mark.parametrize("mode", ERAS)
async def test_an_agent_only_named_as_a_participant_is_adopted_by_the_first_to_act_as_it(
    tmp_path: Path, mode: str
) -> None:
    """The coordinator names the workers in its thread; each worker, under its own token, then
    runs the worker loop as itself, and from then on nobody else may act as it."""
    async with serving(tmp_path) as server:
        async with server.client("alice", mode) as lead, server.client("bob", mode) as worker:
            await ok(lead, "agenthold_create_agent", name="lead")
            thread = await ok(
                lead, "agenthold_create_thread", participant_names=["lead", "worker-1"]
            )
            tid = thread["thread_id"]
            sent = await ok(
                lead, "agenthold_append", thread_id=tid, sender_name="lead", content="square 7"
            )
            assert sent["principal"] == "alice"
            adopted = await ok(worker, "agenthold_create_agent", name="worker-1")
            assert adopted["status"] == "existing"
            state = await ok(
                worker, "agenthold_thread_status", thread_id=tid, agent_name="worker-1"
            )
            page = await ok(worker, "agenthold_poll", thread_id=tid, after_seq=state["cursor"])
            assert [(m["content"], m["principal"]) for m in page["messages"]] == [
                ("square 7", "alice")
            ]
            await ok(
                worker, "agenthold_append", thread_id=tid, sender_name="worker-1", content="49"
            )
            await ok(worker, "agenthold_mark_read", thread_id=tid, agent_name="worker-1", seq=2)
            assert_foreign(  # alice named worker-1, but bob acted as it first
                await call(
                    lead,
                    "agenthold_append",
                    thread_id=tid,
                    sender_name="worker-1",
                    content="forged",
                )
            )
            assert_foreign(
                await call(
                    worker, "agenthold_append", thread_id=tid, sender_name="lead", content="forged"
                )
            )
        with contextlib.closing(sqlite3.connect(server.db)) as conn:
            owners = dict(conn.execute("SELECT name, principal FROM msg_agents").fetchall())
            sent_by = conn.execute("SELECT sender_name, principal FROM msg_messages").fetchall()
        assert owners == {"lead": "alice", "worker-1": "bob"}
        assert sent_by == [("lead", "alice"), ("worker-1", "bob")]


async def test_a_claims_agent_and_its_bus_agent_are_one_identity(tmp_path: Path) -> None:
    """A claims agent_id given as a name stands for the bus agent of its registered name, for
    its own caller only; a name is one agent for everyone, so another caller's claims agent of
    the same name cannot speak as it."""
    async with (
        serving(tmp_path) as server,
        server.client("alice", "auto") as alice,
        server.client("bob", "auto") as bob,
    ):
        editor = (await ok(alice, "agenthold_register", name="editor"))["agent_id"]
        thread = await ok(alice, "agenthold_create_thread", participant_names=[editor, "reviewer"])
        tid = thread["thread_id"]
        assert thread["participants"] == ["editor", "reviewer"]
        sent = await ok(
            alice,
            "agenthold_append",
            thread_id=tid,
            sender_name=editor,
            content="claimed src/app.py",
        )
        assert (sent["sender"], sent["principal"]) == ("editor", "alice")
        assert (await ok(alice, "agenthold_create_agent", name=editor))["name"] == "editor"
        failed, reply = await call(
            bob, "agenthold_append", thread_id=tid, sender_name=editor, content="x"
        )
        assert failed and f"agent_id {editor} belongs to another caller" in reply["message"]
        impostor = (await ok(bob, "agenthold_register", name="editor"))["agent_id"]
        assert_foreign(
            await call(bob, "agenthold_append", thread_id=tid, sender_name=impostor, content="x")
        )
        assert_foreign(await call(bob, "agenthold_create_agent", name=impostor))
        reviewer = await ok(bob, "agenthold_create_agent", name="reviewer")  # adopted
        assert reviewer["status"] == "existing"


async def test_the_inspector_shows_who_sent_each_message(tmp_path: Path) -> None:
    async with serving(tmp_path) as server, server.client("alice", "auto") as alice:
        tid = (await ok(alice, "agenthold_create_thread", participant_names=["a", "b"]))[
            "thread_id"
        ]
        await ok(alice, "agenthold_append", thread_id=tid, sender_name="a", content="hello")
    shown = subprocess.run(
        [sys.executable, "-m", "agenthold", "messages", tid, "--db", str(server.db)],
        capture_output=True, text=True, timeout=60, env=child_env(), check=True,
    ).stdout  # fmt: skip
    assert "a (alice)" in shown and "hello" in shown
    logged = subprocess.run(
        [sys.executable, "-m", "agenthold", "log", "--db", str(server.db), "--json"],
        capture_output=True, text=True, timeout=60, env=child_env(), check=True,
    ).stdout  # fmt: skip
    assert '"principal": "alice"' in logged and '"event": "appended"' in logged


# --------------------------------------------------------------------------------------------
# Scopes: tool sets and threads
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_tools_list_shows_the_messages_tools_only_to_who_may_call_them(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        seen = await tools_seen(server, ["alice", "standard-only", "bus-only", "team-a"], mode)
        async with server.client("standard-only", mode) as c:
            for tool in sorted(MESSAGES_NAMES):
                assert_forbidden(await call(c, tool), "tools:messages")
    assert seen["alice"] > MESSAGES_NAMES and "agenthold_claim" in seen["alice"]
    assert seen["bus-only"] == seen["team-a"] == MESSAGES_NAMES
    assert not seen["standard-only"] & MESSAGES_NAMES


@pytest.mark.parametrize("mode", ERAS)
async def test_thread_scopes_limit_which_threads_a_principal_reads_and_posts_to(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        async with server.client("alice", mode) as alice:
            names = ["t-1", "t-2"]
            news = (await ok(alice, "agenthold_create_thread", participant_names=names,
                             name="news"))["thread_id"]  # fmt: skip
            other = (await ok(alice, "agenthold_create_thread", participant_names=names,
                              name="team-b/plans"))["thread_id"]  # fmt: skip
            unnamed = (await ok(alice, "agenthold_create_thread", participant_names=names))[
                "thread_id"
            ]
            await ok(alice, "agenthold_append", thread_id=news, sender_name="t-1", content="hi")
            failed, taken = await call(
                alice, "agenthold_create_thread", participant_names=names, name="news"
            )
            assert failed and "thread name taken" in taken["message"]
        before = bus_tables(server.db)
        async with server.client("team-a", mode) as team:
            mine = await ok(
                team,
                "agenthold_create_thread",
                participant_names=["t-1", "t-3"],
                name="team-a/standup",
            )
            assert mine["name"] == "team-a/standup"
            assert_forbidden(
                await call(team, "agenthold_create_thread", participant_names=["t-3", "t-4"]),
                "thread-write:*",
            )
            assert_forbidden(
                await call(
                    team, "agenthold_create_thread", participant_names=["t-3", "t-4"], name="news"
                ),
                "thread-write:news",
            )
            page = await ok(team, "agenthold_poll", thread_id=news)  # read: allowed
            assert [m["content"] for m in page["messages"]] == ["hi"]
            await ok(team, "agenthold_thread_info", thread_id=news)
            writes: list[tuple[str, dict[str, Any]]] = [
                ("agenthold_append", {"sender_name": "t-3", "content": "x"}),
                ("agenthold_join_thread", {"agent_name": "t-3"}),
                ("agenthold_leave_thread", {"agent_name": "t-2"}),
            ]
            reads: list[tuple[str, dict[str, Any]]] = [
                ("agenthold_poll", {}),
                ("agenthold_thread_info", {}),
                ("agenthold_thread_status", {"agent_name": "t-2"}),
                ("agenthold_has_unread", {"agent_name": "t-2"}),
                ("agenthold_mark_read", {"agent_name": "t-2", "seq": 0}),
                ("agenthold_wait_messages", {"timeout_seconds": 0.1}),
            ]
            for tool, arguments in writes:
                assert_forbidden(
                    await call(team, tool, thread_id=news, **arguments), "thread-write:news"
                )
            for target, scope in ((other, "team-b/plans"), (unnamed, unnamed)):
                for tool, arguments in reads + writes:
                    assert_forbidden(
                        await call(team, tool, thread_id=target, **arguments),
                        f"thread-read:{scope}"
                        if (tool, arguments) in reads
                        else f"thread-write:{scope}",
                    )
            standup = mine["thread_id"]
            await ok(team, "agenthold_append", thread_id=standup, sender_name="t-3", content="go")
        after = bus_tables(server.db)
        # only the team's own thread, its agent and its message are new
        assert len(after[1]) == len(before[1]) + 1 and len(after[3]) == len(before[3]) + 1
