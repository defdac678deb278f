"""Tests for agenthold.store: the versioned state store and the guarantees it makes.

Everything runs on real databases, real threads and real processes; nothing of ours is mocked:
the contract tests (marked ``backends``) on a SQLite file and on PostgreSQL, the rest on SQLite
files (or ":memory:"). Other processes are tests/helpers/store_worker.py, started with the running
interpreter; they say "ready" when they have opened the database, so a test acts at a known
moment instead of sleeping. Time-based checks use short timeouts and generous bounds, because the
machine that runs them may be busy: they prove "woken, not timed out", never a latency.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers.store_worker import increment_with_retry
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import LEGACY_SCHEMA, LineProcess, child_env, run_threads

from agenthold.store import (
    DEFAULT_MAX_VALUE_BYTES,
    MAX_DEPTH,
    MAX_KEY_LENGTH,
    MAX_NAMESPACE_LENGTH,
    MAX_WAIT_SECONDS,
    MAX_WRITER_LENGTH,
    PAGE_SIZE,
    SCHEMA_VERSION,
    AgentholdError,
    BusyError,
    ChangeSource,
    ConflictError,
    DeleteResult,
    Export,
    HistoryEntry,
    IncompatibleDatabaseError,
    InvalidInputError,
    NamespaceInfo,
    NotFoundError,
    Record,
    SetResult,
    StateStore,
    UnavailableError,
    key_topic,
    utc_iso,
)

HELPER = Path(__file__).parent / "helpers" / "store_worker.py"
APPLICATION_ID = 0x41474844  # "AGHD", how an agenthold database marks itself
# what a StateStore alone creates: its own tables and the table of component versions
OUR_TABLES = {"state", "state_history", "agenthold_components", "agenthold_meta"}

posix_only = pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals and fork()")


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


class Worker(LineProcess):
    """A store_worker.py process whose stdout lines are read by a thread into a queue."""

    def __init__(self, *args: str) -> None:
        argv = [sys.executable, str(HELPER), *args]
        super().__init__(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)

    def expect(self, wanted: str) -> None:
        line = self.next_line()
        assert line == wanted, line

    def result(self) -> Any:
        return json.loads(self.next_line())

    def send(self, line: str = "go") -> None:
        self.write_line(line)

    def finish(self) -> int:
        return self.proc.wait(timeout=30)


@pytest.fixture
def workers() -> Iterator[Callable[..., Worker]]:
    """Start store_worker.py processes; any still running at the end of the test are killed."""
    started: list[Worker] = []

    def start(*args: str | Path) -> Worker:
        worker = Worker(*map(str, args))
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()
        for stream in (worker.proc.stdin, worker.proc.stdout, worker.proc.stderr):
            if stream is not None:
                stream.close()


def file_state(path: Path) -> tuple[str, list[str]]:
    """The sha256 of a file and the names next to it, to prove that nothing was written."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"
    return digest, sorted(p.name for p in path.parent.iterdir())


def identical(a: Any, b: Any) -> bool:
    """Equal with the same types, float signs included (-0.0 is not 0.0, 1.0 is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(identical(a[k], b[k]) for k in a)
    return bool(a == b)


def nested_lists(depth: int) -> list[Any]:
    """``depth`` lists inside each other: nested_lists(2) == [[]]."""
    return functools.reduce(lambda inner, _: [inner], range(depth - 1), [])


def raw_connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


# --------------------------------------------------------------------------------------------
# Reading and writing
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_get_returns_the_written_value_with_version_writer_and_utc_time(store: StateStore) -> None:
    result = store.set("orders", "o-1", {"status": "received"}, updated_by="intake")
    record = store.get("orders", "o-1")
    assert result == SetResult("orders", "o-1", version=1, previous_version=0)
    assert (record.namespace, record.key, record.value) == ("orders", "o-1", {"status": "received"})
    assert (record.version, record.updated_by, record.deleted) == (1, "intake", False)
    assert record.updated_at.endswith("+00:00")
    assert len(record.updated_at) == len("2025-01-01T00:00:00.000000+00:00")


@pytest.mark.backends
def test_get_of_a_key_without_a_live_record_raises_not_found(store: StateStore) -> None:
    with pytest.raises(NotFoundError, match="'missing'") as info:
        store.get("ns", "missing")
    assert (info.value.namespace, info.value.key) == ("ns", "missing")
    store.set("ns", "gone", 1, updated_by="w")
    store.delete("ns", "gone", deleted_by="w")
    with pytest.raises(NotFoundError):
        store.get("ns", "gone")


@pytest.mark.backends
def test_every_write_and_delete_raises_the_version_by_one(store: StateStore) -> None:
    versions = [store.set("ns", "k", i, updated_by="w").version for i in range(3)]
    deleted = store.delete("ns", "k", deleted_by="w")
    again = store.set("ns", "k", "back", updated_by="w")
    assert versions == [1, 2, 3]
    assert (deleted.deleted_version, deleted.version) == (3, 4)
    assert (again.version, again.previous_version) == (5, 0)
    assert store.get("ns", "k").version == 5


@pytest.mark.backends
def test_stale_version_after_delete_is_rejected(store: StateStore) -> None:
    """0.10.0 restarted a re-created key at version 1, so a writer holding version 1 from the
    key's first life silently overwrote the new value. Versions now continue across lives."""
    stale = store.set("ns", "k", "first life", updated_by="a").version
    store.delete("ns", "k", deleted_by="b")
    recreated = store.set("ns", "k", "second life", updated_by="b", expected_version=0)
    assert recreated.version > stale
    with pytest.raises(ConflictError) as info:
        store.set("ns", "k", "stale write", updated_by="a", expected_version=stale)
    assert info.value.detail["actual_version"] == recreated.version
    assert store.get("ns", "k").value == "second life"


@pytest.mark.backends
def test_stale_delete_after_recreate_is_rejected(store: StateStore) -> None:
    stale = store.set("ns", "k", 1, updated_by="a").version
    store.delete("ns", "k", deleted_by="b")
    store.set("ns", "k", 2, updated_by="b")
    with pytest.raises(ConflictError):
        store.delete("ns", "k", deleted_by="a", expected_version=stale)
    assert store.get("ns", "k").value == 2


@pytest.mark.backends
def test_expected_version_zero_creates_only_when_there_is_no_live_record(
    store: StateStore,
) -> None:
    assert store.set("ns", "k", "a", updated_by="w", expected_version=0).version == 1
    with pytest.raises(ConflictError):
        store.set("ns", "k", "b", updated_by="w", expected_version=0)
    store.delete("ns", "k", deleted_by="w")
    assert store.set("ns", "k", "c", updated_by="w", expected_version=0).version == 3


@pytest.mark.backends
def test_expected_version_must_match_the_live_version(store: StateStore) -> None:
    store.set("ns", "k", "v1", updated_by="w")
    result = store.set("ns", "k", "v2", updated_by="w", expected_version=1)
    assert (result.version, result.previous_version) == (2, 1)
    for wrong in (1, 3, 99):
        with pytest.raises(ConflictError):
            store.set("ns", "k", "lost", updated_by="w", expected_version=wrong)
    assert store.get("ns", "k").value == "v2"


@pytest.mark.backends
def test_unconditional_write_replaces_any_version(store: StateStore) -> None:
    store.set("ns", "k", 1, updated_by="a")
    store.set("ns", "k", 2, updated_by="b")
    result = store.set("ns", "k", 3, updated_by="c", expected_version=None)
    assert (result.version, result.previous_version) == (3, 2)


@pytest.mark.backends
def test_conflict_detail_carries_the_live_version_value_writer_and_time(store: StateStore) -> None:
    store.set("ns", "k", {"n": 1}, updated_by="alice")
    live = store.get("ns", "k")
    with pytest.raises(ConflictError) as info:
        store.set("ns", "k", {"n": 2}, updated_by="bob", expected_version=7)
    assert info.value.detail == {
        "namespace": "ns",
        "key": "k",
        "expected_version": 7,
        "actual_version": 1,
        "actual_value": {"n": 1},
        "actual_updated_by": "alice",
        "actual_updated_at": live.updated_at,
    }
    assert info.value.current == live
    assert "expected version 7, the live version is 1 (written by 'alice')" in str(info.value)


@pytest.mark.backends
def test_conflict_without_a_live_record_reports_version_zero(store: StateStore) -> None:
    with pytest.raises(ConflictError) as never_written:
        store.set("ns", "new", 1, updated_by="w", expected_version=1)
    store.set("ns", "old", 1, updated_by="w")
    store.delete("ns", "old", deleted_by="w")
    with pytest.raises(ConflictError) as deleted:
        store.set("ns", "old", 1, updated_by="w", expected_version=1)
    for info in (never_written, deleted):
        detail = info.value.detail
        assert detail["actual_version"] == 0
        assert detail["actual_value"] is None
        assert detail["actual_updated_by"] is None
        assert detail["actual_updated_at"] is None
        assert info.value.current is None
        assert "no live record" in str(info.value) and "written by" not in str(info.value)


@pytest.mark.backends
def test_rejected_write_leaves_value_and_history_unchanged(store: StateStore) -> None:
    store.set("ns", "k", "kept", updated_by="w")
    before = store.history("ns", "k")
    with pytest.raises(ConflictError):
        store.set("ns", "k", "lost", updated_by="w", expected_version=5)
    assert store.get("ns", "k").value == "kept"
    assert store.history("ns", "k") == before


@pytest.mark.backends
def test_delete_leaves_a_tombstone_and_reports_both_versions(store: StateStore) -> None:
    store.set("ns", "k", "v", updated_by="w")
    store.set("ns", "k", "v2", updated_by="w")
    result = store.delete("ns", "k", deleted_by="cleaner", expected_version=2)
    assert result == DeleteResult("ns", "k", 2, 3, "cleaner", result.deleted_at)
    assert result.to_dict() == {
        "namespace": "ns",
        "key": "k",
        "deleted_by": "cleaner",
        "deleted_version": 2,
        "tombstone_version": 3,
        "deleted_at": result.deleted_at,
    }
    tombstone = store.history("ns", "k")[0]
    assert tombstone == HistoryEntry(3, None, "cleaner", result.deleted_at, "delete")


@pytest.mark.backends
def test_delete_of_a_key_without_a_live_record_raises_not_found(store: StateStore) -> None:
    with pytest.raises(NotFoundError):
        store.delete("ns", "never", deleted_by="w")
    store.set("ns", "once", 1, updated_by="w")
    store.delete("ns", "once", deleted_by="w")
    with pytest.raises(NotFoundError):
        store.delete("ns", "once", deleted_by="w")
    assert len(store.history("ns", "once")) == 2


@pytest.mark.backends
def test_delete_with_a_stale_version_is_a_conflict_and_writes_nothing(store: StateStore) -> None:
    store.set("ns", "k", "a", updated_by="w")
    store.set("ns", "k", "b", updated_by="w")
    with pytest.raises(ConflictError) as info:
        store.delete("ns", "k", deleted_by="w", expected_version=1)
    assert info.value.detail["actual_version"] == 2
    assert info.value.detail["actual_value"] == "b"
    assert store.get("ns", "k").version == 2
    assert [h.version for h in store.history("ns", "k")] == [2, 1]


