"""The change feed's base: who listens to which topics, and waking them.

A backend's feed is a ``ChangeFeed``: commits made through this process call ``notify``
directly, and a backend hears other processes' commits its own way (SQLite: a poller woken by
file events, ``sqlite_feed.py``; PostgreSQL: a LISTEN connection). The base owns the
subscribers and their topics; a subclass overrides only the public hooks ``start`` (a first
subscriber came and no runner is on), ``halt`` (end the runner) and ``reset_after_fork``, and
reads ``lock``, ``runner`` and ``subscribers``. A callback runs on the notifier's thread, so it
must be quick (set an event, schedule a task); one that fails is logged, never raised into the
writer. Standard library only (the copyable store carries this module).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from agenthold.db.records import Topic

__all__ = ["FEED_LINGER", "ChangeFeed", "FeedSubscription"]

log = logging.getLogger("agenthold.db.feed")

FEED_LINGER = 1.0  # seconds a feed's runner goes on after the last subscriber left


class FeedSubscription:
    """What ``ChangeFeed.subscribe`` returns: change its topics, or close it (also on exit)."""

    __slots__ = ("callback", "closed", "feed", "topics")

    def __init__(
        self, feed: ChangeFeed, topics: frozenset[Topic] | None, callback: Callable[[], None]
    ) -> None:
        self.feed = feed
        self.topics = topics
        self.callback = callback
        self.closed = False

    def update(self, topics: Iterable[Topic] | None) -> None:
        """Listen to other topics from now on (None: every change)."""
        self.feed._retopic(self, None if topics is None else frozenset(topics))

    def close(self) -> None:
        self.feed._remove(self)

    def __enter__(self) -> FeedSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChangeFeed:
    """Wakes subscribers when a topic they listen to changes. ``listens`` False (a private
    in-memory database) never starts a runner: only this process's commits exist."""

    def __init__(self, *, listens: bool = True) -> None:
        self.listens = listens
        self.lock = threading.Lock()
        self.runner: threading.Thread | None = None  # what hears other processes, while on
        self._by_topic: dict[Topic, set[FeedSubscription]] = {}
        self._everything: set[FeedSubscription] = set()
        self._count = 0

    @property
    def subscribers(self) -> int:
        """How many subscriptions are open (read with ``lock`` held to act on it)."""
        return self._count

    def subscribe(
        self, topics: Iterable[Topic] | None, callback: Callable[[], None]
    ) -> FeedSubscription:
        """Call ``callback`` whenever one of ``topics`` changes (None: every change)."""
        sub = FeedSubscription(self, None if topics is None else frozenset(topics), callback)
        with self.lock:
            self._attach(sub)
            self._count += 1
            if self.listens and self.runner is None:
                self.start()
        return sub

    def start(self) -> None:
        """Hook: start hearing other processes' commits (set ``runner``). Called with ``lock``
        held, before the first subscriber's first look, so no commit after it is missed."""

    def halt(self) -> None:
        """Hook: end the runner (called with ``lock`` held). A runner ends once ``runner`` is
        no longer its own thread."""
        self.runner = None

    def stop(self) -> None:
        """End the runner: the last database of this process on it has closed."""
        with self.lock:
            self.halt()

    def _attach(self, sub: FeedSubscription) -> None:
        if sub.topics is None:
            self._everything.add(sub)
        else:
            for t in sub.topics:
                self._by_topic.setdefault(t, set()).add(sub)

    def _detach(self, sub: FeedSubscription) -> None:
        if sub.topics is None:
            self._everything.discard(sub)
        else:
            for t in sub.topics:
                subs = self._by_topic.get(t)
                if subs is not None:
                    subs.discard(sub)
                    if not subs:
                        del self._by_topic[t]

    def _retopic(self, sub: FeedSubscription, topics: frozenset[Topic] | None) -> None:
        with self.lock:
            if sub.closed:
                return
            self._detach(sub)
            sub.topics = topics
            self._attach(sub)

    def _remove(self, sub: FeedSubscription) -> None:
        with self.lock:
            if sub.closed:
                return
            sub.closed = True
            self._detach(sub)
            self._count -= 1

    def notify(self, topics: Iterable[Topic]) -> None:
        """Wake the subscribers of ``topics`` (and those of every change)."""
        if not self._count:
            return
        with self.lock:
            woken = set(self._everything)
            for t in topics:
                subs = self._by_topic.get(t)
                if subs:
                    woken.update(subs)
        for sub in woken:
            try:
                sub.callback()
            except Exception:  # a subscriber's bug must not break the writer
                log.exception("change callback failed")

    def wake_all(self) -> None:
        """Wake every subscriber to look again (after a time the feed may have been deaf)."""
        with self.lock:
            topics = list(self._by_topic)
        self.notify(topics)

    def reset_after_fork(self) -> None:
        """In a forked child: no subscriber, no runner, a new lock (a subclass drops what it
        inherited first, then calls this)."""
        self.lock = threading.Lock()
        self._by_topic.clear()
        self._everything.clear()
        self._count = 0
        self.runner = None
