"""Who may call over HTTP: bearer tokens, and browser pages of other sites, as plain ASGI
middleware (standard library only).

Decisions behind it:
- Every HTTP request must carry ``Authorization: Bearer <token>`` matching one configured
  token; anything else gets 401 with ``WWW-Authenticate: Bearer`` before any MCP or database
  work, and its connection is closed (not kept alive for another try). Lifespan events pass
  through, so the server still starts and stops.
- The comparison is constant-time: the presented token and each configured token are hashed
  to equal length and compared with ``hmac.compare_digest``, against every token, without an
  early exit that would tell which one matched.
- The scheme is matched case-insensitively and the token is trimmed; tokens never appear in
  logs, error messages or replies.
- With a token file (``--auth-file``, see principals.py) each token names a principal, which
  is put in the ASGI scope as ``agenthold.principal`` for the server to bind agents and check
  scopes with; every ``--auth-token`` is the one all-access principal ``SHARED``. A token file
  that became unusable refuses its principals with 503, never lets them through.
- A session of the handshake era (``Mcp-Session-Id``) belongs to the principal that opened it:
  a request from another principal naming it gets 404, as an unknown session would, so nobody
  can end or use a session (and with it the leases of its agents) that is not theirs.
- Without ``--allowed-host`` the Host header is not checked (a reverse proxy or a container
  may present any name). On a loopback address, though, a request that carries an ``Origin``
  other than a loopback one is refused with 403: only browsers send Origin, and a page of
  another site reaching a server on this machine is what a DNS-rebinding attack looks like.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from agenthold.identity.principals import SHARED, Principal, TokenTable

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNAUTHORIZED = json.dumps(
    {
        "error": "unauthorized",
        "message": "this agenthold server needs 'Authorization: Bearer <token>' with a valid token",
    }
).encode()


async def refuse(
    send: Send,
    status: int,
    body: bytes,
    headers: Sequence[tuple[bytes, bytes]] = (),
    *,
    content_type: bytes = b"application/json",
) -> None:
    """Answer a request with ``status`` and a short ``body``, before any app sees it."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def usable_tokens(tokens: Sequence[str]) -> list[str]:
    """The configured tokens, trimmed, without blanks."""
    return [t.strip() for t in tokens if t.strip()]


UNUSABLE_FILE = json.dumps(
    {
        "error": "auth_file_unusable",
        "message": "this agenthold server's token file cannot be read since it last changed; "
        "its operator must fix it (the server's log says why)",
    }
).encode()

CLOSE = (b"connection", b"close")
PRINCIPAL = "agenthold.principal"  # the ASGI scope key the caller's Principal is put under
MAX_SESSIONS = 20_000  # session owners remembered (the SDK keeps at most 10,000 sessions)
FOREIGN_SESSION = json.dumps(
    {
        "error": "unknown_session",
        "message": "no session with this Mcp-Session-Id belongs to this token; open a new one",
    }
).encode()


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class UnusableFile(Exception):
    """The token file cannot be used right now: refuse with 503."""


class BearerAuth:
    """Let a request through only if it carries one of ``tokens``, or a token of the token
    file ``table``, as a bearer token."""

    def __init__(
        self, app: ASGIApp, tokens: Sequence[str] = (), *, table: TokenTable | None = None
    ) -> None:
        accepted = usable_tokens(tokens)
        if not accepted and table is None:
            raise ValueError("BearerAuth needs at least one non-blank token or a token file")
        self.app = app
        self.table = table
        self._digests = [_digest(t.encode("utf-8")) for t in accepted]
        self._session_owners: OrderedDict[bytes, str] = OrderedDict()
        # Once an owner was forgotten (the oldest, past MAX_SESSIONS), a session id of no known
        # owner may be that one's: it is refused (404: its client opens a new session) rather
        # than served to whoever names it.
        self._forgot_owners = False

    def identify(self, header: bytes | None) -> Principal | None:
        """The principal an Authorization header value names, or None; UnusableFile if only
        the token file could say and it cannot be read."""
        if header is None:
            return None
        scheme, _, token = header.strip().partition(b" ")
        token = token.strip()
        presented = _digest(token)
        matched = False
        for expected in self._digests:  # no early exit: every token is compared
            matched |= hmac.compare_digest(presented, expected)
        found: Principal | None = None
        if self.table is not None:
            current = self.table.current()  # one stat; read again if the file changed
            if current is not None:
                found = current.match(presented)
            elif not matched:
                raise UnusableFile
        if scheme.lower() != b"bearer" or not token:
            return None
        if found is not None:
            return found
        return SHARED if matched else None

    def _noting_sessions(self, send: Send, name: str) -> Send:
        """``send``, noting whose a session is when the response opens one."""

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", ()):
                    if key.lower() == b"mcp-session-id" and value not in self._session_owners:
                        self._session_owners[value] = name
                        while len(self._session_owners) > MAX_SESSIONS:
                            self._session_owners.popitem(last=False)
                            self._forgot_owners = True
            await send(message)

        return noting

    def accepts(self, header: bytes | None) -> bool:
        """Whether an Authorization header value carries an accepted token."""
        try:
            return self.identify(header) is not None
        except UnusableFile:
            return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = session = None  # the first of each, found in one pass over the headers
        for key, value in scope.get("headers", ()):
            if key == b"authorization" and header is None:
                header = value
            elif key == b"mcp-session-id" and session is None:
                session = value
        try:
            principal = self.identify(header)
        except UnusableFile:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1011})
                return
            await refuse(send, 503, UNUSABLE_FILE)
            return
        if principal is not None:
            scope[PRINCIPAL] = principal
            owner = None if session is None else self._session_owners.get(session)
            forgotten = owner is None and session is not None and self._forgot_owners
            if forgotten or (owner is not None and owner != principal.name):
                await refuse(send, 404, FOREIGN_SESSION)
                return
            await self.app(scope, receive, self._noting_sessions(send, principal.name))
            return
        if scope["type"] == "websocket":  # refused before the handshake: the server sends 403
            await send({"type": "websocket.close", "code": 1008})
            return
        # and closes the connection: one without a valid token never holds a connection open
        await refuse(send, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer"), CLOSE])


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine."""
    bare = host.strip("[]").lower()
    if bare == "localhost" or bare.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:  # a host name: assume it reaches beyond this machine
        return False


FOREIGN_ORIGIN = json.dumps(
    {
        "error": "forbidden_origin",
        "message": "requests from web pages of other sites are refused; "
        "start agenthold with --allowed-host to accept a site",
    }
).encode()


class LoopbackOrigins:
    """Refuse requests whose Origin header names a host other than this machine (403)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @staticmethod
    def accepts(origin: bytes | None) -> bool:
        if origin is None:
            return True  # not a browser
        try:
            host = urlsplit(origin.decode("latin-1").strip()).hostname
        except ValueError:
            return False
        return host is not None and is_loopback(host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = next((v for k, v in scope.get("headers", ()) if k == b"origin"), None)
        if self.accepts(origin):
            await self.app(scope, receive, send)
            return
        await refuse(send, 403, FOREIGN_ORIGIN)


class FoldHostCase:
    """Lower-case the Host and Origin headers before the SDK's ``--allowed-host`` check, which
    compares strings exactly: host names are case-insensitive (RFC 9110), so ``Agents.Example``
    is the ``agents.example`` that was allowed. The configured names are lower-cased too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = [
                (name, value.lower()) if name in (b"host", b"origin") else (name, value)
                for name, value in scope["headers"]
            ]
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)
