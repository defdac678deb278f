"""Speed and safety of agenthold over Streamable HTTP, with the load in another process.

    python bench/perf/http_bench.py            # the full run, about a minute and a half
    python bench/perf/http_bench.py --quick    # a smoke run of about ten seconds
    python bench/perf/http_bench.py --json     # the same results as JSON instead of tables
    python bench/perf/http_bench.py --auth-only  # part 4 alone (about three minutes)

The server is the real one (``serve_http`` with the options the ``agenthold`` command builds),
started as ``python bench/perf/http_bench.py --serve ...`` in a process of its own. That launcher
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
4. The cost of authentication: three servers run side by side, one without a token, one with a
   token file of one principal and one with 1,000 (scoped ones too, so their checks run). Each
   round calls ``bench_noop`` once on each, in an order drawn at random, so that whatever else
   the machine does falls on all three alike; by clients of both eras, 4,000 rounds each. What
   a token file costs a call is the median of the per-round differences (with its 95 %
   confidence interval, a trimmed mean and the quartiles); each server's CPU time per call
   during the rounds, and the check alone in this process (elapsed and CPU time, for 1 and
   1,000 principals), say the same without the noise of the clients and the network.
   ``--auth-only`` runs this part alone, for repeated runs.
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

import contextlib
import functools
import itertools
import json
import os
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
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import (
    as_targets,
    finish,
    machine,
    machine_line,
    options,
    process_cpu_seconds,
    table,
    target_lines,
)

HERE = Path(__file__).resolve()
TARGET_GET_OVER_NOOP_MS = 0.5  # median of agenthold_get minus median of bench_noop
TARGET_STALL_MS = 50.0  # slowest ping or get while the lock is held
TARGET_AUTH_MS = 0.1  # median per-round difference: 1,000 principals minus no token
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
    auth_rounds: int  # rounds of part 4, each calling every one of its servers once


FULL = Sizes("full", 2000, 50, 32, 20.0, 50, 6.0, 4000)
QUICK = Sizes("quick", 20, 5, 8, 0.5, 20, 0.5, 30)


# --------------------------------------------------------------------------------------------
# The server under test (run as: http_bench.py --serve AGENTHOLD-ARGS...)
# --------------------------------------------------------------------------------------------


def serve(argv: list[str]) -> int:
    """Serve the advanced and standard tools and bench_noop with ``serve_http``; print the
    port on stdout once listening; stop on SIGTERM like ``agenthold --transport http``."""
    import logging

    from agenthold.cli import (
        build_parser,
        freeze_startup_objects,
        listen,
        open_coordinator,
        serve_options,
        stop_signals,
    )
    from agenthold.serve import Agenthold, ToolCall, ToolSpec, serve_http, standard_tools

    opts, _ = serve_options(build_parser().parse_args(argv), {})
    logging.basicConfig(stream=sys.stderr, level=opts.log_level.upper())
    coordinator = open_coordinator(opts)
    app = Agenthold(coordinator, tools="advanced", disconnect_grace=opts.disconnect_grace)
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


def server_script(checkout: Path) -> Path | None:
    """The http_bench.py of another checkout: in bench/perf/, or in bench/ before the split."""
    for script in (
        checkout / "bench" / "perf" / "http_bench.py",
        checkout / "bench" / "http_bench.py",
    ):
        if script.exists():
            return script
    return None


def start_server(tmp: Path, name: str, *flags: str, checkout: Path | None = None) -> Server:
    """A server started by this script's --serve; with ``checkout``, by that checkout's own
    http_bench.py (``server_script``), importing that checkout's agenthold (see
    http_versus.py)."""
    db, log = tmp / f"{name}.db", tmp / f"{name}.log"
    argv = ["--db", str(db), "--transport", "http", "--claim-ttl", "3600", *flags]
    script, env, cwd = HERE, None, None
    if checkout is not None:
        script, cwd = server_script(checkout), checkout
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        assert script is not None, f"{checkout} has no http_bench.py"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(script), "--serve", *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        raise RuntimeError(f"the {name} server did not start: {log.read_text()}")
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


def token_file(path: Path, principals: int) -> str:
    """A token file of ``principals`` principals, every other one scoped; returns the token of
    the one in the middle (scoped, when there are several), which the clients use. The file is
    dated ten seconds back: one changed in the last two seconds is read again at every call
    (principals.RACY_NS), which is not the steady state this measures."""
    from agenthold.identity import digest

    entries = {}
    for i in range(principals):
        token = f"bench-token-{i:04d}"
        scopes = ["tools:standard,advanced", f"write:team-{i}/*", "claim:*"] if i % 2 else []
        entries[f"p{i}"] = {"tokens": [{"sha256": digest(token.encode()).hex()}],
                            "scopes": scopes}  # fmt: skip
    path.write_text(json.dumps({"version": 1, "principals": entries}))
    path.chmod(0o600)
    past = time.time() - 10
    os.utime(path, (past, past))
    return f"bench-token-{principals // 2 + 1 if principals > 1 else 0:04d}"


def check_cost(tmp: Path, repeats: int = 7, n: int = 5000) -> dict[str, dict[str, float]]:
    """The middleware's own work per request (stat, digest, the pass over every digest), in
    this process, for a file of one principal and one of PRINCIPALS: the part of the HTTP
    difference that noise cannot hide. Microseconds per check: the median and the best of
    ``repeats`` runs of ``n`` checks, in elapsed time and in this thread's CPU time (which
    other work on the machine does not lengthen)."""
    from agenthold.identity import TokenTable
    from agenthold.serve import BearerAuth

    costs = {}
    for principals in (1, PRINCIPALS):
        path = tmp / f"check-{principals}.json"
        token = token_file(path, principals)
        auth = BearerAuth(lambda *a: None, table=TokenTable(path))  # type: ignore[arg-type, return-value]
        for label, header in (("known", f"Bearer {token}"), ("unknown", "Bearer no-such-token")):
            raw = header.encode()
            if (auth.identify(raw) is None) != (label == "unknown"):
                raise RuntimeError(f"the {label} token was not judged so")
            runs, cpu = [], []
            for _ in range(repeats):
                started, started_cpu = time.perf_counter(), time.thread_time()
                for _ in range(n):
                    auth.identify(raw)
                cpu.append((time.thread_time() - started_cpu) / n * 1e6)
                runs.append((time.perf_counter() - started) / n * 1e6)
            costs[f"{principals} {label}"] = {
                "median": statistics.median(runs),
                "best": min(runs),
                "cpu_median": statistics.median(cpu),
                "cpu_best": min(cpu),
            }
    return costs


def paired(over: list[float], under: list[float]) -> dict[str, float]:
    """What ``over`` costs beyond ``under``, from calls made in the same rounds: the median of
    the per-round differences with its 95 % confidence interval (distribution-free, from the
    order statistics), their 10 %-trimmed mean and interquartile range, and the difference of
    the two medians. Microseconds."""
    diffs = sorted((a - b) * 1e6 for a, b in zip(over, under, strict=True))
    n = len(diffs)
    half = 0.98 * n**0.5  # 1.96 / 2 * sqrt(n) ranks either side of the middle
    low, high = max(0, int(n / 2 - half)), min(n - 1, int(n / 2 + half + 0.999))
    cut = n // 10
    kept = diffs[cut : n - cut] or diffs
    q = statistics.quantiles(diffs, n=4) if n > 1 else [diffs[0]] * 3
    return {
        "median": statistics.median(diffs),
        "ci_low": diffs[low],
        "ci_high": diffs[high],
        "trimmed_mean": statistics.fmean(kept),
        "p25": q[0],
        "p75": q[2],
        "of_medians": (statistics.median(over) - statistics.median(under)) * 1e6,
    }


#: The servers of part 4, all running at once: (label, principals in its token file or None).
AUTH_SERVERS = (("none", None), ("one", 1), ("many", PRINCIPALS))
#: The differences part 4 reports: (label, server, baseline server).
AUTH_PAIRS = (
    (f"{PRINCIPALS:,} principals - no token", "many", "none"),
    ("1 principal - no token", "one", "none"),
    (f"{PRINCIPALS:,} principals - 1 principal", "many", "one"),
)


async def measure_auth(tmp: Path, sizes: Sizes, logs: dict[str, tuple[int, str]]) -> dict[str, Any]:
    """bench_noop on a server without a token, one with a token file of one principal and one
    with PRINCIPALS, side by side: each round calls every server once, in an order drawn at
    random, so that the machine's load (shared with other work) falls on all three alike;
    the per-round differences say what a token file costs a call."""
    servers, tokens = {}, {}
    try:
        for label, principals in AUTH_SERVERS:
            flags: tuple[str, ...] = ()
            if principals is not None:
                path = tmp / f"tokens-{principals}.json"
                tokens[label] = token_file(path, principals)
                flags = ("--auth-file", str(path))
            servers[label] = start_server(tmp, f"auth-{label}", *flags)
        results: dict[str, Any] = {"principals": PRINCIPALS, "rounds": sizes.auth_rounds}
        results["check_us"] = check_cost(tmp)
        for mode, era in (("auto", "2026-07-28"), ("legacy", "2025-11-25")):
            rng = random.Random(era)
            async with contextlib.AsyncExitStack() as stack:
                clients = [
                    (label, await stack.enter_async_context(
                        connect(servers[label].url, mode, tokens.get(label))))
                    for label, _ in AUTH_SERVERS
                ]  # fmt: skip
                times: dict[str, list[float]] = {label: [] for label, _ in AUTH_SERVERS}
                cpu: dict[str, float | None] = {}
                for i in range(sizes.warm_up + sizes.auth_rounds):
                    if i == sizes.warm_up:
                        cpu = {label: cpu_seconds(servers[label].proc.pid) for label in servers}
                    rng.shuffle(clients)
                    for label, client in clients:
                        spent, _ = await timed(client, "bench_noop")
                        if i >= sizes.warm_up:
                            times[label].append(spent)
                for label, server in servers.items():
                    start, end = cpu[label], cpu_seconds(server.proc.pid)
                    cpu[label] = None if start is None or end is None else end - start
            results[era] = {
                "calls": {label: summary(t) for label, t in times.items()},
                "over_us": {name: paired(times[a], times[b]) for name, a, b in AUTH_PAIRS},
                # each server's CPU time per call: what other work on the machine cannot add
                "server_cpu_us": {
                    label: None if c is None else c / sizes.auth_rounds * 1e6
                    for label, c in cpu.items()
                },
            }
    finally:
        for label, server in servers.items():
            logs[f"auth-{label}"] = await anyio.to_thread.run_sync(server.stop)
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


async def run_all(tmp: Path, sizes: Sizes, auth_only: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {}
    logs: dict[str, tuple[int, str]] = {}
    for name, flags in () if auth_only else (("sse", ()), ("json", ("--json-response",))):
        server = start_server(tmp, name, *flags)
        try:
            results.setdefault("calls", {})[name] = await measure_calls(server, sizes)
            if name == "sse":
                results["load"] = await measure_load(server, sizes)
                results["stall"] = await measure_stall(server, sizes)
        finally:
            logs[name] = await anyio.to_thread.run_sync(server.stop)
    results["auth"] = await measure_auth(tmp, sizes, logs)
    results["servers"] = {
        name: {"exit_status": rc, "log_lines": [line for line in log.splitlines() if line][:20]}
        for name, (rc, log) in logs.items()
    }
    return results


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    for era, r in results["auth"].items():
        if era in AUTH_FACTS:
            continue
        over = r["over_us"][AUTH_PAIRS[0][0]]
        checks.append((
            f"{era}: bench_noop with {PRINCIPALS:,} principals within {TARGET_AUTH_MS} ms of no "
            "token (median of the per-round differences)",
            over["median"] <= TARGET_AUTH_MS * 1000,
            f"{over['median']:+.0f} us (95% CI {over['ci_low']:+.0f} to {over['ci_high']:+.0f})",
        ))  # fmt: skip
    if "calls" not in results:  # --auth-only
        return as_targets(checks)
    auth, checks = checks, []
    for mode, eras in results["calls"].items():
        for era, r in eras.items():
            checks.append((
                f"{mode}, {era}: agenthold_get median within {TARGET_GET_OVER_NOOP_MS} ms of "
                "bench_noop",
                r["over_ms"] <= TARGET_GET_OVER_NOOP_MS,
                f"{r['over_ms']:+.2f} ms ({r['get']['p50_ms']:.2f} vs {r['noop']['p50_ms']:.2f})",
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
    return as_targets(checks + auth)


def correctness(results: dict[str, Any]) -> list[str]:
    problems = []
    for name, server in results["servers"].items():
        if server["exit_status"] != 0 or any("Traceback" in x for x in server["log_lines"]):
            problems.append(f"the {name} server stopped badly: {server}")
    if "load" not in results:  # --auth-only
        return problems
    load, stall = results["load"], results["stall"]
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
    if "calls" in results:
        out += parts_1_to_3(results)
    out += [*auth_report(results["auth"]), ""]
    out += target_lines(results["targets"], quick=sizes["label"] == "quick")
    problems = results["problems"]
    out.append("correctness: " + ("all checks passed" if not problems else "FAILED"))
    out += [f"  {p}" for p in problems]
    return "\n".join(out)


def parts_1_to_3(results: dict[str, Any]) -> list[str]:
    out = []
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
    return [
        *out,
        table(rows),
        f"waits answered 'available' after the lock: {stall['waits_answered']} of "
        f"{stall['waits']}; writes queued behind the lock: {writes}",
        "",
    ]


AUTH_FACTS = ("principals", "rounds", "check_us")
AUTH_LABELS = {"none": "no token", "one": "1 principal", "many": f"{PRINCIPALS:,} principals"}


def auth_report(auth: dict[str, Any]) -> list[str]:
    rows = [[f"4. bench_noop, servers side by side, {auth['rounds']:,} rounds (ms)", "p50", "p99",
             "max", "calls", "server CPU us/call"]]  # fmt: skip
    diffs = [["   difference per round (us)", "median", "95% CI", "trimmed mean", "IQR",
              "of medians"]]  # fmt: skip
    for era, r in auth.items():
        if era in AUTH_FACTS:
            continue
        for label, s in r["calls"].items():
            used = r["server_cpu_us"][label]
            rows.append([f"{era}: {AUTH_LABELS[label]}", *ms(s),
                         "?" if used is None else f"{used:.0f}"])  # fmt: skip
        for name, d in r["over_us"].items():
            diffs.append([
                f"{era}: {name}", f"{d['median']:+.0f}",
                f"{d['ci_low']:+.0f} to {d['ci_high']:+.0f}", f"{d['trimmed_mean']:+.0f}",
                f"{d['p25']:+.0f} to {d['p75']:+.0f}", f"{d['of_medians']:+.0f}",
            ])  # fmt: skip
    check = [["   the token check alone, in this process (us)", "median", "best", "CPU median",
              "CPU best"]]  # fmt: skip
    for label, c in auth["check_us"].items():
        principals, known = label.split()
        who = "1 principal" if principals == "1" else f"{int(principals):,} principals"
        check.append([f"{who}, {known} token", f"{c['median']:.1f}", f"{c['best']:.1f}",
                      f"{c['cpu_median']:.1f}", f"{c['cpu_best']:.1f}"])  # fmt: skip
    return [table(rows), "", table(diffs), "", table(check)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(argv[1:])
    parser = options(__doc__, quick="a smoke run of about ten seconds (too small to judge)")
    parser.add_argument(
        "--auth-only", action="store_true", help="only part 4, the cost of authentication"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    facts = machine(mcp=version("mcp"), uvicorn=version("uvicorn"))
    results: dict[str, Any] = {"machine": facts, "sizes": sizes.__dict__}
    with tempfile.TemporaryDirectory(prefix="agenthold-http-bench-") as tmp:
        results.update(anyio.run(run_all, Path(tmp), sizes, args.auth_only))
    results["targets"] = targets(results)
    results["problems"] = correctness(results)
    finish(args, results, report)
    return 1 if results["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
