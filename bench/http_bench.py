"""Speed and safety of agenthold over Streamable HTTP, with the load in another process.

    python bench/http_bench.py            # the full run, about a minute and a half
    python bench/http_bench.py --quick    # a smoke run of about ten seconds (too small to judge)
    python bench/http_bench.py --json     # the same results as JSON instead of tables

The server is the real one (``_serve_http`` with the options the ``agenthold`` command builds),
started as ``python bench/http_bench.py --serve ...`` in a process of its own. That launcher
serves the advanced tools, the standard tools next to them (so one server takes the mixed load),
and ``bench_noop``: a tool that goes through the same dispatch as the others (argument check,
reply, in-flight count) but does no database work, the baseline every number is compared with.

1. Cost of a call: ``agenthold_get`` (one small record) and ``bench_noop``, called one at a time
   and taking turns, on one server with event streams (SSE) and one with ``--json-response``,
   from a 2026-07-28 client and from a 2025-11-25 (initialize handshake) client.
2. Mixed load: 32 clients (half of each era) for a fixed time, each picking at random between
   an increment (get, then set with the version read; on a conflict read again and retry) and a
   claim, a short hold and a release. Checked: no call fails; each counter ends equal to the
   increments that succeeded (no lost update); per resource, the claim and release versions form
   one unbroken chain and the client-side hold intervals (time.time() from the claimed reply to
   the release request) never overlap. Then the same 32 connections call only ``bench_noop`` for
   as long. The CPU seconds of the server process and of this one are reported for each part:
   on a small machine the SDK's client is a large share of the work.
4. The cost of authentication: ``bench_noop`` called in turns on a server without a token and
   on one with a token file of 1,000 principals (scoped ones too, so their checks run), by
   clients of both eras; the difference of the medians is what a principal costs per call.
3. The stall of agenthold 0.10.0: 50 ``agenthold_wait`` calls in flight (five sessions), writes
   waiting for the lock, and another process holding SQLite's write lock (BEGIN IMMEDIATE) for
   6 s; meanwhile ping (2025-11-25 session) and get/status (both eras) from other sessions are
   timed, with ``bench_noop`` beside them to show what the machine itself adds. 0.10.0 answered
   such a request after 4.9 s.

Every client is the MCP SDK's own (``mcp.Client`` on httpx2), so the numbers include its cost
too, the same for every tool. The exit status is 1 only when a correctness check fails; a missed
speed target is reported, not fatal, since speed depends on the machine and its load.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import httpx2

# _common sits beside this script; importing it also finds this checkout's agenthold.
from _common import (
    as_targets,
    machine,
    machine_line,
    process_cpu_seconds,
    table,
    target_lines,
)
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).resolve()
TARGET_GET_OVER_NOOP_MS = 0.5  # median of agenthold_get minus median of bench_noop
TARGET_STALL_MS = 50.0  # slowest ping or get while the lock is held
TARGET_AUTH_MS = 0.1  # median bench_noop with 1,000 principals minus the one without a token
PRINCIPALS = 1000


@dataclass(frozen=True)
class Sizes:
    label: str
    calls: int  # sequential calls of each tool, per server mode and era
    warm_up: int  # calls of each tool before those, not counted
    clients: int  # concurrent clients of the mixed load
    load_seconds: float  # how long the mixed load runs (the no-op load runs as long)
    waits: int  # agenthold_wait calls in flight during the stall test
    lock_seconds: float  # how long the other process holds the write lock


FULL = Sizes("full", 2000, 50, 32, 20.0, 50, 6.0)
QUICK = Sizes("quick", 20, 5, 8, 0.5, 20, 0.5)


# --------------------------------------------------------------------------------------------
# The server under test (run as: http_bench.py --serve AGENTHOLD-ARGS...)
# --------------------------------------------------------------------------------------------


def serve(argv: list[str]) -> int:
    """Serve the advanced and standard tools and bench_noop with ``_serve_http``; print the
    port on stdout once listening; stop on SIGTERM like ``agenthold --transport http``."""
    import logging

    from agenthold import server as srv
    from agenthold.claim_tools import standard_tools
    from agenthold.cli import (
        build_parser,
        freeze_startup_objects,
        listen,
        open_coordinator,
        serve_options,
        stop_signals,
    )
    from agenthold.http import serve_http
    from agenthold.toolkit import ToolCall, ToolSpec

    opts, _ = serve_options(build_parser().parse_args(argv), {})
    logging.basicConfig(stream=sys.stderr, level=opts.log_level.upper())
    coordinator = open_coordinator(opts)
    app = srv.Agenthold(coordinator, tools="advanced", disconnect_grace=opts.disconnect_grace)
    app.transport = "http"

    async def noop(call: ToolCall) -> dict[str, Any]:
        return {"status": "ok"}

    extra = [
        *standard_tools(app),
        ToolSpec(
            "bench_noop", "No-op", "Does nothing (a benchmark baseline).", (),
            read_only=True, destructive=False, idempotent=True, handler=noop,
        ),
    ]  # fmt: skip
    for spec in extra:
        app.specs[spec.name] = spec
        app.declarations.append(spec.declaration())
    sock = listen(opts.host, 0)
    print(sock.getsockname()[1], flush=True)
    try:
        anyio.run(
            functools.partial(
                serve_http, app, opts, sock, signals=stop_signals, ready=freeze_startup_objects
            )
        )
        return 0
    finally:
        coordinator.store.close()


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str
    db: Path
    log: Path

    def stop(self) -> tuple[int, str]:
        """SIGTERM, wait; (exit status, what it logged)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return rc, self.log.read_text()


