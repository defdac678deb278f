"""The MCP server: the standard tools (claims) and the advanced tools (the versioned store).

Decisions behind it:
- The low-level ``mcp`` Server, not MCPServer: agenthold owns its JSON schemas, checks every
  argument itself and shapes every reply, so any bad input becomes an ``isError`` result whose
  JSON says ``status: "error"`` with a message and a hint, and a call costs no pydantic model.
- Database work runs in worker threads and is short. Waits and watches are async loops woken by
  the store's change feed, so they hold no thread; reads and writes have separate thread
  limiters, so writers stuck behind another process's lock never delay reads.
- A connection is not an agent. Agents are remembered per connection only to end their leases
  (after ``--disconnect-grace``) when the connection goes away; any later call that names the
  agent, from any process, renews its lease and nothing is lost.
- stdio reads and writes its pipes on the event loop (the SDK's reader thread cannot be
  cancelled, so a signal would hang) and answers every line the SDK cannot parse, which the SDK
  alone drops, leaving the client waiting forever.
- HTTP runs the SDK's Streamable HTTP app on uvicorn behind bearer-token middleware, with
  deadlines for slow clients, and a shutdown that ends every open request with a complete
  answer before it frees the claims of the agents registered here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import os
import re
import signal
import socket
import stat
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread
import h11
import mcp.types as types
import uvicorn
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from pydantic import ValidationError
from sse_starlette.sse import AppStatus
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from agenthold.auth import BearerAuth, FoldHostCase, LoopbackOrigins, is_loopback, refuse
from agenthold.claims import MAX_AGENT_NAME, MAX_MODEL, MAX_PURPOSE, Coordinator, timeout_reply
from agenthold.store import (
    AgentholdError,
    BusyError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    Record,
    StateStore,
    UnavailableError,
    key_topic,
)
from agenthold.uris import Resource

if TYPE_CHECKING:
    from agenthold.cli import ServeOptions

log = logging.getLogger("agenthold.server")

MAX_WAIT_SECONDS = 300  # longest agenthold_wait / agenthold_watch a tool call may ask for
DEFAULT_WAIT_SECONDS = 30.0
MAX_HISTORY_LIMIT = 1000
MAX_VERSION = 2**63 - 1  # SQLite's largest integer: no key's version can be above it
REAP_EVERY = 600.0  # seconds between two looks for idle agents to remove
Reply = dict[str, Any]


def version() -> str:
    from agenthold import _installed_version

    return _installed_version()


# --------------------------------------------------------------------------------------------
# Tool declarations and argument checking
# --------------------------------------------------------------------------------------------


class ToolError(Exception):
    """A call the agent must fix: becomes an isError result with a message and a hint."""

    def __init__(self, message: str, hint: str, kind: str = "invalid_arguments") -> None:
        super().__init__(message)
        self.hint = hint
        self.kind = kind


@dataclass(frozen=True)
class Param:
    name: str
    kind: Literal["string", "integer", "number", "boolean", "json"]
    description: str
    required: bool = True
    default: Any = None
    enum: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None  # of a string; the layer below checks it, with its message
    # Listed as required in the schema although a call may leave it out: expected_version,
    # which `force` makes unnecessary (the tool then explains what is missing, if anything).
    advertised: bool = False

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"description": self.description}
        if self.kind != "json":
            schema["type"] = self.kind
        if self.enum:
            schema["enum"] = list(self.enum)
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.max_length is not None:
            schema["maxLength"] = self.max_length
        if not self.required and self.default is not None:
            schema["default"] = self.default
        return schema

    def check(self, tool: str, value: Any) -> Any:
        """Return ``value`` converted to this parameter's Python type, or raise ToolError."""
        kind = self.kind
        if kind == "json":
            return value
        ok: bool
        if kind == "string":
            ok = isinstance(value, str)
        elif kind == "boolean":
            ok = isinstance(value, bool)
        elif kind == "integer":
            if isinstance(value, float) and value.is_integer():
                value = int(value)  # JSON Schema counts 3.0 as an integer
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            # an int is always finite (math.isfinite would overflow on a 5,000-digit one)
            if ok and isinstance(value, float) and not math.isfinite(value):
                raise ToolError(
                    f"{self.name} must be a finite number, got {value!r}",
                    f"Pass a number between {_bound(self.minimum)} and {_bound(self.maximum)}."
                    if self.minimum is not None and self.maximum is not None
                    else "Pass a finite number.",
                )
        if not ok:
            raise ToolError(
                f"{self.name} must be {_a(kind)}, got {_json_type(value)}",
                f"Call {tool} again with {self.name} as {_a(kind)}.",
            )
        if self.enum and value not in self.enum:
            raise ToolError(
                f"{self.name} must be one of {', '.join(self.enum)}; got {_short(value)}",
                f"Use one of: {', '.join(self.enum)}.",
            )
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            low = "" if self.minimum is None else _bound(self.minimum)
            high = "" if self.maximum is None else _bound(self.maximum)
            bounds = f"from {low} to {high}" if low and high else f"at least {low or high}"
            raise ToolError(
                f"{self.name} must be {bounds}, got {_short(value)}",
                f"Call {tool} again with {self.name} {bounds}.",
            )
        return value


def _bound(limit: float) -> str:
    """A schema bound as people write it: 300, not 300.0; 9223372036854775807, not 9.2e+18."""
    return str(int(limit)) if float(limit).is_integer() else f"{limit:g}"


