"""Serving MCP over Streamable HTTP: the SDK's app on uvicorn, behind bearer tokens (auth.py),
with deadlines for slow clients and a shutdown that answers every open request in full.

Decisions behind it:
- One connection per HTTP session: a client that keeps a session has its agents' leases ended
  when the session ends; sessionless requests name no connection (only a claim TTL reclaims
  their agents).
- What this needs of the SDK, uvicorn, sse-starlette and asyncio beyond their public API is in
  compat/ (the session's connection, uvicorn's HTTP/1.1 protocol with hooks, uvicorn without
  its signal handlers, sse-starlette's process-wide flag, asyncio's report of an accept that
  ran out of descriptors); nothing here names a private part.
- Connections are capped when accepted (``ConnectionGuard``), below the descriptor limit that
  cli.py raised at start (limits.py), and older-protocol sessions per principal
  (sessions.py); refusals are counted in a log line per interval, never one per connection.
- A reply the client does not read is held in memory until its socket drains (uvicorn waits
  for the transport's flow control), so the guard also bounds unread replies: a connection
  whose send buffer stays over asyncio's high-water mark for the send timeout is aborted, and
  the bytes waiting in every stalled connection's buffer together stay under MOST_UNSENT.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import uvicorn
from mcp.server import ServerRequestContext
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agenthold.identity.principals import SHARED, Principal, TokenTable
from agenthold.serve.app import (
    SHUTDOWN_GRACE,
    Agenthold,
    SignalSource,
    build_server,
    report_if_asked,
)
from agenthold.serve.auth import (
    PRINCIPAL,
    BearerAuth,
    FoldHostCase,
    LoopbackOrigins,
    is_loopback,
    refuse,
)
from agenthold.serve.compat import asyncio_loop, mcp_sdk, sse
from agenthold.serve.compat.uvicorn_h11 import HookedH11, QuietServer
from agenthold.serve.limits import (
    DEFAULT_SEND_TIMEOUT,
    MOST_UNSENT,
    Bounds,
    accept_backlog,
    connection_limit,
    descriptor_limit,
)
from agenthold.serve.rpc_id import top_level_id
from agenthold.serve.sessions import SessionLimits
from agenthold.serve.toolkit import Report

log = logging.getLogger("agenthold.serve.http")

BODY_TIMEOUT = 30.0  # seconds a client may take to send a request body
HEAD_TIMEOUT = 5.0  # seconds a client may take to send its request headers
REFUSALS_EVERY = 10.0  # seconds between the log lines that count refused connections
MAX_BODY_BYTES = 4 * 1024 * 1024


def session_progress(ctx: ServerRequestContext) -> Report | None:
    """How a call answered with plain JSON (--json-response) reports progress: the answer has
    no stream to carry it, so the notifications go to the session's own event stream (the GET
    that clients of the 2025 protocol keep open), naming the call's progressToken. A call
    without a token, or without a session (the 2026-07-28 protocol), has nowhere to send any."""
    token = (ctx.meta or {}).get("progress_token")
    if token is None or mcp_sdk.session_connection(ctx) is None:
        return None
    session = ctx.session

    async def report(progress: float, total: float | None, message: str | None) -> None:
        await session.send_progress_notification(token, progress, total, message)

    return report


class HttpOptions(Protocol):
    """What the HTTP transport reads of the serving options (cli.ServeOptions has it all)."""

    host: str
    path: str
    json_response: bool
    allowed_hosts: list[str]
    auth_tokens: list[str]
    auth_file: TokenTable | None
    log_level: str
    bounds: Bounds


def principal_of(ctx: ServerRequestContext) -> Principal | None:
    """Who made a request: the principal BearerAuth put in the HTTP request's ASGI scope; None
    for HTTP without tokens."""
    scope = getattr(ctx.request, "scope", None)
    return None if scope is None else scope.get(PRINCIPAL)


def session_connection(app: Agenthold) -> Callable[[ServerRequestContext], object | None]:
    """The function naming a request's connection: the SDK's connection object of a client
    that keeps a session (whose end is hooked once, to end its agents' leases), or None for a
    sessionless request (compat.mcp_sdk.session_connection finds it)."""

    def connection_of(ctx: ServerRequestContext) -> object | None:
        connection = mcp_sdk.session_connection(ctx)
        if connection is None or connection.session_id is None:
            return None
        state = connection.state
        if not state.get("agenthold"):
            state["agenthold"] = True
            connection.exit_stack.push_async_callback(app.connection_closed, connection)
        return connection

    return connection_of


class CancelOnDisconnect:
    """ASGI middleware: read the request body within BODY_TIMEOUT (else 408), cancel the call
    if the client disconnects before its answer is complete, and end every request still open
    when the server stops (``end_all``), each with a complete HTTP response.

    The SDK never notices a client that gives up on a 2026-07-28 call answered with plain JSON
    (--json-response), so a timed-out wait would otherwise run on until it ends by itself. At
    shutdown, the event streams that old-style clients keep open (GET) must end too; cancelled
    by uvicorn or by sse-starlette's global flag, they end half-sent and uvicorn logs an error
    (with a traceback when its own timeout cancels them)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.ending = False  # end_all was called: new requests get 503
        self.posts_open = 0  # POST requests not yet answered in full
        self._open: set[anyio.CancelScope] = set()

    def end_all(self) -> None:
        """End every open request now (the server is stopping), and refuse new ones."""
        self.ending = True
        for request in list(self._open):
            request.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.ending:
            await _plain(send, 503, "agenthold is shutting down")
            return
        post = scope.get("method") == "POST"
        if post:
            self.posts_open += 1
        try:
            await self._serve(scope, receive, send, post)
        finally:
            if post:
                self.posts_open -= 1

    async def _serve(self, scope: Scope, receive: Receive, send: Send, post: bool) -> None:
        body = bytearray()
        declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), b"")
        if post and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _plain(send, 413, "Request body too large")  # say so before it is sent
            return
        if post:
            with anyio.move_on_after(BODY_TIMEOUT) as reading:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body += message.get("body", b"")
                    if len(body) > MAX_BODY_BYTES:
                        await _plain(send, 413, "Request body too large")
                        return
                    if not message.get("more_body", False):
                        break
            if reading.cancelled_caught:
                await _plain(send, 408, "Request body not received in time")
                return
        delivered = False
        disconnected = anyio.Event()
        started = finished = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        held: Message | None = None  # an error's start, until its body shows the id it needs

        async def tracking_send(message: Message) -> None:
            nonlocal started, finished, held
            if post and message["type"] == "http.response.start" and message["status"] >= 400:
                held = message
                return
            if held is not None:
                start, held = held, None
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    # in a worker thread: the scan of a 4 MiB body takes about a second of
                    # Python, which on the event loop would stall every other request
                    start, message = await anyio.to_thread.run_sync(
                        with_request_id, start, message, body
                    )
                await send(start)
                started = True
            await send(message)  # uvicorn awaits before writing: a cancelled send wrote nothing
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True

        with anyio.CancelScope() as request:
            self._open.add(request)
            if self.ending:  # end_all came while the body was being read
                request.cancel()
            try:
                async with anyio.create_task_group() as tg:

                    async def watch() -> None:
                        while (await receive())["type"] != "http.disconnect":
                            pass
                        disconnected.set()
                        if not finished:  # work after a complete answer (a notification) goes on
                            tg.cancel_scope.cancel()

                    if post:  # other requests (event streams) watch for the disconnect themselves
                        tg.start_soon(watch)
                    await self.app(scope, replay if post else receive, tracking_send)
                    tg.cancel_scope.cancel()
            finally:
                self._open.discard(request)
        if request.cancelled_caught and not disconnected.is_set():  # ended by end_all
            if not started:
                await _plain(send, 503, "agenthold is shutting down")
            elif not finished:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


