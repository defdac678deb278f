"""The seam: what every backend provides (``Database``) and the connection it hands out.

Components (the store, claims, the message bus, retention) speak to a ``Database`` and to the
``Connection`` its ``snapshot`` and ``write`` yield, never to a driver: SQL with ``?``
placeholders in the syntax both engines accept, rows as tuples, errors as AgentholdErrors.
What differs between engines (DDL, pragmas, locks, the change feed, error translation, text a
driver cannot decode) is each backend's own: ``sqlite.py`` and ``postgres.py``, found by the
scheme of a URL in ``backends.py``. ``DatabaseClock`` is here too: every backend feeds one.
Standard library only (the copyable store carries this module).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from agenthold.db.records import Topic
from agenthold.db.schema import Adoption, ChangeSource, Component

__all__ = ["Connection", "Cursor", "Database", "DatabaseClock", "LazyLogger", "Subscription"]


class LazyLogger:
    """A module's logger, made on its first message: importing logging costs a few
    milliseconds, and an edit hook (a fresh process per edit, which opens a SQLite file and
    logs nothing) should not pay them."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import logging

        return getattr(logging.getLogger(self._name), attr)


class Cursor(Protocol):
    """The result of ``Connection.execute``: rows as tuples."""

    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What ``Database.snapshot`` and ``Database.write`` yield. ``fetchall`` is
    ``execute(sql, params).fetchall()``, except that a stored text the driver cannot decode
    (bytes that are not UTF-8, which SQLite keeps) comes back as ``records.UndecodableText``
    instead of failing the whole read: only that row's value is damaged."""

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor: ...
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> object: ...
    def fetchall(self, sql: str, params: Sequence[Any] = (), /) -> list[Any]: ...


class DatabaseClock:
    """How this host's monotonic clock maps onto its database's clock, so that a wait can sleep
    until a time on the database's clock (a holder's lease end) without comparing it with this
    host's wall clock, which may disagree with the database's host by any amount.

    Every read of the database's clock (``Database.now`` and ``serialize``) passes through
    ``read``, which notes the offset between that reading and ``time.monotonic()`` taken just
    after it. The reading was taken before that moment, so the offset is at most one round trip
    too small, and a wake-up it times comes at most that late, never early. Until the first
    reading it assumes the database's clock is this host's wall clock.
    """

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = time.time() - time.monotonic()  # database time = monotonic + offset

    def read(self, at: float) -> float:
        """Note ``at``, the database's clock just read; returns it."""
        self.offset = at - time.monotonic()
        return at

    def until(self, at: float) -> float:
        """Seconds from now until ``at`` on the database's clock (negative once it passed)."""
        return at - self.offset - time.monotonic()

    def estimate(self) -> float:
        """The database's clock now, from the last reading (when the database cannot answer)."""
        return time.monotonic() + self.offset


class Subscription(Protocol):
    """What ``Database.subscribe`` returns: change its topics, or close it (also on exit)."""

    def update(self, topics: Iterable[Topic] | None) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Subscription: ...
    def __exit__(self, *exc: object) -> None: ...


class Database(Protocol):
    """The seam between agenthold's components (store, claims, messages) and a database engine:
    ``agenthold.db.sqlite.SQLiteDatabase``, ``agenthold.db.postgres.PostgresDatabase``.

    Components write their SQL once, with ``?`` placeholders and the syntax both engines share;
    their tables come from a ``Component`` given to ``ensure``, made by the backend's own
    scripts (``migrations``, with ``adoption`` run first: schema.Migrations). The connection
    that ``snapshot`` and ``write`` yield is a ``Connection``. Correctness must not rest on
    one writer at a time: a write that reads before it changes calls ``serialize`` first with
    the names it reads, so that concurrent writers of those names take turns (PostgreSQL runs
    READ COMMITTED with many writers). Errors are AgentholdErrors: BusyError when another writer
    held a lock past ``busy_timeout``, UnavailableError (with a hint) when the database cannot
    serve, never an error of the driver.

    Where the engines' SQL differs, the backend supplies the fragment: ``byte_length(column)``
    is the expression for the size in bytes (UTF-8) of a text column. ``side_file(name)`` is
    the path of a file this host keeps beside the database (None: none, in memory),
    ``has_table`` whether a table exists, and ``give_space_back`` returns the space of removed
    rows to the file system as the engine can (pages freed, and what happened in words).
    """

    dialect: str  # "sqlite" or "postgresql"
    path: str  # what to show the user: a file path, or a URL without its password
    read_only: bool
    busy_timeout: float
    clock: DatabaseClock  # fed by every reading of now() and serialize()

    def ensure(self, component: Component, *, required: bool = True) -> int: ...
    def migrations(self, component: str) -> tuple[str, ...]: ...
    def adoption(self, component: str) -> Adoption | None: ...
    def byte_length(self, column: str) -> str: ...
    def side_file(self, name: str) -> str | None: ...
    def has_table(self, table: str) -> bool: ...
    def give_space_back(
        self, step: int, dry_run: bool, between: Callable[[float], None]
    ) -> tuple[int, str]: ...
    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
    def snapshot(self) -> AbstractContextManager[Connection]: ...
    def write(self) -> AbstractContextManager[tuple[Connection, list[Topic]]]: ...
    def serialize(
        self, conn: Connection, exclusive: Sequence[str], shared: Sequence[str] = ()
    ) -> float: ...
    def now(self) -> float: ...
    def feed_window(
        self, conn: Connection, table: str, after: Any
    ) -> tuple[str, tuple[Any, ...], Any]: ...
    def subscribe(
        self, topics: Iterable[Topic] | None, callback: Callable[[], None]
    ) -> Subscription: ...
    def notify(self, topics: Iterable[Topic]) -> None: ...
    def add_change_source(self, source: ChangeSource) -> None: ...
    def close(self) -> None: ...