@pytest.mark.backends
def test_list_keys_returns_live_records_sorted_by_key(store: StateStore) -> None:
    for key in ["b", "a", "é", "B", "c", "a2"]:
        store.set("ns", key, key.upper(), updated_by="w")
    store.set("other", "z", 0, updated_by="w")
    store.delete("ns", "c", deleted_by="w")
    records = store.list_keys("ns")
    assert [r.key for r in records] == sorted(["b", "a", "é", "B", "a2"])
    assert all(r == store.get("ns", r.key) for r in records)
    assert store.list_keys("empty") == []


@pytest.mark.backends
def test_list_namespaces_counts_live_records_and_leaves_out_empty_namespaces(
    store: StateStore,
) -> None:
    store.set("beta", "x", 1, updated_by="w")
    store.set("alpha", "x", 1, updated_by="w")
    store.set("alpha", "y", 1, updated_by="w")
    store.set("gone", "x", 1, updated_by="w")
    store.delete("gone", "x", deleted_by="w")
    store.set("cleared", "x", 1, updated_by="w")
    store.clear_namespace("cleared", deleted_by="w")
    namespaces = store.list_namespaces()
    assert namespaces == [NamespaceInfo("alpha", 2), NamespaceInfo("beta", 1)]
    assert namespaces[0].to_dict() == {"namespace": "alpha", "record_count": 2}


@pytest.mark.backends
def test_history_lists_writes_and_deletes_newest_first(store: StateStore) -> None:
    store.set("ns", "k", "one", updated_by="a")
    store.set("ns", "k", "two", updated_by="b")
    store.delete("ns", "k", deleted_by="c")
    store.set("ns", "k", "four", updated_by="d")
    history = store.history("ns", "k")
    assert [(h.version, h.value, h.updated_by, h.event_type) for h in history] == [
        (4, "four", "d", "write"),
        (3, None, "c", "delete"),
        (2, "two", "b", "write"),
        (1, "one", "a", "write"),
    ]
    assert [h.updated_at for h in history] == sorted((h.updated_at for h in history), reverse=True)
    assert history[1].to_dict() == {
        "version": 3,
        "value": None,
        "updated_by": "c",
        "updated_at": history[1].updated_at,
        "event_type": "delete",
    }


@pytest.mark.backends
def test_history_limit_keeps_the_newest_entries(store: StateStore) -> None:
    for i in range(15):
        store.set("ns", "k", i, updated_by="w")
    assert [h.version for h in store.history("ns", "k")] == list(range(15, 5, -1))
    assert [h.version for h in store.history("ns", "k", limit=2)] == [15, 14]
    assert len(store.history("ns", "k", limit=10**30)) == 15


@pytest.mark.backends
def test_history_of_a_never_written_key_is_empty(store: StateStore) -> None:
    store.set("ns", "other", 1, updated_by="w")
    assert store.history("ns", "never") == []
    assert store.history("no-such-namespace", "never") == []


@pytest.mark.backends
def test_export_holds_live_records_with_their_whole_history(store: StateStore) -> None:
    store.set("ns", "b", "b1", updated_by="w")
    store.set("ns", "a", "a1", updated_by="w")
    store.delete("ns", "a", deleted_by="w")
    store.set("ns", "a", "a3", updated_by="w")  # a second life: its history has 3 entries
    store.set("ns", "gone", 1, updated_by="w")
    store.delete("ns", "gone", deleted_by="w")  # deleted keys are not exported
    store.set("elsewhere", "x", 1, updated_by="w")
    export = store.export("ns")
    assert isinstance(export, Export)
    assert [r.record.key for r in export.records] == ["a", "b"]
    assert (export.record_count, export.history_count) == (2, 4)
    a = export.records[0]
    assert a.record == store.get("ns", "a")
    assert [(h.version, h.event_type) for h in a.history] == [
        (3, "write"),
        (2, "delete"),
        (1, "write"),
    ]
    as_dict = export.to_dict()
    assert as_dict["namespace"] == "ns"
    assert as_dict["exported_at"] == export.exported_at
    assert (as_dict["record_count"], as_dict["history_count"]) == (2, 4)
    assert as_dict["records"][0] == {
        "key": "a",
        "value": "a3",
        "version": 3,
        "updated_by": "w",
        "updated_at": a.record.updated_at,
        "history": [h.to_dict() for h in a.history],
    }
    assert store.export("empty").to_dict()["records"] == []


