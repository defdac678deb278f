"""The mcp SDK (2.3) where agenthold goes past its public API. Each name below is one such use;
its docstring says what it reaches into, why, and which public API would replace it, and
tests/test_compat.py checks it against the installed SDK.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server import ServerRequestContext
from mcp.server.connection import Connection
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

ReadStream = MemoryObjectReceiveStream[SessionMessage | Exception]
WriteStream = MemoryObjectSendStream[SessionMessage]


def session_connection(ctx: ServerRequestContext) -> Connection | None:
    """The SDK's per-client ``Connection`` that a request came on (its ``session_id``,
    ``state`` and ``exit_stack`` are public), or None if the session has none.

    Reaches into: ``ctx.session._connection``: ServerSession keeps the connection private.
    Why: an HTTP session's end must end the leases of the agents it named (a callback on the
    connection's exit stack), and --json-response sends progress on the session's stream.
    Public replacement: a ``connection`` on ServerRequestContext or ServerSession, as
    ``mcp.server.context.Context.connection`` has (ServerRunner does not build that Context).
    """
    connection: Connection | None = getattr(ctx.session, "_connection", None)
    return connection


class LineSource(Protocol):
    """What stdio_streams reads: the lines of stdin, each a JSON-RPC message as text."""

    def __aiter__(self) -> AsyncIterator[str]: ...


class LineSink(Protocol):
    """What stdio_streams writes to: text, sent on ``flush``."""

    def write(self, text: str) -> Awaitable[None]: ...

    def flush(self) -> Awaitable[None]: ...


@contextlib.asynccontextmanager
async def stdio_streams(
    stdin: LineSource | None = None, stdout: LineSink | None = None
) -> AsyncIterator[tuple[ReadStream, WriteStream]]:
    """The SDK's stdio transport (``mcp.server.stdio.stdio_server``), reading ``stdin`` and
    writing ``stdout``; with neither, the process's own stdin and stdout, as the SDK serves them.

    Reaches into: stdio_server's ``stdin`` and ``stdout`` are typed ``anyio.AsyncFile[str]``;
    agenthold passes objects that have only what stdio_server uses of them: ``async for line
    in stdin``, ``await stdout.write(text)`` and ``await stdout.flush()``.
    Why: an AsyncFile reads and writes in worker threads, and a thread blocked reading a pipe
    cannot be cancelled, so a signal would hang the server; agenthold reads and writes its
    pipes on the event loop (stdio.py).
    Public replacement: a stdio_server that takes any async iterator of lines and any async
    writer (or anyio byte streams), with its parameters typed that way.
    """
    async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):  # type: ignore[arg-type]
        yield read_stream, write_stream


@dataclass(frozen=True)
class Unparsed:
    """What the SDK's stdio reader found wrong with a line: ``not_json``, the line is not JSON
    at all (else it is JSON, but no JSON-RPC message); ``detail``: the JSON parser's words for
    that; ``raw``: the line as the SDK had it (its text if it is not JSON, else the value it
    holds; None if the SDK did not say)."""

    raw: Any
    not_json: bool
    detail: str


def unparsed(exc: Exception) -> Unparsed | None:
    """What the SDK's stdio reader says about a line it could not parse (it passes the error
    on its read stream instead of a message), or None if it is not in the form below.

    Reaches into: that error is the pydantic ValidationError of
    ``mcp_types.jsonrpc_message_adapter.validate_json(line)``: its first error's ``type`` is
    ``json_invalid`` when the line is not JSON, its ``msg`` then starts with "Invalid JSON: "
    and its ``input`` is the line; for JSON that is no message, ``input`` is the value.
    Why: the SDK drops such a line, so a client waits forever for the answer to it; stdio.py
    answers it with a JSON-RPC error that carries the line's id, found in the raw text.
    Public replacement: the SDK answering those lines itself (a parse error or an invalid
    request, with the id), or a typed parse error on the read stream carrying the raw line.
    """
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if not errors:
        return None
    first = errors[0]
    not_json = first.get("type") == "json_invalid"
    detail = str(first.get("msg", "")).removeprefix("Invalid JSON: ") if not_json else ""
    return Unparsed(first.get("input"), not_json, detail)


def handshake_versions() -> tuple[str, ...]:
    """The protocol versions that open a session with the initialize handshake (2025-11-25 and
    older, with ``Mcp-Session-Id``), as the SDK routes them.

    Reaches into: ``mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS``, which the ``mcp_types``
    face does not export.
    Why: sessions.py bounds each principal's sessions, so it must know which requests open one.
    Public replacement: the same tuple exported by ``mcp_types`` (or ``mcp``) itself.
    """
    return tuple(HANDSHAKE_PROTOCOL_VERSIONS)
