"""Speed of agenthold over MCP stdio: what a call costs, how fast a wait wakes, how fast it starts.

    python bench/perf/mcp_bench.py            # the full run, about three minutes
    python bench/perf/mcp_bench.py --quick    # a smoke run of about ten seconds
    python bench/perf/mcp_bench.py --json     # the same results as JSON instead of tables
    python bench/perf/mcp_bench.py --baseline-venv /work/baseline-venv   # also agenthold 0.10.0

The client is the mcp SDK's ``Client`` in this process; servers are child processes on stdio. Every
measurement runs in both protocol eras: mode "auto" (which settles on 2026-07-28) and "legacy"
(the 2025-11-25 initialize handshake). Times are read with time.perf_counter in this process.

1. Per-call cost. The servers are bench/perf/mcp_bench_server.py: the real agenthold stdio server
   with one extra tool, bench_noop, that goes through the same dispatch but does no database
   work. So "tool minus no-op", measured on the same server in the same run, is what the tool's
   own work costs, and what the SDK, the pipes and the client cost cancels out. Calls are made
   one at a time in rounds of one measured call and one no-op (which goes first alternates), so
   load from other work on the machine hits both alike:
   - agenthold_get of an existing key, against bench_noop (--tools advanced);
   - agenthold_set with the expected_version of the last write, so every write succeeds;
   - agenthold_claim + agenthold_release of one resource as a pair, against two no-ops.
2. Wake-up of agenthold_wait by a release in another server process: two servers on one database
   file; agent A holds a resource through one, agent B waits for it through the other, and A
   releases after a random 20-120 ms. The wake-up is B's wait reply arriving minus A's release
   reply arriving (clamped at 0; how often the wait answered first is counted). A trial whose wait
   did not block (elapsed under 10 ms) does not count.
3. Spawn to first answered call: from starting the client, which spawns the server, to the first
   tools/call reply, for ``python -m agenthold`` (agenthold_status) and, as the floor any Python
   server on this SDK pays, a bare low-level mcp Server with one tool (bench_noop).

4. Per-call clients (a client that starts a server for every call, as LangChain's adapters do):
   start the client (which spawns ``python -m agenthold``), initialize, one agenthold_status
   call, exit; PERCALL_RUNS times in a row, through the warm server the first call leaves
   behind, against the same with --no-warm (today's cold start) and a bare mcp Server; and the
   first call when no warm server exists yet (a runtime directory of its own each time), which
   pays the fork of the warm server and must be no slower than --no-warm (FIRST_TOLERANCE);
   with --baseline-venv, that venv's agenthold (0.10.0) is started the same way, by the same
   client, in the same rotation. The kinds take turns, and each first call's warm server is
   stopped once it is up, so none competes with the next measurement. Last, the warm
   server's memory (VmRSS), against a --no-warm server's after one call (it is a fork of one,
   and must not grow with the calls it served), and the CPU time it uses in IDLE_PROBE seconds
   without a client (which must be none: it does not poll).

5. Waiting when nothing happens, and the feed's raw baseline: the same measurements with the
   change feed on file events (the default) and with AGENTHOLD_FILE_EVENTS=off (the 2 ms
   `PRAGMA data_version` poll every wait used before, and still uses where there are no file
   events), in the same run. For each: the wake-up of section 2 (mode auto) and the CPU time
   (/proc/PID/stat) over IDLE_WINDOW seconds of three processes side by side: a server with
   IN_FLIGHT agenthold_wait calls in flight on a resource that stays claimed, an idle server on
   a database of its own with no wait (the floor: what a server costs doing nothing), and an
   idle `agenthold log --follow` on the waits' database. Then the resource is released and
   every wait must answer.

With --baseline-venv, this script also runs with that venv's python (--baseline-client, which
uses only the stdlib, the stdlib-only bench/harness.py and that venv's mcp 1.x client, nothing
of this agenthold) and measures the agenthold installed there the same way, minus the no-op it
does not have: absolute times only.

The exit status is 1 only when a correctness check fails (a refused write, a wait that did not
see its release); a missed speed target is reported, not fatal, since speed depends on the machine
and its load.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from argparse import SUPPRESS
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

# Only the standard library at module level (and the harness, which is standard library only
# too): --baseline-client runs under another venv's python.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import (
    ROOT,
    finish,
    load_average,
    machine,
    options,
    percentile,
    table,
    threads_cpu_seconds,
)

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "mcp_bench_server.py"
NOOP = "bench_noop"
MODES = ("auto", "legacy")
NS, KEY = "bench", "counter"
PAIR_RESOURCE = "custom://bench-pair"
WAKE_RESOURCE = "custom://bench-wake"
STATUS_RESOURCE = "custom://bench-status"
IDLE_RESOURCE = "custom://bench-idle"
WAIT_TIMEOUT = 10.0  # seconds; a wake-up never takes this long unless something is broken
BLOCKED = 0.010  # seconds: a wait that answered sooner did not block, so its trial is void

# The targets: a tool's median over the no-op's (ms), and the wake-up median and p99.
OVER_NOOP_MS = {"get": 0.3, "set": 0.5, "pair": 1.0}
WAKE_MEDIAN_MS, WAKE_P99_MS = 5.0, 15.0
IN_FLIGHT = 100  # agenthold_wait calls in flight in one server while its CPU time is measured
IDLE_CPU_PERCENT = 0.2  # of one core: the ceiling for those waits and for an idle log --follow
FEEDS = {"file events": {}, "2 ms poll": {"AGENTHOLD_FILE_EVENTS": "off"}}  # name: server env
LABELS = {
    "get": ("agenthold_get", "bench_noop"),
    "set": ("agenthold_set", "bench_noop"),
    "pair": ("claim + release", "two no-ops"),
}


@dataclass(frozen=True)
class Sizes:
    label: str
    warmup: int  # unmeasured rounds before each per-call measurement
    rounds: int  # measured calls of each kind
    trials: int  # wake-ups per era
    spawns: int  # measured spawns of each server per era
    percall: int  # per-call clients through the warm server, per era
    firsts: int  # per-call clients of each cold kind (first, --no-warm, 0.10.0, bare), per era
    idle_window: float  # seconds over which idle processes' CPU time is measured


FULL = Sizes("full", 50, 1000, 200, 10, 50, 20, 10.0)
QUICK = Sizes("quick", 5, 20, 5, 1, 3, 1, 2.0)


class BenchError(Exception):
    """A reply that was not what the benchmark relies on: the run is not valid."""


def bench_error(exc: BaseException) -> BenchError | None:
    """The BenchError in ``exc``, which may come wrapped in (nested) exception groups."""
    if isinstance(exc, BenchError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = bench_error(inner)
        if found is not None:
            return found
    return None


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def summary(seconds: list[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 99),
        "min_ms": min(ms),
        "max_ms": max(ms),
    }


# --------------------------------------------------------------------------------------------
# This agenthold, through the mcp 2.x Client
# --------------------------------------------------------------------------------------------


def server_env(runtime: Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The servers import agenthold from this checkout, installed or not. Without a runtime
    directory for warm servers, they use none (each serves its calls, as before warm servers);
    with one, they leave and use warm servers there. ``extra``: more variables (FEEDS)."""
    path = os.environ.get("PYTHONPATH")
    env = {"PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""), **(extra or {})}
    if runtime is None:
        env["AGENTHOLD_NO_WARM"] = "1"
    else:
        env["AGENTHOLD_RUNTIME_DIR"] = str(runtime)
    return env


def bench_server(db: Path, tools: str, extra: dict[str, str] | None = None) -> Any:
    from mcp import StdioServerParameters

    args = [str(LAUNCHER), "--db", str(db), "--tools", tools]
    return StdioServerParameters(
        command=sys.executable, args=args, env=server_env(None, extra), cwd=str(db.parent)
    )


def agenthold_server(
    db: Path, runtime: Path | None = None, extra: dict[str, str] | None = None
) -> Any:
    from mcp import StdioServerParameters

    args = ["-m", "agenthold", "--db", str(db)]
    return StdioServerParameters(
        command=sys.executable, args=args, env=server_env(runtime, extra), cwd=str(db.parent)
    )


def bare_server(tmp: Path) -> Any:
    from mcp import StdioServerParameters

    args = [str(LAUNCHER), "--bare"]
    return StdioServerParameters(command=sys.executable, args=args, cwd=str(tmp))


async def call(client: Any, name: str, args: dict[str, Any], *expect: str) -> dict[str, Any]:
    """Call a tool; its reply, which must have one of the ``expect`` statuses (default ok)."""
    result = await client.call_tool(name, args)
    reply = result.structured_content
    if reply is None and result.content:  # the bare server answers with text only
        reply = json.loads(result.content[0].text)
    if (
        result.is_error
        or not isinstance(reply, dict)
        or reply.get("status") not in (expect or ("ok",))
    ):
        raise BenchError(f"{name} answered {reply if reply is not None else result.content}")
    return reply


Step = Callable[[], Awaitable[Any]]


async def in_rounds(steps: dict[str, Step], warmup: int, rounds: int) -> dict[str, list[float]]:
    """Each step once per round, in turns (which goes first alternates); their times."""
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            await steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    for i in range(rounds):
        for name in names if i % 2 == 0 else reversed(names):
            started = clock()
            await steps[name]()
            times[name].append(clock() - started)
    return times


def against_noop(times: dict[str, list[float]], kind: str) -> dict[str, Any]:
    tool, noop = summary(times["tool"]), summary(times["noop"])
    over = tool["median_ms"] - noop["median_ms"]
    return {
        "tool": tool,
        "noop": noop,
        "over_noop_ms": over,
        "target_ms": OVER_NOOP_MS[kind],
        "passed": over <= OVER_NOOP_MS[kind],
    }


async def measure_calls(client: Any, sizes: Sizes) -> dict[str, Any]:
    """agenthold_get and agenthold_set against the no-op, on an advanced-tools server."""

    async def noop() -> None:
        await call(client, NOOP, {})

    first = await call(
        client,
        "agenthold_set",
        {"namespace": NS, "key": KEY, "value": {"n": 0}, "updated_by": "bench", "force": True},
    )
    version = first["version"]

    async def get() -> None:
        await call(client, "agenthold_get", {"namespace": NS, "key": KEY})

    async def set_() -> None:
        nonlocal version
        args = {
            "namespace": NS,
            "key": KEY,
            "value": {"n": version},
            "updated_by": "bench",
            "expected_version": version,
        }
        version = (await call(client, "agenthold_set", args))["version"]

    out = {}
    for kind, step in (("get", get), ("set", set_)):
        times = await in_rounds({"tool": step, "noop": noop}, sizes.warmup, sizes.rounds)
        out[kind] = against_noop(times, kind)
    return out


async def measure_pairs(client: Any, agent_id: str, sizes: Sizes) -> dict[str, Any]:
    """A claim + release pair against two no-ops, on a standard-tools server."""

    async def two_noops() -> None:
        await call(client, NOOP, {})
        await call(client, NOOP, {})

    args = {"resource": PAIR_RESOURCE, "agent_id": agent_id}

    async def pair() -> None:
        await call(client, "agenthold_claim", args, "claimed")
        await call(client, "agenthold_release", args, "released")

    times = await in_rounds({"tool": pair, "noop": two_noops}, sizes.warmup, sizes.rounds)
    return against_noop(times, "pair")


async def wait_for_release(waiter: Any, woken: list[tuple[float, dict[str, Any]]]) -> None:
    args = {"resource": WAKE_RESOURCE, "timeout_seconds": WAIT_TIMEOUT}
    reply = await call(waiter, "agenthold_wait", args, "available")
    woken.append((time.perf_counter(), reply))


async def measure_wake(
    holder: Any, waiter: Any, agent_id: str, trials: int, rng: random.Random
) -> dict[str, Any]:
    import anyio

    args = {"resource": WAKE_RESOURCE, "agent_id": agent_id}
    latencies: list[float] = []
    void = first = 0
    await call(waiter, "agenthold_status", {"resource": WAKE_RESOURCE}, "available", "claimed")
    for _ in range(trials):
        await call(holder, "agenthold_claim", args, "claimed")
        woken: list[tuple[float, dict[str, Any]]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_release, waiter, woken)
            await anyio.sleep(rng.uniform(0.020, 0.120))
            await call(holder, "agenthold_release", {**args, "outcome": "modified"}, "released")
            released = time.perf_counter()
        arrived, reply = woken[0]
        if reply.get("previous_outcome") != "modified":
            raise BenchError(f"the wait did not see its release: {reply}")
        if reply["elapsed_seconds"] < BLOCKED:
            void += 1
            continue
        if arrived < released:
            first += 1
        latencies.append(max(0.0, arrived - released))
    if not latencies:
        raise BenchError("no wait blocked: every one answered before its release")
    return {
        **summary(latencies),
        "void_trials": void,
        "wait_answered_first": first,
        "passed_median": statistics.median(latencies) * 1000 <= WAKE_MEDIAN_MS,
        "passed_p99": percentile(latencies, 99) * 1000 <= WAKE_P99_MS,
    }


async def first_call(
    server: Any, mode: str, tool: str, args: dict[str, Any], *expect: str
) -> float:
    """Seconds from starting a client (it spawns the server) to the first tools/call reply."""
    from mcp import Client

    started = time.perf_counter()
    async with Client(server, mode=mode) as client:
        await call(client, tool, args, *expect)
        return time.perf_counter() - started


async def measure_spawns(tmp: Path, mode: str, sizes: Sizes) -> dict[str, Any]:
    db = tmp / f"spawn-{mode}.db"
    kinds: dict[str, Callable[[], Awaitable[float]]] = {
        "agenthold": lambda: first_call(
            agenthold_server(db), mode, "agenthold_status", {"resource": STATUS_RESOURCE},
            "available",
        ),
        "bare_sdk": lambda: first_call(bare_server(tmp), mode, NOOP, {}),
    }  # fmt: skip
    if sizes.label == "full":  # one unmeasured start each: creates the database, warms caches
        for spawn in kinds.values():
            await spawn()
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(sizes.spawns):
        for kind in kinds if i % 2 == 0 else reversed(list(kinds)):
            times[kind].append(await kinds[kind]())
    return {kind: summary(t) for kind, t in times.items()}


PERCALL_MEDIAN_MS, PERCALL_P99_MS = 150.0, 300.0  # the targets, once warm
FIRST_TOLERANCE = 1.05  # the first call's median against --no-warm's: 5% for a busy machine
RSS_TOLERANCE = 1.2  # the warm server's memory against a --no-warm server's after one call
IDLE_PROBE = 2.0  # seconds the warm server's idle CPU is watched
IDLE_TICK = 0.01  # s: the clock tick /proc counts CPU time in; less than one means none


async def per_call(server: Any, mode: str, tool: str, args: dict[str, Any], *expect: str) -> float:
    """Seconds from starting a client (it spawns the server) to its end, after one call."""
    from mcp import Client

    started = time.perf_counter()
    async with Client(server, mode=mode) as client:
        await call(client, tool, args, *expect)
    return time.perf_counter() - started


def warm_pids(runtime: Path) -> list[int]:
    return sorted(int(p.read_text()) for p in runtime.glob("*.pid") if p.read_text().strip())


def stop_warm(runtime: Path, *, started: bool = False) -> None:
    """SIGTERM the warm servers of ``runtime`` and wait for them to exit (their pid files go).
    ``started``: a call has just left one behind, which writes its pid file only once it
    listens; wait for that first (else it would outlive the run, and compete with the next)."""
    import signal

    deadline = time.monotonic() + 15
    while started and not warm_pids(runtime) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in warm_pids(runtime):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while list(runtime.glob("*.pid")) and time.monotonic() < deadline:
        time.sleep(0.02)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")  # pragma: no cover


def old_server(command: Path, db: Path) -> Any:
    """The agenthold of --baseline-venv (its own command and interpreter), on ``db``."""
    from mcp import StdioServerParameters

    return StdioServerParameters(command=str(command), args=["--db", str(db)], cwd=str(db.parent))


async def cold_rss_mib(db: Path, mode: str) -> float:
    """The memory of a --no-warm server after one call, while its client is still there."""
    from mcp import Client

    role = f"percall-rss-{mode}"
    async with Client(agenthold_server(db, extra={ROLE: role}), mode=mode) as client:
        await call(client, "agenthold_status", {"resource": STATUS_RESOURCE}, "available")
        return rss_mib(child_pid(role))


async def measure_per_call(
    tmp: Path, mode: str, sizes: Sizes, baseline: Path | None = None
) -> dict[str, Any]:
    """A client that starts a server for every call: warm, cold (--no-warm), bare SDK, the
    first call that finds no warm server, and (``baseline``: its agenthold command) 0.10.0."""
    import anyio

    db = tmp / f"percall-{mode}.db"
    status = ("agenthold_status", {"resource": STATUS_RESOURCE}, "available")
    runtime = tmp / f"rt-{mode}"
    runtime.mkdir(mode=0o700)
    fresh_dirs = iter(range(sizes.firsts))

    async def first() -> float:
        """A call that finds no warm server (a runtime directory of its own), and leaves one;
        stopped before the next measurement, so that none competes with it."""
        fresh = tmp / f"rt-{mode}-first-{next(fresh_dirs)}"
        fresh.mkdir(mode=0o700)
        try:
            return await per_call(agenthold_server(db, fresh), mode, *status)
        finally:
            stop_warm(fresh, started=True)

    try:
        await per_call(agenthold_server(db, runtime), mode, *status)  # leaves the warm server
        stop_warm(runtime, started=True)  # (it made the database: every kind finds it there)
        await per_call(agenthold_server(db, runtime), mode, *status)
        kinds: dict[str, Callable[[], Awaitable[float]]] = {
            "warm": lambda: per_call(agenthold_server(db, runtime), mode, *status),
            "cold": lambda: per_call(agenthold_server(db), mode, *status),
            "first": first,
            "bare_sdk": lambda: per_call(bare_server(tmp), mode, NOOP, {}),
        }
        runs = {"warm": sizes.percall, "cold": sizes.firsts, "first": sizes.firsts,
                "bare_sdk": sizes.firsts}  # fmt: skip
        if baseline is not None:  # a database of its own: 0.10.0 cannot open a newer one
            old_db = tmp / f"percall-{mode}-old.db"
            await per_call(old_server(baseline, old_db), mode, *status)  # makes it
            kinds["old"] = lambda: per_call(old_server(baseline, old_db), mode, *status)
            runs["old"] = sizes.firsts
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(max(runs.values())):  # interleaved, so load hits all alike
            for kind in kinds:
                if len(times[kind]) < runs[kind]:
                    times[kind].append(await kinds[kind]())
        pids = warm_pids(runtime)
        if len(pids) != 1:
            raise BenchError(f"expected one warm server, found {pids}")
        before = threads_cpu_seconds(pids[0])
        await anyio.sleep(IDLE_PROBE)
        idle_cpu = threads_cpu_seconds(pids[0]) - before
        rss = rss_mib(pids[0])
        cold_rss = await cold_rss_mib(db, mode)
    finally:
        stop_warm(runtime)
    out = {kind: summary(t) for kind, t in times.items()}
    return {
        **out,
        "warm_rss_mib": rss,
        "cold_rss_mib": cold_rss,
        "warm_idle_cpu_s": idle_cpu,
        "passed_median": out["warm"]["median_ms"] <= PERCALL_MEDIAN_MS,
        "passed_p99": out["warm"]["p99_ms"] <= PERCALL_P99_MS,
        "passed_first": out["first"]["median_ms"] <= out["cold"]["median_ms"] * FIRST_TOLERANCE,
        "passed_idle": idle_cpu < IDLE_TICK,
        "passed_rss": rss <= cold_rss * RSS_TOLERANCE,
    }


@contextlib.asynccontextmanager
async def open_clients(servers: list[Any], mode: str) -> AsyncIterator[list[Any]]:
    """Clients of ``servers``, started together and closed together, since a server takes half
    a second to start. Each client lives in a task of its own, as its streams require."""
    import anyio
    from mcp import Client

    clients: list[Any] = [None] * len(servers)
    opened = [anyio.Event() for _ in servers]
    done = anyio.Event()

    async def hold(i: int) -> None:
        async with Client(servers[i], mode=mode) as client:
            clients[i] = client
            opened[i].set()
            await done.wait()

    async with anyio.create_task_group() as tg:
        for i in range(len(servers)):
            tg.start_soon(hold, i)
        try:
            for event in opened:
                await event.wait()
            yield clients
        finally:
            done.set()


async def measure_era(
    tmp: Path, mode: str, sizes: Sizes, rng: random.Random, baseline: Path | None
) -> dict[str, Any]:
    """Everything for one protocol era. The measured servers start together but are measured
    one at a time; the idle ones wait on their pipes and use no CPU."""
    advanced = bench_server(tmp / f"calls-{mode}.db", "advanced")
    standard = bench_server(tmp / f"claims-{mode}.db", "standard")
    out: dict[str, Any] = {"mode": mode}
    async with open_clients([advanced, standard, standard], mode) as (client, holder, waiter):
        out["protocol_version"] = client.protocol_version
        out["calls"] = await measure_calls(client, sizes)
        registered = await call(holder, "agenthold_register", {"name": "bench"}, "registered")
        agent_id = registered["agent_id"]
        out["calls"]["pair"] = await measure_pairs(holder, agent_id, sizes)
        out["wake"] = await measure_wake(holder, waiter, agent_id, sizes.trials, rng)
    out["spawn"] = await measure_spawns(tmp, mode, sizes)
    out["per_call"] = await measure_per_call(tmp, mode, sizes, baseline)
    return out


# --------------------------------------------------------------------------------------------
# Waiting when nothing happens: the change feed on file events against the 2 ms poll
# --------------------------------------------------------------------------------------------

ROLE = "AGENTHOLD_BENCH_ROLE"  # marks a server's environment, since the SDK hides its pid


def child_pid(role: str) -> int:
    """The pid of this process's child whose environment has ROLE=role."""
    me, wanted = os.getpid(), f"{ROLE}={role}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != me:
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, ValueError):  # ended meanwhile, or not ours to read
            continue
    if len(found) != 1:
        raise BenchError(f"expected one server with {ROLE}={role}, found {found}")
    return found[0]


