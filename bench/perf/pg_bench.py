"""Throughput of StateStore on PostgreSQL beside raw psycopg running the same statements.

    python bench/perf/pg_bench.py --db postgresql://user@/dbname?host=/run/postgresql
    python bench/perf/pg_bench.py --db URL --quick      # a smoke run

Needs the ``agenthold[postgres]`` extra and a server (a Unix socket is what the targets mean).
The database (or the schema named by ``options=-csearch_path=...``) must be empty or agenthold's;
the benchmark writes namespace ``bench`` in it.

1. ``set`` with ``expected_version`` on one key, one write after another.
2. ``get`` of one key.
3. Wake-up latency of ``wait`` by a release through another server: two ``agenthold --transport
   http`` processes on the database (as on two hosts); a client of server A waits on a resource
   that a client of server B holds, and B's client releases it. Both clients are in this process,
   so one clock times them. The wake-up is timed from the release's event in ``claim_events``
   (its ``at``: the server's clock when B's release transaction took its locks, a moment before
   it committed; the server is on this host, so that clock is time.time()) to A's answer
   reaching its client. Beside it, two bounds that need no database clock: "release sent ->
   wait answered" (the release's own round trip included) and "release answered -> wait
   answered" (negative when A answers first), and the round trip of one plain call through A
   (what the MCP layers and HTTP cost, answer included). Targets, on the wake-up: median at
   most 10 ms, p99 at most 30 ms. Two baselines from the same run: the library alone (a process
   with its own Coordinator, pool and listener releases; this process's ``wait`` returns; timed
   by time.time(), one system-wide clock), and raw psycopg (that process's NOTIFY, committed,
   until a LISTEN connection of this process hears it): the floor of any wake-up by NOTIFY.

The baseline is one psycopg connection in autocommit mode doing what PostgresDatabase does for
the same call: get is the SELECT plus json.loads; set is json.dumps, a UTC timestamp, BEGIN, the
advisory locks and clock read, the SELECT of the current version, the history INSERT, the state
UPSERT, and NOTIFY with COMMIT in one round trip. The ratio store/raw is what validation, the
pool and record objects cost. Target: at least 0.7 for both. Rates are the best of several runs,
store and raw taking turns.

The store does one round trip fewer per set than the baseline: BEGIN goes with the advisory
locks (``PostgresDatabase.serialize``). The baseline sends them apart, as a plain client would.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import (
    best_rates,
    check_line,
    finish,
    load_average,
    options,
    percentile,
    pg_lock_key,
    table,
    utc_iso,
)

from agenthold.claims import Coordinator
from agenthold.resources import Workspace, WorkspaceRegistry
from agenthold.store import StateStore

# What PostgresDatabase runs for a set and a get, as the baseline runs it: the clock read under
# the namespace's shared and the key's exclusive advisory lock, the current version, the
# history row, the live row.
LOCKS = (
    "SELECT extract(epoch FROM clock_timestamp())::float8 FROM (SELECT "
    "pg_advisory_xact_lock_shared(%s::int8), pg_advisory_xact_lock(%s::int8)) AS l"
)
CURRENT = (
    "SELECT version, deleted, value, updated_by, updated_at FROM state "
    "WHERE namespace = %s AND key = %s"
)
GET = (
    "SELECT value, version, updated_by, updated_at FROM state "
    "WHERE namespace = %s AND key = %s AND deleted = 0"
)
INSERT_HISTORY = (
    "INSERT INTO state_history (namespace, key, version, value, updated_by, updated_at, "
    "event_type) VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
UPSERT = (
    "INSERT INTO state (namespace, key, value, version, updated_by, updated_at, deleted) "
    "VALUES (%s, %s, %s, %s, %s, %s, 0) ON CONFLICT (namespace, key) DO UPDATE SET "
    "value = excluded.value, version = excluded.version, updated_by = excluded.updated_by, "
    "updated_at = excluded.updated_at, deleted = 0"
)


RESOURCE = "src/app.py"
URI = "custom://bench/wake"  # the resource of the wake-ups through servers
RAW_CHANNEL = "agenthold_bench_raw"  # not agenthold's channel: its listeners need not hear it


def coordinator(url: str, root: str) -> Coordinator:
    registry = WorkspaceRegistry([Workspace("default", root)])
    return Coordinator(StateStore(url), resolver=registry)


def releaser(url: str, root: str, conn: Any) -> None:
    """Another process: claims the resource when told to, and releases it after a delay,
    answering with its time.time() right after the release committed; or sends a raw NOTIFY
    after a delay, answering with its time.time() once it committed."""
    coord = coordinator(url, root)
    agent = coord.register("releaser").agent_id
    raw = psycopg.connect(url, autocommit=True)
    conn.send("ready")
    while True:
        command = conn.recv()
        if command[0] == "claim":
            conn.send(coord.claim(RESOURCE, agent).status)
        elif command[0] == "release":
            time.sleep(command[1])
            coord.release(RESOURCE, agent, "modified")
            conn.send(time.time())
        elif command[0] == "notify":
            time.sleep(command[1])
            raw.execute(f"NOTIFY {RAW_CHANNEL}, 'x'")
            conn.send(time.time())
        else:
            break
    raw.close()
    coord.store.close()


def measure_raw_notify(url: str, mine: Any, trials: int) -> list[float]:
    """Latencies of a NOTIFY committed by the other process until this process's LISTEN
    connection hears it (the other process's time.time() after commit to ours on hearing)."""
    rng = random.Random(11)
    latencies = []
    with psycopg.connect(url, autocommit=True) as listen:
        listen.execute(f"LISTEN {RAW_CHANNEL}")
        for _ in range(trials):
            mine.send(("notify", rng.uniform(0.005, 0.015)))
            heard = None
            for _note in listen.notifies(timeout=10, stop_after=1):
                heard = time.time()
            sent: float = mine.recv()
            if heard is None:
                raise RuntimeError("the NOTIFY of the other process was not heard")
            latencies.append(heard - sent)
    return latencies


def measure_wake(url: str, trials: int) -> tuple[list[float], list[float], int]:
    """Latencies (seconds) of wake-ups by a library release in another process, of a raw
    NOTIFY from it, and how many wake-up trials did not count (the release came before the
    wait began)."""
    with tempfile.TemporaryDirectory() as root:
        coord = coordinator(url, root)
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter, as another server is
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=releaser, args=(url, root, theirs))
        proc.start()
        rng = random.Random(7)
        latencies: list[float] = []
        early = 0
        try:
            if not mine.poll(60):
                raise RuntimeError("the releasing process did not start")
            mine.recv()
            notified = measure_raw_notify(url, mine, trials)
            for _ in range(trials):
                mine.send(("claim",))
                if mine.recv() != "claimed":
                    raise RuntimeError("the releasing process could not claim")
                result: list[Any] = []
                started = threading.Event()

                def wait(started: threading.Event, result: list[Any]) -> None:
                    started.set()
                    reply = coord.wait(RESOURCE, 10)
                    result.append((time.time(), reply))

                thread = threading.Thread(target=wait, args=(started, result))
                thread.start()
                started.wait()
                mine.send(("release", rng.uniform(0.005, 0.015)))
                released: float = mine.recv()
                thread.join()
                returned, reply = result[0]
                if (
                    reply.status != "available"
                    or reply.previous is None
                    or reply.previous.outcome != "modified"
                ):
                    raise RuntimeError(f"the wait did not see its release: {reply}")
                if reply.elapsed_seconds > 0.002:
                    latencies.append(returned - released)
                else:
                    early += 1
        finally:
            mine.send(("stop",))
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
            coord.store.close()
    return latencies, notified, early


