"""Lease ends that a server could not write as its clients left, kept beside the database until
a server can write them.

When a client leaves, its server ends the leases of the agents it named (after the disconnect
grace). If the database refuses that write (another process holds it locked, the disk is full),
the agents would keep their claims for good. So the server first appends the lease end, with
its deadline, to a side file, which needs no lock on the database (``defer``), and then retries
the write itself until it succeeds or its patience runs out (``server.Agenthold.end_leases``).
Every server applies the side file's lease ends when it starts and then once a minute
(``apply_pending``; ``server.PENDING_EVERY``), so a server that stays up also applies what a
killed one beside it left, and removes what it wrote. A lease end written twice is harmless: a
lease that already ends sooner is kept, and an agent seen after it left (it came back through
another server) is left alone.

Where the side file is: beside a SQLite file (``agenthold.db-disconnects``, in the directory
that holds its WAL anyway); for PostgreSQL, in this user's state directory, one file per
database URL, so it is applied by the next server on the same host.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Iterable
from typing import Any

from agenthold.claims.coordinator import Coordinator
from agenthold.store import AgentholdError, Database, utc_iso

__all__ = ["Deferred", "apply_pending", "defer", "pending_path"]

log = logging.getLogger("agenthold.claims.pending")

Deferred = dict[str, Any]  # {"agent_id", "left_at", "ends_at", "outcome"}: one JSON line


def pending_path(db: Database) -> str | None:
    """The side file of ``db``'s lease ends not written yet (None for ':memory:'): beside a
    SQLite file, in the user's state directory for a server's database (the backend's
    ``side_file``)."""
    return db.side_file("disconnects")


def defer(db: Database, agents: Iterable[str], grace: float, left_at: float) -> str | None:
    """Append the lease ends of ``agents`` (``grace`` seconds after ``left_at``, the database
    clock's time they left) to the side file; returns its path, or None if it cannot be
    written either (the disk is full)."""
    path = pending_path(db)
    if path is None:
        return None
    lines = "".join(
        json.dumps({"agent_id": a, "left_at": left_at, "ends_at": left_at + grace,
                    "outcome": "abandoned"}) + "\n"
        for a in agents
    )  # fmt: skip
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600
        )
        try:
            os.write(fd, lines.encode())  # one append: lines of two servers never interleave
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("could not record the lease ends for later either (%s): %s", path, exc)
        return None
    return path


def apply_pending(coordinator: Coordinator) -> int:
    """Write the lease ends the side file holds, and remove them from it; returns how many were
    written. Those the database still refuses stay for the next server. The file is taken by a
    rename first, so two servers starting together never apply one line twice or lose one."""
    db = coordinator.db
    path = pending_path(db)
    if path is None or db.read_only:
        return 0
    return sum(_apply_file(coordinator, path, taken) for taken in _take(path))


def _take(path: str) -> list[str]:
    """The side file, and any that a server killed while applying it left taken, each renamed
    to a name of this process's own (one rename decides which server applies a file)."""
    directory, base = os.path.split(path)
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    taken = []
    for name in names:
        orphan = _TAKEN.fullmatch(name[len(base) :]) if name.startswith(base) else None
        if name != base and (orphan is None or _alive(int(orphan.group(1)))):
            continue
        mine = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(os.path.join(directory, name), mine)
        except OSError:
            continue  # another server took it a moment ago
        taken.append(mine)
    return taken


_TAKEN = re.compile(r"\.(\d+)-[0-9a-f]{8}")  # the suffix of a side file a server has taken


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _apply_file(coordinator: Coordinator, path: str, taken: str) -> int:
    """Apply one taken side file, putting back (at ``path``) what the database refused."""
    db = coordinator.db
    with open(taken, encoding="utf-8", errors="replace") as f:
        records = [_parse(line) for line in f]
    left: list[Deferred] = []
    done = 0
    for record in filter(None, records):
        try:
            done += _apply(coordinator, record)
        except AgentholdError as exc:
            log.warning("could not end the lease of %s yet: %s", record["agent_id"], exc)
            left.append(record)
    if left:
        for record in left:
            defer(
                db, [record["agent_id"]], record["ends_at"] - record["left_at"], record["left_at"]
            )
    with contextlib.suppress(OSError):
        os.unlink(taken)
    return done


def _apply(coordinator: Coordinator, record: Deferred) -> int:
    row = coordinator.db.fetchone(
        "SELECT last_seen_at FROM agents WHERE agent_id = ?", (record["agent_id"],)
    )
    if row is None or str(row[0]) > utc_iso(record["left_at"]):  # ISO times sort as times
        return 0  # gone, or seen since it left: its lease is its own business again
    now = coordinator.db.now()
    coordinator.end_lease(record["agent_id"], max(0.0, record["ends_at"] - now), record["outcome"])
    return 1


def _parse(line: str) -> Deferred | None:
    """One line of the side file, or None if it is not one (a torn last line, say)."""
    try:
        record = json.loads(line)
        if (
            isinstance(record, dict)
            and isinstance(record.get("agent_id"), str)
            and all(isinstance(record.get(k), (int, float)) for k in ("left_at", "ends_at"))
            and record.get("outcome") in ("abandoned", "expired")
        ):
            return record
    except ValueError:
        pass
    return None


def clock(db: Database) -> float:
    """The database's clock if it answers, else (it may be down) its estimate from the last
    reading: never this host's wall clock, which may disagree with the database's."""
    try:
        return db.now()
    except AgentholdError:
        return db.clock.estimate()