def start_server(tmp: Path, name: str, *flags: str) -> Server:
    db, log = tmp / f"{name}.db", tmp / f"{name}.log"
    argv = ["--db", str(db), "--transport", "http", "--claim-ttl", "3600", *flags]
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(HERE), "--serve", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        raise RuntimeError(f"the server did not start: {log.read_text()}")
    return Server(proc, f"http://127.0.0.1:{port}/mcp", db, log)


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------


class CallFailed(RuntimeError):
    """A tool call raised, or answered with isError."""


@contextlib.asynccontextmanager
async def connect(url: str, mode: str, token: str | None = None) -> AsyncIterator[Client]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        await client.list_tools()  # caches the output schemas (else the SDK lists per call)
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    try:
        result = await client.call_tool(tool, arguments)
    except Exception as exc:
        raise CallFailed(f"{tool}: {exc!r}") from exc
    if result.is_error or result.structured_content is None:
        raise CallFailed(f"{tool}: {result.content}")
    reply: dict[str, Any] = result.structured_content
    return reply


async def timed(client: Client, tool: str, **arguments: Any) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    reply = await call(client, tool, **arguments)
    return time.perf_counter() - started, reply


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "n": len(ms),
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))],
        "max_ms": ms[-1],
    }


# --------------------------------------------------------------------------------------------
# 1: the cost of a call
# --------------------------------------------------------------------------------------------


async def measure_calls(server: Server, sizes: Sizes) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for mode, era in (("auto", "2026-07-28"), ("legacy", "2025-11-25")):
        async with connect(server.url, mode) as c:
            value = {"n": 1, "s": "x" * 40}
            await call(c, "agenthold_set", namespace="bench", key="k", value=value,
                       updated_by="bench", force=True)  # fmt: skip
            times: dict[str, list[float]] = {"get": [], "noop": []}
            for i in range(sizes.warm_up + sizes.calls):
                pair = [("get", "agenthold_get", {"namespace": "bench", "key": "k"}),
                        ("noop", "bench_noop", {})]  # fmt: skip
                for label, tool, arguments in pair if i % 2 else pair[::-1]:
                    spent, _ = await timed(c, tool, **arguments)
                    if i >= sizes.warm_up:
                        times[label].append(spent)
            get, noop = summary(times["get"]), summary(times["noop"])
            results[era] = {"get": get, "noop": noop, "over_ms": get["p50_ms"] - noop["p50_ms"]}
    return results


# --------------------------------------------------------------------------------------------
# 4: the cost of authentication
# --------------------------------------------------------------------------------------------


def token_file(path: Path) -> str:
    """A token file of PRINCIPALS principals, every other one scoped; returns the token of the
    one in the middle (scoped), which the clients use."""
    from agenthold.principals import digest

    principals = {}
    for i in range(PRINCIPALS):
        token = f"bench-token-{i:04d}"
        scopes = ["tools:standard,advanced", f"write:team-{i}/*", "claim:*"] if i % 2 else []
        principals[f"p{i}"] = {"tokens": [{"sha256": digest(token.encode()).hex()}],
                               "scopes": scopes}  # fmt: skip
    path.write_text(json.dumps({"version": 1, "principals": principals}))
    path.chmod(0o600)
    return f"bench-token-{PRINCIPALS // 2 + 1:04d}"


