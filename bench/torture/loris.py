"""The slow-loris scenario of bench/torture/torture.py, and the attacking process it starts.

    python bench/torture/torture.py --scenario loris                   # 5,000 slow connections
    python bench/torture/torture.py --scenario loris --connections 300 --seconds 4
    python bench/torture/loris.py attack PORT COUNT SECONDS    # the attacker alone

One ``agenthold --transport http`` server with a bearer token and its default bounds. A
legitimate client (mcp.Client over HTTP with the token, the 2026-07-28 protocol) claims and
releases a resource, one call every PACE seconds, first alone (the baseline, in the same run),
then while another process holds ``connections`` slow connections without a token: each sends
half a request head and then one byte every TRICKLE seconds, and when the server drops it,
connects again RECONNECT seconds later, so the pressure never lets up. After the calls of each
phase, NEWCOMERS new legitimate clients connect one by one (each timed from connecting, through
listing the tools, to its first answer).

Checked: every legitimate call answered without an error; their p99 under attack within
P99_TARGET; every new legitimate client served; the server's open descriptors stay below its
limit; its standard error has no traceback and at most one count line per 10 s (plus the last,
at exit); it exits 0 on SIGTERM. The attacker runs in its own process so that the legitimate
client's figures are the server's, not those of an event loop shared with 5,000 sockets, and
at a lower priority (nice 10), as a remote attacker would not take the server's CPU; on a busy
machine the figures still vary from run to run, so compare the two rows of one run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the checkers, beside this
from checks import Checks
from harness import ServerOutput, free_port, percentile, process_cpu_seconds

HERE = Path(__file__).resolve().parent

TOKEN = "torture-loris-token"
PACE = 0.02  # seconds between the legitimate client's calls
TRICKLE = 1.0  # seconds between the bytes of a slow client
RECONNECT = 1.0  # seconds before a dropped slow client connects again
RAMP = 1_000  # slow connections opened per second at the start
SLICES = 50  # the slow clients' bytes are spread over this many slices of TRICKLE
P99_TARGET = 0.100  # seconds: the legitimate client's p99 under attack
NEWCOMERS = 5  # new legitimate clients, alone and under attack
LOG_EVERY = 10.0  # the server's count lines come this often at most (http.REFUSALS_EVERY)


# --------------------------------------------------------------------------------------------
# The attacker (its own process)
# --------------------------------------------------------------------------------------------


class Slow(asyncio.Protocol):
    """One slow client: half a request head at once, then a byte per TRICKLE seconds (sent by
    the attack's clock, not by a task of its own: 5,000 connections cost the attacker little)."""

    def __init__(self, tally: dict[str, int]) -> None:
        self.tally = tally
        self.transport: asyncio.Transport | None = None
        self.gone = asyncio.get_running_loop().create_future()
        self.answer = b""
        self.slice = random.randrange(SLICES)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ")

    def data_received(self, data: bytes) -> None:
        self.answer += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.gone.done():
            self.gone.set_result(None)

    def trickle(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"a")  # one more byte of the head, never its end


async def attack(port: int, count: int, seconds: float, seed: int) -> dict[str, int]:
    """Hold ``count`` slow connections for ``seconds``; what happened to them. Prints "ramped"
    on stdout (flushed) once every one was opened once."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    tally = {"connects": 0, "failed connects": 0, "answered 408": 0, "answered 503": 0}
    tally.update({"closed by the server": 0, "open": 0, "most open": 0})
    live: set[Slow] = set()
    end = time.monotonic() + seconds

    first: set[int] = set()  # the slow clients that connected at least once

    async def one(n: int) -> None:
        await asyncio.sleep(n / RAMP)
        while time.monotonic() < end:
            try:
                _, slow = await asyncio.wait_for(
                    loop.create_connection(lambda: Slow(tally), "127.0.0.1", port), 10
                )
            except (OSError, asyncio.TimeoutError):
                tally["failed connects"] += 1
                await asyncio.sleep(RECONNECT)
                continue
            tally["connects"] += 1
            first.add(n)
            tally["open"] += 1
            tally["most open"] = max(tally["most open"], tally["open"])
            live.add(slow)
            await asyncio.wait([slow.gone], timeout=max(0.0, end - time.monotonic()))
            live.discard(slow)
            tally["open"] -= 1
            if slow.answer.startswith(b"HTTP/1.1 408"):
                tally["answered 408"] += 1
            elif slow.answer.startswith(b"HTTP/1.1 503"):
                tally["answered 503"] += 1
            elif slow.gone.done():
                tally["closed by the server"] += 1
            if slow.transport is not None:
                slow.transport.abort()
            await asyncio.sleep(RECONNECT * (0.5 + rng.random()))

    async def clock() -> None:  # each connection's byte in its own slice of TRICKLE seconds
        ramped = False
        tick = 0
        while time.monotonic() < end:
            await asyncio.sleep(TRICKLE / SLICES)
            tick += 1
            for slow in list(live):
                if slow.slice == tick % SLICES:
                    slow.trickle()
            if not ramped and len(first) == count:
                ramped = True
                print("ramped", flush=True)

    ticking = asyncio.ensure_future(clock())
    await asyncio.gather(*(one(n) for n in range(count)))
    ticking.cancel()
    return tally


def attacker_main(argv: list[str]) -> None:
    port, count, seconds = int(argv[0]), int(argv[1]), float(argv[2])
    seed = int(argv[3]) if len(argv) > 3 else 0
    os.nice(10)  # an attacker elsewhere would not take this machine's CPU from the server
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 64 <= hard or (soft < count + 64 and hard == resource.RLIM_INFINITY):
        resource.setrlimit(resource.RLIMIT_NOFILE, (count + 64, hard))
    tally = asyncio.run(attack(port, count, seconds, seed))
    print(json.dumps(tally), flush=True)


# --------------------------------------------------------------------------------------------
# The scenario (in bench/torture/torture.py's process)
# --------------------------------------------------------------------------------------------


class Served:
    """``python -m agenthold --transport http`` with TOKEN on a free port; stderr kept."""

    def __init__(self, work: Path, db: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agenthold", "--db", str(db), "--transport", "http",
             "--port", str(self.port), "--claim-ttl", "60"],
            cwd=work,
            env={**os.environ, "AGENTHOLD_AUTH_TOKEN": TOKEN},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.output = ServerOutput(self.proc)
        self.lines = self.output.lines

    def descriptors(self) -> tuple[int, int]:
        """Open descriptors now, and the soft limit, from /proc."""
        fds = len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        limits = Path(f"/proc/{self.proc.pid}/limits").read_text().splitlines()
        line = next(x for x in limits if x.startswith("Max open files"))
        return fds, int(line.split()[3])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(30)
        finally:
            self.output.reader.join(5)


async def legit_calls(
    url: str, seconds: float, latencies: list[float], errors: list[str], resource: str
) -> None:
    """Claim and release ``resource``, a call every PACE seconds for ``seconds``."""
    import anyio

    async with legit_client(url) as client:
        agent = (await client.call_tool("agenthold_register", {"name": "legit"})).structured_content
        assert agent is not None
        arguments = {"resource": resource, "agent_id": agent["agent_id"]}
        tools = ("agenthold_claim", "agenthold_release")
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            started = time.perf_counter()
            result = await client.call_tool(tools[n % 2], arguments)
            latencies.append(time.perf_counter() - started)
            if result.is_error or not result.structured_content:
                errors.append(f"{tools[n % 2]}: {result.content}")
            n += 1
            await anyio.sleep(max(0.0, PACE - (time.perf_counter() - started)))


def legit_client(url: str) -> Any:
    import contextlib

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    @contextlib.asynccontextmanager
    async def opened() -> Any:
        async with (
            httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {TOKEN}"}, timeout=httpx2.Timeout(30)
            ) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            await client.list_tools()
            yield client

    return opened()


async def newcomers(url: str, count: int, firsts: list[float], errors: list[str]) -> None:
    """``count`` new legitimate clients, one after the other: how long each took to connect,
    list the tools and make its first call."""
    import anyio

    for _ in range(count):
        try:
            with anyio.fail_after(30):
                started = time.perf_counter()
                async with legit_client(url) as client:
                    result = await client.call_tool("agenthold_status", {"resource": "loris.md"})
                    firsts.append(time.perf_counter() - started)
                    if result.is_error:
                        errors.append(f"newcomer: {result.content}")
        except Exception as exc:  # a bench reports every failure and goes on
            errors.append(f"newcomer: {type(exc).__name__}: {exc}")
        await anyio.sleep(0.2)


def server_counts(lines: list[str]) -> dict[str, int]:
    """The server's count lines, summed by kind (the first word after each number)."""
    found: dict[str, int] = {}
    for line in lines:
        for number, kind in re.findall(r"([\d,]+) (displaced|dropped|refused|not accepted)", line):
            found[kind.split()[0]] = found.get(kind.split()[0], 0) + int(number.replace(",", ""))
    return found


def row(name: str, values: list[float]) -> list[str]:
    if not values:
        return [name, "0", "-", "-", "-", "-"]
    ms = [v * 1000 for v in values]
    cells = [percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), max(ms)]
    return [name, f"{len(ms):,}", *(f"{c:.1f}" for c in cells)]


