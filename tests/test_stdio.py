"""The ``agenthold`` command as MCP clients run it: a stdio server in a subprocess.

Three kinds of test, all against real processes and real database files under tmp_path:
- ``mcp.Client`` spawning ``python -m agenthold`` (both protocol eras), for what a client sees:
  the tools, a client that starts a new server for every call, a client that leaves for good,
  and two servers sharing one database file.
- Raw JSON-RPC lines written to the server's stdin, for what no SDK client can send (a
  5,000-digit integer, NaN, text that is not JSON-RPC) and for signals while stdin stays open.
- Bad command-line values, which must fail before any transport opens: one line on stderr
  naming the value, a non-zero exit status and no traceback.
Last, examples/two_agents.py runs as a script and must tell its story in order.

The SDK hands a stdio child only HOME, PATH and the like, so ``child_env`` passes what the child
needs: this source tree on PYTHONPATH and the coverage settings that measure subprocesses.
Process starts cost about half a second each, so the tests share them where they can.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from importlib.metadata import version as distribution_version
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from support import STARTUP, agenthold_args, coordinator_at, reply_of

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver
from agenthold.serve.claim_tools import reply as tool_reply
from agenthold.store import StateStore

# Every test runs twice: with servers that serve their calls themselves, and through warm
# servers (see the stdio_path fixture in conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("stdio_path")]
# These run a third time, on the path users get by default: the first call serves itself and
# forks the warm server that later calls go through (the fixture says why only these).
EVERY_STDIO_PATH = pytest.mark.parametrize("stdio_path", ["cold", "warm", "forks"], indirect=True)

ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """What a server subprocess needs beyond the SDK's few inherited variables."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("COVERAGE", "AGENTHOLD_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    return env


def stdio(db: Path | str, root: Path, *flags: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=agenthold_args(db, root, *flags),
        cwd=str(root),
        env=child_env(),
    )


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    return reply_of(await client.call_tool(tool, arguments))


@asynccontextmanager
async def connected(params: StdioServerParameters, mode: str = "auto") -> AsyncIterator[Client]:
    async with Client(params, mode=mode, read_timeout_seconds=STARTUP) as client:  # type: ignore[arg-type]
        yield client


@contextmanager
def coordinator_on(db: Path, root: Path) -> Iterator[Coordinator]:
    """This test process's own view of the database the servers use."""
    with StateStore(db) as store:
        yield coordinator_at(store, root)


# --------------------------------------------------------------------------------------------
# Through mcp.Client
# --------------------------------------------------------------------------------------------


@EVERY_STDIO_PATH
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_stdio_server_serves_the_claim_protocol_in_both_eras(
    tmp_path: Path, mode: str
) -> None:
    async with connected(stdio(tmp_path / "a.db", tmp_path), mode) as client:
        assert client.server_info is not None
        assert (client.server_info.name, client.server_info.version) == (
            "agenthold",
            distribution_version("agenthold"),
        )
        assert f"- default: {tmp_path}" in (client.instructions or "")
        tools = [t.name for t in (await client.list_tools()).tools]
        assert tools == ["agenthold_register", "agenthold_claim", "agenthold_release",
                         "agenthold_status", "agenthold_wait"]  # fmt: skip
        agent = (await call(client, "agenthold_register", name="editor"))["agent_id"]
        claimed = await call(client, "agenthold_claim", resource="src/app.py", agent_id=agent)
        assert claimed == {"status": "claimed", "resource": "file://default/src/app.py",
                           "version": 1}  # fmt: skip
        status = await call(client, "agenthold_status", resource="src/app.py")
        assert (status["status"], status["held_by"]) == ("claimed", agent)

        with anyio.move_on_after(0.3) as scope:  # a cancelled wait ...
            await client.call_tool("agenthold_wait", {"resource": "src/app.py"})
        assert scope.cancelled_caught
        timed_out = await call(client, "agenthold_wait", resource="src/app.py", timeout_seconds=0)
        assert timed_out["status"] == "timeout"  # ... and the server goes on serving

        bad = await call(client, "agenthold_release", resource="src/app.py", agent_id="nobody")
        assert bad["status"] == "error" and bad["hint"]
        released = await call(
            client, "agenthold_release", resource="src/app.py", agent_id=agent, outcome="modified"
        )
        assert released["status"] == "released"