def check_cost(tmp: Path, token: str) -> dict[str, float]:
    """The middleware's own work per request (stat, digest, table pass), in this process: the
    part of the difference above that HTTP noise cannot hide."""
    from agenthold.auth import BearerAuth
    from agenthold.principals import TokenTable

    auth = BearerAuth(lambda *a: None, table=TokenTable(tmp / "tokens.json"))  # type: ignore[arg-type, return-value]
    costs = {}
    for label, header in (("known", f"Bearer {token}"), ("unknown", "Bearer no-such-token")):
        n = 5000
        started = time.perf_counter()
        for _ in range(n):
            auth.identify(header.encode())
        costs[label] = (time.perf_counter() - started) / n * 1e6
    return costs


async def measure_auth(tmp: Path, sizes: Sizes) -> dict[str, Any]:
    token = token_file(tmp / "tokens.json")
    plain = start_server(tmp, "plain")
    authed = start_server(tmp, "authed", "--auth-file", str(tmp / "tokens.json"))
    results: dict[str, Any] = {"principals": PRINCIPALS, "check_us": check_cost(tmp, token)}
    try:
        for mode, era in (("auto", "2026-07-28"), ("legacy", "2025-11-25")):
            async with connect(plain.url, mode) as a, connect(authed.url, mode, token) as b:
                times: dict[str, list[float]] = {"plain": [], "authed": []}
                for i in range(sizes.warm_up + sizes.calls):
                    pair = [("plain", a), ("authed", b)]
                    for label, client in pair if i % 2 else pair[::-1]:
                        spent, _ = await timed(client, "bench_noop")
                        if i >= sizes.warm_up:
                            times[label].append(spent)
            p, q = summary(times["plain"]), summary(times["authed"])
            results[era] = {"plain": p, "authed": q, "over_ms": q["p50_ms"] - p["p50_ms"]}
    finally:
        for server in (plain, authed):
            await anyio.to_thread.run_sync(server.stop)
    return results


# --------------------------------------------------------------------------------------------
# 2: mixed load
# --------------------------------------------------------------------------------------------

COUNTERS = [f"c{i}" for i in range(4)]
RESOURCES = [f"custom://bench-{i}" for i in range(8)]


@dataclass
class Load:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    increments: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    conflicts: int = 0
    busy: int = 0
    holds: dict[str, list[tuple[int, int, float, float]]] = field(
        default_factory=lambda: {r: [] for r in RESOURCES}
    )

    def note(self, tool: str, spent: float) -> None:
        self.latencies.setdefault(tool, []).append(spent)

    @property
    def calls(self) -> int:
        return sum(len(v) for v in self.latencies.values())


async def mixed_calls(c: Client, agent: str, n: int, deadline: float, load: Load) -> None:
    """Increments and claim-hold-release rounds, picked at random, until ``deadline``."""
    rng = random.Random(n)

    async def run(tool: str, **arguments: Any) -> dict[str, Any]:
        spent, reply = await timed(c, tool, **arguments)
        load.note(tool, spent)
        return reply

    while time.monotonic() < deadline:
        try:
            if rng.random() < 0.5:
                key = rng.choice(COUNTERS)
                while True:
                    got = await run("agenthold_get", namespace="counters", key=key)
                    value, version = (got["value"], got["version"]) if got["status"] == "ok" \
                        else (0, 0)  # fmt: skip
                    done = await run("agenthold_set", namespace="counters", key=key,
                                     value=value + 1, updated_by=agent,
                                     expected_version=version)  # fmt: skip
                    if done["status"] == "ok":
                        load.increments[key] += 1
                        break
                    if done["status"] != "conflict":
                        raise CallFailed(f"agenthold_set answered {done}")
                    load.conflicts += 1
            else:
                resource = rng.choice(RESOURCES)
                claimed = await run("agenthold_claim", resource=resource, agent_id=agent)
                if claimed["status"] == "busy":
                    load.busy += 1
                    continue
                if claimed["status"] != "claimed":
                    raise CallFailed(f"agenthold_claim answered {claimed}")
                start = time.time()
                await anyio.sleep(rng.random() * 0.002)
                end = time.time()
                released = await run("agenthold_release", resource=resource, agent_id=agent)
                if released["status"] != "released":
                    raise CallFailed(f"agenthold_release answered {released}")
                load.holds[resource].append((claimed["version"], released["version"], start, end))
        except CallFailed as exc:
            load.errors.append(str(exc))


