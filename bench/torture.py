"""Proof that agenthold holds up: writers killed mid-work, processes fighting over keys and
resources, and a long-lived HTTP server under agent churn. Each scenario prints its figures and
a pass/FAIL line per property; the exit status is 1 if any property failed.

    python bench/torture.py                          # every scenario, long sizes (~10 minutes)
    python bench/torture.py --scenario crash --iterations 200 --seed 7
    python bench/torture.py --scenario contention --processes 8 --seconds 60
    python bench/torture.py --scenario soak --iterations 20000 --seconds 600
    python bench/torture.py --scenario loris --connections 5000 --seconds 20
    python bench/torture.py --ci                     # the sizes tests/test_torture.py runs
    python bench/torture.py --json --keep DIR        # the reports as JSON; keep the files
    python bench/torture.py --db postgresql://user@/db?host=/run/postgresql   # on PostgreSQL

Scenarios (the checkers are in torture_checks.py, the worker processes in torture_workers.py,
and tests/test_torture.py runs these same functions at CI sizes):

crash       A writer process does OCC writes, deletes, claims and releases and is killed with
            SIGKILL at a random moment, ``--iterations`` times (200; 20 in CI). It logs every
            change after the call returned (flushed; the page cache survives a killed process, so
            no fsync). After each kill: PRAGMA integrity_check is ok, every acknowledged change
            is there, each key's live row is its newest history row, no claim is half-applied;
            and every writer starts by writing, claiming and releasing on the database the last
            one left, so each kill is followed by a new process that carries on.
contention  ``--processes`` processes (8; 4 in CI) of ``--threads`` threads (2) run for
            ``--seconds`` (60; 4 in CI) with random pauses: increments of shared counters with
            the retry loop, deletes and re-creates of churn keys, claim, hold and release of
            shared resources. Every call and answer is recorded with time.monotonic() (on Linux
            CLOCK_MONOTONIC, one clock for all processes); a checker over the merged record and
            the database proves the properties listed in torture_checks.check_contention.
soak        One ``agenthold --transport http`` server (standard tools, --reap-idle 2,
            --claim-ttl 3) under agent churn, driven by mcp.Client over HTTP from 10 lanes of
            calls at once: ``--agents`` distinct agents (1,000; 100 in CI) over ``--iterations``
            cycles (20,000; 2,000 in CI). A cycle registers a new agent (which retires the
            oldest of the 16 live ones), or has a live agent claim a resource and release it;
            in one cycle of four it writes the resource's value in between (with the version it
            last wrote) and releases it as "modified". Nine lanes are sessionless 2026-07-28
            clients; one is a legacy 2025-11-25 client that closes its session and opens
            another every 50 cycles. The standard tools cannot write values, so writes go to a
            second server on the same database (--tools advanced, no reaping), as when one
            deployment serves both tool sets. One cycle in 200 has its agent claim a resource
            and vanish: its lease runs out, and the reaper frees the claim ("expired") and
            removes the agent. Checked: RSS, open descriptors and threads of both servers,
            sampled 200 times, grow by under 5% in the second half, or descriptors by at most
            DESCRIPTOR_SLACK and threads by at most THREAD_SLACK (the highest sample of each
            half compared, see
            torture_checks.growth; the servers' worker-thread pools are filled first, see
            fill_thread_pools); every call is answered without an error;
            idle agents are reaped on time, and all of them once the run is over; claim_events
            and the history hold exactly the rows the documented behaviour implies: one per
            registration, claim, release (by outcome), lapsed claim and reaped agent, and one
            history row per write.

loris       One ``agenthold --transport http`` server with a token and its default bounds; a
            legitimate client (the token, mcp.Client) claims and releases a resource every
            20 ms for ``--seconds`` (20; 4 in CI), alone and then while another process holds
            ``--connections`` slow connections without a token (5,000; 300 in CI), each sending
            half a request head and a byte a second and reconnecting when dropped; then five
            new legitimate clients connect one by one, alone and under attack. A table gives
            the legitimate client's latency in both phases (the baseline is the same run's).
            Checked: every legitimate call answered, their p99 under attack within 100 ms, the
            server's descriptors below its limit, counts rather than tracebacks on its stderr.
            The attacker is torture_loris.py, which has the details.

``--seconds`` caps the crash and soak runs too: they stop early and report what they did.

``--db URL`` runs the scenarios on PostgreSQL: each in a new schema of that database (dropped
afterwards unless --keep), checked by the same checkers reading it with plain psycopg; instead of
PRAGMA integrity_check, amcheck verifies the indexes. A killed writer on PostgreSQL is a killed
client: the server rolls back its open transaction.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "torture_workers.py"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # _common, torture_checks and torture_workers sit beside this

# Importing _common also finds this checkout's agenthold when none is installed.
from _common import (  # noqa: E402
    ServerOutput,
    check_line,
    free_port,
    machine,
    machine_line,
    process_cpu_seconds,
    table,
)
from torture_checks import (  # noqa: E402
    Acks,
    Check,
    Checks,
    check_after_kill,
    check_claim_tables,
    check_contention,
    check_integrity,
    check_live_rows,
    connect,
    growth,
    is_postgres,
    read_lines,
)
from torture_workers import (  # noqa: E402
    CONTENTION_NAMESPACE,
    COUNTERS,
    CRASH_NAMESPACE,
)

from agenthold.claims.coordinator import Coordinator  # noqa: E402
from agenthold.store import StateStore  # noqa: E402

Database = Path | str  # a SQLite file, or the postgresql:// URL of a schema of its own


def database(work: Path, name: str, url: str | None) -> Database:
    """Where a scenario's data lives: ``work/name.db``, or a new schema in ``url``'s
    database (whose name is noted in ``work``, so that ``drop_schemas`` can remove it)."""
    if url is None:
        return work / f"{name}.db"
    import psycopg

    schema = f"torture_{name}_{os.getpid()}_{random.randrange(10**6)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    with (work.parent / "schemas").open("a") as out:
        out.write(schema + "\n")
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}options=-csearch_path%3D{schema}"


def drop_schemas(work: Path, url: str) -> None:
    import psycopg

    listed = work / "schemas"
    if not listed.exists():
        return
    with psycopg.connect(url, autocommit=True) as conn:
        for schema in listed.read_text().split():
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def db_size(db: Database) -> str:
    if not is_postgres(db):
        return f"{Path(db).stat().st_size / 1e6:.1f} MB"
    import psycopg

    with psycopg.connect(str(db), autocommit=True) as conn:
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
            "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'"
        ).fetchone()
    return f"{int(row[0] or 0) / 1e6:.1f} MB (tables and indexes)"


@dataclass(frozen=True)
class Sizes:
    kills: int  # crash: writers killed
    processes: int  # contention: worker processes
    threads: int  # contention: threads per process
    seconds: float  # contention: how long the workers run
    cycles: int  # soak: cycles
    agents: int  # soak: distinct agents
    slow: int = 0  # loris: slow connections
    attack_seconds: float = 0.0  # loris: how long the legitimate client calls, alone and attacked


LONG = Sizes(kills=200, processes=8, threads=2, seconds=60.0, cycles=20_000, agents=1_000)
LONG = replace(LONG, slow=5_000, attack_seconds=20.0)
CI = Sizes(kills=20, processes=4, threads=2, seconds=4.0, cycles=2_000, agents=100)
CI = replace(CI, slow=300, attack_seconds=4.0)


@dataclass
class Report:
    """A scenario's outcome: figures to print and one check per property."""

    scenario: str
    title: str
    figures: list[tuple[str, str]] = field(default_factory=list)
    checks: Checks = field(default_factory=Checks)
    series: list[list[str]] = field(default_factory=list)  # an extra table (soak samples)

    @property
    def passed(self) -> bool:
        return self.checks.passed

    def figure(self, name: str, value: object) -> None:
        if isinstance(value, float):
            text = f"{value:,.2f}"
        elif isinstance(value, int):
            text = f"{value:,}"
        else:
            text = str(value)
        self.figures.append((name, text))


