"""How many sessions of the handshake era (2025-11-25 and older, with ``Mcp-Session-Id``) each
principal may keep open over HTTP, as plain ASGI middleware (standard library only).

Decisions behind it:
- Clients that open sessions and never close them took 44 kB each, and the SDK's limit of
  10,000 sessions over all callers then locked every new legacy client out for the SDK's idle
  time of 30 minutes. So each principal (each token of a token file; every ``--auth-token`` is
  one principal, and without tokens everyone is one) may keep at most ``limit`` sessions, and a
  session without a request in flight for ``idle`` seconds ends (the SDK's own idle timeout,
  set to it; an open event stream is a request in flight).
- At the limit, a request that would open another session first ends that principal's oldest
  idle session, as its client's DELETE would (its agents' claims then get the disconnect grace,
  as for any session that ends). A client that left without closing its session is the usual
  owner of an idle session, and a client that merely paused gets 404 on its next request, which
  tells MCP clients to open a new session. Refusing the new session instead would lock out a
  principal's new clients behind its abandoned ones, the failure this module exists to prevent.
- Only if every session of the principal has a request in flight (a live client, or an open
  event stream) is the new one refused: 429 with a JSON error naming ``--session-limit``.
- Which requests may open a session is read from the headers alone, as the SDK routes them: a
  POST to the MCP path without ``Mcp-Session-Id`` whose ``MCP-Protocol-Version`` is absent or
  of the handshake era. A request to any other path opens nothing and makes no room, and the
  DELETE that ends an idle session goes to the MCP path. The 2026-07-28 protocol keeps no
  sessions and passes untouched.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from agenthold.serve.auth import PRINCIPAL, ASGIApp, Message, Receive, Scope, Send, refuse

log = logging.getLogger("agenthold.serve.http")

TOO_MANY = "too_many_sessions"
LOG_EVERY = 10.0  # seconds between log lines counting the sessions ended to make room


@dataclass
class Session:
    """What is known of one open session."""

    id: bytes
    owner: str
    host: bytes  # the Host header of the request that opened it (the internal DELETE's)
    version: bytes | None  # its MCP-Protocol-Version, once a request named it
    in_flight: int = 0
    idle_since: float = field(default_factory=time.monotonic)


class SessionLimits:
    """Keep each principal at most ``limit`` open sessions, ending the oldest idle one to make
    room, and forget sessions idle for ``idle`` seconds (the SDK ends them then)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        idle: float,
        handshake_versions: Collection[str],
        path: str = "/mcp",
    ) -> None:
        self.app = app
        self.path = path.rstrip("/") or "/"  # the MCP endpoint's path
        self.limit = limit
        self.idle = idle
        self._handshake = {v.encode() for v in handshake_versions}
        self.sessions: dict[bytes, Session] = {}  # oldest first
        self.opening: dict[str, int] = {}  # requests in flight that may open one, by owner
        self._ended = 0  # idle sessions ended to make room since the last log line
        self._logged = -LOG_EVERY

    def owned(self, owner: str) -> list[Session]:
        """The open sessions of ``owner``, oldest first."""
        self._forget_expired()
        return [s for s in self.sessions.values() if s.owner == owner]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        principal = scope.get(PRINCIPAL)
        owner = "" if principal is None else principal.name
        sid = headers.get(b"mcp-session-id")
        version = headers.get(b"mcp-protocol-version")
        mcp_path = (scope.get("path", "").rstrip("/") or "/") == self.path
        if not mcp_path:  # another path's answer says nothing about sessions
            await self.app(scope, receive, send)
        elif sid is not None:
            await self._in_session(sid, version, scope, receive, send)
        elif scope.get("method") == "POST" and (version is None or version in self._handshake):
            await self._opening(owner, headers.get(b"host", b""), scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _in_session(
        self, sid: bytes, version: bytes | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        session = self.sessions.get(sid)
        if session is None:
            await self.app(scope, receive, send)
            return
        if version is not None:
            session.version = version
        session.in_flight += 1
        status = 0

        async def noting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting)
        finally:
            session.in_flight -= 1
            session.idle_since = time.monotonic()
            ended = scope.get("method") == "DELETE" and 200 <= status < 300
            if status == 404 or ended:  # the SDK no longer knows it
                self.sessions.pop(sid, None)

    async def _opening(
        self, owner: str, host: bytes, scope: Scope, receive: Receive, send: Send
    ) -> None:
        # a place is taken before any await, so that requests opening at once count each other
        self._reserve(owner, +1)
        reserved = True
        opened: Session | None = None
        try:
            full = len(self.owned(owner)) + self.opening[owner] > self.limit
            if full and not await self._make_room(owner, scope):
                await refuse(send, 429, self._refusal())
                return

            async def noting(message: Message) -> None:
                nonlocal opened, reserved
                if message["type"] == "http.response.start" and message["status"] < 400:
                    headers = message.get("headers", ())
                    sid = next((v for k, v in headers if k == b"mcp-session-id"), None)
                    if sid is not None and sid not in self.sessions:
                        opened = Session(sid, owner, host, None, in_flight=1)
                        self.sessions[sid] = opened  # the reserved place is this session now
                        self._reserve(owner, -1)
                        reserved = False
                await send(message)

            await self.app(scope, receive, noting)
        finally:
            if reserved:
                self._reserve(owner, -1)
            if opened is not None:
                opened.in_flight -= 1
                opened.idle_since = time.monotonic()

    def _reserve(self, owner: str, change: int) -> None:
        self.opening[owner] = self.opening.get(owner, 0) + change
        if not self.opening[owner]:
            del self.opening[owner]

    async def _make_room(self, owner: str, scope: Scope) -> bool:
        """End ``owner``'s oldest idle session; whether one was ended."""
        for victim in self.owned(owner):
            if victim.in_flight:
                continue
            self.sessions.pop(victim.id, None)
            status = await self._delete(victim, scope)
            if status in (200, 204, 404):  # ended now, or the SDK had ended it already
                self._count_ended()
                return True
            log.warning("could not end an idle session to make room (HTTP %d)", status)
            return False
        return False

    async def _delete(self, victim: Session, scope: Scope) -> int:
        """Send the SDK the DELETE its client would have sent for ``victim``; the status."""
        headers = [(b"host", victim.host), (b"mcp-session-id", victim.id)]
        if victim.version is not None:
            headers.append((b"mcp-protocol-version", victim.version))
        request = {
            **{k: v for k, v in scope.items() if k in ("asgi", "http_version", "server", "scheme")},
            "type": "http",
            "method": "DELETE",
            "path": self.path,
            "raw_path": self.path.encode(),
            "root_path": scope.get("root_path", ""),
            "query_string": b"",
            "headers": headers,
            "client": None,
            "state": dict(scope.get("state", {})),
        }
        status = 0
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await self.app(request, receive, send)
        return status

    def _count_ended(self) -> None:
        """Log how many idle sessions were ended to make room: at most one line per LOG_EVERY
        seconds (a client that never closes its sessions would otherwise log one per session)."""
        self._ended += 1
        now = time.monotonic()
        if now - self._logged >= LOG_EVERY:
            log.info(
                "ended %d idle session(s) to make room for new ones (--session-limit %d per token)",
                self._ended,
                self.limit,
            )
            self._ended, self._logged = 0, now

    def _forget_expired(self) -> None:
        """Drop sessions idle past ``idle``: the SDK has ended them (a margin for its timer)."""
        cutoff = time.monotonic() - self.idle - 1.0
        for sid in [
            s.id for s in self.sessions.values() if not s.in_flight and s.idle_since < cutoff
        ]:
            del self.sessions[sid]

    def _refusal(self) -> bytes:
        return json.dumps(
            {
                "error": TOO_MANY,
                "message": f"this token already has {self.limit} sessions open, each with a "
                "request in flight; close one (DELETE with its Mcp-Session-Id) or ask the "
                "server's operator to raise --session-limit",
            }
        ).encode()
