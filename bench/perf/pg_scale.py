"""Scaling over HTTP: 1, 2 and 4 ``agenthold --transport http`` processes (standard tools) on one
database, 16 clients doing claim and release on resources of their own, on PostgreSQL and on
SQLite.

    python bench/perf/pg_scale.py --db postgresql://user@/dbname?host=/run/postgresql
    python bench/perf/pg_scale.py --db URL --quick        # a smoke run (too small to judge)

Each client is an ``mcp.Client`` over Streamable HTTP (all 16 in this one process, on asyncio),
bound to server ``i % N``; it registers an agent, then claims and releases its own resource
(``custom://scale/<i>``) again and again. The figure is calls per second over all clients,
counted after a warm-up; the baseline is the same load on one server. Every reply is checked
("claimed", then "released"), so a rate never counts a failed call.

The CPU seconds of each side are printed beside the rates (this process, the agenthold servers,
and, on PostgreSQL, the server backends of their connections, read from /proc): on a machine of
few cores, they show where the time goes when adding servers stops helping. On PostgreSQL,
"lock waiters" is the mean number of sessions waiting for an advisory lock (sampled every
20 ms): claim writes of one database take turns on one (the claims lock), whatever the servers.
PostgreSQL runs in a new schema of the URL's database for each row; SQLite on a file in a
temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import ROOT, finish, free_port, load_average, options, process_cpu_seconds, table


class Server:
    def __init__(self, db: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agenthold", "--db", db, "--transport", "http",
                 "--port", str(self.port), "--claim-ttl", "3600"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
            )  # fmt: skip

    def wait_serving(self) -> None:
        deadline = time.monotonic() + 60
        while "serving" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {self.log.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def servers(db: str, count: int, tmp: Path) -> Iterator[list[Server]]:
    started = [Server(db, tmp / f"server-{i}.log") for i in range(count)]
    try:
        for s in started:
            s.wait_serving()
        yield started
    finally:
        for s in started:
            s.stop()


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        await client.list_tools()
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error or result.structured_content is None:
        raise RuntimeError(f"{tool}: {result.content}")
    reply: dict[str, Any] = result.structured_content
    return reply


async def drive(urls: list[str], clients: int, warm_up: float, seconds: float) -> float:
    """Calls per second of ``clients`` claim/release loops, counted for ``seconds`` after
    ``warm_up``."""
    counted = [0] * clients
    start = time.monotonic() + warm_up
    end = start + seconds

    async def one(i: int) -> None:
        async with connect(urls[i % len(urls)]) as c:
            agent = (await call(c, "agenthold_register", name=f"scale-{i}"))["agent_id"]
            uri = f"custom://scale/{i}"
            while time.monotonic() < end:
                claimed = await call(c, "agenthold_claim", resource=uri, agent_id=agent)
                released = await call(c, "agenthold_release", resource=uri, agent_id=agent)
                if claimed["status"] != "claimed" or released["status"] != "released":
                    raise RuntimeError(f"client {i}: {claimed} {released}")
                if start <= time.monotonic() < end:
                    counted[i] += 2

    async with anyio.create_task_group() as tg:
        for i in range(clients):
            tg.start_soon(one, i)
    return sum(counted) / seconds


def backend_pids(url: str) -> list[int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchall()
    return [r[0] for r in rows]


@contextlib.contextmanager
def lock_waiters(url: str) -> Iterator[list[int]]:
    """Sample, every 20 ms while the block runs, how many sessions of the database wait for an
    advisory lock (the claims lock: claim writes of one database take turns on it)."""
    import threading

    import psycopg

    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not done.wait(0.02):
                row = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()
                samples.append(int(row[0]) if row else 0)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(10)


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += process_cpu_seconds(pid)
    return total


def new_schema(url: str) -> str:
    import psycopg

    name = f"scale_{os.getpid()}_{random.randrange(10**6)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{name}"


def measure(
    backend: str, db: str, count: int, clients: int, warm_up: float, seconds: float, tmp: Path
) -> list[str]:
    from agenthold.store import StateStore

    StateStore(db).close()  # every server starts on a ready database
    with servers(db, count, tmp) as started:
        me0 = resource.getrusage(resource.RUSAGE_SELF)
        srv0 = cpu_of([s.proc.pid for s in started])
        pids = backend_pids(db) if backend == "postgresql" else []
        pg0 = cpu_of(pids)
        began = time.monotonic()
        sampling = lock_waiters(db) if backend == "postgresql" else contextlib.nullcontext([])
        with sampling as waiting:
            rate = anyio.run(drive, [s.url for s in started], clients, warm_up, seconds)
        wall = time.monotonic() - began
        if backend == "postgresql":  # connections the pools opened during the run count too
            pids = sorted(set(pids) | set(backend_pids(db)))
        pg = cpu_of(pids) - pg0
        srv = cpu_of([s.proc.pid for s in started]) - srv0
        me1 = resource.getrusage(resource.RUSAGE_SELF)
    me = (me1.ru_utime + me1.ru_stime) - (me0.ru_utime + me0.ru_stime)
    waiters = f"{sum(waiting) / len(waiting):.1f}" if waiting else "-"
    return [backend, str(count), f"{rate:,.0f}", f"{srv / wall:.2f}",
            f"{pg / wall:.2f}" if backend == "postgresql" else "-", f"{me / wall:.2f}",
            waiters]  # fmt: skip


def main() -> int:
    parser = options(__doc__)
    parser.add_argument("--db", required=True, help="a postgresql:// URL")
    parser.add_argument("--servers", default="1,2,4")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each row; the best counts")
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    args = parser.parse_args()
    counts = [int(n) for n in args.servers.split(",")]
    seconds, warm_up, repeats = (1.0, 0.5, 1) if args.quick else (args.seconds, 2.0, args.repeats)
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_average_at_start": load_average(),
        "clients": args.clients,
        "seconds": seconds,
        "warm_up": warm_up,
        "repeats": repeats,
    }
    if not args.json:
        print(heading(results), flush=True)
    rows = [["backend", "servers", "calls/s", "CPU/s servers", "CPU/s postgres", "CPU/s clients",
             "lock waiters"]]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="agenthold-scale-") as tmp:
        for backend in ("postgresql", "sqlite"):
            if args.only and backend != args.only:
                continue
            for count in counts:
                best: list[str] | None = None
                for r in range(repeats):
                    if backend == "postgresql":
                        db = new_schema(args.db)
                    else:
                        db = str(Path(tmp) / f"scale-{count}-{r}.db")
                    row = measure(backend, db, count, args.clients, warm_up, seconds, Path(tmp))
                    if best is None or float(row[2].replace(",", "")) > float(
                        best[2].replace(",", "")
                    ):
                        best = row
                assert best is not None
                rows.append(best)
                if not args.json:  # each row as it is measured: a full run takes minutes
                    print("  " + "  ".join(best), flush=True)
    results["rows"] = rows
    results["load_average_at_end"] = load_average()
    finish(args, results, report)
    return 0


def heading(results: dict[str, Any]) -> str:
    return (
        f"{results['cpus']} CPUs, load average {results['load_average_at_start'] or 0:.2f} at "
        f"start; {results['clients']} clients, {results['seconds']:g} s counted after "
        f"{results['warm_up']:g} s, best of {results['repeats']}"
    )


def report(results: dict[str, Any]) -> str:
    return (
        f"\n{table(results['rows'])}\nload average {results['load_average_at_end'] or 0:.2f} at end"
    )


if __name__ == "__main__":
    raise SystemExit(main())