async def wake_through_servers(url: str, trials: int) -> dict[str, list[float]]:
    """Wake-ups of a wait through server A by a release through server B, for each trial the
    seconds from the release's event ("event"), its sending ("sent") and its answer ("answer")
    to the wait's answer; "early" has a 1 for each trial that did not count (the wait began
    after the release); "call" the round trips of a status call through A, for reference."""
    import anyio
    from pg_scale import call, connect, servers

    rng = random.Random(13)
    found: dict[str, list[float]] = {"event": [], "sent": [], "answer": [], "early": [], "call": []}
    last_release = (
        "SELECT at FROM claim_events WHERE event = 'released' AND uri = %s ORDER BY id DESC LIMIT 1"
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        servers(url, 2, Path(tmp)) as (one, two),
        psycopg.connect(url, autocommit=True) as raw,
    ):
        async with connect(one.url) as a, connect(two.url) as b:
            holder = (await call(b, "agenthold_register", name="releaser"))["agent_id"]
            for _ in range(trials):  # what one call through A costs, answer included
                began = time.monotonic()
                await call(a, "agenthold_status", resource=URI)
                found["call"].append(time.monotonic() - began)
            for _ in range(trials):
                claimed = await call(b, "agenthold_claim", resource=URI, agent_id=holder)
                if claimed["status"] != "claimed":
                    raise RuntimeError(f"server B could not claim: {claimed}")
                answered: list[tuple[float, float, dict[str, Any]]] = []

                async def wait(answered: list[tuple[float, float, dict[str, Any]]]) -> None:
                    reply = await call(a, "agenthold_wait", resource=URI, timeout_seconds=10)
                    answered.append((time.monotonic(), time.time(), reply))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait, answered)
                    await anyio.sleep(rng.uniform(0.04, 0.06))  # A's wait is asleep by now
                    sent = time.monotonic()
                    released = await call(
                        b, "agenthold_release", resource=URI, agent_id=holder, outcome="modified"
                    )
                    acked = time.monotonic()
                returned, returned_at, reply = answered[0]
                seen = (reply["status"], reply.get("previous_outcome"))
                if released["status"] != "released" or seen != ("available", "modified"):
                    raise RuntimeError(f"the wait did not see its release: {released} {reply}")
                if reply["elapsed_seconds"] < 0.02:  # it began after the release committed
                    found["early"].append(1)
                    continue
                row = raw.execute(last_release, (released["resource"],)).fetchone()
                found["event"].append(returned_at - datetime.fromisoformat(row[0]).timestamp())
                found["sent"].append(returned - sent)
                found["answer"].append(returned - acked)
    return found


