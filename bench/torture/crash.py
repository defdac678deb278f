"""The crash scenario of bench/torture/torture.py: a writer killed with SIGKILL at random moments,
and after each kill the checks of checks.py on what it left (see torture.py's help).
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the checkers and workers beside this
from checks import Acks, check_after_kill, connect
from scenario import Report, Tally, database, db_size, worker
from workers import CRASH_NAMESPACE

from agenthold.claims import Coordinator
from agenthold.store import StateStore

MAX_KILL_DELAY = 0.25  # seconds: a writer is killed this long at most after it said "ready"


def run_crash(
    work: Path, *, kills: int, seed: int, seconds: float | None = None, url: str | None = None
) -> Report:
    """Kill a writer ``kills`` times (fewer if ``seconds`` run out) and check after each."""
    rng = random.Random(f"{seed}-crash")
    db = database(work, "crash", url)
    report = Report("crash", f"crash consistency: a writer killed with SIGKILL (seed {seed})")
    with StateStore(db) as store:
        coord = Coordinator(store)
        agents = ",".join(coord.register(f"crash-writer-{i}").agent_id for i in range(2))
    tally = Tally()
    acks = Acks()
    started = time.monotonic()
    unacked: list[int] = []
    done = 0
    for n in range(kills):
        if seconds is not None and time.monotonic() - started > seconds:
            break
        log = work / f"acks-{n:04d}.jsonl"
        child = worker(work, f"crash-{n:04d}", "crash", db, log, rng.randrange(2**32), agents)
        ready = child.line(timeout=60)
        tally.count(
            "a new process opens the database after each kill, writes, claims and releases",
            ready == "ready",
            f"writer {n} said {ready!r}: {child.stderr_tail()}",
        )
        if ready == "ready":
            time.sleep(rng.uniform(0, MAX_KILL_DELAY))
        rc = child.kill()
        tally.count(
            "the writer ran until it was killed (no error stopped it first)",
            rc == -signal.SIGKILL,
            f"writer {n} exited with {rc}: {child.stderr_tail()}",
        )
        if log.exists():  # a writer that failed to open the database wrote no log
            acks.read(log)
        checks, figures = check_after_kill(db, acks, CRASH_NAMESPACE)
        tally.add(checks, f"after kill {n}")
        unacked.append(figures["unacknowledged"] - sum(unacked))
        done += 1
    # One more writer carries on and stops by itself: the database still takes work.
    log = work / "acks-final.jsonl"
    child = worker(work, "crash-final", "crash", db, log, rng.randrange(2**32), agents, 200)
    ready, result = child.line(timeout=60), child.line(timeout=60)
    rc = child.wait(60)
    tally.count(
        "after the last kill a new process carries on and finishes 200 steps",
        ready == "ready" and rc == 0 and result is not None and json.loads(result)["steps"] == 200,
        f"exit {rc}, said {ready!r} {result!r}: {child.stderr_tail()}",
    )
    if log.exists():
        acks.read(log)
    checks, figures = check_after_kill(db, acks, CRASH_NAMESPACE)
    tally.add(checks, "at the end")
    report.checks = tally.checks("times")
    elapsed = time.monotonic() - started
    conn = connect(db)
    try:
        history = conn.execute("SELECT count(*) FROM state_history").fetchone()[0]
        events = conn.execute("SELECT count(*) FROM claim_events").fetchone()[0]
    finally:
        conn.close()
    report.figure("writers killed", done)
    report.figure("acknowledged changes, all checked after every kill", figures["acknowledged"])
    report.figure("changes committed without an acknowledgement (allowed)", sum(unacked))
    most = max(unacked, default=0)
    report.figure("most after one kill (a clear_namespace commits several)", most)
    report.figure("history rows / claim events in the end", f"{history:,} / {events:,}")
    report.figure("database size", db_size(db))
    report.figure("seconds", elapsed)
    return report


# --------------------------------------------------------------------------------------------
# Contention with a history check
# --------------------------------------------------------------------------------------------
