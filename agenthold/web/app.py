"""The live page's HTTP side: routes, the guard in front of them, and the listener.

Decisions behind it:
- Its own process and listener, apart from any MCP server: the page reads the database the
  servers write, so a slow or stuck browser can hold up nothing but its own stream.
- The guard reuses auth.py: ``BearerAuth.identify`` (the token file's constant-time match,
  read again when the file changes) names the principal, and ``LoopbackOrigins.accepts`` and
  ``is_loopback`` are the HTTP server's Origin check. On a loopback address the Host header
  must be a loopback name too: the page answers GET requests, which browsers send without an
  Origin, and a page of another site that rebinds its name to 127.0.0.1 would otherwise read
  it.
- With ``--auth-file`` the page asks for a token once; a valid one opens a session (a random
  cookie, ``HttpOnly`` and ``SameSite=Strict``) that remembers the token in memory only, and
  each request matches that token against the file again, so a revoked token stops working at
  once. ``Authorization: Bearer`` works as well, for scripts.
- Every response says: no framing (``X-Frame-Options: DENY`` and ``frame-ancestors 'none'``),
  a content security policy allowing only the page's own files, ``Cache-Control: no-store``,
  ``nosniff`` and no referrer. Streams are bounded (``MAX_STREAMS``), and so are connections
  (uvicorn's ``limit_concurrency``).
- The HTML, CSS and JavaScript are files of the package (agenthold/web/static), read once: no
  CDN, no build step, nothing fetched from elsewhere.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from importlib import resources
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import uvicorn
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agenthold.identity.principals import Principal, TokenTable
from agenthold.serve.auth import BearerAuth, LoopbackOrigins, UnusableFile, is_loopback, refuse
from agenthold.serve.compat.uvicorn_h11 import QuietServer
from agenthold.store import AgentholdError
from agenthold.web.feed import PING, SEND_TIMEOUT, Hub, Stream
from agenthold.web.views import MAX_PAGE, PAGE, View, WebInputError

MAX_STREAMS = 32  # open event streams at once (each open page holds one)
MAX_CONNECTIONS = 128  # uvicorn's limit_concurrency: connections and tasks at once
MAX_SESSIONS = 256  # signed-in browsers remembered; the oldest is forgotten first
COOKIE = "agenthold_web"
PRINCIPAL = "agenthold.web.principal"  # where the guard puts the caller, in the ASGI scope
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
OPEN_PATHS = set(STATIC) | {"/api/login"}  # served without a token (they hold no data)


def _json_error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class Guard:
    """Security headers on every response; the Host and Origin checks; with a token file,
    a principal for every request that reads data (401 without one)."""

    def __init__(self, app: ASGIApp, *, host: str, table: TokenTable | None) -> None:
        self.app = app
        self.loopback = is_loopback(host)
        self.table = table
        # BearerAuth's token match and its reading of the file, reused (it wraps nothing here)
        self.auth = None if table is None else BearerAuth(app, table=table)
        self.sessions: OrderedDict[str, str] = OrderedDict()

    def principal_of(self, scope: Scope) -> Principal | None:
        """The caller a request names (a bearer token or a session cookie), or None."""
        assert self.auth is not None
        header = cookie = None
        for key, value in scope.get("headers", ()):
            if key == b"authorization" and header is None:
                header = value
            elif key == b"cookie":
                cookie = value
        if header is None and cookie is not None:
            token = self.sessions.get(_cookie(cookie))
            if token is not None:
                header = b"Bearer " + token.encode()
        return self.auth.identify(header)

    def sign_in(self, token: str) -> str | None:
        """A new session for ``token`` if it names a principal; its cookie value."""
        assert self.auth is not None
        if self.auth.identify(b"Bearer " + token.encode()) is None:
            return None
        session = secrets.token_urlsafe(32)
        self.sessions[session] = token
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return session

    def sign_out(self, scope: Scope) -> None:
        for key, value in scope.get("headers", ()):
            if key == b"cookie":
                self.sessions.pop(_cookie(value), None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *SECURITY_HEADERS]
            await send(message)

        headers = dict(scope.get("headers", ()))
        host = headers.get(b"host", b"").decode("latin-1")
        if self.loopback and not is_loopback(_hostname(host)):
            await refuse(secured, 403, _json_error("this page answers to loopback names only"))
            return
        if not LoopbackOrigins.accepts(headers.get(b"origin")) and self.loopback:
            await refuse(secured, 403, _json_error("requests from other sites are refused"))
            return
        scope[PRINCIPAL] = None
        scope["agenthold.guard"] = self
        if self.table is not None and scope["path"] not in OPEN_PATHS:
            try:
                principal = self.principal_of(scope)
            except UnusableFile:
                await refuse(secured, 503, _json_error("the token file cannot be read"))
                return
            if principal is None:
                await refuse(
                    secured,
                    401,
                    _json_error("a token is needed"),
                    [(b"www-authenticate", b"Bearer")],
                )
                return
            scope[PRINCIPAL] = principal
        await self.app(scope, receive, secured)


def _cookie(header: bytes) -> str:
    for part in header.decode("latin-1").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return ""


def _whole(text: str) -> bool:
    """ASCII digits only, and small enough for a database integer: str.isdigit alone takes
    "²" (which int() refuses) and numbers past 2**63 (which the database refuses)."""
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


# --------------------------------------------------------------------------------------------
# Routes
# --------------------------------------------------------------------------------------------


def build_app(view: View, hub: Hub, *, host: str, table: TokenTable | None) -> ASGIApp:
    """The page's ASGI application over ``view``, its streams fed by ``hub``."""
    folder = resources.files("agenthold.web").joinpath("static")
    files = {
        path: (folder.joinpath(name).read_bytes(), kind) for path, (name, kind) in STATIC.items()
    }

    def static(request: Request) -> Response:
        body, kind = files[request.url.path]
        return Response(body, media_type=kind)

    def principal(request: Request) -> Principal | None:
        found: Principal | None = request.scope.get(PRINCIPAL)
        return found

    def reading(
        read: Callable[[Request], Any],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                found = await anyio.to_thread.run_sync(read, request)
            except WebInputError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            except AgentholdError as exc:  # the database cannot be read right now
                return JSONResponse({"error": str(exc)}, status_code=503)
            return JSONResponse(found)

        return endpoint

    def overview(request: Request) -> Any:
        return view.overview(principal(request))

    def events(request: Request) -> Any:
        q = request.query_params
        before: list[int | None] = [None, None, None]
        if q.get("before"):
            parts = q["before"].split(",")
            if len(parts) != 3 or not all(_whole(p) for p in parts):
                raise WebInputError("before: three whole numbers, as a page's 'before' gives")
            before = [int(p) for p in parts]
        limit = q.get("limit", str(PAGE))
        if not _whole(limit) or not 1 <= int(limit) <= MAX_PAGE:
            raise WebInputError(f"limit: a whole number from 1 to {MAX_PAGE}")
        agent = q.get("agent") or None
        resource = q.get("resource") or None
        return view.page(before, int(limit), agent, resource, principal(request))

    def why(request: Request) -> Any:
        resource = request.query_params.get("resource", "")
        mode = request.query_params.get("mode", "exclusive")
        if not resource.strip():
            raise WebInputError("resource: name the resource to look at")
        return view.why(resource, mode)

    def keys(request: Request) -> Any:
        return view.keys(request.query_params.get("namespace", ""), principal(request))

    def history(request: Request) -> Any:
        q = request.query_params
        return view.history(q.get("namespace", ""), q.get("key", ""), principal(request))

    async def stream(request: Request) -> Response:
        if len(hub.streams) >= MAX_STREAMS:
            return JSONResponse({"error": "too many pages are open"}, status_code=429)
        one = Stream(hub, principal(request))
        return EventSourceResponse(one.messages(), ping=PING, send_timeout=SEND_TIMEOUT)

    async def login(request: Request) -> Response:
        guard: Guard = request.scope["agenthold.guard"]
        if guard.table is None:
            return JSONResponse({"signed_in": True, "auth": False})
        try:
            body = await request.json()
            token = body["token"]
            if not isinstance(token, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'send {"token": "..."}'}, status_code=400)
        try:
            session = guard.sign_in(token.strip())
        except UnusableFile:
            return JSONResponse({"error": "the token file cannot be read"}, status_code=503)
        if session is None:
            return JSONResponse({"error": "this token is not in the token file"}, status_code=401)
        reply = JSONResponse({"signed_in": True, "auth": True})
        reply.set_cookie(COOKIE, session, httponly=True, samesite="strict", path="/")
        return reply

    async def logout(request: Request) -> Response:
        request.scope["agenthold.guard"].sign_out(request.scope)
        reply = JSONResponse({"signed_in": False})
        reply.delete_cookie(COOKIE, path="/")
        return reply

    routes = [Route(path, static) for path in STATIC]
    routes += [
        Route("/api/overview", reading(overview)),
        Route("/api/events", reading(events)),
        Route("/api/why", reading(why)),
        Route("/api/keys", reading(keys)),
        Route("/api/history", reading(history)),
        Route("/api/stream", stream),
        Route("/api/login", login, methods=["POST"]),
        Route("/api/logout", logout, methods=["POST"]),
    ]
    return Guard(Starlette(routes=routes), host=host, table=table)


# --------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------


async def serve(
    view: View,
    sock: socket.socket,
    *,
    table: TokenTable | None,
    signals: Callable[[], AbstractContextManager[AsyncIterator[int]]],
) -> None:
    """Serve the page on the listening ``sock`` until a signal of ``signals`` arrives (a
    second one drops the connections still open)."""
    hub = Hub(view)
    host = str(sock.getsockname()[0])
    config = uvicorn.Config(
        build_app(view, hub, host=host, table=table),
        log_level="warning",
        access_log=False,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_graceful_shutdown=2,
        lifespan="off",
    )
    server = QuietServer(config)  # uvicorn without its signal handlers: cli.py's stop it

    async def stop_on_signal(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with signals() as arriving:
            task_status.started()
            async for _ in arriving:
                if server.should_exit:
                    server.force_exit = True
                server.should_exit = True
                hub.close_streams()  # else open pages would hold the end back

    async with anyio.create_task_group() as tg:
        await tg.start(stop_on_signal)
        tg.start_soon(hub.run)
        await server.serve(sockets=[sock])
        tg.cancel_scope.cancel()
