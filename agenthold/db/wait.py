"""Waiting on the change feed: the database's clock, ``Waiter`` and ``wait_until``.

Every wait in agenthold (``StateStore.watch``, ``Coordinator.wait``, the MCP server's async
waits) is a loop that looks at the database, listens to the topics the look depended on, and
sleeps until a commit to one of them wakes it, its deadline, or a time on the database's clock
(a holder's lease end). Two clocks, never compared: a timeout is this host's monotonic clock,
a stored instant is the database's, mapped onto the monotonic clock by ``base.DatabaseClock``.
Standard library only (the copyable store carries this module).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from agenthold.db.base import Database, DatabaseClock
from agenthold.db.records import Topic

__all__ = ["Waiter", "wait_until"]


class Waiter:
    """One wait on the change feed, the mechanism behind every wait in agenthold
    (``StateStore.watch``, ``Coordinator.wait``, the MCP server's async waits): it listens to
    the topics the waiter's last look named and says how long to sleep before the next look.

    A loop looks at the database, passes the topics it depends on to ``listen`` (True means
    they changed, so look again: a commit may have come between the look and the subscription),
    then sleeps for ``pause()`` seconds, or until ``wake`` is called (from any thread) by a
    commit to one of those topics. ``pause`` is None once the deadline has passed. See
    ``wait_until`` for the blocking form; an async form only swaps the sleep.
    """

    __slots__ = ("_clock", "_subscription", "_topics", "deadline", "start")

    def __init__(
        self,
        db: Database,
        timeout: float,
        wake: Callable[[], None],
        topics: Iterable[Topic] = (),
    ) -> None:
        # two clocks, never compared with each other: the timeout is this host's (monotonic),
        # a wake_at is the database's (see DatabaseClock)
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self._clock: DatabaseClock = db.clock
        self._topics = frozenset(topics)
        self._subscription = db.subscribe(self._topics, wake)

    @property
    def elapsed(self) -> float:
        """Seconds since the wait began, rounded to the millisecond (as replies show it)."""
        return round(time.monotonic() - self.start, 3)

    def listen(self, topics: Iterable[Topic]) -> bool:
        """Listen to ``topics`` from now on; True if they differ from the last ones."""
        wanted = frozenset(topics)
        if wanted == self._topics:
            return False
        self._subscription.update(wanted)
        self._topics = wanted
        return True

    def pause(self, wake_at: float | None = None) -> float | None:
        """Seconds to sleep before looking again: until the deadline, or until ``wake_at`` (a
        unix time on the database's clock, say a holder's lease end) if that comes first; None
        once the deadline has passed."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return None
        if wake_at is not None:
            remaining = min(remaining, max(0.0, self._clock.until(wake_at)) + 0.001)
        return remaining

    def due(self, wake_at: float | None) -> bool:
        """Whether ``wake_at`` (the database's clock, or None: never) has come."""
        return wake_at is not None and self._clock.until(wake_at) <= 0

    def close(self) -> None:
        self._subscription.close()

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(
    db: Database,
    look: Callable[[], tuple[Any, Iterable[Topic], float | None]],
    timeout: float,
    topics: Iterable[Topic] = (),
) -> Any:
    """Call ``look`` until it returns something other than None, or ``timeout`` seconds pass
    (then None), blocking this thread in between on the change feed (see ``Waiter``). ``look``
    returns (what it found or None, the topics to listen to, a unix time on the database's
    clock to look again at, or None); ``topics`` are listened to before the first look."""
    woken = threading.Event()
    with Waiter(db, timeout, woken.set, topics) as waiter:
        while True:
            woken.clear()
            found, wanted, wake_at = look()
            if found is not None:
                return found
            if waiter.listen(wanted):
                continue
            pause = waiter.pause(wake_at)
            if pause is None:
                return None
            woken.wait(pause)