async def wait_idle(waiter: Any, timeout: float, answers: list[dict[str, Any]]) -> None:
    args = {"resource": IDLE_RESOURCE, "timeout_seconds": timeout}
    answers.append(await call(waiter, "agenthold_wait", args, "available"))


async def measure_feed(
    tmp: Path, tag: str, env: dict[str, str], sizes: Sizes, rng: random.Random
) -> dict[str, Any]:
    """Wake-up, and the CPU time of IN_FLIGHT waits, an idle server and an idle log --follow,
    with the servers' change feed configured by ``env``."""
    import anyio

    db = tmp / f"feed-{tag}.db"

    def role(name: str) -> dict[str, str]:
        return {**env, ROLE: f"{tag}-{name}"}

    servers = [
        bench_server(db, "standard", role("holder")),
        bench_server(db, "standard", role("waiter")),
        agenthold_server(tmp / f"feed-{tag}-floor.db", None, role("floor")),
    ]
    out: dict[str, Any] = {}
    async with open_clients(servers, "auto") as (holder, waiter, floor):
        registered = await call(holder, "agenthold_register", {"name": "bench"}, "registered")
        agent_id = registered["agent_id"]
        out["wake"] = await measure_wake(holder, waiter, agent_id, sizes.trials, rng)
        await call(floor, "agenthold_status", {"resource": STATUS_RESOURCE}, "available")
        held = {"resource": IDLE_RESOURCE, "agent_id": agent_id}
        await call(holder, "agenthold_claim", held, "claimed")
        follow = subprocess.Popen(
            [sys.executable, "-m", "agenthold", "log", "--follow", "--db", str(db)],
            env={**os.environ, **server_env(None, env)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        answers: list[dict[str, Any]] = []
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(IN_FLIGHT):
                    tg.start_soon(wait_idle, waiter, sizes.idle_window + 60, answers)
                await anyio.sleep(2.0)  # every wait has looked and sleeps; log --follow started
                if follow.poll() is not None:
                    raise BenchError(f"log --follow ended: {follow.communicate()[1]}")
                pids = {
                    "waits": child_pid(f"{tag}-waiter"),
                    "floor": child_pid(f"{tag}-floor"),
                    "follow": follow.pid,
                }
                before = {name: threads_cpu_seconds(pid) for name, pid in pids.items()}
                await anyio.sleep(sizes.idle_window)
                out["cpu_s"] = {
                    name: threads_cpu_seconds(pid) - before[name] for name, pid in pids.items()
                }
                if answers:
                    raise BenchError(f"a wait answered while the resource was held: {answers[0]}")
                await call(holder, "agenthold_release", {**held, "outcome": "modified"}, "released")
        finally:
            follow.terminate()
            follow.communicate(timeout=30)
    if len(answers) != IN_FLIGHT or any(a.get("previous_outcome") != "modified" for a in answers):
        raise BenchError(f"{IN_FLIGHT - len(answers)} waits did not see their release")
    out["cpu_percent"] = {k: 100 * v / sizes.idle_window for k, v in out["cpu_s"].items()}
    return out


async def measure_feeds(tmp: Path, sizes: Sizes, rng: random.Random) -> dict[str, Any]:
    return {
        name: await measure_feed(tmp, f"feed{i}", env, sizes, rng)
        for i, (name, env) in enumerate(FEEDS.items())
    }


# --------------------------------------------------------------------------------------------
# Another agenthold (0.10.0) through that venv's mcp 1.x client: --baseline-client
# --------------------------------------------------------------------------------------------


async def baseline_client(server: str, tmp: Path, sizes: Sizes) -> dict[str, Any]:
    """Run under the baseline venv's python: only the stdlib and its mcp 1.x."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    @contextlib.asynccontextmanager
    async def session(*args: str) -> AsyncIterator[Any]:
        params = StdioServerParameters(command=server, args=list(args), cwd=str(tmp))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            yield s

    async def call1(s: Any, name: str, args: dict[str, Any], *expect: str) -> dict[str, Any]:
        result = await s.call_tool(name, args)
        text = result.content[0].text if result.content else ""
        try:
            reply = json.loads(text)
        except ValueError:
            raise BenchError(f"{name} answered {text!r}") from None
        if (
            result.isError
            or not isinstance(reply, dict)
            or reply.get("status") not in (expect or ("ok",))
        ):
            raise BenchError(f"{name} answered {reply if reply is not None else result.content}")
        return reply

    async def wait_for(waiter: Any, woken: list[tuple[float, dict[str, Any]]]) -> None:
        args = {"resource": WAKE_RESOURCE, "timeout_seconds": WAIT_TIMEOUT}
        reply = await call1(waiter, "agenthold_wait", args, "available")
        woken.append((time.perf_counter(), reply))

    async def timed(step: Step, warmup: int, n: int) -> dict[str, Any]:
        for _ in range(warmup):
            await step()
        times = []
        for _ in range(n):
            started = time.perf_counter()
            await step()
            times.append(time.perf_counter() - started)
        return summary(times)

    out: dict[str, Any] = {}
    db = str(tmp / "baseline-calls.db")
    async with session("--db", db, "--tools", "advanced") as s:
        version = (
            await call1(
                s,
                "agenthold_set",
                {
                    "namespace": NS,
                    "key": KEY,
                    "value": {"n": 0},
                    "updated_by": "bench",
                    "expected_version": 0,
                },
            )
        )["version"]

        async def get() -> None:
            await call1(s, "agenthold_get", {"namespace": NS, "key": KEY})

        async def set_() -> None:
            nonlocal version
            args = {
                "namespace": NS,
                "key": KEY,
                "value": {"n": version},
                "updated_by": "bench",
                "expected_version": version,
            }
            version = (await call1(s, "agenthold_set", args))["version"]

        out["get"] = await timed(get, sizes.warmup, sizes.rounds)
        out["set"] = await timed(set_, sizes.warmup, sizes.rounds)

    db = str(tmp / "baseline-claims.db")
    rng = random.Random(11)
    async with session("--db", db) as holder, session("--db", db) as waiter:
        agent_id = (await call1(holder, "agenthold_register", {"name": "bench"}, "registered"))[
            "agent_id"
        ]
        pair_args = {"resource": PAIR_RESOURCE, "agent_id": agent_id}

        async def pair() -> None:
            await call1(holder, "agenthold_claim", pair_args, "claimed")
            await call1(holder, "agenthold_release", pair_args, "released")

        out["pair"] = await timed(pair, sizes.warmup, sizes.rounds)

        wake_args = {"resource": WAKE_RESOURCE, "agent_id": agent_id}
        latencies: list[float] = []
        for _ in range(sizes.trials):
            await call1(holder, "agenthold_claim", wake_args, "claimed")
            woken: list[tuple[float, dict[str, Any]]] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for, waiter, woken)
                await anyio.sleep(rng.uniform(0.020, 0.120))
                await call1(
                    holder, "agenthold_release", {**wake_args, "outcome": "modified"}, "released"
                )
                released = time.perf_counter()
            arrived, reply = woken[0]
            if reply.get("elapsed_seconds", 1.0) >= BLOCKED:
                latencies.append(max(0.0, arrived - released))
        if not latencies:
            raise BenchError("no wait blocked: every one answered before its release")
        out["wake"] = summary(latencies)

    spawns = []
    for i in range(sizes.spawns + (sizes.label == "full")):
        started = time.perf_counter()
        async with session("--db", db) as s:
            await call1(s, "agenthold_status", {"resource": STATUS_RESOURCE}, "available")
            took = time.perf_counter() - started
        if i or sizes.label != "full":  # the first full-run spawn only warms caches
            spawns.append(took)
    out["spawn"] = summary(spawns)
    per_call = []
    for _ in range(sizes.percall):  # start, initialize, one call, exit
        started = time.perf_counter()
        async with session("--db", db) as s:
            await call1(s, "agenthold_status", {"resource": STATUS_RESOURCE}, "available")
        per_call.append(time.perf_counter() - started)
    out["per_call"] = summary(per_call)
    return out


def baseline_commands(venv: Path) -> tuple[Path, Path]:
    """The python and the agenthold command of ``venv``; BenchError if either is missing."""
    python, server = venv / "bin" / "python", venv / "bin" / "agenthold"
    for needed in (python, server):
        if not needed.exists():
            raise BenchError(f"--baseline-venv: {needed} does not exist")
    return python, server


def run_baseline(venv: Path, tmp: Path, quick: bool) -> dict[str, Any]:
    """Measure the agenthold installed in ``venv`` with that venv's python and mcp."""
    python, server = baseline_commands(venv)
    argv = [str(python), str(Path(__file__).resolve()), "--baseline-client", str(server)]
    argv += ["--tmp", str(tmp)] + (["--quick"] if quick else [])
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=str(tmp))
    if done.returncode != 0:
        raise BenchError(f"the baseline run failed:\n{done.stderr.strip()[-2000:]}")
    facts = subprocess.run(  # -I: not this checkout's metadata, whatever the directory
        [str(python), "-I", "-c", "import importlib.metadata as m, platform; "
         "print(m.version('agenthold'), m.version('mcp'), platform.python_version())"],
        capture_output=True, text=True, check=True, cwd=str(tmp),
    ).stdout.split()  # fmt: skip
    results: dict[str, Any] = json.loads(done.stdout)
    results["versions"] = {"agenthold": facts[0], "mcp": facts[1], "python": facts[2]}
    return results


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def version_of(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for era in results["eras"]:
        mode = era["mode"]
        for kind, (tool, noop) in LABELS.items():
            c = era["calls"][kind]
            rows.append(
                {
                    "target": f"{mode}: {tool} median <= {noop} median + {c['target_ms']:g} ms",
                    "measured": f"{c['over_noop_ms']:+.2f} ms",
                    "passed": c["passed"],
                }
            )
        p = era["per_call"]
        rows.append(
            {
                "target": f"{mode}: per-call client, warm: median <= {PERCALL_MEDIAN_MS:g} ms",
                "measured": f"{p['warm']['median_ms']:.2f} ms",
                "passed": p["passed_median"],
            }
        )
        rows.append(
            {
                "target": f"{mode}: per-call client, warm: p99 <= {PERCALL_P99_MS:g} ms",
                "measured": f"{p['warm']['p99_ms']:.2f} ms",
                "passed": p["passed_p99"],
            }
        )
        slack = round((FIRST_TOLERANCE - 1) * 100)
        rows.append(
            {
                "target": f"{mode}: per-call client, first call: median <= --no-warm's + {slack}%",
                "measured": f"{p['first']['median_ms']:.2f} vs {p['cold']['median_ms']:.2f} ms",
                "passed": p["passed_first"],
            }
        )
        rows.append(
            {
                "target": f"{mode}: warm server idle: no CPU in {IDLE_PROBE:g} s",
                "measured": f"{p['warm_idle_cpu_s'] * 1000:.0f} ms",
                "passed": p["passed_idle"],
            }
        )
        rows.append(
            {
                "target": f"{mode}: warm server memory <= {RSS_TOLERANCE:g} x a --no-warm server's",
                "measured": f"{p['warm_rss_mib']:.1f} vs {p['cold_rss_mib']:.1f} MiB",
                "passed": p["passed_rss"],
            }
        )
        w = era["wake"]
        rows.append(
            {
                "target": f"{mode}: wake-up by another process: median <= {WAKE_MEDIAN_MS:g} ms",
                "measured": f"{w['median_ms']:.2f} ms",
                "passed": w["passed_median"],
            }
        )
        rows.append(
            {
                "target": f"{mode}: wake-up by another process: p99 <= {WAKE_P99_MS:g} ms",
                "measured": f"{w['p99_ms']:.2f} ms",
                "passed": w["passed_p99"],
            }
        )
    events = results["feeds"]["file events"]["cpu_percent"]
    for kind, label in (("waits", f"{IN_FLIGHT} waits in flight in one server"),
                        ("follow", "an idle log --follow")):  # fmt: skip
        rows.append(
            {
                "target": f"{label}: CPU < {IDLE_CPU_PERCENT:g}% of a core",
                "measured": f"{events[kind]:.3f}%",
                "passed": events[kind] < IDLE_CPU_PERCENT,
            }
        )
    return rows


def ms(value: float) -> str:
    return f"{value:.2f} ms"


def report(results: dict[str, Any]) -> str:
    m, sizes = results["machine"], results["sizes"]
    start, end = m["load_average_at_start"], m["load_average_at_end"]
    out = [
        f"agenthold MCP stdio benchmark ({sizes['label']} run)",
        f"machine: {m['cpus']} CPUs, {m['platform']}, Python {m['python']}, mcp {m['mcp']}, "
        f"agenthold {m['agenthold']}, SQLite {m['sqlite']}",
        (
            f"load average (1 min): {start:.2f} at start, {end:.2f} at end"
            if start is not None
            else "load average: unknown"
        ),
        f"per-call: {sizes['rounds']} calls of each kind after {sizes['warmup']} warm-up rounds, "
        f"tool and no-op taking turns; wake-up: {sizes['trials']} trials; "
        f"spawn: {sizes['spawns']} starts of each",
        "",
    ]
    for era in results["eras"]:
        rows = [
            [
                f"per-call cost, mode {era['mode']} (protocol {era['protocol_version']})",
                "median",
                "p99",
                "against",
                "median",
                "p99",
                "over",
                "target",
                "",
            ]
        ]
        for kind, (tool, noop) in LABELS.items():
            c = era["calls"][kind]
            rows.append(
                [
                    tool,
                    ms(c["tool"]["median_ms"]),
                    ms(c["tool"]["p99_ms"]),
                    noop,
                    ms(c["noop"]["median_ms"]),
                    ms(c["noop"]["p99_ms"]),
                    f"{c['over_noop_ms']:+.2f} ms",
                    f"<= {c['target_ms']:g} ms",
                    "pass" if c["passed"] else "MISS",
                ]
            )
        out += [table(rows), ""]
    rows = [["wake-up of agenthold_wait by another process", "median", "p99", "max", "trials"]]
    rows[0] += ["void", "wait first"]
    for era in results["eras"]:
        w = era["wake"]
        rows.append(
            [
                f"mode {era['mode']}",
                ms(w["median_ms"]),
                ms(w["p99_ms"]),
                ms(w["max_ms"]),
                str(w["n"]),
                str(w["void_trials"]),
                str(w["wait_answered_first"]),
            ]
        )
    out += [
        table(rows),
        f"(targets: median <= {WAKE_MEDIAN_MS:g} ms, p99 <= {WAKE_P99_MS:g} ms; void: the wait "
        "did not block; wait first: its reply beat the release reply, counted as 0)",
        "",
    ]
    rows = [["spawn -> first answered tools/call", "median", "min", "max", "starts"]]
    for era in results["eras"]:
        for kind, label in (("agenthold", "python -m agenthold"), ("bare_sdk", "bare mcp Server")):
            s = era["spawn"][kind]
            rows.append(
                [
                    f"mode {era['mode']}: {label}",
                    ms(s["median_ms"]),
                    ms(s["min_ms"]),
                    ms(s["max_ms"]),
                    str(s["n"]),
                ]
            )
    out += [table(rows), ""]
    window = sizes["idle_window"]
    rows = [["change feed", "wake-up median", "p99", f"CPU in {window:g} s:"]]
    rows[0] += [f"{IN_FLIGHT} waits", "idle server", "log --follow"]
    for name, feed in results["feeds"].items():
        w, cpu, pct = feed["wake"], feed["cpu_s"], feed["cpu_percent"]
        rows.append([name, ms(w["median_ms"]), ms(w["p99_ms"]), ""])
        rows[-1] += [
            f"{cpu[k] * 1000:.0f} ms ({pct[k]:.2f}%)" for k in ("waits", "floor", "follow")
        ]
    out += [
        table(rows),
        f'(mode auto, {sizes["trials"]} wake-ups each; "2 ms poll" is AGENTHOLD_FILE_EVENTS=off, '
        "what every wait did before file events; idle server: no wait, the floor)",
        "",
    ]
    base = results.get("baseline")
    rows = [["per-call client: start, initialize, 1 call, exit", "median", "p99", "max", "runs"]]
    for era in results["eras"]:
        p = era["per_call"]
        for kind, label in (
            ("warm", "python -m agenthold, warm"),
            ("first", "python -m agenthold, first call (leaves a warm server)"),
            ("cold", "python -m agenthold --no-warm"),
            ("old", f"agenthold {base['versions']['agenthold']}, same client" if base else ""),
            ("bare_sdk", "bare mcp Server"),
        ):
            if kind not in p:
                continue
            s = p[kind]
            rows.append(
                [
                    f"mode {era['mode']}: {label}",
                    ms(s["median_ms"]),
                    ms(s["p99_ms"]),
                    ms(s["max_ms"]),
                    str(s["n"]),
                ]
            )
    if base is not None:
        s = base["per_call"]
        rows.append(
            [
                f"agenthold {base['versions']['agenthold']} (mcp {base['versions']['mcp']})",
                ms(s["median_ms"]),
                ms(s["p99_ms"]),
                ms(s["max_ms"]),
                str(s["n"]),
            ]
        )
    out += [table(rows)]
    for era in results["eras"]:
        p = era["per_call"]
        out.append(
            f"mode {era['mode']}: warm server {p['warm_rss_mib']:.1f} MiB resident "
            f"(a --no-warm server {p['cold_rss_mib']:.1f} MiB), "
            f"{p['warm_idle_cpu_s'] * 1000:.0f} ms of CPU in {IDLE_PROBE:g} s idle"
        )
    out.append("")
    if base is not None:
        v = base["versions"]
        ours = {era["mode"]: era for era in results["eras"]}
        head = f"agenthold {v['agenthold']} (mcp {v['mcp']})"
        rows = [["medians (p99)", "this, auto", "this, legacy", head]]
        for kind, label in (
            ("get", "agenthold_get"),
            ("set", "agenthold_set"),
            ("pair", "claim + release"),
        ):
            cells = [label]
            for mode in MODES:
                t = ours[mode]["calls"][kind]["tool"]
                cells.append(f"{t['median_ms']:.2f} ({t['p99_ms']:.2f}) ms")
            cells.append(f"{base[kind]['median_ms']:.2f} ({base[kind]['p99_ms']:.2f}) ms")
            rows.append(cells)
        cells = ["wake-up by another process"]
        for mode in MODES:
            w = ours[mode]["wake"]
            cells.append(f"{w['median_ms']:.2f} ({w['p99_ms']:.2f}) ms")
        cells.append(f"{base['wake']['median_ms']:.2f} ({base['wake']['p99_ms']:.2f}) ms")
        rows.append(cells)
        cells = ["spawn -> first answered call"]
        for mode in MODES:
            s = ours[mode]["spawn"]["agenthold"]
            cells.append(f"{s['median_ms']:.0f} ({s['max_ms']:.0f} max) ms")
        cells.append(f"{base['spawn']['median_ms']:.0f} ({base['spawn']['max_ms']:.0f} max) ms")
        rows.append(cells)
        out += [
            table(rows),
            f"({head} runs with its own client, on Python {v['python']}; no no-op there)",
            "",
        ]
    rows = [["target", "measured", ""]]
    for t in results["targets"]:
        rows.append([t["target"], t["measured"], "pass" if t["passed"] else "MISS"])
    out.append(table(rows))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


async def run_all(
    tmp: Path, sizes: Sizes, baseline: Path | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rng = random.Random(7)
    eras = [await measure_era(tmp, mode, sizes, rng, baseline) for mode in MODES]
    return eras, await measure_feeds(tmp, sizes, rng)


def main(argv: list[str] | None = None) -> int:
    parser = options(__doc__, quick="a smoke run of about ten seconds (too small to judge)")
    parser.add_argument(
        "--baseline-venv",
        type=Path,
        metavar="DIR",
        help="also measure the agenthold installed in this venv (e.g. 0.10.0 with mcp 1.x)",
    )
    parser.add_argument("--baseline-client", metavar="SERVER", help=SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=SUPPRESS)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    import anyio

    if args.baseline_client:  # run by run_baseline, with the other venv's python
        try:
            results = anyio.run(baseline_client, args.baseline_client, args.tmp, sizes)
        except Exception as exc:
            if (error := bench_error(exc)) is None:
                raise
            print(f"mcp_bench: {error}", file=sys.stderr)
            return 1
        print(json.dumps(results))
        return 0

    if args.baseline_venv is not None:
        try:
            baseline_commands(args.baseline_venv)  # before minutes of measuring, not after
        except BenchError as exc:
            print(f"mcp_bench: {exc}", file=sys.stderr)
            return 2
    facts = machine(mcp=version_of("mcp"), agenthold=version_of("agenthold"))
    results = {"machine": facts, "sizes": asdict(sizes)}
    with tempfile.TemporaryDirectory(prefix="agenthold-mcp-bench-") as tmp:
        try:
            old = None if args.baseline_venv is None else baseline_commands(args.baseline_venv)[1]
            results["eras"], results["feeds"] = anyio.run(run_all, Path(tmp), sizes, old)
            if args.baseline_venv is not None:
                results["baseline"] = run_baseline(args.baseline_venv, Path(tmp), args.quick)
        except Exception as exc:
            if (error := bench_error(exc)) is None:
                raise
            print(f"mcp_bench: {error}", file=sys.stderr)
            return 1
    results["machine"]["load_average_at_end"] = load_average()
    results["targets"] = targets(results)
    finish(args, results, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