def with_request_id(
    start: Message, answer: Message, request: bytes | bytearray
) -> tuple[Message, Message]:
    """An error answer of the SDK's (a parse or validation error, always ``id: null``) with the
    id of ``request`` put in when its text shows one, as stdio does for the lines it cannot
    parse: the client is waiting for that id. Any other answer goes out as it came."""
    headers = start.get("headers", [])
    if not any(
        k.lower() == b"content-type" and v.startswith(b"application/json") for k, v in headers
    ):
        return start, answer
    try:
        error = json.loads(answer.get("body", b""))
    except ValueError:  # pragma: no cover - the SDK writes its errors as JSON
        return start, answer
    if not (isinstance(error, dict) and "error" in error and "id" in error and error["id"] is None):
        return start, answer
    found = top_level_id(bytes(request).decode("utf-8", errors="replace"))
    if found is None:
        return start, answer
    error["id"] = found
    # ASCII escapes: an id the client wrote as a lone surrogate ("\\ud800") has no UTF-8 form
    data = json.dumps(error, separators=(",", ":")).encode()
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    start = {**start, "headers": [*kept, (b"content-length", str(len(data)).encode())]}
    return start, {**answer, "body": data}


async def _plain(send: Send, status: int, text: str) -> None:
    await refuse(send, status, text.encode(), content_type=b"text/plain; charset=utf-8")


