"""Who may call over HTTP: bearer tokens, and browser pages of other sites, as plain ASGI
middleware (standard library only).

Decisions behind it:
- Every HTTP request must carry ``Authorization: Bearer <token>`` matching one configured
  token; anything else gets 401 with ``WWW-Authenticate: Bearer`` before any MCP or database
  work. Lifespan events pass through, so the server still starts and stops.
- The comparison is constant-time: the presented token and each configured token are hashed
  to equal length and compared with ``hmac.compare_digest``, against every token, without an
  early exit that would tell which one matched.
- The scheme is matched case-insensitively and the token is trimmed; tokens never appear in
  logs, error messages or replies.
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
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any
from urllib.parse import urlsplit

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


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class BearerAuth:
    """Let a request through only if it carries one of ``tokens`` as a bearer token."""

    def __init__(self, app: ASGIApp, tokens: Sequence[str]) -> None:
        accepted = usable_tokens(tokens)
        if not accepted:
            raise ValueError("BearerAuth needs at least one non-blank token")
        self.app = app
        self._digests = [_digest(t.encode("utf-8")) for t in accepted]

    def accepts(self, header: bytes | None) -> bool:
        """Whether an Authorization header value carries an accepted token."""
        if header is None:
            return False
        scheme, _, token = header.strip().partition(b" ")
        presented = _digest(token.strip())
        matched = False
        for expected in self._digests:  # no early exit: every token is compared
            matched |= hmac.compare_digest(presented, expected)
        return matched and scheme.lower() == b"bearer" and bool(token.strip())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if self.accepts(header):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # refused before the handshake: the server sends 403
            await send({"type": "websocket.close", "code": 1008})
            return
        await refuse(send, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])


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