# --------------------------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------------------------


class Child:
    """A process whose stdout lines a thread reads into a queue; stderr goes to a file."""

    def __init__(self, args: list[str], stderr: Path, cwd: Path) -> None:
        self.stderr_path = stderr
        self._stderr = open(stderr, "w", encoding="utf-8")  # noqa: SIM115 (closed in wait)
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout: float) -> str | None:
        """The next stdout line, or None if the process ended or said nothing in time."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.wait(30)

    def wait(self, timeout: float) -> int:
        """The exit status; a process still running after ``timeout`` is killed (-9)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is not None:
                self._reader.join(5)
                for stream in (self.proc.stdin, self.proc.stdout):
                    if stream is not None:
                        with contextlib.suppress(OSError):
                            stream.close()
                self._stderr.close()

    def stderr_tail(self, lines: int = 5) -> str:
        text = self.stderr_path.read_text(encoding="utf-8", errors="replace").strip()
        return " | ".join(text.splitlines()[-lines:]) or "(nothing on stderr)"


def worker(work: Path, name: str, *args: object) -> Child:
    argv = [sys.executable, str(WORKERS), *map(str, args)]
    return Child(argv, work / f"{name}.stderr", work)


class Tally:
    """The same checks run many times (after each kill): how often each passed, and the
    first failure's detail."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.passes: dict[str, int] = {}
        self.first_failure: dict[str, str] = {}
        self.last_detail: dict[str, str] = {}

    def add(self, checks: Checks, label: str) -> None:
        for c in checks.items:
            self.count(c.name, c.passed, f"{label}: {c.detail}", c.detail)

    def count(self, name: str, passed: bool, failure: str, detail: str = "") -> None:
        self.runs[name] = self.runs.get(name, 0) + 1
        self.passes[name] = self.passes.get(name, 0) + passed
        self.last_detail[name] = detail
        if not passed:
            self.first_failure.setdefault(name, failure)

    def checks(self, unit: str) -> Checks:
        out = Checks()
        for name, runs in self.runs.items():
            passed = self.passes[name] == runs
            detail = f"{self.passes[name]} of {runs} {unit}"
            if passed:
                if self.last_detail[name]:
                    detail += f"; at the end {self.last_detail[name]}"
            else:
                detail += f"; first failure {self.first_failure[name]}"
            out.items.append(Check(name, passed, detail))
        return out


# --------------------------------------------------------------------------------------------
# Crash consistency
# --------------------------------------------------------------------------------------------

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

REAP_IDLE = 2.0  # --reap-idle: agents idle this long are removed
CLAIM_TTL = 3.0  # --claim-ttl: a vanished agent's claims end this long after its last call
REAP_EVERY = min(max(REAP_IDLE / 4, 1.0), 600.0)  # how often the server looks (server.py)
DESCRIPTOR_SLACK = 4  # descriptors the soak allows past the first half's high (soak_checks)
# Threads likewise: about 9 run, and some come and go with the work (the change feed's poller
# lingers a second after its last waiter; a worker thread idle for 10 s leaves and a later
# burst starts it again), so on a loaded machine one sample of the second half can catch one
# more than any of the first (10 against 9: 11%). A leak grows with the calls or sessions,
# thousands and dozens here, and passes this slack many times over.
THREAD_SLACK = 2
SLACK = 1.5  # seconds of scheduling delay allowed on a busy machine
LANES = 10  # calls in flight at once; lane 0 is the legacy-session lane
POOL = 16  # live agents at a time; registering one more retires the oldest
LEGACY_EVERY = 50  # cycles of the legacy lane between closing its session and opening another
ABANDON = 0.005  # chance that a cycle's agent claims and then vanishes without a release
WRITE = 0.25  # chance that a cycle's agent writes the resource's value (then "modified")
RESOURCES = 64
SAMPLES = 200
SOAK_NAMESPACE = "soak"


class Server:
    """``python -m agenthold --transport http`` on a free port; stderr collected live.

    --disconnect-grace is longer than the claim TTL, so a legacy session that closes never
    shortens a lease: leases end by the TTL alone, one "expired" release per vanished agent."""

    def __init__(self, work: Path, db: Database, tools: str, reap_idle: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.tools = tools
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agenthold", "--db", str(db), "--transport", "http",
             "--port", str(self.port), "--tools", tools, "--reap-idle", reap_idle,
             "--claim-ttl", f"{CLAIM_TTL:g}", "--disconnect-grace", "30"],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.output = ServerOutput(self.proc)
        self.lines = self.output.lines
        self.stop_seconds = 0.0

    def wait_serving(self) -> None:
        self.output.wait_serving(f"the {self.tools} server")

    def sample(self) -> tuple[int, int, int]:
        """Resident memory (kB), open descriptors and threads, from /proc."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss = int(fields["VmRSS"].split()[0])
        threads = int(fields["Threads"])
        fds = len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        return rss, fds, threads

    def cpu_seconds(self) -> float:
        """User and system CPU time the server has used so far."""
        return process_cpu_seconds(self.proc.pid)

    def stop(self) -> int:
        """Send SIGTERM and return the exit status; ``stop_seconds`` is how long it took."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(30)
        finally:
            self.stop_seconds = time.monotonic() - started
            self.output.reader.join(5)
            if self.proc.stderr is not None:
                self.proc.stderr.close()


@dataclass
class Soak:
    """The driver's book of what it did and what it was told."""

    cycles: int
    agents: int
    rng: random.Random
    deadline: float | None
    next_cycle: int = 0
    registering: int = 0  # registrations started
    registered: list[str] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)
    agents_in_use: set[str] = field(default_factory=set)
    resources_in_use: set[str] = field(default_factory=set)
    last_call: dict[str, float] = field(default_factory=dict)
    abandoned: dict[str, str] = field(default_factory=dict)  # agent -> resource it kept
    versions: dict[str, int] = field(default_factory=dict)  # the version each key last got
    answers: Counter[str] = field(default_factory=Counter)  # "tool status": how many
    outcomes: Counter[str] = field(default_factory=Counter)  # releases answered, by outcome
    errors: list[str] = field(default_factory=list)
    busy_named: list[str] = field(default_factory=list)
    legacy_sessions: int = 0
    cpu: tuple[float, float, float] = (0.0, 0.0, 0.0)  # CPU seconds: driver, servers
    agent_figures: list[tuple[str, int]] = field(default_factory=list)
    samples: list[tuple[int, float, tuple[int, int, int], tuple[int, int, int]]] = field(
        default_factory=list
    )

    def should_register(self, n: int) -> bool:
        """Whether cycle ``n`` registers an agent; if so, the registration is counted at once,
        before the call, so lanes running at the same time never register too many."""
        due = max(POOL, math.ceil(self.agents * (n + 1) / self.cycles))
        if self.registering < min(self.agents, due):
            self.registering += 1
            return True
        return False

    def free_agent(self) -> str | None:
        """The free pooled agent that has waited longest, so every live agent makes a call
        often enough never to look idle to the reaper."""
        free = [a for a in self.pool if a not in self.agents_in_use]
        return min(free, key=lambda a: self.last_call.get(a, 0.0)) if free else None

    def retire_extra(self) -> None:
        while len(self.pool) > POOL:
            oldest = next((a for a in self.pool if a not in self.agents_in_use), None)
            if oldest is None:
                return
            self.pool.remove(oldest)


