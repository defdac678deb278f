"""File-system events: the hint that another process may have committed to a SQLite file.

One watcher per process (the kernel allows a user few inotify instances), read by one daemon
thread: inotify on Linux, kqueue on macOS and the BSDs, both through the standard library
(ctypes for inotify, imported only when the first feed starts). A watch is on the database's
directory (kqueue: also on its WAL), never on the database file itself (closing a descriptor
drops this process's POSIX locks on that file, SQLite's included). An event is only a hint:
the feed then reads the tables. Where there are no events, the feed polls.
Standard library only (the copyable store carries this module).
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, NamedTuple

__all__ = ["FILE_EVENTS_VARIABLE", "POLL_INTERVAL", "events_alive", "file_events", "unwatch"]

log = logging.getLogger("agenthold.db.watch")

# What a forked child inherited and must never close (a kqueue's number may be reused there).
_inherited: list[Any] = []


# The change feed learns of another process's commit from an event on the database's files
# (inotify on Linux, kqueue on macOS and the BSDs), then checks ``PRAGMA data_version`` as a
# poll would: the tables are the truth, an event only says when to look. Events come when the
# WAL is written, which is a moment before the commit is visible to readers (SQLite updates the
# shared-memory index after the write), so after an event the feed looks again a few times over
# the next quarter second (sqlite_feed.FOLLOW_UPS), and every FEED_SAFETY_NET seconds. Without
# events (another platform, a failure to set them up, or FILE_EVENTS_VARIABLE set to "off") the
# feed polls every POLL_INTERVAL as before.
POLL_INTERVAL = 0.002  # how often a feed without file events looks for other processes' commits
FILE_EVENTS_VARIABLE = "AGENTHOLD_FILE_EVENTS"  # "off": no file events, poll (tests use it)


def _file_names(path: str) -> tuple[str, str, frozenset[str]]:
    """The directory of the database at ``path`` and the names there whose changes matter:
    the file itself (checkpoints, rollback-journal commits, a replacement), its WAL and its
    rollback journal (not the -shm file, which SQLite changes through shared memory)."""
    directory, name = os.path.split(path)
    return directory or ".", name, frozenset((name, f"{name}-wal", f"{name}-journal"))


class _InotifyWatch(NamedTuple):
    wd: int
    names: frozenset[str]
    nudge: Callable[[], None]


class _Inotify:
    """One inotify instance for the whole process (the kernel allows a user only a few, 128 by
    default), read by one daemon thread. Each database's directory is watched, not its files:
    that also sees a WAL created after the watch began, a WAL removed and a file replaced by a
    rename. Reads make no events, so waiting readers do not wake each other."""

    kind = "inotify"
    alive = True  # False once its thread failed
    IN_MODIFY, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x2, 0x40, 0x80, 0x100, 0x200
    IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = (
        0x400, 0x800, 0x2000, 0x4000, 0x8000)  # fmt: skip
    IN_ONLYDIR, IN_CLOEXEC = 0x1000000, 0o2000000
    MASK = (IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
            | IN_MOVE_SELF | IN_ONLYDIR)  # fmt: skip
    EVERYONE = IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT

    def __init__(self) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        self._init = libc.inotify_init1
        self._add = libc.inotify_add_watch
        self._rm = libc.inotify_rm_watch
        self._init.argtypes = [ctypes.c_int]
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
        self._errno = ctypes.get_errno
        fd = self._init(self.IN_CLOEXEC)
        if fd < 0:
            raise self._error("inotify_init1")
        self._fd = fd
        self._lock = threading.Lock()
        self._dirs: dict[int, dict[str, set[Callable[[], None]]]] = {}  # wd: name: nudges
        threading.Thread(target=self._run, name="agenthold-file-events", daemon=True).start()

    def _error(self, call: str) -> OSError:
        number = self._errno()
        return OSError(number, f"{call}: {os.strerror(number)}")

    def add(self, path: str, nudge: Callable[[], None]) -> object:
        """Call ``nudge`` (from the reader thread) whenever the database at ``path`` may have
        changed; returns what ``remove`` takes."""
        directory, _, names = _file_names(path)
        with self._lock:
            wd = self._add(self._fd, os.fsencode(directory), self.MASK)
            if wd < 0:
                raise self._error(f"inotify_add_watch {directory!r}")
            by_name = self._dirs.setdefault(wd, {})
            for name in names:
                by_name.setdefault(name, set()).add(nudge)
        return _InotifyWatch(wd, names, nudge)

    def remove(self, handle: object) -> None:
        assert isinstance(handle, _InotifyWatch)
        wd, names, nudge = handle
        with self._lock:
            by_name = self._dirs.get(wd)
            if by_name is None:
                return
            for name in names:
                nudges = by_name.get(name)
                if nudges is not None:
                    nudges.discard(nudge)
                    if not nudges:
                        del by_name[name]
            if not by_name:
                del self._dirs[wd]
                self._rm(self._fd, wd)  # may fail if the directory is gone: nothing to undo

    def _run(self) -> None:
        _read_events(self, self._read)

    def _read(self) -> set[Callable[[], None]]:
        """Block for the next events; the nudges they call for."""
        data = os.read(self._fd, 65536)
        woken: set[Callable[[], None]] = set()
        with self._lock:
            offset = 0
            while offset + 16 <= len(data):
                wd, mask, _, size = struct.unpack_from("iIII", data, offset)
                name = os.fsdecode(data[offset + 16 : offset + 16 + size].rstrip(b"\0"))
                offset += 16 + size
                if wd == -1:  # the queue overflowed: events were lost
                    for by_name in self._dirs.values():
                        woken.update(*by_name.values())
                elif mask & self.EVERYONE:  # the directory itself went
                    woken.update(*self._dirs.get(wd, {}).values())
                    if mask & self.IN_IGNORED:  # the watch is gone with it
                        self._dirs.pop(wd, None)
                else:
                    woken.update(self._dirs.get(wd, {}).get(name, ()))
        return woken

    def nudges(self) -> set[Callable[[], None]]:
        with self._lock:
            return {n for by_name in self._dirs.values() for ns in by_name.values() for n in ns}

    def close_in_child(self) -> None:
        with suppress(OSError):
            os.close(self._fd)


class _KqueueWatch:  # pragma: no cover - macOS and the BSDs only; CI runs Linux
    __slots__ = ("dir_fd", "directory", "nudge", "wal", "wal_fd", "wal_id")

    def __init__(self, directory: str, wal: str, dir_fd: int, nudge: Callable[[], None]):
        self.directory = directory
        self.wal = wal
        self.dir_fd = dir_fd
        self.wal_fd = -1
        self.wal_id: tuple[int, int] | None = None
        self.nudge = nudge


class _Kqueue:  # pragma: no cover - macOS and the BSDs only; CI runs Linux
    """One kqueue for the whole process (macOS and the BSDs), read by one daemon thread. kqueue
    watches open files, so each database gets two: its directory (a WAL created or removed, a
    file replaced) and its WAL (every commit writes it), reopened whenever the directory changes.
    The database file itself is never opened: closing a descriptor of a file drops every POSIX
    lock this process holds on it, SQLite's among them. Nothing locks the WAL."""

    kind = "kqueue"
    alive = True  # False once its thread failed

    def __init__(self) -> None:
        import select

        self._select: Any = select  # typed loosely: mypy on Linux does not know kqueue
        self._kq = self._select.kqueue()
        self._lock = threading.Lock()
        self._by_fd: dict[int, _KqueueWatch] = {}
        self._evtonly = getattr(os, "O_EVTONLY", os.O_RDONLY)  # does not keep a volume busy
        threading.Thread(target=self._run, name="agenthold-file-events", daemon=True).start()

    def _register(self, fd: int, watch: _KqueueWatch) -> None:
        s = self._select
        flags = s.KQ_NOTE_WRITE | s.KQ_NOTE_EXTEND | s.KQ_NOTE_ATTRIB | s.KQ_NOTE_DELETE
        flags |= s.KQ_NOTE_RENAME | s.KQ_NOTE_REVOKE
        event = s.kevent(fd, s.KQ_FILTER_VNODE, s.KQ_EV_ADD | s.KQ_EV_CLEAR, flags)
        self._kq.control([event], 0, 0)
        self._by_fd[fd] = watch

    def add(self, path: str, nudge: Callable[[], None]) -> object:
        directory, name, _ = _file_names(path)
        dir_fd = os.open(directory, self._evtonly)
        watch = _KqueueWatch(directory, os.path.join(directory, f"{name}-wal"), dir_fd, nudge)
        with self._lock:
            try:
                self._register(dir_fd, watch)
            except OSError:
                os.close(dir_fd)
                raise
            self._follow_wal(watch)
        return watch

    def _follow_wal(self, watch: _KqueueWatch) -> None:
        """Watch the WAL now at the path (a new one after a removal); called with the lock."""
        try:
            st = os.stat(watch.wal)
            wal_id: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            wal_id = None
        if wal_id == watch.wal_id and (wal_id is None or watch.wal_fd >= 0):
            return
        self._drop_wal(watch)
        if wal_id is None:
            return
        try:
            fd = os.open(watch.wal, self._evtonly)
        except OSError:  # removed meanwhile: the directory's event comes
            return
        try:
            self._register(fd, watch)
        except OSError:
            os.close(fd)
            return
        watch.wal_fd, watch.wal_id = fd, wal_id

    def _drop_wal(self, watch: _KqueueWatch) -> None:
        if watch.wal_fd >= 0:
            self._by_fd.pop(watch.wal_fd, None)
            with suppress(OSError):
                os.close(watch.wal_fd)  # closing a descriptor ends its kqueue watch
        watch.wal_fd, watch.wal_id = -1, None

    def remove(self, handle: object) -> None:
        assert isinstance(handle, _KqueueWatch)
        with self._lock:
            self._drop_wal(handle)
            if self._by_fd.pop(handle.dir_fd, None) is not None:
                with suppress(OSError):
                    os.close(handle.dir_fd)

    def _run(self) -> None:
        _read_events(self, self._read)

    def _read(self) -> set[Callable[[], None]]:
        events = self._kq.control(None, 64, None)
        woken: set[Callable[[], None]] = set()
        with self._lock:
            for event in events:
                watch = self._by_fd.get(event.ident)
                if watch is None:  # removed since the event came
                    continue
                if event.ident == watch.dir_fd or event.fflags & (
                    self._select.KQ_NOTE_DELETE | self._select.KQ_NOTE_RENAME
                ):
                    self._follow_wal(watch)
                woken.add(watch.nudge)
        return woken

    def nudges(self) -> set[Callable[[], None]]:
        with self._lock:
            return {watch.nudge for watch in self._by_fd.values()}

    def close_in_child(self) -> None:
        # The descriptors of files are inherited by a child of fork(), a kqueue is not: its
        # number may be reused there, so the object is kept, never closed (see _inherited).
        for fd in list(self._by_fd):
            with suppress(OSError):
                os.close(fd)
        _inherited.append(self._kq)