@pytest.mark.backends
def test_a_namespace_is_listed_and_exported_in_pages_that_cover_it_once(
    store: StateStore,
) -> None:
    """Pages by key: every live key exactly once, in order, whatever the page size; a page
    stops early at its byte budget (after its first record); a tombstone is never listed."""
    keys = [f"k{i:03d}" for i in range(25)]
    for key in keys:
        store.set("ns", key, {"key": key, "pad": "x" * 100}, updated_by="w")
    store.set("ns", "k010", "v2", updated_by="w", expected_version=1)
    store.delete("ns", "k007", deleted_by="w")
    live = [k for k in keys if k != "k007"]
    for limit, max_bytes in ((1, 10**9), (7, 10**9), (24, 10**9), (100, 10**9), (100, 300)):
        listed: list[str] = []
        exported: list[str] = []
        after = ""
        while True:
            page, nxt = store.list_page("ns", after=after, limit=limit, max_bytes=max_bytes)
            assert 1 <= len(page) <= limit
            listed += [r.key for r in page]
            if nxt is None:
                break
            assert nxt == page[-1].key
            after = nxt
        after = ""
        while True:
            part = store.export("ns", after=after, limit=limit, max_bytes=max_bytes)
            exported += [r.record.key for r in part.records]
            if part.next_after is None:
                break
            after = part.next_after
        assert listed == exported == live, (limit, max_bytes)
    page, nxt = store.list_page("ns", max_bytes=300)  # ~130 bytes a value: two fit
    assert (len(page), nxt) == (2, "k001")
    part = store.export("ns", after="k009", limit=1)
    assert [(r.record.key, [h.version for h in r.history]) for r in part.records] == [
        ("k010", [2, 1])
    ]
    assert part.next_after == "k010"
    assert store.list_page("ns", after="k024") == ([], None)
    assert store.export("ns", limit=1000).next_after is None
    assert store.export("ns").next_after is None  # not paged: all of it, as ever
    for bad in ({"limit": 0}, {"max_bytes": 0}, {"after": "x" * 10_000}):
        with pytest.raises(InvalidInputError):
            store.list_page("ns", **bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            store.export("ns", **bad)  # type: ignore[arg-type]


@pytest.mark.backends
def test_export_is_one_snapshot_while_another_thread_writes(store: StateStore) -> None:
    """Each record's newest history entry is the record itself, and no history is longer than
    its version, although a writer keeps committing while the export reads."""
    keys = [f"key-{i:03}" for i in range(200)]
    for key in keys:
        store.set("ns", key, {"n": 0, "pad": "p" * 200}, updated_by="setup")
    stop = threading.Event()

    def write() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            store.set("ns", rng.choice(keys), {"n": 1, "pad": "q" * 200}, updated_by="writer")

    writer = threading.Thread(target=write)
    writer.start()
    try:
        deadline = time.monotonic() + 0.5
        exports = 0
        while time.monotonic() < deadline or exports < 5:
            exports += 1
            for exported in store.export("ns").records:
                newest = exported.history[0]
                assert newest.version == exported.record.version, exported.record.key
                assert newest.value == exported.record.value
                assert len(exported.history) == exported.record.version
    finally:
        stop.set()
        writer.join()
    assert any(r.version > 1 for r in store.list_keys("ns"))  # the writer did write


@pytest.mark.backends
def test_clear_namespace_tombstones_every_live_key_in_one_step(store: StateStore) -> None:
    store.set("ns", "b", 1, updated_by="w")
    store.set("ns", "a", 1, updated_by="w")
    store.set("ns", "a", 2, updated_by="w")
    store.set("ns", "dead", 1, updated_by="w")
    store.delete("ns", "dead", deleted_by="w")
    store.set("keep", "a", 1, updated_by="w")
    assert store.clear_namespace("ns", deleted_by="janitor") == ["a", "b"]
    assert store.list_keys("ns") == []
    assert store.list_keys("keep")[0].value == 1
    newest = store.history("ns", "a")[0]
    assert (newest.version, newest.event_type, newest.updated_by) == (3, "delete", "janitor")
    assert len(store.history("ns", "dead")) == 2  # it had no live record: no second tombstone
    assert store.set("ns", "a", "again", updated_by="w").version == 4
    assert store.clear_namespace("empty", deleted_by="janitor") == []


def test_clear_namespace_that_cannot_finish_changes_nothing(store: StateStore) -> None:
    """The database may not grow (its page limit stands in for a full disk), so the tombstones
    cannot all be written: the whole clear is rolled back."""
    for i in range(300):
        store.set("ns", f"key-{i:03}", i, updated_by="w")
    pages = store.db.fetchone("PRAGMA page_count")[0]
    store.db.fetchone(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(UnavailableError, match="cannot grow"):
        store.clear_namespace("ns", deleted_by="janitor")
    assert len(store.list_keys("ns")) == 300
    assert store.history("ns", "key-000")[0].event_type == "write"
    assert store.list_namespaces() == [NamespaceInfo("ns", 300)]


def test_write_that_does_not_fit_raises_unavailable_and_writes_nothing(store: StateStore) -> None:
    store.set("ns", "k", "small", updated_by="w")
    pages = store.db.fetchone("PRAGMA page_count")[0]
    store.db.fetchone(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(UnavailableError, match="nothing was written"):
        store.set("ns", "k", "x" * 200_000, updated_by="w")
    assert store.get("ns", "k").value == "small"
    assert len(store.history("ns", "k")) == 1


def test_records_convert_to_plain_dicts() -> None:
    record = Record("ns", "k", [1], 2, "w", "t")
    assert record.to_dict() == {
        "namespace": "ns",
        "key": "k",
        "value": [1],
        "version": 2,
        "updated_by": "w",
        "updated_at": "t",
    }
    assert Record("ns", "k", None, 3, "w", "t", deleted=True).to_dict()["deleted"] is True
    assert SetResult("ns", "k", 2, 1).to_dict() == {
        "namespace": "ns",
        "key": "k",
        "version": 2,
        "previous_version": 1,
    }


def test_utc_iso_writes_fixed_width_utc_times() -> None:
    assert utc_iso(0) == "1970-01-01T00:00:00.000000+00:00"
    assert utc_iso(1.5) == "1970-01-01T00:00:01.500000+00:00"
    assert len(utc_iso()) == len(utc_iso(0))


def _datetime_iso(timestamp: float) -> str | type[BaseException]:
    try:
        return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="microseconds")
    except (OverflowError, ValueError, OSError) as exc:
        return type(exc)


@settings(max_examples=2000, deadline=None)
@given(
    st.one_of(
        st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
        # a microsecond and a half: the rounding of a fraction that sits on the half
        st.integers(0, 4_000_000_000).map(lambda s: s + 0.0000005),
        st.integers(0, 4_000_000_000).map(lambda s: s + 0.9999995),
        st.sampled_from([0.0, -0.0000005, 253402300799.9999995, 253402300800.0, -1.0]),
    )
)
def test_utc_iso_formats_a_timestamp_exactly_as_datetime_does(timestamp: float) -> None:
    # utc_iso keeps the whole-second text of its last call instead of building a datetime: it
    # must still give datetime's text (and datetime's refusal) for every timestamp
    expected = _datetime_iso(timestamp)
    try:
        got: str | type[BaseException] = utc_iso(timestamp)
    except (OverflowError, ValueError, OSError) as exc:
        got = type(exc)
    assert got == expected
    if isinstance(expected, str):
        assert utc_iso(timestamp) == expected  # the kept second gives the same text again


def test_utc_iso_of_now_reads_the_clock_it_is_called_at() -> None:
    before = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    now = utc_iso()
    after = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    assert before <= now <= after


# --------------------------------------------------------------------------------------------
# Values: strict JSON in, the same value out
# --------------------------------------------------------------------------------------------

circular_list: list[Any] = []
circular_list.append(circular_list)
circular_dict: dict[str, Any] = {}
circular_dict["self"] = {"inner": circular_dict}

REJECTED_VALUES = [
    pytest.param(float("nan"), "NaN or Infinity", id="nan"),
    pytest.param(float("inf"), "NaN or Infinity", id="infinity"),
    pytest.param(float("-inf"), "NaN or Infinity", id="minus-infinity"),
    pytest.param({"a": [1, {"b": float("nan")}]}, "NaN or Infinity", id="nested-nan"),
    pytest.param([[float("inf")]], "NaN or Infinity", id="nested-infinity"),
    pytest.param({1: "a"}, "object key 1 of type int", id="int-key"),
    pytest.param({None: "a"}, "object key None", id="none-key"),
    pytest.param({"ok": {(1, 2): "a"}}, "of type tuple", id="nested-tuple-key"),
    pytest.param({1, 2}, "contains a set", id="set"),
    pytest.param(frozenset([1]), "contains a frozenset", id="frozenset"),
    pytest.param((1, 2), "contains a tuple", id="tuple"),
    pytest.param([b"raw"], "contains a bytes", id="bytes"),
    pytest.param(object(), "contains a object", id="object"),
    pytest.param({"price": Decimal("1.10")}, "contains a Decimal", id="decimal"),
    pytest.param(circular_list, "circular", id="circular-list"),
    pytest.param(circular_dict, "circular", id="circular-dict"),
    pytest.param(nested_lists(MAX_DEPTH + 1), "nested deeper than 256", id="too-deep"),
    pytest.param("half \ud800 pair", "lone surrogate", id="lone-surrogate"),
    pytest.param({"\udc00": 1}, "lone surrogate", id="lone-surrogate-key"),
    pytest.param("x" * (DEFAULT_MAX_VALUE_BYTES - 1), "the limit is 1,048,576 bytes", id="too-big"),
    pytest.param(
        10**5000,
        "integer too long to write as JSON",
        id="too-many-digits",
        marks=pytest.mark.skipif(
            not hasattr(sys, "get_int_max_str_digits"), reason="no integer digit limit"
        ),
    ),
]


@pytest.mark.backends
@pytest.mark.parametrize(("value", "problem"), REJECTED_VALUES)
def test_value_that_is_not_strict_json_is_rejected_and_nothing_is_written(
    store: StateStore, value: Any, problem: str
) -> None:
    store.set("ns", "k", "before", updated_by="w")
    with pytest.raises(InvalidInputError, match="value") as info:
        store.set("ns", "k", value, updated_by="w")
    assert problem in str(info.value)
    assert isinstance(info.value, ValueError)
    assert store.get("ns", "k").value == "before"
    assert len(store.history("ns", "k")) == 1


def test_value_nested_exactly_to_the_depth_limit_is_accepted(memory_store: StateStore) -> None:
    deepest = nested_lists(MAX_DEPTH)
    memory_store.set("ns", "deep", deepest, updated_by="w")
    assert memory_store.get("ns", "deep").value == deepest
    mixed: Any = "leaf"
    for i in range(MAX_DEPTH):
        mixed = {"d": mixed} if i % 2 else [mixed]
    memory_store.set("ns", "mixed", mixed, updated_by="w")
    assert memory_store.get("ns", "mixed").value == mixed


def test_values_at_the_size_limit_are_accepted_and_one_byte_more_is_not(tmp_path: Path) -> None:
    with StateStore(tmp_path / "small.db", max_value_bytes=10) as store:
        store.set("ns", "k", "12345678", updated_by="w")  # '"12345678"': 10 bytes
        store.set("ns", "k", "ééé", updated_by="w")  # 2 quotes + 3 two-byte letters: 8 bytes
        with pytest.raises(InvalidInputError, match="11 bytes as JSON; the limit is 10"):
            store.set("ns", "k", "123456789", updated_by="w")
        with pytest.raises(InvalidInputError, match="12 bytes"):
            store.set("ns", "k", "ééééé", updated_by="w")
        assert store.get("ns", "k").value == "ééé"


EXACT_VALUES = [
    pytest.param(2**64, id="2**64"),
    pytest.param(-(10**40), id="-10**40"),
    pytest.param(0.1, id="0.1"),
    pytest.param(1e308, id="1e308"),
    pytest.param(-0.0, id="minus-zero"),
    pytest.param(5e-324, id="smallest-float"),
    pytest.param(1.0, id="float-one"),
    pytest.param(True, id="true"),
    pytest.param(None, id="null"),
    pytest.param("", id="empty-string"),
    pytest.param("héllo ✓ 𝄞 日本語 \u200b \x00 \n", id="unicode"),
    pytest.param([], id="empty-list"),
    pytest.param({}, id="empty-object"),
    pytest.param(
        {"b": [1, 2.5, {"c": None, "": False}], "a": "x", "日": [[], {}]}, id="nested-object"
    ),
]


@pytest.mark.backends
@pytest.mark.parametrize("value", EXACT_VALUES)
def test_stored_value_comes_back_exactly(store: StateStore, value: Any) -> None:
    store.set("ns", "k", value, updated_by="w")
    assert identical(store.get("ns", "k").value, value)
    assert identical(store.history("ns", "k")[0].value, value)
    assert identical(store.list_keys("ns")[0].value, value)
    assert identical(store.export("ns").records[0].record.value, value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@pytest.mark.backends
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=json_values)
def test_any_json_value_round_trips_exactly(store: StateStore, value: Any) -> None:
    # One store for every example (a fresh PostgreSQL schema each would be slow): each example
    # writes a new version of the key, so get and the newest history entry must hold it.
    store.set("ns", "k", value, updated_by="w")
    assert identical(store.get("ns", "k").value, value)
    assert identical(store.history("ns", "k")[0].value, value)


# --------------------------------------------------------------------------------------------
# Names and numbers are validated
# --------------------------------------------------------------------------------------------

BAD_NAMES = [
    pytest.param(None, "must be a string, got NoneType", id="none"),
    pytest.param(42, "must be a string, got int", id="int"),
    pytest.param(b"bytes", "must be a string, got bytes", id="bytes"),
    pytest.param(["k"], "must be a string, got list", id="list"),
    pytest.param("", "must not be empty or blank", id="empty"),
    pytest.param(" ", "must not be empty or blank", id="space"),
    pytest.param("   ", "must not be empty or blank", id="spaces"),
    pytest.param("\u3000", "must not be empty or blank", id="ideographic-space"),
    pytest.param("a\nb", "control character", id="newline"),
    pytest.param("a\tb", "control character", id="tab"),
    pytest.param("a\rb", "control character", id="carriage-return"),
    pytest.param("a\x00b", "control character, and null bytes", id="nul"),
    pytest.param("a\x7fb", "control character", id="del"),
    pytest.param("a\x85b", "control character", id="c1-next-line"),
    pytest.param("a\x9fb", "control character", id="c1-last"),
    pytest.param("a\ud800b", "lone surrogate", id="lone-surrogate"),
    pytest.param("evil\u202egnp.exe", "invisible character U+202E", id="right-to-left-override"),
    pytest.param("a\u2066b\u2069", "invisible character U+2066", id="left-to-right-isolate"),
    pytest.param("a\u200fb", "invisible character U+200F", id="right-to-left-mark"),
    pytest.param("ad\u200bmin", "invisible character U+200B", id="zero-width-space"),
    pytest.param("\ufeffkey", "invisible character U+FEFF", id="byte-order-mark"),
    pytest.param("a\u2060b", "invisible character U+2060", id="word-joiner"),
    pytest.param("a\u2028b", "invisible character U+2028", id="line-separator"),
    pytest.param("a\u2029b", "invisible character U+2029", id="paragraph-separator"),
]

# Every public call that takes a name, with the bad value in one argument.
NAME_USES: list[tuple[str, Callable[[StateStore, Any], Any]]] = [
    ("namespace", lambda s, bad: s.set(bad, "k", 1, updated_by="w")),
    ("key", lambda s, bad: s.set("ns", bad, 1, updated_by="w")),
    ("updated_by", lambda s, bad: s.set("ns", "k", 1, updated_by=bad)),
    ("namespace", lambda s, bad: s.get(bad, "k")),
    ("key", lambda s, bad: s.get("ns", bad)),
    ("namespace", lambda s, bad: s.delete(bad, "k", deleted_by="w")),
    ("key", lambda s, bad: s.delete("ns", bad, deleted_by="w")),
    ("deleted_by", lambda s, bad: s.delete("ns", "k", deleted_by=bad)),
    ("namespace", lambda s, bad: s.list_keys(bad)),
    ("namespace", lambda s, bad: s.history(bad, "k")),
    ("key", lambda s, bad: s.history("ns", bad)),
    ("namespace", lambda s, bad: s.export(bad)),
    ("namespace", lambda s, bad: s.clear_namespace(bad, deleted_by="w")),
    ("deleted_by", lambda s, bad: s.clear_namespace("ns", deleted_by=bad)),
    ("namespace", lambda s, bad: s.watch(bad, "k", since_version=0, timeout=0)),
    ("key", lambda s, bad: s.watch("ns", bad, since_version=0, timeout=0)),
    ("namespace", lambda s, bad: s.changed_since(bad, "k", 0)),
    ("key", lambda s, bad: s.changed_since("ns", bad, 0)),
]


@pytest.mark.backends
@pytest.mark.parametrize(("bad", "problem"), BAD_NAMES)
def test_bad_names_are_rejected_by_every_call(store: StateStore, bad: Any, problem: str) -> None:
    store.set("ns", "k", "kept", updated_by="w")
    for field, use in NAME_USES:
        with pytest.raises(InvalidInputError) as info:
            use(store, bad)
        assert str(info.value).startswith(field), (field, str(info.value))
        assert problem in str(info.value), (field, str(info.value))
    assert store.get("ns", "k").value == "kept"
    assert len(store.history("ns", "k")) == 1


LENGTH_LIMITS = [
    ("namespace", MAX_NAMESPACE_LENGTH),
    ("key", MAX_KEY_LENGTH),
    ("updated_by", MAX_WRITER_LENGTH),
]


@pytest.mark.parametrize(("field", "limit"), LENGTH_LIMITS)
def test_names_up_to_their_length_limit_are_accepted(
    memory_store: StateStore, field: str, limit: int
) -> None:
    args = {"namespace": "ns", "key": "k", "updated_by": "w"}
    args[field] = "é" * limit
    memory_store.set(args["namespace"], args["key"], 1, updated_by=args["updated_by"])
    assert memory_store.get(args["namespace"], args["key"]).updated_by == args["updated_by"]
    args[field] = "é" * (limit + 1)
    with pytest.raises(InvalidInputError, match=f"{field} is {limit + 1} characters long; the "):
        memory_store.set(args["namespace"], args["key"], 1, updated_by=args["updated_by"])


def test_deleted_by_has_the_writer_length_limit(memory_store: StateStore) -> None:
    memory_store.set("ns", "k", 1, updated_by="w")
    with pytest.raises(InvalidInputError, match=f"limit is {MAX_WRITER_LENGTH}"):
        memory_store.delete("ns", "k", deleted_by="x" * (MAX_WRITER_LENGTH + 1))
    result = memory_store.delete("ns", "k", deleted_by="x" * MAX_WRITER_LENGTH)
    assert result.deleted_by == "x" * MAX_WRITER_LENGTH


def test_names_may_hold_inner_spaces_and_any_printable_unicode(memory_store: StateStore) -> None:
    for name in [" padded ", "a b", "日本", "😀", "zero\u200dwidth-joiner", "%?#&=/\\"]:
        memory_store.set(name, name, name, updated_by=name)
        assert memory_store.get(name, name).value == name


BAD_COUNTS = [
    pytest.param(True, "must be an integer, got bool", id="true"),
    pytest.param(False, "must be an integer, got bool", id="false"),
    pytest.param(1.0, "must be an integer, got float", id="float"),
    pytest.param("1", "must be an integer, got str", id="string"),
    pytest.param(-1, "must be at least", id="negative"),
]


@pytest.mark.parametrize(("bad", "problem"), BAD_COUNTS)
def test_bad_versions_and_limits_are_rejected(
    memory_store: StateStore, bad: Any, problem: str
) -> None:
    memory_store.set("ns", "k", "kept", updated_by="w")
    uses: list[tuple[str, Callable[[], Any]]] = [
        (
            "expected_version",
            lambda: memory_store.set("ns", "k", 1, updated_by="w", expected_version=bad),
        ),
        (
            "expected_version",
            lambda: memory_store.delete("ns", "k", deleted_by="w", expected_version=bad),
        ),
        ("since_version", lambda: memory_store.watch("ns", "k", since_version=bad, timeout=0)),
        ("since_version", lambda: memory_store.changed_since("ns", "k", bad)),
        ("limit", lambda: memory_store.history("ns", "k", limit=bad)),
    ]
    for field, use in uses:
        with pytest.raises(InvalidInputError, match=f"^{field} ") as info:
            use()
        assert problem in str(info.value)
    assert memory_store.get("ns", "k").version == 1


def test_history_limit_must_be_at_least_one(memory_store: StateStore) -> None:
    with pytest.raises(InvalidInputError, match="limit must be at least 1, got 0"):
        memory_store.history("ns", "k", limit=0)


def test_since_version_is_required_to_be_an_integer(memory_store: StateStore) -> None:
    with pytest.raises(InvalidInputError, match="since_version must be an integer, got NoneType"):
        memory_store.watch("ns", "k", since_version=None, timeout=0)  # type: ignore[arg-type]


BAD_SECONDS = [
    pytest.param(-0.1, "between 0 and", id="negative"),
    pytest.param(float("nan"), "between 0 and", id="nan"),
    pytest.param(float("inf"), "between 0 and", id="infinity"),
    pytest.param(MAX_WAIT_SECONDS + 1, "between 0 and 86400 seconds", id="too-long"),
    pytest.param(10**400, "between 0 and", id="huge-int"),
    pytest.param("1", "must be a number of seconds, got str", id="string"),
    pytest.param(True, "must be a number of seconds, got bool", id="bool"),
    pytest.param(None, "must be a number of seconds, got NoneType", id="none"),
]


@pytest.mark.parametrize(("bad", "problem"), BAD_SECONDS)
def test_bad_watch_timeouts_are_rejected(memory_store: StateStore, bad: Any, problem: str) -> None:
    with pytest.raises(InvalidInputError, match=r"^timeout ") as info:
        memory_store.watch("ns", "k", since_version=0, timeout=bad)
    assert problem in str(info.value)


def test_watch_accepts_the_longest_allowed_timeout_when_the_key_has_changed(
    memory_store: StateStore,
) -> None:
    memory_store.set("ns", "k", 1, updated_by="w")
    record = memory_store.watch("ns", "k", since_version=0, timeout=MAX_WAIT_SECONDS)
    assert record is not None and record.version == 1


BAD_OPTIONS = [
    pytest.param({"durability": "extra"}, "durability must be 'normal' or 'full'", id="durability"),
    pytest.param({"durability": ["full"]}, "durability must be", id="durability-list"),
    pytest.param({"durability": None}, "durability must be", id="durability-none"),
    pytest.param({"read_only": "no"}, "read_only must be True or False", id="read-only-str"),
    pytest.param({"read_only": 1}, "read_only must be True or False", id="read-only-int"),
    pytest.param({"busy_timeout": -1}, "busy_timeout must be between 0", id="busy-negative"),
    pytest.param({"busy_timeout": float("nan")}, "busy_timeout must be between", id="busy-nan"),
    pytest.param({"busy_timeout": 10**400}, "busy_timeout must be between", id="busy-huge"),
    pytest.param({"busy_timeout": "5"}, "busy_timeout must be a number", id="busy-string"),
    pytest.param({"max_value_bytes": 0}, "max_value_bytes must be at least 1", id="size-zero"),
    pytest.param({"max_value_bytes": 1.5}, "max_value_bytes must be an integer", id="size-float"),
    pytest.param({"max_value_bytes": True}, "max_value_bytes must be an integer", id="size-bool"),
]


@pytest.mark.parametrize(("options", "problem"), BAD_OPTIONS)
def test_bad_store_options_are_rejected_before_anything_is_created(
    db_path: Path, options: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        StateStore(db_path, **options)
    assert not db_path.exists()


BAD_PATHS = [
    pytest.param(None, id="none"),
    pytest.param(42, id="int"),
    pytest.param(b"state.db", id="bytes"),
    pytest.param("", id="empty"),
    pytest.param("state\x00.db", id="nul"),
]


@pytest.mark.parametrize("bad", BAD_PATHS)
def test_bad_paths_are_rejected_as_invalid_input(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="path must be a file path or ':memory:'"):
        StateStore(bad)


def test_a_path_like_that_gives_bytes_is_rejected() -> None:
    class BytesPath:
        def __fspath__(self) -> bytes:
            return b"state.db"

    with pytest.raises(InvalidInputError, match="path must be"):
        StateStore(BytesPath())  # type: ignore[arg-type]


def test_errors_form_one_family() -> None:
    assert issubclass(InvalidInputError, AgentholdError)
    assert issubclass(InvalidInputError, ValueError)
    assert issubclass(IncompatibleDatabaseError, InvalidInputError)
    assert issubclass(BusyError, UnavailableError)
    for error in (ConflictError, NotFoundError, UnavailableError):
        assert issubclass(error, AgentholdError)


# --------------------------------------------------------------------------------------------
# Durability and SQLite settings
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("durability", "level"), [("normal", 1), ("full", 2)])
def test_durability_sets_synchronous_on_every_connection(
    db_path: Path, durability: Any, level: int
) -> None:
    with StateStore(db_path, durability=durability) as store:
        seen: list[int] = []
        run_threads(3, lambda _: seen.append(store.db.fetchone("PRAGMA synchronous")[0]))
        assert seen == [level] * 3
        assert store.db.fetchone("PRAGMA synchronous")[0] == level


def test_new_database_uses_wal_and_says_so_in_the_file(db_path: Path) -> None:
    with StateStore(db_path) as store:
        assert store.db.fetchone("PRAGMA journal_mode")[0] == "wal"
    header = db_path.read_bytes()[:100]
    assert header[18:20] == b"\x02\x02"  # file format read/write versions 2: WAL
    assert int.from_bytes(header[68:72], "big") == APPLICATION_ID
    assert int.from_bytes(header[60:64], "big") == SCHEMA_VERSION
    assert int.from_bytes(header[16:18], "big") == PAGE_SIZE == 2048


def test_a_file_made_with_another_page_size_keeps_it(db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA page_size = 8192")
    conn.execute("PRAGMA journal_mode = wal")  # the first write fixes the page size
    conn.close()
    with StateStore(db_path) as store:
        store.set("ns", "k", {"x": "y" * 20_000}, updated_by="w")
        assert store.db.fetchone("PRAGMA page_size")[0] == 8192
        assert store.get("ns", "k").value == {"x": "y" * 20_000}


# --------------------------------------------------------------------------------------------
# Opening files safely
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(os.urandom(4096), id="random-bytes"),
        pytest.param(b"# my notes\nnot a database\n" * 20, id="text"),
        pytest.param(b"SQLite", id="short-header"),
    ],
)
def test_a_file_that_is_not_sqlite_is_refused_and_left_untouched(
    db_path: Path, content: bytes
) -> None:
    db_path.write_bytes(content)
    before = file_state(db_path)
    for read_only in (False, True):
        with pytest.raises(IncompatibleDatabaseError, match="is not a SQLite database"):
            StateStore(db_path, read_only=read_only)
    assert file_state(db_path) == before


def test_a_damaged_sqlite_file_is_refused_and_left_untouched(db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    data = bytearray(db_path.read_bytes())
    data[100:] = bytes(random.Random(1).randrange(256) for _ in range(len(data) - 100))
    db_path.write_bytes(bytes(data))
    before = file_state(db_path)
    with pytest.raises(IncompatibleDatabaseError, match="cannot open database"):
        StateStore(db_path)
    assert file_state(db_path) == before


def test_a_sqlite_file_of_another_program_is_refused_and_left_untouched(db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO invoices VALUES (1, 9.5)")
    conn.commit()
    conn.close()
    before = file_state(db_path)
    for read_only in (False, True):
        with pytest.raises(IncompatibleDatabaseError, match="not an agenthold database") as info:
            StateStore(db_path, read_only=read_only)
        assert "invoices" in str(info.value)
    assert file_state(db_path) == before


def test_a_database_with_a_newer_schema_is_refused_and_left_untouched(db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 99")
    conn.execute("CREATE TABLE future (x)")
    conn.commit()
    conn.close()
    before = file_state(db_path)
    for read_only in (False, True):
        with pytest.raises(IncompatibleDatabaseError, match="schema version 99, newer") as info:
            StateStore(db_path, read_only=read_only)
        assert "upgrade agenthold" in str(info.value)
    assert file_state(db_path) == before


def test_read_only_refuses_a_database_that_needs_migrating(db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 0")
    conn.commit()
    conn.close()
    before = file_state(db_path)
    with pytest.raises(IncompatibleDatabaseError, match="older than this agenthold's"):
        StateStore(db_path, read_only=True)
    assert file_state(db_path) == before
    with StateStore(db_path) as store:  # a read-write opening migrates it
        store.set("ns", "k", 1, updated_by="w")
    with StateStore(db_path, read_only=True) as reader:
        assert reader.get("ns", "k").value == 1


def test_an_empty_file_becomes_a_new_database_but_not_read_only(db_path: Path) -> None:
    db_path.write_bytes(b"")
    with pytest.raises(IncompatibleDatabaseError, match="it is empty"):
        StateStore(db_path, read_only=True)
    assert db_path.read_bytes() == b""
    with StateStore(db_path) as store:
        store.set("ns", "k", 1, updated_by="w")
    with StateStore(db_path) as store:
        assert store.get("ns", "k").value == 1


def test_an_empty_sqlite_database_of_another_tool_becomes_ours(db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA journal_mode = wal")
    conn.close()
    with StateStore(db_path) as store:
        store.set("ns", "k", 1, updated_by="w")
    conn = sqlite3.connect(db_path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert tables == OUR_TABLES


def test_read_only_never_creates_a_missing_database(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(IncompatibleDatabaseError, match="read-only opening never creates one"):
        StateStore(path, read_only=True)
    assert list(tmp_path.iterdir()) == []


def test_read_only_reads_and_never_writes(db_path: Path) -> None:
    with StateStore(db_path) as writer:
        writer.set("ns", "k", {"v": 1}, updated_by="w")
        writer.set("ns", "gone", 1, updated_by="w")
        writer.delete("ns", "gone", deleted_by="w")
    before = file_state(db_path)
    with StateStore(db_path, read_only=True) as reader:
        assert reader.read_only is True
        assert reader.get("ns", "k").value == {"v": 1}
        assert [r.key for r in reader.list_keys("ns")] == ["k"]
        assert reader.list_namespaces() == [NamespaceInfo("ns", 1)]
        assert len(reader.history("ns", "gone")) == 2
        assert reader.export("ns").record_count == 1
        assert reader.watch("ns", "k", since_version=0, timeout=0) is not None
        attempts: list[Callable[[], Any]] = [
            lambda: reader.set("ns", "k", 2, updated_by="w"),
            lambda: reader.set("ns", "new", 2, updated_by="w"),
            lambda: reader.delete("ns", "k", deleted_by="w"),
            lambda: reader.clear_namespace("ns", deleted_by="w"),
        ]
        for attempt in attempts:
            with pytest.raises(UnavailableError, match="read-only"):
                attempt()
    assert file_state(db_path)[0] == before[0]
    with StateStore(db_path) as writer:
        assert writer.get("ns", "k").version == 1


def test_a_missing_directory_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "state.db"
    for read_only in (False, True):
        with pytest.raises(IncompatibleDatabaseError, match="does not exist") as info:
            StateStore(path, read_only=read_only)
        assert str(tmp_path / "no" / "such" / "dir") in str(info.value)
    assert not (tmp_path / "no").exists()


def test_a_path_over_the_platforms_limit_is_named_as_the_cause_not_a_failed_open(
    tmp_path: Path,
) -> None:
    """SQLite itself says only "unable to open database file"; the library names the cause,
    also when only the write-ahead log's name (the path plus '-wal') is too long."""
    for name in ("n" * 300, "n" * 253):
        for read_only in (False, True):
            with pytest.raises(IncompatibleDatabaseError, match="longer than this system allows"):
                StateStore(tmp_path / name, read_only=read_only)
    with pytest.raises(IncompatibleDatabaseError, match=r"\.\.\..*longer than"):
        StateStore(tmp_path / ("d/" * 3000 + "x.db"))  # a path shown cut short, not 6,000 bytes
    assert list(tmp_path.iterdir()) == []


@posix_only
def test_a_link_into_a_missing_directory_is_named_in_the_error(tmp_path: Path) -> None:
    link = tmp_path / "state.db"
    link.symlink_to(tmp_path / "gone" / "state.db")
    with pytest.raises(IncompatibleDatabaseError, match="does not exist") as info:
        StateStore(link)
    assert str(tmp_path / "gone") in str(info.value)
    assert not (tmp_path / "gone").exists()


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(IncompatibleDatabaseError, match="it is a directory"):
        StateStore(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_a_file_that_cannot_be_read_is_refused_with_the_reason() -> None:
    # Reading /proc/self/mem at offset 0 fails with an I/O error, whoever runs the test.
    with pytest.raises(IncompatibleDatabaseError, match="cannot read database '/proc/self/mem'"):
        StateStore("/proc/self/mem")


def test_paths_with_uri_characters_open_exactly_that_file(tmp_path: Path) -> None:
    path = tmp_path / "my dir %41 #1" / "state?mode=ro&x=%2F#frag.db"
    path.parent.mkdir()
    with StateStore(path) as store:
        store.set("ns", "k", 1, updated_by="w")
        assert store.path == str(path)
    assert path.read_bytes().startswith(b"SQLite format 3\x00")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my dir %41 #1"]
    with StateStore(path, read_only=True) as reader:
        assert reader.get("ns", "k").value == 1


def test_two_processes_creating_one_new_database_both_succeed(
    db_path: Path, workers: Callable[..., Worker]
) -> None:
    openers = [workers("open-new", db_path, f"opener-{i}") for i in range(3)]
    for opener in openers:
        opener.expect("ready")
    for opener in openers:
        opener.send()
    assert [opener.result() for opener in openers] == [{"version": 1}] * 3
    assert all(opener.finish() == 0 for opener in openers)
    with StateStore(db_path) as store:
        assert [r.key for r in store.list_keys("openers")] == ["opener-0", "opener-1", "opener-2"]
    conn = sqlite3.connect(db_path)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert sorted(tables) == sorted(OUR_TABLES)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_another_program_creating_tables_first_wins_the_new_file(db_path: Path) -> None:
    """Another program holds the write lock on a new, empty database and creates its own table:
    agenthold waits for the lock, then sees the table and refuses the file, changing nothing."""
    other = raw_connect(db_path)
    other.execute("PRAGMA journal_mode = wal")
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    committer = threading.Timer(0.2, lambda: other.execute("COMMIT"))
    committer.start()
    try:
        with pytest.raises(IncompatibleDatabaseError, match="invoices"):
            StateStore(db_path, busy_timeout=10)
    finally:
        committer.join()
    tables = [r[0] for r in other.execute("SELECT name FROM sqlite_master")]
    other.close()
    assert tables == ["invoices"]


def test_opening_while_another_connection_holds_the_lock_raises_busy(db_path: Path) -> None:
    other = raw_connect(db_path)
    other.execute("CREATE TABLE IF NOT EXISTS scratch (x)")
    other.execute("DROP TABLE scratch")  # an empty database in rollback-journal mode
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(BusyError, match=r"locked by another writer for more than 0\.2 s"):
            StateStore(db_path, busy_timeout=0.2)
    finally:
        other.execute("ROLLBACK")
        other.close()
    with StateStore(db_path) as store:  # and once the lock is gone, it opens
        store.set("ns", "k", 1, updated_by="w")


# --------------------------------------------------------------------------------------------
# Closing
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_closed_store_refuses_every_call(db_path: Path, where: str) -> None:
    store = StateStore(db_path if where == "file" else ":memory:")
    store.set("ns", "k", 1, updated_by="w")
    store.close()
    calls: list[Callable[[], Any]] = [
        lambda: store.get("ns", "k"),
        lambda: store.set("ns", "k", 2, updated_by="w"),
        lambda: store.delete("ns", "k", deleted_by="w"),
        lambda: store.list_keys("ns"),
        lambda: store.list_namespaces(),
        lambda: store.history("ns", "k"),
        lambda: store.export("ns"),
        lambda: store.clear_namespace("ns", deleted_by="w"),
        lambda: store.watch("ns", "k", since_version=0, timeout=0),
    ]
    for call in calls:
        with pytest.raises(AgentholdError, match="closed"):
            call()
    other_thread: list[BaseException] = []

    def from_another_thread() -> None:
        try:
            store.get("ns", "k")
        except AgentholdError as exc:
            other_thread.append(exc)

    t = threading.Thread(target=from_another_thread)
    t.start()
    t.join()
    assert "closed" in str(other_thread[0])
    store.close()  # closing twice is harmless


def _close_while_another_thread_is_inside(store: StateStore, block: str) -> None:
    """Close ``store`` while another thread is inside a ``block`` ("write" or "snapshot") of
    its database: the block ends as it would have (a write commits) and the store is closed
    for that thread too. On SQLite close() returns only after the block: closing a
    connection that another thread was using crashed the whole process (a write's COMMIT on
    a freed handle). PostgreSQL's pool closes a connection in use when it is given back."""
    inside, ended, failed = threading.Event(), [0.0], []

    def use() -> None:
        try:
            opened = store.db.write() if block == "write" else store.db.snapshot()
            with opened:
                inside.set()
                time.sleep(0.3)  # close() is called meanwhile
                ended[0] = time.monotonic()
        except BaseException as exc:  # the assertion below says what it was
            failed.append(exc)
        finally:
            inside.set()

    thread = threading.Thread(target=use)
    thread.start()
    assert inside.wait(10)
    store.close()
    closed = time.monotonic()
    thread.join(10)
    assert not failed, failed
    assert ended[0] > 0
    if not store.path.startswith("postgresql"):
        assert ended[0] <= closed  # close() waited for the block
    with pytest.raises(AgentholdError, match="closed"):
        store.get("ns", "k")


READERS_WHILE_CLOSING = """
import random, sys, threading, time
from agenthold.store import AgentholdError, StateStore
path, failures = sys.argv[1], []
with StateStore(path) as store:
    for i in range(20):
        store.set("ns", f"k{i}", {"i": i, "pad": "x" * 200}, updated_by="t")
for trial in range(100):
    store = StateStore(path)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                if random.random() < 0.5:
                    store.get("ns", f"k{random.randrange(20)}")
                else:
                    store.list_keys("ns")
            except AgentholdError as exc:
                if "closed" not in str(exc):
                    failures.append(str(exc))
                return

    readers = [threading.Thread(target=read) for _ in range(4)]
    for reader in readers:
        reader.start()
    time.sleep(random.random() * 0.01)
    store.close()
    stop.set()
    for reader in readers:
        reader.join()
print(failures or "ok")
"""


def test_closing_a_store_while_threads_read_it_crashes_nothing(db_path: Path) -> None:
    """A hundred times, four threads read (get, list_keys) while another closes the store:
    every read returns a record or says the store is closed. Closing a connection while
    another thread ran a statement on it crashed the process (in the child here: a crash is
    its exit status -11, not this test run's end)."""
    done = subprocess.run(
        [sys.executable, "-c", READERS_WHILE_CLOSING, str(db_path)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-2000:]


@pytest.mark.backends
@pytest.mark.parametrize("block", ["write", "snapshot"])
def test_closing_a_store_waits_for_another_threads_transaction(db_url: str, block: str) -> None:
    _close_while_another_thread_is_inside(StateStore(db_url), block)


@pytest.mark.parametrize("block", ["write", "snapshot"])
def test_closing_an_in_memory_store_waits_for_another_threads_transaction(block: str) -> None:
    _close_while_another_thread_is_inside(StateStore(":memory:"), block)


def test_the_context_manager_closes_the_store(db_path: Path) -> None:
    with StateStore(db_path) as store:
        store.set("ns", "k", 1, updated_by="w")
        assert repr(store) == f"StateStore({str(db_path)!r}, read_only=False)"
    with pytest.raises(AgentholdError, match="closed"):
        store.get("ns", "k")
    with StateStore(db_path) as again:  # the data outlives the store
        assert again.get("ns", "k").value == 1


# --------------------------------------------------------------------------------------------
# Errors from SQLite become errors a caller can act on
# --------------------------------------------------------------------------------------------


def test_sqlite_errors_are_translated_never_raised_raw(store: StateStore) -> None:
    with pytest.raises(UnavailableError, match="the database failed: no such table"):
        store.db.fetchone("SELECT * FROM no_such_table")
    with pytest.raises(UnavailableError, match="the database failed"):
        store.db.fetchall("SELECT * FROM no_such_table")
    with pytest.raises(UnavailableError, match="the database failed"):  # noqa: SIM117
        with store.db.snapshot() as conn:
            conn.execute("SELECT * FROM no_such_table")


def test_memory_database_translates_sqlite_errors_too(memory_store: StateStore) -> None:
    with pytest.raises(UnavailableError, match="no such table"):
        memory_store.db.fetchone("SELECT * FROM no_such_table")
    with pytest.raises(UnavailableError, match="no such table"):
        memory_store.db.fetchall("SELECT * FROM no_such_table")


def test_a_connection_that_refuses_writes_raises_unavailable(store: StateStore) -> None:
    store.set("ns", "k", 1, updated_by="w")
    store.db.fetchone("PRAGMA query_only = 1")  # SQLite now answers writes with SQLITE_READONLY
    with pytest.raises(UnavailableError, match="read-only here; nothing was written"):
        store.set("ns", "k", 2, updated_by="w")
    store.db.fetchone("PRAGMA query_only = 0")
    assert store.set("ns", "k", 3, updated_by="w").version == 2


def test_a_memory_database_cannot_be_read_only() -> None:
    with pytest.raises(InvalidInputError, match="cannot be opened read-only"):
        StateStore(":memory:", read_only=True)


# --------------------------------------------------------------------------------------------
# Concurrency: no lost updates, clear busy errors, readers beside a writer
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["file", "memory"])
def test_threads_sharing_one_store_lose_no_increment(db_path: Path, where: str) -> None:
    threads, per_thread = 8, 40
    with StateStore(db_path if where == "file" else ":memory:") as store:
        store.set("counters", "n", 0, updated_by="setup")
        run_threads(
            threads, lambda i: [increment_with_retry(store, f"t{i}") for _ in range(per_thread)]
        )
        record = store.get("counters", "n")
        assert record.value == threads * per_thread
        assert record.version == 1 + threads * per_thread
        assert len(store.history("counters", "n", limit=10_000)) == record.version


def test_memory_store_serves_readers_and_writers_from_many_threads(
    memory_store: StateStore,
) -> None:
    def work(i: int) -> None:
        for j in range(30):
            memory_store.set(f"ns{i % 2}", f"k{i}-{j}", j, updated_by=f"t{i}")
            assert memory_store.get(f"ns{i % 2}", f"k{i}-{j}").value == j
            memory_store.list_namespaces()
            memory_store.export(f"ns{i % 2}")

    run_threads(6, work)
    assert memory_store.list_namespaces() == [NamespaceInfo("ns0", 90), NamespaceInfo("ns1", 90)]


def test_processes_sharing_one_file_lose_no_increment(
    db_path: Path, workers: Callable[..., Worker]
) -> None:
    processes, per_process = 4, 100
    with StateStore(db_path) as store:
        store.set("counters", "n", 0, updated_by="setup")
        counters = [workers("increment", db_path, per_process) for _ in range(processes)]
        for counter in counters:
            counter.expect("ready")
        results = [counter.result() for counter in counters]
        assert all(counter.finish() == 0 for counter in counters)
        done = sum(r["increments"] for r in results)
        record = store.get("counters", "n")
        assert record.value == done == processes * per_process
        assert record.version == 1 + done
        writers = {h.updated_by for h in store.history("counters", "n", limit=10_000)}
        assert len(writers) == processes + 1


def test_a_lock_held_past_busy_timeout_raises_busy_and_writes_nothing(
    db_path: Path, workers: Callable[..., Worker]
) -> None:
    with StateStore(db_path, busy_timeout=0.2) as store:
        store.set("ns", "k", "committed", updated_by="w")
        holder = workers("hold-lock", db_path)
        holder.expect("locked")
        started = time.monotonic()
        with pytest.raises(BusyError) as info:
            store.set("ns", "k", "blocked", updated_by="w")
        assert time.monotonic() - started >= 0.15
        assert "locked by another writer for more than 0.2 s (busy_timeout)" in str(info.value)
        assert "retry" in str(info.value)
        holder.send()
        assert holder.finish() == 0
        assert store.get("ns", "k").value == "committed"
        assert len(store.history("ns", "k")) == 1
        assert store.set("ns", "k", "after", updated_by="w").version == 2


def test_reads_do_not_wait_for_a_writer_holding_the_lock(
    db_path: Path, workers: Callable[..., Worker]
) -> None:
    """The other process keeps its lock until this test tells it to let go, so every read below
    is answered while the lock is held; a read that queued would hit busy_timeout (5 s)."""
    with StateStore(db_path) as store:
        store.set("ns", "k", "committed", updated_by="w")
        holder = workers("hold-lock", db_path)
        holder.expect("locked")
        started = time.monotonic()
        record = store.get("ns", "k")
        assert store.list_keys("ns")[0].value == "committed"
        assert store.export("ns").record_count == 1
        assert store.history("ns", "k")[0].value == "committed"
        elapsed = time.monotonic() - started
        assert holder.proc.poll() is None  # the lock is still held
        holder.send()
        assert holder.finish() == 0
        assert (record.value, record.version) == ("committed", 1)  # not the uncommitted change
        assert elapsed < 2.5


def test_a_writer_thread_waiting_past_busy_timeout_raises_busy(db_path: Path) -> None:
    with StateStore(db_path) as holder_store, StateStore(db_path, busy_timeout=0.2) as store:
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            with holder_store.db.write():
                holding.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert holding.wait(10)
            with pytest.raises(BusyError, match="another writer in this process held"):
                store.set("ns", "k", 1, updated_by="w")
        finally:
            release.set()
            holder.join()
        assert store.set("ns", "k", 1, updated_by="w").version == 1


@pytest.mark.backends
def test_an_error_inside_a_write_rolls_it_back(store: StateStore) -> None:
    store.set("ns", "k", "kept", updated_by="w")
    with pytest.raises(RuntimeError, match="changed my mind"), store.db.write() as (conn, _):
        conn.execute("UPDATE state SET value = '\"lost\"'")
        raise RuntimeError("changed my mind")
    assert store.get("ns", "k").value == "kept"
    assert store.set("ns", "k", "next", updated_by="w").version == 2


# --------------------------------------------------------------------------------------------
# Crashes: history first, atomically
# --------------------------------------------------------------------------------------------


def check_database_after_crash(db_path: Path, log_path: Path) -> int:
    """Every acknowledged change is in the history; each key's live row is its newest history
    entry; SQLite finds the file sound. Returns how many acknowledged changes were checked."""
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        history = {
            (key, version): (event, None if value is None else json.loads(value))
            for key, version, event, value in conn.execute(
                "SELECT key, version, event_type, value FROM state_history WHERE namespace = ?",
                ("crash",),
            )
        }
        acknowledged = 0
        # Only whole lines count: a process killed in the middle of one never acknowledged it
        # (the next writer starts on a new line, so a torn line stands alone).
        for line in log_path.read_text(encoding="utf-8").split("\n")[:-1]:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            acknowledged += 1
            assert history.get((event["key"], event["version"])) == (
                event["op"],
                event.get("value"),
            ), event
        rows = conn.execute(
            "SELECT s.key, s.version, s.deleted, s.value, h.version, h.event_type, h.value "
            "FROM state AS s JOIN state_history AS h ON h.namespace = s.namespace "
            "AND h.key = s.key AND h.version = (SELECT max(version) FROM state_history "
            "WHERE namespace = s.namespace AND key = s.key) WHERE s.namespace = ?",
            ("crash",),
        ).fetchall()
        keys = {k for k, _ in history}
        assert {r[0] for r in rows} == keys
        for key, live_version, deleted, value, newest, event, newest_value in rows:
            assert live_version == newest, key
            assert bool(deleted) == (event == "delete"), key
            assert value == newest_value, key
        return acknowledged
    finally:
        conn.close()


@posix_only
def test_a_killed_writer_loses_no_acknowledged_change(
    db_path: Path, tmp_path: Path, workers: Callable[..., Worker]
) -> None:
    log_path = tmp_path / "acknowledged.jsonl"
    log_path.touch()
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    StateStore(db_path).close()
    acknowledged = 0
    for round_ in range(6):
        writer = workers("crash-writer", db_path, log_path, rng.randrange(2**32))
        writer.expect("ready")
        time.sleep(rng.uniform(0.02, 0.25))
        writer.proc.send_signal(signal.SIGKILL)
        assert writer.finish() == -signal.SIGKILL, f"round {round_}, seed {seed}"
        acknowledged = check_database_after_crash(db_path, log_path)
    assert acknowledged > 0, f"the writers acknowledged nothing (seed {seed})"
    with StateStore(db_path) as store:  # and this process carries on where they stopped
        for key in ("k0", "k1"):
            result = store.set("crash", key, "after", updated_by="survivor")
            assert result.version == len(store.history("crash", key, limit=10**6))


# --------------------------------------------------------------------------------------------
# Watch: pushed, not polled by the caller
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_watch_returns_at_once_when_the_key_is_already_past_since_version(
    store: StateStore,
) -> None:
    store.set("ns", "k", "v1", updated_by="w")
    store.set("ns", "k", "v2", updated_by="w")
    started = time.monotonic()
    record = store.watch("ns", "k", since_version=1, timeout=30)
    assert time.monotonic() - started < 5
    assert record == store.get("ns", "k")


@pytest.mark.backends
def test_watch_returns_none_after_the_timeout(store: StateStore) -> None:
    store.set("ns", "k", 1, updated_by="w")
    started = time.monotonic()
    assert store.watch("ns", "k", since_version=1, timeout=0.1) is None
    assert 0.1 <= time.monotonic() - started < 1.0
    assert store.watch("ns", "never", since_version=0, timeout=0) is None


@pytest.mark.parametrize("where", ["file", "memory"])
def test_watch_is_woken_by_a_commit_of_another_thread(db_path: Path, where: str) -> None:
    with StateStore(db_path if where == "file" else ":memory:") as store:
        store.set("ns", "k", "old", updated_by="w")

        def write_later() -> None:
            time.sleep(0.05)
            store.set("ns", "k", "new", updated_by="thread")

        writer = threading.Thread(target=write_later)
        started = time.monotonic()
        writer.start()
        record = store.watch("ns", "k", since_version=1, timeout=10)
        elapsed = time.monotonic() - started
        writer.join()
        assert record is not None
        assert (record.value, record.version, record.updated_by) == ("new", 2, "thread")
        assert elapsed < 0.05 + 0.5  # woken by the commit, far before the timeout


def watch_a_write_of_another_process(
    store: StateStore, db_path: Path, workers: Callable[..., Worker], value: Any, timeout: float
) -> tuple[Record | None, float]:
    """Watch ns/k past version 1 while another process writes ``value`` there 0.1 s in;
    returns what the watch saw and how long it took."""
    other = workers("set-when-told", db_path, "ns", "k", json.dumps(value))
    other.expect("ready")
    go = threading.Timer(0.1, other.send)
    started = time.monotonic()
    go.start()
    record = store.watch("ns", "k", since_version=1, timeout=timeout)
    elapsed = time.monotonic() - started
    go.join()
    assert other.result() == {"version": 2}
    return record, elapsed


def test_watch_is_woken_by_a_commit_of_another_process(
    db_path: Path, workers: Callable[..., Worker]
) -> None:
    with StateStore(db_path) as store:
        store.set("ns", "k", "old", updated_by="w")
        record, elapsed = watch_a_write_of_another_process(
            store, db_path, workers, {"from": "process"}, timeout=20
        )
        assert record is not None
        assert (record.value, record.version) == ({"from": "process"}, 2)
        assert record.updated_by == "other-process"
        assert elapsed < 5  # woken by the commit, long before the 20 s timeout


@pytest.mark.backends
def test_watch_is_woken_by_a_delete_with_a_deleted_record(store: StateStore) -> None:
    store.set("ns", "k", "doomed", updated_by="w")
    deleter = threading.Timer(0.05, lambda: store.delete("ns", "k", deleted_by="reaper"))
    deleter.start()
    record = store.watch("ns", "k", since_version=1, timeout=10)
    deleter.join()
    assert record is not None
    assert (record.deleted, record.value, record.version, record.updated_by) == (
        True,
        None,
        2,
        "reaper",
    )
    assert record.to_dict()["deleted"] is True
    assert store.changed_since("ns", "k", 1) == record
    assert store.changed_since("ns", "k", 2) is None


@pytest.mark.backends
def test_watch_from_version_zero_returns_once_the_key_is_created(store: StateStore) -> None:
    creator = threading.Timer(0.05, lambda: store.set("ns", "new", "born", updated_by="w"))
    creator.start()
    record = store.watch("ns", "new", since_version=0, timeout=10)
    creator.join()
    assert record is not None
    assert (record.value, record.version, record.deleted) == ("born", 1, False)


@pytest.mark.backends
def test_watch_from_version_zero_waits_through_a_tombstone_for_a_new_value(
    store: StateStore,
) -> None:
    store.set("ns", "k", "first life", updated_by="w")
    store.clear_namespace("ns", deleted_by="cleanup")
    assert store.changed_since("ns", "k", 0) is None  # a tombstone is no value to wait for
    assert store.watch("ns", "k", since_version=0, timeout=0.05) is None
    writer = threading.Timer(0.05, lambda: store.set("ns", "k", "second", updated_by="w"))
    writer.start()
    record = store.watch("ns", "k", since_version=0, timeout=10)
    writer.join()
    assert record is not None
    assert (record.value, record.version, record.deleted) == ("second", 3, False)
    deleted = store.changed_since("ns", "k", 0)
    assert deleted == record  # a live key answers since_version 0 at once
    store.delete("ns", "k", deleted_by="w")
    gone = store.changed_since("ns", "k", 3)  # a watcher that knew version 3 learns of it
    assert gone is not None and (gone.deleted, gone.version) == (True, 4)


def test_watch_hears_another_process_after_the_file_was_replaced_at_the_same_path(
    db_path: Path, workers: Callable[..., Worker]
) -> None:
    with StateStore(db_path) as first:
        first.set("ns", "k", "old file", updated_by="w")
        assert first.watch("ns", "k", since_version=1, timeout=0.01) is None  # starts the feed
    for suffix in ("", "-wal", "-shm"):
        Path(str(db_path) + suffix).unlink(missing_ok=True)
    with StateStore(db_path) as store:
        store.set("ns", "k", "new file", updated_by="w")
        record, elapsed = watch_a_write_of_another_process(
            store, db_path, workers, "from the other process", timeout=5
        )
        assert record is not None and record.value == "from the other process"
        assert elapsed < 2, f"woken only after {elapsed:.2f} s: the feed read the old file"


def test_closing_the_last_store_after_a_watch_leaves_no_wal_file_behind(db_path: Path) -> None:
    with StateStore(db_path) as store:
        store.set("ns", "k", "v", updated_by="w")
        assert store.watch("ns", "k", since_version=1, timeout=0.01) is None  # starts the feed
        assert Path(f"{db_path}-wal").exists()
    # Every connection, the change feed's too, is closed, so SQLite checkpointed and removed
    # the write-ahead log as it does at a clean close.
    assert not Path(f"{db_path}-wal").exists()


def test_closing_one_of_two_stores_on_a_file_keeps_the_others_cross_process_wakeups(
    db_path: Path, workers: Callable[..., Worker]
) -> None:
    staying = StateStore(db_path)
    try:
        with StateStore(db_path) as leaving:
            leaving.set("ns", "k", "v", updated_by="w")
            assert leaving.watch("ns", "k", since_version=1, timeout=0.01) is None
        record, elapsed = watch_a_write_of_another_process(
            staying, db_path, workers, "from afar", timeout=5
        )
        assert record is not None and record.value == "from afar"
        assert elapsed < 2, f"woken only after {elapsed:.2f} s"
    finally:
        staying.close()


@pytest.mark.backends
def test_watch_ignores_other_keys_until_its_own_changes(store: StateStore) -> None:
    store.set("ns", "k", 0, updated_by="w")

    def write_others_then_key() -> None:
        for i in range(5):
            store.set("ns", f"other-{i}", i, updated_by="w")
            store.set("other-ns", "k", i, updated_by="w")
        time.sleep(0.05)
        store.set("ns", "k", "mine", updated_by="w")

    writer = threading.Thread(target=write_others_then_key)
    writer.start()
    record = store.watch("ns", "k", since_version=1, timeout=10)
    writer.join()
    assert record is not None and record.value == "mine"


@pytest.mark.backends
def test_a_waiting_watch_uses_little_cpu(store: StateStore) -> None:
    store.set("ns", "k", 1, updated_by="w")
    started = time.process_time()
    assert store.watch("ns", "k", since_version=1, timeout=0.5) is None
    # About 0.015 s here with the 2 ms change-feed poll; a poll loop without a pause takes 0.15.
    assert time.process_time() - started < 0.1


def test_the_change_feed_thread_ends_soon_after_the_last_watch(
    store: StateStore,
    db_path: Path,
    workers: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("agenthold.db.sqlite_feed.FEED_LINGER", 0.1)  # 1 s by default
    other = workers("set-when-told", db_path, "ns", "k", '"late"')
    before = set(threading.enumerate())
    seen: list[threading.Thread] = []

    def look_while_waiting() -> None:
        time.sleep(0.05)
        seen.extend(
            t
            for t in threading.enumerate()
            if t not in before and t.name == "agenthold-change-feed"
        )

    looker = threading.Thread(target=look_while_waiting)
    looker.start()
    store.watch("ns", "k", since_version=0, timeout=0.2)
    looker.join()
    assert len(seen) == 1
    ended = time.monotonic()
    seen[0].join(timeout=5)
    assert not seen[0].is_alive()
    assert time.monotonic() - ended < 3  # after the linger, not at the join's timeout
    # A later watch starts a new one, which hears the commit of another process.
    other.expect("ready")
    go = threading.Timer(0.1, other.send)
    go.start()
    record = store.watch("ns", "k", since_version=0, timeout=20)
    go.join()
    assert record is not None and record.value == "late"


@pytest.mark.backends
def test_many_watchers_on_one_key_all_wake(store: StateStore) -> None:
    results: list[Record | None] = [None] * 6
    store.set("ns", "k", 0, updated_by="w")

    def watch(i: int) -> None:
        results[i] = store.watch("ns", "k", since_version=1, timeout=10)

    writer = threading.Timer(0.1, lambda: store.set("ns", "k", "go", updated_by="w"))
    writer.start()
    run_threads(6, watch)
    writer.join()
    assert [r.value if r else None for r in results] == ["go"] * 6


# --------------------------------------------------------------------------------------------
# The change feed under the watch
# --------------------------------------------------------------------------------------------


def test_subscriptions_hear_their_topics_and_can_change_them(memory_store: StateStore) -> None:
    # In memory there is no poller, whose later look at the file would repeat local commits.
    store = memory_store
    heard: list[str] = []
    sub = store.db.subscribe([key_topic("ns", "a")], lambda: heard.append("sub"))
    with store.db.subscribe(None, lambda: heard.append("all")):
        store.set("ns", "b", 1, updated_by="w")
        assert heard == ["all"]
        store.set("ns", "a", 1, updated_by="w")
        assert sorted(heard) == ["all", "all", "sub"]
    heard.clear()
    sub.update([key_topic("ns", "b")])
    store.set("ns", "a", 2, updated_by="w")
    store.set("ns", "b", 2, updated_by="w")
    assert heard == ["sub"]
    sub.update(None)
    store.db.notify([("claims", "anything")])
    assert heard == ["sub", "sub"]
    sub.close()
    sub.close()
    sub.update([key_topic("ns", "a")])  # a closed subscription stays closed
    store.set("ns", "a", 3, updated_by="w")
    assert heard == ["sub", "sub"]


@pytest.mark.backends
def test_a_failing_subscriber_does_not_break_the_writer(
    store: StateStore, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("subscriber bug")

    with (
        caplog.at_level(logging.ERROR, logger="agenthold.store"),
        store.db.subscribe([key_topic("ns", "k")], broken),
    ):
        assert store.set("ns", "k", 1, updated_by="w").version == 1
    assert "change callback failed" in caplog.text
    assert store.get("ns", "k").value == 1


def test_a_failing_change_source_does_not_hide_changes_of_the_others(
    store: StateStore,
    db_path: Path,
    workers: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A second source (as claims adds one) whose table cannot be read must not swallow the
    state change read in the same poll: the watcher of that key is still woken."""
    raw = raw_connect(db_path)
    raw.execute("CREATE TABLE extra_events (id INTEGER PRIMARY KEY, topic TEXT)")
    raw.execute("INSERT INTO extra_events (topic) VALUES ('x')")
    store.watch("ns", "k", since_version=0, timeout=0)  # the feed opens its connection
    store.db.add_change_source(
        ChangeSource(
            name="extra",
            max_sql="SELECT max(id) FROM extra_events",
            since_sql="SELECT id, topic FROM extra_events WHERE id > ? ORDER BY id",
            topics=lambda row: (("extra", row[1]),),
        )
    )
    other = workers("set-when-told", db_path, "ns", "k", '"from elsewhere"')
    other.expect("ready")
    woken = threading.Event()
    with (
        caplog.at_level(logging.WARNING, logger="agenthold.store"),
        store.db.subscribe([key_topic("ns", "k")], woken.set),
    ):
        raw.execute("DROP TABLE extra_events")
        raw.close()
        other.send()
        assert other.result() == {"version": 1}
        assert woken.wait(10), "the state change was lost with the failing source's read"
    assert "change feed poll failed" in caplog.text
    assert store.get("ns", "k").value == "from elsewhere"


def test_watch_still_hears_local_commits_when_the_feed_cannot_read(
    store: StateStore, db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store.set("ns", "k", 0, updated_by="w")
    raw = raw_connect(db_path)
    raw.execute("ALTER TABLE state_history RENAME TO hidden_history")

    def restore_then_write() -> None:
        time.sleep(0.05)
        raw.execute("ALTER TABLE hidden_history RENAME TO state_history")
        store.set("ns", "k", "local", updated_by="w")

    writer = threading.Thread(target=restore_then_write)
    with caplog.at_level(logging.WARNING, logger="agenthold.store"):
        writer.start()
        record = store.watch("ns", "k", since_version=1, timeout=10)
        writer.join()
    raw.close()
    assert "change feed cannot read the database" in caplog.text
    assert record is not None and record.value == "local"


# --------------------------------------------------------------------------------------------
# fork(): a child process starts with fresh locks and connections
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_writes_through_fresh_locks_and_connections(db_path: Path) -> None:
    """The parent forks while another of its threads holds the process's write lock for the
    file (as a writer does between taking it and starting its transaction). The child inherits
    that lock locked, with no thread to release it, and its thread's connection belongs to the
    parent: it must start afresh instead of timing out. (A fork in the middle of a SQLite
    transaction is beyond repair from Python: SQLite's in-process lock records are inherited
    with the parent's connections, and the child's writes to that file stay busy.)"""
    store = StateStore(db_path, busy_timeout=3)
    memory = StateStore(":memory:")
    store.set("ns", "k", "parent", updated_by="parent")
    memory.set("ns", "k", "parent", updated_by="parent")
    assert store.watch("ns", "k", since_version=1, timeout=0) is None  # feed connection open
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.db._file.write_lock:
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            os.close(read_end)
            report: dict[str, Any] = {}
            report["version"] = store.set("ns", "k", "child", updated_by="child").version
            try:
                memory.get("ns", "k")
            except AgentholdError as exc:
                report["memory"] = str(exc)
            watched = store.watch("ns", "k2", since_version=0, timeout=10)
            report["watched"] = watched.value if watched else None
            os.write(write_end, json.dumps(report).encode())
            code = 0
        except BaseException as exc:
            os.write(write_end, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        release.set()
        holder.join()
        deadline = time.monotonic() + 20
        while store.get("ns", "k").version < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        store.set("ns", "k2", "from parent", updated_by="parent")
        with os.fdopen(read_end, "rb") as pipe:
            report = json.loads(pipe.read() or b"{}")
        _, status = os.waitpid(pid, 0)
    finally:
        store.close()
        memory.close()
    assert report == {
        "version": 2,
        "memory": "the store is closed",
        "watched": "from parent",
    }
    assert os.waitstatus_to_exitcode(status) == 0


# --------------------------------------------------------------------------------------------
# Upgrading an agenthold 0.10 database
# --------------------------------------------------------------------------------------------


def make_legacy_database(path: Path) -> None:
    """A database as agenthold 0.10 leaves it: versions restart at 1 after a delete, a delete
    records the deleted version, claims live as records, and NaN slipped through."""

    def at(second: int) -> str:
        return f"2026-01-01T00:00:0{second}.000000+00:00"

    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA)
    history = [
        ("orders", "o1", '{"status": "new"}', 1, "intake", at(1), "write"),
        ("orders", "o1", '{"status": "paid"}', 2, "billing", at(2), "write"),
        ("orders", "o1", "null", 2, "cleanup", at(3), "delete"),
        ("orders", "o1", '{"status": "again"}', 1, "intake", at(4), "write"),
        ("orders", "o2", "NaN", 1, "pricing", at(5), "write"),
        ("gone", "k", "1", 1, "a", at(6), "write"),
        ("gone", "k", "null", 1, "a", at(7), "delete"),
        ("claims", "file://default/x", '{"status": "claimed"}', 1, "a", at(8), "write"),
    ]
    conn.executemany(
        "INSERT INTO state_history (namespace, key, value, version, updated_by, updated_at, "
        "event_type) VALUES (?, ?, ?, ?, ?, ?, ?)",
        history,
    )
    conn.executemany(
        "INSERT INTO state_records VALUES (?, ?, ?, ?, ?, ?)",
        [
            ("orders", "o1", '{"status": "again"}', 1, "intake", at(4)),
            ("orders", "o2", "NaN", 1, "pricing", at(5)),
            ("claims", "file://default/x", '{"status": "claimed"}', 1, "a", at(8)),
        ],
    )
    conn.commit()
    conn.close()


def test_an_agenthold_0_10_database_is_imported_with_versions_renumbered(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    make_legacy_database(path)
    with StateStore(path) as store:
        record = store.get("orders", "o1")
        assert record.value == {"status": "again"}
        assert record.version == 4  # write 1, write 2, delete 3, write 4: never reused
        assert [(h.version, h.event_type, h.updated_by) for h in store.history("orders", "o1")] == [
            (4, "write", "intake"),
            (3, "delete", "cleanup"),
            (2, "write", "billing"),
            (1, "write", "intake"),
        ]
        assert store.get("orders", "o2").value is None  # NaN is not JSON
        with pytest.raises(NotFoundError):
            store.get("gone", "k")
        assert store.set("gone", "k", 2, updated_by="b", expected_version=0).version == 3
        # 0.10 kept claims as records; they are not state and are not imported
        assert [n.namespace for n in store.list_namespaces()] == ["gone", "orders"]
        with pytest.raises(ConflictError) as caught:  # a version held from before the upgrade
            store.set("orders", "o1", "stale", updated_by="x", expected_version=1)
        assert caught.value.detail["actual_version"] == 4
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    conn.close()
    assert "state_records" not in tables and "legacy_history" not in tables
    assert tables >= OUR_TABLES


def test_an_agenthold_0_10_database_is_refused_read_only_and_left_untouched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    make_legacy_database(path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(IncompatibleDatabaseError, match=r"0\.10 or older.*upgrade"):
        StateStore(path, read_only=True)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_schema_version_1_database_gains_the_claims_file_id_column(tmp_path: Path) -> None:
    """Version 2 of the claims tables added claims.file_id (hard links share a claim); a file
    of layout 1 (store and claims at version 1) migrates in place once claims open it, keeping
    its rows, and a store alone leaves it unchanged."""
    from agenthold.claims import CLAIMS_SCHEMA, Coordinator
    from agenthold.db.sqlite_schema import MIGRATIONS
    from agenthold.store import STORE_SCHEMA

    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[STORE_SCHEMA.name][0])
    conn.executescript(MIGRATIONS[CLAIMS_SCHEMA.name][0])
    conn.execute(
        "INSERT INTO claims (resource, uri, holder, claimed_at, version) "
        "VALUES ('file:///r/a', 'file://default/a', NULL, NULL, 4)"
    )
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()

    def schema() -> list[Any]:
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
            return [conn.execute("PRAGMA user_version").fetchone()[0], rows]

    with StateStore(path) as store:
        assert store.list_namespaces() == []
    with StateStore(path) as store:
        Coordinator(store)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    assert conn.execute("SELECT resource, version, file_id FROM claims").fetchall() == [
        ("file:///r/a", 4, None)
    ]
    assert dict(conn.execute("SELECT component, version FROM agenthold_components")) == {
        "store": 2,
        # v4: directory and glob claims; v5: shared claims, the wait queue (issue 15); v6: the
        # held patterns' token; v7: a queued wait's liveness (issue 27); v8: the host process of
        # an agent's client (issue 25)
        "claims": 8,
    }
    conn.close()


def test_joiners_that_spell_words_and_emoji_are_kept_in_names(memory_store: StateStore) -> None:
    """ZWNJ spells Persian and Indic words and ZWJ joins emoji: names may hold them."""
    for key in (
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
        "team-\U0001f469\u200d\U0001f4bb",
    ):
        memory_store.set("ns", key, 1, updated_by="w")
        assert memory_store.get("ns", key).value == 1


SQLITE_SHARED_FIRST, SQLITE_SHARED_SIZE = 0x40000000 + 2, 510  # SQLite's unix lock bytes


def shared_lock_seen_from_another_process(path: Path) -> bool:
    """Whether another process sees a SQLite SHARED lock held on the database file (F_GETLK
    on SQLite's shared-lock bytes: a write lock there would conflict with it)."""
    probe = (
        "import fcntl, os, struct, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        f"req = struct.pack('hhqqi', fcntl.F_WRLCK, 0, {SQLITE_SHARED_FIRST}, "
        f"{SQLITE_SHARED_SIZE}, 0)\n"
        "got = fcntl.fcntl(fd, fcntl.F_GETLK, req)\n"
        "print(struct.unpack('hhqqi', got)[0] != fcntl.F_UNLCK)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX advisory locks")
def test_opening_a_second_store_on_a_file_keeps_the_locks_of_the_first(tmp_path: Path) -> None:
    # Closing any descriptor of a file drops every POSIX lock the process holds on it; a
    # second store must not open and close the file that the first one's connections lock.
    path = tmp_path / "locks.db"
    with StateStore(path) as first:
        first.set("ns", "k", 1, updated_by="t")
        with first.db.snapshot() as conn:
            conn.execute("SELECT count(*) FROM state").fetchone()  # holds SHARED on the file
            assert shared_lock_seen_from_another_process(path)
            with StateStore(path) as second:
                assert second.get("ns", "k").value == 1
                assert shared_lock_seen_from_another_process(path)  # still held


@pytest.mark.parametrize("method", ["fetchone", "fetchall"])
def test_a_keyboard_interrupt_right_after_a_read_takes_its_lock_lets_go_of_it(
    db_path: Path, method: str
) -> None:
    """Ctrl-C lands as a call returns: raised at the first instruction after the read took
    its connection's lock (an opcode tracer raises it there), the interrupt still leaves the
    lock free, so close() from another thread does not wait on it."""
    with StateStore(db_path) as store:
        store.set("ns", "k", 1, updated_by="t")
        read = getattr(store.db, method)
        read("SELECT 1")
        _, use = store.db._local.reader
        code = getattr(type(store.db), method).__code__
        raised: list[int] = []

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            if frame.f_code is not code:
                return None
            frame.f_trace_opcodes = True
            if event == "opcode" and use._is_owned() and not raised:
                raised.append(frame.f_lasti)
                raise KeyboardInterrupt
            return tracer

        before = sys.gettrace()
        sys.settrace(tracer)
        try:
            with pytest.raises(KeyboardInterrupt):
                read("SELECT count(*) FROM state")
        finally:
            sys.settrace(before)
        assert raised and not use._is_owned()
        closer = threading.Thread(target=store.close)  # would wait the busy timeout on it
        closer.start()
        closer.join(store.db.busy_timeout / 2)
        assert not closer.is_alive()
