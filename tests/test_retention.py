"""Retention rules and compaction (agenthold/retention.py), on SQLite and PostgreSQL: the rules
stored in the database, what compaction removes and keeps, the answers after it (history,
watch, export, messages' unread counts), its command line, and the space SQLite gives back.

Ages are tested by moving rows' times back in the database itself (an UPDATE of the stored
time), not by waiting: what compaction compares is the stored text against the database's
clock."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import (
    REPO,
    another_process_holds_the_write_lock,
    child_env,
    in_process_client,
    reply_of,
)

from agenthold.claims import Coordinator
from agenthold.messages import MessageBus
from agenthold.retention import (
    SETTINGS,
    Retention,
    compact,
    describe_value,
    parse_setting,
    read_retention,
    retention_summary,
    set_retention,
)
from agenthold.store import (
    HistoryCompactedError,
    InvalidInputError,
    StateStore,
)

OLD = "2000-01-01T00:00:00.000000+00:00"


def backdate(store: StateStore, sql: str, *params: Any) -> None:
    """Move stored times back (``sql`` sets them to OLD), as time passing would."""
    with store.db.write() as (conn, _):
        conn.execute(sql, (OLD, *params))


def write_versions(store: StateStore, key: str, count: int, namespace: str = "ns") -> None:
    for i in range(count):
        store.set(namespace, key, {"i": i}, updated_by="w")


def versions_of(store: StateStore, key: str, namespace: str = "ns") -> list[int]:
    return [e.version for e in store.history(namespace, key, limit=1000)]


# -- the rules ---------------------------------------------------------------------------------


@pytest.mark.backends
def test_a_database_that_set_no_rule_keeps_everything(store: StateStore) -> None:
    write_versions(store, "k", 5)
    assert read_retention(store.db) == Retention() and Retention().keeps_everything
    assert {r["value"] for r in retention_summary(store.db)} == {"keep"}
    report = compact(store.db)
    assert (report.history, report.claim_events, report.messages) == (0, 0, 0)
    assert versions_of(store, "k") == [5, 4, 3, 2, 1]


@pytest.mark.backends
def test_rules_are_stored_in_the_database_so_another_opening_sees_them(db_url: str) -> None:
    with StateStore(db_url) as first:
        set_retention(first.db, {"history.versions": 3, "claims.age": 86400})
        set_retention(first.db, {"history.versions": 0}, namespace="audit")
        set_retention(first.db, {"messages.count": 10}, thread="t-1")
    with StateStore(db_url) as second:
        rules = read_retention(second.db)
        shown = retention_summary(second.db)
    assert rules.database == {"history.versions": 3, "claims.age": 86400}
    assert rules.namespaces == {"audit": {"history.versions": 0}}
    assert rules.threads == {"t-1": {"messages.count": 10}}
    assert not rules.keeps_everything
    values = {(r["scope"], r["name"], r["setting"]): r["value"] for r in shown}
    assert values[("database", "", "claims.age")] == "1d"
    assert values[("namespace", "audit", "history.versions")] == "keep"
    assert values[("thread", "t-1", "messages.count")] == "10"
    assert rules.to_dict()["database"]["messages.age"] == 0


@pytest.mark.backends
def test_inherit_drops_an_override_and_keep_drops_a_database_rule(store: StateStore) -> None:
    set_retention(store.db, {"history.versions": 3})
    set_retention(store.db, {"history.versions": 5}, namespace="a")
    rules = set_retention(store.db, {"history.versions": None}, namespace="a")
    assert rules.namespaces == {} and rules.database == {"history.versions": 3}
    assert set_retention(store.db, {"history.versions": 0}).keeps_everything


def test_a_read_only_database_without_rules_reads_as_keep_everything(db_path: Path) -> None:
    StateStore(db_path).close()
    with StateStore(db_path, read_only=True) as ro:
        assert read_retention(ro.db) == Retention()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("history.versions", "NAME=VALUE"),
        ("bogus=3", "NAME=VALUE"),
        ("history.versions=-1", "not a count"),
        ("history.versions=3d", "not a count"),
        ("history.age=soon", "not an age"),
        ("history.age=5y", "not an age"),
        ("messages.count=9999999999999999999", "not a count"),
        ("messages.age=9999999999999d", "not an age"),
    ],
)
def test_a_bad_setting_is_refused_with_a_message_naming_it(text: str, fragment: str) -> None:
    with pytest.raises(InvalidInputError, match=fragment):
        parse_setting(text)


def test_settings_parse_counts_ages_keep_and_inherit() -> None:
    assert parse_setting("history.versions=12") == ("history.versions", 12)
    assert parse_setting("history.age=30d") == ("history.age", 30 * 86400)
    assert parse_setting("messages.age=90m") == ("messages.age", 5400)
    assert parse_setting("claims.age=3600") == ("claims.age", 3600)
    assert parse_setting("claims.age = 2w") == ("claims.age", 2 * 604800)
    assert parse_setting("messages.count=keep") == ("messages.count", 0)
    assert parse_setting("messages.count=inherit") == ("messages.count", None)
    assert [describe_value("history.age", v) for v in (0, 7200, 90, 61)] == [
        "keep",
        "2h",
        "90s",
        "61s",
    ]


def test_rules_that_do_not_fit_their_scope_are_refused(memory_store: StateStore) -> None:
    db = memory_store.db
    with pytest.raises(InvalidInputError, match="only per thread"):
        set_retention(db, {"messages.count": 3}, namespace="ns")
    with pytest.raises(InvalidInputError, match="only for the database"):
        set_retention(db, {"claims.age": 3}, thread="t")
    with pytest.raises(InvalidInputError, match="not both"):
        set_retention(db, {"history.age": 3}, namespace="a", thread="t")
    with pytest.raises(InvalidInputError, match="at least one"):
        set_retention(db, {})
    with pytest.raises(InvalidInputError, match="unknown"):
        set_retention(db, {"bogus": 3})
    with pytest.raises(InvalidInputError, match="whole number"):
        set_retention(db, {"history.age": -3})
    with pytest.raises(InvalidInputError, match="namespace"):
        set_retention(db, {"history.age": 3}, namespace="")
    with pytest.raises(InvalidInputError, match="batch"):
        compact(db, batch=0)
    assert read_retention(db) == Retention()  # nothing was stored by a refused call


# -- compaction of state history ---------------------------------------------------------------


@pytest.mark.backends
def test_versions_per_key_keep_the_newest_and_the_next_version_continues(
    store: StateStore,
) -> None:
    write_versions(store, "k", 10)
    write_versions(store, "short", 2)
    set_retention(store.db, {"history.versions": 3})
    assert compact(store.db, dry_run=True).history == 7
    assert versions_of(store, "k") == list(range(10, 0, -1))  # a dry run removes nothing
    report = compact(store.db, batch=2)
    assert report.history == 7 and report.batches > 1
    assert versions_of(store, "k") == [10, 9, 8]
    assert versions_of(store, "short") == [2, 1]
    assert store.compacted_before("ns", "k") == 8 and store.compacted_before("ns", "short") == 1
    assert store.set("ns", "k", "next", updated_by="w").version == 11  # never reused
    assert compact(store.db).history == 1


@pytest.mark.backends
def test_a_namespace_override_bounds_or_frees_its_namespace_alone(store: StateStore) -> None:
    for namespace in ("a", "b", "c"):
        write_versions(store, "k", 6, namespace)
    set_retention(store.db, {"history.versions": 2})
    set_retention(store.db, {"history.versions": 0}, namespace="b")  # b keeps everything
    set_retention(store.db, {"history.versions": 4}, namespace="c")
    assert compact(store.db).history == 4 + 2
    assert len(versions_of(store, "k", "a")) == 2
    assert len(versions_of(store, "k", "b")) == 6
    assert len(versions_of(store, "k", "c")) == 4


@pytest.mark.backends
def test_age_keeps_a_live_keys_live_version(store: StateStore) -> None:
    write_versions(store, "k", 4)
    backdate(store, "UPDATE state_history SET updated_at = ?")
    set_retention(store.db, {"history.age": 3600})
    assert compact(store.db).history == 3
    assert versions_of(store, "k") == [4]
    assert store.get("ns", "k").value == {"i": 3}


@pytest.mark.backends
def test_a_deleted_keys_tombstone_goes_last_and_its_version_is_not_reused(
    store: StateStore,
) -> None:
    write_versions(store, "gone", 3)
    store.delete("ns", "gone", deleted_by="w")  # version 4, the tombstone
    store.set("ns", "newer", 1, updated_by="w")  # the newest row of all stays (its id)
    backdate(store, "UPDATE state_history SET updated_at = ? WHERE version <= 2")
    set_retention(store.db, {"history.age": 3600})
    compact(store.db)
    entries = store.history("ns", "gone")
    assert [(e.version, e.event_type) for e in entries] == [(4, "delete"), (3, "write")]
    backdate(store, "UPDATE state_history SET updated_at = ?")
    assert compact(store.db).history == 2
    with pytest.raises(HistoryCompactedError, match="compacted before version 5") as caught:
        store.history("ns", "gone")  # not an empty list that looks like no history
    assert caught.value.before == 5 and caught.value.hint
    assert not store.was_written("ns", "never") and store.history("ns", "never") == []
    assert store.set("ns", "gone", "back", updated_by="w").version == 5


@pytest.mark.backends
def test_a_history_page_below_what_is_kept_says_compacted_before(store: StateStore) -> None:
    write_versions(store, "k", 10)
    set_retention(store.db, {"history.versions": 4})
    compact(store.db)
    entries, after = store.history_page("ns", "k", limit=2)
    assert [e.version for e in entries] == [10, 9] and after == 9
    entries, after = store.history_page("ns", "k", before=after, limit=10)
    assert [e.version for e in entries] == [8, 7] and after is None
    for before in (7, 3, 1):
        with pytest.raises(HistoryCompactedError, match="before version 7"):
            store.history_page("ns", "k", before=before)


@pytest.mark.backends
def test_a_watch_from_a_compacted_version_is_told_so(store: StateStore) -> None:
    write_versions(store, "k", 10)
    set_retention(store.db, {"history.versions": 3})
    compact(store.db)
    with pytest.raises(HistoryCompactedError, match="before version 8"):
        store.watch("ns", "k", since_version=5, timeout=5)
    assert store.watch("ns", "k", since_version=7, timeout=5).version == 10  # type: ignore[union-attr]
    assert store.watch("ns", "k", since_version=0, timeout=5).version == 10  # type: ignore[union-attr]


@pytest.mark.backends
def test_a_watch_in_flight_while_compaction_removes_its_version(store: StateStore) -> None:
    """The watch started from the key's tombstone; compaction removes every row of the key,
    that version included; the watch keeps waiting and sees the next write, whose version
    follows the one it started from."""
    write_versions(store, "k", 2)
    store.delete("ns", "k", deleted_by="w")  # version 3
    store.set("ns", "newer", 1, updated_by="w")  # the newest row of all stays (its id)
    set_retention(store.db, {"history.age": 60})
    found: list[Any] = []
    db: Any = store.db

    def subscribers() -> int:  # PostgreSQL's feed; SQLite's, made with the first subscriber
        feed = db._feed if hasattr(db, "_feed") else db._file.feed
        return 0 if feed is None else int(feed.subscribers)

    thread = threading.Thread(
        target=lambda: found.append(store.watch("ns", "k", since_version=3, timeout=60))
    )
    thread.start()
    deadline = time.monotonic() + 30
    while subscribers() == 0 and time.monotonic() < deadline:  # the watch has subscribed
        time.sleep(0.005)
    assert subscribers() == 1
    backdate(store, "UPDATE state_history SET updated_at = ?")
    assert compact(store.db).history == 3
    with pytest.raises(HistoryCompactedError):
        store.history("ns", "k")
    assert thread.is_alive()
    store.set("ns", "k", "again", updated_by="w")
    thread.join(30)
    assert not thread.is_alive()
    assert found[0].version == 4 and found[0].value == "again"


@pytest.mark.backends
def test_export_says_what_was_compacted(store: StateStore) -> None:
    write_versions(store, "k", 5)
    write_versions(store, "whole", 2)
    set_retention(store.db, {"history.versions": 2})
    set_retention(store.db, {"history.versions": 0}, namespace="other")
    compact(store.db)
    exported = {r.record.key: r for r in store.export("ns").records}
    assert exported["k"].compacted_before == 4 and len(exported["k"].history) == 2
    assert exported["whole"].compacted_before == 1
    as_json = {r["key"]: r for r in store.export("ns").to_dict()["records"]}
    assert as_json["k"]["compacted_before"] == 4
    assert "compacted_before" not in as_json["whole"]


# -- claim events and messages -----------------------------------------------------------------


@pytest.mark.backends
def test_claim_events_go_by_age_and_the_fencing_version_stays(
    store: StateStore, tmp_path: Path
) -> None:
    coordinator = Coordinator(store)
    agent = coordinator.register("a").agent_id
    first = coordinator.claim("custom:job", agent)
    coordinator.release("custom:job", agent)
    backdate(store, "UPDATE claim_events SET at = ?")
    coordinator.claim("custom:other", agent)  # the newest event of all stays (its id)
    set_retention(store.db, {"claims.age": 3600})
    assert compact(store.db, dry_run=True).claim_events == 3
    assert compact(store.db).claim_events == 3
    with store.db.snapshot() as conn:
        assert [e[4].rsplit("/", 1)[-1] for e in coordinator.read_log(conn)[0]] == ["custom:other"]
    again = coordinator.claim("custom:job", agent)
    assert first.version is not None and again.version is not None
    assert again.version > first.version  # the fencing version never goes backwards


@pytest.mark.backends
def test_messages_trim_by_count_and_age_without_moving_a_cursor(db_url: str) -> None:
    with MessageBus(db_url) as bus:
        a, b = bus.create_agent("a"), bus.create_agent("b")
        kept = bus.create_thread(a, b)
        trimmed = bus.create_thread(a, b)
        for i in range(6):
            bus.append(kept.id, a, f"m{i}")
            bus.append(trimmed.id, a, f"m{i}")
        bus.mark_read(trimmed.id, b, 2)
        store = bus._store
        set_retention(store.db, {"messages.count": 4})
        set_retention(store.db, {"messages.count": 0}, thread=kept.id)
        assert compact(store.db).messages == 2
        assert [m.seq for m in bus.poll(trimmed.id)] == [3, 4, 5, 6]
        assert [m.seq for m in bus.poll(kept.id)] == [1, 2, 3, 4, 5, 6]
        state = bus.get_thread_read_state(trimmed.id, b)
        assert state is not None and state.cursor == 2 and state.unread_count == 4
        bus.mark_read(trimmed.id, a, 0)
        backdate(store, "UPDATE msg_messages SET created_at = ? WHERE seq <= 4")
        set_retention(store.db, {"messages.age": 60}, thread=trimmed.id)
        assert compact(store.db).messages == 2
        state = bus.get_thread_read_state(trimmed.id, b)
        assert state is not None and state.cursor == 2 and state.unread_count == 2
        backdate(store, "UPDATE msg_messages SET created_at = ?")
        compact(store.db)
        state = bus.get_thread_read_state(trimmed.id, b)
        assert state is not None and state.unread_count == 0 and state.cursor == 2
        assert bus.append(trimmed.id, a, "next").seq == 7  # the sequence continues


# -- space -------------------------------------------------------------------------------------


def test_a_new_sqlite_file_gives_the_space_back(db_path: Path) -> None:
    with StateStore(db_path) as store:
        assert store.db.fetchone("PRAGMA auto_vacuum")[0] == 2  # incremental
        for i in range(300):
            store.set("ns", "k", "x" * 2000, updated_by=f"w{i}")
        set_retention(store.db, {"history.versions": 1})
        pages = store.db.fetchone("PRAGMA page_count")[0]
        assert "would be given back" in compact(store.db, dry_run=True).space
        report = compact(store.db, vacuum_step=16)
        assert report.history == 299 and report.pages_freed > 100
        assert "given back" in report.space
        assert store.db.fetchone("PRAGMA freelist_count")[0] == 0
        assert store.db.fetchone("PRAGMA page_count")[0] < pages - 100
        assert store.get("ns", "k").version == 300


def test_an_old_sqlite_file_says_how_to_convert_it(db_path: Path) -> None:
    import sqlite3

    StateStore(db_path).close()
    conn = sqlite3.connect(db_path)  # as files made before incremental auto-vacuum are
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("VACUUM")
    conn.close()
    with StateStore(db_path) as store:
        assert store.db.fetchone("PRAGMA auto_vacuum")[0] == 0
        write_versions(store, "k", 3)
        set_retention(store.db, {"history.versions": 1})
        report = compact(store.db)
    assert report.history == 2 and "VACUUM" in report.space and report.pages_freed == 0


def test_postgresql_leaves_the_space_to_autovacuum(pg_url: str) -> None:
    with StateStore(pg_url) as store:
        assert "autovacuum" in compact(store.db).space


def test_memory_has_no_space_to_give(memory_store: StateStore) -> None:
    assert "memory" in compact(memory_store.db).space


# -- over MCP ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_history_and_watch_over_mcp_say_compacted_before(db_path: Path) -> None:
    with StateStore(db_path) as store:
        write_versions(store, "k", 6)
        set_retention(store.db, {"history.versions": 2})
        compact(store.db)
        async with in_process_client(Coordinator(store), tools="advanced") as (_, client):
            page = reply_of(
                await client.call_tool("agenthold_history", {"namespace": "ns", "key": "k"})
            )
            assert [e["version"] for e in page["history"]] == [6, 5]
            assert page["compacted_before"] == 5
            old = await client.call_tool(
                "agenthold_history", {"namespace": "ns", "key": "k", "cursor": "3"}
            )
            reply = reply_of(old)
            assert old.is_error and "compacted before version 5" in reply["message"]
            assert "agenthold_history" in reply["hint"]
            watched = await client.call_tool(
                "agenthold_watch",
                {"namespace": "ns", "key": "k", "since_version": 2, "timeout_seconds": 1},
            )
            assert watched.is_error and "compacted before version 5" in reply_of(watched)["message"]


@pytest.mark.anyio
async def test_a_server_compacts_on_its_schedule_only_when_a_rule_is_set(db_path: Path) -> None:
    import anyio

    with StateStore(db_path) as store:
        write_versions(store, "k", 6)
        async with in_process_client(Coordinator(store), tools="advanced") as (app, _):
            app.compact_every = 0.0  # a pass at every turn of the loop
            async with anyio.create_task_group() as tg:
                tg.start_soon(app.reap_forever)
                await anyio.sleep(0.3)
                assert app.compactions == 0  # no rule: the loop looked and did nothing
                set_retention(store.db, {"history.versions": 2})
                with anyio.fail_after(30):
                    while app.compactions == 0:
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
        assert versions_of(store, "k") == [6, 5]


def test_a_compaction_asked_to_stop_stops_before_its_next_batch(memory_store: StateStore) -> None:
    write_versions(memory_store, "k", 5)
    set_retention(memory_store.db, {"history.versions": 1})
    report = compact(memory_store.db, stop=lambda: True)
    assert report.stopped and report.history == 0 and report.to_dict()["stopped"]
    assert len(versions_of(memory_store, "k")) == 5


# -- the command line --------------------------------------------------------------------------


def agenthold(db: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthold", "--db", str(db), *args],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=120,
    )


def test_the_commands_show_set_and_compact(db_path: Path) -> None:
    with StateStore(db_path) as store:
        write_versions(store, "k", 5)
    shown = agenthold(db_path, "retention")
    assert shown.returncode == 0 and shown.stderr == ""
    assert shown.stdout.splitlines()[0].split() == ["SCOPE", "NAME", "SETTING", "VALUE", "BOUNDS"]
    assert len(shown.stdout.splitlines()) == 1 + len(SETTINGS)
    done = agenthold(db_path, "retention", "set", "history.versions=2", "history.age=30d")
    assert done.returncode == 0, done.stderr
    assert "30d" in done.stdout
    override = agenthold(db_path, "retention", "set", "--namespace", "x", "history.versions=keep")
    assert override.returncode == 0 and "namespace  x" in override.stdout
    rows = json.loads(agenthold(db_path, "retention", "--json").stdout)
    assert {"scope": "namespace", "name": "x", "setting": "history.versions"}.items() <= rows[
        -1
    ].items()
    dry = agenthold(db_path, "compact", "--dry-run")
    assert dry.returncode == 0 and "would remove: 3 history rows" in dry.stdout
    assert "space:" in dry.stdout
    report = json.loads(agenthold(db_path, "compact", "--json").stdout)
    assert report["removed"] == {"history": 3, "claim_events": 0, "messages": 0}
    assert not report["dry_run"]
    with StateStore(db_path, read_only=True) as store:
        assert versions_of(store, "k") == [5, 4]


@pytest.mark.parametrize(
    ("args", "status", "fragment"),
    [
        (("retention", "set", "history.versions=x"), 2, "not a count"),
        (("retention", "set", "--thread", "t", "history.versions=3"), 2, "per thread"),
        (("retention", "set", "nope=3"), 2, "NAME=VALUE"),
    ],
)
def test_a_bad_command_line_is_one_line_and_status_2(
    db_path: Path, args: tuple[str, ...], status: int, fragment: str
) -> None:
    StateStore(db_path).close()
    done = agenthold(db_path, *args)
    assert done.returncode == status and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and fragment in done.stderr


def test_a_missing_database_is_one_line_and_status_2(tmp_path: Path) -> None:
    """A --db that is no database is a bad command line, as for every subcommand."""
    for args in (("retention",), ("compact", "--dry-run")):
        done = agenthold(tmp_path / "none.db", *args)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
        assert "no database at" in done.stderr
        assert "agenthold:" in done.stderr and not (tmp_path / "none.db").exists()


def test_the_commands_never_import_mcp(db_path: Path) -> None:
    StateStore(db_path).close()
    code = (
        "import sys; from agenthold.cli.main import main; "
        "statuses = [main(['--db', sys.argv[1], *a.split()]) for a in sys.argv[2:]]; "
        "assert 'mcp' not in sys.modules, 'mcp imported'; print(statuses)"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(db_path),
            "retention",
            "retention set claims.age=1d",
            "compact",
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("[0, 0, 0]"), done.stderr


@pytest.mark.usefixtures("no_child_coverage")
def test_the_compaction_benchmark_quick_run_reports_both_runs() -> None:
    done = subprocess.run(
        [sys.executable, "bench/perf/compact_bench.py", "--quick", "--json"],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert results["rows"] == 20_000 and results["compaction"]["removed"] >= 18_000
    for run in ("writes_alone", "writes_during_compaction"):
        assert results[run]["writes"] > 0
        assert results[run]["max_ms"] >= results[run]["p99_ms"] >= results[run]["median_ms"]


def test_a_database_busy_past_the_timeout_is_one_line_and_status_1(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agenthold.cli.main import main

    StateStore(db_path).close()
    with another_process_holds_the_write_lock(db_path):
        status = main(["--db", str(db_path), "retention", "set", "history.versions=3"])
    err = capsys.readouterr().err
    assert status == 1 and len(err.splitlines()) == 1 and err.startswith("agenthold: ")
    with StateStore(db_path, read_only=True) as store:
        assert read_retention(store.db) == Retention()  # nothing half-stored


def test_a_rule_of_a_newer_agenthold_is_left_alone(memory_store: StateStore) -> None:
    set_retention(memory_store.db, {"history.versions": 2})
    with memory_store.db.write() as (conn, _):
        conn.execute("INSERT INTO agenthold_retention VALUES ('database', '', 'history.bytes', 9)")
    assert read_retention(memory_store.db).database == {"history.versions": 2}
    assert compact(memory_store.db).history == 0  # an empty history: nothing to walk


@pytest.mark.anyio
async def test_a_servers_pass_skips_a_read_only_database_and_survives_a_busy_one(
    db_path: Path,
) -> None:
    from agenthold.serve.app import Agenthold

    with StateStore(db_path) as store:
        write_versions(store, "k", 3)
        set_retention(store.db, {"history.versions": 1})
    with StateStore(db_path, read_only=True) as ro:
        app = Agenthold(Coordinator(ro), tools="advanced")
        await app.compact_once()
        assert app.compactions == 0
    with StateStore(db_path, busy_timeout=0.1) as store:
        app = Agenthold(Coordinator(store), tools="advanced")
        with another_process_holds_the_write_lock(db_path):
            await app.compact_once()  # busy: logged, and the server goes on
        assert app.compactions == 0 and len(versions_of(store, "k")) == 3
        await app.compact_once()
        assert app.compactions == 1 and versions_of(store, "k") == [3]


def test_the_inspectors_history_of_a_wholly_compacted_key_is_one_line_and_status_1(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agenthold.cli.main import main
    from agenthold.exceptions import HistoryCompactedError as Exported

    assert Exported is HistoryCompactedError
    with StateStore(db_path) as store:
        write_versions(store, "k", 2)
        store.delete("ns", "k", deleted_by="w")
        store.set("ns", "newer", 1, updated_by="w")  # the newest row of all stays (its id)
        backdate(store, "UPDATE state_history SET updated_at = ?")
        set_retention(store.db, {"history.age": 60})
        compact(store.db)
    status = main(["--db", str(db_path), "history", "ns", "k"])
    err = capsys.readouterr().err
    assert status == 1 and len(err.splitlines()) == 1 and "compacted before version 4" in err


@pytest.mark.backends
def test_ids_are_never_handed_out_again_after_compaction_removes_the_newest_rows(
    store: StateStore,
) -> None:
    """Change feeds in other processes follow each table by its newest id: an id handed out
    again would be a change they never see. SQLite gives a table without AUTOINCREMENT the
    largest id plus one, so compaction must not remove the row holding the largest id."""
    coordinator = Coordinator(store)
    agent = coordinator.register("a").agent_id
    coordinator.claim("custom:job", agent)
    coordinator.release("custom:job", agent)
    store.set("ns", "k", 1, updated_by="w")
    store.delete("ns", "k", deleted_by="w")
    tops = {t: store.db.fetchone(f"SELECT max(id) FROM {t}")[0] for t in TABLES}
    backdate(store, "UPDATE claim_events SET at = ?")
    backdate(store, "UPDATE state_history SET updated_at = ?")
    set_retention(store.db, {"claims.age": 60, "history.age": 60})
    report = compact(store.db)
    assert report.claim_events >= 1 and report.history >= 1
    coordinator.claim("custom:job", agent)
    store.set("ns", "k", 2, updated_by="w")
    for table, top in tops.items():
        newest = store.db.fetchone(f"SELECT max(id) FROM {table}")[0]
        assert newest > top, table


TABLES = ("claim_events", "state_history")


def test_a_watch_in_another_process_sees_the_write_after_all_history_went(
    db_path: Path,
) -> None:
    """The symptom of an id handed out again: a watch in another process, begun before
    compaction removed every row of the key, is woken by the next write."""
    with StateStore(db_path) as store:
        store.set("ns", "k", 1, updated_by="w")
        store.delete("ns", "k", deleted_by="w")  # version 2
        script = (
            "import sys, threading, time\n"
            "from agenthold.store import StateStore\n"
            "s = StateStore(sys.argv[1]); found = []\n"
            "t = threading.Thread(target=lambda: found.append("
            "s.watch('ns', 'k', since_version=2, timeout=300)))\n"
            "t.start()\n"
            "def polling():\n"
            "    feed = s.db._file.feed  # made with the first subscriber\n"
            "    return feed is not None and feed.runner and 'state' in feed._cursors\n"
            "while not polling(): time.sleep(0.01)\n"
            "print('subscribed', flush=True)\n"
            "t.join()\n"
            "print(found[0].version if found[0] else 'timeout', flush=True)\n"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", script, str(db_path)],
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "subscribed"
            backdate(store, "UPDATE state_history SET updated_at = ?")
            set_retention(store.db, {"history.age": 60})
            compact(store.db)
            store.set("ns", "k", "again", updated_by="w")  # version 3
            out, _ = child.communicate(timeout=120)  # woken, not the watch's 300 s
        finally:
            child.kill()
            child.wait()
        assert out.strip() == "3"


@pytest.mark.backends
def test_compaction_beside_writing_threads_loses_no_acknowledged_write(store: StateStore) -> None:
    """Writers in threads and compaction passes run at once (history.versions 1: every pass
    races the writes for the rows it may remove); every acknowledged write is the key's value
    or in its kept history, versions run without a gap or a repeat, and the live version
    always stays."""
    set_retention(store.db, {"history.versions": 1})
    writers, rounds = 3, 40
    acked: dict[str, list[int]] = {f"k{w}": [] for w in range(writers)}
    done = threading.Event()
    errors: list[BaseException] = []
    removed: list[int] = []
    passed = threading.Condition()

    def write(key: str) -> None:
        try:
            for i in range(rounds):
                acked[key].append(store.set("ns", key, i, updated_by="w").version)
                if i % 10 == 9:  # let a whole pass run among the writes, whatever the load
                    seen = len(removed)
                    with passed:
                        passed.wait_for(lambda s=seen: len(removed) > s + 1, timeout=60)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def compacting() -> None:
        try:
            while not done.is_set():
                count = compact(store.db, batch=2).history
                with passed:
                    removed.append(count)
                    passed.notify_all()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(k,)) for k in acked]
    compactor = threading.Thread(target=compacting)
    compactor.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    done.set()
    compactor.join(300)
    assert not errors and not compactor.is_alive()
    assert sum(removed) > 0  # the passes ran among the writes
    compact(store.db)
    for key, versions in acked.items():
        assert versions == list(range(1, rounds + 1))  # no gap, no repeat
        record = store.get("ns", key)
        assert record is not None and record.version == rounds and record.value == rounds - 1
        assert versions_of(store, key) == [rounds]  # the live version stayed