def _a(kind: str) -> str:
    return {"integer": "an integer", "json": "a JSON value"}.get(kind, f"a {kind}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        shown = _short(value)
        return shown if shown.startswith("a very") else f"the number {shown}"
    if isinstance(value, str):
        return f"the string {_short(value)}"
    return "an array" if isinstance(value, list) else "an object"


def _short(value: Any, limit: int = 60) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return "a very large integer"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


Handler = Callable[["ToolCall"], Awaitable[Reply]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    params: tuple[Param, ...]
    read_only: bool
    destructive: bool
    idempotent: bool
    handler: Handler

    def declaration(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema={
                "type": "object",
                "properties": {p.name: p.schema() for p in self.params},
                "required": [p.name for p in self.params if p.required or p.advertised],
                "additionalProperties": False,
            },
            output_schema=OUTPUT_SCHEMA,
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.destructive,
                idempotent_hint=self.idempotent,
                open_world_hint=False,
            ),
        )

    def bind(self, arguments: dict[str, Any] | None) -> dict[str, Any]:
        """Check the call's arguments against the parameters. A null counts as absent."""
        arguments = arguments or {}
        known = {p.name for p in self.params}
        extra = sorted(k for k in arguments if k not in known)
        if extra:
            accepted = ", ".join(p.name for p in self.params) or "no arguments"
            raise ToolError(
                f"{self.name} does not take {', '.join(map(repr, extra))}",
                f"Call it with only these arguments: {accepted}.",
            )
        bound: dict[str, Any] = {}
        for p in self.params:
            value = arguments.get(p.name)
            if value is None and (p.kind != "json" or p.name not in arguments):
                if p.required:
                    raise ToolError(
                        f"{self.name} needs the argument {p.name!r} ({p.description})",
                        f"Call {self.name} again with {p.name}.",
                    )
                bound[p.name] = p.default
            else:
                bound[p.name] = p.check(self.name, value)
        return bound


OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "description": "what happened; 'error' on failure"},
    },
    "required": ["status"],
}


@dataclass
class ToolCall:
    """One call: its checked arguments and the connection it arrived on."""

    args: dict[str, Any]
    connection: object | None


# --------------------------------------------------------------------------------------------
# Connections and the agents they served
# --------------------------------------------------------------------------------------------


@dataclass
class AgentTracker:
    """Which agents each live connection has named, so their leases can end when it goes."""

    by_connection: dict[object, set[str]] = field(default_factory=dict)
    registered: set[str] = field(default_factory=set)  # agents registered through this server

    def note(self, connection: object | None, agent_id: str, *, registered: bool = False) -> None:
        if registered:
            self.registered.add(agent_id)
        if connection is not None:
            self.by_connection.setdefault(connection, set()).add(agent_id)

    def forget(self, agents: Iterable[str]) -> None:
        """Forget agents that no longer exist (reaped), so memory stays bounded."""
        gone = set(agents)
        self.registered -= gone
        for named in self.by_connection.values():
            named -= gone

    def close(self, connection: object) -> set[str]:
        """Forget ``connection``; return its agents that no other live connection named."""
        agents = self.by_connection.pop(connection, set())
        still = set().union(*self.by_connection.values()) if self.by_connection else set()
        return agents - still


# --------------------------------------------------------------------------------------------
# The tools
# --------------------------------------------------------------------------------------------

BUSY_DB_HINT = (
    "The database is busy or cannot take writes right now; nothing was changed. Retry in a moment."
)


