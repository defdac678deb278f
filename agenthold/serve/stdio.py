"""Serving MCP over stdio: one session on a pair of pipes (``serve_session``), the one runner
both for agenthold's own stdio server (``serve_stdio``: one client per process, on the
protocol's pipes) and for each call a warm server takes (warm.py, on the pipes the front
passed it).

Decisions behind it:
- One runner, so that a warm call is served exactly as a stdio server serves: the SDK's
  server, agenthold's pipe reader and writer and its guard (below), the idle reaper, and at the
  end the leases of the session's agents cut to the grace period. What stops a session early
  is the caller's: a signal for serve_stdio, the front's forwarded signal (or its end) for a
  warm session.
- The pipes are read and written on the event loop (the SDK's reader thread cannot be
  cancelled, so a signal would hang), after fds 0 and 1 are pointed at /dev/null and stderr so
  that stray reads and prints cannot touch the wire. A terminal is read the same way (someone
  who typed ``agenthold`` in a shell must be able to Ctrl-C it), but left in blocking mode: its
  file status flags are shared with the shell, which would find it non-blocking afterwards.
- Every line the SDK cannot parse is answered with a JSON-RPC error carrying its id; the SDK
  alone drops it, leaving the client waiting forever.
- The end of stdin waits (SHUTDOWN_GRACE at most) until every request read before it is
  answered, so a claim or write that committed is reported to the client that sent it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import stat
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio
import mcp.types as types
from mcp.shared.message import SessionMessage

from agenthold.hooks.ancestry import my_host
from agenthold.serve.app import (
    PROCESS,
    SHUTDOWN_GRACE,
    Agenthold,
    SignalSource,
    build_server,
    report_if_asked,
)
from agenthold.serve.compat.mcp_sdk import ReadStream, WriteStream, stdio_streams, unparsed
from agenthold.serve.rpc_id import top_level_id

log = logging.getLogger("agenthold.serve.stdio")

MAX_LINE_BYTES = 64 * 1024 * 1024


class _PipeLines:
    """stdin as lines, read on the event loop. The SDK's reader blocks in a worker thread
    that cannot be cancelled, so SIGTERM would hang while the client keeps stdin open."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        if not os.isatty(fd):  # a terminal stays blocking: readable means a read will not wait
            os.set_blocking(fd, False)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        buffer = bytearray()
        skipping = False  # inside a line that grew past MAX_LINE_BYTES: drop it
        while True:
            await anyio.wait_readable(self._fd)
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                if buffer and not skipping and not buffer.isspace():
                    yield _text_of(bytes(buffer))
                return
            searched = len(buffer)  # holds no newline: look only at the new chunk (a long
            buffer += chunk  # line would otherwise be scanned again for every chunk of it)
            while (end := buffer.find(b"\n", searched)) >= 0:
                searched = 0
                line = bytes(buffer[: end + 1])
                del buffer[: end + 1]
                if skipping:
                    skipping = False
                    continue
                if line.isspace():  # a blank line is no message (the SDK's reader skips it too)
                    continue
                yield _text_of(line)
            if len(buffer) > MAX_LINE_BYTES and not skipping:
                log.warning("dropped a message longer than %d bytes", MAX_LINE_BYTES)
                yield _marker(OVERSIZE_KEY, MAX_LINE_BYTES, bytes(buffer[:4096]))
                buffer.clear()
                skipping = True
            elif skipping and len(buffer) > MAX_LINE_BYTES:
                buffer.clear()


def _text_of(line: bytes) -> str:
    """A line as text; one that is not UTF-8 becomes a marker answered as a parse error (as
    over HTTP), never text with U+FFFD in it that would be stored as if it had been sent."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _marker(NOT_UTF8_KEY, exc.start, line)


def _marker(key: str, value: int, head: bytes) -> str:
    """A line standing for a message agenthold refused to pass on (``key``: why): not
    JSON-RPC, so the SDK hands it to ``_guard_stdio``, which answers it with the id found in
    ``head``, the message's start."""
    request_id = top_level_id(head.decode("utf-8", errors="replace"))
    return json.dumps({key: value, "id": request_id}) + "\n"


