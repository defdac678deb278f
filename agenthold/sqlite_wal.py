"""Reading a SQLite write-ahead log without SQLite, to tell whether it belongs to the file
beside it before any connection can apply it.

SQLite applies a `-wal` file to whatever database file stands at its name: the log names no
file, only a page size, two salts and checksums that chain from its header through its frames.
A log left by a file that a restored backup replaced is therefore replayed into the backup
("database disk image is malformed", a file that grows by the old file's pages). Asking SQLite
what the log would show is no answer either: its view of such a mix can be unreadable, or read
through a live server's shared memory. So this module reads the log the way SQLite's recovery
does (the header checksum, then every frame whose salts are the header's and whose checksum
chains, up to the last commit frame) and reports what those committed frames hold; store.py
compares that with the database id it finds in the file alone (see META_SQL there).

The format is SQLite's, documented at https://sqlite.org/fileformat2.html#walformat: a
32-byte header (magic, version, page size, checkpoint sequence, two salts, two checksums),
then frames of a 24-byte header (page number, database size in pages after a commit, else 0,
the two salts, two checksums) and one page.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Container
from dataclasses import dataclass, field

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


def read_wal(path: str, pages: Container[int] = ()) -> WalLog | None:
    """The committed contents of the log at ``path``, with the last committed image of each of
    ``pages``; None if there is no log SQLite would read (missing, shorter than its header, or
    a header that fails its checksum: SQLite then starts the log afresh). Reading 1,000 frames
    of 2 KiB takes some 40 ms; it happens once, when a process first opens a file with a log."""
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
        return found
    finally:
        os.close(fd)
