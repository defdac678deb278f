"""Backing up and restoring a SQLite database, with real server processes.

The procedure of docs/upgrading.md ("Backing up and restoring") is performed step by step:
`agenthold backup` while a server runs and writes, the server stopped, the copy put back, a new
server started; the backed-up data is there, and nothing of the replaced file's write-ahead log
is. Then the ways a restore goes wrong: a copy put over the file of a running server (in place,
or moved over it), and a WAL left by a killed server beside a restored copy. Each is refused or
repaired as the docs say; none brings back data from after the backup.

Then every order at once (``test_a_restore_out_of_order_is_served_or_refused_and_never_corrupted``):
mv or cp, the old server killed, stopped or left running, cold or warm, with the inspector, a
StateStore and a server as the next opener; and the pieces that decide it, each alone: the
log reader, the first writer's own commit, a log held by another store, one of another page
size or id, a warm server left behind.

The procedure and the copies put over a running server's file run through both stdio paths
(``stdio_path``): served by the server process itself, and through a warm server, which is then
one of the servers that step 1 stops (its log has what a stopped server says). The killed-server
tests run cold only: a SIGKILL of a warm call ends its front, not the warm server serving it,
so no write-ahead log is left by a kill there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import (
    StdioPipes,
    agenthold_args,
    backed_up_store,
    child_env,
    python_child,
    run_python,
    stop_warm_servers,
)

from agenthold.store import (
    IncompatibleDatabaseError,
    InvalidInputError,
    NotFoundError,
    StateStore,
    UnavailableError,
)


class Server:
    """A stdio server process on ``db`` with the standard and advanced tools."""

    def __init__(self, tmp_path: Path, db: Path) -> None:
        self.pipes = StdioPipes(
            [sys.executable, *agenthold_args(db, tmp_path, "--tools", "standard,advanced")],
            tmp_path,
        )
        self.pipes.handshake("restore-test")

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = self.pipes.request("tools/call", {"name": tool, "arguments": arguments})
        reply: dict[str, Any] = json.loads(result["content"][0]["text"])
        return reply

    def set(self, value: Any) -> dict[str, Any]:
        return self.call(
            "agenthold_set", namespace="ns", key="k", value=value, updated_by="t", force=True
        )

    def get(self) -> Any:
        return self.call("agenthold_get", namespace="ns", key="k")["value"]

    def stop(self) -> str:
        """Stop the server, warm servers too (step 1 of the procedure): what they said."""
        status, err = self.pipes.close()
        assert status == 0, err
        runtime = os.environ.get("AGENTHOLD_RUNTIME_DIR")
        if os.environ.get("AGENTHOLD_NO_WARM") != "1" and runtime:  # stdio_path "warm"
            assert not stop_warm_servers(Path(runtime))
            err += "".join(log.read_text() for log in Path(runtime).glob("*.log"))
        return err


def backup(db: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthold", "backup", str(dest), "--db", str(db)],
        capture_output=True, text=True, timeout=60, env=child_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip


def side_files(db: Path) -> dict[str, int]:
    """The -wal and -shm files beside ``db`` and their sizes."""
    return {
        suffix: os.path.getsize(f"{db}{suffix}")
        for suffix in ("-wal", "-shm")
        if os.path.exists(f"{db}{suffix}")
    }


@pytest.fixture
def started(tmp_path: Path, stdio_path: str) -> tuple[Path, Path, Server]:
    """A running server that wrote "backed-up", a backup taken while it runs, then "after"
    written by the server: what a restore must undo. Run cold and warm (``stdio_path``)."""
    return start(tmp_path)


@pytest.fixture
def started_cold(tmp_path: Path) -> tuple[Path, Path, Server]:
    """The same, served by the server process itself only (for the tests that kill it)."""
    return start(tmp_path)


def start(tmp_path: Path) -> tuple[Path, Path, Server]:
    db, copy = tmp_path / "agenthold.db", tmp_path / "backup.db"
    server = Server(tmp_path, db)
    assert server.set("backed-up")["version"] == 1
    agent = server.call("agenthold_register", name="worker")["agent_id"]
    assert server.call("agenthold_claim", agent_id=agent, resource="a.txt")["status"] == "claimed"
    made = backup(db, copy)
    assert made.returncode == 0 and made.stdout.strip() == f"agenthold: backed up {db} to {copy}"
    assert not made.stderr
    assert server.set("after")["version"] == 2
    assert server.get() == "after"
    return db, copy, server


def test_the_documented_restore_procedure_brings_back_the_backup_and_nothing_after_it(
    tmp_path: Path, started: tuple[Path, Path, Server]
) -> None:
    db, copy, server = started
    server.stop()  # 2. stop every server on the database
    assert side_files(db) == {}  # a clean exit checkpoints and removes the WAL
    shutil.copyfile(copy, db)  # 3. copy the backup over the database file
    again = Server(tmp_path, db)  # 4. start again
    try:
        assert again.get() == "backed-up"
        history = again.call("agenthold_history", namespace="ns", key="k")["history"]
        assert [h["value"] for h in history] == ["backed-up"]
        assert again.set("new life")["version"] == 2  # the restored file is served as usual
    finally:
        again.stop()
    with StateStore(db) as store:  # the first writer took the copy's FRESH mark off its id
        assert not store.db.fetchone("SELECT value FROM agenthold_meta")[0].endswith(":fresh")
        assert store.get("ns", "k").value == "new life"


def test_a_backup_copied_in_place_under_a_running_server_is_detected_and_kept(
    tmp_path: Path, started: tuple[Path, Path, Server]
) -> None:
    db, copy, server = started
    inode = os.stat(db).st_ino
    shutil.copyfile(copy, db)  # in place: the same inode, another database's contents
    assert os.stat(db).st_ino == inode
    refused = server.set("into the restored file")
    assert refused["status"] == "unavailable"
    assert "replaced while agenthold was running" in refused["message"]
    assert "nothing was written" in refused["message"] and "Stop every" in refused["hint"]
    err = server.stop()
    assert "write-ahead log of the file it replaced was emptied" in err
    assert side_files(db).get("-wal", 0) == 0
    again = Server(tmp_path, db)
    try:
        assert again.get() == "backed-up"  # none of the old WAL's pages reached the file
    finally:
        again.stop()
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_process_ended_by_exit_now_closes_what_it_left_open_and_flushes_its_output(
    tmp_path: Path,
) -> None:
    """``agenthold`` ends its process without the interpreter's teardown (``cli.exit_now``),
    which would otherwise have closed a database left open: it closes it first, so SQLite
    removes the WAL as at any clean exit (what step 2 of the restore procedure relies on),
    and what the process printed still reaches its reader."""
    db = tmp_path / "left-open.db"
    code = (
        "import sys; from agenthold.store import StateStore; "
        "from agenthold.cli.main import exit_now; "
        "store = StateStore(sys.argv[1]); store.set('ns', 'k', 1, updated_by='t'); "
        "print('written', end=''); exit_now(3)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(db)],
        capture_output=True, text=True, timeout=60, env=child_env(),
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (3, "written", "")
    assert side_files(db) == {}
    with StateStore(db) as store:
        assert store.get("ns", "k").value == 1


def test_a_process_whose_output_cannot_be_written_does_not_exit_0() -> None:
    """``exit_now`` flushes what the command printed; when that fails (a full disk: /dev/full),
    the status says so (120, the interpreter's own for it), where it said 0."""
    env = {k: v for k, v in child_env().items() if k != "PYTHONUNBUFFERED"}  # written at exit
    with open(os.devnull, "rb") as nothing, open("/dev/full", "wb") as full:
        done = subprocess.run(
            [sys.executable, "-m", "agenthold", "--version"],
            stdin=nothing, stdout=full, stderr=subprocess.PIPE, timeout=60, env=env,
        )  # fmt: skip
    assert done.returncode == 120, done.stderr


def test_a_backup_moved_over_the_file_of_a_running_server_is_not_undone_by_its_wal(
    tmp_path: Path, started: tuple[Path, Path, Server]
) -> None:
    db, copy, server = started
    os.replace(copy, db)  # a new inode at the path; the server still has the old file open
    refused = server.set("into the old file")
    assert refused["status"] == "unavailable" and "deleted or replaced" in refused["message"]
    err = server.stop()  # SQLite keeps the WAL of a file moved away: the server empties it
    assert "write-ahead log of the file it replaced was emptied" in err
    assert side_files(db).get("-wal", 0) == 0
    again = Server(tmp_path, db)
    try:
        assert again.get() == "backed-up"
    finally:
        again.stop()


def test_a_wal_left_by_a_killed_server_is_never_applied_to_a_restored_backup(
    tmp_path: Path, started_cold: tuple[Path, Path, Server]
) -> None:
    db, copy, server = started_cold
    server.pipes.proc.send_signal(signal.SIGKILL)
    server.pipes.close()
    assert side_files(db)["-wal"] > 0  # the killed server's log, with "after" in it
    shutil.copyfile(copy, db)  # restored without moving that log away first
    with pytest.raises(IncompatibleDatabaseError, match="does not belong") as caught:
        StateStore(db)
    assert "-wal and -shm" in (caught.value.hint or "")
    started_anyway = subprocess.run(
        [sys.executable, *agenthold_args(db, tmp_path)], capture_output=True, text=True,
        timeout=60, env=child_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert started_anyway.returncode != 0
    assert "does not belong to the database file" in started_anyway.stderr
    assert "Traceback" not in started_anyway.stderr
    for suffix in ("-wal", "-shm"):  # as the hint says
        os.replace(f"{db}{suffix}", tmp_path / f"moved{suffix}")
    again = Server(tmp_path, db)
    try:
        assert again.get() == "backed-up"
    finally:
        again.stop()


def test_a_wal_left_by_a_killed_server_is_still_recovered_on_its_own_file(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agenthold.db"
    server = Server(tmp_path, db)
    server.set("acknowledged")
    server.pipes.proc.send_signal(signal.SIGKILL)
    server.pipes.close()
    assert side_files(db)["-wal"] > 0
    with StateStore(db) as store:  # crash recovery: the log is this file's own
        assert store.get("ns", "k").value == "acknowledged"


@pytest.mark.backends
def test_the_library_backs_up_sqlite_and_names_pg_dump_for_postgresql(
    store: StateStore, backend: str, tmp_path: Path
) -> None:
    store.set("ns", "k", [1, 2], updated_by="t")
    dest = tmp_path / "copy.db"
    if backend == "postgresql":
        with pytest.raises(InvalidInputError, match="pg_dump"):
            store.backup(dest)
        return
    assert store.backup(dest) == str(dest)
    with pytest.raises(InvalidInputError, match="already exists"):
        store.backup(dest)
    with pytest.raises(InvalidInputError, match="does not exist"):
        store.backup(tmp_path / "missing" / "copy.db")
    assert sorted(p.name for p in tmp_path.iterdir() if "copy" in p.name) == ["copy.db"]
    with StateStore(dest, read_only=True) as copy:
        assert copy.get("ns", "k").value == [1, 2]
        ids = {s.db.fetchone("SELECT value FROM agenthold_meta")[0] for s in (store, copy)}
        assert len(ids) == 2  # the copy is a database of its own
    with StateStore(":memory:") as memory, pytest.raises(InvalidInputError, match="memory"):
        memory.backup(tmp_path / "m.db")


def test_the_backup_command_fails_in_one_line_and_never_imports_mcp(tmp_path: Path) -> None:
    db = tmp_path / "agenthold.db"
    StateStore(db).close()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c",
             "import sys; from agenthold.cli.main import main; status = main(sys.argv[1:]); "
             "print('mcp' in sys.modules); sys.exit(status)", *args],
            capture_output=True, text=True, timeout=60, env=child_env(), cwd=tmp_path,
        )  # fmt: skip

    done = run("backup", str(tmp_path / "b.db"), "--db", str(db))
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "False"
    cases = [
        (("backup", str(tmp_path / "b.db"), "--db", str(db)), 1, "already exists"),
        (("backup", "x.db", "--db", "postgresql://u@h/d"), 2, "pg_dump"),
        (("backup", "x.db", "--db", ""), 2, "empty path"),
        (("backup", "", "--db", str(db)), 2, "DEST is empty"),
        (("backup", "x.db", "--db", str(tmp_path / "none.db")), 2, "no database at"),
        (("backup", "x.db", "--db", ":memory:"), 2, "':memory:' has none"),
        (
            ("backup", str(tmp_path / ("a" * 300 + ".db")), "--db", str(db)),
            1,
            "cannot write the backup",
        ),  # the copy's name is too long: DEST is named, not the db
    ]
    for args, status, fragment in cases:
        failed = run(*args)
        assert failed.returncode == status, (args, failed.stderr)
        lines = failed.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], (args, failed.stderr)
    assert run("backup").returncode == 2  # DEST is required (argparse)