def run_soak(
    work: Path,
    *,
    cycles: int,
    agents: int,
    seed: int,
    seconds: float | None = None,
    url: str | None = None,
) -> Report:
    import anyio

    return anyio.run(_soak, work, cycles, agents, seed, seconds, url)


async def _soak(
    work: Path, cycles: int, agents: int, seed: int, seconds: float | None, url: str | None
) -> Report:
    import anyio

    report = Report(
        "soak",
        f"soak: one HTTP server, {agents:,} agents over {cycles:,} cycles (seed {seed})",
    )
    db = database(work, "soak", url)
    StateStore(db).close()  # both servers start on a ready database
    claims = Server(work, db, "standard", f"{REAP_IDLE:g}")
    writes = Server(work, db, "advanced", "off")
    begun = time.monotonic()
    book = Soak(
        cycles,
        agents,
        random.Random(f"{seed}-soak"),
        None if seconds is None else begun + seconds,
    )
    codes: dict[str, int] = {}
    try:
        claims.wait_serving()
        writes.wait_serving()
        every = max(1, cycles // SAMPLES)
        await fill_thread_pools(db, claims, writes)
        started = time.monotonic()  # the cycles' clock: servers up, thread pools full
        book.samples.append((0, 0.0, claims.sample(), writes.sample()))
        cpu = time.process_time(), claims.cpu_seconds(), writes.cpu_seconds()
        async with anyio.create_task_group() as tg:
            for lane in range(LANES):
                tg.start_soon(soak_lane, book, lane, claims, writes, every, started)
        ended = time.monotonic()
        book.cpu = (
            time.process_time() - cpu[0],
            claims.cpu_seconds() - cpu[1],
            writes.cpu_seconds() - cpu[2],
        )
        book.samples.append((book.next_cycle, ended - started, claims.sample(), writes.sample()))
        at_end = agent_rows(db)
        # Every agent is idle now: wait until all are reaped, or the last one is overdue.
        due = max((due_by(book, a) for a in book.registered), default=ended)
        while agent_rows(db) and time.monotonic() < due:
            await anyio.sleep(0.1)
        soak_checks(report, book, db, at_end, ended)
    finally:
        codes = {"standard": claims.stop(), "advanced": writes.stop()}
    stderr = "".join(claims.lines + writes.lines)
    report.checks.expect(
        "both servers stop on SIGTERM with status 0 and no traceback",
        [f"{k} exited {v}" for k, v in codes.items() if v != 0]
        + (["a traceback on stderr: " + stderr[-300:]] if "Traceback" in stderr else []),
        "exit 0, 0",
    )
    soak_figures(report, book, db, ended - started)
    report.figure(
        "seconds from SIGTERM to exit: standard / advanced server",
        f"{claims.stop_seconds:.1f} / {writes.stop_seconds:.1f}",
    )
    return report


async def fill_thread_pools(db: Database, *servers: Server) -> None:
    """Fill each server's pool of worker threads to its limit before anything is sampled.

    A server runs each write in a worker thread. Its pool grows to the most writes it has had
    in flight at once (idle threads leave after a while), and that high rises now and then
    during a run, say when the other server holds the database's write lock, until it reaches
    the limit. The samples would read that as growth. So the driver holds the write lock
    itself while it sends each server more writes than its limit; they wait in worker threads
    until every pool has grown and stopped growing, then the lock is let go (well within the
    servers' 5 s busy timeout). The writes change nothing: a claim by an agent id nobody
    registered, a delete of a key that does not exist."""
    import anyio

    lock: Any
    if is_postgres(db):  # the locks the warm-up writes take (see PostgresDatabase.serialize)
        import psycopg

        from agenthold.db.postgres import lock_key

        lock = psycopg.connect(str(db), autocommit=True)
        lock.execute("BEGIN")
        for name in ("claims", "state\x1fwarm-up"):
            lock.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(name),))
    else:
        lock = sqlite3.connect(db, isolation_level=None, timeout=60)
        lock.execute("BEGIN IMMEDIATE")
    try:
        async with anyio.create_task_group() as tg:
            for server in servers:
                tg.start_soon(blocked_writes, server)
            # Wait until every server's thread count has risen and then held for a second.
            before = counts = [s.sample()[2] for s in servers]
            steady_since = time.monotonic()
            deadline = steady_since + 15
            while time.monotonic() < deadline:
                await anyio.sleep(0.05)
                now = [s.sample()[2] for s in servers]
                if now != counts:
                    counts, steady_since = now, time.monotonic()
                grown = all(n > b for n, b in zip(now, before, strict=True))
                if grown and time.monotonic() - steady_since >= 1.0:
                    break
            lock.execute("ROLLBACK")
    finally:
        lock.close()


