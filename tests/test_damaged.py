"""Damaged records: stored values that are not strict JSON.

Another tool (or a damaged page) can leave text in the ``value`` column that agenthold never
wrote: NaN, text that is not JSON at all, bytes that are not UTF-8. Each such row is written
here with the engine's own driver (sqlite3, psycopg), behind agenthold's back, then read
through the library and over MCP: the damaged key answers a clear error of its own, and the
rest of its namespace is still read, listed and exported.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support import coordinator_at, in_process_client, reply_of

from agenthold.store import DamagedRecordError, StateStore

pytestmark = pytest.mark.anyio

# What another tool might leave in the value column, and what the error says about it.
DAMAGE = {
    "nan": ("NaN", "NaN"),
    "infinity": ('{"x": -Infinity}', "-Infinity"),
    "not-json": ("{oops", "Expecting property name"),
    "junk-after": ('{"a": 1} trailing', "Extra data"),
    "bare-word": ("hello", "reads 'hello'"),
    "surrogate": ('"\\ud800"', "lone surrogate"),
    "huge-integer": ("9" * 5000, "integer string conversion"),
    "too-deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    # numbers past the largest float read as infinity, which JSON does not have either
    "overflow": ("[1e999]", "'1e999', too large"),
    "overflow-digits": ('{"x": -' + "9" * 400 + ".5}", "too large for a float"),
}


def tamper(backend: str, db_url: str, sql: str, params: tuple[Any, ...] = ()) -> None:
    """Run ``sql`` (``?`` placeholders) on the database with the engine's own driver."""
    if backend == "postgresql":
        import psycopg

        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
    else:
        with contextlib.closing(sqlite3.connect(db_url)) as conn, conn:
            conn.execute(sql, params)


def damage(backend: str, db_url: str, key: str, text: str) -> None:
    """Replace the live value of ``ns``/``key`` (and its newest history row) with ``text``."""
    tamper(backend, db_url, "UPDATE state SET value = ? WHERE namespace = 'ns' AND key = ?",
           (text, key))  # fmt: skip
    tamper(
        backend, db_url,
        "UPDATE state_history SET value = ? WHERE namespace = 'ns' AND key = ? AND version = "
        "(SELECT max(version) FROM state_history WHERE namespace = 'ns' AND key = ?)",
        (text, key, key),
    )  # fmt: skip


def fill(store: StateStore) -> None:
    for key in ("a", "b", "c", "d"):
        store.set("ns", key, {"key": key}, updated_by="t")


@pytest.mark.backends
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_value_is_an_error_for_its_key_only(
    store: StateStore, backend: str, db_url: str, kind: str
) -> None:
    fill(store)
    store.set("ns", "b", {"key": "b", "second": True}, updated_by="t")
    text, reason = DAMAGE[kind]
    damage(backend, db_url, "b", text)
    with pytest.raises(DamagedRecordError) as caught:
        store.get("ns", "b")
    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.namespace, error.key, error.version) == ("ns", "b", 2)
    assert reason in str(error) and "'b'" in str(error) and error.hint
    assert store.get("ns", "a").value == {"key": "a"}
    with pytest.raises(DamagedRecordError, match="version 2"):
        store.history("ns", "b")
    with pytest.raises(DamagedRecordError):
        store.changed_since("ns", "b", 0)
    # Without a list to collect them in, reading the whole namespace names the damaged key...
    with pytest.raises(DamagedRecordError, match="'b'"):
        store.list_keys("ns")
    with pytest.raises(DamagedRecordError, match="'b'"):
        store.export("ns")
    # ...and with one, the rest is read and the damaged key reported.
    damaged: list[DamagedRecordError] = []
    assert [r.key for r in store.list_keys("ns", damaged=damaged)] == ["a", "c", "d"]
    assert [(e.key, e.version, e.updated_by) for e in damaged] == [("b", 2, "t")]
    damaged = []
    exported = store.export("ns", damaged=damaged)
    assert [r.record.key for r in exported.records] == ["a", "c", "d"]
    assert [e.key for e in damaged] == ["b"]
    # Writing the key again without a version check repairs it (so would a delete); the
    # damaged entry stays in its history, left out of what is read and named in damaged.
    store.set("ns", "b", "repaired", updated_by="t")
    assert store.get("ns", "b").value == "repaired"
    damaged = []
    assert [h.version for h in store.history("ns", "b", damaged=damaged)] == [3, 1]
    assert [(e.key, e.version) for e in damaged] == [("b", 2)]
    damaged = []
    exported = store.export("ns", damaged=damaged)
    assert [r.record.key for r in exported.records] == ["a", "b", "c", "d"]
    assert [h.version for h in exported.records[1].history] == [3, 1]
    assert [(e.key, e.version) for e in damaged] == [("b", 2)]


