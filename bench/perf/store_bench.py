"""Throughput of agenthold's StateStore, each number measured beside raw sqlite3 doing the same.

    python bench/perf/store_bench.py            # the full run, about a minute
    python bench/perf/store_bench.py --quick    # a smoke run of a few seconds (too small to judge)
    python bench/perf/store_bench.py --json     # the same results as JSON instead of tables

What is measured, on files in a temporary directory, with the default durability ("normal": WAL
and synchronous NORMAL):

1. ``set`` with ``expected_version`` on one key, one write after another.
2. ``get`` of one key.
3. Contention: 4 processes each add 1 to one key 500 times with the conflict-retry loop (get,
   compute, set with expected_version; on ConflictError get again and retry). The final value
   must be exactly 2000. Reports increments per second and how many writes met a conflict.
4. A database holding 1,000,000 history rows (10,000 keys x 100 versions, bulk-inserted):
   ``get``, ``set`` and ``history(limit=10)`` there against an otherwise empty database, and
   ``list_keys`` of its 10,000-key namespace.

The baseline. Each measurement also runs on a raw ``sqlite3`` connection to a database of the same
schema (made by a StateStore, then opened raw with WAL and synchronous NORMAL). The raw side runs
the SQL statements store.py runs for the same calls, written out below: get is the SELECT plus
json.loads of the value; set is json.dumps of the value, a UTC timestamp, BEGIN IMMEDIATE, the
SELECT of the current version, the history INSERT, the state UPSERT and COMMIT.
The raw contention baseline holds the write lock from read to write (BEGIN IMMEDIATE around
read, increment, write), so it never conflicts. The ratio store/raw is what validation, locking
and record objects cost.

Rates are the best of several runs, store and raw taking turns, because on a shared machine the
best run is the one least disturbed by other work; times (list_keys) are medians. The exit status
is 1 only when a correctness check fails (a lost increment); a missed speed target is reported,
not fatal, since speed depends on the machine.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import (
    Loop,
    as_targets,
    best_rates,
    finish,
    machine,
    machine_line,
    median_seconds,
    options,
    raw_connection,
    table,
    target_lines,
    utc_iso,
)

from agenthold.store import ConflictError, StateStore

# The statements StateStore runs for get, history, list_keys and set on SQLite, as the baseline
# runs them.
_GET = (
    "SELECT value, version, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND key = ? AND deleted = 0"
)
_CURRENT = (
    "SELECT version, deleted, value, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND key = ?"
)
_HISTORY = (
    "SELECT version, value, updated_by, updated_at, event_type, principal FROM state_history "
    "WHERE namespace = ? AND key = ? ORDER BY version DESC LIMIT ?"
)
_LIST = (
    "SELECT key, value, version, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND deleted = 0 ORDER BY key"
)
_INSERT_HISTORY = (
    "INSERT INTO state_history (namespace, key, version, value, updated_by, updated_at, "
    "event_type) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_UPSERT = (
    "INSERT INTO state (namespace, key, value, version, updated_by, updated_at, deleted) "
    "VALUES (?, ?, ?, ?, ?, ?, 0) ON CONFLICT (namespace, key) DO UPDATE SET "
    "value = excluded.value, version = excluded.version, updated_by = excluded.updated_by, "
    "updated_at = excluded.updated_at, deleted = 0"
)

NS = "bench"  # the namespace of the measured key
KEY = "k"
BIG_NS = "big"  # the bulk-built namespace of the large database
WRITER = "bench"
NOTE = "a small JSON object, like most agent state"
HISTORY_DEPTH = 20  # writes of the measured key before timing, so history(limit=10) finds 10


@dataclass(frozen=True)
class Sizes:
    label: str
    repeats: int  # runs of each rate measurement; the best counts
    set_ops: int
    get_ops: int
    history_ops: int
    workers: int  # processes in the contention run
    increments: int  # per worker
    big_keys: int  # keys of the large database's namespace (list_keys reads them all)
    big_versions: int  # history rows per key of the large database
    list_runs: int  # list_keys calls; the median counts


FULL = Sizes("full", 3, 10_000, 100_000, 30_000, 4, 500, 10_000, 100, 9)
QUICK = Sizes("quick", 2, 300, 3_000, 1_000, 4, 25, 500, 10, 3)


# --------------------------------------------------------------------------------------------
# The raw sqlite3 baseline
# --------------------------------------------------------------------------------------------


def make_database(path: Path) -> None:
    """Create an agenthold database (schema, pragmas) at ``path`` and close it."""
    StateStore(path).close()


class RawStore:
    """store.py's statements on one plain sqlite3 connection, and nothing else."""

    def __init__(self, path: Path) -> None:
        self.conn = raw_connection(path)
        self.cur = self.conn.cursor()

    def close(self) -> None:
        self.conn.close()

    def get(self, namespace: str, key: str) -> tuple[Any, int]:
        value, version, _by, _at = self.cur.execute(_GET, (namespace, key)).fetchone()
        return json.loads(value), version

    def history(self, namespace: str, key: str, limit: int) -> list[tuple[Any, ...]]:
        rows = self.cur.execute(_HISTORY, (namespace, key, limit)).fetchall()
        return [(v, json.loads(val), by, at, ev, p) for v, val, by, at, ev, p in rows]

    def list_keys(self, namespace: str) -> list[tuple[Any, ...]]:
        rows = self.cur.execute(_LIST, (namespace,)).fetchall()
        return [(k, json.loads(v), ver, by, at) for k, v, ver, by, at in rows]

    def set(self, namespace: str, key: str, value: Any, writer: str, expected_version: int) -> int:
        """Write like StateStore.set with expected_version; return the new version."""
        text = json.dumps(value, separators=(",", ":"))
        now = utc_iso()
        cur = self.cur
        cur.execute("BEGIN IMMEDIATE")
        try:
            row = cur.execute(_CURRENT, (namespace, key)).fetchone()
            live = row[0] if row and not row[1] else 0
            if live != expected_version:
                raise RuntimeError(f"raw baseline: expected version {expected_version}, not {live}")
            version = row[0] + 1 if row else 1
            cur.execute(_INSERT_HISTORY, (namespace, key, version, text, writer, now, "write"))
            cur.execute(_UPSERT, (namespace, key, text, version, writer, now))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return version

    def increment(self, namespace: str, key: str, writer: str) -> None:
        """Add 1 to an integer value, holding the write lock from the read to the write."""
        now = utc_iso()
        cur = self.cur
        cur.execute("BEGIN IMMEDIATE")
        try:
            row = cur.execute(_CURRENT, (namespace, key)).fetchone()
            version = row[0] + 1
            text = json.dumps(json.loads(row[2]) + 1)
            cur.execute(_INSERT_HISTORY, (namespace, key, version, text, writer, now, "write"))
            cur.execute(_UPSERT, (namespace, key, text, version, writer, now))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def store_set_loop(store: StateStore, key: str = KEY) -> Loop:
    version = store.get(NS, key).version

    def run(n: int) -> None:
        nonlocal version
        for i in range(n):
            value = {"n": i, "note": NOTE}
            version = store.set(NS, key, value, updated_by=WRITER, expected_version=version).version

    return run


