"""What every torture scenario shares: where its database lives (a file, or a schema of its own
on PostgreSQL), its sizes, its report and how it is printed, the child processes it starts and
the tally of checks repeated after each kill. The scenarios are in crash.py, contention.py,
soak.py and loris.py; torture.py runs them.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the checkers and workers beside this
from checks import Check, Checks, is_postgres
from harness import check_line, table

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers.py"
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


def render(report: Report) -> str:
    out = [report.title, "", table([["figure", "value"], *map(list, report.figures)])]
    if report.series:
        out += ["", table(report.series)]
    out.append("")
    out += [check_line(c.passed, c.name, c.detail) for c in report.checks.items]
    verdict = "every check passed" if report.passed else f"{len(report.checks.failed())} FAILED"
    out += [f"{report.scenario}: {verdict}", ""]
    return "\n".join(out)