@pytest.mark.backends
def test_damaged_keys_count_towards_a_page_and_the_cursor_passes_them(
    store: StateStore, backend: str, db_url: str
) -> None:
    fill(store)
    damage(backend, db_url, "b", "NaN")
    damage(backend, db_url, "d", "{")
    damaged: list[DamagedRecordError] = []
    keys, after = [], ""
    while after is not None:
        page, after = store.list_page("ns", after=after, limit=2, damaged=damaged)
        keys += [r.key for r in page]
    assert keys == ["a", "c"] and [e.key for e in damaged] == ["b", "d"]
    damaged = []
    exported, after = [], ""
    while after is not None:
        piece = store.export("ns", after=after, limit=1, damaged=damaged)
        exported += [r.record.key for r in piece.records]
        after = piece.next_after
    assert exported == ["a", "c"] and [e.key for e in damaged] == ["b", "d"]


@pytest.mark.backends
def test_a_damaged_old_history_entry_is_left_out_and_its_record_still_exported(
    store: StateStore, backend: str, db_url: str
) -> None:
    fill(store)
    store.set("ns", "c", "newer", updated_by="t")
    tamper(backend, db_url,
           "UPDATE state_history SET value = 'NaN' WHERE key = 'c' AND version = 1")  # fmt: skip
    assert store.get("ns", "c").value == "newer"  # the live value is fine
    damaged: list[DamagedRecordError] = []
    exported = store.export("ns", damaged=damaged)
    assert [r.record.key for r in exported.records] == ["a", "b", "c", "d"]
    assert [h.version for h in exported.records[2].history] == [2]
    assert [(e.key, e.version) for e in damaged] == [("c", 1)]
    with pytest.raises(DamagedRecordError, match="version 1"):
        store.history("ns", "c")
    with pytest.raises(DamagedRecordError, match="version 1"):
        store.export("ns")


def test_text_that_is_not_utf8_is_a_damaged_record_not_a_failed_database(
    db_path: Path,
) -> None:
    with StateStore(db_path) as store:
        fill(store)
        with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
            conn.execute("UPDATE state SET value = CAST(X'22FF22' AS TEXT) WHERE key = 'b'")
            conn.execute("UPDATE state SET value = X'7B7D' WHERE key = 'c'")  # a blob
        with pytest.raises(DamagedRecordError, match="not UTF-8"):
            store.get("ns", "b")
        with pytest.raises(DamagedRecordError, match="blob"):
            store.get("ns", "c")
        damaged: list[DamagedRecordError] = []
        assert [r.key for r in store.list_keys("ns", damaged=damaged)] == ["a", "d"]
        assert [e.key for e in damaged] == ["b", "c"]
        damaged = []
        assert [r.record.key for r in store.export("ns", damaged=damaged).records] == ["a", "d"]
        assert [e.key for e in damaged] == ["b", "c"]
        damaged = []
        assert [r.key for r in store.list_page("ns", damaged=damaged)[0]] == ["a", "d"]
        assert store.get("ns", "d").value == {"key": "d"}  # the connection reads text again
    with StateStore(":memory:") as memory:  # the in-memory database reads through one connection
        memory.set("ns", "k", 1, updated_by="t")
        memory.db.fetchone("UPDATE state SET value = CAST(X'FF' AS TEXT)")
        with pytest.raises(DamagedRecordError, match="not UTF-8"):
            memory.get("ns", "k")
        assert memory.list_keys("ns", damaged=[]) == []


def test_a_writer_name_that_is_not_utf8_leaves_the_record_readable(db_path: Path) -> None:
    with StateStore(db_path) as store:
        fill(store)
        with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
            conn.execute("UPDATE state SET updated_by = CAST(X'FF41' AS TEXT) WHERE key = 'b'")
        record = store.get("ns", "b")
        assert record.value == {"key": "b"} and record.updated_by == "\ufffdA"
        assert json.dumps(record.updated_by)  # a plain text in any reply
        assert [r.key for r in store.list_keys("ns", damaged=[])] == ["a", "b", "c", "d"]
        assert len(store.export("ns").records) == 4


@pytest.mark.backends
def test_json_text_with_whitespace_around_it_reads_as_its_value(
    store: StateStore, backend: str, db_url: str
) -> None:
    fill(store)
    damage(backend, db_url, "b", ' {"x": 1}')  # another tool's spacing: still valid JSON
    damage(backend, db_url, "c", '{"x": 2}\n')
    assert store.get("ns", "b").value == {"x": 1}
    assert store.get("ns", "c").value == {"x": 2}
    with pytest.raises(DamagedRecordError, match="character 1"):
        damage(backend, db_url, "d", " nope")
        store.get("ns", "d")


