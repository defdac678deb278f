"""The application, free of any transport: tool dispatch, database work on thread limiters,
waits on the change feed, the agents each connection served and their leases, and the MCP
server object that stdio.py and http.py run.

Decisions behind it:
- The low-level ``mcp`` Server, not MCPServer: agenthold owns its JSON schemas, checks every
  argument itself and shapes every reply (toolkit.py), so any bad input becomes an ``isError``
  result whose JSON says ``status: "error"`` with a message and a hint, and a call costs no
  pydantic model.
- Database work runs in worker threads and is short. Waits and watches are async loops woken by
  the store's change feed, so they hold no thread; reads and writes have separate thread
  limiters, so writers stuck behind another process's lock never delay reads.
- A connection is not an agent. Agents are remembered per connection only to end their leases
  (after ``--disconnect-grace``) when the connection goes away; any later call that names the
  agent, from any process, renews its lease and nothing is lost. What a connection is, is the
  transport's business: it hands ``build_server`` a function that names the connection of a
  request (stdio and in-process clients: the process).
- Nothing here touches process-wide state (logging, signals, exit codes): cli.py owns it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import mcp.types as types
from mcp.server import Server, ServerRequestContext

from agenthold.bus.messagebus import MessageBus
from agenthold.claims import pending
from agenthold.claims.coordinator import Coordinator, ForeignAgentError, NotHolderError
from agenthold.identity.principals import (
    ForbiddenError,
    Principal,
    require_namespace,
    require_tool_set,
)
from agenthold.retention import compact, read_retention
from agenthold.serve.toolkit import (
    Look,
    Progress,
    Reply,
    Report,
    ToolCall,
    ToolError,
    error_result,
    result,
)
from agenthold.serve.tools import (
    DEFAULT_TOOLS,
    TOOL_SETS,
    build_tools,
    parse_tool_sets,
    server_instructions,
    unknown_tool_hint,
    unknown_tool_message,
)
from agenthold.store import (
    AgentholdError,
    BusyError,
    DamagedRecordError,
    InvalidInputError,
    StateStore,
    UnavailableError,
    Waiter,
)

#: Where a transport hears the signals that stop it: a context manager over an async iterator
#: of signal numbers. Which signals stop a server is process-wide, so the command line decides
#: (``cli.stop_signals``); the transports only react to what arrives.
SignalSource = Callable[[], AbstractContextManager[AsyncIterator[int]]]

log = logging.getLogger("agenthold.serve.app")

REAP_EVERY = 600.0  # seconds between two looks for idle agents to remove
COMPACT_EVERY = 300.0  # seconds between two compaction passes, when retention rules are set
PENDING_EVERY = 60.0  # seconds between two looks for lease ends other servers left pending
# Seconds between two progress notifications of a wait that asked. The promise is at least one
# every 10 s; 8 leaves 2 s for a busy event loop or a slow worker thread to be late by.
PROGRESS_EVERY = 8.0
SHUTDOWN_GRACE = 5  # seconds that calls in flight get to finish after SIGINT, SIGTERM or EOF
EXIT_PATIENCE = 30.0  # seconds a refused lease end is retried (AGENTHOLD_EXIT_PATIENCE)
PROCESS = "this process"  # the connection key of stdio: one client per server process
BUSY_DB_HINT = (
    "The database is busy or cannot take writes right now; nothing was changed. Retry in a moment."
)
ConnectionOf = Callable[[ServerRequestContext], "object | None"]
ReportOf = Callable[[ServerRequestContext], "Report | None"]
PrincipalOf = Callable[[ServerRequestContext], "Principal | None"]


def version() -> str:
    from agenthold import _installed_version

    return _installed_version()


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


class Agenthold:
    """The application over one Coordinator (and its StateStore), serving the tool sets that
    ``tools`` names (one, or a comma list: see tools.py)."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        tools: str = DEFAULT_TOOLS,
        disconnect_grace: float | None = 300.0,
    ) -> None:
        self.coordinator = coordinator
        self.store: StateStore = coordinator.store
        self.tool_sets = parse_tool_sets(tools)
        self.tools = ",".join(self.tool_sets)
        self.disconnect_grace = disconnect_grace
        self.agents = AgentTracker()
        self.transport = "memory"  # "stdio" or "http", set by the transport that serves it
        # the process the stdio client runs in (agenthold.hooks.ancestry), recorded on the
        # agents it registers so that the host's edit hook knows them as its own
        self.host: str | None = None
        self.reap_idle: float | None = None  # seconds; None: never remove idle agents
        self.pending_every = PENDING_EVERY  # seconds between two looks at the side file
        self.compact_every: float | None = COMPACT_EVERY  # None: never compact here
        self.compactions = 0  # compaction passes run (retention rules were set)
        self.in_flight = 0  # tool calls being answered
        self.progress_every = PROGRESS_EVERY  # seconds between progress reports of a wait
        self.stopping = False  # the server is shutting down: waits end now
        # seconds a lease end the database refuses is retried (see end_leases)
        self.exit_patience = exit_patience(os.environ.get("AGENTHOLD_EXIT_PATIENCE"))
        self._wakers: set[Callable[[], None]] = set()
        # writes that failed and are worth one more try once the database takes writes again
        # (a wait's leaving the queue): (monotonic deadline, the write), see write_later
        self._later: list[tuple[float, Callable[[], Any]]] = []
        self._deferring = False  # _write_deferred is running: its own writes do not recurse
        self._bus: MessageBus | None = None
        self.read_limiter = anyio.CapacityLimiter(16)
        self.write_limiter = anyio.CapacityLimiter(8)
        self._write_threads = anyio.CapacityLimiter(8)  # taken only by holders of the above
        specs = build_tools(self, self.tool_sets)
        self.specs = {spec.name: spec for spec in specs}
        self.declarations = [spec.declaration() for spec in specs]

    @property
    def bus(self) -> MessageBus:
        """The message bus on the same database, opened on first use (only a server that
        serves the messages tools makes the bus's tables)."""
        if self._bus is None:
            self._bus = MessageBus(self.store)
        return self._bus

    def input_schema(self, name: str) -> dict[str, Any] | None:
        """The input schema of the tool named ``name`` (None if there is none)."""
        return next((t.input_schema for t in self.declarations if t.name == name), None)

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
            done = await anyio.to_thread.run_sync(fn, *args, limiter=self._write_threads)
        finally:
            self.write_limiter.release()
        if self._later and not self._deferring:
            await self._write_deferred()
        return done

    def write_later(self, fn: Callable[[], Any], seconds: float) -> None:
        """Run the write ``fn``, which just failed (the database refused it), after the next
        write that succeeds, if that comes within ``seconds``. A wait that could not leave the
        queue so leaves it as soon as the database is back, rather than when its row's
        liveness runs out."""
        self._later = [(d, f) for d, f in self._later if d > time.monotonic()]
        self._later.append((time.monotonic() + seconds, fn))

    async def _write_deferred(self) -> None:
        later, self._later, self._deferring = self._later, [], True
        try:
            for deadline, fn in later:
                if deadline <= time.monotonic():
                    continue
                try:
                    await self.write(fn)
                except AgentholdError as exc:  # still refused: kept for the next write
                    log.info("a deferred write failed again: %s", exc)
                    self._later.append((deadline, fn))
        finally:
            self._deferring = False

    # -- dispatch ------------------------------------------------------------------------------

    async def call(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        connection: object | None,
        report: Report | None = None,
        principal: Principal | None = None,
    ) -> types.CallToolResult:
        """Answer one tool call: an MCP result, whatever happens (a bug is logged and answered
        as an 'internal' error). ``report`` sends progress, if the client asked for it."""
        spec = self.specs.get(name)
        self.in_flight += 1
        try:
            if spec is None:
                raise ToolError(
                    unknown_tool_message(name),
                    unknown_tool_hint(name, self.tool_sets, list(self.specs)),
                    kind="unknown_tool",
                )
            require_tool_set(principal, tool_set_of(name), name)
            args = spec.bind(arguments)
            if "namespace" in args:  # every tool that names a namespace: read, or read-write
                require_namespace(principal, args["namespace"], write=not spec.read_only)
            reply = await spec.handler(ToolCall(args, connection, report, principal))
        except ToolError as exc:
            return error_result(exc.kind, str(exc), exc.hint)
        except (ForbiddenError, ForeignAgentError) as exc:
            return error_result("forbidden", str(exc), hint_for(name, exc) or "")
        except UnavailableError as exc:
            hint = hint_for(name, exc) or BUSY_DB_HINT
            return result({"status": "unavailable", "message": str(exc), "hint": hint})
        except InvalidInputError as exc:
            hint = hint_for(name, exc) or "Check the argument named in the message and call again."
            kind = type(exc).__name__.removesuffix("Error")
            # who holds it, as a field: 0.10 replied held_by, and an agent should not parse text
            facts = {"held_by": exc.held_by} if isinstance(exc, NotHolderError) else {}
            return error_result(_snake(kind), str(exc), hint, **facts)
        except DamagedRecordError as exc:
            hint = hint_for(name, exc) or exc.hint or ""
            return error_result("damaged_record", str(exc), hint)
        except AgentholdError as exc:
            return error_result(
                "failed", str(exc), hint_for(name, exc) or "Call again in a moment."
            )
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

    # -- waiting without holding a thread ----------------------------------------------------

    async def wait_for(
        self,
        look: Look,
        give_up: Callable[[], Awaitable[Reply]],
        timeout: float,
        progress: Progress | None = None,
    ) -> Reply:
        """Look until ``look`` returns a reply or ``timeout`` passes (then ``give_up``), sleeping
        in between on the change feed (a store.Waiter: woken by commits to the topics ``look``
        names) or until the time on the database's clock it gives (a holder's lease end).
        Holds no thread while asleep. With ``progress``, it is called every ``progress_every``
        seconds with the seconds waited so far, so that a host that cuts calls it thinks hung
        keeps waiting."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        every = self.progress_every
        next_report = time.monotonic() + every
        self._wakers.add(wake)
        try:
            with Waiter(self.store.db, timeout, wake) as waiter:
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
                    if waiter.listen(topics):
                        continue  # look again now that the new topics are heard
                    while (pause := waiter.pause(wake_at)) is not None:
                        if progress is not None:
                            pause = min(pause, max(0.0, next_report - time.monotonic()))
                        with anyio.move_on_after(pause):
                            await woken.wait()
                        if progress is not None and time.monotonic() >= next_report:
                            next_report += every
                            progress = await _report(progress, waiter.elapsed)
                        if woken.is_set() or waiter.due(wake_at):
                            break  # something changed: look again
                    else:
                        return await give_up()
        finally:
            self._wakers.discard(wake)

    def stop_waiting(self) -> None:
        """End every wait and watch in flight (with 'unavailable'): the server is stopping."""
        self.stopping = True
        for wake in list(self._wakers):
            wake()

    # -- connections -----------------------------------------------------------------------

    def note_agent(
        self, connection: object | None, agent_id: str, *, registered: bool = False
    ) -> None:
        self.agents.note(connection, agent_id, registered=registered)

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
        """Apply the lease ends that servers could not write (see pending.py): at start, and
        every ``pending_every`` seconds, so a server that stays up also applies what one that
        was killed beside it left; and remove idle agents now and then (see --reap-idle)."""
        next_reap = time.monotonic()
        next_compact = time.monotonic()
        while True:
            await self.apply_pending()
            if self.compact_every is not None and time.monotonic() >= next_compact:
                await self.compact_once()
                next_compact = time.monotonic() + self.compact_every
            if self.reap_idle is not None and time.monotonic() >= next_reap:
                try:
                    reaped = await self.write(self.coordinator.reap_idle_agents, self.reap_idle)
                    if reaped:
                        self.agents.forget(reaped)
                        log.info("removed %d idle agents", len(reaped))
                except AgentholdError as exc:
                    log.warning("could not remove idle agents: %s", exc)
                next_reap = time.monotonic() + min(max(self.reap_idle / 4, 1.0), REAP_EVERY)
            pause = self.pending_every
            if self.reap_idle is not None:
                pause = min(pause, next_reap - time.monotonic())
            if self.compact_every is not None:
                pause = min(pause, next_compact - time.monotonic())
            await anyio.sleep(max(pause, 0.05))

    async def compact_once(self) -> None:
        """One compaction pass (retention.py) if the database holds any retention rule: no
        rule, nothing to do (a read of one small table). It runs in a worker thread of its
        own, outside the write limiter: each of its batches is a short write of its own, so
        calls' writes interleave with it."""
        db = self.store.db
        if db.read_only:
            return
        try:
            rules = await self.read(read_retention, db)
            if rules.keeps_everything:
                return
            halt = threading.Event()  # set when this task is cancelled: the pass stops
            try:  # at its next batch, instead of holding up the server's shutdown
                report = await anyio.to_thread.run_sync(
                    lambda: compact(db, stop=lambda: halt.is_set() or self.stopping),
                    abandon_on_cancel=True,
                )
            finally:
                halt.set()
        except AgentholdError as exc:
            log.warning("could not compact the database: %s", exc)
            return
        self.compactions += 1
        removed = report.history + report.claim_events + report.messages
        if removed:
            log.info(
                "compacted %d history rows, %d claim events, %d messages",
                report.history,
                report.claim_events,
                report.messages,
            )

    async def end_leases(self, agents: Iterable[str]) -> None:
        """End the leases of ``agents`` (their client left) after the disconnect grace. A
        database that refuses the write (locked by another process, full) does not make them
        keep their claims for good: the lease ends go first to the side file of pending.py,
        which the next server applies, and are retried here until they are written or
        ``exit_patience`` seconds have passed."""
        if self.disconnect_grace is None:
            return
        grace, left = self.disconnect_grace, list(agents)
        if not left:
            return
        started = time.monotonic()
        left_at = await anyio.to_thread.run_sync(pending.clock, self.store.db)
        deferred, pause, reason = False, 0.05, ""
        while left:
            unwritten = []
            for agent_id in left:
                ends_in = max(0.0, grace - (time.monotonic() - started))
                try:
                    await self.write(self.coordinator.end_lease, agent_id, ends_in)
                except UnavailableError as exc:
                    if not exc.transient:  # read-only, replaced: no retry will change that
                        log.warning("could not end the lease of %s: %s", agent_id, exc)
                        continue
                    unwritten.append(agent_id)  # locked, full: worth another try
                    reason = str(exc)
                except AgentholdError as exc:
                    log.warning("could not end the lease of %s: %s", agent_id, exc)
            left = unwritten
            if left and not deferred:
                where = await anyio.to_thread.run_sync(
                    pending.defer, self.store.db, left, grace, left_at
                )
                deferred = True
                log.warning(
                    "could not end the leases of %s yet (%s); retrying for %g s%s",
                    ", ".join(left), reason, self.exit_patience,
                    f", and the next server to start applies them from {where}" if where else "",
                )  # fmt: skip
            if left and time.monotonic() + pause > started + self.exit_patience:
                log.warning("gave up ending the leases of %s here: %s", ", ".join(left), reason)
                return
            if left:
                await anyio.sleep(pause)
                pause = min(pause * 2, 1.0)

    async def apply_pending(self) -> None:
        """Write the lease ends that earlier servers could not (see pending.py)."""
        try:
            done = await self.write(pending.apply_pending, self.coordinator)
        except AgentholdError as exc:  # pragma: no cover - apply_pending keeps what fails
            log.warning("could not apply pending lease ends: %s", exc)
            return
        if done:
            log.info("ended %d leases that an earlier server could not", done)