class Agenthold:
    """The tool handlers over one Coordinator (and its StateStore)."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        tools: str = "standard",
        disconnect_grace: float | None = 300.0,
    ) -> None:
        self.coordinator = coordinator
        self.store: StateStore = coordinator.store
        self.tools = tools
        self.disconnect_grace = disconnect_grace
        self.agents = AgentTracker()
        self.transport = "memory"  # "stdio" and "http" set by serve()
        self.reap_idle: float | None = None  # seconds; None: never remove idle agents
        self.in_flight = 0  # tool calls being answered
        self.stopping = False  # the server is shutting down: waits end now
        self._wakers: set[Callable[[], None]] = set()
        self.read_limiter = anyio.CapacityLimiter(16)
        self.write_limiter = anyio.CapacityLimiter(8)
        self._write_threads = anyio.CapacityLimiter(8)  # taken only by holders of the above
        specs = standard_tools(self) if tools == "standard" else advanced_tools(self)
        self.specs = {spec.name: spec for spec in specs}
        self.declarations = [spec.declaration() for spec in specs]

    # -- running database work ------------------------------------------------------------

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.read_limiter)

    async def write(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` in a write thread. Waiting for one counts against busy_timeout too: when
        every write thread is stuck behind another process's lock, a caller further back in
        the queue hears "busy" after busy_timeout, not after its turn comes."""
        budget = self.store.db.busy_timeout
        try:
            self.write_limiter.acquire_nowait()  # a free slot is taken even with a budget of 0
        except anyio.WouldBlock:
            with anyio.move_on_after(budget) as queued:
                await self.write_limiter.acquire()
            if queued.cancelled_caught:
                raise BusyError(
                    f"the database's writers have been busy for more than {budget:g} s "
                    "(busy_timeout); retry in a moment"
                ) from None
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._write_threads)
        finally:
            self.write_limiter.release()

    # -- dispatch ------------------------------------------------------------------------------

    async def call(
        self, name: str, arguments: dict[str, Any] | None, connection: object | None
    ) -> types.CallToolResult:
        spec = self.specs.get(name)
        self.in_flight += 1
        try:
            if spec is None:
                raise ToolError(
                    f"there is no tool named {_short(name)} on this server",
                    self._unknown_tool_hint(name),
                    kind="unknown_tool",
                )
            reply = await spec.handler(ToolCall(spec.bind(arguments), connection))
        except ToolError as exc:
            return error_result(exc.kind, str(exc), exc.hint)
        except UnavailableError as exc:
            hint = exc.hint or BUSY_DB_HINT
            return result({"status": "unavailable", "message": str(exc), "hint": hint})
        except InvalidInputError as exc:
            hint = exc.hint or "Check the argument named in the message and call again."
            kind = type(exc).__name__.removesuffix("Error")
            return error_result(_snake(kind), str(exc), hint)
        except AgentholdError as exc:
            return error_result("failed", str(exc), exc.hint or "Call again in a moment.")
        except Exception:
            log.exception("tool %s failed", name)
            return error_result(
                "internal",
                f"{name} failed inside agenthold (the details are in the server's log)",
                "This is a bug in agenthold; call again, and report it if it persists.",
            )
        finally:
            self.in_flight -= 1
        return result(reply)

    def _unknown_tool_hint(self, name: str) -> str:
        names = ", ".join(self.specs)
        other = "advanced" if self.tools == "standard" else "standard"
        if isinstance(name, str) and name in ADVANCED_NAMES | STANDARD_NAMES:
            return (
                f"{name} is one of the {other} tools, which this server does not serve (it "
                f"runs with --tools {self.tools}). Use: {names}."
            )
        return f"The tools here are: {names}."

    # -- standard tools --------------------------------------------------------------------

    async def register(self, call: ToolCall) -> Reply:
        a = call.args
        reply: Reply = await self.write(
            self.coordinator.register, a["name"], a["model"], a["purpose"]
        )
        self.agents.note(call.connection, reply["agent_id"], registered=True)
        return reply

    async def claim(self, call: ToolCall) -> Reply:
        a = call.args
        reply: Reply = await self.write(self.coordinator.claim, a["resource"], a["agent_id"])
        self.agents.note(call.connection, a["agent_id"])
        return reply

    async def release(self, call: ToolCall) -> Reply:
        a = call.args
        reply: Reply = await self.write(
            self.coordinator.release, a["resource"], a["agent_id"], a["outcome"], a["moved_to"]
        )
        self.agents.note(call.connection, a["agent_id"])
        return reply

    async def status(self, call: ToolCall) -> Reply:
        reply: Reply = await self.read(self.coordinator.status, call.args["resource"])
        return reply

    async def wait(self, call: ToolCall) -> Reply:
        resource: Resource = self.coordinator.resolver.resolve(call.args["resource"])
        timeout = call.args["timeout_seconds"]
        start = time.monotonic()
        coordinator = self.coordinator

        async def look() -> tuple[Reply | None, Iterable[tuple[str, ...]], float | None]:
            probe = await self.read(coordinator.probe, resource)
            elapsed = round(time.monotonic() - start, 3)
            if probe.available is not None:
                return {**probe.available, "elapsed_seconds": elapsed}, probe.topics, None
            return None, probe.topics, probe.lease_ends_at

        async def give_up() -> Reply:
            probe = await self.read(coordinator.probe, resource)
            elapsed = round(time.monotonic() - start, 3)
            if probe.available is not None:
                return {**probe.available, "elapsed_seconds": elapsed}
            return timeout_reply(resource, probe, elapsed)

        return await self._wait_for(look, give_up, timeout)

    # -- advanced tools --------------------------------------------------------------------

    async def get(self, call: ToolCall) -> Reply:
        ns, key = call.args["namespace"], call.args["key"]
        try:
            record: Record = await self.read(self.store.get, ns, key)
        except NotFoundError:
            return {
                "status": "not_found",
                "namespace": ns,
                "key": key,
                "hint": "No live value. To create it, call agenthold_set with expected_version 0.",
            }
        return {"status": "ok", **record.to_dict()}

    async def set(self, call: ToolCall) -> Reply:
        a = call.args
        expected = _expected_version(
            "agenthold_set",
            a,
            "Pass the version you read with agenthold_get, or 0 to create a new key.",
        )
        try:
            done = await self.write(
                lambda: self.store.set(
                    a["namespace"], a["key"], a["value"], updated_by=a["updated_by"],
                    expected_version=expected,
                )
            )  # fmt: skip
        except ConflictError as exc:
            return conflict_reply(exc)
        return {"status": "ok", **done.to_dict()}

    async def list(self, call: ToolCall) -> Reply:
        ns = call.args["namespace"]
        records = await self.read(self.store.list_keys, ns)
        return {
            "status": "ok",
            "namespace": ns,
            "count": len(records),
            "records": [_without_namespace(r) for r in records],
        }

    async def history(self, call: ToolCall) -> Reply:
        a = call.args
        entries = await self.read(self.store.history, a["namespace"], a["key"], a["limit"])
        return {
            "status": "ok",
            "namespace": a["namespace"],
            "key": a["key"],
            "history": [e.to_dict() for e in entries],
        }

    async def delete(self, call: ToolCall) -> Reply:
        a = call.args
        expected = _expected_version(
            "agenthold_delete", a, "Pass the version you read with agenthold_get."
        )
        try:
            done = await self.write(
                lambda: self.store.delete(
                    a["namespace"], a["key"], deleted_by=a["deleted_by"], expected_version=expected
                )
            )
        except NotFoundError:
            return {
                "status": "not_found",
                "namespace": a["namespace"],
                "key": a["key"],
                "hint": "The key has no live value, so there is nothing to delete.",
            }
        except ConflictError as exc:
            return conflict_reply(exc)
        return {"status": "ok", **done.to_dict()}

    async def watch(self, call: ToolCall) -> Reply:
        a = call.args
        ns, key, since = a["namespace"], a["key"], a["since_version"]
        store = self.store
        await self.read(store.changed_since, ns, key, since)  # checks the names up front
        start = time.monotonic()
        topics = [key_topic(ns, key)]

        async def look() -> tuple[Reply | None, Iterable[tuple[str, ...]], float | None]:
            record = await self.read(store.changed_since, ns, key, since)
            return (None if record is None else watched_reply(record)), topics, None

        async def give_up() -> Reply:
            record = await self.read(store.changed_since, ns, key, since)
            if record is not None:
                return watched_reply(record)
            return {
                "status": "timeout",
                "namespace": ns,
                "key": key,
                "since_version": since,
                "elapsed_seconds": round(time.monotonic() - start, 3),
                "hint": (
                    "The key did not change in time. Watch again with the same since_version, "
                    "or read it with agenthold_get."
                ),
            }

        return await self._wait_for(look, give_up, a["timeout_seconds"])

    async def clear_namespace(self, call: ToolCall) -> Reply:
        a = call.args
        keys = await self.write(
            lambda: self.store.clear_namespace(a["namespace"], deleted_by=a["deleted_by"])
        )
        return {
            "status": "ok",
            "namespace": a["namespace"],
            "deleted_count": len(keys),
            "deleted_keys": keys,
            "deleted_by": a["deleted_by"],
        }

    async def export(self, call: ToolCall) -> Reply:
        snapshot = await self.read(self.store.export, call.args["namespace"])
        return {"status": "ok", **snapshot.to_dict()}

    # -- waiting without holding a thread ----------------------------------------------------

    async def _wait_for(
        self,
        look: Callable[[], Awaitable[tuple[Reply | None, Iterable[tuple[str, ...]], float | None]]],
        give_up: Callable[[], Awaitable[Reply]],
        timeout: float,
    ) -> Reply:
        """Look until ``look`` returns a reply or ``timeout`` passes, sleeping in between on the
        change feed (woken by commits to the topics ``look`` names) or until the unix time it
        gives (a holder's lease end). Holds no thread while asleep."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        deadline = time.monotonic() + timeout
        subscription = self.store.db.subscribe((), wake)
        self._wakers.add(wake)
        try:
            current: frozenset[tuple[str, ...]] = frozenset()
            while True:
                woken.clear()
                if self.stopping:
                    return {
                        "status": "unavailable",
                        "message": "the server is shutting down",
                        "hint": "Call again in a moment, once the server is back.",
                    }
                reply, topics, wake_at = await look()
                if reply is not None:
                    return reply
                wanted = frozenset(topics)
                if wanted != current:
                    subscription.update(wanted)
                    current = wanted
                    continue  # look again now that the new topics are heard
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return await give_up()
                if wake_at is not None:
                    remaining = min(remaining, max(0.0, wake_at - time.time()) + 0.001)
                with anyio.move_on_after(remaining):
                    await woken.wait()
        finally:
            self._wakers.discard(wake)
            subscription.close()

    def stop_waiting(self) -> None:
        """End every wait and watch in flight (with 'unavailable'): the server is stopping."""
        self.stopping = True
        for wake in list(self._wakers):
            wake()

    # -- connections -----------------------------------------------------------------------

    def connection_of(self, ctx: ServerRequestContext) -> object | None:
        """The key of the connection a call came on: the process for stdio and in-process
        clients; for HTTP, the session of a client that keeps one (their end is hooked once);
        None for sessionless HTTP requests, whose agents only a claim TTL reclaims."""
        if self.transport != "http":
            return PROCESS
        connection: Any = getattr(ctx.session, "_connection", None)  # private in mcp 2.3
        if connection is None or getattr(connection, "session_id", None) is None:
            return None
        state = connection.state
        if not state.get("agenthold"):
            state["agenthold"] = True
            connection.exit_stack.push_async_callback(self.connection_closed, connection)
        return connection  # type: ignore[no-any-return]

    async def connection_closed(self, connection: object) -> None:
        """End the leases of the agents only ``connection`` named, after the grace period."""
        agents = self.agents.close(connection)
        await self.end_leases(agents)

    async def release_everyone(self) -> None:
        """Free the claims of every agent registered through this server, as 'abandoned' (at
        shutdown). Agents registered elsewhere may be working through another server."""
        for agent_id in sorted(self.agents.registered):
            try:
                await self.write(self.coordinator.release_all, agent_id, "abandoned")
            except AgentholdError as exc:
                log.warning("could not release the claims of %s: %s", agent_id, exc)

    async def reap_forever(self) -> None:
        """Remove idle agents now and then (see --reap-idle)."""
        if self.reap_idle is None:
            return
        while True:
            try:
                reaped = await self.write(self.coordinator.reap_idle_agents, self.reap_idle)
                if reaped:
                    self.agents.forget(reaped)
                    log.info("removed %d idle agents", len(reaped))
            except AgentholdError as exc:
                log.warning("could not remove idle agents: %s", exc)
            await anyio.sleep(min(max(self.reap_idle / 4, 1.0), REAP_EVERY))

    async def end_leases(self, agents: Iterable[str]) -> None:
        if self.disconnect_grace is None:
            return
        for agent_id in agents:
            try:
                await self.write(self.coordinator.end_lease, agent_id, self.disconnect_grace)
            except AgentholdError as exc:
                log.warning("could not end the lease of %s: %s", agent_id, exc)


def _expected_version(tool: str, args: dict[str, Any], hint: str) -> int | None:
    """The version check a write asks for: None with force (no check), else the
    expected_version, which is then required."""
    if args["force"]:
        return None
    if args["expected_version"] is None:
        raise ToolError(f"{tool} needs expected_version (or force: true)", hint)
    return int(args["expected_version"])


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def _without_namespace(record: Record) -> Reply:
    d = record.to_dict()
    del d["namespace"]
    return d


def conflict_reply(exc: ConflictError) -> Reply:
    d = exc.detail
    live = d["actual_version"] != 0
    return {
        "status": "conflict",
        **d,
        "hint": (
            "Another agent wrote first. Apply your change to actual_value (or call "
            "agenthold_get) and retry with expected_version set to actual_version."
            if live
            else "The key has no live value now (it was deleted, or never written). To create "
            "it, retry with expected_version 0."
        ),
    }


def watched_reply(record: Record) -> Reply:
    if record.deleted:
        return {
            "status": "deleted",
            "namespace": record.namespace,
            "key": record.key,
            "version": record.version,
            "deleted_by": record.updated_by,
            "deleted_at": record.updated_at,
            "hint": (
                f"The key was deleted. To wait for it to be written again, watch with "
                f"since_version {record.version}."
            ),
        }
    return {"status": "ok", **record.to_dict()}


def result(reply: Reply) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_dumps(reply))],
        structured_content=reply,
    )


def error_result(kind: str, message: str, hint: str) -> types.CallToolResult:
    reply = {"status": "error", "error": kind, "message": message, "hint": hint}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_dumps(reply))],
        structured_content=reply,
        is_error=True,
    )


def _dumps(reply: Reply) -> str:
    return json.dumps(reply, ensure_ascii=False, allow_nan=False)


# --------------------------------------------------------------------------------------------
# The tool sets
# --------------------------------------------------------------------------------------------

RESOURCE = Param(
    "resource",
    "string",
    "the file or resource: a path relative to the workspace (src/main.py), an absolute path "
    "inside a workspace, file://<workspace>/<path>, or custom://<name> for anything that is "
    "not a file",
)
AGENT_ID = Param("agent_id", "string", "your agent_id, from agenthold_register")
WAIT_TIMEOUT = Param(
    "timeout_seconds",
    "number",
    f"how long to wait, in seconds (0 to {MAX_WAIT_SECONDS:g})",
    required=False,
    default=DEFAULT_WAIT_SECONDS,
    minimum=0,
    maximum=MAX_WAIT_SECONDS,
)
NAMESPACE = Param("namespace", "string", "the namespace: a group of keys, e.g. order-1234")
KEY = Param("key", "string", "the key within the namespace")

STANDARD_NAMES = frozenset(
    {"agenthold_register", "agenthold_claim", "agenthold_release", "agenthold_status",
     "agenthold_wait"}
)  # fmt: skip
ADVANCED_NAMES = frozenset(
    {"agenthold_get", "agenthold_set", "agenthold_list", "agenthold_history",
     "agenthold_delete", "agenthold_watch", "agenthold_clear_namespace", "agenthold_export"}
)  # fmt: skip


def standard_tools(a: Agenthold) -> list[ToolSpec]:
    return [
        ToolSpec(
            "agenthold_register",
            "Register as an agent",
            "Register yourself and get an agent_id. Call this once, before your first claim, "
            "and pass the agent_id to agenthold_claim and agenthold_release from then on. The "
            "id keeps working across reconnects and restarts; register again only if a call "
            "says the agent_id is unknown.",
            (
                Param(
                    "name",
                    "string",
                    "a short name for yourself, e.g. editor or reviewer",
                    max_length=MAX_AGENT_NAME,
                ),
                Param(
                    "model",
                    "string",
                    "the model you run on, if known",
                    False,
                    "",
                    max_length=MAX_MODEL,
                ),
                Param(
                    "purpose",
                    "string",
                    "what you are working on, in a few words",
                    False,
                    "",
                    max_length=MAX_PURPOSE,
                ),
            ),
            read_only=False,
            destructive=False,
            idempotent=False,
            handler=a.register,
        ),
        ToolSpec(
            "agenthold_claim",
            "Claim a file or resource",
            "Claim a file or other shared resource BEFORE you modify, create, delete or move "
            "it, so no other agent changes it at the same time. Reading needs no claim. "
            "Replies: 'claimed' (it is yours until you release it; if previous_outcome is "
            "present, follow the hint: the last holder modified, created, deleted or moved it, "
            "or left without finishing), 'already_claimed' (you hold it already), or 'busy' "
            "(another agent holds it: do not touch it; work on something else, or call "
            "agenthold_wait and then claim again). To rename a file, claim both the old and "
            "the new path first.",
            (RESOURCE, AGENT_ID),
            read_only=False,
            destructive=False,
            idempotent=True,
            handler=a.claim,
        ),
        ToolSpec(
            "agenthold_release",
            "Release a claim, saying what you did",
            "Release a resource you claimed as soon as you are done, and say honestly what "
            "you did: 'modified' (changed it in place), 'created' (it did not exist before), "
            "'deleted' (it no longer exists), 'moved' (it now lives elsewhere; give the new "
            "location in moved_to), or 'released' (you did not change it). The next agent to "
            "claim it is told. To rename old to new: claim both, rename, then release old with "
            "outcome 'moved' and moved_to the new path, and release new with outcome 'created'.",
            (
                RESOURCE,
                AGENT_ID,
                Param(
                    "outcome",
                    "string",
                    "what you did to the resource",
                    False,
                    "released",
                    enum=("released", "modified", "created", "deleted", "moved"),
                ),
                Param(
                    "moved_to",
                    "string",
                    "the new path or URI, only with outcome 'moved'",
                    required=False,
                ),
            ),
            read_only=False,
            destructive=False,
            idempotent=False,
            handler=a.release,
        ),
        ToolSpec(
            "agenthold_status",
            "Check a resource",
            "See whether a resource is claimed, without claiming it and without registering. "
            "Replies 'claimed' (held_by, agent_name, claimed_at) or 'available' (with "
            "previous_outcome and a hint when the last holder changed, moved or deleted it, "
            "or left without finishing).",
            (RESOURCE,),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.status,
        ),
        ToolSpec(
            "agenthold_wait",
            "Wait for a resource to be released",
            "Wait until a claimed resource is released, then claim it with agenthold_claim "
            "(waiting does not claim it for you). Replies 'available' the moment the holder "
            "releases it or its claim ends, with previous_outcome when there is something to "
            "know (read the resource again if it was modified; use moved_to if it moved), or "
            "'timeout' when timeout_seconds pass first. Your turn is blocked while you wait: "
            "wait only when you have nothing else to do.",
            (RESOURCE, WAIT_TIMEOUT),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.wait,
        ),
    ]


def advanced_tools(a: Agenthold) -> list[ToolSpec]:
    expected = Param(
        "expected_version",
        "integer",
        "the version you read with agenthold_get, or 0 for a key that must not exist yet "
        "(ignored with force: true)",
        required=False,
        advertised=True,
        minimum=0,
        maximum=MAX_VERSION,
    )
    force = Param(
        "force",
        "boolean",
        "true skips the version check (expected_version is then ignored)",
        required=False,
        default=False,
    )
    return [
        ToolSpec(
            "agenthold_get",
            "Read a value",
            "Read a value from the shared store, with its version. Keep the version: pass it "
            "as expected_version to agenthold_set, so your write is refused if another agent "
            "wrote in between. Replies 'ok' or 'not_found'.",
            (NAMESPACE, KEY),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.get,
        ),
        ToolSpec(
            "agenthold_set",
            "Write a value, checking its version",
            "Write a JSON value. expected_version is the version you read (agenthold_get), or "
            "0 to create a key that must not exist yet. If another agent wrote first, the "
            "reply is 'conflict' with actual_value and actual_version: apply your change to "
            "that value and retry with expected_version set to actual_version. force: true "
            "writes without the check; use it only to seed a value or for writes that are "
            "safe to repeat.",
            (
                NAMESPACE,
                KEY,
                Param("value", "json", "the new value: any JSON"),
                Param("updated_by", "string", "who is writing: your name or agent_id"),
                expected,
                force,
            ),
            read_only=False,
            destructive=True,
            idempotent=False,
            handler=a.set,
        ),
        ToolSpec(
            "agenthold_list",
            "List a namespace",
            "List every live value in a namespace, sorted by key, with versions, writers and "
            "times.",
            (NAMESPACE,),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.list,
        ),
        ToolSpec(
            "agenthold_history",
            "A key's history",
            "Show a key's writes and deletes, newest first, with who made each and when. "
            "Deletes have event_type 'delete' and value null. An empty list means the key "
            "was never written.",
            (
                NAMESPACE,
                KEY,
                Param(
                    "limit",
                    "integer",
                    f"how many entries, newest first (1 to {MAX_HISTORY_LIMIT})",
                    False,
                    10,
                    minimum=1,
                    maximum=MAX_HISTORY_LIMIT,
                ),
            ),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.history,
        ),
        ToolSpec(
            "agenthold_delete",
            "Delete a key, checking its version",
            "Delete a key. expected_version must be the version you read (or pass force: "
            "true). The delete stays in the key's history, and the key's version keeps "
            "counting up if it is written again.",
            (
                NAMESPACE,
                KEY,
                Param("deleted_by", "string", "who is deleting: your name or agent_id"),
                expected,
                force,
            ),
            read_only=False,
            destructive=True,
            idempotent=False,
            handler=a.delete,
        ),
        ToolSpec(
            "agenthold_watch",
            "Wait for a key to change",
            "Wait until a key's version goes above since_version, then get its new value "
            "('ok'), 'deleted' if it was deleted, or 'timeout' after timeout_seconds. Use "
            "since_version 0 to wait until a key has a value (also after it was deleted). Your "
            "turn is blocked while you wait: watch only when you have nothing else to do.",
            (
                NAMESPACE,
                KEY,
                Param(
                    "since_version",
                    "integer",
                    "the version you already know (0: none)",
                    minimum=0,
                    maximum=MAX_VERSION,
                ),
                WAIT_TIMEOUT,
            ),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.watch,
        ),
        ToolSpec(
            "agenthold_clear_namespace",
            "Delete a whole namespace",
            "Delete every key of a namespace in one step (each delete stays in history). "
            "There is no version check, so use it only when you mean to wipe the namespace.",
            (NAMESPACE, Param("deleted_by", "string", "who is deleting: your name or agent_id")),
            read_only=False,
            destructive=True,
            idempotent=True,
            handler=a.clear_namespace,
        ),
        ToolSpec(
            "agenthold_export",
            "Export a namespace with its history",
            "Return every live value of a namespace with its complete history, read as one "
            "consistent snapshot. It can be large; prefer agenthold_list for a quick look.",
            (NAMESPACE,),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.export,
        ),
    ]


# --------------------------------------------------------------------------------------------
# The MCP server object
# --------------------------------------------------------------------------------------------

PROCESS = "this process"  # the connection key of stdio: one client per server process


def instructions(coordinator: Coordinator) -> str:
    """What a standard-mode server tells every client: the protocol and the workspaces."""
    lines = [
        "agenthold keeps agents that work on the same files from overwriting each other.",
        "1. Call agenthold_register once, at the start, and keep the agent_id it returns.",
        "2. Before you modify, create, delete or move a file or shared resource, call "
        "agenthold_claim. 'busy' means another agent is working on it: leave it alone, work on "
        "something else or call agenthold_wait, then claim it again.",
        "3. As soon as you are done, call agenthold_release with what you did: modified, "
        "created, deleted, moved (with moved_to) or released (no change).",
        "4. To rename a file: claim the old and the new path, rename, then release the old "
        "path as moved (moved_to the new path) and the new path as created.",
        "Reading needs no claim. Paths are relative to a workspace:",
    ]
    for ws in coordinator.resolver.workspaces:
        lines.append(f"- {ws.name}: {ws.root}")
    lines.append(
        "Name files in another workspace as file://<workspace>/<path>, and shared things that "
        "are not files as custom://<name>."
    )
    return "\n".join(lines)


def build_server(app: Agenthold) -> Server:
    """The low-level MCP server answering tools/list and tools/call with ``app``'s tools."""

    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=app.declarations)

    async def call_tool(
        ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = params.arguments
        if arguments is not None and not isinstance(arguments, dict):  # pragma: no cover
            return error_result(
                "invalid_arguments", "arguments must be an object", "Pass an object."
            )
        return await app.call(params.name, arguments, app.connection_of(ctx))

    server = Server(
        "agenthold",
        version=version(),
        title="agenthold",
        instructions=instructions(app.coordinator) if app.tools == "standard" else None,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    return server


# --------------------------------------------------------------------------------------------
# Serving over stdio
# --------------------------------------------------------------------------------------------


class _PipeLines:
    """stdin as lines, read on the event loop. The SDK's reader blocks in a worker thread
    that cannot be cancelled, so SIGTERM would hang while the client keeps stdin open."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
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
                    yield buffer.decode("utf-8", errors="replace")
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
                yield line.decode("utf-8", errors="replace")
            if len(buffer) > MAX_LINE_BYTES and not skipping:
                log.warning("dropped a message longer than %d bytes", MAX_LINE_BYTES)
                yield _oversize_marker(bytes(buffer[:4096]))  # answered with an error
                buffer.clear()
                skipping = True
            elif skipping and len(buffer) > MAX_LINE_BYTES:
                buffer.clear()


_ID_AT_START = re.compile(rb'"id"\s*:\s*(-?\d{1,30}|"(?:[^"\\]|\\.){0,200}")')
OVERSIZE_KEY = "agenthold_oversize"


def _oversize_marker(head: bytes) -> str:
    """A line standing for a dropped oversized message: not JSON-RPC, so the SDK hands it to
    ``_guard_stdio``, which answers the request (its id is looked for in the head)."""
    found = _ID_AT_START.search(head)
    request_id = json.loads(found.group(1)) if found else None
    return json.dumps({OVERSIZE_KEY: MAX_LINE_BYTES, "id": request_id}) + "\n"


class _PipeWriter:
    """stdout written on the event loop (the SDK writes through a worker thread, twice per
    message). A client that went away loses what is left; its EOF on stdin ends the server."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pending = bytearray()
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


MAX_LINE_BYTES = 64 * 1024 * 1024


def _claim_stdio() -> tuple[_PipeLines, _PipeWriter] | None:
    """Take the protocol's pipes off fds 0 and 1 (which then point at /dev/null and stderr,
    so stray reads and prints cannot touch the wire) and serve them on the event loop.
    None where that is not possible (a terminal, Windows): the SDK's own streams serve."""
    if os.name != "posix":  # pragma: no cover
        return None
    try:
        modes = [os.fstat(fd).st_mode for fd in (0, 1)]
    except OSError:  # pragma: no cover
        return None
    if not all(stat.S_ISFIFO(m) or stat.S_ISSOCK(m) for m in modes):
        return None
    wire_in, wire_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return _PipeLines(wire_in), _PipeWriter(wire_out)


class _Answers:
    """The write side the SDK answers on, keeping count of the requests read from stdin that
    are still unanswered, so that the end of stdin can wait for their answers (below)."""

    def __init__(self, inner: MemoryObjectSendStream[SessionMessage]) -> None:
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
    app: Agenthold,
    read_stream: MemoryObjectReceiveStream[SessionMessage | Exception],
    write_stream: MemoryObjectSendStream[SessionMessage],
) -> AsyncIterator[tuple[MemoryObjectReceiveStream[SessionMessage | Exception], _Answers]]:
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
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if errors:
        first = errors[0]
        raw = first.get("input")
        if first.get("type") == "json_invalid":
            detail = str(first.get("msg", "")).removeprefix("Invalid JSON: ")
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
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        request_id = None
    if isinstance(found, dict) and OVERSIZE_KEY in found:
        code = types.INVALID_REQUEST
        message = f"Message too large: the limit is {MAX_LINE_BYTES // (1024 * 1024)} MiB a line"
    return request_id, code, message


async def _serve_stdio(app: Agenthold) -> int:
    server = build_server(app)
    pipes = _claim_stdio()
    streams: dict[str, Any] = {}
    if pipes is not None:
        streams = {"stdin": pipes[0], "stdout": pipes[1]}
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_signal, tg.cancel_scope)
            tg.start_soon(app.reap_forever)
            async with (
                stdio_server(**streams) as (read_stream, write_stream),
                _guard_stdio(app, read_stream, write_stream) as (guarded, answers),
            ):
                await server.run(guarded, answers, server.create_initialization_options())
            tg.cancel_scope.cancel()  # stdin reached EOF: the client has gone
    finally:
        with anyio.CancelScope(shield=True):
            await app.end_leases(app.agents.close(PROCESS))
    return 0


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("%s: stopping", signal.Signals(signum).name)
            scope.cancel()
            return


