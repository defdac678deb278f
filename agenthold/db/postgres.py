"""PostgreSQL behind agenthold's Database seam, for agents on several hosts sharing one database.

``StateStore("postgresql://user@host/dbname")`` (or ``--db`` with such a URL) opens it. It needs
the optional extra ``agenthold[postgres]`` (psycopg 3 with its binary and pool packages) and
imports nothing of agenthold but the seam's base modules (``agenthold.db``). Decisions behind it:
- The dialect is this module's: the components' SQL is sent as written but for psycopg's
  placeholder style (``?`` to ``%s``); where the engines differ, this backend supplies the
  fragment (``byte_length``: ``octet_length``) or does the job itself (``has_table``,
  ``side_file``, ``give_space_back``), and its scripts are each Component's ``"postgresql"``
  ones, run whole by the one migration runner (schema.migrate) under an advisory lock.
- Many writers, READ COMMITTED. Correctness does not rest on one writer at a time: a write that
  reads before it changes first takes transaction-scoped advisory locks on the names it reads
  (``serialize``: shared locks, then exclusive ones, each in a fixed order), so writers of one
  key take turns and the second reads what the first committed. A race that still fails (a lock
  held past ``busy_timeout``, a deadlock, a unique violation) is a BusyError: nothing written,
  retry. Versions are therefore never reused and never lost.
- One clock. ``serialize`` and ``now`` return ``clock_timestamp()`` of the server, so leases are
  judged alike by hosts whose clocks disagree (and feed ``clock``, so waits sleep until them).
- Connections come from a psycopg pool in autocommit mode; transactions are explicit BEGIN and
  COMMIT, and a pooled connection found dead at BEGIN (sent with a write's first statement) is
  replaced once, so a restarted server costs no call an error. A server that is down gives
  UnavailableError with a hint and libpq's reason, within DOWN_WAIT once the pool has seen it
  fail; the pool reconnects in the background (psycopg_pool's backoff) and calls succeed again
  as soon as it has.
- Change feed: commits NOTIFY channel ``agenthold`` with their topics (JSON, or ``*`` "look
  again, everyone" when it would pass the 8,000-byte limit) in the same round trip as COMMIT.
  Each process keeps one listening connection per database, outside the pool, while anyone
  waits; its thread opens it, so a subscriber never waits for a connect. The tables are the
  truth and a notification only a hint: whenever LISTEN is on again (the first time, or after
  a lost connection) every waiter looks again, and every BACKSTOP seconds anyway.
- Event tables (``state_history``, ``claim_events``) carry the writing transaction's id (xid8).
  Identity ids do not commit in order, so readers of new events (``log --follow``) take the rows
  of transactions older than their snapshot's xmin, window by window: every such transaction has
  ended, so no row can still appear below the window, and none is read twice.
- fork(): a child process that goes on using a store inherited from its parent gets new
  sessions of its own on first use; the parent's are kept in the child, never used or closed.
- A password given in the URL is never shown: ``path`` (what errors and logs print) and every
  driver error shown or logged have it masked.
  libpq's environment variables (PGHOST, PGUSER, PGPASSWORD...) and ~/.pgpass work as usual.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import unquote

import psycopg
from psycopg import errors
from psycopg_pool import ConnectionPool, PoolTimeout

from agenthold.db.base import DatabaseClock
from agenthold.db.errors import (
    AgentholdError,
    BusyError,
    IncompatibleDatabaseError,
    InvalidInputError,
    UnavailableError,
)
from agenthold.db.feed import FEED_LINGER, ChangeFeed, FeedSubscription
from agenthold.db.postgres_schema import MIGRATIONS
from agenthold.db.records import Topic, check_seconds
from agenthold.db.schema import Adoption, ChangeSource, Component, migrate

__all__ = ["PostgresDatabase", "redact"]

log = logging.getLogger("agenthold.db.postgres")

CHANNEL = "agenthold"
MAX_PAYLOAD = 7900  # bytes; PostgreSQL refuses NOTIFY payloads of 8,000 bytes or more
BACKSTOP = 2.0  # seconds: waiters look again this often even if no notification came
LISTEN_TICK = 0.25  # seconds the listener waits for notifications before its housekeeping
POOL_SIZE = 10
DOWN_WAIT = 0.5  # seconds a call waits for a connection while the server cannot be reached
RECONNECT_FOR = 86400.0  # seconds the pool keeps trying to reconnect (backing off) after a loss
SCHEMA_LOCK = "agenthold\x1fschema"
UNREACHABLE_HINT = (
    "Check that the PostgreSQL server is running and reachable; agenthold reconnects by itself "
    "once it is back. Retry in a moment."
)


@functools.lru_cache(maxsize=64)
def _passwords(url: str) -> tuple[str, ...]:
    """Every text of ``url`` that may be a password, as written and percent-decoded, longest
    first: the userinfo's, read up to each '@' (libpq ends it at the first, urllib at the
    last), and each ``password=`` parameter's (libpq decodes keys; a capitalised key is refused,
    but its value was meant as a password). Read by hand: libpq's errors can quote a URL that
    urllib cannot parse."""
    head = url.partition("://")[2].partition("/")[0]
    found = [head[:i].partition(":")[2] for i, c in enumerate(head) if c == "@"]
    for key, _, value in (p.partition("=") for p in url.partition("?")[2].split("&")):
        if unquote(key).strip().lower() == "password":
            found.append(value)
    found += [unquote(p) for p in found]
    return tuple(sorted({p for p in found if p}, key=len, reverse=True))


def redact(url: str, text: str | None = None) -> str:
    """``text`` (by default ``url`` itself) with every password of ``url`` masked, for
    messages and logs."""
    text = url if text is None else text
    for secret in _passwords(url):
        text = text.replace(secret, "***")
    return text


@functools.lru_cache(maxsize=4096)
def lock_key(name: str) -> int:
    """The advisory-lock key (a signed 64-bit integer) of a name: the same in every process."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@functools.cache  # the components' statements are a fixed set
