"""The change feed of a SQLite file: a poller thread that hears other processes' commits.

While anyone listens, one thread per file and process looks at ``PRAGMA data_version`` when a
file event says the file may have changed (watch.py), a few more times over the next quarter
second (``FOLLOW_UPS``: the WAL is written a moment before the commit is visible), and every
``FEED_SAFETY_NET`` seconds in any case; without events, every ``POLL_INTERVAL``. When another
connection committed, it reads the new rows of each ``ChangeSource`` (a cursor per source, by
id: SQLite commits ids in order) and notifies their topics. A cursor moves only past rows
whose topics were notified, so a failed read is retried at the next look. Loaded only when a
first subscriber comes (an edit hook never waits, and never imports it).
Standard library only (the copyable store carries this module).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from agenthold.db.feed import FEED_LINGER, ChangeFeed
from agenthold.db.records import Topic
from agenthold.db.schema import ChangeSource
from agenthold.db.watch import POLL_INTERVAL, events_alive, file_events, unwatch

__all__ = ["FEED_SAFETY_NET", "FOLLOW_UPS", "SQLiteFeed"]

log = logging.getLogger("agenthold.db.sqlite_feed")

FEED_SAFETY_NET = 0.5  # seconds: with file events, the feed still looks this often
FOLLOW_UPS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128)  # looks after an event

# A connection must not be used or closed in a child process after fork(); a child keeps the
# pollers' connections it inherited here, unused, so that garbage collection never closes them.
_inherited: list[Any] = []


class SQLiteFeed(ChangeFeed):
    """The feed of one SQLite file (``uri`` None: a private in-memory database, which no other
    process can write, so nothing to poll). One feed serves every store of the process on the
    same file; ``sources`` are the change sources its databases added so far."""

    def __init__(
        self,
        uri: str | None,
        path: str | None = None,
        sources: dict[str, ChangeSource] | None = None,
    ) -> None:
        super().__init__(listens=uri is not None)
        self._uri = uri
        self._path = path  # the file whose events wake the poller; None: poll (or no poller)
        self._nudge = threading.Event()  # set by a file event: look now
        self._watch: object | None = None  # the poller's file watch, if it has one
        self._sources: dict[str, ChangeSource] = dict(sources or {})
        self._cursors: dict[str, int] = {}
        self._poll_conn: sqlite3.Connection | None = None
        self._data_version = -1

    def add_source(self, source: ChangeSource) -> None:
        with self.lock:
            if source.name in self._sources:
                return
            self._sources[source.name] = source
            if self._poll_conn is not None:
                self._cursors[source.name] = (
                    self._poll_conn.execute(source.max_sql).fetchone()[0] or 0
                )

    def start(self) -> None:
        """Open the poller's connection and set its cursors. Called with the lock held, before
        the subscriber's first check, so no commit after that check can be missed."""
        assert self._uri is not None
        # The watch begins before the first look, so every later write makes an event.
        self._nudge = nudge = threading.Event()
        self._watch = self._watch_file(nudge.set)
        try:
            if self._poll_conn is None:
                conn = sqlite3.connect(
                    self._uri, uri=True, isolation_level=None, check_same_thread=False
                )
                conn.execute("PRAGMA query_only = 1")
                self._poll_conn = conn
            conn = self._poll_conn
            self._data_version = conn.execute("PRAGMA data_version").fetchone()[0]
            for name, src in self._sources.items():
                self._cursors[name] = conn.execute(src.max_sql).fetchone()[0] or 0
        except sqlite3.Error as exc:
            log.warning(
                "change feed cannot read the database (%s); waiters rely on local commits", exc
            )
            self._unwatch()
            return
        self.runner = threading.Thread(
            target=self._poll, args=(nudge, self._watch is not None),
            name="agenthold-change-feed", daemon=True,
        )  # fmt: skip
        self.runner.start()

    def _watch_file(self, nudge: Callable[[], None]) -> object | None:
        """Ask for file events on the database; None where there are none (then poll)."""
        path = self._path
        watcher = file_events() if path is not None else None
        if path is None or watcher is None:
            return None
        try:
            return watcher.add(path, nudge)
        except Exception as exc:  # too many watches, a file system without events, ...
            log.warning("no file events for %s (%s); the change feed polls every %g s",
                        self._path, exc, POLL_INTERVAL)  # fmt: skip
            return None

    def _unwatch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            unwatch(watch)

    def _poll(self, nudge: threading.Event, events: bool) -> None:
        idle_since: float | None = None
        failures = 0
        # After an event, look again a few times: the commit that wrote the WAL may not be
        # visible yet. The watch's own start counts as one (a commit may be half written).
        follow_ups = iter(FOLLOW_UPS if events else ())
        while True:
            if failures:
                delay = min(1.0, POLL_INTERVAL * 2**failures)
            elif events and events_alive():
                delay = next(follow_ups, FEED_SAFETY_NET)
            else:
                delay = POLL_INTERVAL
            if nudge.wait(delay):
                nudge.clear()  # before the look: an event during it means look again
                follow_ups = iter(FOLLOW_UPS)
            with self.lock:
                if self.runner is not threading.current_thread():  # stopped by stop()
                    return
                if not self.subscribers:
                    now = time.monotonic()
                    idle_since = idle_since or now
                    if now - idle_since > FEED_LINGER:  # nobody listened for a while: stop
                        self.halt()
                        return
                    continue
                idle_since = None
                conn = self._poll_conn
                assert conn is not None
                # A cursor moves only past rows whose topics are notified below, and the data
                # version is remembered only once every source was read: a failed read is
                # retried at the next poll instead of waiting for another commit.
                topics: set[Topic] = set()
                try:
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                    if version != self._data_version:
                        for name, src in self._sources.items():
                            for row in conn.execute(src.since_sql, (self._cursors[name],)):
                                self._cursors[name] = max(self._cursors[name], row[0])
                                topics.update(src.topics(row))
                        self._data_version = version
                    failures = 0
                except sqlite3.Error as exc:
                    failures = min(failures + 1, 9)
                    log.warning("change feed poll failed: %s", exc)
            if topics:
                self.notify(topics)

    def halt(self) -> None:
        self.runner = None
        self._unwatch()
        self._nudge.set()  # the poller ends now rather than at its next look
        if self._poll_conn is not None:
            with suppress(sqlite3.Error):
                self._poll_conn.close()
            self._poll_conn = None

    def reset_after_fork(self) -> None:
        if self._poll_conn is not None:
            _inherited.append(self._poll_conn)
        self._watch = None  # the child has a watcher of its own, started when needed
        self._nudge = threading.Event()
        self._poll_conn = None
        super().reset_after_fork()
