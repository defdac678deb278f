"""``agenthold status`` (agenthold/overview.py), on SQLite and PostgreSQL, through the real
command line: every database is made by the real StateStore, Coordinator and MessageBus; the
status is read in-process by ``agenthold.cli.main`` and, for the import check, in a child."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest
from support import REPO, child_env
from support import run_cli as run

from agenthold.claims import Coordinator
from agenthold.inspect.status import SHOWN
from agenthold.messages import MessageBus
from agenthold.store import StateStore


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")


def populate(db: str) -> dict[str, Any]:
    """Agents (one with a lease that ended), exclusive and shared claims, a wait queued to
    claim, a wait that gave up long ago (its row left in line), writes, and a thread where one
    participant has unread messages, all through the library."""
    with StateStore(db) as store:
        coord = Coordinator(store)
        editor = coord.register("editor", "model-x", principal="(shared token)").agent_id
        reviewer = coord.register("reviewer").agent_id
        gone = coord.register("gone").agent_id
        coord.claim("custom://chapter-1", editor)
        coord.claim("custom://spec", reviewer, mode="shared")
        coord.claim("custom://old", gone)
        coord.claim("custom://spec", gone, mode="shared")  # a share ends with its lease too
        coord.end_lease(gone, 0.0)
        waiter = coord.register("waiter").agent_id
        line = coord.queue_look(coord.target("custom://chapter-1"), waiter, "exclusive", None, 600)
        assert line.in_line
        store.set("orders", "o-1", {"n": 1}, updated_by="editor")
        bus = MessageBus(store)
        thread = bus.create_thread_by_names(["lead", "worker"], name="review").id
        bus.append(thread, "lead", "please look")
        bus.append(thread, "lead", "and this")
        bus.mark_read(thread, "lead", 2)
        quiet = bus.create_thread_by_names(["lead", "worker"], name="read").id
        bus.append(quiet, "lead", "read by all")
        bus.mark_read(quiet, "worker", 1)
        bus.mark_read(quiet, "lead", 1)
    time.sleep(0.01)  # gone's lease (ended at once) is in the past by the database clock
    return {
        "editor": editor,
        "reviewer": reviewer,
        "gone": gone,
        "waiter": waiter,
        "thread": thread,
    }


@pytest.mark.backends
def test_status_shows_database_agents_claims_queue_events_and_unread(
    capsys: pytest.CaptureFixture[str], db_url: str, backend: str
) -> None:
    made = populate(db_url)
    status, out, err = run(capsys, "status", "--db", db_url)
    assert (status, err) == (0, "")
    text = out.splitlines()
    assert text[0].startswith("database: ") and f"({backend}" in text[0]
    assert "agents: 3 with a live lease, of 4 registered" in out
    assert any("editor (shared token)" in line and made["editor"] in line for line in text)
    assert "gone" not in [line.split()[0] for line in text if line.startswith("  ")]
    assert "claims: 2 held" in out
    assert any("custom://chapter-1" in line and "exclusive" in line for line in text)
    assert any("custom://spec" in line and "shared" in line for line in text)
    assert "custom://old" not in out.split("latest events")[0]  # its holder's lease ended
    assert "queue: 1 waiting to claim" in out
    assert any(line.split()[:3] == ["custom://chapter-1", "exclusive", "waiter"] for line in text)
    assert "latest events: " in out and "orders/o-1" in out
    assert "threads with unread messages: 1" in out
    assert any(made["thread"] in line and "worker 2" in line for line in text)
    assert all(len(line) <= 120 for line in text[1:]), out  # the path is shown whole

    status, out, _ = run(capsys, "status", "--json", "--db", db_url)
    record = json.loads(out)
    assert status == 0
    assert set(record) == {
        "database",
        "agents",
        "claims",
        "queue",
        "events",
        "threads",
        "retention",
    }
    assert record["database"]["backend"] == backend
    assert (record["database"]["size_bytes"] is None) == (backend == "postgresql")
    assert (record["agents"]["registered"], record["agents"]["live"]) == (4, 3)
    assert {a["name"] for a in record["agents"]["shown"]} == {"editor", "reviewer", "waiter"}
    held = {(c["resource"], c["mode"], c["agent_name"]) for c in record["claims"]["shown"]}
    assert held == {
        ("custom://chapter-1", "exclusive", "editor"),
        ("custom://spec", "shared", "reviewer"),
    }
    [queued] = record["queue"]["shown"]
    assert (queued["resource"], queued["agent_id"]) == ("custom://chapter-1", made["waiter"])
    assert record["events"][-1]["event"] == "appended"
    assert len(record["events"]) == SHOWN
    [thread] = record["threads"]["shown"]
    assert (thread["name"], thread["message_count"], thread["unread"]) == (
        "review",
        2,
        {"worker": 2},
    )


@pytest.mark.backends
def test_status_of_an_empty_database_says_so(
    capsys: pytest.CaptureFixture[str], db_url: str
) -> None:
    StateStore(db_url).close()
    status, out, err = run(capsys, "status", "--db", db_url)
    assert (status, err) == (0, "")
    assert "agents: 0 with a live lease, of 0 registered" in out
    assert "claims: 0 held" in out and "queue:" not in out
    assert "latest events: none yet" in out
    assert "threads with unread messages: 0" in out


@pytest.mark.backends
def test_each_section_shows_its_first_rows_and_says_how_many_more(
    capsys: pytest.CaptureFixture[str], db_url: str
) -> None:
    with StateStore(db_url) as store:
        coord = Coordinator(store)
        for n in range(SHOWN + 3):
            agent = coord.register(f"agent-{n}").agent_id
            coord.claim(f"custom://r{n}", agent)
    status, out, _ = run(capsys, "status", "--db", db_url)
    assert status == 0
    assert out.count("... and 3 more") == 2  # agents and claims
    assert "'agenthold agents' lists them all" in out
    assert "'agenthold claims' lists them all" in out
    record = json.loads(run(capsys, "status", "--json", "--db", db_url)[1])
    assert record["claims"]["held"] == SHOWN + 3 and len(record["claims"]["shown"]) == SHOWN


@pytest.mark.backends
def test_status_never_writes_not_even_to_drop_a_dead_wait(
    capsys: pytest.CaptureFixture[str], db_url: str
) -> None:
    """A wait no longer alive (its waiter stopped looking, and the place a timeout keeps has
    ended) is left in the table until a writer meets it (claim_queue.waiting deletes such rows):
    status reads past it and leaves it there."""
    with StateStore(db_url) as store:
        coord = Coordinator(store)
        coord.waiter_liveness = 0.01  # the place a timed-out wait keeps ends at once
        holder, late = coord.register("holder").agent_id, coord.register("late").agent_id
        coord.claim("custom://x", holder)
        coord.queue_look(coord.target("custom://x"), late, "exclusive", None, 0.0)
    time.sleep(0.05)
    status, out, _ = run(capsys, "status", "--db", db_url)
    assert status == 0 and "queue:" not in out  # not waiting any more
    with StateStore(db_url) as store:
        assert store.db.fetchall("SELECT seq FROM claim_waiters") != []  # still there


@pytest.mark.backends
def test_status_never_imports_mcp(db_url: str) -> None:
    populate(db_url)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from agenthold.cli.main import main; status = main(sys.argv[1:]); "
            "print('mcp' in sys.modules); sys.exit(status)",
            "status",
            "--db",
            db_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False"


def test_the_size_of_a_database_file_is_shown_in_the_largest_whole_unit() -> None:
    from agenthold.inspect.status import _size

    shown = [_size(n) for n in (None, 512, 55_296, 5 * 2**20, 3 * 2**30, 2**42)]
    assert shown == ["", ", 512 bytes", ", 54.0 KiB", ", 5.0 MiB", ", 3.0 GiB", ", 4096.0 GiB"]


def test_help_points_at_status_first(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--help")
    assert status == 0
    assert "Start with 'agenthold status'" in out
    listed = out.split("inspecting a database (read-only):")[1].splitlines()
    assert listed[1].strip() == "COMMAND" and listed[2].split()[0] == "status"  # listed first


@pytest.mark.backends
def test_status_shows_the_retention_rules_that_bound_something(
    capsys: pytest.CaptureFixture[str], db_url: str
) -> None:
    populate(db_url)
    status, out, _ = run(capsys, "status", "--db", db_url)
    assert status == 0 and "retention: everything is kept" in out
    assert run(capsys, "retention", "set", "history.versions=100", "--db", db_url)[0] == 0
    assert run(capsys, "retention", "set", "--namespace", "orders", "history.age=7d",
               "--db", db_url)[0] == 0  # fmt: skip
    status, out, _ = run(capsys, "status", "--db", db_url)
    line = next(x for x in out.splitlines() if x.startswith("retention:"))
    assert "history.versions=100" in line and "history.age=1w (namespace orders)" in line
    status, out, _ = run(capsys, "status", "--json", "--db", db_url)
    rules = {
        (r["scope"], r["name"], r["setting"], r["value"]) for r in json.loads(out)["retention"]
    }
    assert rules == {
        ("database", "", "history.versions", "100"),
        ("namespace", "orders", "history.age", "1w"),
    }