async def test_the_advanced_tools_serve_over_stdio_without_instructions_on_a_memory_database(
    tmp_path: Path,
) -> None:
    params = stdio(":memory:", tmp_path, "--tools", "advanced")
    async with connected(params) as client:
        assert not client.instructions
        tools = [t.name for t in (await client.list_tools()).tools]
        assert len(tools) == 8 and "agenthold_set" in tools and "agenthold_claim" not in tools
        key = {"namespace": "order-1", "key": "status"}
        await call(client, "agenthold_set", **key, value="received", updated_by="a",
                   expected_version=0)  # fmt: skip
        stale = await call(client, "agenthold_set", **key, value="x", updated_by="b",
                           expected_version=0)  # fmt: skip
        assert (stale["status"], stale["actual_value"]) == ("conflict", "received")
        got = await call(client, "agenthold_get", **key)
        assert (got["value"], got["version"]) == ("received", 1)
    assert not (tmp_path / ":memory:").exists()


@EVERY_STDIO_PATH
async def test_a_client_that_starts_a_server_for_every_call_keeps_its_agent_and_claims(
    tmp_path: Path,
) -> None:
    db = tmp_path / "per-call.db"
    params = stdio(db, tmp_path)  # the default disconnect grace: 300 s
    modes = iter(["auto", "legacy", "auto", "legacy"])

    async def one_call(tool: str, **arguments: Any) -> dict[str, Any]:
        async with connected(params, next(modes)) as client:
            return await call(client, tool, **arguments)

    agent = (await one_call("agenthold_register", name="langchain-agent"))["agent_id"]
    assert (await one_call("agenthold_claim", resource="plan.md", agent_id=agent))["status"] == (
        "claimed"
    )
    again = await one_call("agenthold_claim", resource="plan.md", agent_id=agent)
    assert again == {"status": "already_claimed", "resource": "file://default/plan.md",
                     "version": 1}  # fmt: skip
    released = await one_call(
        "agenthold_release", resource="plan.md", agent_id=agent, outcome="modified"
    )
    assert (released["status"], released["version"]) == ("released", 2)
    with coordinator_on(db, tmp_path) as coordinator:
        history = tool_reply(coordinator.status("plan.md"))
        assert (history["status"], history.get("previous_outcome")) == ("available", "modified"), (
            history
        )


@EVERY_STDIO_PATH
async def test_a_client_that_leaves_for_good_has_its_claims_freed_as_abandoned_after_the_grace(
    tmp_path: Path,
) -> None:
    db = tmp_path / "leaving.db"
    async with connected(stdio(db, tmp_path, "--disconnect-grace", "0.3")) as client:
        agent = (await call(client, "agenthold_register", name="leaver"))["agent_id"]
        await call(client, "agenthold_claim", resource="a.md", agent_id=agent)
        await call(client, "agenthold_claim", resource="custom://lock", agent_id=agent)
    # the client closed its end (EOF): the server ended the agent's lease, then exited
    with coordinator_on(db, tmp_path) as coordinator:
        lease = coordinator.agent(agent)
        assert lease.lease_end_outcome == "abandoned" and lease.lease_ends_at is not None
        assert lease.lease_ends_at - time.time() <= 0.3
        await anyio.sleep(max(0.0, lease.lease_ends_at - time.time()) + 0.05)
        for resource in ("a.md", "custom://lock"):
            status = tool_reply(coordinator.status(resource))
            assert (status["status"], status["previous_outcome"], status["previous_holder"]) == (
                "available",
                "abandoned",
                agent,
            )