async def noop_calls(c: Client, deadline: float, load: Load) -> None:
    while time.monotonic() < deadline:
        try:
            spent, _ = await timed(c, "bench_noop")
            load.note("bench_noop", spent)
        except CallFailed as exc:
            load.errors.append(str(exc))


@dataclass
class Phase:
    """One timed part of the load: when it started, when its last client finished, and the
    CPU seconds the server and this (client) process used in between."""

    load: Load
    start: float = 0.0
    end: float = 0.0
    cpu_at_start: tuple[float | None, float] = (None, 0.0)
    cpu_at_end: tuple[float | None, float] = (None, 0.0)
    running: int = 0

    def begin(self, server: Server, clients: int) -> None:
        self.start, self.running = time.monotonic(), clients
        self.cpu_at_start = (cpu_seconds(server.proc.pid), time.process_time())

    def finish_one(self, server: Server) -> None:
        self.running -= 1
        if self.running == 0:
            self.end = time.monotonic()
            self.cpu_at_end = (cpu_seconds(server.proc.pid), time.process_time())

    def facts(self) -> dict[str, Any]:
        (s0, c0), (s1, c1) = self.cpu_at_start, self.cpu_at_end
        seconds = self.end - self.start
        return {
            "seconds": seconds,
            "calls": self.load.calls,
            "calls_per_s": self.load.calls / seconds,
            "server_cpu_s": None if s0 is None or s1 is None else s1 - s0,
            "client_cpu_s": c1 - c0,
        }


async def run_load(server: Server, sizes: Sizes) -> tuple[Phase, Phase]:
    """Connect ``sizes.clients`` clients (half of each era), then run the mixed load and after
    it the no-op load, each for ``sizes.load_seconds``, on the same connections."""
    mixed, noop = Phase(Load()), Phase(Load())
    connected = 0
    everyone = anyio.Event()
    mixed_done = anyio.Event()

    async def one(n: int) -> None:
        nonlocal connected
        async with connect(server.url, "legacy" if n % 2 else "auto") as c:
            agent = (await call(c, "agenthold_register", name=f"bench-{n}"))["agent_id"]
            connected += 1
            if connected == sizes.clients:
                mixed.begin(server, sizes.clients)
                everyone.set()
            await everyone.wait()
            await mixed_calls(c, agent, n, mixed.start + sizes.load_seconds, mixed.load)
            mixed.finish_one(server)
            if mixed.running == 0:
                noop.begin(server, sizes.clients)
                mixed_done.set()
            await mixed_done.wait()
            await noop_calls(c, noop.start + sizes.load_seconds, noop.load)
            noop.finish_one(server)

    async with anyio.create_task_group() as tg:
        for n in range(sizes.clients):
            tg.start_soon(one, n)
    return mixed, noop


def check_holds(load: Load) -> list[str]:
    """Problems in the claim history: a broken version chain or overlapping holds."""
    problems = []
    for resource, holds in load.holds.items():
        holds.sort()
        for (c1, r1, s1, e1), (c2, r2, s2, e2) in itertools.pairwise(holds):
            if c2 != r1 + 1 or r2 != c2 + 1 or r1 != c1 + 1:
                problems.append(f"{resource}: versions {c1}-{r1} then {c2}-{r2}")
            if s2 < e1:
                problems.append(f"{resource}: holds overlap ({s1:.6f}-{e1:.6f}, {s2:.6f}-{e2:.6f})")
    return problems


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used so far; None where /proc is missing."""
    try:
        return process_cpu_seconds(pid)
    except OSError:
        return None


async def measure_load(server: Server, sizes: Sizes) -> dict[str, Any]:
    mixed, noop = await run_load(server, sizes)
    async with connect(server.url, "auto") as c:
        finals = {}
        for key in COUNTERS:
            got = await call(c, "agenthold_get", namespace="counters", key=key)
            finals[key] = got["value"] if got["status"] == "ok" else 0
    done = mixed.load.increments
    lost = {k: (done[k], finals[k]) for k in COUNTERS if done[k] != finals[k]}
    every = [s for times in mixed.load.latencies.values() for s in times]
    return {
        "clients": sizes.clients,
        "mixed": {
            **mixed.facts(),
            "all": summary(every),
            "by_tool": {t: summary(times) for t, times in sorted(mixed.load.latencies.items())},
            "increments": sum(done.values()),
            "conflicts": mixed.load.conflicts,
            "holds": sum(len(h) for h in mixed.load.holds.values()),
            "busy": mixed.load.busy,
            "errors": mixed.load.errors[:10],
            "error_count": len(mixed.load.errors),
            "lost_updates": lost,
            "hold_problems": check_holds(mixed.load)[:10],
        },
        "noop": {
            **noop.facts(),
            "all": summary(noop.load.latencies.get("bench_noop", [0.0])),
            "error_count": len(noop.load.errors),
            "errors": noop.load.errors[:10],
        },
    }


# --------------------------------------------------------------------------------------------
# 3: the stall test
# --------------------------------------------------------------------------------------------

HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
print("released", flush=True)
"""