def test_a_file_without_an_id_opens_while_another_process_holds_the_write_lock(
    tmp_path: Path,
) -> None:
    from support import another_process_holds_the_write_lock

    db = tmp_path / "old.db"
    with StateStore(db) as store:
        store.set("ns", "k", 1, updated_by="t")
    with sqlite3.connect(db) as conn:  # as an agenthold from before database ids left it
        conn.execute("DROP TABLE agenthold_meta")
    with another_process_holds_the_write_lock(db), StateStore(db, busy_timeout=0.1) as store:
        assert store.get("ns", "k").value == 1  # it opens and reads; the id comes later
    with StateStore(db) as store:
        assert store.db.fetchone("SELECT value FROM agenthold_meta")[0].startswith("agenthold-id:")


def test_a_copy_whose_id_lives_on_another_page_is_detected_when_copied_in_place(
    tmp_path: Path,
) -> None:
    """The check reads the page where the running file keeps its id; a copy of a database that
    got its id later keeps it on another page, and that page holds ordinary rows."""
    other, db = tmp_path / "other.db", tmp_path / "agenthold.db"
    with StateStore(other) as store:
        store.set("fill", "k", "x" * 200, updated_by="t")
    with contextlib.closing(sqlite3.connect(other)) as conn, conn:
        conn.execute("DROP TABLE agenthold_meta")  # as a file made before ids
        conn.execute("CREATE TABLE filler (x)")  # rows on the page the id had
        conn.executemany("INSERT INTO filler VALUES (?)", [("y" * 200,)] * 300)
    with StateStore(other) as store:  # gets its id now, on a page after all of those
        store.backup(tmp_path / "copy.db")
    with StateStore(db) as running:
        running.set("ns", "k", "mine", updated_by="t")
        shutil.copyfile(tmp_path / "copy.db", db)  # in place: the same inode
        with pytest.raises(UnavailableError, match="replaced while agenthold was running"):
            running.set("ns", "after-restore", 1, updated_by="t")
    with StateStore(db) as reopened:
        with pytest.raises(NotFoundError):  # nothing was written into the copy
            reopened.get("ns", "after-restore")
        assert reopened.get("fill", "k").value == "x" * 200