def raw_set_loop(raw: RawStore, key: str = KEY) -> Loop:
    version = raw.get(NS, key)[1]

    def run(n: int) -> None:
        nonlocal version
        for i in range(n):
            version = raw.set(NS, key, {"n": i, "note": NOTE}, WRITER, version)

    return run


def store_get_loop(store: StateStore, key: str = KEY) -> Loop:
    def run(n: int) -> None:
        get = store.get
        for _ in range(n):
            get(NS, key)

    return run


def raw_get_loop(raw: RawStore, key: str = KEY) -> Loop:
    def run(n: int) -> None:
        get = raw.get
        for _ in range(n):
            get(NS, key)

    return run


def store_history_loop(store: StateStore, key: str = KEY) -> Loop:
    def run(n: int) -> None:
        history = store.history
        for _ in range(n):
            history(NS, key, limit=10)

    return run


def raw_history_loop(raw: RawStore, key: str = KEY) -> Loop:
    def run(n: int) -> None:
        history = raw.history
        for _ in range(n):
            history(NS, key, 10)

    return run


# --------------------------------------------------------------------------------------------
# 1 and 2: set and get on a small database
# --------------------------------------------------------------------------------------------


def measure_set_get(tmp: Path, sizes: Sizes) -> dict[str, Any]:
    store_path, raw_path = tmp / "store.db", tmp / "raw.db"
    make_database(raw_path)
    raw = RawStore(raw_path)
    raw.set(NS, KEY, {"n": 0, "note": NOTE}, WRITER, 0)
    with StateStore(store_path) as store:
        store.set(NS, KEY, {"n": 0, "note": NOTE}, updated_by=WRITER, expected_version=0)
        sets = best_rates(
            {"store": store_set_loop(store), "raw": raw_set_loop(raw)}, sizes.set_ops, sizes.repeats
        )
        gets = best_rates(
            {"store": store_get_loop(store), "raw": raw_get_loop(raw)}, sizes.get_ops, sizes.repeats
        )
    raw.close()
    return {"set": sets, "get": gets}