class ConnectionGuard:
    """The cap on open connections, and the log that counts what was refused.

    At the cap, a new connection replaces the oldest one that has not yet sent a complete
    request head (a slow or silent client, or a slow-loris attack), which is closed at once;
    a connection that has sent one (a client that was served, so one with a valid token where
    tokens are required) is never displaced. If every open connection has, the new one gets
    503 and is closed. Nothing is logged per connection: what was refused or dropped is
    counted, and one WARNING line per REFUSALS_EVERY seconds says how many.

    Why not uvicorn's ``limit_concurrency``: it is checked per request, once a request head has
    arrived, against the connections and tasks open, and answers that request 503. Connections
    that never finish a head are accepted and kept all the same (they are what ran the process
    out of descriptors), and the request it refuses is the one that did arrive, an
    authenticated client's. The cap here acts when a connection is accepted instead."""

    def __init__(
        self,
        limit: int,
        *,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        most_unsent: int = MOST_UNSENT,
    ) -> None:
        self.limit = limit
        self.send_timeout = send_timeout
        self.most_unsent = most_unsent
        self.open = 0
        self.unserved: dict[_BoundedH11, None] = {}  # oldest first (insertion order)
        self.stalled: dict[_BoundedH11, None] = {}  # replies not draining, oldest stall first
        self.counts: dict[str, int] = {}
        self._report: asyncio.TimerHandle | None = None

    def unsent(self) -> int:
        """The bytes of replies waiting in the send buffers of stalled connections."""
        return sum(conn.transport.get_write_buffer_size() for conn in self.stalled)

    def stall(self, conn: _BoundedH11) -> None:
        """``conn``'s send buffer went over the high-water mark: while the stalled buffers
        together hold more than ``most_unsent``, close the connection stalled longest (never
        ``conn`` itself, which its send deadline bounds)."""
        self.stalled[conn] = None
        unsent = self.unsent()
        while unsent > self.most_unsent:
            victim = next(iter(self.stalled))
            if victim is conn:
                break
            unsent -= victim.transport.get_write_buffer_size()
            self.note("closed to keep unread replies within their memory bound")
            victim.drop()

    def admit(self, conn: _BoundedH11) -> bool:
        """Whether ``conn``, just accepted, may stay (displacing another if need be)."""
        self.open += 1
        conn.counted = True
        if self.open > self.limit:
            victim = next(iter(self.unserved), None)
            if victim is None:
                self.note("refused at the limit")
                self.gone(conn)
                return False
            self.note("displaced before sending a request")
            self.gone(victim)
            victim.transport.abort()
        self.unserved[conn] = None
        return True

    def gone(self, conn: _BoundedH11) -> None:
        self.unserved.pop(conn, None)
        self.stalled.pop(conn, None)
        if conn.counted:
            conn.counted = False
            self.open -= 1

    def note(self, what: str) -> None:
        """Count one refusal or drop; the first of an interval schedules its log line."""
        self.counts[what] = self.counts.get(what, 0) + 1
        if self._report is None:
            loop = asyncio.get_running_loop()
            self._report = loop.call_later(REFUSALS_EVERY, self.report)

    def report(self) -> None:
        self._report = None
        counts, self.counts = self.counts, {}
        if counts:
            said = "; ".join(f"{n:,} {what}" for what, n in counts.items())
            log.warning(
                "connections in the last %g s: %s (limit: %d open connections, %g s to send "
                "the request headers, %g s to read a reply)",
                REFUSALS_EVERY,
                said,
                self.limit,
                HEAD_TIMEOUT,
                self.send_timeout,
            )

    def close(self) -> None:
        """Log what is still counted (the server is stopping)."""
        if self._report is not None:
            self._report.cancel()
            self.report()


