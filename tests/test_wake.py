"""Tests of how a wait learns of another process's commit on SQLite: file events (inotify on
Linux, kqueue on macOS and the BSDs) wake the change feed, which then checks the database, and a
poll every 2 ms stands in where there are no events (AGENTHOLD_FILE_EVENTS=off forces it).

Waits run in this process or in a child, commits in another process (tests/helpers/
wake_worker.py), on real files. Where a test must prove that an event did the waking, it stretches
the feed's safety-net look (FEED_SAFETY_NET, 0.5 s) past the wait's timeout: a wait that nothing
woke then returns None. Bounds are generous: these tests prove "woken" and "idle", not speed
(bench/perf/mcp_bench.py measures that).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import LineProcess

from agenthold.db.watch import FILE_EVENTS_VARIABLE
from agenthold.store import Record, StateStore

HELPER = Path(__file__).parent / "helpers" / "wake_worker.py"
WAIT = 20.0  # seconds a wait may take here; woken waits take milliseconds
LATE = 10.0  # seconds after the commit by which a woken wait must have returned
IDLE_SECONDS = 3.0  # how long the idle waits whose CPU time is measured last
# CPU a process may use while it waits idle for IDLE_SECONDS: about 1 ms with file events; the
# 2 ms poll they replace used 60-100 ms over the same time.
IDLE_CPU = 0.04

has_events = pytest.mark.skipif(
    not (sys.platform.startswith("linux") or sys.platform == "darwin" or "bsd" in sys.platform),
    reason="no file events on this platform",
)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


class Writer(LineProcess):
    """A wake_worker.py process that sets ns/k to each value it is sent."""

    def __init__(self, db: Path) -> None:
        super().__init__(
            [sys.executable, str(HELPER), "writer", str(db), "ns", "k"],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.next_line() == "ready"

    def commit(self, value: Any) -> dict[str, Any]:
        self.write_line(json.dumps(value))
        reply: dict[str, Any] = json.loads(self.next_line())
        return reply


@pytest.fixture
def writers() -> Iterator[Callable[[Path], Writer]]:
    started: list[Writer] = []

    def start(db: Path) -> Writer:
        started.append(Writer(db))
        return started[-1]

    yield start
    for writer in started:
        assert writer.proc.stdin is not None
        writer.proc.stdin.close()
        writer.proc.wait(timeout=30)
        for stream in (writer.proc.stdout, writer.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def only_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The feed's safety-net look comes only after every wait here has timed out."""
    monkeypatch.setattr("agenthold.db.sqlite_feed.FEED_SAFETY_NET", 2 * WAIT)


def woken_by(store: StateStore, writer: Writer, value: Any, since: int) -> tuple[Record, float]:
    """Watch ns/k past version ``since`` in this process while the writer process commits
    ``value``; the record the watch returned and how long after the commit it returned."""
    seen: dict[str, Any] = {}

    def watch() -> None:
        seen["record"] = store.watch("ns", "k", since_version=since, timeout=WAIT)
        seen["at"] = time.time()

    watcher = threading.Thread(target=watch)
    watcher.start()
    # Asleep by now, past the looks the feed takes right after it starts (a commit seen at the
    # first look would prove nothing about events).
    time.sleep(0.6)
    committed = writer.commit(value)
    watcher.join(WAIT + 10)
    record = seen["record"]
    assert record is not None, "the wait was never woken: it timed out"
    assert (record.value, record.version) == (value, committed["version"])
    late = seen["at"] - committed["at"]
    assert late < LATE, f"woken {late:.2f} s after the commit"
    return record, late


def feed_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("agenthold-")}


@has_events
def test_a_wait_is_woken_by_a_commit_of_another_process_through_file_events(
    db_path: Path, writers: Callable[[Path], Writer], only_events: None
) -> None:
    with StateStore(db_path) as store:
        store.set("ns", "k", "before", updated_by="w")
        writer = writers(db_path)
        woken_by(store, writer, "first", since=1)
        woken_by(store, writer, {"n": 2}, since=2)
        assert "agenthold-file-events" in feed_threads()


def test_with_file_events_off_the_feed_polls_and_still_wakes(
    db_path: Path,
    writers: Callable[[Path], Writer],
    only_events: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FILE_EVENTS_VARIABLE, "off")
    with StateStore(db_path) as store:
        store.set("ns", "k", "before", updated_by="w")
        writer = writers(db_path)
        woken_by(store, writer, "polled", since=1)  # no event: only the 2 ms poll can wake it


@has_events
def test_a_wait_is_woken_after_checkpoints_reset_the_wal(
    db_path: Path, writers: Callable[[Path], Writer], only_events: None
) -> None:
    """A checkpoint copies the WAL into the database; TRUNCATE also empties the WAL file, and
    the next commit after any complete checkpoint writes the WAL from its start again."""
    wal = Path(f"{db_path}-wal")
    with StateStore(db_path) as store:
        store.set("ns", "k", 0, updated_by="w")
        writer = writers(db_path)
        raw = sqlite3.connect(db_path, isolation_level=None)
        try:
            for version, mode in enumerate(("TRUNCATE", "RESTART", "PASSIVE", "TRUNCATE"), 1):
                busy, _, _ = raw.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
                assert busy == 0
                if mode == "TRUNCATE":
                    assert wal.stat().st_size == 0
                woken_by(store, writer, f"after {mode}", since=version)
        finally:
            raw.close()


