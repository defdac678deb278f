"""The inspector on the message bus: ``agenthold threads``, ``agenthold messages THREAD_ID`` and
message appends in ``agenthold log`` (and ``log --follow``), read-only like every subcommand.

The databases are made by the real MessageBus; commands run through agenthold.cli.main (and, for
``--follow``, as a real child process).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import REPO, LineProcess, child_env
from support import run_cli as run

from agenthold.messages import MessageBus
from agenthold.store import StateStore

posix_only = pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")
THREAD_KEYS = {
    "name",
    "created_by",
    "thread_id",
    "participants",
    "message_count",
    "last_seq",
    "created_at",
    "last_activity_at",
}
MESSAGE_KEYS = {"seq", "sender", "sender_id", "content", "created_at"}


@pytest.fixture(autouse=True)
def terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def chat(db_url: str) -> tuple[str, str, str]:
    """A database with two threads (one of 1,500 messages) and a store write: a SQLite file,
    or (``backends`` tests) also a PostgreSQL schema."""
    db = db_url
    with MessageBus(db) as bus:
        long = bus.create_thread_by_names(["lead", "worker-2"]).id
        with bus.db.write() as (conn, _):
            conn.executemany(
                "INSERT INTO msg_messages (thread_id, seq, sender_id, sender_name, content, "
                "created_at) VALUES (?, ?, 'x', 'worker-2', ?, '2026-01-01T00:00:00+00:00')",
                [(long, n, f"m{n}") for n in range(1, 1501)],
            )
            conn.execute("UPDATE msg_threads SET last_seq = 1500 WHERE thread_id = ?", (long,))
        review = bus.create_thread_by_names(
            ["lead", "worker-1", "worker-2"], name="review", principal="ci-bot"
        ).id
        bus.append(review, "lead", "Please review src/app.py\nline 40 especially")
        bus.append(review, "worker-1", "On it")
    with StateStore(db) as store:
        store.set("ns", "k", 1, updated_by="writer")
    return db, review, long


def files_of(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


@pytest.mark.backends
def test_threads_lists_participants_counts_and_activity(
    capsys: pytest.CaptureFixture[str], chat: Any
) -> None:
    db, review, long = chat
    status, out, _ = run(capsys, "threads", "--db", db)
    assert status == 0
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "THREAD", "NAME", "CREATED BY", "PARTICIPANTS", "MESSAGES", "LAST ACTIVITY"
    ]  # fmt: skip
    row = next(line for line in lines if line.startswith(review))
    assert re.split(r"\s{2,}", row) == [
        review, "review", "ci-bot", "lead, worker-1, worker-2", "2", "0s ago"
    ]  # fmt: skip
    unnamed = next(line for line in lines if line.startswith(long))
    assert re.split(r"\s{2,}", unnamed)[1:3] == ["-", "-"]  # no name, a trusted creator
    assert any(line.startswith(long) and " 1500 " in line for line in lines)
    status, out, _ = run(capsys, "threads", "--json", "--db", db)
    records = json.loads(out)
    assert status == 0 and [r["thread_id"] for r in records] == [long, review]
    assert all(set(r) == THREAD_KEYS for r in records)
    assert records[1]["participants"] == ["lead", "worker-1", "worker-2"]
    assert (records[1]["name"], records[1]["created_by"]) == ("review", "ci-bot")
    assert (records[0]["name"], records[0]["created_by"]) == (None, None)
    assert (records[0]["message_count"], records[0]["last_seq"]) == (1500, 1500)


@pytest.mark.backends
def test_messages_shows_a_thread_in_order_with_after_and_limit(
    capsys: pytest.CaptureFixture[str], chat: Any
) -> None:
    db, review, long = chat
    status, out, _ = run(capsys, "messages", review, "--db", db)
    lines = out.splitlines()
    assert status == 0 and lines[0].split() == ["SEQ", "SENDER", "SENT", "CONTENT"]
    assert re.split(r"\s{2,}", lines[2].strip())[:2] == ["1", "lead"]
    assert "src/app.py\\x0aline 40" in lines[2]  # a newline cannot break the table
    status, out, _ = run(capsys, "messages", review, "--after", "1", "--json", "--db", db)
    [only] = json.loads(out)
    assert set(only) == MESSAGE_KEYS and (only["seq"], only["sender"]) == (2, "worker-1")
    status, out, _ = run(capsys, "messages", long, "--json", "--db", db)
    assert [m["seq"] for m in json.loads(out)] == list(range(1, 21))  # the default limit
    status, out, _ = run(capsys, "messages", long, "--after", "100", "--limit", "1200", "--json")
    assert status == 1  # no --db: the default database does not exist here
    status, out, _ = run(
        capsys, "messages", long, "--after", "100", "--limit", "1200", "--json", "--db", db
    )
    assert [m["seq"] for m in json.loads(out)] == list(range(101, 1301))  # across pages
    status, out, _ = run(capsys, "messages", long, "--after", "1500", "--json", "--db", db)
    assert (status, json.loads(out)) == (0, [])


@pytest.mark.parametrize(
    ("argv", "status", "fragment"),
    [
        (["messages", "not-a-uuid"], 2, "THREAD_ID: thread_id must be a UUID"),
        (["messages", "123e4567-e89b-12d3-a456-426614174000"], 1, "agenthold threads"),
        (["messages", "123e4567-e89b-12d3-a456-426614174000", "--after", "-1"], 2, "0 or more"),
        (["messages", "123e4567-e89b-12d3-a456-426614174000", "--after", "x"], 2, "whole"),
        (["messages", "123e4567-e89b-12d3-a456-426614174000", "--limit", "0"], 2, "1 or more"),
    ],
)
def test_bad_message_arguments_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], chat: Any, argv: list[str], status: int, fragment: str
) -> None:
    got, out, err = run(capsys, *argv, "--db", chat[0])
    assert (got, out) == (status, "")
    assert err.startswith("agenthold: ") and err.count("\n") == 1 and fragment in err


def test_a_database_without_the_bus_has_no_threads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "plain.db"
    StateStore(db).close()
    before = files_of(tmp_path)["plain.db"]
    assert run(capsys, "threads", "--json", "--db", str(db))[:2] == (0, "[]\n")
    status, _, err = run(
        capsys, "messages", "123e4567-e89b-12d3-a456-426614174000", "--db", str(db)
    )
    assert status == 1 and "no thread" in err
    status, out, _ = run(capsys, "log", "--json", "--db", str(db))
    assert (status, json.loads(out)) == (0, [])
    assert files_of(tmp_path)["plain.db"] == before  # no bus tables added (-wal, -shm aside)
    names = StateStore(db, read_only=True)
    assert names.db.fetchone("SELECT count(*) FROM sqlite_master WHERE name LIKE 'msg%'")[0] == 0
    names.close()


def test_the_bus_commands_never_change_the_database(
    capsys: pytest.CaptureFixture[str], chat: Any, tmp_path: Path
) -> None:
    db, review, _ = chat
    run(capsys, "threads", "--db", db)  # the first read may create the -wal and -shm files
    before = files_of(tmp_path)
    for argv in (["threads"], ["messages", review], ["log"], ["messages", review, "--json"]):
        assert run(capsys, *argv, "--db", db)[0] == 0
    assert files_of(tmp_path) == before


@pytest.mark.backends
def test_log_shows_appends_beside_writes(capsys: pytest.CaptureFixture[str], chat: Any) -> None:
    db, review, _ = chat
    status, out, _ = run(capsys, "log", "--limit", "50", "--db", db)
    assert status == 0
    appended = [line for line in out.splitlines() if " appended " in line]
    assert any(f"thread {review[:8]}: On it" in line and "worker-1" in line for line in appended)
    status, out, _ = run(capsys, "log", "--limit", "3", "--json", "--db", db)
    events = json.loads(out)
    assert [e["event"] for e in events] == ["appended", "appended", "write"]
    first = events[0]
    assert (first["actor"], first["version"], first["value"], first["thread_id"]) == (
        "lead",
        1,
        "Please review src/app.py\nline 40 especially",
        review,
    )
    status, out, _ = run(capsys, "log", "--namespace", "ns", "--json", "--db", db)
    assert [e["event"] for e in json.loads(out)] == ["write"]  # a namespace has no appends


def _default_sigint() -> None:  # pragma: no cover - runs in the child
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # even if this suite's shell ignores it


@posix_only
@pytest.mark.backends
def test_log_follow_shows_an_append_by_another_process(chat: Any) -> None:
    db, review, _ = chat
    follow = LineProcess(
        [sys.executable, "-m", "agenthold", "log", "-f", "--json", "--limit", "1", "--db", db],
        env={**child_env(), "COLUMNS": "200"},
        stderr=subprocess.PIPE,
        encoding="utf-8",
        cwd=REPO,
        preexec_fn=_default_sigint,  # the test sends SIGINT: as a terminal would start it
    )
    try:
        assert json.loads(follow.next_line())["event"] == "write"
        appender = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from agenthold.bus.messagebus import MessageBus; "
                "MessageBus(sys.argv[1]).append(sys.argv[2], 'worker-2', 'late news')",
                db,
                review,
            ],
            env=child_env(),
            timeout=60,
            check=True,
        )
        assert appender.returncode == 0
        event = json.loads(follow.next_line(20))
        assert (event["event"], event["actor"], event["value"], event["version"]) == (
            "appended",
            "worker-2",
            "late news",
            3,
        )
        follow.proc.send_signal(signal.SIGINT)
        assert follow.proc.wait(timeout=20) == 0
    finally:
        follow.kill()
