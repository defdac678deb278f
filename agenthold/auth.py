"""Bearer tokens for the HTTP transport, as plain ASGI middleware (standard library only).

Decisions behind it:
- Every HTTP request must carry ``Authorization: Bearer <token>`` matching one configured
  token; anything else gets 401 with ``WWW-Authenticate: Bearer`` before any MCP or database
  work. Lifespan events pass through, so the server still starts and stops.
- The comparison is constant-time: the presented token and each configured token are hashed
  to equal length and compared with ``hmac.compare_digest``, against every token, without an
  early exit that would tell which one matched.
- The scheme is matched case-insensitively and the token is trimmed; tokens never appear in
  logs, error messages or replies.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

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
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(UNAUTHORIZED)).encode()),
                    (b"www-authenticate", b'Bearer realm="agenthold"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": UNAUTHORIZED})