OVERSIZE_KEY = "agenthold_oversize"
NOT_UTF8_KEY = "agenthold_not_utf8"


class _PipeWriter:
    """stdout written on the event loop (the SDK writes through a worker thread, twice per
    message). A client that went away loses what is left; its EOF on stdin ends the server."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pending = bytearray()
        if not os.isatty(fd):
            os.set_blocking(fd, False)

    async def write(self, text: str) -> None:
        self._pending += text.encode("utf-8")

    async def flush(self) -> None:
        while self._pending:
            try:
                written = os.write(self._fd, self._pending)
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
                continue
            except OSError:  # BrokenPipeError and the like: nobody is listening
                self._pending.clear()
                return
            del self._pending[:written]


@dataclass(frozen=True)
class Pipes:
    """The two ends of one stdio session, read and written on the event loop."""

    lines: _PipeLines
    writer: _PipeWriter


def pipes_on(stdin: int, stdout: int) -> Pipes:
    """A session's pipes on the descriptors ``stdin`` and ``stdout`` (made non-blocking unless
    they are a terminal)."""
    return Pipes(_PipeLines(stdin), _PipeWriter(stdout))


def _claim_stdio() -> Pipes | None:
    """Take the protocol's pipes off fds 0 and 1 (which then point at /dev/null and stderr,
    so stray reads and prints cannot touch the wire) and serve them on the event loop.
    None where that is not possible (a regular file on stdin, Windows): the SDK's own streams
    serve."""
    if os.name != "posix":  # pragma: no cover
        return None
    try:
        modes = [os.fstat(fd).st_mode for fd in (0, 1)]
    except OSError:  # pragma: no cover
        return None
    if not all(
        stat.S_ISFIFO(m) or stat.S_ISSOCK(m) or os.isatty(fd)
        for fd, m in zip((0, 1), modes, strict=True)
    ):
        return None
    wire_in, wire_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return pipes_on(wire_in, wire_out)


class _Answers:
    """The write side the SDK answers on, keeping count of the requests read from stdin that
    are still unanswered, so that the end of stdin can wait for their answers (below)."""

    def __init__(self, inner: WriteStream) -> None:
        self._inner = inner
        self.open: set[str | int] = set()
        self._changed = anyio.Event()

    def asked(self, message: object) -> None:
        if isinstance(message, types.JSONRPCRequest):
            self.open.add(message.id)
        elif isinstance(message, types.JSONRPCNotification) and message.method == (
            "notifications/cancelled"
        ):  # a cancelled request is never answered
            request_id = (message.params or {}).get("requestId")
            if isinstance(request_id, (str, int)):
                self._settle(request_id)

    def _settle(self, request_id: str | int) -> None:
        self.open.discard(request_id)
        self._changed.set()
        self._changed = anyio.Event()

    async def all_answered(self) -> None:
        while self.open:
            await self._changed.wait()

    async def send(self, item: SessionMessage) -> None:
        await self._inner.send(item)
        message = item.message
        if (
            isinstance(message, (types.JSONRPCResponse, types.JSONRPCError))
            and message.id is not None
        ):
            self._settle(message.id)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Answers:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def _guard_stdio(
    app: Agenthold, read_stream: ReadStream, write_stream: WriteStream
) -> AsyncIterator[tuple[ReadStream, _Answers]]:
    """Stand between the SDK and the pipes, for two things the SDK does not do.

    Lines it cannot parse get a JSON-RPC error carrying the request's id (the SDK drops them
    silently: a 5,000-digit integer, nesting past ~200 levels, text that is not JSON-RPC, and
    the client then waits forever). And the end of stdin waits until every request read before
    it is answered (waits and watches end at once, as 'unavailable'; SHUTDOWN_GRACE at most):
    the SDK cancels calls in flight at EOF, so a claim or a write that had already committed
    would be reported as failed, or not at all, to a client that sent it and closed its end."""
    send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    answers = _Answers(write_stream)

    async def relay() -> None:
        async with send:
            async for item in read_stream:
                if isinstance(item, Exception):
                    request_id, code, message = _diagnose(item)
                    log.warning("answered an unparseable message (id %r): %s", request_id, message)
                    reply = types.JSONRPCError(
                        jsonrpc="2.0",
                        id=request_id,
                        error=types.ErrorData(code=code, message=message),
                    )
                    try:
                        await write_stream.send(SessionMessage(reply))
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return
                    continue
                answers.asked(item.message)
                await send.send(item)
            if answers.open:
                app.stop_waiting()
                with anyio.move_on_after(SHUTDOWN_GRACE):
                    await answers.all_answered()

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay)
        yield receive, answers
        tg.cancel_scope.cancel()


def _diagnose(exc: Exception) -> tuple[str | int | None, int, str]:
    """The id (if it can be found), JSON-RPC code and message for an unparseable line."""
    raw: Any = None
    code, message = types.PARSE_ERROR, "Parse error"
    found_wrong = unparsed(exc)  # what the SDK's reader said of the line (compat.mcp_sdk)
    if found_wrong is not None:
        raw = found_wrong.raw
        if found_wrong.not_json:
            detail = found_wrong.detail
            message = f"Parse error: {detail}"
            if "number out of range" in detail:
                message += " (integers are limited to 4,300 digits)"
            elif "recursion limit" in detail:
                message += " (the message is nested too deeply)"
        else:
            code, message = types.INVALID_REQUEST, "Invalid request: not a JSON-RPC 2.0 message"
    found: Any = raw
    if isinstance(raw, str):
        try:  # the standard library parser has no digit limit with parse_int; ids stay ids
            found = json.loads(raw, parse_int=lambda d: int(d) if len(d) < 30 else None)
        except (ValueError, RecursionError):
            found = None
    request_id = found.get("id") if isinstance(found, dict) else None
    if found is None and isinstance(raw, str):  # too deep even for that parser: scan for it
        request_id = top_level_id(raw)
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        request_id = None
    if isinstance(request_id, str) and not _utf8(request_id):
        request_id = None  # a lone surrogate escape: no answer can carry it
    if isinstance(found, dict) and OVERSIZE_KEY in found:
        code = types.INVALID_REQUEST
        message = f"Message too large: the limit is {MAX_LINE_BYTES // (1024 * 1024)} MiB a line"
    elif isinstance(found, dict) and NOT_UTF8_KEY in found:
        code = types.PARSE_ERROR
        message = (
            f"Parse error: the message is not valid UTF-8 (at byte {found[NOT_UTF8_KEY]});"
            " JSON-RPC over stdio is UTF-8 text"
        )
    return request_id, code, message


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


Stop = Callable[[anyio.CancelScope], Coroutine[Any, Any, None]]


async def serve_session(app: Agenthold, pipes: Pipes | None, stop: Stop) -> None:
    """Serve one MCP session of ``app`` on ``pipes`` (None: the process's stdin and stdout,
    as the SDK serves them) until its input ends, or until ``stop``, which runs beside it and
    is handed the session's cancel scope, cancels it. Then the leases of the agents registered
    in the session are cut to the grace period, as when a client goes away."""
    server = build_server(app, report_of=report_if_asked)
    lines, writer = (None, None) if pipes is None else (pipes.lines, pipes.writer)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop, tg.cancel_scope)
            tg.start_soon(app.reap_forever)
            async with (
                stdio_streams(lines, writer) as (read_stream, write_stream),
                _guard_stdio(app, read_stream, write_stream) as (guarded, answers),
            ):
                await server.run(guarded, answers, server.create_initialization_options())
            tg.cancel_scope.cancel()  # stdin reached EOF: the client has gone
    finally:
        with anyio.CancelScope(shield=True):
            await app.end_leases(app.agents.close(PROCESS))


async def serve_stdio(app: Agenthold, signals: SignalSource) -> None:
    """Serve ``app`` on stdio until the client closes stdin or a signal from ``signals``
    arrives."""
    app.host = my_host()  # the client that started this server, for the edit hooks
    await serve_session(app, _claim_stdio(), functools.partial(_cancel_on_signal, signals))


async def _cancel_on_signal(signals: SignalSource, scope: anyio.CancelScope) -> None:
    with signals() as arriving:
        async for signum in arriving:
            log.info("%s: stopping", signal.Signals(signum).name)
            scope.cancel()
            return
