"""How long writes stall while compaction trims a large state history, against the same writes
with no compaction, in the same run.

    python bench/perf/compact_bench.py              # 200,000 history rows (about a minute)
    python bench/perf/compact_bench.py --full       # 1,000,000 history rows, as issue 29 asks
    python bench/perf/compact_bench.py --rows N     # any other size
    python bench/perf/compact_bench.py --quick      # a smoke run (too small to judge)
    python bench/perf/compact_bench.py --json       # the results as JSON instead of tables

What is measured. A SQLite file is bulk-built with ``rows`` history rows (keys of 100 versions
each) and copied, so both runs start from the same bytes. On each copy a writer process (a
StateStore of its own, as a server would be) writes small values to 10 keys of another
namespace, one write after another, timing each ``set``. Baseline: the writer runs alone for
as long as the compaction took. Compaction: with ``history.versions=10`` stored, this process
runs ``retention.compact`` (default batch of ids, then incremental vacuum), which removes 90%
of the rows while the writer writes. The table gives each run's write count, median, p99 and
longest write (the longest stall), and the ratio of the two longest. The figures are the
machine's, loaded or not: compare the two columns, never a number on its own.
"""

from __future__ import annotations

import multiprocessing
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import finish, machine, machine_line, options, percentile, table

from agenthold.retention import DEFAULT_BATCH, compact, set_retention
from agenthold.store import StateStore

VERSIONS_PER_KEY = 100
KEEP = 10


def build(path: Path, rows: int) -> None:
    """``rows`` history rows (keys of VERSIONS_PER_KEY versions) and each key's live row,
    bulk-inserted into a file a StateStore made (so it has incremental auto-vacuum)."""
    StateStore(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = off")
    conn.execute("PRAGMA synchronous = off")
    at = "2025-01-01T00:00:00.000000+00:00"
    keys = max(rows // VERSIONS_PER_KEY, 1)

    def history() -> Iterator[tuple[Any, ...]]:
        for k in range(keys):
            for v in range(1, VERSIONS_PER_KEY + 1):
                yield "big", f"key-{k:06d}", v, f'{{"n":{v},"pad":"{"x" * 40}"}}', "b", at

    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO state_history (namespace, key, version, value, updated_by, updated_at, "
        "event_type) VALUES (?, ?, ?, ?, ?, ?, 'write')",
        history(),
    )
    conn.executemany(
        "INSERT INTO state (namespace, key, value, version, updated_by, updated_at) "
        "VALUES ('big', ?, '1', ?, 'b', ?)",
        ((f"key-{k:06d}", VERSIONS_PER_KEY, at) for k in range(keys)),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA journal_mode = wal")
    conn.close()


def writer(path: str, ready: Any, stop: Any, out: Any) -> None:
    """Write until ``stop`` is set; put each write's seconds on ``out``."""
    times: list[float] = []
    with StateStore(path) as store:
        store.set("w", "warm", 0, updated_by="bench")
        ready.set()
        i = 0
        while not stop.is_set():
            started = time.perf_counter()
            store.set("w", f"k{i % 10}", i, updated_by="bench")
            times.append(time.perf_counter() - started)
            i += 1
    out.put(times)


def run(path: Path, seconds: float | None) -> tuple[list[float], dict[str, Any]]:
    """The writer's times while compaction runs (``seconds`` None) or for ``seconds``."""
    ctx = multiprocessing.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=writer, args=(str(path), ready, stop, out))
    proc.start()
    if not ready.wait(60):
        raise SystemExit("the writer process did not start")
    facts: dict[str, Any] = {}
    started = time.perf_counter()
    if seconds is None:
        with StateStore(path) as store:
            set_retention(store.db, {"history.versions": KEEP})
            report = compact(store.db)
        facts = {
            "removed": report.history,
            "batches": report.batches,
            "pages_freed": report.pages_freed,
        }
    else:
        time.sleep(seconds)
    facts["seconds"] = time.perf_counter() - started
    stop.set()
    times: list[float] = out.get(timeout=60)
    proc.join(60)
    return times, facts


def summary(times: list[float]) -> dict[str, float]:
    ms = [t * 1000 for t in times]
    return {
        "writes": len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
    }


def main() -> int:
    parser = options(__doc__, quick="a smoke run: 20,000 rows", full="1,000,000 history rows")
    parser.add_argument("--rows", type=int, default=200_000, help="history rows to build")
    args = parser.parse_args()
    rows = 1_000_000 if args.full else 20_000 if args.quick else args.rows
    facts = machine()
    with tempfile.TemporaryDirectory(prefix="compact-bench-") as tmp:
        built, copy = Path(tmp) / "compacted.db", Path(tmp) / "baseline.db"
        started = time.perf_counter()
        build(built, rows)
        shutil.copyfile(built, copy)
        build_seconds = time.perf_counter() - started
        during, compaction = run(built, None)
        alone, _ = run(copy, compaction["seconds"])
    results = {
        "machine": facts,
        "quick": args.quick,
        "rows": rows,
        "build_seconds": build_seconds,
        "batch": DEFAULT_BATCH,
        "compaction": compaction,
        "writes_alone": summary(alone),
        "writes_during_compaction": summary(during),
    }
    a, d = results["writes_alone"], results["writes_during_compaction"]
    results["longest_stall_ratio"] = d["max_ms"] / a["max_ms"]
    results["p99_ratio"] = d["p99_ms"] / a["p99_ms"]
    finish(args, results, report)
    return 0


def report(results: dict[str, Any]) -> str:
    rows, build_seconds, compaction = (
        results["rows"],
        results["build_seconds"],
        results["compaction"],
    )
    a, d = results["writes_alone"], results["writes_during_compaction"]
    return "\n".join(
        [
            "agenthold compaction benchmark" + (" (quick run)" if results["quick"] else ""),
            machine_line(results["machine"]),
            f"\n{rows:,} history rows built in {build_seconds:.1f} s; compaction kept {KEEP} "
            f"versions per key: removed {compaction['removed']:,} rows in "
            f"{compaction['batches']} batches of {DEFAULT_BATCH} ids, gave back "
            f"{compaction['pages_freed']:,} pages, in {compaction['seconds']:.2f} s\n",
            "writes by another process (StateStore.set, one after another)",
            table(
                [
                    ["run", "writes", "median ms", "p99 ms", "longest ms"],
                    *(
                        [
                            name,
                            str(s["writes"]),
                            f"{s['median_ms']:.2f}",
                            f"{s['p99_ms']:.2f}",
                            f"{s['max_ms']:.2f}",
                        ]
                        for name, s in (("no compaction", a), ("during compaction", d))
                    ),
                ]
            ),
            f"\nlongest stall during compaction / without: {results['longest_stall_ratio']:.2f}x; "
            f"p99: {results['p99_ratio']:.2f}x",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