@EVERY_STDIO_PATH
async def test_two_servers_on_one_file_share_claims_and_wake_each_others_waits(
    tmp_path: Path,
) -> None:
    db = tmp_path / "shared.db"
    async with (
        connected(stdio(db, tmp_path), "auto") as one,
        connected(stdio(db, tmp_path), "legacy") as two,
    ):
        writer = (await call(one, "agenthold_register", name="writer"))["agent_id"]
        reviewer = (await call(two, "agenthold_register", name="reviewer"))["agent_id"]
        await call(one, "agenthold_claim", resource="chapter-3.md", agent_id=writer)
        busy = await call(two, "agenthold_claim", resource="./chapter-3.md", agent_id=reviewer)
        assert (busy["status"], busy["held_by"], busy["agent_name"]) == ("busy", writer, "writer")

        woken: dict[str, Any] = {}

        async def wait_in_two() -> None:
            woken.update(await call(two, "agenthold_wait", resource="chapter-3.md",
                                    timeout_seconds=30))  # fmt: skip
            woken["at"] = time.monotonic()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_in_two)
            await anyio.sleep(0.3)  # the wait is asleep in the other process
            assert not woken
            released_at = time.monotonic()
            await call(one, "agenthold_release", resource="chapter-3.md", agent_id=writer,
                       outcome="modified")  # fmt: skip
        assert (woken["status"], woken["previous_outcome"]) == ("available", "modified")
        assert woken["at"] - released_at < 2.0  # milliseconds in practice; generous here
        taken = await call(two, "agenthold_claim", resource="chapter-3.md", agent_id=reviewer)
        assert (taken["status"], taken["previous_outcome"]) == ("claimed", "modified")


async def test_an_agent_that_comes_back_within_the_grace_through_another_server_keeps_its_claims(
    tmp_path: Path,
) -> None:
    db = tmp_path / "back.db"
    grace = 2.0  # a client under load (and the warm path) may take a second to come back
    async with connected(stdio(db, tmp_path), "legacy") as staying:
        async with connected(stdio(db, tmp_path, "--disconnect-grace", str(grace))) as leaving:
            agent = (await call(leaving, "agenthold_register", name="hopper"))["agent_id"]
            await call(leaving, "agenthold_claim", resource="notes.md", agent_id=agent)
        back = await call(staying, "agenthold_claim", resource="notes.md", agent_id=agent)
        assert back["status"] == "already_claimed"
        await anyio.sleep(grace + 0.1)
        status = await call(staying, "agenthold_status", resource="notes.md")
        assert (status["status"], status["held_by"]) == ("claimed", agent)


@EVERY_STDIO_PATH
async def test_every_tool_of_every_set_answers_over_stdio_in_calls_of_both_eras(
    tmp_path: Path,
) -> None:
    # two calls with one command line, as a per-call client makes them: on the default path
    # the first serves itself and the second goes through the warm server the first forked
    params = stdio(tmp_path / "all.db", tmp_path, "--tools", "standard,advanced,messages")
    called: list[str] = []

    async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await client.call_tool(tool, arguments)
        reply = reply_of(result)
        assert not result.is_error and reply["status"] != "error", (tool, reply)
        called.append(tool)
        return reply

    async with connected(params, "auto") as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        agent = (await ok(client, "agenthold_register", name="all"))["agent_id"]
        where = {"resource": "all.md"}
        await ok(client, "agenthold_claim", **where, agent_id=agent)
        assert (await ok(client, "agenthold_status", **where))["held_by"] == agent
        await ok(client, "agenthold_wait", **where, timeout_seconds=0)
        await ok(client, "agenthold_release", **where, agent_id=agent, outcome="modified")
    async with connected(params, "legacy") as client:
        key = {"namespace": "n", "key": "k"}
        await ok(client, "agenthold_set", **key, value=1, updated_by="a", expected_version=0)
        assert (await ok(client, "agenthold_get", **key))["value"] == 1
        await ok(client, "agenthold_list", namespace="n")
        await ok(client, "agenthold_history", **key)
        await ok(client, "agenthold_watch", **key, since_version=0, timeout_seconds=0)
        await ok(client, "agenthold_export", namespace="n")
        await ok(client, "agenthold_delete", **key, deleted_by="a", expected_version=1)
        await ok(client, "agenthold_clear_namespace", namespace="n", deleted_by="a")
        await ok(client, "agenthold_create_agent", name="ann")
        thread = await ok(client, "agenthold_create_thread", participant_names=["ann", "bob"])
        tid = {"thread_id": thread["thread_id"]}
        await ok(client, "agenthold_create_agent", name="cy")
        await ok(client, "agenthold_join_thread", **tid, agent_name="cy")
        seq = (await ok(client, "agenthold_append", **tid, sender_name="ann", content="hi"))["seq"]
        assert (await ok(client, "agenthold_has_unread", **tid, agent_name="bob"))["has_unread"]
        page = await ok(client, "agenthold_poll", **tid)
        assert [m["content"] for m in page["messages"]] == ["hi"]
        await ok(client, "agenthold_wait_messages", **tid, after_seq=0, timeout_seconds=0)
        await ok(client, "agenthold_mark_read", **tid, agent_name="bob", seq=seq)
        state = await ok(client, "agenthold_thread_status", **tid, agent_name="bob")
        assert state["cursor"] == seq
        await ok(client, "agenthold_thread_info", **tid)
        await ok(client, "agenthold_leave_thread", **tid, agent_name="cy")
        await ok(client, "agenthold_delete_account", agent_id="cy")
    assert set(called) == listed and len(listed) == 25


