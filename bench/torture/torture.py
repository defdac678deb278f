"""Proof that agenthold holds up: writers killed mid-work, processes fighting over keys and
resources, and a long-lived HTTP server under agent churn. Each scenario prints its figures and
a pass/FAIL line per property; the exit status is 1 if any property failed.

    python bench/torture/torture.py                   # every scenario, long sizes (~10 minutes)
    python bench/torture/torture.py --scenario crash --iterations 200 --seed 7
    python bench/torture/torture.py --scenario contention --processes 8 --seconds 60
    python bench/torture/torture.py --scenario soak --iterations 20000 --seconds 600
    python bench/torture/torture.py --scenario loris --connections 5000 --seconds 20
    python bench/torture/torture.py --ci              # the sizes tests/test_torture.py runs
    python bench/torture/torture.py --json --keep DIR # the reports as JSON; keep the files
    python bench/torture/torture.py --db postgresql://user@/db?host=/run/postgresql  # PostgreSQL

Scenarios, one module each beside this one (crash.py, contention.py, soak.py, loris.py) on what
they share (scenario.py); the checkers are in checks.py, the worker processes in workers.py, and
tests/test_torture.py runs these same functions at CI sizes:

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
            the database proves the properties listed in checks.check_contention.
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
            checks.growth; the servers' worker-thread pools are filled first, see
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
            The attacker is loris.py, which has the details.

``--seconds`` caps the crash and soak runs too: they stop early and report what they did.

``--db URL`` runs the scenarios on PostgreSQL: each in a new schema of that database (dropped
afterwards unless --keep), checked by the same checkers reading it with plain psycopg; instead of
PRAGMA integrity_check, amcheck verifies the indexes. A killed writer on PostgreSQL is a killed
client: the server rolls back its open transaction.
"""

from __future__ import annotations

import contextlib
import random
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the checkers and workers beside this
from checks import is_postgres
from contention import run_contention
from crash import run_crash
from harness import (
    finish,
    machine,
    machine_line,
    options,
)
from scenario import CI, LONG, Report, Sizes, drop_schemas, render
from soak import run_soak


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
    """The slow-loris scenario (loris.py): a legitimate client alone, then under
    ``connections`` slow connections without a token."""
    from loris import run_loris as attack

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
    parser = options(
        __doc__, quick="the sizes of tests/test_torture.py (as --ci)", full="the long sizes"
    )
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
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep the files")
    parser.add_argument(
        "--db", metavar="URL", help="run on PostgreSQL: a postgresql:// URL (a schema per scenario)"
    )
    args = parser.parse_args(argv)
    if args.db is not None and not is_postgres(args.db):
        parser.error(f"--db must be a postgresql:// URL, got {args.db!r}")
    base = CI if args.ci or args.quick else LONG
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
    finish(args, {"seed": seed, "reports": [asdict(r) for r in reports]}, None)  # printed above
    return 0 if all(r.passed for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
