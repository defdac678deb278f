"""A second server started beside a database file deleted under a running one.

The file is unlinked while a server (a real process) uses it; its -wal and -shm stay. A new
server must not make a fresh file and take those for its own (SQLite would share the running
server's log, fail with a misleading I/O error and reset that log): it says what happened and
touches nothing. Once the running server has stopped, a new, empty database can be made.
The running server is also a warm one (``stdio_path``), stopped as the hint says; the second
server has no pipe on stdin, so it never goes warm.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import StdioPipes, agenthold_args, child_env, stop_warm_servers

from agenthold.store import IncompatibleDatabaseError, StateStore


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def call(pipes: StdioPipes, tool: str, **arguments: Any) -> dict[str, Any]:
    result = pipes.request("tools/call", {"name": tool, "arguments": arguments})
    reply: dict[str, Any] = json.loads(result["content"][0]["text"])
    return reply


def test_a_server_started_beside_a_deleted_database_says_so_and_touches_nothing(
    tmp_path: Path, stdio_path: str
) -> None:
    db = tmp_path / "agenthold.db"
    first = StdioPipes([sys.executable, *agenthold_args(db, tmp_path, "--tools", "advanced")],
                       tmp_path)  # fmt: skip
    first.handshake("first")
    assert call(first, "agenthold_set", namespace="n", key="k", value=1, updated_by="w",
                force=True)["status"] == "ok"  # fmt: skip
    db.unlink()  # the WAL and the shared index stay: the running server holds them
    wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
    before = digest(wal), digest(shm)
    with pytest.raises(IncompatibleDatabaseError, match="deleted while a server") as caught:
        StateStore(db)
    assert "Stop the agenthold processes" in (caught.value.hint or "")
    second = subprocess.run(
        [sys.executable, *agenthold_args(db, tmp_path)], capture_output=True, text=True,
        timeout=60, env=child_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert second.returncode != 0 and "Traceback" not in second.stderr
    assert "deleted while a server was using it" in second.stderr
    assert "I/O error" not in second.stderr and "disk" not in second.stderr
    assert not db.exists()  # nothing created
    assert (digest(wal), digest(shm)) == before  # nothing of the running server's touched
    # The running server answers on: a worker thread with its connection already open still
    # reads the deleted file; one that must connect now cannot, and says why (a restart is
    # what a deleted file needs), never a crash or a made-up empty store.
    read = call(first, "agenthold_get", namespace="n", key="k")
    if read["status"] == "ok":
        assert read["value"] == 1
    else:
        assert read["status"] == "unavailable", read
        assert "deleted or replaced while agenthold was running" in read["message"], read
    status, err = first.close()
    assert status == 0, err
    if stdio_path == "warm":  # the process that had the file open is the warm server
        assert not stop_warm_servers(Path(os.environ["AGENTHOLD_RUNTIME_DIR"]))
    with StateStore(db) as fresh:  # once it has stopped, a new database is made
        assert fresh.list_namespaces() == []


def test_a_wal_left_beside_a_deleted_database_is_not_applied_to_a_new_one(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agenthold.db"
    with StateStore(db) as store:
        store.set("n", "k", 1, updated_by="w")
        wal = Path(f"{db}-wal")
        kept = wal.read_bytes()
    db.unlink()
    wal.write_bytes(kept)  # as a killed server leaves it: its log, beside no file
    with pytest.raises(IncompatibleDatabaseError, match="cannot be applied to a new file"):
        StateStore(db)
    assert not db.exists() and wal.read_bytes() == kept
    os.replace(wal, tmp_path / "moved-wal")
    with StateStore(db) as fresh:
        assert fresh.list_namespaces() == []


def test_a_second_store_in_the_same_process_beside_a_deleted_database_is_refused(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agenthold.db"
    with StateStore(db) as store:
        store.set("n", "k", 1, updated_by="w")
        db.unlink()
        with pytest.raises(IncompatibleDatabaseError, match="deleted while a server"):
            StateStore(db)
        assert store.get("n", "k").value == 1
