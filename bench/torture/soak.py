"""The soak scenario of bench/torture/torture.py: a long-lived HTTP server under agent churn,
its resources sampled and its event log and history checked against what the calls imply
(see torture.py's help).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the checkers and workers beside this
from checks import (
    check_claim_tables,
    check_integrity,
    check_live_rows,
    connect,
    growth,
    is_postgres,
)
from harness import (
    ServerOutput,
    free_port,
    pg_lock_key,
    process_cpu_seconds,
)
from scenario import Database, Report, database, db_size

from agenthold.store import StateStore

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

        lock = psycopg.connect(str(db), autocommit=True)
        lock.execute("BEGIN")
        for name in ("claims", "state\x1fwarm-up"):
            lock.execute("SELECT pg_advisory_xact_lock(%s)", (pg_lock_key(name),))
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
