"""Leases end even when a client leaves while the database refuses writes.

A server ends its agents' leases when their client leaves. Here the database is held locked by
another real process (SQLite: BEGIN EXCLUSIVE; PostgreSQL: LOCK TABLE agents) while that
happens: the server retries, records the lease ends beside the database (pending.py), and the
next server to start writes them, so the claims come free after the disconnect grace instead
of never. Nothing of ours is mocked: real stdio server processes, real locks.

These servers serve their calls themselves (no ``stdio_path``): what is tested is a process's
exit and the next process's start, and a session of a warm server ends without either.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import StdioPipes, agenthold_args

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.claims.pending import apply_pending, clock, defer, pending_path
from agenthold.serve.app import EXIT_PATIENCE, Agenthold, exit_patience
from agenthold.store import StateStore

pytestmark = pytest.mark.anyio

HOLD_EXCLUSIVE = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@contextlib.contextmanager
def exclusive_lock(db: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``BEGIN EXCLUSIVE`` on ``db`` until the block ends (or until
    it is sent a line)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_EXCLUSIVE, str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        with contextlib.suppress(OSError):
            holder.stdin.write("done\n")
            holder.stdin.close()
        holder.wait(10)


class Server:
    def __init__(self, tmp_path: Path, db: Path, *flags: str) -> None:
        argv = agenthold_args(db, tmp_path, "--disconnect-grace", "1", *flags)
        self.pipes = StdioPipes([sys.executable, *argv], tmp_path)
        self.pipes.handshake("lease-test")

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = self.pipes.request("tools/call", {"name": tool, "arguments": arguments})
        reply: dict[str, Any] = json.loads(result["content"][0]["text"])
        return reply


def holder_of(db: Path, tmp_path: Path, resource: str) -> str | None:
    with StateStore(db) as store:
        coordinator = Coordinator(store, resolver=Resolver([Workspace("default", str(tmp_path))]))
        status = coordinator.status(resource)
        return status.holder.agent_id if status.holder is not None else None


def claimed_by_a_server(tmp_path: Path, db: Path) -> tuple[Server, str]:
    server = Server(tmp_path, db, "--busy-timeout", "0.2")
    agent = server.call("agenthold_register", name="leaver")["agent_id"]
    assert server.call("agenthold_claim", agent_id=agent, resource="a.txt")["status"] == "claimed"
    return server, agent


def test_a_lease_end_refused_at_exit_is_written_by_the_next_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTHOLD_EXIT_PATIENCE", "1")
    db = tmp_path / "agenthold.db"
    server, agent = claimed_by_a_server(tmp_path, db)
    with exclusive_lock(db):
        started = time.monotonic()
        status, err = server.pipes.close()  # the client leaves while the database is locked
        assert status == 0, err
        assert time.monotonic() - started < 15  # patience, not forever
    assert "could not end the leases of" in err and "the next server to start applies" in err
    assert "gave up ending the leases" in err
    pending = Path(f"{db}-disconnects")
    assert [json.loads(line)["agent_id"] for line in pending.read_text().splitlines()] == [agent]
    assert holder_of(db, tmp_path, "a.txt") == agent  # nothing wrote the lease end yet
    nxt = Server(tmp_path, db)  # the next server writes it as it starts
    try:
        deadline = time.monotonic() + 15
        while holder_of(db, tmp_path, "a.txt") is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert holder_of(db, tmp_path, "a.txt") is None  # free, one grace after it left
        assert not pending.exists()
        other = nxt.call("agenthold_register", name="next")["agent_id"]
        assert nxt.call("agenthold_claim", agent_id=other, resource="a.txt")["status"] == "claimed"
    finally:
        nxt.pipes.close()


def test_a_lease_end_refused_at_exit_is_retried_until_the_lock_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTHOLD_EXIT_PATIENCE", "20")
    db = tmp_path / "agenthold.db"
    server, agent = claimed_by_a_server(tmp_path, db)
    with exclusive_lock(db) as holder:
        assert server.pipes.proc.stdin is not None
        server.pipes.proc.stdin.close()  # the client leaves while the database is locked
        time.sleep(1.0)
        assert server.pipes.proc.poll() is None  # still retrying
        assert holder.stdin is not None
        holder.stdin.write("done\n")  # the lock goes
        holder.stdin.flush()
        status, err = server.pipes.close()
    assert status == 0 and "gave up" not in err, err
    deadline = time.monotonic() + 10
    while holder_of(db, tmp_path, "a.txt") is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert holder_of(db, tmp_path, "a.txt") is None  # its own retry ended the lease
    assert holder_of(db, tmp_path, "a.txt") != agent


@pytest.mark.backends
async def test_lease_ends_the_database_refuses_are_kept_and_applied_later(
    backend: str, db_url: str, tmp_path: Path
) -> None:
    with StateStore(db_url, busy_timeout=0.2) as store:
        coordinator = Coordinator(store, resolver=Resolver([Workspace("d", str(tmp_path))]))
        agent = coordinator.register("leaver").agent_id
        assert coordinator.claim("a.txt", agent).status == "claimed"
        app = Agenthold(coordinator, disconnect_grace=0.3)
        app.exit_patience = 0.3
        with _locked(backend, db_url):
            await app.end_leases([agent])
        path = pending_path(store.db)
        assert path is not None and os.path.exists(path)
        assert coordinator.status("a.txt").status == "claimed"  # not yet
        assert apply_pending(coordinator) == 1 and not os.path.exists(path)
        time.sleep(0.4)
        assert coordinator.status("a.txt").status == "available"
        # An agent that came back after it left keeps its lease: the old record is left alone.
        again = coordinator.register("back").agent_id
        coordinator.claim("b.txt", again)
        with _locked(backend, db_url):
            await app.end_leases([again])
        time.sleep(1.1)  # last_seen_at is rewritten at most once a second
        coordinator.claim("c.txt", again)  # a call: it is back
        assert apply_pending(coordinator) == 0
        time.sleep(0.4)
        assert coordinator.status("b.txt").status == "claimed"


@contextlib.contextmanager
def _locked(backend: str, db_url: str) -> Iterator[None]:
    if backend == "postgresql":
        import psycopg

        with psycopg.connect(db_url) as conn:
            conn.execute("LOCK TABLE agents IN ACCESS EXCLUSIVE MODE")
            yield
            conn.rollback()
    else:
        with exclusive_lock(Path(db_url)):
            yield


def test_the_patience_comes_from_the_environment_within_bounds() -> None:
    assert exit_patience("2.5") == 2.5 and exit_patience("0") == 0
    assert exit_patience(None) == exit_patience("soon") == exit_patience("-1") == EXIT_PATIENCE
    assert exit_patience("1e9") == EXIT_PATIENCE


def test_a_torn_or_foreign_line_in_the_side_file_is_skipped(tmp_path: Path) -> None:
    with StateStore(tmp_path / "s.db") as store:
        coordinator = Coordinator(store, resolver=Resolver([Workspace("d", str(tmp_path))]))
        path = pending_path(store.db)
        assert path is not None
        Path(path).write_text('{"agent_id": "agent-00", "left_at": 1}\nnot json\n[1]\n')
        assert apply_pending(coordinator) == 0 and not os.path.exists(path)
        gone = {"agent_id": "agent-0123456789abcdef", "left_at": 1.0, "ends_at": 2.0,
                "outcome": "abandoned"}  # fmt: skip
        Path(path).write_text(json.dumps(gone) + "\n")
        assert apply_pending(coordinator) == 0  # an agent that is gone is left alone


def test_a_side_file_left_taken_by_a_killed_server_is_applied_by_the_next(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    with StateStore(db) as store:
        coordinator = Coordinator(store, resolver=Resolver([Workspace("d", str(tmp_path))]))
        dead, live = (coordinator.register(n).agent_id for n in ("dead", "live"))
        path = pending_path(store.db)
        assert path is not None
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        for agent, pid in ((dead, int(gone.stdout)), (live, os.getpid())):
            assert defer(store.db, [agent], 0.0, time.time() + 1) == path
            os.rename(path, f"{path}.{pid}-0123abcd")  # taken by a server, which then died
        assert apply_pending(coordinator) == 1  # the dead server's file
        assert not os.path.exists(f"{path}.{gone.stdout.strip()}-0123abcd")
        ends = dict(store.db.fetchall("SELECT agent_id, lease_ends_at FROM agents"))
        assert ends[dead] is not None and ends[live] is None
        assert os.path.exists(f"{path}.{os.getpid()}-0123abcd")  # a live server's: its own


def test_a_lease_end_still_refused_when_applied_stays_noted_for_the_next_server(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    with StateStore(db, busy_timeout=0.1) as store:
        coordinator = Coordinator(store, resolver=Resolver([Workspace("d", str(tmp_path))]))
        agent = coordinator.register("leaver").agent_id
        path = pending_path(store.db)
        assert path is not None
        with StateStore(":memory:") as memory:
            assert pending_path(memory.db) is None and defer(memory.db, [agent], 1.0, 0.0) is None
        assert defer(store.db, [agent], 0.0, time.time() + 1) == path
        with exclusive_lock(db):
            assert apply_pending(coordinator) == 0  # the database still refuses: kept
        assert [json.loads(line)["agent_id"] for line in Path(path).read_text().splitlines()] == [
            agent
        ]
        assert apply_pending(coordinator) == 1 and not os.path.exists(path)
        assert apply_pending(coordinator) == 0  # nothing noted: nothing to do


@pytest.mark.backends
def test_a_note_that_cannot_be_written_either_is_reported_not_raised(
    store: StateStore, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))  # PostgreSQL notes go under it
    if backend == "sqlite":
        os.chmod(tmp_path, 0o500)  # and SQLite's beside the file (root ignores this)
    try:
        noted = defer(store.db, ["agent-0123456789abcdef"], 1.0, time.time())
    finally:
        os.chmod(tmp_path, 0o700)
    if backend == "postgresql" or os.geteuid() != 0:
        assert noted is None
    assert clock(store.db) > 0


@pytest.mark.backends
async def test_a_server_that_stays_up_applies_lease_ends_noted_after_it_started(
    db_url: str, tmp_path: Path
) -> None:
    """Another server (killed before it could write them) notes lease ends after this one
    started: this one applies them within ``pending_every``, not only at its next start."""
    import anyio

    with StateStore(db_url) as store:
        coordinator = Coordinator(store, resolver=Resolver([Workspace("d", str(tmp_path))]))
        agent = coordinator.register("leaver").agent_id
        assert coordinator.claim("a.txt", agent).status == "claimed"
        app = Agenthold(coordinator)
        app.pending_every = 0.1
        async with anyio.create_task_group() as tg:
            tg.start_soon(app.reap_forever)
            await anyio.sleep(0.2)  # it has looked once already: nothing was pending
            path = defer(store.db, [agent], 0.0, clock(store.db))
            assert path is not None and os.path.exists(path)
            with anyio.fail_after(10):
                while os.path.exists(path):
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        assert coordinator.status("a.txt").status == "available"
        assert coordinator.status("a.txt").previous is not None