def exit_patience(text: str | None) -> float:
    """Seconds a refused lease end is retried: AGENTHOLD_EXIT_PATIENCE (0 to 3600 seconds), or
    EXIT_PATIENCE when it is not set or not such a number."""
    try:
        seconds = float(text or "-1")
    except ValueError:
        seconds = -1.0
    return seconds if 0 <= seconds <= 3600 else EXIT_PATIENCE


async def _report(progress: Progress, elapsed: float) -> Progress | None:
    """Send one progress report; a client that cannot take it (gone, or a transport that
    has no way to send it) gets no more, and the wait goes on."""
    try:
        await progress(elapsed)
    except Exception as exc:  # the wait's own answer matters more than its progress
        log.debug("stopped reporting progress: %r", exc)
        return None
    return progress


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def tool_set_of(name: str) -> str:
    """The tool set (the scope ``tools:SET``) a tool belongs to."""
    return next((n for n, ts in TOOL_SETS.items() if name in ts.names), "advanced")


def hint_for(name: str, error: Exception) -> str | None:
    """The hint a call of tool ``name`` gets for a library error: its tool set's wording (which
    names tools) where it has one, else the error's own."""
    return TOOL_SETS[tool_set_of(name)].hint_for(error) or getattr(error, "hint", None)


def report_if_asked(ctx: ServerRequestContext) -> Report | None:
    """How a call that came over JSON-RPC (stdio, HTTP) reports progress: on its own stream,
    if its request carried a progressToken; else not at all, so that a wait without one is
    never woken to report (100 waits would wake every PROGRESS_EVERY seconds for nothing).
    In-process clients give their callback without a token, so they keep the default."""
    if (ctx.meta or {}).get("progress_token") is None:
        return None
    return ctx.session.report_progress