async def blocked_writes(server: Server, calls: int = 24) -> None:
    import anyio

    unknown = "agent-" + "0" * 16
    async with mcp_client(server.url, "auto") as client, anyio.create_task_group() as tg:
        for _ in range(calls):
            if server.tools == "standard":
                arguments = {"resource": "custom://soak/warm-up", "agent_id": unknown}
                tg.start_soon(client.call_tool, "agenthold_claim", arguments)
            else:
                arguments = {"namespace": "warm-up", "key": "none", "deleted_by": "warm-up"}
                tg.start_soon(client.call_tool, "agenthold_delete", {**arguments, "force": True})


@contextlib.asynccontextmanager
async def mcp_client(url: str, mode: Literal["auto", "legacy"]) -> AsyncIterator[Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        await client.list_tools()
        yield client


async def call(book: Soak, client: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    reply: dict[str, Any] = result.structured_content or {}
    if result.is_error or not reply:
        book.errors.append(f"{tool} {arguments}: {reply or result.content}")
        return {"status": "error"}
    book.answers[f"{tool.removeprefix('agenthold_')} {reply['status']}"] += 1
    if "agent_id" in arguments or "agent_id" in reply:
        book.last_call[arguments.get("agent_id") or reply["agent_id"]] = time.monotonic()
    return reply


async def soak_lane(
    book: Soak, lane: int, claims: Server, writes: Server, every: int, started: float
) -> None:
    import anyio

    mode: Literal["auto", "legacy"] = "legacy" if lane == 0 else "auto"
    while book.next_cycle < book.cycles:
        async with mcp_client(claims.url, mode) as c, mcp_client(writes.url, mode) as w:
            book.legacy_sessions += 2 if mode == "legacy" else 0  # one per server
            for _ in range(LEGACY_EVERY if mode == "legacy" else book.cycles):
                if book.next_cycle >= book.cycles:
                    return
                if book.deadline is not None and time.monotonic() > book.deadline:
                    book.cycles = book.next_cycle  # out of time: every lane stops here
                    return
                n = book.next_cycle
                book.next_cycle += 1
                await soak_cycle(book, n, c, w)
                if n and n % every == 0:
                    book.samples.append(
                        (n, time.monotonic() - started, claims.sample(), writes.sample())
                    )
                await anyio.sleep(0)


async def soak_cycle(book: Soak, n: int, c: Any, w: Any) -> None:
    import anyio

    if book.should_register(n):
        reply = await call(book, c, "agenthold_register", name=f"soak-agent-{n}", model="soak")
        if reply["status"] == "registered":
            book.registered.append(reply["agent_id"])
            book.pool.append(reply["agent_id"])
            book.retire_extra()
        return
    agent = book.free_agent()
    while agent is None:  # every pooled agent is in another lane's cycle (rare)
        await anyio.sleep(0.001)
        agent = book.free_agent()
    every = [f"custom://soak/r{i}" for i in range(RESOURCES)]
    resource = book.rng.choice([r for r in every if r not in book.resources_in_use])
    book.agents_in_use.add(agent)
    book.resources_in_use.add(resource)
    try:
        reply = await call(book, c, "agenthold_claim", resource=resource, agent_id=agent)
        if reply["status"] == "busy":
            if reply["held_by"] not in book.abandoned:
                book.busy_named.append(f"{resource} busy, held by {reply['held_by']}")
            return
        if reply["status"] != "claimed":
            return
        if len(book.pool) > LANES + 1 and book.rng.random() < ABANDON:
            book.abandoned[agent] = resource  # it vanishes holding the claim
            book.pool.remove(agent)
            return
        outcome = "released"
        if book.rng.random() < WRITE:
            key = resource.removeprefix("custom://soak/")
            expected = book.versions.get(key, 0)
            wrote = await call(
                book, w, "agenthold_set", namespace=SOAK_NAMESPACE, key=key,
                value={"agent": agent, "cycle": n}, updated_by=agent, expected_version=expected,
            )  # fmt: skip
            if wrote["status"] == "ok":
                book.versions[key] = wrote["version"]
                outcome = "modified"
        reply = await call(
            book, c, "agenthold_release", resource=resource, agent_id=agent, outcome=outcome
        )
        if reply["status"] == "released":
            book.outcomes[outcome] += 1
    finally:
        book.agents_in_use.discard(agent)
        book.resources_in_use.discard(resource)


def due_by(book: Soak, agent: str) -> float:
    """The latest monotonic time by which the reaper must have removed ``agent``: idle for
    --reap-idle (and, holding a claim it abandoned, past its lease), plus one reaper period
    and some slack."""
    idle = max(REAP_IDLE, CLAIM_TTL if agent in book.abandoned else 0.0)
    return book.last_call.get(agent, 0.0) + idle + REAP_EVERY + SLACK


def agent_rows(db: Database) -> set[str]:
    conn = connect(db)
    try:
        return {a for (a,) in conn.execute("SELECT agent_id FROM agents")}
    finally:
        conn.close()


def soak_checks(report: Report, book: Soak, db: Database, at_end: set[str], ended: float) -> None:
    checks = report.checks
    checks.expect("every call was answered without an error", book.errors, "0 errors")
    checks.expect(
        "no write conflicted (only a resource's holder writes its key)",
        [f"{book.answers['set conflict']} conflicts"] if book.answers["set conflict"] else [],
        f"{book.answers['set ok']:,} writes",
    )
    checks.expect(
        "every busy answer named an agent that vanished holding the claim",
        book.busy_named,
        f"{book.answers['claim busy']:,} busy answers",
    )
    by_server = [s[2] for s in book.samples], [s[3] for s in book.samples]
    for server, values in zip(("standard", "advanced"), by_server, strict=True):
        for i, what in enumerate(("resident memory", "open descriptors", "threads")):
            series = [v[i] for v in values]
            grew = growth(series)
            unit = " kB" if i == 0 else ""
            half = len(series) // 2
            highs = (
                f"{grew:.1%}: highest {max(series[:half]):,}{unit} in the first half, "
                f"{max(series[half:]):,}{unit} in the second"
            )
            # Descriptors also get a few of slack: with ~40 open, one connection accepted
            # while another is still closing moves the high by one or two (5% of 37 is 1.85).
            # A leak grows with the work (per call or per session: thousands and dozens here),
            # so it passes that slack many times over.
            rise = max(series[half:]) - max(series[:half])
            slack = {"open descriptors": DESCRIPTOR_SLACK, "threads": THREAD_SLACK}.get(what, 0)
            bound = f"by under 5% (or {slack} more)" if slack else "by under 5%"
            checks.expect(
                f"{server} server: the second half grows {what} {bound}",
                [highs] if grew >= 0.05 and rise > slack else [],
                highs,
            )
    overdue = [a for a in at_end if due_by(book, a) < ended]
    window = REAP_IDLE + REAP_EVERY  # the longest an idle agent is kept, give or take a write
    recent = [a for a in book.registered if book.last_call.get(a, 0.0) > ended - window]
    book.agent_figures = [
        ("agent rows when the cycles ended", len(at_end)),
        (f"agents that made a call in the {window:g} s before", len(recent)),
    ]
    checks.expect(
        "idle agents are reaped: at the end, every agent row is an agent not yet due for it",
        [f"{a} still there, idle for {ended - book.last_call[a]:.1f} s" for a in overdue],
        f"{len(at_end)} rows, none overdue",
    )
    left = agent_rows(db)
    checks.expect(
        "once every agent is idle, every one is reaped",
        [f"{len(left)} agent rows remain"] if left else [],
        f"{len(book.registered):,} registered, 0 left",
    )
    conn = connect(db)
    try:
        check_integrity(conn, checks)
        check_claim_tables(conn, checks)
        check_live_rows(conn, SOAK_NAMESPACE, checks)
        events = Counter(
            (event, outcome or "")
            for event, outcome in conn.execute("SELECT event, outcome FROM claim_events")
        )
        history = conn.execute("SELECT count(*) FROM state_history").fetchone()[0]
    finally:
        conn.close()
    answered = book.answers
    wanted = Counter(
        {
            ("registered", ""): answered["register registered"],
            ("claimed", ""): answered["claim claimed"],
            ("released", "modified"): book.outcomes["modified"],
            ("released", "released"): book.outcomes["released"],
            ("released", "expired"): len(book.abandoned),
            ("reaped", ""): len(book.registered),
        }
    )
    wanted = +wanted  # without zero counts
    checks.expect(
        "claim_events holds one row per registration, claim, release, lapsed claim and reap",
        [f"found {dict(events)}, expected {dict(wanted)}"] if events != wanted else [],
        f"{sum(events.values()):,} rows",
    )
    checks.expect(
        "the history holds one row per answered write",
        [] if history == answered["set ok"] else [f"{history} rows, {answered['set ok']} writes"],
        f"{history:,} rows",
    )


def soak_figures(report: Report, book: Soak, db: Database, elapsed: float) -> None:
    report.figure("cycles", book.next_cycle)
    report.figure("cycles per second", book.next_cycle / elapsed if elapsed else 0.0)
    report.figure("agents registered (all distinct)", len(book.registered))
    report.figure("calls answered", sum(book.answers.values()))
    report.figure("legacy sessions opened and closed", book.legacy_sessions)
    report.figure("agents that vanished holding a claim", len(book.abandoned))
    report.figure("busy answers", book.answers["claim busy"])
    for name, value in book.agent_figures:
        report.figure(name, value)
    report.figure("database size", db_size(db))
    report.figure("seconds (cycles only)", elapsed)
    driver, standard, advanced = book.cpu
    report.figure(
        "CPU seconds: standard / advanced server / driver",
        f"{standard:.1f} / {advanced:.1f} / {driver:.1f}",
    )
    rows = [["cycle", "seconds", "standard: RSS MB", "fds", "threads", "advanced: RSS MB"]]
    rows[0] += ["fds", "threads"]
    picks = sorted({round(i * (len(book.samples) - 1) / 8) for i in range(9)})
    for i in picks:
        n, at, (r1, f1, t1), (r2, f2, t2) = book.samples[i]
        cells = [f"{n:,}", f"{at:.1f}", f"{r1 / 1024:.1f}", str(f1), str(t1)]
        rows.append([*cells, f"{r2 / 1024:.1f}", str(f2), str(t2)])
    report.series = rows


# --------------------------------------------------------------------------------------------
# Reporting and the command line
# --------------------------------------------------------------------------------------------


def render(report: Report) -> str:
    out = [report.title, "", table([["figure", "value"], *map(list, report.figures)])]
    if report.series:
        out += ["", table(report.series)]
    out.append("")
    out += [check_line(c.passed, c.name, c.detail) for c in report.checks.items]
    verdict = "every check passed" if report.passed else f"{len(report.checks.failed())} FAILED"
    out += [f"{report.scenario}: {verdict}", ""]
    return "\n".join(out)


def run(
    scenario: str,
    work: Path,
    sizes: Sizes,
    seed: int,
    seconds: float | None,
    url: str | None = None,
) -> Report:
    place = work / scenario
    place.mkdir()
    if scenario == "crash":
        return run_crash(place, kills=sizes.kills, seed=seed, seconds=seconds, url=url)
    if scenario == "contention":
        return run_contention(
            place,
            processes=sizes.processes,
            threads=sizes.threads,
            seconds=seconds or sizes.seconds,
            seed=seed,
            url=url,
        )
    if scenario == "loris":
        return run_loris(
            place, connections=sizes.slow, seconds=seconds or sizes.attack_seconds, seed=seed
        )
    return run_soak(
        place, cycles=sizes.cycles, agents=sizes.agents, seed=seed, seconds=seconds, url=url
    )


def run_loris(work: Path, *, connections: int, seconds: float, seed: int) -> Report:
    """The slow-loris scenario (torture_loris.py): a legitimate client alone, then under
    ``connections`` slow connections without a token."""
    from torture_loris import run_loris as attack

    report = Report(
        "loris",
        f"loris: one HTTP server, a legitimate client alone and then beside {connections:,} "
        f"slow connections, {seconds:g} s each (seed {seed})",
    )
    report.figures, report.checks, report.series = attack(
        work, connections=connections, seconds=seconds, seed=seed
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario", choices=("crash", "contention", "soak", "loris", "all"), default="all"
    )
    parser.add_argument("--seed", type=int, help="seed of every random choice (default: random)")
    parser.add_argument(
        "--iterations", type=int, help="crash: writers to kill; soak: cycles (default: long sizes)"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        help="contention: how long the workers run; crash and soak: stop after this long",
    )
    parser.add_argument("--processes", type=int, help="contention: worker processes")
    parser.add_argument("--threads", type=int, help="contention: threads per worker process")
    parser.add_argument("--agents", type=int, help="soak: distinct agents")
    parser.add_argument("--connections", type=int, help="loris: slow connections")
    parser.add_argument("--ci", action="store_true", help="the sizes of tests/test_torture.py")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep the files")
    parser.add_argument(
        "--db", metavar="URL", help="run on PostgreSQL: a postgresql:// URL (a schema per scenario)"
    )
    args = parser.parse_args(argv)
    if args.db is not None and not is_postgres(args.db):
        parser.error(f"--db must be a postgresql:// URL, got {args.db!r}")
    base = CI if args.ci else LONG
    sizes = Sizes(
        kills=args.iterations or base.kills,
        processes=args.processes or base.processes,
        threads=args.threads or base.threads,
        seconds=base.seconds,
        cycles=args.iterations or base.cycles,
        agents=args.agents or base.agents,
        slow=args.connections or base.slow,
        attack_seconds=base.attack_seconds,
    )
    for name in ("iterations", "seconds", "processes", "threads", "agents", "connections"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name} must be more than 0, got {value}")
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    every = ("crash", "contention", "soak", "loris")
    scenarios = every if args.scenario == "all" else (args.scenario,)
    if not args.json:
        print(f"agenthold torture run, seed {seed}\n{machine_line(machine())}\n", flush=True)
    reports = []
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = Path(args.keep)
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agenthold-tt-")))
        if args.db and not args.keep:
            stack.callback(drop_schemas, work, args.db)
        for scenario in scenarios:
            report = run(scenario, work, sizes, seed, args.seconds, args.db)
            reports.append(report)
            if not args.json:
                print(render(report), flush=True)
    if args.json:
        print(json.dumps({"seed": seed, "reports": [asdict(r) for r in reports]}, indent=2))
    return 0 if all(r.passed for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
