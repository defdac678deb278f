"""The contention scenario of bench/torture/torture.py: processes of threads fighting over
counters, churn keys and resources, every call recorded, the merged record checked by
checks.check_contention (see torture.py's help).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the checkers and workers beside this
from checks import Check, check_contention, read_lines
from scenario import Report, database, worker
from workers import CONTENTION_NAMESPACE, COUNTERS

from agenthold.store import StateStore


def run_contention(
    work: Path,
    *,
    processes: int,
    threads: int,
    seconds: float,
    seed: int,
    url: str | None = None,
) -> Report:
    """Run the contention workers together and check their merged record."""
    rng = random.Random(f"{seed}-contention")
    db = database(work, "contention", url)
    report = Report(
        "contention",
        f"contention: {processes} processes x {threads} threads for {seconds:g} s (seed {seed})",
    )
    initial: dict[str, int] = {}
    with StateStore(db) as store:
        for key in COUNTERS:
            done = store.set(CONTENTION_NAMESPACE, key, 0, updated_by="setup", expected_version=0)
            initial[key] = done.version
    outs = [work / f"records-{i}.jsonl" for i in range(processes)]
    children = [
        worker(
            work, f"contend-{i}", "contend", db, outs[i], rng.randrange(2**32), seconds, threads, i
        )
        for i in range(processes)
    ]
    problems: list[str] = []
    try:
        said = [c.line(timeout=60) for c in children]
        problems += [f"worker {i} said {s!r}" for i, s in enumerate(said) if s != "ready"]
        started = time.monotonic()
        for c in children:
            if c.proc.poll() is None:
                c.send("go")
        results = [c.line(timeout=seconds + 120) for c in children]
        elapsed = time.monotonic() - started
        for i, (c, result) in enumerate(zip(children, results, strict=True)):
            rc = c.wait(60)
            if rc != 0 or result is None:
                problems.append(f"worker {i} exited with {rc}: {result} {c.stderr_tail()}")
    finally:
        for c in children:
            c.kill()
    records = read_lines(p for p in outs if p.exists())
    checks, figures = check_contention(
        db, records, namespace=CONTENTION_NAMESPACE, counters=COUNTERS, initial=initial
    )
    checks.items.insert(
        0,
        Check(
            "every worker ran to its deadline without an error",
            not problems,
            "; ".join(problems) or f"{processes} processes, {processes * threads} threads",
        ),
    )
    report.checks = checks
    calls = figures["calls"]
    report.figure("calls recorded (each with its answer)", calls)
    report.figure("calls per second, all processes", calls / elapsed if elapsed else 0.0)
    report.figure("successful increments", figures["increments"])
    report.figure("most attempts for one increment", figures["max_attempts"])
    conflicts = f"{figures['conflicts']:,} ({figures['conflicts_no_live_record']:,})"
    report.figure("conflicts (of them: no live record)", conflicts)
    report.figure("deletes / re-creates", f"{figures['deletes']:,} / {figures['creates']:,}")
    report.figure("reads checked against the history", figures["reads"])
    report.figure("holds / busy answers", f"{figures['holds']:,} / {figures['busy']:,}")
    report.figure("calls answered 'unavailable' (busy_timeout)", figures["unavailable"])
    report.figure("seconds", elapsed)
    return report


# --------------------------------------------------------------------------------------------
# Soak: a long-lived HTTP server under agent churn
# --------------------------------------------------------------------------------------------