@has_events
def test_a_wait_hears_a_database_whose_wal_did_not_exist_when_it_began(
    db_path: Path, writers: Callable[[Path], Writer], only_events: None
) -> None:
    """A database in rollback-journal mode, watched read-only (as ``log --follow`` does), has
    no WAL; the writer's agenthold turns WAL on as it opens, so the WAL appears mid-wait."""
    with StateStore(db_path) as store:
        store.set("ns", "k", "rollback journal", updated_by="w")
    raw = sqlite3.connect(db_path, isolation_level=None)
    assert raw.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    raw.close()
    wal = Path(f"{db_path}-wal")
    with StateStore(db_path, read_only=True) as reader:
        assert reader.watch("ns", "k", since_version=1, timeout=0) is None  # the feed starts
        assert not wal.exists()
        seen: dict[str, Any] = {}

        def watch() -> None:
            seen["record"] = reader.watch("ns", "k", since_version=1, timeout=WAIT)

        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(0.6)
        writer = writers(db_path)  # opening it creates the WAL
        assert wal.exists()
        committed = writer.commit("in the new WAL")
        watcher.join(WAIT + 10)
        assert seen["record"] is not None, "the wait never heard the WAL that came later"
        assert seen["record"].version == committed["version"] == 2


@has_events
def test_two_databases_in_one_directory_keep_their_events_when_one_closes(
    tmp_path: Path, writers: Callable[[Path], Writer], only_events: None
) -> None:
    """Their feeds share one watch of the directory; the first to stop must not end the
    other's events."""
    first, second = StateStore(tmp_path / "one.db"), StateStore(tmp_path / "two.db")
    try:
        for store in (first, second):
            store.set("ns", "k", 0, updated_by="w")
            assert store.watch("ns", "k", since_version=1, timeout=0) is None  # feeds start
        woken_by(first, writers(tmp_path / "one.db"), "one", since=1)
        first.close()  # its feed stops, and gives up its part of the watch
        woken_by(second, writers(tmp_path / "two.db"), "two", since=1)
    finally:
        first.close()
        second.close()


def idle_watch(db: Path, env: dict[str, str]) -> dict[str, Any]:
    """What a wake_worker.py process that waits IDLE_SECONDS, unwoken, reports."""
    run = LineProcess(
        [sys.executable, str(HELPER), "idle-watch", str(db), "ns", "k", str(IDLE_SECONDS)],
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        assert run.next_line() == "ready"
        report: dict[str, Any] = json.loads(run.next_line(IDLE_SECONDS + 30))
        return report
    finally:
        run.kill()
        for stream in (run.proc.stdout, run.proc.stderr):
            if stream is not None:
                stream.close()


@has_events
def test_an_idle_wait_uses_almost_no_cpu(db_path: Path) -> None:
    with StateStore(db_path) as store:
        store.set("ns", "k", 1, updated_by="w")
    report = idle_watch(db_path, {})
    assert report["woken"] is False
    assert report["cpu"] < IDLE_CPU, f"{report['cpu']:.3f} s of CPU in {IDLE_SECONDS:g} s idle"
    assert "agenthold-file-events" in report["threads"]


def test_with_file_events_off_an_idle_wait_polls_on_its_own_thread(db_path: Path) -> None:
    with StateStore(db_path) as store:
        store.set("ns", "k", 1, updated_by="w")
    report = idle_watch(db_path, {FILE_EVENTS_VARIABLE: "off"})
    assert report["woken"] is False
    assert "agenthold-change-feed" in report["threads"]
    assert "agenthold-file-events" not in report["threads"]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (Linux: /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@linux_only
def test_an_idle_log_follow_uses_almost_no_cpu_and_still_prints_new_events(
    db_path: Path, writers: Callable[[Path], Writer]
) -> None:
    """On a database only a store used (no claims tables), as on any other."""
    with StateStore(db_path) as store:
        store.set("ns", "k", "old", updated_by="w")
    follow = LineProcess(
        [sys.executable, "-m", "agenthold", "log", "--follow", "--json", "--db", str(db_path)],
        stderr=subprocess.PIPE,
    )
    try:
        assert json.loads(follow.next_line())["value"] == "old"
        time.sleep(0.5)  # past its start
        before = cpu_seconds(follow.proc.pid)
        time.sleep(IDLE_SECONDS)
        used = cpu_seconds(follow.proc.pid) - before
        assert used < IDLE_CPU, f"{used:.3f} s of CPU in {IDLE_SECONDS:g} s idle"
        writers(db_path).commit("new")
        assert json.loads(follow.next_line(LATE))["value"] == "new"
        follow.proc.send_signal(signal.SIGTERM)
        assert follow.proc.wait(timeout=30) == 0
        assert follow.proc.stderr is not None
        assert follow.proc.stderr.read() == ""  # the change feed read every table it needs
    finally:
        follow.kill()
        for stream in (follow.proc.stdout, follow.proc.stderr):
            if stream is not None:
                stream.close()