def build_server(
    app: Agenthold,
    connection_of: ConnectionOf | None = None,
    report_of: ReportOf | None = None,
    principal_of: PrincipalOf | None = None,
) -> Server:
    """The low-level MCP server answering tools/list and tools/call with ``app``'s tools.
    ``connection_of`` names the connection a call came on (by default: this process);
    ``report_of`` gives the way to send a call's progress (by default: on the call's own
    stream, which the SDK makes a no-op unless the client asked for progress);
    ``principal_of`` says who made a request (by default nobody: a trusted caller). The
    transports give them, so this core knows none of them."""

    def caller(ctx: ServerRequestContext) -> Principal | None:
        return None if principal_of is None else principal_of(ctx)

    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        principal = caller(ctx)
        if principal is None or principal.scopes.tools is None:
            return types.ListToolsResult(tools=app.declarations)
        allowed = principal.scopes.tools
        return types.ListToolsResult(
            tools=[d for d in app.declarations if tool_set_of(d.name) in allowed]
        )

    async def call_tool(
        ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = params.arguments
        if arguments is not None and not isinstance(arguments, dict):  # pragma: no cover
            return error_result(
                "invalid_arguments", "arguments must be an object", "Pass an object."
            )
        connection = PROCESS if connection_of is None else connection_of(ctx)
        report = ctx.session.report_progress if report_of is None else report_of(ctx)
        return await app.call(params.name, arguments, connection, report, caller(ctx))

    server = Server(
        "agenthold",
        version=version(),
        title="agenthold",
        instructions=server_instructions(app.tool_sets, app.coordinator),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # Before each 2026-07-28 tools/call with arguments, the SDK's HTTP transport checks
        # Mcp-Param headers against the tool's input schema; without this lookup it would run
        # a whole tools/list to find it.
        get_tool_input_schema=app.input_schema,
    )
    return server