def serve(opts: ServeOptions, coordinator: Coordinator, sock: socket.socket | None = None) -> int:
    """Serve MCP as ``opts`` says until the client goes away or a signal arrives. ``sock``:
    for HTTP, a socket already listening (see ``listen``); without one the server binds."""
    logging.basicConfig(
        stream=sys.stderr,
        level=opts.log_level.upper(),
        format="agenthold: %(levelname)s: %(message)s",
    )
    app = Agenthold(coordinator, tools=opts.tools, disconnect_grace=opts.disconnect_grace)
    app.transport = opts.transport
    app.reap_idle = opts.reap_idle
    try:
        if opts.transport == "stdio":
            return anyio.run(_serve_stdio, app)
        return anyio.run(_serve_http, app, opts, sock)
    except KeyboardInterrupt:  # a signal before the handlers were in place
        return 0
    finally:
        coordinator.store.close()


# --------------------------------------------------------------------------------------------
# Serving over Streamable HTTP
# --------------------------------------------------------------------------------------------

SHUTDOWN_GRACE = 5  # seconds that calls in flight get to finish after SIGINT or SIGTERM
BODY_TIMEOUT = 30.0  # seconds a client may take to send a request body
HEAD_TIMEOUT = 10.0  # seconds a client may take to send its request headers
MAX_BODY_BYTES = 4 * 1024 * 1024


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

        async def tracking_send(message: Message) -> None:
            nonlocal started, finished
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