def measure_rates(url: str, n: int, repeats: int) -> dict[str, dict[str, float]]:
    """set and get per second through StateStore and through raw psycopg, taking turns."""
    store = StateStore(url)
    store.set("bench", "occ", 0, updated_by="bench")
    store.set("bench", "raw", 0, updated_by="bench")
    raw = psycopg.connect(url, autocommit=True)
    ns_lock, key_lock = pg_lock_key("state\x1fbench"), pg_lock_key("state\x1fbench\x1fraw")

    def store_set(count: int) -> None:
        version = store.get("bench", "occ").version
        for i in range(count):
            version = store.set(
                "bench", "occ", {"i": i}, updated_by="bench", expected_version=version
            ).version

    def raw_set(count: int) -> None:
        for i in range(count):
            text = json.dumps({"i": i}, separators=(",", ":"))
            now = utc_iso()
            raw.execute("BEGIN")
            raw.execute(LOCKS, (ns_lock, key_lock))
            row = raw.execute(CURRENT, ("bench", "raw")).fetchone()
            assert row is not None
            version = row[0] + 1
            raw.execute(INSERT_HISTORY, ("bench", "raw", version, text, "bench", now, "write"))
            raw.execute(UPSERT, ("bench", "raw", text, version, "bench", now))
            raw.execute("""NOTIFY agenthold, '[["k","bench","raw"]]'; COMMIT""")

    def store_get(count: int) -> None:
        for _ in range(count):
            store.get("bench", "occ")

    def raw_get(count: int) -> None:
        for _ in range(count):
            row = raw.execute(GET, ("bench", "raw")).fetchone()
            json.loads(row[0])

    try:
        sets = best_rates({"store": store_set, "raw": raw_set}, n, repeats)
        gets = best_rates({"store": store_get, "raw": raw_get}, n * 3, repeats)
    finally:
        raw.close()
        store.close()
    return {"set (expected_version)": sets, "get": gets}