# --------------------------------------------------------------------------------------------
# 3: contention between processes
# --------------------------------------------------------------------------------------------


def occ_worker(path: str, increments: int, name: str, barrier: Any, results: Any) -> None:
    """An agent: increments with the conflict-retry loop; reports conflicts and its end time."""
    conflicts = 0
    with StateStore(path) as store:
        barrier.wait()
        for _ in range(increments):
            record = store.get(NS, KEY)
            while True:
                try:
                    store.set(
                        NS, KEY, record.value + 1, updated_by=name, expected_version=record.version
                    )
                    break
                except ConflictError:
                    conflicts += 1
                    record = store.get(NS, KEY)
        results.put((conflicts, time.time()))


def raw_worker(path: str, increments: int, name: str, barrier: Any, results: Any) -> None:
    """The baseline agent: each increment is one BEGIN IMMEDIATE transaction."""
    raw = RawStore(Path(path))
    barrier.wait()
    for _ in range(increments):
        raw.increment(NS, KEY, name)
    results.put((0, time.time()))
    raw.close()


def run_workers(worker: Callable[..., None], path: Path, sizes: Sizes) -> tuple[float, int]:
    """Start the worker processes together; return increments per second and conflicts."""
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters, as separate agents would be
    barrier = ctx.Barrier(sizes.workers + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=worker, args=(str(path), sizes.increments, f"agent-{i}", barrier, results)
        )
        for i in range(sizes.workers)
    ]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=60)
        started = time.time()
        reports = [results.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    finished = max(end for _, end in reports)
    return sizes.workers * sizes.increments / (finished - started), sum(c for c, _ in reports)


def measure_contention(tmp: Path, sizes: Sizes) -> dict[str, Any]:
    expected = sizes.workers * sizes.increments
    out: dict[str, Any] = {"workers": sizes.workers, "increments": sizes.increments}
    runs: dict[str, list[dict[str, Any]]] = {"store": [], "raw": []}
    for r in range(sizes.repeats):
        for name, worker in (("store", occ_worker), ("raw", raw_worker)):
            path = tmp / f"contention-{name}-{r}.db"
            with StateStore(path) as store:
                store.set(NS, KEY, 0, updated_by="setup")
            rate, conflicts = run_workers(worker, path, sizes)
            with StateStore(path) as store:
                final = store.get(NS, KEY)
            runs[name].append(
                {
                    "rate": rate,
                    "conflicts": conflicts,
                    "final": final.value,
                    "exact": final.value == expected and final.version == expected + 1,
                }
            )
    for name, results in runs.items():
        best = max(results, key=lambda run: run["rate"])
        out[name] = {**best, "exact": all(run["exact"] for run in results)}
    return out


# --------------------------------------------------------------------------------------------
# 4: a million history rows
# --------------------------------------------------------------------------------------------


def build_big(path: Path, keys: int, versions: int) -> None:
    """Bulk-insert ``keys`` x ``versions`` history rows in key order, and each key's newest
    version as its live row: a valid database, built with the journal off for speed."""
    make_database(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = off")
    conn.execute("PRAGMA synchronous = off")
    at = "2025-01-01T00:00:00.000000+00:00"
    values = [
        json.dumps({"n": v, "note": NOTE}, separators=(",", ":")) for v in range(versions + 1)
    ]

    def history() -> Iterator[tuple[Any, ...]]:
        for k in range(keys):
            key = f"key-{k:06d}"
            for v in range(1, versions + 1):
                yield BIG_NS, key, v, values[v], "builder", at, "write"

    def live() -> Iterator[tuple[Any, ...]]:
        for k in range(keys):
            yield BIG_NS, f"key-{k:06d}", values[versions], versions, "builder", at

    conn.execute("BEGIN")
    conn.executemany(_INSERT_HISTORY, history())
    conn.executemany(_UPSERT, live())
    conn.execute("COMMIT")
    conn.execute("PRAGMA journal_mode = wal")
    conn.close()


def measure_history_size(tmp: Path, sizes: Sizes) -> dict[str, Any]:
    names = ("store-empty", "store-big", "raw-empty", "raw-big")
    paths = {name: tmp / f"{name}.db" for name in names}
    started = time.perf_counter()
    build_big(paths["store-big"], sizes.big_keys, sizes.big_versions)
    shutil.copyfile(paths["store-big"], paths["raw-big"])
    build_seconds = time.perf_counter() - started
    for path in paths.values():
        with StateStore(path) as store:  # the measured key, with some history of its own
            for i in range(HISTORY_DEPTH):
                store.set(NS, KEY, {"n": i, "note": NOTE}, updated_by=WRITER)

    stores = {"empty": StateStore(paths["store-empty"]), "big": StateStore(paths["store-big"])}
    raws = {"empty": RawStore(paths["raw-empty"]), "big": RawStore(paths["raw-big"])}
    makers: dict[str, tuple[Callable[[StateStore], Loop], Callable[[RawStore], Loop], int]] = {
        "get": (store_get_loop, raw_get_loop, sizes.get_ops),
        "set": (store_set_loop, raw_set_loop, sizes.set_ops),
        "history": (store_history_loop, raw_history_loop, sizes.history_ops),
    }
    out: dict[str, Any] = {
        "history_rows": sizes.big_keys * sizes.big_versions,
        "keys": sizes.big_keys,
        "build_seconds": build_seconds,
    }
    try:
        for op, (store_loop, raw_loop, n) in makers.items():
            loops = {f"store-{db}": store_loop(s) for db, s in stores.items()}
            loops.update({f"raw-{db}": raw_loop(r) for db, r in raws.items()})
            out[op] = best_rates(loops, n, sizes.repeats)
        newest = stores["big"].history(BIG_NS, "key-000000", limit=1)[0]
        assert newest.version == sizes.big_versions, "the bulk build is not what was meant"
        assert len(stores["big"].list_keys(BIG_NS)) == sizes.big_keys
        out["list_keys"] = median_seconds(
            {
                "store": lambda: stores["big"].list_keys(BIG_NS),
                "raw": lambda: raws["big"].list_keys(BIG_NS),
            },
            sizes.list_runs,
        )
    finally:
        for s in stores.values():
            s.close()
        for r in raws.values():
            r.close()
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target: what it asks, whether it passed, and what was measured."""
    sg, con, big = results["set_get"], results["contention"], results["history_size"]
    rows = f"{big['history_rows']:,}"
    checks: list[tuple[str, bool, str]] = [
        ("set >= 20,000 ops/s", sg["set"]["store"] >= 20_000, f"{sg['set']['store']:,.0f}/s"),
        ("set >= 60% of raw sqlite3", ratio(sg["set"]) >= 0.6, f"{ratio(sg['set']):.0%}"),
        ("get >= 200,000 ops/s", sg["get"]["store"] >= 200_000, f"{sg['get']['store']:,.0f}/s"),
        ("get >= 70% of raw sqlite3", ratio(sg["get"]) >= 0.7, f"{ratio(sg['get']):.0%}"),
    ]
    for name in ("store", "raw"):
        expected = con["workers"] * con["increments"]
        what = "agenthold" if name == "store" else "raw sqlite3"
        checks.append(
            (
                f"contention ({what}) loses no increment: final value {expected:,}",
                con[name]["exact"],
                f"{con[name]['final']:,}",
            )
        )
    for op in ("get", "set", "history"):
        kept = big[op]["store-big"] / big[op]["store-empty"]
        checks.append(
            (f"{op} with {rows} history rows within 20% of empty", kept >= 0.8, f"{kept:.0%}")
        )
    ms = big["list_keys"]["store"] * 1000
    checks.append((f"list_keys of {big['keys']:,} keys < 50 ms", ms < 50, f"{ms:.1f} ms"))
    return as_targets(checks)


def ratio(rates: dict[str, float]) -> float:
    return rates["store"] / rates["raw"]


def per_second(rate: float) -> str:
    return f"{rate:,.0f}/s"


def report(results: dict[str, Any]) -> str:
    m, sizes = results["machine"], results["sizes"]
    sg, con, big = results["set_get"], results["contention"], results["history_size"]
    out = [
        f"agenthold StateStore benchmark ({sizes['label']} run)",
        machine_line(m),
        f"rates: best of {sizes['repeats']} runs, agenthold and raw sqlite3 taking turns; "
        f"list_keys: median of {sizes['list_runs']} calls",
        "",
        table(
            [
                [
                    "operation (file database, durability normal)",
                    "agenthold",
                    "raw sqlite3",
                    "ratio",
                ],
                ["set with expected_version"]
                + [per_second(sg["set"][s]) for s in ("store", "raw")]
                + [f"{ratio(sg['set']):.0%}"],
                ["get"]
                + [per_second(sg["get"][s]) for s in ("store", "raw")]
                + [f"{ratio(sg['get']):.0%}"],
            ]
        ),
        "",
        table(
            [
                [
                    f"contention: {con['workers']} processes x {con['increments']} increments",
                    "rate",
                    "final value",
                    "conflicts",
                ],
                [
                    "agenthold: get, set(expected_version), retry",
                    per_second(con["store"]["rate"]),
                    f"{con['store']['final']:,}",
                    f"{con['store']['conflicts']:,}",
                ],
                [
                    "raw sqlite3: BEGIN IMMEDIATE read + write",
                    per_second(con["raw"]["rate"]),
                    f"{con['raw']['final']:,}",
                    f"{con['raw']['conflicts']:,}",
                ],
            ]
        ),
        "",
        f"history size: {big['history_rows']:,} history rows ({big['keys']:,} keys x "
        f"{big['history_rows'] // big['keys']} versions, built in {big['build_seconds']:.1f} s) "
        "against an empty database",
    ]
    rows = [["operation", "agenthold empty", "agenthold big", "big/empty", "raw empty", "raw big"]]
    for op, label in (("get", "get"), ("set", "set"), ("history", "history(limit=10)")):
        r = big[op]
        rows.append(
            [
                label,
                per_second(r["store-empty"]),
                per_second(r["store-big"]),
                f"{r['store-big'] / r['store-empty']:.0%}",
                per_second(r["raw-empty"]),
                per_second(r["raw-big"]),
            ]
        )
    out.append(table(rows))
    lk = big["list_keys"]
    out += [
        "",
        table(
            [
                [
                    f"list_keys of {big['keys']:,} keys (median)",
                    "agenthold",
                    "raw sqlite3",
                    "ratio",
                ],
                [
                    "time per call",
                    f"{lk['store'] * 1000:.1f} ms",
                    f"{lk['raw'] * 1000:.1f} ms",
                    f"{lk['raw'] / lk['store']:.0%}",
                ],
            ]
        ),
        "",
        *target_lines(results["targets"], quick=sizes["label"] == "quick"),
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = options(__doc__).parse_args(argv)
    sizes = QUICK if args.quick else FULL
    results: dict[str, Any] = {"machine": machine(), "sizes": asdict(sizes)}
    with tempfile.TemporaryDirectory(prefix="agenthold-bench-") as tmp:
        results["set_get"] = measure_set_get(Path(tmp), sizes)
        results["contention"] = measure_contention(Path(tmp), sizes)
        results["history_size"] = measure_history_size(Path(tmp), sizes)
    results["targets"] = targets(results)
    finish(args, results, report)
    correct = results["contention"]["store"]["exact"] and results["contention"]["raw"]["exact"]
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
