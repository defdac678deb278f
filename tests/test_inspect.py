"""Tests for the read-only inspector (agenthold/inspect.py), through the real command line.

Every database here is made by the real StateStore and Coordinator. Most runs call
``agenthold.cli.main`` in-process; ``log --follow`` (stopped with SIGINT or SIGTERM), the
"never imports mcp" check and the ASCII terminal run ``python -m agenthold`` as a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import REPO, LineProcess

from agenthold.claims import Coordinator
from agenthold.cli.main import main
from agenthold.inspect import commands as inspector
from agenthold.inspect import tables
from agenthold.store import SCHEMA_VERSION, StateStore

posix_only = pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")

AGENT_KEYS = {
    "agent_id",
    "name",
    "model",
    "purpose",
    "registered_at",
    "last_seen_at",
    "lease_ends_at",
    "lease_end_outcome",
    "lease_state",
    "claims_held",
}
CLAIM_KEYS = {
    "resource",
    "state",
    "version",
    "held_by",
    "agent_name",
    "agent_model",
    "claimed_at",
    "lease_ends_at",
    "last_outcome",
    "last_holder",
    "last_holder_name",
    "last_outcome_at",
    "moved_to",
}
NAMESPACE_KEYS = {"namespace", "record_count", "deleted_count", "updated_at", "updated_by"}
RECORD_KEYS = {"namespace", "key", "value", "version", "updated_by", "updated_at"}
HISTORY_KEYS = {"version", "value", "updated_by", "updated_at", "event_type"}
EVENT_KEYS = {
    "at",
    "event",
    "actor",
    "principal",
    "agent_id",
    "namespace",
    "key",
    "resource",
    "version",
    "value",
    "outcome",
    "moved_to",
    "thread_id",
}
LONG_VALUE = "x" * 5000


# --------------------------------------------------------------------------------------------
# Databases made by the real store and claims code
# --------------------------------------------------------------------------------------------


@dataclass
class Demo:
    path: Path
    editor: str
    reviewer: str
    sleepy: str  # its claim TTL ran out while it held file://default/src/ttl.py
    gone: str  # its lease was ended (a disconnect) while it held file://default/src/gone.py
    reaped: str  # removed as idle

    @property
    def db(self) -> str:
        return str(self.path)


def build_demo(path: Path) -> Demo:
    """Agents, claims in every state and keys with writes, deletes, tombstones, a long value
    and unicode, all through the public API."""
    store = StateStore(path)
    coord = Coordinator(store)
    editor = coord.register("editor-agent", "claude-sonnet-4", "edits chapter 1").agent_id
    reviewer = coord.register("review-bot", "gpt-4o").agent_id
    coord.claim("custom://chapter-1", editor)
    coord.claim("src/main.py", reviewer)
    idle = coord.register("idle-agent").agent_id
    time.sleep(0.002)
    assert coord.reap_idle_agents(0) == [idle]
    coord.claim("src/a.py", reviewer)
    coord.release("src/a.py", reviewer, "modified")
    coord.claim("src/old.py", reviewer)
    coord.release("src/old.py", reviewer, "moved", moved_to="src/new.py")
    coord.claim("src/tmp.py", editor)
    coord.release("src/tmp.py", editor, "deleted")
    coord.claim("src/plain.py", editor)
    coord.release("src/plain.py", editor)

    store.set("orders", "order-1", {"status": "received"}, updated_by="intake-agent")
    store.set(
        "orders", "order-1", {"status": "paid"}, updated_by="billing-agent", expected_version=1
    )
    store.set("orders", "order-2", LONG_VALUE, updated_by="intake-agent")
    store.delete("orders", "order-2", deleted_by="cleanup-agent")
    store.set("notes", "日本語", {"text": "héllo → ✓ 日本語"}, updated_by="translator")
    store.set("archive", "old", 1, updated_by="archivist")
    store.delete("archive", "old", deleted_by="archivist")

    short = Coordinator(store, claim_ttl=0.05)
    sleepy = short.register("sleepy-agent", "tiny").agent_id
    short.claim("src/ttl.py", sleepy)
    gone = coord.register("gone-agent").agent_id
    coord.claim("src/gone.py", gone)
    coord.end_lease(gone, 0.0)
    coord.end_lease(reviewer, 300.0)  # disconnected, but may still come back
    time.sleep(0.1)  # sleepy's TTL runs out
    store.close()
    return Demo(path, editor, reviewer, sleepy, gone, idle)


@pytest.fixture
def demo(tmp_path: Path) -> Demo:
    return build_demo(tmp_path / "demo.db")


@pytest.fixture
def empty_db(tmp_path: Path) -> str:
    path = tmp_path / "empty.db"
    StateStore(path).close()
    return str(path)


@pytest.fixture(autouse=True)
def terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables fit the terminal: pin its width so results do not depend on where tests run."""
    monkeypatch.setenv("COLUMNS", "200")


@dataclass
class Result:
    status: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Result:
    try:
        status = main(list(argv))
    except SystemExit as exc:  # argparse: --help and usage errors
        status = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return Result(status, out, err)


def cells(line: str) -> list[str]:
    """The cells of a table row: the text between runs of two or more spaces."""
    return re.split(r"\s{2,}", line.strip())


def row_of(result: Result, first_cell: str) -> list[str]:
    """The cells of the table row that starts with ``first_cell``."""
    for line in result.lines[2:]:
        if line.startswith(first_cell + " ") or line == first_cell:
            return cells(line)
    raise AssertionError(f"no row for {first_cell!r} in:\n{result.out}")