# --------------------------------------------------------------------------------------------
# Raw JSON-RPC on the server's pipes
# --------------------------------------------------------------------------------------------


class RawServer:
    """``agenthold`` on pipes, spoken to one JSON-RPC line at a time (legacy handshake).

    A thread reads stdout into a queue, so every read has a timeout; clearing ``reading``
    stops it after the line it is reading, like a client that stops reading its pipe."""

    def __init__(self, db: Path, root: Path, *flags: str) -> None:
        env = {**os.environ, **child_env()}
        self.proc = subprocess.Popen(
            [sys.executable, *agenthold_args(db, root, *flags)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=root,
            env=env,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.stdout: list[bytes] = []
        self._stderr: str | None = None
        self.reading = threading.Event()
        self.reading.set()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while self.reading.wait() and (line := self.proc.stdout.readline()):
            self.stdout.append(line)
            self.lines.put(line)

    def send_line(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.send_line(json.dumps({"jsonrpc": "2.0", **message}))

    def receive(self, timeout: float = STARTUP) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(self.lines.get(timeout=timeout))
        return message

    def request(self, request_id: int | str, method: str, params: dict[str, Any]) -> Any:
        self.send({"id": request_id, "method": method, "params": params})
        reply = self.receive()
        assert reply["id"] == request_id, reply
        return reply["result"]

    def handshake(self) -> None:
        self.request(
            0,
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {},
             "clientInfo": {"name": "raw-test", "version": "1"}},
        )  # fmt: skip
        self.send({"method": "notifications/initialized"})

    def tool(self, request_id: int, name: str, /, **arguments: Any) -> dict[str, Any]:
        result = self.request(request_id, "tools/call", {"name": name, "arguments": arguments})
        reply: dict[str, Any] = result["structuredContent"]
        return reply

    def finish(self, timeout: float = 10.0) -> tuple[int, str]:
        """Wait for the exit; return the status and everything written to stderr."""
        status = self.proc.wait(timeout=timeout)
        err = self.stderr_text()
        for line in self.stdout:  # nothing but JSON-RPC ever reached stdout
            json.loads(line)
        return status, err

    def stderr_text(self) -> str:
        """Everything the server wrote to stderr (read once it has exited)."""
        if self._stderr is None:
            assert self.proc.stderr is not None
            self._stderr = self.proc.stderr.read().decode()
        return self._stderr

    def close(self) -> None:
        """End the server as a client does, by closing its stdin; kill it only if it hangs
        (a killed server would not save its coverage data)."""
        self.reading.set()
        if self.proc.poll() is None:
            with suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=10)  # it reads to the end of stdout, then stops
        self.stderr_text()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with suppress(OSError):
                    stream.close()


@pytest.fixture
def raw(tmp_path: Path) -> Iterator[RawServer]:
    server = RawServer(tmp_path / "raw.db", tmp_path, "--disconnect-grace", "0.3")
    try:
        server.handshake()
        yield server
    finally:
        server.close()


@EVERY_STDIO_PATH
def test_a_line_the_sdk_cannot_parse_gets_a_json_rpc_error_with_its_id_and_serving_goes_on(
    raw: RawServer,
) -> None:
    big = "1" + "0" * 5000
    raw.send_line(
        '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"agenthold_status",'
        f'"arguments":{{"resource":{big}}}}}}}'
    )
    reply = raw.receive()
    assert reply["id"] == 7 and reply["error"]["code"] == -32700
    assert "4,300 digits" in reply["error"]["message"]

    deep = "[" * 300 + "]" * 300
    raw.send_line(
        '{"jsonrpc":"2.0","id":"deep","method":"tools/call","params":{"name":"agenthold_status",'
        f'"arguments":{{"resource":{deep}}}}}}}'
    )
    reply = raw.receive()
    assert reply["id"] == "deep" and "nested too deeply" in reply["error"]["message"]

    raw.send_line('{"id": 8, "hello": "not JSON-RPC"}')
    reply = raw.receive()
    assert (reply["id"], reply["error"]["code"]) == (8, -32600)

    raw.send_line("this is not JSON at all")
    reply = raw.receive()
    assert reply["id"] is None and reply["error"]["code"] == -32700

    raw.send_line("   \r")  # blank lines are skipped without a word, as the SDK does: the next
    raw.send_line("")  # line the server writes answers request 9
    reply = raw.tool(9, "agenthold_status", resource="still-here.md")
    assert reply["status"] == "available"


def test_nan_and_infinity_sent_as_values_are_errors(raw: RawServer) -> None:
    for request_id, constant in ((10, "NaN"), (11, "Infinity"), (12, "-Infinity")):
        raw.send_line(
            f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call","params":{{"name":'
            f'"agenthold_wait","arguments":{{"resource":"x.md","timeout_seconds":{constant}}}}}}}'
        )
        result = raw.receive()["result"]
        assert result["isError"] is True
        assert "must be a finite number" in result["structuredContent"]["message"]
        assert "NaN" not in result["content"][0]["text"]  # the reply itself is strict JSON
        json.loads(result["content"][0]["text"], parse_constant=lambda c: 1 / 0)


def test_a_line_longer_than_64_mib_is_refused_with_its_id_and_serving_goes_on(
    raw: RawServer,
) -> None:
    assert raw.proc.stdin is not None
    raw.proc.stdin.write(b'{"jsonrpc":"2.0","id":30,"x":"' + b"y" * (65 * 1024 * 1024) + b'"}\n')
    raw.proc.stdin.flush()
    refused = raw.receive()
    assert refused["id"] == 30 and refused["error"]["code"] == -32600
    assert "too large" in refused["error"]["message"]
    reply = raw.tool(31, "agenthold_status", resource="after.md")
    assert reply["status"] == "available"
    raw.close()
    assert "dropped a message longer than" in raw.stderr_text()


def test_a_client_that_stops_reading_for_a_while_still_gets_every_reply_whole(
    tmp_path: Path,
) -> None:
    server = RawServer(tmp_path / "slow.db", tmp_path, "--tools", "advanced")
    try:
        server.handshake()
        value = "v" * 300_000  # a reply far larger than a pipe holds
        stored = server.tool(1, "agenthold_set", namespace="n", key="big", value=value,
                             updated_by="t", expected_version=0)  # fmt: skip
        assert stored["status"] == "ok"
        server.reading.clear()
        server.tool(2, "agenthold_list", namespace="empty")  # the reader stops after this one
        server.send(
            {
                "id": 3,
                "method": "tools/call",
                "params": {"name": "agenthold_get", "arguments": {"namespace": "n", "key": "big"}},
            }
        )
        server.send(
            {
                "id": 4,
                "method": "tools/call",
                "params": {"name": "agenthold_list", "arguments": {"namespace": "n"}},
            }
        )
        time.sleep(0.3)  # the server has filled the pipe and waits for room
        server.reading.set()
        replies = {reply["id"]: reply for reply in (server.receive(), server.receive())}
        # requests run side by side, so the small reply may come first: match them by id
        assert replies[3]["result"]["structuredContent"]["value"] == value
        assert replies[4]["result"]["structuredContent"]["count"] == 1
    finally:
        server.close()
    assert server.proc.returncode == 0


def test_a_client_that_closes_its_end_of_stdout_does_not_crash_the_server(
    tmp_path: Path,
) -> None:
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, *agenthold_args(tmp_path / "gone.db", tmp_path)],
        stdin=subprocess.PIPE,
        stdout=write_end,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, **child_env()},
    )
    os.close(write_end)
    os.close(read_end)  # nobody will ever read a reply
    try:
        assert proc.stdin is not None
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                            "clientInfo": {"name": "gone", "version": "1"}}}  # fmt: skip
        proc.stdin.write(json.dumps(hello).encode() + b"\n")
        proc.stdin.flush()
        time.sleep(0.5)  # the server answers into a pipe without a reader
        # a last request without a newline, then EOF: whatever is left is still a line
        proc.stdin.write(b'{"jsonrpc":"2.0","id":2,"method":"ping"}')
        proc.stdin.close()
        # Loose: a server still starting reads the ping while initialize is in flight, and the
        # SDK leaves such a ping unanswered, so the end of input waits SHUTDOWN_GRACE for it.
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        err = proc.stderr.read()
        proc.stderr.close()
    assert proc.returncode == 0 and b"Traceback" not in err, err