def _pg(text: str) -> str:
    """The components' SQL (``?`` placeholders) in psycopg's placeholder style (``%s``). That
    is all that is rewritten: where the engines differ, the backend supplies the fragment
    (``byte_length``) or its own SQL."""
    return text.replace("%", "%%").replace("?", "%s")


class _Connection:
    """What ``snapshot`` and ``write`` yield: ``execute`` and ``executemany`` with ``?``.

    A write's BEGIN is deferred (``begin``) and sent with its first statement: ``serialize``,
    the first statement of every write, sends both in one round trip."""

    __slots__ = ("begin", "db", "raw")

    def __init__(
        self,
        raw: psycopg.Connection[Any],
        db: PostgresDatabase | None = None,
        begin: str | None = None,
    ) -> None:
        self.raw = raw
        self.db = db
        self.begin = begin

    def start(self, first: str | None = None) -> psycopg.Cursor[Any] | None:
        """Send the deferred BEGIN, with ``first`` (SQL without parameters) in the same round
        trip; returns the cursor positioned on ``first``'s result."""
        if self.begin is None:
            return self.raw.execute(first) if first is not None else None
        assert self.db is not None
        return self.db._start(self, first)

    def execute(self, text: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        if self.begin is not None:
            self.start()
        return self.raw.execute(_pg(text), params)

    def fetchall(self, text: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.execute(text, params).fetchall()

    def executemany(self, text: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            if self.begin is not None:
                self.start()
            with self.raw.cursor() as cursor:
                cursor.executemany(_pg(text), rows)


def _run_script(conn: _Connection, script: str) -> None:
    """How the migration runner runs a script here: whole, in one round trip (no parameters,
    so psycopg sends it as it is)."""
    conn.raw.execute(script)


def _lost(conn: psycopg.Connection[Any], exc: psycopg.Error) -> bool:
    """Whether ``exc`` says the connection is gone (the server restarted, or the session was
    ended): then a statement that changed nothing yet can run again on another connection."""
    if conn.broken or isinstance(exc, (errors.AdminShutdown, errors.CrashShutdown)):
        return True
    return isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc, (errors.LockNotAvailable, errors.QueryCanceled)
    )


def _quote(text: str) -> str:
    """``text`` as an SQL string literal (standard_conforming_strings is on in every session
    of the pool: backslashes are plain characters, a quote is doubled)."""
    if "\x00" in text:
        raise InvalidInputError("a NUL character cannot be sent to PostgreSQL")
    return "'" + text.replace("'", "''") + "'"


def _connect_options(url: str) -> dict[str, Any]:
    """Added to ``url`` at every connect. libpq's default gssencmode ("prefer") asks Kerberos
    for credentials each time, which is not safe across a server's threads and forks (a known
    cause of crashes); off unless the URL or PGGSSENCMODE chooses. Kerberos login still works."""
    options: dict[str, Any] = {"autocommit": True, "connect_timeout": 5}
    if "gssencmode=" not in url.partition("?")[2] and not os.environ.get("PGGSSENCMODE"):
        options["gssencmode"] = "disable"
    return options


def _first_line(exc: BaseException, url: str) -> str:
    """``exc`` on one line, without a password of ``url`` (libpq quotes a part of a URL it
    cannot parse; a server quotes names, which a password may equal)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return redact(url, "; ".join(lines) or type(exc).__name__)


class _Feed(ChangeFeed):
    """The change feed of one database in this process: local commits notify directly, and a
    listener thread on its own connection hears the commits of every other process."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = url
        self._listen: psycopg.Connection[Any] | None = None
        self.users = 0  # open PostgresDatabases of this process on the database

    def start(self) -> None:
        """Start the listener thread (called with the lock held). It connects on its own: a
        slow or unreachable server must not hold up the subscriber, which in a server is the
        event loop. Until its LISTEN is on, the listener is deaf; see ``_run``."""
        self.runner = threading.Thread(target=self._run, name="agenthold-pg-listener", daemon=True)
        self.runner.start()

    def _connect_listener(self) -> psycopg.Connection[Any] | None:
        try:
            conn = psycopg.connect(self._url, **_connect_options(self._url))
            conn.execute(f"LISTEN {CHANNEL}")
            return conn
        except psycopg.Error as exc:
            log.warning("change feed cannot listen (%s); waiters look again every %gs",
                        _first_line(exc, self._url), BACKSTOP)  # fmt: skip
            return None

    def _run(self) -> None:
        """Listen while anyone is subscribed, and FEED_LINGER seconds after. The listener is
        deaf before its first LISTEN and after losing its connection: each time LISTEN is on
        again it wakes every subscriber to look again, so a commit made while it was deaf is
        seen by that look and every later one is heard. BACKSTOP covers the rest."""
        me = threading.current_thread()
        conn: psycopg.Connection[Any] | None = None
        last_sweep = time.monotonic()
        idle_since: float | None = None
        retry = 0.0  # seconds before the next connect: none the first time, then backing off
        try:
            while True:
                with self.lock:
                    if self.runner is not me:
                        return
                    if not self.subscribers:
                        now = time.monotonic()
                        idle_since = idle_since or now
                        if now - idle_since > FEED_LINGER:
                            self.runner = None
                            return
                    else:
                        idle_since = None
                if conn is None:
                    time.sleep(retry)
                    conn = self._connect_listener()
                    retry = 0.05 if conn is not None else min(2.0, max(0.05, retry * 2))
                    with self.lock:
                        if self.runner is me:
                            self._listen = conn
                    if conn is not None:
                        self.wake_all()
                else:
                    try:
                        for note in conn.notifies(timeout=LISTEN_TICK):
                            self._heard(note.payload)
                    except psycopg.Error as exc:
                        log.warning("change feed lost its connection (%s); reconnecting",
                                    _first_line(exc, self._url))  # fmt: skip
                        with suppress(psycopg.Error):
                            conn.close()
                        conn = None
                if time.monotonic() - last_sweep >= BACKSTOP:
                    last_sweep = time.monotonic()
                    self.wake_all()
        finally:
            if conn is not None:
                with suppress(psycopg.Error):
                    conn.close()

    def _heard(self, payload: str) -> None:
        try:  # "*" (everyone looks again) is not JSON, nor is a payload another program sent
            self.notify([tuple(t) for t in json.loads(payload)])
        except (ValueError, TypeError):
            self.wake_all()

    def halt(self) -> None:
        self.runner = None  # the thread closes its connection as it ends

    def reset_after_fork(self) -> None:
        if self._listen is not None:
            _inherited.append(self._listen)  # the parent's session: never used or closed here
            self._listen = None
        super().reset_after_fork()


_feeds: dict[str, _Feed] = {}
_feeds_lock = threading.Lock()
_open_databases: weakref.WeakSet[PostgresDatabase] = weakref.WeakSet()
# What a forked child inherited (pools, listening connections): sessions of the parent, kept so
# that garbage collection never closes them (which would end them for the parent too).
_inherited: list[Any] = []


def _after_fork_in_child() -> None:
    """Connections and threads do not survive fork(): a child that goes on using a store opens
    sessions of its own and leaves its parent's alone."""
    global _feeds_lock
    _feeds_lock = threading.Lock()
    for feed in _feeds.values():
        feed.reset_after_fork()
    for db in list(_open_databases):
        db._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class PostgresDatabase:
    """Connections, transactions and change notification for one PostgreSQL database (the
    same methods as ``SQLiteDatabase``; see ``agenthold.db.base.Database``)."""

    dialect = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        durability: str = "normal",
        busy_timeout: float = 5.0,
        pool_size: int = POOL_SIZE,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise InvalidInputError("a PostgreSQL database is named by a postgresql:// URL")
        if not isinstance(durability, str) or durability not in ("normal", "full"):
            raise InvalidInputError(f"durability must be 'normal' or 'full', got {durability!r}")
        if not isinstance(read_only, bool):
            raise InvalidInputError(f"read_only must be True or False, got {read_only!r}")
        self.busy_timeout = check_seconds("busy_timeout", busy_timeout, maximum=3600)
        self.clock = DatabaseClock()  # maps this host's monotonic clock onto the server's
        self.url = url
        self.path = redact(url)
        self.read_only = read_only
        self.durability = durability  # commits are as durable as the server is set up to make them
        self._closed = False
        self._unreachable: str | None = None  # why the pool's last connection attempt failed
        self._check_server()
        self._pool_size = max(1, pool_size)
        self._pool = self._new_pool(open=True)
        self._reopen: threading.Lock | None = None  # set in a forked child: open a new pool
        with _feeds_lock:
            feed = _feeds.get(url)
            if feed is None:
                feed = _feeds[url] = _Feed(url)
            feed.users += 1
        self._feed = feed
        _open_databases.add(self)

    def _new_pool(self, *, open: bool) -> ConnectionPool[psycopg.Connection[Any]]:
        return ConnectionPool(
            self.url,
            connection_class=self._connection_class(),
            min_size=1,
            max_size=self._pool_size,
            kwargs=_connect_options(self.url),
            configure=self._configure,
            open=open,
            name="agenthold",
            reconnect_timeout=RECONNECT_FOR,
        )

    def _reset_after_fork(self) -> None:
        """In a forked child: the pool's connections are the parent's sessions. Keep them,
        unused and unclosed (closing would end the parent's sessions), and open a pool of this
        process's own on first use."""
        _inherited.append(self._pool)
        self._pool = self._new_pool(open=False)
        self._reopen = threading.Lock()

    # -- opening -----------------------------------------------------------------------------

    def _check_server(self) -> None:
        """Connect once now, so that a server that is down, a wrong password or a missing
        database is one clear error at start."""
        try:
            conn = psycopg.connect(self.url, **_connect_options(self.url))
        except psycopg.Error as exc:  # a password missing or wrong: say where libpq looks
            why = _first_line(exc, self.url)
            if "no password supplied" in why or "password authentication failed" in why:
                why += "; give the password in PGPASSWORD, in ~/.pgpass (or PGPASSFILE) or the URL"
            raise UnavailableError(f"cannot connect to PostgreSQL at {self.path}: {why}") from None
        conn.close()

    def _connection_class(self) -> type[psycopg.Connection[Any]]:
        """The pool's connections, noting whether the server could be reached: while it cannot,
        calls are answered ``unavailable`` at once (with libpq's reason) instead of each
        waiting for a connection that cannot come."""
        db = self

        class Pooled(psycopg.Connection[Any]):
            @classmethod
            def connect(cls, conninfo: str = "", **kwargs: Any) -> Pooled:
                try:
                    conn = super().connect(conninfo, **kwargs)
                except psycopg.Error as exc:  # the pool logs it: without the password
                    db._unreachable = _first_line(exc, db.url)
                    raise psycopg.OperationalError(db._unreachable) from None
                db._unreachable = None
                return conn

        return Pooled

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"SET lock_timeout = {max(1, int(self.busy_timeout * 1000))}")
        conn.execute("SET standard_conforming_strings = on")  # what _quote relies on
        if self.read_only:
            conn.execute("SET default_transaction_read_only = on")

    def migrations(self, component: str) -> tuple[str, ...]:
        """``component``'s migration scripts on PostgreSQL, in order (postgres_schema.py)."""
        return MIGRATIONS.get(component, ())

    def adoption(self, component: str) -> Adoption | None:
        """None: no older layout of a PostgreSQL database to take over."""
        return None

    def ensure(self, component: Component, *, required: bool = True) -> int:
        """Create or migrate ``component``'s tables (under an advisory lock, so processes that
        open a new database together make them once). A database that holds tables of
        another program, or a newer version of ours, is refused and left untouched."""
        with self._transaction("BEGIN") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(SCHEMA_LOCK),))
            versions = self._versions(conn)
            have = versions.get(component.name, 0)
            if have > component.version:
                raise IncompatibleDatabaseError(
                    f"{self.path} has the {component.name} tables at version {have}, newer "
                    f"than this agenthold supports ({component.version}); upgrade agenthold"
                )
            if have == component.version or (self.read_only and have == 0 and not required):
                return have
            if self.read_only:
                raise IncompatibleDatabaseError(
                    f"{self.path} has the {component.name} tables at version {have}, older than "
                    f"this agenthold's {component.version}; open it once without read-only to "
                    "migrate it"
                )
            migrate(_Connection(conn), component, have, self, _run_script)
            return component.version

    def _versions(self, conn: psycopg.Connection[Any]) -> dict[str, int]:
        if conn.execute("SELECT to_regclass('agenthold_components')").fetchone()[0] is None:  # type: ignore[index]
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                    "ORDER BY tablename"
                )
            ]
            if tables or self.read_only:  # a read never creates them: a server does
                held = f"is not an agenthold database (it holds tables {', '.join(tables[:5])})"
                empty = "has no agenthold tables yet: start a server on it first"
                raise IncompatibleDatabaseError(
                    f"{self.path} {held}; give another --db" if tables else f"{self.path} {empty}"
                )
            return {}
        rows = conn.execute("SELECT component, version FROM agenthold_components").fetchall()
        return {name: version for name, version in rows}

    # -- connections ---------------------------------------------------------------------------

    def _error(self, exc: BaseException) -> AgentholdError:
        """The error a caller can act on, with a hint, for a driver or pool error."""
        error: AgentholdError
        if isinstance(exc, AgentholdError):
            return exc
        if isinstance(exc, errors.LockNotAvailable):
            error = BusyError(
                f"another writer held a lock for more than {self.busy_timeout:g} s "
                "(busy_timeout); nothing was written; retry in a moment"
            )
            error.hint = "Another writer holds the data; nothing was changed. Retry in a moment."
        elif isinstance(
            exc, (errors.DeadlockDetected, errors.SerializationFailure, errors.UniqueViolation)
        ):
            error = BusyError(
                "a concurrent writer got in the way; nothing was written; retry in a moment"
            )
            error.hint = "Nothing was changed. Retry in a moment."
        elif isinstance(exc, errors.ReadOnlySqlTransaction):
            error = UnavailableError("the database is read-only here; nothing was written")
            error.hint = "Connect to the primary server, or as a role that may write."
        elif isinstance(exc, errors.InsufficientPrivilege):
            error = UnavailableError(f"the database refused the call: {_first_line(exc, self.url)}")
            error.hint = "Grant the role agenthold connects as the rights on its tables."
        elif isinstance(exc, errors.ProgramLimitExceeded):  # an OperationalError, not an outage
            error = InvalidInputError(f"too large for PostgreSQL: {_first_line(exc, self.url)}")
            error.hint = "Nothing was written. Use shorter names (see the limits in docs/store.md)."
        elif isinstance(exc, (psycopg.OperationalError, PoolTimeout, psycopg.InterfaceError)):
            error = self._down(_first_line(exc, self.url))
        else:
            error = UnavailableError(f"the database failed: {_first_line(exc, self.url)}")
            error.hint = "Retry in a moment; if it keeps failing, check the PostgreSQL server."
        return error

    def _down(self, reason: str) -> UnavailableError:
        """The server cannot be reached (a transient error: the pool reconnects by itself)."""
        error = UnavailableError(f"PostgreSQL at {self.path} is unreachable: {reason}")
        error.hint, error.transient = UNREACHABLE_HINT, True
        return error

    def _getconn(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise AgentholdError("the store is closed")
        if self._reopen is not None:
            with self._reopen:
                if self._reopen is not None:
                    self._pool.open()
                    self._reopen = None
        down = self._unreachable
        try:
            return self._pool.getconn(
                timeout=DOWN_WAIT if down else max(DOWN_WAIT, min(self.busy_timeout, 5.0))
            )
        except PoolTimeout as exc:
            down = self._unreachable or down
            raise (self._error(exc) if down is None else self._down(down)) from None
        except psycopg.Error as exc:
            raise self._error(exc) from None

    def _begin(self, statement: str | None) -> psycopg.Connection[Any]:
        """A pooled connection, with ``statement`` (BEGIN...) run on it. A connection the
        server dropped since its last use (a restart) is replaced once: nothing was sent."""
        for attempt in (1, 2):
            conn = self._getconn()
            if statement is None:
                return conn
            try:
                conn.execute(statement)
                return conn
            except psycopg.Error as exc:
                self._pool.putconn(conn)  # a broken connection is discarded by the pool
                if attempt == 2 or not _lost(conn, exc):
                    raise self._error(exc) from None
                self._drop_dead()
        raise AssertionError("unreachable")  # pragma: no cover

    def _drop_dead(self) -> None:
        """One pooled connection was found dead (a restart, or sessions ended by an
        administrator): check the idle others now, so the retry gets a live one."""
        with suppress(psycopg.Error, PoolTimeout):
            self._pool.check()

    def _start(self, tx: _Connection, first: str | None) -> psycopg.Cursor[Any] | None:
        """Send ``tx``'s deferred BEGIN (with ``first``, if given, in the same round trip).
        A connection the server dropped since its last use is replaced once: nothing was done
        on it. Any other error leaves the transaction begun (so it is rolled back)."""
        assert tx.begin is not None
        statement = tx.begin if first is None else f"{tx.begin}; {first}"
        for attempt in (1, 2):
            try:
                cursor = tx.raw.execute(statement)
            except psycopg.Error as exc:
                if attempt == 2 or not _lost(tx.raw, exc):
                    tx.begin = None
                    raise
                self._pool.putconn(tx.raw)  # a broken connection is discarded by the pool
                self._drop_dead()
                tx.raw = self._getconn()
                continue
            tx.begin = None
            if first is not None:
                cursor.nextset()
            return cursor
        raise AssertionError("unreachable")  # pragma: no cover

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[psycopg.Connection[Any]]:
        conn = self._begin(begin)
        try:
            try:
                yield conn
            except BaseException:
                with suppress(psycopg.Error):
                    if not conn.broken:
                        conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except psycopg.Error as exc:
            raise self._error(exc) from None
        finally:
            self._pool.putconn(conn)

    def _read(self, run: Callable[[psycopg.Connection[Any]], Any]) -> Any:
        for attempt in (1, 2):
            conn = self._begin(None)
            try:
                result = run(conn)
            except psycopg.Error as exc:
                lost = _lost(conn, exc)
                self._pool.putconn(conn)
                if attempt == 2 or not lost:
                    raise self._error(exc) from None
                self._drop_dead()
                continue
            self._pool.putconn(conn)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the interface -------------------------------------------------------------------------

    def fetchone(self, text: str, params: Sequence[Any] = ()) -> Any:
        query = _pg(text)
        return self._read(lambda conn: conn.execute(query, params).fetchone())

    def fetchall(self, text: str, params: Sequence[Any] = ()) -> list[Any]:
        query = _pg(text)
        rows: list[Any] = self._read(lambda conn: conn.execute(query, params).fetchall())
        return rows

    @contextmanager
    def snapshot(self) -> Iterator[_Connection]:
        """A read transaction (REPEATABLE READ): every statement sees the same snapshot."""
        with self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as conn:
            try:
                yield _Connection(conn)
            except psycopg.Error as exc:
                raise self._error(exc) from None

    @contextmanager
    def write(self) -> Iterator[tuple[_Connection, list[Topic]]]:
        """A write transaction, committed when the block ends normally (with the NOTIFY of the
        topics appended to the yielded list, in the same round trip) and rolled back if it
        raises. BEGIN goes with the first statement (see ``_Connection``)."""
        if self.read_only:
            raise UnavailableError("the store was opened read-only; it cannot write")
        tx = _Connection(self._getconn(), self, "BEGIN")
        changed: list[Topic] = []
        try:
            try:
                yield tx, changed
            except BaseException as exc:
                with suppress(psycopg.Error):
                    if tx.begin is None and not tx.raw.broken:
                        tx.raw.execute("ROLLBACK")
                if isinstance(exc, psycopg.Error):
                    raise self._error(exc) from None
                raise
            if tx.begin is not None:  # nothing was sent: nothing to commit
                return
            conn = tx.raw
            try:
                if changed:
                    conn.execute(self._notify_sql(changed) + "; COMMIT")
                else:
                    conn.execute("COMMIT")
            except psycopg.Error as exc:
                if not conn.broken:
                    with suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                    raise self._error(exc) from None
                error = UnavailableError(
                    f"the connection to PostgreSQL at {self.path} was lost while committing: "
                    "the write may or may not have been made"
                )
                error.hint = "Read the data again to see whether the write was made, then retry."
                raise error from None
        finally:
            self._pool.putconn(tx.raw)
        self._feed.notify(changed)

    @staticmethod
    def _notify_sql(changed: list[Topic]) -> str:
        payload = json.dumps(list(dict.fromkeys(changed)), ensure_ascii=False)
        if len(payload.encode("utf-8")) > MAX_PAYLOAD:
            payload = "*"  # too long for NOTIFY: every waiter looks again
        return f"NOTIFY {CHANNEL}, {_quote(payload)}"

    def serialize(self, conn: Any, exclusive: Sequence[str], shared: Sequence[str] = ()) -> float:
        """Take transaction-scoped advisory locks on ``shared`` then ``exclusive`` names (each
        sorted, so every writer takes them in the same order) and return the server's clock,
        read once they are held. The first statement of a write: its BEGIN goes with it."""
        # the keys are integers, written into the statement: without parameters it can go
        # with BEGIN in one round trip
        locks = [
            f"pg_advisory_xact_lock_shared('{k}'::int8)" for k in sorted(map(lock_key, shared))
        ]
        locks += [f"pg_advisory_xact_lock('{k}'::int8)" for k in sorted(map(lock_key, exclusive))]
        query = (
            "SELECT extract(epoch FROM clock_timestamp())::float8 FROM (SELECT "
            + ", ".join(locks)
            + ") AS l"
        )
        return self.clock.read(float(conn.start(query).fetchone()[0]))

    def now(self) -> float:
        row = self.fetchone("SELECT extract(epoch FROM clock_timestamp())::float8")
        return self.clock.read(float(row[0]))

    def feed_window(self, conn: Any, table: str, after: Any) -> tuple[str, tuple[Any, ...], Any]:
        """Rows of transactions that ended before this snapshot's xmin, and (given ``after``,
        the xmin of the last read) not before that: no row can still commit below the window,
        and no row is in two windows."""
        xmin = int(
            conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()[0]
        )
        if after is None:
            return "xid < ?::xid8", (str(xmin),), xmin
        return "xid >= ?::xid8 AND xid < ?::xid8", (str(after), str(xmin)), xmin

    def byte_length(self, column: str) -> str:
        return f"octet_length({column})"

    def side_file(self, name: str) -> str | None:
        """A file of this host's for the database (the server's files are not ours): in the
        user's state directory, named by a digest of the URL without its password."""
        state = os.environ.get("XDG_STATE_HOME") or os.path.join(
            os.path.expanduser("~"), ".local", "state"
        )
        digest = hashlib.sha256(self.path.encode()).hexdigest()[:16]
        return os.path.join(state, "agenthold", f"{name}-{digest}.jsonl")

    def has_table(self, table: str) -> bool:
        row = self.fetchone("SELECT to_regclass(?) IS NOT NULL", (table,))
        return bool(row[0])

    def give_space_back(
        self, step: int, dry_run: bool, between: Callable[[float], None]
    ) -> tuple[int, str]:
        return 0, "PostgreSQL: autovacuum takes the removed rows' space back on its own"

    def subscribe(
        self, topics: Iterable[Topic] | None, callback: Callable[[], None]
    ) -> FeedSubscription:
        return self._feed.subscribe(topics, callback)

    def notify(self, topics: Iterable[Topic]) -> None:
        self._feed.notify(topics)

    def add_change_source(self, source: ChangeSource) -> None:
        """Nothing to do: commits say what changed in their NOTIFY."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _feeds_lock:
            self._feed.users -= 1
            if self._feed.users == 0:
                self._feed.stop()
                if _feeds.get(self.url) is self._feed:
                    del _feeds[self.url]
        self._pool.close()


BACKEND = PostgresDatabase  # what backends.py opens for a postgresql:// URL
