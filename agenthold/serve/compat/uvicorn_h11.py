"""uvicorn (0.54), and the h11 connection its HTTP/1.1 protocol keeps, where agenthold goes past
their public API. Each name below is one such use; its docstring says what it reaches into,
why, and which public API would replace it, and tests/test_compat.py checks it against the
installed uvicorn. No mcp here: the live page (web/) serves on this module too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


class QuietServer(uvicorn.Server):
    """uvicorn's server, with the process's signals left to its caller.

    Reaches into: ``uvicorn.Server.capture_signals``, the undocumented context manager that
    ``serve`` enters: it installs handlers for SIGINT and SIGTERM and, once the server has
    stopped, raises the signal again. Replaced by one that does nothing.
    Why: that signal would end the process before agenthold frees its agents' claims (and give
    it the signal's exit status); the command line's signal source stops the server instead.
    Public replacement: an option of ``uvicorn.Config`` or ``Server.serve`` to install no
    signal handlers.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HookedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (``uvicorn.Config(http=...)`` takes a subclass), with a hook
    for each moment of a connection and what h11 says of its request. A subclass overrides the
    hooks (no-ops here) and uses ``transport`` and ``loop``; it names nothing of uvicorn's.

    Reaches into: ``uvicorn.protocols.http.h11_impl.H11Protocol``, whose methods are no public
    API: ``connection_made``, ``data_received``, ``on_response_complete``, ``pause_writing``,
    ``resume_writing`` and ``connection_lost`` are extended (each hook runs after uvicorn's
    method, ``lost`` before it); its ``transport`` and ``loop`` attributes; and its h11
    connection ``conn`` (``their_state``, ``trailing_data``), read by ``request_open`` and
    ``bytes_waiting``.
    Why: the cap on open connections, the deadline for a request head and the deadline for a
    reply to drain act on a connection from the moment it is accepted (http.py's
    ConnectionGuard); uvicorn's ``limit_concurrency`` and ``timeout_keep_alive`` act per
    request, once a head has arrived, and a client stalled inside its headers is never timed.
    Public replacement: a cap on connections and a request-head timeout in ``uvicorn.Config``,
    or connection hooks (accepted, head received, response complete, write paused and
    resumed, closed) on a documented protocol class.
    """

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.connected(transport)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.received()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.answered()

    def pause_writing(self) -> None:
        super().pause_writing()
        self.writing_paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.writing_resumed()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost()
        super().connection_lost(exc)

    @property
    def request_open(self) -> bool:
        """A complete request head has arrived, and that request is not over yet (h11 keeps
        the client's state off IDLE until the head is whole, and until the answer is sent)."""
        return self.conn.their_state is not h11.IDLE

    @property
    def bytes_waiting(self) -> bool:
        """The client sent bytes that h11 holds unparsed: part of a request head (of the
        next request, while one is open)."""
        return bool(self.conn.trailing_data[0])

    def connected(self, transport: asyncio.Transport) -> None:
        """The connection was accepted (uvicorn has set it up)."""

    def received(self) -> None:
        """Bytes arrived and uvicorn has handed them to h11."""

    def answered(self) -> None:
        """A response was sent in full."""

    def writing_paused(self) -> None:
        """The transport's send buffer went over its high-water mark."""

    def writing_resumed(self) -> None:
        """The send buffer drained below its low-water mark."""

    def lost(self) -> None:
        """The connection is gone (before uvicorn tidies up after it)."""