class _BoundedH11(HookedH11):
    """uvicorn's HTTP/1.1 protocol, bounded: a connection counts against the guard's cap, and
    has HEAD_TIMEOUT seconds after connecting, or after its last answer, to send a complete
    request head. A client that sent part of one by then (however slowly it trickles bytes)
    gets 408 and is disconnected; an idle keep-alive connection is closed quietly. uvicorn has
    no such deadline (its keep-alive timeout stops at the first byte), so a client stalled
    inside its headers would hold a connection forever.

    Sending is bounded too: when the transport pauses writing (its buffer is over the
    high-water mark because the client is not reading), the connection has the guard's
    ``send_timeout`` to drain it below the low-water mark; if it does not, the connection is
    aborted, which frees the reply (uvicorn's send returns once the transport is lost).

    What this relies on of uvicorn is compat.uvicorn_h11.HookedH11's: the hooks below, and
    what it says of the connection's request (``request_open``, ``bytes_waiting``)."""

    guard: ConnectionGuard  # set on the subclass each server makes (web_config)
    counted = False  # counted in guard.open
    served = False  # a complete request head arrived: never displaced
    _head_timer: asyncio.TimerHandle | None = None
    _send_timer: asyncio.TimerHandle | None = None

    def connected(self, transport: asyncio.Transport) -> None:
        if not self.guard.admit(self):
            transport.write(_SERVICE_UNAVAILABLE)
            transport.close()
            return
        self._arm()

    def received(self) -> None:
        if not self.served and self.request_open:
            self.served = True
            self.guard.unserved.pop(self, None)

    def answered(self) -> None:
        self._arm()

    def writing_paused(self) -> None:
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.guard.send_timeout, self._send_overdue)
        self.guard.stall(self)

    def writing_resumed(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        self.guard.stalled.pop(self, None)

    def lost(self) -> None:
        for timer in (self._head_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self.guard.gone(self)

    def drop(self) -> None:
        """Close at once, discarding what is unsent (the client is not reading it)."""
        self.guard.stalled.pop(self, None)
        self.transport.abort()

    def _send_overdue(self) -> None:
        self._send_timer = None
        self.guard.note("closed for not reading a reply in time")
        self.drop()

    def _arm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.request_open or self.transport.is_closing():
            return  # a request is being read or answered: the body deadline is CancelOnDisconnect's
        if self.served and not self.bytes_waiting:
            self.transport.close()  # idle between requests, as uvicorn's keep-alive timeout does
            return
        self.guard.note("dropped for not sending the request headers in time")
        self.transport.write(_HEAD_TIMED_OUT)
        self.transport.close()


def _plain_response(status: bytes, text: bytes) -> bytes:
    return (
        b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (status, len(text), text)
    )


_HEAD_TIMED_OUT = _plain_response(b"408 Request Timeout", b"Request headers not received in time")
_SERVICE_UNAVAILABLE = _plain_response(
    b"503 Service Unavailable", b"agenthold has as many connections open as it takes; retry later"
)


def quiet_accept_errors(guard: ConnectionGuard) -> Callable[[], None]:
    """Count, rather than log with a traceback, asyncio's failures to accept a connection for
    want of descriptors: it reports one per pending connection (thousands a second), then
    retries in a second, and a retry that finds the socket closed at shutdown reports again.
    Only possible if --connection-limit was set above what the descriptor limit backs (or
    something else holds descriptors). Installed on the running loop; returns the undo."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = asyncio_loop.accept_exhausted(context)
        if error is not None:
            guard.note(f"not accepted: {error.strerror or error}")
            return
        if asyncio_loop.accept_retry_after_close(context):
            return  # asyncio's retry of an accept that failed, after the socket was closed
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return lambda: loop.set_exception_handler(previous)


def web_config(
    asgi: ASGIApp, log_level: str = "warning", *, guard: ConnectionGuard | None = None
) -> uvicorn.Config:
    """How agenthold runs uvicorn: its own logging (no access log, nothing on stdout), a
    bounded shutdown, deadlines for clients slow to send their headers, and ``guard``'s cap on
    open connections (by default, the one the descriptor limit allows)."""
    descriptors = descriptor_limit()
    if guard is None:
        guard = ConnectionGuard(connection_limit(None, descriptors)[0])
    protocol = type("_H11", (_BoundedH11,), {"guard": guard})  # one guard per server
    return uvicorn.Config(
        asgi,
        lifespan="on",
        log_config=None,
        log_level="debug"
        if log_level == "debug"
        else "warning",  # its start-up chatter: ours says it
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
        timeout_keep_alive=5,
        http=protocol,
        backlog=accept_backlog(guard.limit, descriptors),
    )


def transport_security(opts: HttpOptions) -> TransportSecuritySettings:
    """DNS-rebinding protection: the SDK's Host and Origin checks for the given Host values,
    or none without them (then LoopbackOrigins guards a loopback server; see auth.py).

    A value without a port (``agents.example``, ``[::1]``) also accepts that host on any port,
    since a Host header carries the port unless it is 80 or 443; ``host:*`` says so outright."""
    if not opts.allowed_hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts: list[str] = []
    for host in (h.lower() for h in opts.allowed_hosts):  # FoldHostCase lowers the headers
        hosts.append(host)
        if not _has_port(host):
            hosts.append(f"{host}:*")
    origins = [f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def _has_port(host: str) -> bool:
    """Whether a Host value ends in a port (or the ``:*`` wildcard): ``h:80``, ``[::1]:80``."""
    head, colon, port = host.rpartition(":")
    bracketed_or_plain = head.endswith("]") or ":" not in head  # not a bare IPv6 address
    return bool(colon) and (port == "*" or port.isdigit()) and bracketed_or_plain


def principal_live(table: TokenTable) -> Callable[[str], bool]:
    """Whether a principal may still call: one of ``table`` that still has a token, or the
    shared token's (which lives as long as the server)."""
    return lambda name: name == SHARED.name or table.knows(name)


def http_app(app: Agenthold, opts: HttpOptions) -> ASGIApp:
    """The whole HTTP application: bearer tokens first, then the MCP endpoint."""
    return _http_stack(app, opts)[0]


def _http_stack(app: Agenthold, opts: HttpOptions) -> tuple[ASGIApp, CancelOnDisconnect]:
    """The HTTP application, and its layer that can end every open request at shutdown: bearer
    tokens, then the bound on each principal's sessions, the Host and Origin checks, and the
    layer that ends requests, around the SDK's app."""
    app.transport = "http"
    if opts.auth_file is not None:  # a revoked principal's waits are handed no claim
        app.coordinator.principal_live = principal_live(opts.auth_file)
    report_of = session_progress if opts.json_response else report_if_asked
    server = build_server(app, session_connection(app), report_of, principal_of)
    starlette_app = server.streamable_http_app(
        streamable_http_path=opts.path,
        json_response=opts.json_response,
        transport_security=transport_security(opts),
        host=opts.host,
        max_request_body_size=MAX_BODY_BYTES,
        session_idle_timeout=opts.bounds.session_idle,  # sessions.py keeps the same clock
    )
    requests = CancelOnDisconnect(starlette_app)
    asgi: ASGIApp = requests
    if opts.allowed_hosts:
        asgi = FoldHostCase(asgi)
    elif is_loopback(opts.host):
        asgi = LoopbackOrigins(asgi)
    asgi = SessionLimits(
        asgi,
        limit=opts.bounds.sessions,
        idle=opts.bounds.session_idle,
        handshake_versions=mcp_sdk.handshake_versions(),
        path=opts.path,
    )
    if opts.auth_tokens or opts.auth_file is not None:
        asgi = BearerAuth(asgi, opts.auth_tokens, table=opts.auth_file)
    return asgi, requests


async def serve_http(
    app: Agenthold,
    opts: HttpOptions,
    sock: socket.socket,
    *,
    signals: SignalSource,
    ready: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` on the listening ``sock`` until a signal stops it; at the end, free the
    claims of the agents registered here. ``ready`` runs once everything is built, just before
    the first request is taken (the command line freezes the startup objects there)."""
    sse.clear_exit_flag()  # sse-starlette's process-wide "close every stream" flag
    asgi, requests = _http_stack(app, opts)
    limit, warning = connection_limit(opts.bounds.connections, descriptor_limit())
    if warning is not None:
        log.warning("%s", warning)
    guard = ConnectionGuard(limit, send_timeout=opts.bounds.send_timeout)
    web = QuietServer(web_config(asgi, opts.log_level, guard=guard))
    host, port = sock.getsockname()[:2]
    undo = quiet_accept_errors(guard)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(
                _stop_web_on_signal, signals, web, app, requests
            )  # signals are ours from now
            url = f"http://{_url_host(str(host))}:{port}{opts.path}"
            log.info("serving %s tools at %s", app.tools, url)  # the port bound, if 0 was asked
            tg.start_soon(app.reap_forever)
            if ready is not None:
                ready()
            await web.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    finally:
        undo()
        guard.close()
        with anyio.CancelScope(shield=True):
            await app.release_everyone()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _stop_web_on_signal(
    signals: SignalSource,
    web: uvicorn.Server,
    app: Agenthold,
    requests: CancelOnDisconnect,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """First signal: stop accepting, end waits, give calls in flight SHUTDOWN_GRACE seconds;
    second: end the calls in flight now; third: let uvicorn drop everything."""
    async with anyio.create_task_group() as tg:
        with signals() as arriving:
            task_status.started()
            async for signum in arriving:
                name = signal.Signals(signum).name
                if not web.should_exit:
                    log.info("%s: stopping (calls in flight get %g s)", name, SHUTDOWN_GRACE)
                    web.should_exit = True
                    app.stop_waiting()
                    tg.start_soon(_drain, requests)
                elif not requests.ending:
                    log.warning("%s again: ending the calls in flight now", name)
                    requests.end_all()
                else:
                    web.force_exit = True


async def _drain(requests: CancelOnDisconnect) -> None:
    """Let the calls in flight finish (within the grace period), then end what is still open:
    the event streams of old-style clients, and calls that did not finish in time. This comes
    before uvicorn's own deadline, whose cancellations would log tracebacks."""
    with anyio.move_on_after(SHUTDOWN_GRACE - 0.5):
        while requests.posts_open:
            await anyio.sleep(0.05)
    requests.end_all()