async def _plain(send: Send, status: int, text: str) -> None:
    await refuse(send, status, text.encode(), content_type=b"text/plain; charset=utf-8")


class _H11WithHeadTimeout(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for request headers: a client that has not
    sent a complete request head HEAD_TIMEOUT seconds after connecting (or after its last
    answer) gets 408 and is disconnected. uvicorn has no such deadline, so a client stalled
    inside its headers would hold a connection forever. An idle keep-alive connection is
    closed by uvicorn first (its timeout is shorter)."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            body = b"Request headers not received in time"
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
            self.transport.close()


def web_config(asgi: ASGIApp, log_level: str = "warning") -> uvicorn.Config:
    """How agenthold runs uvicorn: its own logging (no access log, nothing on stdout), a
    bounded shutdown, and deadlines for clients slow to send their headers."""
    return uvicorn.Config(
        asgi,
        lifespan="on",
        log_config=None,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
        timeout_keep_alive=5,
        http=_H11WithHeadTimeout,
    )


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: they re-raise the signal after shutting down,
    which would end the process before agenthold releases its agents' claims."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``; OSError (with a readable message) if not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"--host: cannot use {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        reason = "the port is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise OSError(f"cannot listen on {host}:{port}: {reason}") from None
    return sock


def transport_security(opts: ServeOptions) -> TransportSecuritySettings:
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


def http_app(app: Agenthold, opts: ServeOptions) -> ASGIApp:
    """The whole HTTP application: bearer tokens first, then the MCP endpoint."""
    return _http_stack(app, opts)[0]


def _http_stack(app: Agenthold, opts: ServeOptions) -> tuple[ASGIApp, CancelOnDisconnect]:
    """The HTTP application, and its layer that can end every open request at shutdown."""
    server = build_server(app)

    def input_schema(name: str) -> dict[str, Any] | None:
        return next((t.input_schema for t in app.declarations if t.name == name), None)

    # Before each 2026-07-28 tools/call with arguments, the SDK checks Mcp-Param headers against
    # the tool's input schema; without this lookup it runs a whole tools/list to find it.
    server.get_tool_input_schema = input_schema
    starlette_app = server.streamable_http_app(
        streamable_http_path=opts.path,
        json_response=opts.json_response,
        transport_security=transport_security(opts),
        host=opts.host,
        max_request_body_size=MAX_BODY_BYTES,
    )
    requests = CancelOnDisconnect(starlette_app)
    asgi: ASGIApp = requests
    if opts.allowed_hosts:
        asgi = FoldHostCase(asgi)
    elif is_loopback(opts.host):
        asgi = LoopbackOrigins(asgi)
    if opts.auth_tokens:
        asgi = BearerAuth(asgi, opts.auth_tokens)
    return asgi, requests


async def _serve_http(app: Agenthold, opts: ServeOptions, sock: socket.socket | None = None) -> int:
    if sock is None:
        try:
            sock = listen(opts.host, opts.port)
        except OSError as exc:
            print(f"agenthold: {exc}", file=sys.stderr)
            return 2
    AppStatus.should_exit = False  # sse-starlette's process-wide "close every stream" flag
    asgi, requests = _http_stack(app, opts)
    web = _Uvicorn(web_config(asgi, opts.log_level))
    host, port = sock.getsockname()[:2]
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(_stop_web_on_signal, web, app, requests)  # signals are ours from now
            url = f"http://{_url_host(str(host))}:{port}{opts.path}"
            log.warning("serving %s tools at %s", app.tools, url)
            tg.start_soon(app.reap_forever)
            _freeze_startup_objects()
            await web.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await app.release_everyone()
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _freeze_startup_objects() -> None:
    """Keep the garbage collector's full passes short in a long-lived server: the objects of
    the modules, schemas and app made at startup live as long as the process, yet each full
    pass walked them all (50-100 ms measured, stalling every request in flight)."""
    import gc  # here, not at the top: only the HTTP server wants it

    gc.collect()
    gc.freeze()


async def _stop_web_on_signal(
    web: uvicorn.Server,
    app: Agenthold,
    requests: CancelOnDisconnect,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """First signal: stop accepting, end waits, give calls in flight SHUTDOWN_GRACE seconds;
    second: end the calls in flight now; third: let uvicorn drop everything."""
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                name = signal.Signals(signum).name
                if not web.should_exit:
                    log.warning("%s: stopping (calls in flight get %g s)", name, SHUTDOWN_GRACE)
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
