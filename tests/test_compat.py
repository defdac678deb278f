"""Every use agenthold makes of a private part of the mcp SDK, uvicorn (and its h11), sse-starlette
or asyncio, checked against the installed library, one test per use, named after it
(agenthold/serve/compat/). An upgrade that moves one fails here, by name, rather than as a lease
that silently never ends, a signal that kills the server before it frees its claims, or a line
the client waits for forever. The last test reads every other module of the package and fails
if one names a private part itself.
"""

from __future__ import annotations

import ast
import asyncio
import asyncio.selector_events
import contextlib
import inspect
import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import h11
import mcp.types as types
import pytest
import uvicorn
from mcp.server.session import ServerSession
from mcp.shared.message import SessionMessage
from sse_starlette.sse import AppStatus
from support import coordinator_at, sdk_client, uvicorn_serving
from uvicorn.protocols.http.h11_impl import H11Protocol

import agenthold
from agenthold.cli.main import ServeOptions, listen
from agenthold.serve.app import Agenthold
from agenthold.serve.compat import asyncio_loop, mcp_sdk, sse
from agenthold.serve.compat.uvicorn_h11 import HookedH11, QuietServer
from agenthold.serve.http import _http_stack
from agenthold.store import StateStore

pytestmark = pytest.mark.anyio

PACKAGE = Path(agenthold.__file__).parent


