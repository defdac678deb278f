"""Reading a SQLite write-ahead log without SQLite, and telling whose log and file it is.

SQLite applies a -wal file to whatever database file stands at its name: the log names no
file. A log left by a file that a restored backup replaced would be replayed into the backup,
and asking SQLite what the log would show is no answer (its view of such a mix can be
unreadable, or read through a live server's shared memory). So the SQLite backend reads the
log here as SQLite's recovery does (``read_wal``), reads the file's database id from the file
alone (``file_alone``), and asks the POSIX locks SQLite holds who else has the log or the file
open (``wal_alone``, ``opened_by_another_process``). Standard library only.
"""

from __future__ import annotations

import os
import re
import sqlite3
import struct
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from agenthold.db.schema import DATABASE_ID_SQL, FRESH, ID_PREFIX

__all__ = [
    "FRAME_HEADER",
    "WAL_HEADER",
    "WalLog",
    "file_alone",
    "log_is_foreign",
    "names_another_id",
    "opened_by_another_process",
    "posix_locks",
    "quote_path",
    "read_database_id",
    "read_wal",
    "wal_alone",
]

# and one page.
WAL_HEADER = 32
FRAME_HEADER = 24
WAL_VERSION = 3007000
MAGIC_LITTLE, MAGIC_BIG = 0x377F0682, 0x377F0683  # the byte order of the checksums
_MASK = 0xFFFFFFFF


@dataclass
class WalLog:
    """What SQLite's recovery would take from a log: its page size, how many committed frames
    it has, and the last committed image of each page asked for."""

    page_size: int
    committed: int = 0
    images: dict[int, bytes] = field(default_factory=dict)


def _checksum(data: bytes, s1: int, s2: int, big: bool) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big else '<'}{len(data) // 4}I", data)
    it = iter(words)
    for x0, x1 in zip(it, it, strict=True):
        s1 = (s1 + x0 + s2) & _MASK
        s2 = (s2 + x1 + s1) & _MASK
    return s1, s2


def read_wal(
    path: str,
    pages: Container[int] = (),
    *,
    first_commit: bool = False,
    written: int = 0,
    telling: Callable[[bytes], bool] | None = None,
) -> WalLog | None:
    """The committed contents of the log at ``path``, with the last committed image of each of
    ``pages``; None if there is no log SQLite would read (missing, shorter than its header, or
    a header that fails its checksum: SQLite then starts the log afresh). Checksums cost some
    40 ms per 1,000 frames of 2 KiB, so: ``first_commit`` stops at the first commit frame
    (its transaction is all a fresh file's check needs), and ``written``, a page number,
    returns an empty log at once unless a frame of the log's current salts writes that page
    (a look at the frame headers alone), and with ``telling`` too, unless that frame's image is
    one ``telling`` accepts (unverified images: a filter before the checksums, never a verdict;
    a server's log that outgrew its checkpoints can be tens of thousands of frames, a second of
    checksums on every open)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        header = os.pread(fd, WAL_HEADER, 0)
        if len(header) < WAL_HEADER:
            return None
        magic, version, page_size, _, salt1, salt2, c1, c2 = struct.unpack(">8I", header)
        big = magic == MAGIC_BIG
        valid_size = page_size >= 512 and page_size <= 65536 and page_size & (page_size - 1) == 0
        if magic not in (MAGIC_LITTLE, MAGIC_BIG) or version != WAL_VERSION or not valid_size:
            return None
        s1, s2 = _checksum(header[:24], 0, 0, big)
        if (s1, s2) != (c1, c2):
            return None
        found = WalLog(page_size)
        if written and not _frame_writes(fd, page_size, salt1, salt2, written, telling):
            return found
        pending: dict[int, bytes] = {}  # images of the transaction not yet committed
        offset, frame = WAL_HEADER, 0
        while True:
            data = os.pread(fd, FRAME_HEADER + page_size, offset)
            if len(data) < FRAME_HEADER + page_size:
                break
            page, db_size, f1, f2, fc1, fc2 = struct.unpack(">6I", data[:FRAME_HEADER])
            if (f1, f2) != (salt1, salt2) or page == 0:
                break
            s1, s2 = _checksum(data[:8], s1, s2, big)
            s1, s2 = _checksum(data[FRAME_HEADER:], s1, s2, big)
            if (s1, s2) != (fc1, fc2):
                break
            frame += 1
            offset += FRAME_HEADER + page_size
            if page in pages:
                pending[page] = data[FRAME_HEADER:]
            if db_size:  # a commit frame: its transaction, and those before it, count
                found.committed = frame
                found.images.update(pending)
                pending.clear()
                if first_commit:
                    break
        return found
    finally:
        os.close(fd)


def _frame_writes(
    fd: int,
    page_size: int,
    salt1: int,
    salt2: int,
    page: int,
    telling: Callable[[bytes], bool] | None = None,
) -> bool:
    """Whether a frame of the log open at ``fd`` with the header's salts writes ``page`` (with
    ``telling``: an image of it that ``telling`` accepts)."""
    offset = WAL_HEADER
    while True:
        head = os.pread(fd, FRAME_HEADER, offset)
        if len(head) < FRAME_HEADER:
            return False
        number, _, f1, f2 = struct.unpack(">4I", head[:16])
        if (f1, f2) != (salt1, salt2):
            return False
        if number == page and (
            telling is None or telling(os.pread(fd, page_size, offset + FRAME_HEADER))
        ):
            return True
        offset += FRAME_HEADER + page_size


def file_alone(real: str) -> tuple[str, int, int] | None:
    """The database id in the file at ``real`` itself (its write-ahead log not read), the page
    that holds it and the file's page size; None for a file without an id, or unreadable."""
    try:
        conn = sqlite3.connect(f"file:{quote_path(real)}?immutable=1", uri=True)
        try:
            row = conn.execute(
                "SELECT rootpage, (" + DATABASE_ID_SQL + ") FROM sqlite_master "
                "WHERE type = 'table' AND name = 'agenthold_meta'"
            ).fetchone()
            size = conn.execute("PRAGMA page_size").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    if row is None or not isinstance(row[1], str):
        return None
    return row[1], int(row[0]), int(size)