def test_with_the_disconnect_grace_off_claims_outlive_the_server_and_http_flags_are_ignored(
    tmp_path: Path,
) -> None:
    os.environ["AGENTHOLD_AUTH_TOKEN"] = "secret"  # inherited by the server; ignored on stdio
    try:
        server = RawServer(tmp_path / "off.db", tmp_path, "--disconnect-grace", "off",
                           "--port", "9000")  # fmt: skip
    finally:
        del os.environ["AGENTHOLD_AUTH_TOKEN"]
    try:
        server.handshake()
        agent = server.tool(1, "agenthold_register", name="keeper")["agent_id"]
        server.tool(2, "agenthold_claim", resource="kept.md", agent_id=agent)
    finally:
        server.close()
    assert server.proc.returncode == 0
    warnings = server.stderr_text().splitlines()
    assert len(warnings) == 2
    assert "--port only applies with --transport http; ignored" in warnings[0]
    assert "auth tokens apply to --transport http only" in warnings[1]
    with coordinator_on(tmp_path / "off.db", tmp_path) as coordinator:
        assert coordinator.agent(agent).lease_ends_at is None
        assert coordinator.status("kept.md").holder.agent_id == agent


def test_a_server_whose_stdin_is_a_file_reads_it_and_ends_at_its_end(tmp_path: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
             "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": {"name": "file", "version": "1"}}}  # fmt: skip
    requests.write_text(json.dumps(hello) + "\n")
    with requests.open("rb") as stdin:  # not a pipe: the SDK's own reader serves it
        done = subprocess.run(
            [sys.executable, *agenthold_args(tmp_path / "file.db", tmp_path)],
            stdin=stdin,
            capture_output=True,
            cwd=tmp_path,
            env={**os.environ, **child_env()},
            timeout=60,
        )
    assert (done.returncode, done.stderr) == (0, b"")
    assert [json.loads(line)["id"] for line in done.stdout.splitlines()] == [0]