def test_a_backup_never_replaces_a_file_that_appeared_at_its_name(tmp_path: Path) -> None:
    from agenthold.db.sqlite import _put_in_place

    partial, target = tmp_path / "copy.partial", tmp_path / "dest.db"
    partial.write_bytes(b"the copy")
    target.write_bytes(b"someone else's")  # made after backup() looked
    with pytest.raises(InvalidInputError, match="already exists"):
        _put_in_place(str(partial), str(target), "dest.db")
    assert target.read_bytes() == b"someone else's"
    target.unlink()
    _put_in_place(str(partial), str(target), "dest.db")
    assert target.read_bytes() == b"the copy"


# --------------------------------------------------------------------------------------------
# Every way of doing a restore out of order: the copy moved (mv) or copied (cp) over the file
# while a server has 50 writes in its log, that server then killed, stopped or left running,
# served cold and through a warm server; then the inspector, a StateStore and a new server open
# the path. Each either serves the backup (and nothing of the log) or refuses in words that say
# why; the restored file's bytes stay as restored until something serves it, and never does
# anything answer "malformed".
# --------------------------------------------------------------------------------------------

REFUSALS = ("does not belong to the database file", "a restored backup that no server has opened")


def _inspect(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthold", "namespaces", "--db", str(db), "--json"],
        capture_output=True, text=True, timeout=120, env=child_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _serve(tmp_path: Path, db: Path) -> subprocess.CompletedProcess[str]:
    """A new stdio server on ``db`` whose input ends at once: it opens the database (or says
    why not) and exits."""
    return subprocess.run(
        [sys.executable, *agenthold_args(db, tmp_path), "--busy-timeout", "2"],
        capture_output=True, text=True, timeout=120, env=child_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _kill_holder(server: Server) -> None:
    """SIGKILL the process that has the database open: the server, or its warm server (the
    front that a warm server serves holds no database)."""
    runtime = os.environ.get("AGENTHOLD_RUNTIME_DIR")
    if os.environ.get("AGENTHOLD_NO_WARM") != "1" and runtime:
        from support import warm_pids

        holders = warm_pids(Path(runtime))
        assert holders, "no warm server served the writes"
        for pid in holders:
            os.kill(pid, signal.SIGKILL)
        for pid_file in Path(runtime).glob("*.pid"):  # a killed server cannot remove its own
            pid_file.unlink()
    server.pipes.proc.send_signal(signal.SIGKILL)
    server.pipes.close()


@pytest.mark.parametrize("how", ["mv", "cp"])
@pytest.mark.parametrize("fate", ["killed", "stopped", "running"])
def test_a_restore_out_of_order_is_served_or_refused_and_never_corrupted(
    tmp_path: Path, stdio_path: str, how: str, fate: str
) -> None:
    db, copy, pristine = tmp_path / "agenthold.db", tmp_path / "backup.db", tmp_path / "p.db"
    server = Server(tmp_path, db)
    assert server.set("backed-up")["version"] == 1
    assert backup(db, copy).returncode == 0
    shutil.copyfile(copy, pristine)
    for n in range(50):  # what the restore undoes, in the server's log
        written = server.call(
            "agenthold_set",
            namespace="after",
            key=f"k{n}",
            value="x" * 300,
            updated_by="t",
            force=True,
        )
        assert written["status"] == "ok"
    assert side_files(db).get("-wal", 0) > 0
    if how == "mv":
        os.replace(copy, db)
    else:
        shutil.copyfile(copy, db)
    restored = pristine.read_bytes()
    if fate == "killed":
        _kill_holder(server)
    elif fate == "stopped":
        server.stop()  # (its warm server too): it must leave the restored file as it was
    assert db.read_bytes() == restored

    served = fate == "stopped"  # a log no one holds and that is this file's, or none
    inspected = _inspect(db)
    assert "malformed" not in inspected.stderr + inspected.stdout
    if served:
        assert inspected.returncode == 0, inspected.stderr
        assert [n["namespace"] for n in json.loads(inspected.stdout)] == ["ns"]
    else:
        assert inspected.returncode == 1, inspected.stderr
        assert any(r in inspected.stderr for r in REFUSALS), inspected.stderr
        assert len(inspected.stderr.strip().splitlines()) == 1, inspected.stderr
    assert db.read_bytes() == restored  # the inspector never writes

    if served:
        with StateStore(db, busy_timeout=1) as store:
            assert store.get("ns", "k").value == "backed-up"
            assert store.list_keys("after") == []
    else:
        with pytest.raises(IncompatibleDatabaseError) as caught:
            StateStore(db, busy_timeout=1)
        assert any(r in str(caught.value) for r in REFUSALS), caught.value
        assert "move them away" in (caught.value.hint or "")
        assert db.read_bytes() == restored

    started = _serve(tmp_path, db)
    assert "malformed" not in started.stderr and "Traceback" not in started.stderr
    if served:
        assert started.returncode == 0, started.stderr
    else:
        assert started.returncode == 1, started.stderr
        assert any(r in started.stderr for r in REFUSALS), started.stderr
        assert db.read_bytes() == restored

    # then as the refusal's hint says: stop what still runs, move a log left by a kill away
    if fate == "running":
        server.stop()  # the old server empties the log it leaves (the file was replaced)
    if fate == "killed":
        for suffix in ("-wal", "-shm"):
            if os.path.exists(f"{db}{suffix}"):
                os.replace(f"{db}{suffix}", tmp_path / f"moved{suffix}")
    if not served:
        assert db.read_bytes() == restored
    with StateStore(db) as store:
        assert store.get("ns", "k").value == "backed-up"
        assert store.list_keys("after") == []
    with contextlib.closing(sqlite3.connect(db)) as check:
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_copy_put_in_place_under_a_store_of_the_same_process_is_not_opened_beside_it(
    tmp_path: Path,
) -> None:
    """A second store of the process that has the file open shares SQLite's view of it (the
    old file's log over the copy's pages): it refuses, and the first one's close empties that
    log, so the copy then opens as restored."""
    db, copy = tmp_path / "agenthold.db", tmp_path / "backup.db"
    running = StateStore(db)
    running.set("ns", "k", "backed-up", updated_by="t")
    running.backup(copy)
    for n in range(20):
        running.set("after", f"k{n}", "x" * 300, updated_by="t")
    shutil.copyfile(copy, db)
    with pytest.raises(IncompatibleDatabaseError, match="replaced while this process had it open"):
        StateStore(db)
    restored = db.read_bytes()
    running.close()  # it finds the copy on its own (no write since) and empties its log
    assert db.read_bytes() == restored and side_files(db).get("-wal", 0) == 0
    with StateStore(db) as store:
        assert store.get("ns", "k").value == "backed-up" and store.list_keys("after") == []


def test_a_log_whose_commits_write_another_id_is_refused_beside_a_file_a_writer_opened(
    tmp_path: Path,
) -> None:
    """Without FRESH to go by (a copy a writer has opened, put back by hand), a log is still
    refused when its commits rewrite the id's page with another database's id: the log of a
    file whose id was written since its last restart."""
    db, other = tmp_path / "agenthold.db", tmp_path / "other.db"
    with StateStore(other) as store:
        store.set("ns", "k", "other", updated_by="t")
    code = (
        "import os, sys; from agenthold.store import StateStore; "
        "s = StateStore(sys.argv[1]); os._exit(0)"
    )  # a new file's id goes into its log (then the file, by a checkpoint): left by the exit
    made = run_python(code, db)
    assert made.returncode == 0 and side_files(db).get("-wal", 0) > 0
    shutil.copyfile(other, db)
    restored = db.read_bytes()
    with pytest.raises(IncompatibleDatabaseError, match="does not belong"):
        StateStore(db)
    assert db.read_bytes() == restored


def test_the_log_reader_takes_only_what_sqlite_recovery_would(tmp_path: Path) -> None:
    """No header, a header that fails its checksum, a torn last frame: none is read as a
    commit (SQLite would not apply them either)."""
    from agenthold.store import WAL_HEADER, read_wal

    db = tmp_path / "agenthold.db"
    code = (
        "import os, sys; from agenthold.store import StateStore; "
        "s = StateStore(sys.argv[1]); s.set('ns', 'k', 1, updated_by='t'); os._exit(0)"
    )
    assert run_python(code, db).returncode == 0
    wal = Path(f"{db}-wal")
    whole = wal.read_bytes()
    log = read_wal(str(wal))
    assert log is not None and log.committed > 0 and log.page_size == 2048
    assert read_wal(str(tmp_path / "none-wal")) is None
    wal.write_bytes(whole[:20])
    assert read_wal(str(wal)) is None
    wal.write_bytes(whole[:8] + b"\x00\x00\x10\x01" + whole[12:])  # no page size SQLite has
    assert read_wal(str(wal)) is None
    wal.write_bytes(whole[:24] + bytes(8) + whole[32:])  # the header's checksum is wrong
    assert read_wal(str(wal)) is None
    end = WAL_HEADER + log.committed * (24 + 2048)  # the last commit frame ends here
    wal.write_bytes(whole[: end - 100] + bytes(100) + whole[end:])  # torn: no commit then
    torn = read_wal(str(wal))
    assert torn is not None and torn.committed < log.committed
    wal.write_bytes(whole[: WAL_HEADER + 24 + 2048 - 1])  # a frame cut short
    assert read_wal(str(wal)) == type(log)(2048)


@pytest.mark.parametrize("stdio_path", ["warm"], indirect=True)
@pytest.mark.parametrize("how", ["mv", "cp"])
def test_a_warm_server_left_behind_over_a_restored_file_steps_aside_for_it(
    tmp_path: Path, stdio_path: str, how: str
) -> None:
    """What a restore by a user who closed the host meets: the call ended, its warm server
    still has the old file open. The next call's hello finds it stale (a copy put in place is
    found by its id, as a moved one is by its inode); it leaves, emptying its log rather than
    checkpointing it into the copy, and the call serves the backup."""
    db, copy = tmp_path / "agenthold.db", tmp_path / "backup.db"
    server = Server(tmp_path, db)
    server.set("backed-up")
    assert backup(db, copy).returncode == 0
    for n in range(50):
        server.call(
            "agenthold_set", namespace="after", key=f"k{n}", value="x" * 300, updated_by="t",
            force=True,
        )  # fmt: skip
    status, err = server.pipes.close()  # the front only: its warm server stays
    assert status == 0, err
    runtime = Path(os.environ["AGENTHOLD_RUNTIME_DIR"])
    from support import warm_pids

    left_behind = warm_pids(runtime)
    assert left_behind
    if how == "mv":
        os.replace(copy, db)
    else:
        shutil.copyfile(copy, db)
    again = Server(tmp_path, db)
    try:
        assert again.get() == "backed-up"
        listed = again.call("agenthold_list", namespace="after")
        assert listed.get("records", []) == []
        deadline = time.monotonic() + 60  # it has let go of the file; its pid file goes last
        while set(left_behind) & set(warm_pids(runtime)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not set(left_behind) & set(warm_pids(runtime))
    finally:
        again.stop()
    with StateStore(db) as store:
        assert store.list_keys("after") == []
        assert store.db.fetchone("PRAGMA integrity_check")[0] == "ok"


def test_the_first_writers_own_commit_beside_a_fresh_copy_is_recovered(tmp_path: Path) -> None:
    """The one commit a fresh copy's log may hold is the first writer's, which drops FRESH
    from the id: killed before its checkpoint, that log is the file's own and is applied."""
    db = tmp_path / "agenthold.db"
    backed_up_store(tmp_path / "source.db", db)
    code = (
        "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('PRAGMA journal_mode = wal'); c.execute('PRAGMA wal_autocheckpoint = 0'); "
        "c.execute(\"UPDATE agenthold_meta SET value = replace(value, ':fresh', '')\"); "
        "os._exit(0)"
    )  # what _ensure_database_id commits, killed before its checkpoint
    assert run_python(code, db).returncode == 0
    assert side_files(db).get("-wal", 0) > 0
    with StateStore(db) as store:
        assert store.get("ns", "k").value == "backed-up"
        assert not store.db.fetchone("SELECT value FROM agenthold_meta")[0].endswith(":fresh")


def test_a_fresh_copy_beside_a_log_another_store_holds_is_refused_even_without_commits(
    tmp_path: Path,
) -> None:
    """A store still open on the file moved away shares the log by its name: empty now, its
    next commit would land in the restored copy's log. Opening waits busy_timeout for it to
    let go, then refuses; once it has closed, the copy opens."""
    db, copy = tmp_path / "agenthold.db", tmp_path / "backup.db"
    running = StateStore(db)
    running.set("ns", "k", "backed-up", updated_by="t")
    running.backup(copy)
    running.db.fetchone("PRAGMA wal_checkpoint(TRUNCATE)")
    assert side_files(db).get("-wal", 0) == 0 and "-shm" in side_files(db)
    os.replace(copy, db)
    restored = db.read_bytes()
    with pytest.raises(IncompatibleDatabaseError, match="no server has opened yet"):
        StateStore(db, busy_timeout=0.2)
    assert db.read_bytes() == restored
    running.close()
    with StateStore(db) as store:
        assert store.get("ns", "k").value == "backed-up"


def test_a_log_of_another_page_size_is_never_applied_to_a_restored_copy(tmp_path: Path) -> None:
    db, plain = tmp_path / "agenthold.db", tmp_path / "plain.db"
    backed_up_store(tmp_path / "source.db", db)
    code = (
        "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('PRAGMA page_size = 4096'); c.execute('PRAGMA journal_mode = wal'); "
        "c.execute('CREATE TABLE t (x)'); c.execute('INSERT INTO t VALUES (1)'); os._exit(0)"
    )
    assert run_python(code, plain).returncode == 0
    shutil.copyfile(f"{plain}-wal", f"{db}-wal")  # a log of 4 KiB pages beside 2 KiB ones
    restored = db.read_bytes()
    with pytest.raises(IncompatibleDatabaseError, match="does not belong"):
        StateStore(db)
    assert db.read_bytes() == restored


def test_a_log_beside_a_sqlite_file_of_another_program_is_left_to_the_usual_refusal(
    tmp_path: Path,
) -> None:
    """A file with no database id has nothing to compare a log with: it is refused for what it
    is (not an agenthold database), its log read as its own (SQLite may fold it into the file,
    as any SQLite program would)."""
    plain = tmp_path / "plain.db"
    code = (
        "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('PRAGMA journal_mode = wal'); c.execute('CREATE TABLE t (x)'); os._exit(0)"
    )
    assert run_python(code, plain).returncode == 0
    assert side_files(plain).get("-wal", 0) > 0
    with pytest.raises(IncompatibleDatabaseError, match="not an agenthold database"):
        StateStore(plain)
    with contextlib.closing(sqlite3.connect(plain)) as check:
        assert check.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with StateStore(":memory:") as memory:  # nothing to be replaced
        assert memory.db.replaced() is False  # type: ignore[attr-defined]


def test_a_reader_of_a_restored_copy_does_not_keep_its_first_writer_out(tmp_path: Path) -> None:
    """A read-only opening (the inspector, `log --follow`) made after the restore holds the log
    it created beside the copy, as a server of the replaced file would hold its old one: a
    writer opening next is not refused for it, and the backed-up data is served."""
    db, copy = tmp_path / "agenthold.db", tmp_path / "backup.db"
    backed_up_store(tmp_path / "source.db", copy)
    os.replace(copy, db)  # restored with every server stopped: no log beside it
    code = (
        "import sys; from agenthold.store import StateStore\n"
        "s = StateStore(sys.argv[1], read_only=True)\n"
        "print(s.get('ns', 'k').value, flush=True)\n"
        "sys.stdin.read()"
    )
    with python_child(code, db) as (_, read):
        assert read == "backed-up"
        assert "-shm" in side_files(db)
        with StateStore(db, busy_timeout=0.5) as store:
            assert store.get("ns", "k").value == "backed-up"
            assert store.set("ns", "k", "after", updated_by="t").version == 2


@pytest.mark.parametrize("how", ["mv", "cp"])
def test_a_copy_put_in_place_beside_an_empty_log_another_server_holds_is_still_refused(
    tmp_path: Path, how: str
) -> None:
    """A server of the replaced file still holding its log, empty now: moved over (mv), it holds
    another inode; written over in place (cp), it shares the copy's, as a reader of the copy
    would, but its log is older than the copy. Either way it is waited for, then refused (its
    exit would empty or delete a log the copy's writer used)."""
    db, copy = tmp_path / "agenthold.db", tmp_path / "backup.db"
    code = (
        "import sys; from agenthold.store import StateStore\n"
        "s = StateStore(sys.argv[1]); s.set('ns', 'k', 'backed-up', updated_by='t')\n"
        "s.backup(sys.argv[2]); s.db.fetchone('PRAGMA wal_checkpoint(TRUNCATE)')\n"
        "print('ready', flush=True); sys.stdin.read()"
    )
    with python_child(code, db, copy) as (old, said):
        assert said == "ready"
        assert side_files(db).get("-wal", 0) == 0 and "-shm" in side_files(db)
        if how == "mv":
            os.replace(copy, db)
        else:
            shutil.copyfile(copy, db)
        restored = db.read_bytes()
        with pytest.raises(IncompatibleDatabaseError, match="no server has opened yet"):
            StateStore(db, busy_timeout=0.2)
        assert db.read_bytes() == restored
    assert old.returncode == 0
    with StateStore(db) as store:
        assert store.get("ns", "k").value == "backed-up"


def test_a_copy_whose_log_a_process_is_emptying_is_not_taken_for_a_readers(
    tmp_path: Path,
) -> None:
    """A server of the old file on its way out (a copy written over it in place) empties the
    log after the copy, holding the -shm file exclusively until its connections close: its log
    is then newer than the copy and it shares the copy's inode, as a reader of the copy would.
    The exclusive hold tells it apart: waited for, refused, and opened once it is gone."""
    db, copy = tmp_path / "agenthold.db", tmp_path / "backup.db"
    backed_up_store(tmp_path / "source.db", copy)
    os.replace(copy, db)
    code = (  # what _forget_stale_wal holds while its connections close, kept here
        "import fcntl, os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1]); c.execute('SELECT 1 FROM sqlite_master').fetchall()\n"
        "fd = os.open(sys.argv[1] + '-shm', os.O_RDWR)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)\n"
        "os.truncate(sys.argv[1] + '-wal', 0)\n"
        "print('ready', flush=True); sys.stdin.read()"
    )
    with python_child(code, db) as (holder, said):
        assert said == "ready"
        with pytest.raises(IncompatibleDatabaseError, match="no server has opened yet"):
            StateStore(db, busy_timeout=0.2)
    assert holder.returncode == 0
    with StateStore(db) as store:
        assert store.get("ns", "k").value == "backed-up"