async def poll(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``condition()`` is true (fail after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        await anyio.sleep(0.01)


# --------------------------------------------------------------------------------------------
# The mcp SDK (compat/mcp_sdk.py)
# --------------------------------------------------------------------------------------------


async def test_mcp_sdk_session_connection_is_still_the_private_connection_of_the_session(
    tmp_path: Path,
) -> None:
    assert "self._connection = connection" in inspect.getsource(ServerSession.__init__)
    with StateStore(tmp_path / "state.db") as store:
        app = Agenthold(coordinator_at(store, tmp_path), tools="standard", disconnect_grace=0.3)
        asgi, _ = _http_stack(app, ServeOptions(transport="http"))
        async with uvicorn_serving(app, asgi) as web:
            async with sdk_client(web.url, mode="legacy") as c:  # a session: its connection
                await c.call_tool("agenthold_register", {"name": "in-a-session"})
                (connection,) = app.agents.by_connection
                assert connection.session_id  # the Connection's public parts http.py uses
                assert connection.state["agenthold"] is True
                assert callable(connection.exit_stack.push_async_callback)
            await poll(lambda: not app.agents.by_connection)  # its end was hooked
            async with sdk_client(web.url, mode="auto") as c:  # sessionless: none to find
                await c.call_tool("agenthold_register", {"name": "sessionless"})
                assert not app.agents.by_connection


class Lines:
    """A LineSource that is no anyio.AsyncFile: the lines given, then the end of input."""

    def __init__(self, *lines: str) -> None:
        self.lines = lines

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        for line in self.lines:
            yield line


class Written:
    """A LineSink that is no anyio.AsyncFile: what was written, and what was flushed."""

    def __init__(self) -> None:
        self.pending = ""
        self.flushed: list[str] = []

    async def write(self, text: str) -> None:
        self.pending += text

    async def flush(self) -> None:
        self.flushed.append(self.pending)
        self.pending = ""


async def read_all(*lines: str) -> list[SessionMessage | Exception]:
    """What the SDK's stdio reader passes on for ``lines``."""
    received: list[SessionMessage | Exception] = []
    streams = mcp_sdk.stdio_streams(Lines(*lines), Written())
    async with streams as (read_stream, write_stream), write_stream:  # as the server closes it
        async for item in read_stream:
            received.append(item)
    return received


async def test_mcp_sdk_stdio_streams_reads_and_writes_objects_that_are_not_async_files() -> None:
    ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
    (message,) = await read_all(json.dumps(ping) + "\n")
    assert isinstance(message, SessionMessage)
    assert isinstance(message.message, types.JSONRPCRequest) and message.message.id == 7
    written = Written()
    async with mcp_sdk.stdio_streams(Lines(), written) as (_, write_stream), write_stream:
        answer = types.JSONRPCResponse(jsonrpc="2.0", id=7, result={})
        await write_stream.send(SessionMessage(answer))
        await poll(lambda: bool(written.flushed))
    (line,) = written.flushed  # one write, then a flush, per message
    assert line.endswith("\n") and json.loads(line) == {"jsonrpc": "2.0", "id": 7, "result": {}}


async def test_mcp_sdk_unparsed_reads_the_error_the_stdio_reader_passes_for_a_bad_line() -> None:
    not_json, not_rpc, fine = await read_all(
        '{"id": 3, "method": \n',
        '{"id": 4, "hello": "there"}\n',
        '{"jsonrpc": "2.0", "method": "notifications/initialized"}\n',
    )
    assert isinstance(not_json, Exception) and isinstance(not_rpc, Exception)
    assert isinstance(fine, SessionMessage)
    said = mcp_sdk.unparsed(not_json)
    assert said is not None and said.not_json and said.detail  # the parser's words
    assert not said.detail.startswith("Invalid JSON")
    assert said.raw == '{"id": 3, "method": \n'  # not JSON: the line itself, for its id
    said = mcp_sdk.unparsed(not_rpc)
    assert said is not None and not said.not_json
    assert said.raw == {"id": 4, "hello": "there"}  # JSON: the value it holds
    assert mcp_sdk.unparsed(ValueError("not the SDK's")) is None


def test_mcp_sdk_handshake_versions_are_the_protocol_versions_with_sessions() -> None:
    versions = mcp_sdk.handshake_versions()
    assert "2025-11-25" in versions and "2024-11-05" in versions
    assert "2026-07-28" not in versions


# --------------------------------------------------------------------------------------------
# uvicorn and h11 (compat/uvicorn_h11.py)
# --------------------------------------------------------------------------------------------


async def ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def running(server: uvicorn.Server) -> AsyncIterator[int]:
    """``server`` serving on a free loopback port (yielded) in this loop, until the block ends."""
    sock = listen("127.0.0.1", 0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            await poll(lambda: server.started)
            try:
                yield sock.getsockname()[1]
            finally:
                server.should_exit = True
    finally:
        sock.close()


async def test_uvicorn_quiet_server_replaces_capture_signals_which_serve_still_enters() -> None:
    assert "self.capture_signals()" in inspect.getsource(uvicorn.Server.serve)
    before = signal.getsignal(signal.SIGTERM)
    config = uvicorn.Config(ok, lifespan="off", log_config=None, log_level="warning")
    async with running(QuietServer(config)):
        assert signal.getsignal(signal.SIGTERM) is before  # uvicorn's would be its handle_exit
    assert signal.getsignal(signal.SIGTERM) is before


async def test_uvicorn_hooked_h11_hooks_run_as_uvicorns_h11_protocol_serves() -> None:
    for name in ("connection_made", "data_received", "on_response_complete", "connection_lost",
                 "pause_writing", "resume_writing"):  # fmt: skip
        assert callable(getattr(H11Protocol, name)), name
    for attribute in ("self.conn = h11.Connection", "self.transport", "self.loop"):
        assert attribute in inspect.getsource(H11Protocol), attribute
    assert h11.Connection(h11.SERVER).trailing_data == (b"", False)
    assert "backlog" in inspect.signature(uvicorn.Config).parameters
    seen: list[tuple[str, bool, bool]] = []

    class Recorder(HookedH11):
        def note(self, what: str) -> None:
            seen.append((what, self.request_open, self.bytes_waiting))

        def connected(self, transport: asyncio.Transport) -> None:
            assert transport is self.transport and self.loop is asyncio.get_running_loop()
            self.note("connected")

        def received(self) -> None:
            self.note("received")

        def answered(self) -> None:
            self.note("answered")

        def lost(self) -> None:
            self.note("lost")

    config = uvicorn.Config(ok, lifespan="off", log_config=None, http=Recorder)
    async with running(QuietServer(config)) as port:
        stream = await anyio.connect_tcp("127.0.0.1", port)
        await poll(lambda: ("connected", False, False) in seen)
        head = b"GET / HTTP/1.1\r\nHost: x\r\n"
        await stream.send(head)  # part of a head: no request yet, bytes waiting
        await poll(lambda: ("received", False, True) in seen)
        await stream.send(b"\r\n" + head)  # the head completed, and part of the next one
        reply = b""
        while b"ok" not in reply:
            reply += await stream.receive()
        assert reply.startswith(b"HTTP/1.1 200")
        assert ("received", True, True) in seen  # a request open, the next one's bytes waiting
        await poll(lambda: ("answered", False, True) in seen)  # answered: none open
        await stream.aclose()
        await poll(lambda: seen[-1][0] == "lost")
    assert seen[0][0] == "connected" and [w for w, _, _ in seen].count("lost") == 1


# --------------------------------------------------------------------------------------------
# sse-starlette (compat/sse.py)
# --------------------------------------------------------------------------------------------


def test_sse_clear_exit_flag_resets_the_process_wide_flag_every_stream_reads() -> None:
    import sse_starlette.sse

    assert "AppStatus.should_exit" in inspect.getsource(sse_starlette.sse._shutdown_watcher)
    assert uvicorn.Server.handle_exit is AppStatus.handle_exit  # patched at import
    assert isinstance(AppStatus.should_exit, bool)
    AppStatus.should_exit = True
    sse.clear_exit_flag()
    assert AppStatus.should_exit is False


# --------------------------------------------------------------------------------------------
# asyncio (compat/asyncio_loop.py)
# --------------------------------------------------------------------------------------------


def test_asyncio_accept_reports_are_still_worded_as_asyncio_loop_reads_them() -> None:
    source = inspect.getsource(asyncio.selector_events.BaseSelectorEventLoop._accept_connection)
    assert "'socket.accept() out of system resource'" in source
    assert "self._start_serving" in source  # the retry, a second later
    report = {"message": "socket.accept() out of system resource", "exception": OSError(24, "x")}
    assert asyncio_loop.accept_exhausted(report) is report["exception"]
    assert asyncio_loop.accept_exhausted({"message": "other", "exception": OSError()}) is None
    loop = asyncio.new_event_loop()
    try:
        retry = loop.call_later(1, loop._start_serving)  # type: ignore[attr-defined]
        closed = {"message": "x", "exception": ValueError("closed"), "handle": retry}
        assert asyncio_loop.accept_retry_after_close(closed)
        assert not asyncio_loop.accept_retry_after_close({**closed, "handle": None})
        retry.cancel()
    finally:
        loop.close()


# --------------------------------------------------------------------------------------------
# Nowhere else
# --------------------------------------------------------------------------------------------

PRIVATE_MODULES = ("uvicorn.protocols", "mcp.server.stdio", "mcp_types.version", "h11")
PRIVATE_NAMES = {"AppStatus", "H11Protocol", "capture_signals", "_connection", "their_state",
                 "trailing_data", "_start_serving"}  # fmt: skip
PRIVATE_WORDS = ("accept() out of system resource",)


def private_parts(path: Path) -> list[str]:
    """What the module at ``path`` names of the private parts compat/ wraps: imports of the
    modules that hold them, underscored names imported from a library, and the names and
    words themselves (in code, not in comments or docstrings)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.append(node.module)
                if not node.module.startswith("agenthold"):
                    found += [a.name for a in node.names if a.name.startswith("_")]
            found += [m for m in modules if m.startswith(PRIVATE_MODULES)]
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
            found.append(node.attr)
        elif isinstance(node, ast.Name) and node.id in PRIVATE_NAMES:
            found.append(node.id)
        elif isinstance(node, ast.FunctionDef) and node.name in PRIVATE_NAMES:
            found.append(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in docstrings:
                continue
            found += [w for w in PRIVATE_WORDS if w in node.value]
            if node.value in PRIVATE_NAMES:  # getattr(x, "_connection")
                found.append(node.value)
    return found


def test_no_module_outside_compat_names_a_private_part_of_a_library() -> None:
    compat = PACKAGE / "serve" / "compat"
    named = {
        str(path.relative_to(PACKAGE)): parts
        for path in sorted(PACKAGE.rglob("*.py"))
        if compat not in path.parents and (parts := private_parts(path))
    }
    assert named == {}
    # the check sees them where they are
    assert "_connection" in private_parts(compat / "mcp_sdk.py")
    assert "capture_signals" in private_parts(compat / "uvicorn_h11.py")
    assert "uvicorn.protocols.http.h11_impl" in private_parts(compat / "uvicorn_h11.py")
    assert "AppStatus" in private_parts(compat / "sse.py")
    assert PRIVATE_WORDS[0] in private_parts(compat / "asyncio_loop.py")