def test_requests_sent_just_before_the_end_of_stdin_are_answered_and_waits_end_at_once(
    tmp_path: Path,
) -> None:
    db = tmp_path / "eof.db"
    with coordinator_on(db, tmp_path) as coordinator:
        holder = coordinator.register("holder").agent_id
        coordinator.claim("held.md", holder)
    messages = [
        {"id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "one-shot", "version": "1"}}},
        {"method": "notifications/initialized"},
        {"id": 1, "method": "tools/call",
         "params": {"name": "agenthold_register", "arguments": {"name": "late"}}},
        {"id": 2, "method": "tools/call",
         "params": {"name": "agenthold_wait",
                    "arguments": {"resource": "held.md", "timeout_seconds": 60}}},
        {"id": 3, "method": "tools/list"},
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(  # writes every line, then closes stdin at once
        [sys.executable, *agenthold_args(db, tmp_path)],
        input="".join(json.dumps({"jsonrpc": "2.0", **m}) + "\n" for m in messages).encode(),
        capture_output=True,
        cwd=tmp_path,
        env={**os.environ, **child_env()},
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr.decode()
    replies = {r["id"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert sorted(replies) == [0, 1, 2, 3]  # the SDK alone cancels them with the end of input
    registered = replies[1]["result"]["structuredContent"]
    assert registered["status"] == "registered"
    waited = replies[2]["result"]["structuredContent"]
    assert waited["status"] == "unavailable"  # the client has gone: the wait ends now
    assert elapsed < 30, f"the server lingered {elapsed:.1f} s after its client left"
    with coordinator_on(db, tmp_path) as coordinator:
        assert coordinator.agent(registered["agent_id"]).name == "late"  # answered == done


@EVERY_STDIO_PATH
@pytest.mark.parametrize("ending", ["SIGTERM", "SIGINT", "EOF"])
def test_a_signal_or_eof_ends_the_server_cleanly_and_then_its_agents_claims(
    tmp_path: Path, raw: RawServer, ending: str
) -> None:
    agent = raw.tool(1, "agenthold_register", name="worker")["agent_id"]
    assert raw.tool(2, "agenthold_claim", resource="job.md", agent_id=agent)["status"] == "claimed"
    raw.send(
        {"id": 3, "method": "tools/call",
         "params": {"name": "agenthold_wait", "arguments": {"resource": "job.md",
                                                             "timeout_seconds": 60}}}
    )  # fmt: skip
    time.sleep(0.2)  # the wait is in flight
    started = time.monotonic()
    if ending == "EOF":
        assert raw.proc.stdin is not None
        raw.proc.stdin.close()
    else:
        raw.proc.send_signal(getattr(signal, ending))  # stdin stays open
    status, err = raw.finish()
    assert status == 0, err
    assert err == ""  # no traceback, no warning: a clean stop
    assert time.monotonic() - started < 5
    with coordinator_on(tmp_path / "raw.db", tmp_path) as coordinator:
        lease = coordinator.agent(agent)
        assert lease.lease_end_outcome == "abandoned" and lease.lease_ends_at is not None
        time.sleep(max(0.0, lease.lease_ends_at - time.time()) + 0.05)
        freed = tool_reply(coordinator.status("job.md"))
        assert (freed["status"], freed["previous_outcome"]) == ("available", "abandoned")


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


def run_agenthold(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthold", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **child_env()},
        timeout=60,
    )


def bad_values(tmp: Path) -> list[tuple[list[str], str]]:
    """(arguments, a fragment the one error line must hold)."""
    return [
        (["--claim-ttl", "0"], "--claim-ttl: '0'"),
        (["--claim-ttl", "-1"], "--claim-ttl: '-1'"),
        (["--claim-ttl", "soon"], "'soon'"),
        (["--claim-ttl", "nan"], "'nan'"),
        (["--claim-ttl", "1e12"], "--claim-ttl: '1e12' is too long"),
        (["--disconnect-grace", "1e12"], "--disconnect-grace: '1e12' is too long"),
        (["--reap-idle", "1e12"], "--reap-idle: '1e12' is too long"),
        (["--busy-timeout", "7200"], "--busy-timeout: '7200' is too long"),
        (["--workspace", "bad name=/x"], "'bad name'"),
        (["--workspace", "relative/dir"], "'relative/dir'"),
        (["--workspace", "ws=/nonexistent/agenthold-test"], "/nonexistent/agenthold-test"),
        (["--workspace", f"a={tmp}", "--workspace", f"a={tmp}"], "'a' is given more than once"),
        (["--db", "/nonexistent/dir/x.db"], "/nonexistent/dir"),
        (["--db", str(tmp / "notes.txt")], "is not a SQLite database"),
        (["--db", str(tmp / "other.db")], "not an agenthold database"),
        (["--db", str(tmp)], "is a directory"),
        (["--disconnect-grace", "abc"], "--disconnect-grace: 'abc'"),
        (["--disconnect-grace", "-5"], "'-5'"),
        (["--busy-timeout", "later"], "--busy-timeout: 'later'"),
        (["--reap-idle", "0"], "--reap-idle: '0'"),
        (["--tools", "everything"], "'everything'"),
        (["--transport", "pigeon"], "'pigeon'"),
        (["--unknown-flag"], "--unknown-flag"),
        (["--json"], "--json"),
        (["--transport", "http", "--port", "99999"], "--port: '99999'"),
        (["--transport", "http", "--port", "eighty"], "--port: 'eighty'"),
        (["--transport", "http", "--path", "m?cp"], "--path: 'm?cp'"),
        (["--transport", "http", "--host", " "], "--host"),
        (["--transport", "http", "--auth-token", " "], "blank"),
    ]


def test_every_bad_command_line_value_fails_with_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a database\n")
    with sqlite3.connect(tmp_path / "other.db") as other:
        other.execute("CREATE TABLE customers (id INTEGER)")
    other.close()
    failures = []
    for args, fragment in bad_values(tmp_path):
        done = run_agenthold(*args, cwd=tmp_path)
        lines = done.stderr.splitlines()
        ok = (
            done.returncode != 0
            and done.stdout == ""
            and len(lines) == 1
            and lines[0].startswith("agenthold: ")
            and fragment in lines[0]
            and "Traceback" not in done.stderr
        )
        if not ok:
            failures.append((args, done.returncode, done.stderr))
    assert not failures
    assert not (tmp_path / "agenthold.db").exists()  # nothing was served, nothing created


def test_version_prints_agentholds_version(tmp_path: Path) -> None:
    done = run_agenthold("--version", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"agenthold {distribution_version('agenthold')}\n",
        "",
    )
    # The console script as users run it: the one installed beside this interpreter (PATH
    # may lead to another Python's).
    installed = shutil.which("agenthold", path=str(Path(sys.executable).parent))
    if installed is not None:
        script = subprocess.run(
            [installed, "--version"], capture_output=True, text=True, timeout=60
        )
        assert script.stdout == done.stdout


# --------------------------------------------------------------------------------------------
# The worked example
# --------------------------------------------------------------------------------------------


def test_the_two_agents_example_tells_its_story_and_leaves_the_outcome_in_the_database(
    tmp_path: Path,
) -> None:
    db = tmp_path / "example.db"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "two_agents.py"), "--db", str(db)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **child_env()},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    order = [
        "writer claims notes.md: claimed",
        "reviewer claims notes.md: busy (held by writer)",
        "reviewer waits for notes.md",
        "writer released notes.md as modified",
        "reviewer's wait ended: available",
        "previous outcome: modified",
        "reviewer claims notes.md: claimed",
    ]
    positions = [out.find(line) for line in order]
    assert -1 not in positions, out
    assert positions == sorted(positions), out
    with StateStore(db) as store:
        status = Coordinator(store, resolver=Resolver(cwd=str(tmp_path))).list_claims(
            include_free=True
        )
    (notes,) = [c for c in status if c.uri.endswith("/notes.md")]
    assert (notes.state, notes.last_outcome) == ("free", "modified")


# --------------------------------------------------------------------------------------------
# Progress of long waits
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_wait_with_a_progress_token_reports_progress_over_stdio_until_it_ends(
    tmp_path: Path, mode: str
) -> None:
    params = stdio(tmp_path / "p.db", tmp_path)
    params.env = {**(params.env or {}), "AGENTHOLD_PROGRESS_EVERY": "0.15"}
    seen: list[tuple[float, float | None, str | None]] = []

    async def note(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with connected(params, mode) as client:
        holder = (await call(client, "agenthold_register", name="holder"))["agent_id"]
        await call(client, "agenthold_claim", resource="slow.md", agent_id=holder)
        result = await client.call_tool(
            "agenthold_wait",
            {"resource": "slow.md", "timeout_seconds": 0.8},
            progress_callback=note,
        )
        reply = reply_of(result)
        assert (reply["status"], reply["held_by"]) == ("timeout", holder)
        assert len(seen) >= 3, seen
        assert [p for p, _, _ in seen] == sorted({p for p, _, _ in seen})
        assert all(t == 0.8 and "slow.md to be released" in str(m) for _, t, m in seen), seen
        assert seen[-1][0] <= 0.8 + 0.2  # none after the wait ended

        seen.clear()
        quick = await client.call_tool(
            "agenthold_wait", {"resource": "free.md", "timeout_seconds": 5}, progress_callback=note
        )
        assert reply_of(quick)["status"] == "available"
        assert seen == []  # a wait that ends at once reports nothing