@pytest.mark.backends
async def test_over_mcp_a_damaged_key_is_an_error_and_list_and_export_report_it(
    store: StateStore, backend: str, db_url: str, tmp_path: Path
) -> None:
    fill(store)
    damage(backend, db_url, "b", '{"x": NaN}')
    async with in_process_client(coordinator_at(store, tmp_path), tools="advanced") as (_, c):
        got = reply_of(await c.call_tool("agenthold_get", {"namespace": "ns", "key": "b"}))
        assert got["error"] == "damaged_record"
        assert "'b'" in got["message"] and "NaN" in got["message"]
        assert "agenthold_set" in got["hint"] and "force" in got["hint"]
        fine = reply_of(await c.call_tool("agenthold_get", {"namespace": "ns", "key": "a"}))
        assert fine["value"] == {"key": "a"}
        listed = reply_of(await c.call_tool("agenthold_list", {"namespace": "ns", "limit": 2}))
        assert [r["key"] for r in listed["records"]] == ["a"] and listed["count"] == 1
        assert [d["key"] for d in listed["damaged"]] == ["b"]
        assert listed["damaged"][0]["version"] == 1 and "NaN" in listed["damaged"][0]["message"]
        assert "left out" in listed["hint"] and "next_cursor" in listed["hint"]
        rest = reply_of(await c.call_tool(
            "agenthold_list", {"namespace": "ns", "cursor": listed["next_cursor"]}
        ))  # fmt: skip
        assert [r["key"] for r in rest["records"]] == ["c", "d"] and "damaged" not in rest
        exported = reply_of(await c.call_tool("agenthold_export", {"namespace": "ns"}))
        assert [r["key"] for r in exported["records"]] == ["a", "c", "d"]
        assert exported["record_count"] == 3 and [d["key"] for d in exported["damaged"]] == ["b"]
        repaired = reply_of(await c.call_tool("agenthold_set", {
            "namespace": "ns", "key": "b", "value": 2, "updated_by": "t", "force": True,
        }))  # fmt: skip
        assert repaired["status"] == "ok" and repaired["version"] == 2
        history = reply_of(await c.call_tool("agenthold_history", {"namespace": "ns", "key": "b"}))
        assert [h["version"] for h in history["history"]] == [2]
        assert [(d["key"], d["version"]) for d in history["damaged"]] == [("b", 1)]
        again = reply_of(await c.call_tool("agenthold_export", {"namespace": "ns"}))
        assert again["record_count"] == 4 and [d["version"] for d in again["damaged"]] == [1]
        fine = reply_of(await c.call_tool("agenthold_list", {"namespace": "ns"}))
        assert fine["count"] == 4 and "damaged" not in fine and "hint" not in fine


@pytest.mark.backends
async def test_a_stored_number_too_large_for_a_float_is_a_damaged_record_over_mcp(
    store: StateStore, backend: str, db_url: str, tmp_path: Path
) -> None:
    fill(store)
    # what must not be mistaken for one: text that merely looks like it, and large finite floats
    store.set(
        "ns", "c", {"s": "1e999 " + "7" * 300, "big": 1.5e308, "small": 1e-999}, updated_by="t"
    )
    damage(backend, db_url, "b", "[1e999]")
    async with in_process_client(coordinator_at(store, tmp_path), tools="advanced") as (_, c):
        got = await c.call_tool("agenthold_get", {"namespace": "ns", "key": "b"})
        assert got.is_error and reply_of(got)["error"] == "damaged_record"
        assert "1e999" in reply_of(got)["message"] and reply_of(got)["hint"]
        listed = reply_of(await c.call_tool("agenthold_list", {"namespace": "ns"}))
        assert [r["key"] for r in listed["records"]] == ["a", "c", "d"]
        assert [d["key"] for d in listed["damaged"]] == ["b"]
        assert listed["records"][1]["value"] == {
            "s": "1e999 " + "7" * 300,
            "big": 1.5e308,
            "small": 0.0,
        }
        exported = reply_of(await c.call_tool("agenthold_export", {"namespace": "ns"}))
        assert exported["record_count"] == 3 and [d["key"] for d in exported["damaged"]] == ["b"]


def test_the_inspector_shows_damaged_values_flagged_and_everything_else(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agenthold.cli.main import main

    with StateStore(db_path) as store:
        fill(store)
        store.set("ns", "b", "second", updated_by="t")
    damage("sqlite", str(db_path), "b", "NaN")
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE state_history SET value = CAST(X'FF' AS TEXT) WHERE key = 'c'")

    def run(*argv: str) -> tuple[int, str, str]:
        status = main([*argv, "--db", str(db_path)])
        out, err = capsys.readouterr()
        return status, out, err

    status, out, err = run("keys", "ns")
    assert status == 0 and not err
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"a", "b", "c", "d"}
    assert "(damaged: not valid JSON)" in rows["b"] and '{"key":"a"}' in rows["a"]
    status, out, _ = run("keys", "ns", "--json")
    by_key = {r["key"]: r for r in json.loads(out)}
    assert by_key["b"]["damaged"] is True and by_key["b"]["version"] == 2
    assert "NaN" in by_key["b"]["message"] and "damaged" not in by_key["a"]
    status, out, _ = run("history", "ns", "b", "--json")
    assert status == 0
    assert [(h["version"], h.get("damaged", False)) for h in json.loads(out)] == [
        (2, True), (1, False),
    ]  # fmt: skip
    status, out, err = run("log", "--json")
    assert status == 0 and not err, err
    values = [(e["key"], e["value"]) for e in json.loads(out)]
    assert ("b", "(damaged: not valid JSON)") in values and (
        "c",
        "(damaged: not valid JSON)",
    ) in values
    assert ("a", {"key": "a"}) in values