def assert_one_line_error(result: Result, status: int, *fragments: str) -> None:
    assert result.status == status
    assert result.out == ""
    assert result.err.startswith("agenthold: ")
    assert result.err.count("\n") == 1
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in result.err


# --------------------------------------------------------------------------------------------
# The command line itself
# --------------------------------------------------------------------------------------------


def test_help_lists_every_inspector_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(capsys, "--help")
    assert result.status == 0
    for command in inspector.COMMANDS:
        assert command in result.out


@pytest.mark.parametrize("command", inspector.COMMANDS)
def test_every_subcommand_has_help_with_db_and_json(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    result = run_cli(capsys, command, "--help")
    assert result.status == 0
    assert "--db PATH" in result.out
    assert "--json" in result.out


def test_db_given_before_the_subcommand_is_used(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "--db", demo.db, "claims")
    assert result.status == 0
    assert "custom://chapter-1" in result.out


def test_db_given_after_the_subcommand_overrides_the_one_before(
    capsys: pytest.CaptureFixture[str], demo: Demo, tmp_path: Path
) -> None:
    missing = str(tmp_path / "missing.db")
    result = run_cli(capsys, "--db", missing, "claims", "--db", demo.db)
    assert result.status == 0
    assert "custom://chapter-1" in result.out


def test_default_db_is_the_servers_per_user_database(
    capsys: pytest.CaptureFixture[str], demo: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = demo.path.parent / "state"
    (state / "agenthold").mkdir(parents=True)
    os.replace(demo.path, state / "agenthold" / "agenthold.db")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.chdir(demo.path.parent)
    result = run_cli(capsys, "claims")
    assert result.status == 0
    assert "custom://chapter-1" in result.out


# --------------------------------------------------------------------------------------------
# agents
# --------------------------------------------------------------------------------------------


def test_agents_table_shows_each_agent_with_lease_and_claims_held(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "agents", "--db", demo.db)
    assert result.status == 0
    assert result.lines[0].split() == [
        "ID", "NAME", "MODEL", "REGISTERED", "LAST", "SEEN", "LEASE", "CLAIMS",
    ]  # fmt: skip
    assert set(result.lines[1]) == {"-", " "}
    editor = row_of(result, demo.editor)
    assert editor[1:3] == ["editor-agent", "claude-sonnet-4"]
    assert editor[3].endswith("s ago") and editor[4].endswith("s ago")
    assert editor[5:] == ["no expiry", "1"]
    reviewer = row_of(result, demo.reviewer)
    assert reviewer[5].startswith("ends in ") and reviewer[5].endswith("m (disconnected)")
    assert reviewer[6] == "1"
    sleepy = row_of(result, demo.sleepy)
    assert sleepy[5].startswith("ended ") and sleepy[5].endswith(" ago (expired)")
    assert sleepy[6] == "0"  # a lapsed lease holds nothing
    gone = row_of(result, demo.gone)
    assert gone[2] == "-"  # registered without a model
    assert gone[5].endswith(" ago (abandoned)") and gone[6] == "0"
    assert demo.reaped not in result.out


def test_agents_json_has_the_documented_shape(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "agents", "--db", demo.db, "--json")
    assert result.status == 0
    agents = {a["agent_id"]: a for a in result.json()}
    assert set(agents) == {demo.editor, demo.reviewer, demo.sleepy, demo.gone}
    for agent in agents.values():
        assert set(agent) == AGENT_KEYS
    editor = agents[demo.editor]
    assert editor["purpose"] == "edits chapter 1"
    assert (editor["lease_state"], editor["lease_ends_at"], editor["claims_held"]) == (
        "none",
        None,
        2 - 1,  # custom://chapter-1 is held; src/tmp.py and src/plain.py were released
    )
    assert agents[demo.reviewer]["lease_state"] == "active"
    assert agents[demo.reviewer]["lease_end_outcome"] == "abandoned"
    assert agents[demo.sleepy]["lease_state"] == "ended"
    assert agents[demo.sleepy]["lease_end_outcome"] == "expired"
    assert agents[demo.gone]["claims_held"] == 0


# --------------------------------------------------------------------------------------------
# claims
# --------------------------------------------------------------------------------------------


def test_claims_shows_only_resources_held_now_with_holder_names(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "claims", "--db", demo.db)
    assert result.status == 0
    assert result.lines[0].split() == ["RESOURCE", "STATE", "BY", "SINCE"]
    rows = [row_of(result, uri) for uri in ("custom://chapter-1", "file://default/src/main.py")]
    assert [r[1:3] for r in rows] == [["claimed", "editor-agent"], ["claimed", "review-bot"]]
    assert all(r[3].endswith("s ago") for r in rows)
    assert len(result.lines) == 4


def test_expired_and_abandoned_claims_are_never_shown_as_claimed(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    held = run_cli(capsys, "claims", "--db", demo.db)
    assert "src/ttl.py" not in held.out and "src/gone.py" not in held.out
    everything = run_cli(capsys, "claims", "--all", "--db", demo.db)
    assert row_of(everything, "file://default/src/ttl.py")[1:3] == ["expired", "sleepy-agent"]
    assert row_of(everything, "file://default/src/gone.py")[1:3] == ["abandoned", "gone-agent"]
    records = {
        r["resource"]: r
        for r in run_cli(capsys, "claims", "--all", "--json", "--db", demo.db).json()
    }
    ttl = records["file://default/src/ttl.py"]
    assert (ttl["state"], ttl["held_by"], ttl["last_outcome"], ttl["last_holder"]) == (
        "free",
        None,
        "expired",
        demo.sleepy,
    )


def test_claims_all_states_every_outcome_in_words(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "claims", "--all", "--db", demo.db)
    assert result.status == 0
    states = {uri: row_of(result, uri)[1] for uri in (
        "custom://chapter-1",
        "file://default/src/a.py",
        "file://default/src/old.py",
        "file://default/src/tmp.py",
        "file://default/src/plain.py",
    )}  # fmt: skip
    assert states == {
        "custom://chapter-1": "claimed",
        "file://default/src/a.py": "free (modified)",
        "file://default/src/old.py": "free (moved → file://default/src/new.py)",
        "file://default/src/tmp.py": "free (deleted)",
        "file://default/src/plain.py": "free",
    }
    assert row_of(result, "file://default/src/a.py")[2] == "review-bot"  # the last holder


def test_claims_json_has_the_documented_shape(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    records = run_cli(capsys, "claims", "--all", "--json", "--db", demo.db).json()
    assert [r["resource"] for r in records] == sorted(r["resource"] for r in records)
    for record in records:
        assert set(record) == CLAIM_KEYS
    by_uri = {r["resource"]: r for r in records}
    moved = by_uri["file://default/src/old.py"]
    assert (moved["state"], moved["last_outcome"], moved["moved_to"]) == (
        "free",
        "moved",
        "file://default/src/new.py",
    )
    assert (moved["last_holder"], moved["last_holder_name"]) == (demo.reviewer, "review-bot")
    assert moved["version"] == 2
    held = by_uri["custom://chapter-1"]
    assert (held["held_by"], held["agent_name"], held["agent_model"]) == (
        demo.editor,
        "editor-agent",
        "claude-sonnet-4",
    )
    current = run_cli(capsys, "claims", "--json", "--db", demo.db).json()
    assert {r["resource"] for r in current} == {
        "custom://chapter-1",
        "file://default/src/main.py",
    }


# --------------------------------------------------------------------------------------------
# namespaces, keys, history
# --------------------------------------------------------------------------------------------


def test_namespaces_lists_every_namespace_with_live_and_deleted_counts(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "namespaces", "--db", demo.db)
    assert result.status == 0
    assert result.lines[0].split() == ["NAMESPACE", "KEYS", "DELETED", "LAST", "CHANGE", "BY"]
    orders = row_of(result, "orders")
    assert orders[1:3] == ["1", "1"] and orders[4] == "cleanup-agent"
    archive = row_of(result, "archive")
    assert archive[1:3] == ["0", "1"]  # only tombstones: still a namespace
    records = run_cli(capsys, "namespaces", "--json", "--db", demo.db).json()
    assert [r["namespace"] for r in records] == ["archive", "notes", "orders"]
    for record in records:
        assert set(record) == NAMESPACE_KEYS
    assert records[2]["record_count"] == 1 and records[2]["deleted_count"] == 1
    assert records[2]["updated_by"] == "cleanup-agent"


def test_keys_lists_live_keys_with_versions_writers_and_values(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "keys", "orders", "--db", demo.db)
    assert result.status == 0
    assert result.lines[0].split() == ["KEY", "VERSION", "UPDATED", "BY", "UPDATED", "VALUE"]
    row = row_of(result, "order-1")
    assert row[1:3] == ["2", "billing-agent"]
    assert row[4] == '{"status":"paid"}'
    assert "order-2" not in result.out  # deleted
    records = run_cli(capsys, "keys", "orders", "--json", "--db", demo.db).json()
    assert len(records) == 1 and set(records[0]) == RECORD_KEYS
    assert records[0]["value"] == {"status": "paid"}


def test_keys_of_a_namespace_whose_keys_were_all_deleted_is_empty_not_an_error(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "keys", "archive", "--db", demo.db)
    assert result.status == 0 and len(result.lines) == 2 and result.err == ""
    assert run_cli(capsys, "keys", "archive", "--json", "--db", demo.db).json() == []


def test_keys_of_a_namespace_never_written_is_an_error(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "keys", "nope", "--db", demo.db)
    assert_one_line_error(result, 1, "no namespace 'nope'", "agenthold namespaces")


def test_history_shows_writes_and_deletes_newest_first(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "history", "orders", "order-1", "--db", demo.db)
    assert result.status == 0
    assert result.lines[0].split() == ["VERSION", "EVENT", "BY", "WHEN", "VALUE"]
    assert [line.split()[:3] for line in result.lines[2:]] == [
        ["2", "write", "billing-agent"],
        ["1", "write", "intake-agent"],
    ]
    records = run_cli(capsys, "history", "orders", "order-1", "--json", "--db", demo.db).json()
    assert [r["value"] for r in records] == [{"status": "paid"}, {"status": "received"}]
    for record in records:
        assert set(record) == HISTORY_KEYS


def test_history_and_log_show_the_principal_beside_the_actor(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Writes, deletes and claim events made through a token carry its principal: the tables
    show it in brackets after the free-text writer or agent name, JSON as its own field; a
    write made without one (stdio, no tokens) shows the writer alone."""
    db = tmp_path / "who.db"
    with StateStore(db) as store:
        coord = Coordinator(store)
        store.set("orders", "o", 1, updated_by="intake", principal="alice")
        store.set("orders", "o", 2, updated_by="says-alice", expected_version=1, principal="bob")
        store.set("orders", "o", 3, updated_by="local", expected_version=2)
        store.delete("orders", "o", deleted_by="cleanup", principal="alice")
        agent = coord.register("alice-agent", principal="alice").agent_id
        coord.claim("custom://deploy", agent, principal="alice")
        coord.release("custom://deploy", agent, principal="alice")

    table = run_cli(capsys, "history", "orders", "o", "--db", str(db))
    assert table.status == 0
    assert [cells(line)[:3] for line in table.lines[2:]] == [
        ["4", "delete", "cleanup (alice)"],
        ["3", "write", "local"],
        ["2", "write", "says-alice (bob)"],
        ["1", "write", "intake (alice)"],
    ]
    records = run_cli(capsys, "history", "orders", "o", "--json", "--db", str(db)).json()
    assert [r.get("principal") for r in records] == ["alice", None, "bob", "alice"]

    log = run_cli(capsys, "log", "--db", str(db))
    assert log.status == 0
    rows = [cells(line)[1:3] for line in log.lines[2:]]
    assert rows == [
        ["intake (alice)", "write"],
        ["says-alice (bob)", "write"],
        ["local", "write"],
        ["cleanup (alice)", "delete"],
        ["alice-agent (alice)", "registered"],
        ["alice-agent (alice)", "claimed"],
        ["alice-agent (alice)", "released"],
    ]
    events = run_cli(capsys, "log", "--json", "--db", str(db)).json()
    assert [(e["actor"], e["principal"]) for e in events] == [
        ("intake", "alice"),
        ("says-alice", "bob"),
        ("local", None),
        ("cleanup", "alice"),
        ("alice-agent", "alice"),
        ("alice-agent", "alice"),
        ("alice-agent", "alice"),
    ]


@pytest.mark.backends
def test_the_shared_token_is_named_once_and_a_resource_keeps_its_width_at_100_columns(
    capsys: pytest.CaptureFixture[str], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared token's principal is named "(shared token)" already: shown as such beside
    the actor, not in a second pair of parentheses. At 100 columns the log's WHAT keeps the
    resource whole (36 cells) and the actor with its principal gives way first."""
    from agenthold.identity.principals import SHARED

    resource = "custom://pg-demo-1/chapter-one.md"  # 33 cells
    with StateStore(db_url) as store:
        coord = Coordinator(store)
        agent = coord.register("pg-editor", principal=SHARED.name).agent_id
        coord.claim(resource, agent, principal=SHARED.name)
        store.set("ns", "k", "v" * 300, updated_by="pg-editor", principal=SHARED.name)
    monkeypatch.setenv("COLUMNS", "200")
    wide = run_cli(capsys, "log", "--db", db_url)
    assert ["pg-editor (shared token)", "claimed"] in [cells(line)[1:3] for line in wide.lines]
    assert "((" not in wide.out
    agents = run_cli(capsys, "agents", "--db", db_url)
    assert "pg-editor (shared token)" in agents.out and "((" not in agents.out
    monkeypatch.setenv("COLUMNS", "100")
    for command in (["log"], ["status"]):
        narrow = run_cli(capsys, *command, "--db", db_url)
        claimed = next(line for line in narrow.lines if " claimed " in line)
        assert claimed.rstrip().endswith(resource), narrow.out  # whole, not cut
        assert all(len(line) <= 100 for line in narrow.lines[1:]), narrow.out
        write = next(line for line in narrow.lines if " write " in line)
        assert write.endswith("…")  # a long value is still cut to fit


def test_history_of_a_deleted_key_shows_its_tombstone(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "history", "archive", "old", "--db", demo.db)
    assert result.status == 0
    assert [line.split()[:3] for line in result.lines[2:]] == [
        ["2", "delete", "archivist"],
        ["1", "write", "archivist"],
    ]
    assert result.lines[2].endswith(" -")  # a delete has no value
    records = run_cli(capsys, "history", "archive", "old", "--json", "--db", demo.db).json()
    assert records[0]["event_type"] == "delete" and records[0]["value"] is None


def test_history_limit_keeps_the_newest_entries(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    records = run_cli(
        capsys, "history", "orders", "order-1", "--limit", "1", "--json", "--db", demo.db
    ).json()
    assert [r["version"] for r in records] == [2]


def test_history_of_a_key_never_written_is_an_error(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "history", "orders", "order-9", "--db", demo.db)
    assert_one_line_error(result, 1, "no key 'order-9' in namespace 'orders'")
    result = run_cli(capsys, "history", "nope", "order-1", "--db", demo.db)
    assert_one_line_error(result, 1, "no namespace 'nope'")


def test_a_blank_namespace_is_refused_with_a_clear_error(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    result = run_cli(capsys, "keys", " ", "--db", demo.db)
    assert_one_line_error(result, 1, "namespace must not be empty or blank")


# --------------------------------------------------------------------------------------------
# log
# --------------------------------------------------------------------------------------------


def test_log_shows_every_kind_of_event_oldest_first(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    events = run_cli(capsys, "log", "--limit", "1000", "--json", "--db", demo.db).json()
    for event in events:
        assert set(event) == EVENT_KEYS
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
    kinds = {e["event"] for e in events}
    assert kinds == {"registered", "claimed", "released", "reaped", "lease_ends", "write", "delete"}
    moved = next(e for e in events if e["outcome"] == "moved")
    assert (moved["actor"], moved["agent_id"], moved["resource"], moved["moved_to"]) == (
        "review-bot",
        demo.reviewer,
        "file://default/src/old.py",
        "file://default/src/new.py",
    )
    reaped = next(e for e in events if e["event"] == "reaped")
    assert reaped["actor"] == demo.reaped  # its name went with it
    paid = next(e for e in events if e["value"] == {"status": "paid"})
    assert (paid["actor"], paid["namespace"], paid["key"], paid["version"]) == (
        "billing-agent",
        "orders",
        "order-1",
        2,
    )

    table = run_cli(capsys, "log", "--limit", "1000", "--db", demo.db)
    assert table.lines[0].split() == ["TIME", "(UTC)", "ACTOR", "EVENT", "VERSION", "WHAT"]
    assert len(table.lines) == 2 + len(events)
    rows = [cells(line)[1:] for line in table.lines[2:]]
    assert [
        "review-bot",
        "released",
        "2",
        "file://default/src/old.py (moved → file://default/src/new.py)",
    ] in rows
    assert ["billing-agent", "write", "2", 'orders/order-1 = {"status":"paid"}'] in rows
    assert ["cleanup-agent", "delete", "2", "orders/order-2"] in rows
    assert ["editor-agent", "registered", "-", f"as {demo.editor}"] in rows
    assert [
        "gone-agent",
        "lease_ends",
        "-",
        "its claims end as abandoned unless it acts again",
    ] in rows
    assert [demo.reaped, "reaped", "-", f"{demo.reaped} removed after a long idle time"] in rows
    assert table.lines[2][:23] == events[0]["at"][:23].replace("T", " ")


def test_log_limit_shows_the_newest_events(capsys: pytest.CaptureFixture[str], demo: Demo) -> None:
    every = run_cli(capsys, "log", "--limit", "1000", "--json", "--db", demo.db).json()
    last3 = run_cli(capsys, "log", "--limit", "3", "--json", "--db", demo.db).json()
    assert last3 == every[-3:]
    default = run_cli(capsys, "log", "--json", "--db", demo.db).json()
    assert default == every[-inspector.DEFAULT_LIMIT :]


def test_log_namespace_shows_only_state_events_of_that_namespace(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    events = run_cli(capsys, "log", "--namespace", "orders", "--json", "--db", demo.db).json()
    assert [(e["event"], e["key"], e["version"]) for e in events] == [
        ("write", "order-1", 1),
        ("write", "order-1", 2),
        ("write", "order-2", 1),
        ("delete", "order-2", 2),
    ]
    assert events[2]["value"] == LONG_VALUE
    result = run_cli(capsys, "log", "--namespace", "nope", "--db", demo.db)
    assert_one_line_error(result, 1, "no namespace 'nope'")


def test_log_of_claims_released_by_a_lapsed_lease_shows_the_outcome(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    store = StateStore(demo.path)
    coord = Coordinator(store)
    late = coord.register("late-agent").agent_id
    coord.claim("src/ttl.py", late)  # records sleepy's lapse as a release first
    store.close()
    events = run_cli(capsys, "log", "--limit", "3", "--json", "--db", demo.db).json()
    assert [(e["event"], e["actor"], e["outcome"], e["version"]) for e in events] == [
        ("released", "sleepy-agent", "expired", 2),
        ("registered", "late-agent", None, None),
        ("claimed", "late-agent", None, 3),
    ]


# --------------------------------------------------------------------------------------------
# Nothing to show, and errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["agents", "claims", "namespaces", "log"])
def test_an_empty_database_gives_an_empty_table_and_an_empty_list(
    capsys: pytest.CaptureFixture[str], empty_db: str, command: str
) -> None:
    result = run_cli(capsys, command, "--db", empty_db)
    assert result.status == 0 and result.err == ""
    assert len(result.lines) == 2 and set(result.lines[1]) <= {"-", " "}
    result = run_cli(capsys, command, "--json", "--db", empty_db)
    assert (result.status, result.json()) == (0, [])


def test_a_missing_file_is_an_error_and_is_not_created(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for command in (["agents"], ["claims", "--all"], ["keys", "a"], ["log", "--follow"]):
        result = run_cli(capsys, *command, "--db", str(tmp_path / "missing.db"))
        assert_one_line_error(result, 2, "no database at", "never creates")
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_sqlite_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    result = run_cli(capsys, "claims", "--db", str(path))
    assert_one_line_error(result, 2, "is not a SQLite database")
    assert path.read_text() == "hello\n"


def test_a_sqlite_file_of_another_program_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import sqlite3

    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE songs (title TEXT)")
    conn.commit()
    conn.close()
    before = sha256(path)
    result = run_cli(capsys, "namespaces", "--db", str(path))
    assert_one_line_error(result, 1, "not an agenthold database")
    assert sha256(path) == before


def test_a_database_with_a_newer_schema_is_an_error(
    capsys: pytest.CaptureFixture[str], empty_db: str
) -> None:
    import sqlite3

    conn = sqlite3.connect(empty_db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    result = run_cli(capsys, "agents", "--db", empty_db)
    assert_one_line_error(result, 1, "newer than this agenthold supports")


@pytest.mark.parametrize("limit", ["0", "-3", "abc", "1.5", ""])
@pytest.mark.parametrize("command", [["log"], ["history", "orders", "order-1"]])
def test_a_bad_limit_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], demo: Demo, command: list[str], limit: str
) -> None:
    result = run_cli(capsys, *command, "--limit", limit, "--db", demo.db)
    assert_one_line_error(result, 2, "--limit", repr(limit))


def test_a_huge_limit_means_everything(capsys: pytest.CaptureFixture[str], demo: Demo) -> None:
    result = run_cli(capsys, "log", "--limit", str(10**30), "--json", "--db", demo.db)
    assert result.status == 0 and len(result.json()) > inspector.DEFAULT_LIMIT


# --------------------------------------------------------------------------------------------
# Read-only, proven
# --------------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files(directory: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in directory.iterdir()}


EVERY_COMMAND = [
    ["status"],
    ["agents"],
    ["claims"],
    ["claims", "--all"],
    ["namespaces"],
    ["keys", "orders"],
    ["keys", "archive"],
    ["history", "orders", "order-2"],
    ["history", "archive", "old", "--limit", "1"],
    ["log"],
    ["log", "--namespace", "notes"],
    ["keys", "nope"],  # errors must not write either
    ["history", "orders", "nope"],
]


@pytest.mark.parametrize("as_json", [False, True])
def test_no_subcommand_changes_a_byte_of_the_database(
    capsys: pytest.CaptureFixture[str], demo: Demo, as_json: bool
) -> None:
    db, wal = demo.path, Path(f"{demo.path}-wal")
    before = files(demo.path.parent)
    assert set(before) == {db.name}  # the writer closed cleanly: no side files
    for command in EVERY_COMMAND:
        run_cli(capsys, *command, *(["--json"] if as_json else []), "--db", demo.db)
        assert sha256(db) == before[db.name]
        # Reading a WAL database may leave SQLite's side files behind, but never any content:
        # the write-ahead log stays empty and no other file appears.
        assert set(files(demo.path.parent)) <= {db.name, wal.name, f"{db.name}-shm"}
        assert not wal.exists() or wal.stat().st_size == 0


def test_commits_left_in_the_wal_by_a_crashed_writer_are_read_without_writing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "crashed.db"
    crash = (
        "import os, sys\n"
        "from agenthold.store import StateStore\n"
        "store = StateStore(sys.argv[1])\n"
        "for i in range(50):\n"
        "    store.set('ns', f'k{i}', i, updated_by='crasher')\n"
        "os._exit(0)  # no close: the commits stay in the write-ahead log\n"
    )
    subprocess.run([sys.executable, "-c", crash, str(db)], check=True, timeout=60)
    wal = Path(f"{db}-wal")
    assert wal.stat().st_size > 0
    before = (sha256(db), sha256(wal))
    records = run_cli(capsys, "keys", "ns", "--json", "--db", str(db)).json()
    assert [r["value"] for r in records] == sorted(range(50), key=lambda i: f"k{i}")
    assert run_cli(capsys, "log", "--db", str(db)).status == 0
    assert (sha256(db), sha256(wal)) == before  # not even checkpointed


def test_the_inspector_reads_while_another_store_writes(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    writer = StateStore(demo.path)
    writer.set("live", "counter", 0, updated_by="writer")
    stop = threading.Event()
    written: list[int] = []
    failures: list[BaseException] = []

    def write() -> None:
        try:
            version = 1
            while not stop.is_set():
                version = writer.set(
                    "live", "counter", version, updated_by="writer", expected_version=version
                ).version
                written.append(version)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        seen: list[int] = []
        deadline = time.monotonic() + 60  # a bound for a stuck read, not a speed
        while len(seen) < 20 and time.monotonic() < deadline:
            result = run_cli(
                capsys, "history", "live", "counter", "--limit", "1", "--json", "--db", demo.db
            )
            assert result.status == 0, result.err
            seen.append(result.json()[0]["version"])
            assert run_cli(capsys, "log", "--json", "--db", demo.db).status == 0
            assert run_cli(capsys, "claims", "--db", demo.db).status == 0
    finally:
        stop.set()
        thread.join()
        writer.close()
    assert not failures
    assert seen == sorted(seen) and len(seen) == 20
    assert seen[-1] > seen[0]  # it saw the writes as they happened
    assert seen[-1] <= written[-1]


# --------------------------------------------------------------------------------------------
# Tables for people: widths, cuts, unicode, ages
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["keys", "long"], ["history", "orders", "order-2"], ["log", "--namespace", "orders"]],
)
def test_long_values_are_cut_with_an_ellipsis_to_fit_the_terminal(
    capsys: pytest.CaptureFixture[str], demo: Demo, monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:  # fmt: skip
    with StateStore(demo.db) as store:  # a live long value for `keys`
        store.set("long", "big", LONG_VALUE, updated_by="writer")
    monkeypatch.setenv("COLUMNS", "80")
    result = run_cli(capsys, *command, "--db", demo.db)
    assert result.status == 0
    assert all(tables.text_width(line) <= 80 for line in result.lines)
    assert any(line.endswith("xxx…") for line in result.lines)


def test_json_output_is_never_cut(
    capsys: pytest.CaptureFixture[str], demo: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    records = run_cli(capsys, "history", "orders", "order-2", "--json", "--db", demo.db).json()
    assert records[1]["value"] == LONG_VALUE


def test_a_narrow_terminal_cuts_the_least_useful_column_first(
    capsys: pytest.CaptureFixture[str], demo: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "70")
    result = run_cli(capsys, "claims", "--all", "--db", demo.db)
    assert all(tables.text_width(line) <= 70 for line in result.lines)
    moved = next(line for line in result.lines if "src/old.py" in line)
    resource, state = cells(moved)[:2]
    assert resource == "file://default/src/old.py"  # the resource is whole
    assert state.startswith("free (moved") and state.endswith("…")  # the state was cut instead


def test_wide_characters_keep_columns_aligned(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    store = StateStore(demo.path)
    store.set("notes", "abc", "plain", updated_by="translator")
    store.close()
    result = run_cli(capsys, "keys", "notes", "--db", demo.db)
    rows = result.lines[2:]
    assert len(rows) == 2
    # The VERSION column ends at the same terminal cell on both rows, although "日本語"
    # is 3 characters and 6 cells wide.
    ends = {tables.text_width(line[: line.index("1") + 1]) for line in rows}
    assert len(ends) == 1
    assert "héllo → ✓ 日本語" in result.out


def test_control_characters_in_values_are_shown_as_escapes(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    store = StateStore(demo.path)
    store.set("notes", "evil", "red\x1b[31m and \x9b2J", updated_by="prankster")
    store.close()
    result = run_cli(capsys, "keys", "notes", "--db", demo.db)
    assert "\x1b" not in result.out and "\x9b" not in result.out
    assert "\\u001b[31m and \\x9b2J" in result.out
    records = run_cli(capsys, "keys", "notes", "--json", "--db", demo.db).json()
    assert any(r["value"] == "red\x1b[31m and \x9b2J" for r in records)


def test_unprintable_characters_in_every_table_are_shown_as_escapes(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    """Names written before agenthold refused invisible characters, or by another tool, and
    the joiners it still accepts, are escaped in every table: none can reorder a line."""
    import sqlite3

    store = StateStore(demo.path)
    store.set("n\u200dotes", "k\u00ad", "v", updated_by="w\u200c")
    Coordinator(store).claim("custom://a-b", demo.editor)
    store.close()
    conn = sqlite3.connect(demo.path)
    conn.execute("UPDATE claims SET uri = 'custom://a\u2028b' WHERE uri = 'custom://a-b'")
    conn.execute("UPDATE agents SET name = 'evil\u202egnp.exe' WHERE agent_id = ?", (demo.editor,))
    conn.commit()
    conn.close()
    outputs = {
        argv: run_cli(capsys, *argv, "--db", demo.db).out
        for argv in [
            ("agents",),
            ("claims",),
            ("namespaces",),
            ("keys", "n\u200dotes"),
            ("history", "n\u200dotes", "k\u00ad"),
            ("log", "--limit", "100"),
        ]
    }
    for argv, out in outputs.items():
        assert out.isprintable() or all(line.isprintable() for line in out.splitlines()), argv
    assert "evil\\u202egnp.exe" in outputs[("agents",)]
    assert "custom://a\\u2028b" in outputs[("claims",)]
    assert "n\\u200dotes" in outputs[("namespaces",)]
    assert "k\\xad" in outputs[("keys", "n\u200dotes")]
    assert "w\\u200c" in outputs[("history", "n\u200dotes", "k\u00ad")]
    assert "evil\\u202egnp.exe" in outputs[("log", "--limit", "100")]


def test_a_terminal_too_narrow_for_any_table_still_gets_every_row(
    capsys: pytest.CaptureFixture[str], demo: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    result = run_cli(capsys, "claims", "--all", "--db", demo.db)
    assert result.status == 0
    assert len(result.lines) == 2 + 8
    assert all(line.split()[0].startswith(("custom://", "file://d")) for line in result.lines[2:])


def test_an_event_kind_unknown_to_this_version_is_still_logged(
    capsys: pytest.CaptureFixture[str], demo: Demo
) -> None:
    import sqlite3

    conn = sqlite3.connect(demo.path)  # as a later agenthold might write it
    conn.execute(
        "INSERT INTO claim_events (at, agent_id, event, resource, uri, version) "
        "VALUES ('2999-01-01T00:00:00.000000+00:00', ?, 'handed_over', 'k', 'custom://x', 7)",
        (demo.editor,),
    )
    conn.commit()
    conn.close()
    result = run_cli(capsys, "log", "--limit", "1", "--db", demo.db)
    assert cells(result.lines[2]) == [
        "2999-01-01 00:00:00.000", "editor-agent", "handed_over", "7", "custom://x",
    ]  # fmt: skip


def test_text_is_cut_by_terminal_cells_not_characters() -> None:
    assert tables.cut("日本語テキスト", 7) == "日本語…"
    assert tables.text_width(tables.cut("日本語テキスト", 7)) == 7
    assert tables.cut("short", 5) == "short"
    assert tables.cut("e\u0301e\u0301e\u0301", 3) == "e\u0301e\u0301e\u0301"  # combining
    assert tables.cut("abc", 0) == ""


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (59.9, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h"), (86_399, "23h"),
     (86_400, "1d"), (10 * 86_400, "10d")],
)  # fmt: skip
def test_durations_are_shown_in_the_largest_whole_unit(seconds: float, shown: str) -> None:
    assert tables.span(seconds) == shown


def test_ages_are_relative_to_now() -> None:
    from agenthold.store import utc_iso

    now = time.time()
    assert tables.age(utc_iso(now - 2.5), now) == "2s ago"
    assert tables.age(utc_iso(now - 300.5), now) == "5m ago"
    assert tables.age(utc_iso(now + 5.5), now) == "in 5s"  # another machine's clock is ahead
    assert tables.age(None, now) == "-"
    assert tables.age("yesterday", now) == "yesterday"  # not written by agenthold: as is
    assert tables.clock("2026-05-09T07:35:25.123456+00:00") == "2026-05-09 07:35:25.123"
    assert tables.clock("yesterday") == "yesterday"


# --------------------------------------------------------------------------------------------
# Subprocesses: log --follow, start-up imports, terminals
# --------------------------------------------------------------------------------------------

WRITER = """
import sys
from agenthold.claims import Coordinator
from agenthold.store import StateStore

store = StateStore(sys.argv[1])
coord = Coordinator(store)
agent = coord.register("late-agent", "m").agent_id
coord.claim("src/late.py", agent)
store.set(sys.argv[2], "late-key", {"n": 1}, updated_by="late-agent")
coord.release("src/late.py", agent, "created")
store.close()
"""


def write_from_another_process(db: str, namespace: str = "orders") -> None:
    subprocess.run([sys.executable, "-c", WRITER, db, namespace], check=True, timeout=60)


def _default_sigint() -> None:  # pragma: no cover - runs in the child
    # A shell starts background jobs with SIGINT ignored; a person's terminal does not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Agenthold(LineProcess):
    """``python -m agenthold ARGS`` running as a child process, its output read line by line."""

    def __init__(self, *argv: str, env: dict[str, str] | None = None) -> None:
        super().__init__(
            [sys.executable, "-m", "agenthold", *argv],
            stderr=subprocess.PIPE,
            encoding="utf-8",
            cwd=REPO,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
            preexec_fn=_default_sigint if os.name == "posix" else None,
        )
        self.seen: list[str] = []

    def wait_for(self, done: Callable[[list[str]], bool], timeout: float = 20.0) -> list[str]:
        """Collect lines until ``done(lines so far)``; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not done(self.seen):
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"timed out; output so far: {self.seen}") from None
            if line is None:
                raise AssertionError(f"the process ended; output: {self.seen} {self.stop()}")
            self.seen.append(line)
        return self.seen

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        status = self.proc.wait(timeout=20)
        assert self.proc.stderr is not None
        return status, self.proc.stderr.read()


@pytest.fixture
def follow_runs() -> Iterator[list[Agenthold]]:
    runs: list[Agenthold] = []
    yield runs
    for run in runs:
        if run.proc.poll() is None:  # pragma: no cover - only when a test failed
            run.proc.kill()
            run.proc.wait()


@posix_only
def test_log_follow_prints_writes_of_another_process_until_ctrl_c(
    demo: Demo, follow_runs: list[Agenthold]
) -> None:
    run = Agenthold("log", "--follow", "--limit", "2", "--db", demo.db)
    follow_runs.append(run)
    run.wait_for(lambda lines: len(lines) >= 4)  # header, rule and the last two events
    assert run.seen[0].split()[:3] == ["TIME", "(UTC)", "ACTOR"]
    write_from_another_process(demo.db)
    lines = run.wait_for(lambda lines: any("(created)" in line for line in lines))
    new = [line.split()[2:5] for line in lines[4:]]
    assert new == [
        ["late-agent", "registered", "-"],
        ["late-agent", "claimed", "1"],
        ["late-agent", "write", "1"],
        ["late-agent", "released", "2"],
    ]
    assert 'orders/late-key = {"n":1}' in lines[6]
    status, err = run.stop(signal.SIGINT)
    assert (status, err) == (0, "")


@posix_only
def test_log_follow_json_prints_json_lines_and_stops_on_sigterm(
    demo: Demo, follow_runs: list[Agenthold]
) -> None:
    run = Agenthold("--db", demo.db, "log", "--follow", "--json", "--limit", "1")
    follow_runs.append(run)
    run.wait_for(lambda lines: len(lines) >= 1)
    write_from_another_process(demo.db)
    lines = run.wait_for(lambda lines: len(lines) >= 5)
    events = [json.loads(line) for line in lines]
    assert all(set(e) == EVENT_KEYS for e in events)
    assert [e["event"] for e in events[1:]] == ["registered", "claimed", "write", "released"]
    assert events[4]["outcome"] == "created"
    status, err = run.stop(signal.SIGTERM)
    assert (status, err) == (0, "")


@posix_only
def test_log_follow_namespace_shows_only_that_namespace(
    demo: Demo, follow_runs: list[Agenthold]
) -> None:
    run = Agenthold("log", "-f", "--namespace", "fresh", "--json", "--db", demo.db)
    follow_runs.append(run)
    time.sleep(0.3)  # let it start; a namespace not written yet is fine when following
    write_from_another_process(demo.db, "elsewhere")
    write_from_another_process(demo.db, "fresh")
    lines = run.wait_for(lambda lines: len(lines) >= 1)
    event = json.loads(lines[0])
    assert (event["event"], event["namespace"], event["key"]) == ("write", "fresh", "late-key")
    status, err = run.stop()
    assert (status, err, run.seen) == (0, "", lines[:1])


@posix_only
def test_log_follow_stops_quietly_when_its_reader_goes_away(demo: Demo) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthold", "log", "-f", "--limit", "1", "--db", demo.db],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None
    for _ in range(3):
        assert proc.stdout.readline()
    proc.stdout.close()  # like `agenthold log -f | head -3`
    write_from_another_process(demo.db)
    try:
        status = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:  # pragma: no cover - only when the test failed
            proc.kill()
    assert (status, proc.stderr.read()) == (0, b"")


def test_no_inspector_subcommand_imports_mcp(demo: Demo) -> None:
    script = (
        "import sys\n"
        "from agenthold.cli.main import main\n"
        f"db = {demo.db!r}\n"
        "commands = [['agents'], ['claims', '--all'], ['namespaces'], ['keys', 'orders'],\n"
        "            ['history', 'orders', 'order-1'], ['log'], ['--help']]\n"
        "for command in commands:\n"
        "    try:\n"
        "        main([*command, '--db', db, '--json'] if command != ['--help'] else command)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "loaded = sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.'))\n"
        "print('MCP MODULES:', loaded, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "MCP MODULES: []" in done.stderr


def test_an_ascii_only_terminal_gets_escapes_instead_of_a_crash(demo: Demo) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agenthold", "claims", "--all", "--db", demo.db],
        capture_output=True,
        cwd=REPO,
        env={**os.environ, "PYTHONIOENCODING": "ascii", "COLUMNS": "200"},
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, b"")
    assert b"free (moved \\u2192 file://default/src/new.py)" in done.stdout


def test_json_before_the_subcommand_means_the_same_as_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    with StateStore(db) as store:
        store.set("ns", "k", 1, updated_by="w")
    assert main(["--json", "namespaces", "--db", str(db)]) == 0
    assert [row["namespace"] for row in json.loads(capsys.readouterr().out)] == ["ns"]