async def measure_stall(server: Server, sizes: Sizes) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        holder = await stack.enter_async_context(connect(server.url, "legacy"))
        waiters = [await stack.enter_async_context(connect(server.url, m))
                   for m in ("legacy", "auto", "legacy", "auto", "legacy")]  # fmt: skip
        writer = await stack.enter_async_context(connect(server.url, "legacy"))
        old = await stack.enter_async_context(connect(server.url, "legacy"))
        new = await stack.enter_async_context(connect(server.url, "auto"))
        agent = (await call(holder, "agenthold_register", name="stall-holder"))["agent_id"]
        resources = [f"custom://stall-{i}" for i in range(10)]
        for resource in resources:
            await call(holder, "agenthold_claim", resource=resource, agent_id=agent)
        await call(old, "agenthold_set", namespace="stall", key="k", value=1, updated_by="b",
                   force=True)  # fmt: skip
        labels = ("ping", "get (2025-11-25)", "get (2026-07-28)", "status (2026-07-28)",
                  "bench_noop (2026-07-28), for scale")  # fmt: skip
        samples: dict[str, list[float]] = {label: [] for label in labels}
        wait_replies: list[dict[str, Any]] = []
        write_replies: list[dict[str, Any]] = []
        failures: list[str] = []

        async def wait_on(c: Client, resource: str) -> None:
            try:
                wait_replies.append(
                    await call(c, "agenthold_wait", resource=resource, timeout_seconds=120)
                )
            except CallFailed as exc:
                failures.append(str(exc))

        async def blocked_write(i: int) -> None:
            started = time.perf_counter()
            try:
                reply = await call(writer, "agenthold_set", namespace="stall", key=f"w{i}",
                                   value=i, updated_by="b", force=True)  # fmt: skip
                reply["seconds"] = time.perf_counter() - started
                write_replies.append(reply)
            except CallFailed as exc:
                failures.append(str(exc))

        async def probe() -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the SDK deprecates send_ping
                started = time.perf_counter()
                await old.send_ping()
            samples["ping"].append(time.perf_counter() - started)
            for label, c, tool, arguments in (
                ("get (2025-11-25)", old, "agenthold_get", {"namespace": "stall", "key": "k"}),
                ("get (2026-07-28)", new, "agenthold_get", {"namespace": "stall", "key": "k"}),
                ("status (2026-07-28)", new, "agenthold_status", {"resource": resources[0]}),
                (labels[-1], new, "bench_noop", {}),
            ):
                spent, reply = await timed(c, tool, **arguments)
                if reply["status"] not in ("ok", "claimed"):
                    failures.append(f"{tool} answered {reply}")
                samples[label].append(spent)

        async with anyio.create_task_group() as tg:
            for i in range(sizes.waits):
                tg.start_soon(wait_on, waiters[i % len(waiters)], resources[i % len(resources)])
            await anyio.sleep(1.0)  # every wait is in flight
            lock = subprocess.Popen(
                [sys.executable, "-c", HOLD_LOCK, str(server.db), str(sizes.lock_seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert lock.stdout is not None
            if lock.stdout.readline().strip() != "locked":
                raise RuntimeError("the lock holder did not take the lock")
            locked_at = time.monotonic()
            for i in range(4):
                tg.start_soon(blocked_write, i)
            await anyio.sleep(0.1)  # the writes are queued behind the lock
            while True:  # at least one probe, even when a slow start ate the whole lock time
                await probe()
                await anyio.sleep(0.02)
                if time.monotonic() - locked_at >= sizes.lock_seconds - 0.3:
                    break
            await anyio.to_thread.run_sync(lock.wait)
            lock.stdout.close()
            for resource in resources:
                await call(holder, "agenthold_release", resource=resource, agent_id=agent)
    return {
        "waits": sizes.waits,
        "lock_seconds": sizes.lock_seconds,
        "probes": {label: summary(times) for label, times in samples.items()},
        "waits_answered": sum(r["status"] == "available" for r in wait_replies),
        "writes": [
            {"status": r["status"], "seconds": round(r["seconds"], 2)} for r in write_replies
        ],
        "failures": failures[:10],
    }


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


async def run_all(tmp: Path, sizes: Sizes) -> dict[str, Any]:
    results: dict[str, Any] = {"calls": {}}
    logs: dict[str, tuple[int, str]] = {}
    for name, flags in (("sse", ()), ("json", ("--json-response",))):
        server = start_server(tmp, name, *flags)
        try:
            results["calls"][name] = await measure_calls(server, sizes)
            if name == "sse":
                results["load"] = await measure_load(server, sizes)
                results["stall"] = await measure_stall(server, sizes)
        finally:
            logs[name] = await anyio.to_thread.run_sync(server.stop)
    results["auth"] = await measure_auth(tmp, sizes)
    results["servers"] = {
        name: {"exit_status": rc, "log_lines": [line for line in log.splitlines() if line][:20]}
        for name, (rc, log) in logs.items()
    }
    return results


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    for mode, eras in results["calls"].items():
        for era, r in eras.items():
            checks.append((
                f"{mode}, {era}: agenthold_get median within {TARGET_GET_OVER_NOOP_MS} ms of "
                "bench_noop",
                r["over_ms"] <= TARGET_GET_OVER_NOOP_MS,
                f"{r['over_ms']:+.2f} ms ({r['get']['p50_ms']:.2f} vs {r['noop']['p50_ms']:.2f})",
            ))  # fmt: skip
    for era, r in results["auth"].items():
        if era in ("principals", "check_us"):
            continue
        checks.append((
            f"{era}: bench_noop with {PRINCIPALS:,} principals within {TARGET_AUTH_MS} ms of no "
            "token",
            r["over_ms"] <= TARGET_AUTH_MS,
            f"{r['over_ms'] * 1000:+.0f} us ({r['authed']['p50_ms']:.3f} vs "
            f"{r['plain']['p50_ms']:.3f} ms)",
        ))  # fmt: skip
    probes = [p for label, p in results["stall"]["probes"].items() if "bench_noop" not in label]
    p99, worst = max(p["p99_ms"] for p in probes), max(p["max_ms"] for p in probes)
    checks.append((
        f"while the lock is held: ping, get and status p99 under {TARGET_STALL_MS:g} ms",
        p99 < TARGET_STALL_MS,
        f"worst p99 {p99:.1f} ms",
    ))  # fmt: skip
    noise = max(r[tool]["max_ms"] for eras in results["calls"].values() for r in eras.values()
                for tool in ("get", "noop"))  # fmt: skip
    checks.append((
        f"while the lock is held: every ping, get and status under {TARGET_STALL_MS:g} ms",
        worst < TARGET_STALL_MS,
        f"slowest {worst:.1f} ms (for scale, the slowest call of part 1, with no lock and no "
        f"waits: {noise:.1f} ms)",
    ))  # fmt: skip
    return as_targets(checks)


def correctness(results: dict[str, Any]) -> list[str]:
    load, stall = results["load"], results["stall"]
    problems = []
    mixed = load["mixed"]
    if mixed["error_count"] or load["noop"]["error_count"]:
        problems.append(f"failed calls: {mixed['errors'] + load['noop']['errors']}")
    if mixed["lost_updates"]:
        problems.append(
            f"lost updates (successful increments, final value): {mixed['lost_updates']}"
        )
    if mixed["hold_problems"]:
        problems.append(f"claims held together: {mixed['hold_problems']}")
    if stall["failures"] or stall["waits_answered"] != stall["waits"]:
        problems.append(
            f"stall test: {stall['waits_answered']} of {stall['waits']} waits answered "
            f"'available'; {stall['failures']}"
        )
    for name, server in results["servers"].items():
        if server["exit_status"] != 0 or any("Traceback" in x for x in server["log_lines"]):
            problems.append(f"the {name} server stopped badly: {server}")
    return problems


def ms(s: dict[str, float]) -> list[str]:
    return [f"{s['p50_ms']:.2f}", f"{s['p99_ms']:.2f}", f"{s['max_ms']:.1f}", f"{s['n']:,}"]


def cpu(phase: dict[str, Any]) -> str:
    """The CPU seconds of server and clients, and the server's CPU time per call."""
    if phase["server_cpu_s"] is None:
        return f"? / {phase['client_cpu_s']:.1f}"
    per_call = phase["server_cpu_s"] / max(1, phase["calls"]) * 1000
    return f"{phase['server_cpu_s']:.1f} / {phase['client_cpu_s']:.1f} ({per_call:.2f} ms per call)"


def report(results: dict[str, Any]) -> str:
    m, sizes = results["machine"], results["sizes"]
    out = [
        f"agenthold HTTP benchmark ({sizes['label']} run)",
        machine_line(m),
        "server and clients share this machine; clients are the MCP SDK's, in another process",
        "",
    ]
    rows = [["1. one call at a time (ms)", "p50", "p99", "max", "calls"]]
    for mode, eras in results["calls"].items():
        for era, r in eras.items():
            rows.append([f"{mode}, {era}: agenthold_get", *ms(r["get"])])
            rows.append([f"{mode}, {era}: bench_noop", *ms(r["noop"])])
    out += [table(rows), ""]
    load = results["load"]
    mixed, noop = load["mixed"], load["noop"]
    rows = [[f"2. {load['clients']} concurrent clients (ms)", "p50", "p99", "max", "calls"]]
    rows.append(
        [f"mixed load, every call ({mixed['calls_per_s']:,.0f} calls/s)", *ms(mixed["all"])]
    )
    for tool, s in mixed["by_tool"].items():
        rows.append([f"  {tool}", *ms(s)])
    rows.append([f"bench_noop only ({noop['calls_per_s']:,.0f} calls/s)", *ms(noop["all"])])
    out += [
        table(rows),
        f"CPU seconds, server / clients: mixed {cpu(mixed)}; bench_noop only {cpu(noop)}",
        f"mixed load for {mixed['seconds']:.1f} s: {mixed['increments']:,} increments "
        f"({mixed['conflicts']:,} conflicts retried), {mixed['holds']:,} claim-release holds "
        f"({mixed['busy']:,} busy), {mixed['error_count']} failed calls, "
        f"{len(mixed['lost_updates'])} counters off, {len(mixed['hold_problems'])} hold problems",
        "",
    ]
    stall = results["stall"]
    rows = [[
        f"3. {stall['waits']} waits in flight, write lock held {stall['lock_seconds']:g} s by "
        "another process (ms)", "p50", "p99", "max", "calls",
    ]]  # fmt: skip
    for label, s in stall["probes"].items():
        rows.append([f"  {label}", *ms(s)])
    writes = ", ".join(f"{w['status']} after {w['seconds']} s" for w in stall["writes"])
    auth = results["auth"]
    auth_rows = [[f"4. bench_noop, {auth['principals']:,} principals vs no token (ms)", "p50",
                  "p99", "max", "calls"]]  # fmt: skip
    for era, r in auth.items():
        if era not in ("principals", "check_us"):
            auth_rows.append([f"{era}: no token", *ms(r["plain"])])
            auth_rows.append([f"{era}: token file", *ms(r["authed"])])
    out += [
        table(rows),
        f"waits answered 'available' after the lock: {stall['waits_answered']} of "
        f"{stall['waits']}; writes queued behind the lock: {writes}",
        "",
        table(auth_rows),
        f"the token check alone, in this process: {auth['check_us']['known']:.1f} us for a known "
        f"token, {auth['check_us']['unknown']:.1f} us for an unknown one",
        "",
        *target_lines(results["targets"], quick=sizes["label"] == "quick"),
    ]
    problems = results["problems"]
    out.append("correctness: " + ("all checks passed" if not problems else "FAILED"))
    out += [f"  {p}" for p in problems]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of about ten seconds")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    facts = machine(mcp=version("mcp"), uvicorn=version("uvicorn"))
    results: dict[str, Any] = {"machine": facts, "sizes": sizes.__dict__}
    with tempfile.TemporaryDirectory(prefix="agenthold-http-bench-") as tmp:
        results.update(anyio.run(run_all, Path(tmp), sizes))
    results["targets"] = targets(results)
    results["problems"] = correctness(results)
    print(json.dumps(results, indent=2) if args.json else report(results))
    return 1 if results["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