def stats(seconds: list[float]) -> tuple[float, float, list[str]]:
    """Median and p99 of ``seconds`` in ms, and the table cells: trials, median, p99, max."""
    ms = sorted(x * 1000 for x in seconds)
    median, p99 = statistics.median(ms), percentile(ms, 99)
    return median, p99, [str(len(ms)), f"{median:.2f}", f"{p99:.2f}", f"{ms[-1]:.2f}"]


def report(results: dict[str, Any]) -> str:
    out = [f"load average {results['load_average_at_start'] or 0:.2f} at start "
           "(2 CPUs shared: see uptime)"]  # fmt: skip
    rows = [["operation", "store/s", "raw psycopg/s", "ratio"]]
    checks = []
    for name, rates in results["rates"].items():
        ratio = rates["store"] / rates["raw"]
        rows.append([name, f"{rates['store']:,.0f}", f"{rates['raw']:,.0f}", f"{ratio:.2f}"])
        checks.append(check_line(ratio >= 0.7, f"{name} at least 0.7 of raw", f"{ratio:.2f}"))
    out += [table(rows), ""]
    through, wake = results["through_servers"], results["wake"]
    median, p99, woken = stats(through["event"])
    out.append(
        table(
            [
                ["wake-up of wait by a release elsewhere", "trials", "median ms", "p99 ms",
                 "max ms"],
                ["via server B -> via server A: release committed -> wait answered", *woken],
                ["  bound: release sent -> wait answered", *stats(through["sent"])[2]],
                ["  bound: release answered -> wait answered", *stats(through["answer"])[2]],
                ["  reference: one agenthold_status call via server A, round trip",
                 *stats(through["call"])[2]],
                ["baseline, library: release in another process -> wait returned",
                 *stats(wake["library"])[2]],
                ["baseline, raw psycopg: NOTIFY in another process -> LISTEN heard",
                 *stats(wake["raw"])[2]],
            ]
        )
    )  # fmt: skip
    early = wake["early"] + len(through["early"])
    if early:
        out.append(f"({early} trials released before the wait began; not counted)")
    checks.append(
        check_line(median <= 10, "wake-up through another server: median at most 10 ms",
                   f"{median:.2f} ms")
    )  # fmt: skip
    checks.append(
        check_line(p99 <= 30, "wake-up through another server: p99 at most 30 ms",
                   f"{p99:.2f} ms")
    )  # fmt: skip
    out.append("\n".join(checks))
    out.append(f"load average {results['load_average_at_end'] or 0:.2f} at end")
    return "\n".join(out)


def main() -> int:
    parser = options(__doc__)
    parser.add_argument("--db", required=True, help="a postgresql:// URL")
    args = parser.parse_args()
    n, repeats, trials = (200, 2, 10) if args.quick else (3000, 5, 200)
    results: dict[str, Any] = {"load_average_at_start": load_average()}
    results["rates"] = measure_rates(args.db, n, repeats)
    latencies, notified, early = measure_wake(args.db, trials)
    results["wake"] = {"library": latencies, "raw": notified, "early": early}
    import anyio

    results["through_servers"] = anyio.run(wake_through_servers, args.db, trials)
    results["load_average_at_end"] = load_average()
    finish(args, results, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
