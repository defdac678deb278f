"""Review tests: the log reader (read_wal) against SQLite's own recovery, on logs SQLite wrote."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import struct
from pathlib import Path

from support import backed_up_store, run_python

from agenthold.store import FRAME_HEADER, WAL_HEADER, StateStore, read_wal

# A child that writes rows in transactions of several frames, restarts its log twice on the
# way (a TRUNCATE checkpoint, then writes that leave older frames of other salts past the end
# of the new ones), and is killed with its log hot.
_WRITER = """
import os, signal, sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA page_size = 1024"); c.execute("PRAGMA journal_mode = wal")
c.execute("PRAGMA wal_autocheckpoint = 0"); c.execute("CREATE TABLE t (x)")
def burst(n, size):
    for i in range(n):
        c.execute("BEGIN"); c.executemany("INSERT INTO t VALUES (?)", [(os.urandom(size),)] * 3)
        c.execute("COMMIT")
burst(60, 900)
c.execute("PRAGMA wal_checkpoint(PASSIVE)")  # the next write restarts the log: new salts
burst(5, 900)  # shorter than the last generation: its frames stay past these
os.kill(os.getpid(), signal.SIGKILL)
"""


def _sqlite_recovers(db: Path, wal: bytes, tmp: Path) -> tuple[int, bytes]:
    """What SQLite itself takes from ``wal`` beside ``db``: how many frames its recovery
    counts as committed (the log size a passive checkpoint reports), and the database after."""
    copy = tmp / "judge.db"
    shutil.copyfile(db, copy)
    Path(f"{copy}-wal").write_bytes(wal)
    with sqlite3.connect(copy) as c:
        _, frames, _ = c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    conn = sqlite3.connect(copy)
    conn.close()
    data = copy.read_bytes()
    for side in ("-wal", "-shm"):
        Path(f"{copy}{side}").unlink(missing_ok=True)
    copy.unlink()
    return frames, data


def _killed_log(tmp: Path) -> tuple[Path, bytes]:
    db = tmp / "w.db"
    done = run_python(_WRITER, db, timeout=120)
    assert done.returncode == -signal.SIGKILL
    return db, Path(f"{db}-wal").read_bytes()


def _other_byte_order(wal: bytes) -> bytes:
    """The same log with the other magic number, every checksum recomputed in that order."""
    magic = struct.unpack(">I", wal[:4])[0]
    big = magic & 1 == 0  # the new order
    order = ">" if big else "<"

    def cks(data: bytes, s1: int, s2: int) -> tuple[int, int]:
        words = struct.unpack(f"{order}{len(data) // 4}I", data)
        for i in range(0, len(words), 2):
            s1 = (s1 + words[i] + s2) & 0xFFFFFFFF
            s2 = (s2 + words[i + 1] + s1) & 0xFFFFFFFF
        return s1, s2

    page = struct.unpack(">I", wal[8:12])[0]
    head = struct.pack(">I", magic ^ 1) + wal[4:24]
    s = cks(head, 0, 0)
    out = bytearray(head + struct.pack(">2I", *s))
    salts = wal[16:24]
    at = WAL_HEADER
    while at + FRAME_HEADER + page <= len(wal) and wal[at + 8 : at + 16] == salts:
        frame = wal[at : at + FRAME_HEADER + page]
        s = cks(frame[:8], *s)
        s = cks(frame[FRAME_HEADER:], *s)
        out += frame[:16] + struct.pack(">2I", *s) + frame[FRAME_HEADER:]
        at += FRAME_HEADER + page
    return bytes(out + wal[at:])


def _agrees(db: Path, wal: bytes, tmp: Path) -> int:
    frames, after = _sqlite_recovers(db, wal, tmp)
    path = tmp / "probe-wal"
    path.write_bytes(wal)
    page = struct.unpack(">I", wal[8:12])[0]
    pages = range(1, len(after) // page + 1)
    log = read_wal(str(path), set(pages))
    assert log is not None
    assert log.committed == frames
    for n, image in log.images.items():  # the last committed image of each page is SQLite's
        assert after[(n - 1) * page : n * page] == image, n
    return frames


def test_the_log_reader_counts_what_sqlite_recovery_counts_across_restarted_logs(
    tmp_path: Path,
) -> None:
    db, wal = _killed_log(tmp_path)
    frame = FRAME_HEADER + struct.unpack(">I", wal[8:12])[0]
    assert len(wal) > WAL_HEADER + 20 * frame  # the older generation's frames lie past the end
    frames = _agrees(db, wal, tmp_path)
    assert 0 < frames < (len(wal) - WAL_HEADER) // frame
    # a transaction cut after a frame that is not its commit: SQLite drops all of it
    cut = WAL_HEADER + (frames - 1) * frame
    assert _agrees(db, wal[:cut], tmp_path) < frames


def test_the_log_reader_reads_checksums_in_the_order_its_magic_number_names(
    tmp_path: Path,
) -> None:
    db, wal = _killed_log(tmp_path)
    other = _other_byte_order(wal)
    assert other[:4] != wal[:4]
    assert _agrees(db, other, tmp_path) == _agrees(db, wal, tmp_path) > 0


def test_a_server_killed_with_a_long_hot_log_across_checkpoints_recovers_every_write(
    tmp_path: Path,
) -> None:
    """The log check must never take a file's own log for another's: a restored copy whose
    first writer wrote hundreds of frames, restarting its log on the way, then was killed."""
    db = tmp_path / "agenthold.db"
    # a fresh copy: its first writer's log holds the id's page
    backed_up_store(tmp_path / "source.db", db, key="seed", value=0)
    code = (
        "import os, sys; from agenthold.store import StateStore\n"
        "s = StateStore(sys.argv[1])\n"
        "for i in range(400):\n"
        "    s.set('ns', f'k{i}', 'x' * 3000, updated_by='t')\n"
        "    if i in (100, 250):\n"
        "        s.db.fetchone('PRAGMA wal_checkpoint(TRUNCATE)')\n"
        "os._exit(0)"
    )
    assert run_python(code, db, timeout=300).returncode == 0
    wal = Path(f"{db}-wal").read_bytes()
    log = read_wal(f"{db}-wal")
    assert log is not None and log.committed > 100
    assert wal[16:24] != bytes(8)
    with StateStore(db) as store:
        assert [store.get("ns", f"k{i}").value for i in range(400)] == ["x" * 3000] * 400


def test_a_files_own_log_holding_its_id_commit_after_a_checkpoint_is_recovered(
    tmp_path: Path,
) -> None:
    """The log check's costly case: a file that has seen a writer (its id is in the file) whose
    log still holds the commit that wrote the id (checkpointed, then killed before a write
    restarted the log). Its frames name only the file's own id: the log is recovered."""
    db = tmp_path / "agenthold.db"
    backed_up_store(tmp_path / "source.db", db)
    code = (
        "import os, sys, sqlite3; from agenthold.db.sqlite import _write_database_id\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA wal_autocheckpoint = 0')\n"
        "c.execute('BEGIN IMMEDIATE'); _write_database_id(c); c.execute('COMMIT')\n"
        "c.execute('CREATE TABLE pad (x)')\n"
        "for i in range(300): c.execute('INSERT INTO pad VALUES (?)', (os.urandom(1800),))\n"
        "c.execute('PRAGMA wal_checkpoint(PASSIVE)')\n"
        "c.execute('INSERT INTO pad VALUES (1)')\n"  # after the checkpoint: only in the log
        "os._exit(0)"
    )
    assert run_python(code, db, timeout=120).returncode == 0
    with StateStore(db) as store:
        assert store.get("ns", "k").value == "backed-up"
        assert store.db.fetchone("SELECT count(*) FROM pad")[0] == 301
