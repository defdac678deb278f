"""The one skeleton every script in bench/ shares: its command line, the machine it ran on, the
timing loops, the raw baseline's connection and clock, targets with pass/FAIL, and the tables.

    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
    from harness import ...

Decisions behind it:
- Standard library only. bench/perf/mcp_bench.py --baseline-client imports it under another
  venv's python (mcp 1.x, an older agenthold), where nothing of this package may be loaded.
- Importing it makes this checkout's agenthold importable when none is installed, since the
  scripts run as ``python bench/perf/x.py`` from a source tree. It only looks for the package
  (``importlib.util.find_spec``) and never imports it.
- A benchmark is a user of agenthold like any other: it uses the public API only (the test
  tests/test_bench_layout.py says which), and a raw baseline writes its SQL itself, so that what
  the baseline runs is on the page beside the figure it explains.
- Every script takes ``--quick`` (a smoke run, too small to judge), ``--full`` (the largest
  sizes it knows, where that differs from its default), ``--json`` (the results as JSON instead
  of tables) and ``--output FILE`` (the results as JSON in FILE too); ``finish`` prints them.
- Only what the scripts really do alike lives here. Each script keeps its own statistics where
  they differ (http_bench.py's nearest-rank p99, the key names of each summary), so no number a
  script prints changed when it moved here.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import platform
import socket
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

if importlib.util.find_spec("agenthold") is None:  # a source checkout without agenthold installed
    sys.path.insert(0, str(ROOT))

# The keys of machine() that are not versions of something the script uses.
_MACHINE_FACTS = ("cpus", "platform", "python", "sqlite", "load_average_at_start")


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


def options(
    doc: str | None,
    *,
    quick: str = "a smoke run of a few seconds (too small to judge)",
    full: str | None = None,
) -> argparse.ArgumentParser:
    """A parser with the options every script takes: ``--quick`` and ``--full`` (one or
    neither), ``--json`` and ``--output FILE``. ``doc``'s first paragraph is its description;
    ``full`` is what --full does, where it differs from the default run."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=quick)
    size.add_argument(
        "--full", action="store_true", help=full or "the full run (the default): sizes to judge"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of tables"
    )
    parser.add_argument(
        "--output", type=Path, metavar="FILE", help="also write the results as JSON to FILE"
    )
    return parser


def finish(args: argparse.Namespace, results: Any, report: Callable[[Any], str] | None) -> None:
    """Print ``report(results)`` (or the results as JSON with --json; ``report`` None: the
    script printed its tables as it went), and write the results as JSON to --output's file
    if given."""
    text = json.dumps(results, indent=2, default=str)
    if args.output is not None:
        args.output.write_text(text + "\n")
    if args.json:
        print(text)
    elif report is not None:
        print(report(results))


# --------------------------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------------------------


def load_average() -> float | None:
    """The load average of the last minute, or None where the system does not tell."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # no getloadavg (Windows), or it failed
        return None


def machine(**versions: str) -> dict[str, Any]:
    """Facts about this machine that explain its numbers, with ``versions`` (such as
    ``mcp="2.3.0"``) after SQLite's and the load average at the end."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        **versions,
        "load_average_at_start": load_average(),
    }


def machine_line(facts: dict[str, Any]) -> str:
    """``machine()``'s facts as the one line a report starts with."""
    versions = "".join(
        f", {name} {facts[name]}"
        for name in facts
        if name not in _MACHINE_FACTS and name != "load_average_at_end"
    )
    load = facts["load_average_at_start"]
    return (
        f"machine: {facts['cpus']} CPUs, {facts['platform']}, Python {facts['python']}, "
        f"SQLite {facts['sqlite']}"
        + versions
        + (f", load average {load:.2f} at start" if load is not None else "")
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server started next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerOutput:
    """A server process's stderr, read live on a thread of its own (so the pipe never fills):
    every line, and ``serving`` set once a line says so (or the stream ends)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.serving = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "serving" in line:
                self.serving.set()
        self.serving.set()

    def wait_serving(self, what: str) -> None:
        """Return once the server serves; RuntimeError with its output if it ended first."""
        if not self.serving.wait(60) or self.proc.poll() is not None:
            raise RuntimeError(f"{what} did not start: {''.join(self.lines)}")


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU time process ``pid`` has used so far, from /proc (OSError where
    there is none)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu_seconds(pid: int) -> float:
    """CPU time of the live threads of process ``pid``, to the nanosecond (the scheduler's
    own count in /proc/PID/task/*/schedstat). For a process that uses almost none: the clock
    ticks of process_cpu_seconds (10 ms each) are too coarse to tell 0.1% of a core from 0.3%
    over ten seconds. Threads that end are not counted, so use it across a window in which the
    process starts or ends no thread (an idle server). Falls back to the ticks where the
    kernel has no schedstat."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                total += int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return process_cpu_seconds(pid)
    return total / 1e9


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

Loop = Callable[[int], None]  # performs n operations


def best_rates(loops: dict[str, Loop], n: int, repeats: int) -> dict[str, float]:
    """Operations per second of each loop, the best of ``repeats`` runs of ``n``. The loops take
    turns, so that a burst of load on the machine hits them alike, and the best run is the one
    least disturbed by other work."""
    best = dict.fromkeys(loops, 0.0)
    for _ in range(repeats):
        for name, loop in loops.items():
            started = time.perf_counter()
            loop(n)
            best[name] = max(best[name], n / (time.perf_counter() - started))
    return best


def median_seconds(calls: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median duration of each call over ``runs`` runs, the calls taking turns."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(ts) for name, ts in times.items()}


def percentile(values: Sequence[float], p: int) -> float:
    """The ``p``-th percentile of ``values`` (inclusive method); a single value is its own."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


# --------------------------------------------------------------------------------------------
# The raw baseline
# --------------------------------------------------------------------------------------------


def raw_connection(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection, the baseline's: autocommit (the statements say BEGIN and
    COMMIT themselves), WAL and synchronous NORMAL, as agenthold's default durability."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    conn.execute("PRAGMA journal_mode = wal")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def pg_lock_key(name: str) -> int:
    """The PostgreSQL advisory-lock key agenthold takes for ``name`` (a key, a namespace, the
    claims): the signed 64-bit BLAKE2b of its UTF-8, the same in every process."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def utc_iso() -> str:
    """Now as agenthold stores times: ISO-8601 UTC with microseconds (fixed width)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


# --------------------------------------------------------------------------------------------
# Targets and tables
# --------------------------------------------------------------------------------------------


def table(rows: list[list[str]]) -> str:
    """Rows of cells as aligned text: the first column left, the others right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def check_line(passed: bool, name: str, detail: str) -> str:
    """One indented ``pass``/``FAIL`` line: what was asked, and what was found."""
    return f"  {'pass' if passed else 'FAIL'}  {name}: {detail}"


def as_targets(checks: list[tuple[str, bool, str]]) -> list[dict[str, Any]]:
    """Targets as the results keep them, from (what it asks, passed, what was measured)."""
    return [{"target": t, "passed": ok, "measured": m} for t, ok, m in checks]


def target_lines(results: list[dict[str, Any]], *, quick: bool) -> list[str]:
    """The ``targets`` heading and a pass/FAIL line per target (from ``as_targets``)."""
    heading = "targets" + (" (a quick run is too small to judge them)" if quick else "")
    return [heading] + [check_line(t["passed"], t["target"], t["measured"]) for t in results]