def run_loris(
    work: Path, *, connections: int, seconds: float, seed: int
) -> tuple[list[tuple[str, str]], Checks, list[list[str]]]:
    """The scenario: its figures, its checks and the latency table."""
    import anyio

    checks = Checks()
    figures: list[tuple[str, str]] = []
    served = Served(work, work / "loris.db")
    alone: list[float] = []
    attacked: list[float] = []
    firsts_alone: list[float] = []
    firsts: list[float] = []
    errors: list[str] = []
    peaks = {"descriptors": 0, "limit": 0}
    busy = {"alone": 0.0, "attacked": 0.0, "attacker": 0.0}  # share of a core while calling
    attacker: subprocess.Popen[str] | None = None
    tally: dict[str, int] = {}
    attack_seconds = 0.0
    try:
        served.output.wait_serving("the server")
        anyio.run(newcomers, served.url, 1, [], errors)  # the server's first call warms it
        cpu = process_cpu_seconds(served.proc.pid), time.monotonic()
        anyio.run(legit_calls, served.url, seconds, alone, errors, "alone.md")
        busy["alone"] = (process_cpu_seconds(served.proc.pid) - cpu[0]) / (
            time.monotonic() - cpu[1]
        )
        anyio.run(newcomers, served.url, NEWCOMERS, firsts_alone, errors)
        attack_started = time.monotonic()
        attacker = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "attack", str(served.port),
             str(connections), str(seconds + connections / RAMP + 3), str(seed)],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert attacker.stdout is not None
        for line in attacker.stdout:  # until every slow connection was opened once
            if line.startswith("ramped"):
                break
        stop_sampling = threading.Event()

        def sample() -> None:
            while not stop_sampling.wait(1.0):
                fds, peaks["limit"] = served.descriptors()
                peaks["descriptors"] = max(peaks["descriptors"], fds)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        cpu = process_cpu_seconds(served.proc.pid), time.monotonic()
        attacker_cpu = process_cpu_seconds(attacker.pid)
        anyio.run(legit_calls, served.url, seconds, attacked, errors, "attacked.md")
        spent = time.monotonic() - cpu[1]
        busy["attacked"] = (process_cpu_seconds(served.proc.pid) - cpu[0]) / spent
        busy["attacker"] = (process_cpu_seconds(attacker.pid) - attacker_cpu) / spent
        anyio.run(newcomers, served.url, NEWCOMERS, firsts, errors)
        stop_sampling.set()
        sampler.join(5)
        last = ""
        for line in attacker.stdout:
            last = line
        attacker.wait(60)
        attack_seconds = time.monotonic() - attack_started
        tally = json.loads(last) if last.startswith("{") else {}
    finally:
        if attacker is not None and attacker.poll() is None:
            attacker.kill()
            attacker.wait(30)
        code = served.stop()
    limit = peaks["limit"]
    stderr = "".join(served.lines)
    count_lines = [line for line in served.lines if "connections in the last" in line]
    p99 = percentile(attacked, 99) if attacked else float("inf")
    checks.expect(
        "every legitimate call answered without an error",
        errors,
        f"{len(alone) + len(attacked):,} calls, {len(firsts_alone) + len(firsts)} new clients",
    )
    checks.expect(
        f"the legitimate client's p99 under attack is within {P99_TARGET * 1000:.0f} ms",
        [] if p99 <= P99_TARGET else [f"p99 {p99 * 1000:.1f} ms"],
        f"p99 {p99 * 1000:.1f} ms (alone: {percentile(alone, 99) * 1000:.1f} ms)",
    )
    checks.expect(
        "new legitimate clients are served under attack",
        [] if len(firsts) == NEWCOMERS else [f"only {len(firsts)} of {NEWCOMERS} served"],
        f"{len(firsts)} of {NEWCOMERS} served",
    )
    checks.expect(
        "the server's open descriptors stay below its limit",
        [] if 0 < peaks["descriptors"] < limit else [f"{peaks['descriptors']} of {limit}"],
        f"highest {peaks['descriptors']:,} of {limit:,}",
    )
    most_lines = int(attack_seconds / LOG_EVERY) + 3  # an interval's line, and the last at exit
    checks.expect(
        "stderr: no traceback, refusals only counted (one line per 10 s at most)",
        (["a traceback: " + stderr[-300:]] if "Traceback" in stderr else [])
        + ([f"{len(count_lines)} count lines"] if len(count_lines) > most_lines else []),
        f"{len(served.lines)} lines, {len(count_lines)} of them counts",
    )
    checks.expect(
        "the server stops on SIGTERM with status 0", [] if code == 0 else [f"exit {code}"], "0"
    )
    counted = server_counts(count_lines)
    figures += [
        ("slow connections the attacker held at once, at most", f"{tally.get('most open', 0):,}"),
        ("slow connections made, in all", f"{tally.get('connects', 0):,}"),
        ("answered 408 (head deadline) / 503 (all served)", f"{tally.get('answered 408', 0):,} / "
         f"{tally.get('answered 503', 0):,}"),
        ("closed without a word (displaced at the limit)",
         f"{tally.get('closed by the server', 0):,}"),
        ("server counted: displaced / dropped at the head deadline / refused", " / ".join(
            f"{counted.get(k, 0):,}" for k in ("displaced", "dropped", "refused"))),
        ("server: highest open descriptors / soft limit", f"{peaks['descriptors']:,} / {limit:,}"),
        ("server's CPU while the client calls: alone / attacked (attacker's)",
         f"{busy['alone']:.0%} / {busy['attacked']:.0%} ({busy['attacker']:.0%})"),
    ]  # fmt: skip
    series = [
        ["legitimate client (ms)", "calls", "p50", "p90", "p99", "max"],
        row("claim/release, alone (baseline)", alone),
        row(f"claim/release, {connections:,} slow connections", attacked),
        row("new client (connect, list, call), alone", firsts_alone),
        row(f"new client (connect, list, call), {connections:,} slow", firsts),
    ]
    return figures, checks, series


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command != "attack":
        sys.exit(f"unknown command {command!r}; see the module's opening lines")
    attacker_main(rest)