_ID_BYTES = re.compile(re.escape(ID_PREFIX).encode() + rb"[0-9a-f]{32}")


def names_another_id(alone: tuple[str, int, int]) -> Callable[[bytes], bool]:
    """Whether a page image names an id other than the file's: only a log one of whose images
    does can be foreign to a file that has seen a writer (see log_is_foreign)."""
    own = alone[0].removesuffix(FRESH).encode()
    return lambda image: any(m.group() != own for m in _ID_BYTES.finditer(image))


def log_is_foreign(wal: WalLog, alone: tuple[str, int, int]) -> bool:
    """Whether the committed frames of ``wal`` cannot be those of the file whose id, id page
    and page size are ``alone`` (see _check_wal)."""
    database_id, id_page, page_size = alone
    if wal.page_size != page_size:
        return True  # one file's pages are all of one size, in the file and in its log
    image = wal.images.get(id_page)
    found = _ID_BYTES.search(image) if image is not None else None
    if found is not None:  # the log rewrites the id's page: it must say the same id
        return found.group().decode() != database_id.removesuffix(FRESH)
    # (a page without an id proves nothing: another tool may have dropped the table.) A fresh
    # file has seen no writer: the only commit of its own would have written its id
    return database_id.endswith(FRESH)


def read_database_id(uri: str) -> str | None:
    """The database id of the file at ``uri`` (None: it has none, or it cannot be read)."""
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            row = conn.execute(DATABASE_ID_SQL).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return row[0] if row is not None and isinstance(row[0], str) else None


SHM_DMS_BYTE = 128  # the byte of the -shm file every SQLite connection of a WAL holds shared


def wal_alone(real: str) -> int | None:
    """A descriptor of ``real``'s -shm file holding its dead-man's-switch byte exclusively, if
    no other process has the WAL open (each SQLite connection holds that byte shared, and
    this process's own locks never conflict with it); None if another does, or where POSIX
    locks are not available."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None
    try:
        fd = os.open(real + "-shm", os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, SHM_DMS_BYTE)
    except OSError:
        os.close(fd)
        return None
    return fd


# SQLite's unix locks on a database file: every connection of a WAL database holds a read
# lock on the SHARED range for as long as it is open (its last one to close takes the whole
# file exclusively to know it is the last).
SQLITE_SHARED_FIRST = 0x40000000 + 2
SQLITE_SHARED_SIZE = 510


def opened_by_another_process(real: str) -> bool:
    """Whether the log beside a restored copy at ``real`` that holds no commit is held by a
    process that has this very file open, not only one on the file it replaced. Another
    process's SQLite connection on this inode holds its SHARED range; one on a file moved away
    holds that other inode's. Such a process opened the copy through _check_wal, which refused
    it while a server of the old file held the log; so the log is the copy's. Not while a
    process holds the -shm file's dead-man's-switch byte exclusively (a server emptying the
    old log as it exits: the log is not settled), nor where this cannot be told (no POSIX
    locks, a file this process may not write): False, and the caller refuses as before. A
    server of the old file shares this inode when the copy was written over it in place (cp);
    its log is then older than the copy (its writes since are refused by its own checks),
    where a reader of the copy made the log after the copy (a tie of timestamps refuses)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return False
    flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
    try:  # no store of this process has this file open (stores == 0): no lock of ours drops
        fd = os.open(real, flags)
    except OSError:
        return False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, SQLITE_SHARED_SIZE, SQLITE_SHARED_FIRST)
        except OSError:
            pass  # someone holds it: the answer, unless the log is being emptied
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN, SQLITE_SHARED_SIZE, SQLITE_SHARED_FIRST)
            return False
    finally:
        os.close(fd)
    try:  # a log older than the copy is the old file's: its server shares a copy made in place
        if os.stat(real + "-wal").st_ctime_ns <= os.stat(real).st_ctime_ns:
            return False
        shm = os.open(real + "-shm", flags)
    except OSError:
        return False
    try:
        fcntl.lockf(shm, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, SHM_DMS_BYTE)
    except OSError:
        return False  # held exclusively: a process is emptying the log or closing it
    finally:
        os.close(shm)
    return True


def posix_locks() -> bool:
    """Whether this platform has the POSIX locks that wal_alone tests."""
    try:
        import fcntl  # noqa: F401
    except ImportError:  # pragma: no cover - Windows
        return False
    return True


def quote_path(path: str) -> str:
    return path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")