def _read_events(watcher: _Inotify | _Kqueue, read: Callable[[], set[Callable[[], None]]]) -> None:
    """The watcher thread: call the nudges of each batch of events. If reading ever fails, the
    watcher is dead: every feed is nudged and polls every POLL_INTERVAL from then on."""
    try:
        while True:
            for nudge in read():
                nudge()
    except Exception as exc:  # a closed descriptor, a bug: never a silent loss of wake-ups
        watcher.alive = False
        log.warning("file events stopped (%s); the change feed polls every %g s",
                    exc, POLL_INTERVAL)  # fmt: skip
        for nudge in watcher.nudges():
            nudge()


_watcher: _Inotify | _Kqueue | None = None
_watcher_tried = False
_watcher_lock = threading.Lock()


def events_alive() -> bool:
    """Whether file events still come (the watcher thread has not failed)."""
    return _watcher is not None and _watcher.alive


def file_events() -> _Inotify | _Kqueue | None:
    """This process's file-event watcher, started on first use; None where there are none."""
    global _watcher, _watcher_tried
    if os.environ.get(FILE_EVENTS_VARIABLE, "").strip().lower() in ("off", "0", "no", "false"):
        return None
    with _watcher_lock:
        if not _watcher_tried:
            _watcher_tried = True
            try:
                if sys.platform.startswith("linux"):
                    _watcher = _Inotify()
                elif sys.platform == "darwin" or "bsd" in sys.platform:
                    _watcher = _Kqueue()
            except Exception as exc:  # no inotify in this libc, a kernel without it, ...
                log.warning("no file events (%s); the change feed polls every %g s",
                            exc, POLL_INTERVAL)  # fmt: skip
        return _watcher


def unwatch(handle: object) -> None:
    """End a watch that ``file_events().add`` returned."""
    if _watcher is not None:
        _watcher.remove(handle)


def _after_fork_in_child() -> None:
    # the watcher's thread does not survive fork(): the child starts its own when needed
    global _watcher, _watcher_lock, _watcher_tried
    if _watcher is not None:
        _watcher.close_in_child()
    _watcher, _watcher_tried, _watcher_lock = None, False, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
