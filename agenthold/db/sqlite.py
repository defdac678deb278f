"""SQLite behind agenthold's Database seam: one file (or ``:memory:``), embedded, no server.

Decisions behind it:
- One connection per thread, WAL, explicit transactions (``BEGIN IMMEDIATE`` for writes), and
  threads of one process queue for writing on a lock instead of in SQLite's sleeping busy
  handler. Settings are the named table ``PRAGMAS``; new files get 2 KiB pages.
- The backend owns its dialect: its DDL is the ``"sqlite"`` scripts of each Component (run by
  the one runner, schema.migrate, statement by statement), its error translation
  (``_translate``: a driver error never leaves this module) and its text decoding (a stored
  text that is not UTF-8 reads as ``UndecodableText``, through ``SQLiteConnection``).
- A file is agenthold's by its application id; a file of agenthold 0.10 is taken over by the
  store's adoption step (legacy.py). Each file carries a database id, so that a file replaced
  under a running process (a backup restored, a copy put over it) is told apart from the one
  it opened, and a write-ahead log that is not the file's is never applied (wal.py).
- The change feed (sqlite_feed.py) starts with the first subscriber: a process that never
  waits (an edit hook) never imports it, nor the file watchers.
Standard library only (the copyable store carries this module).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from agenthold.db.base import DatabaseClock, LazyLogger
from agenthold.db.errors import (
    AgentholdError,
    BusyError,
    IncompatibleDatabaseError,
    InvalidInputError,
    UnavailableError,
)
from agenthold.db.legacy import LEGACY_TABLES
from agenthold.db.records import Topic, UndecodableText, check_seconds
from agenthold.db.schema import (
    APPLICATION_ID,
    DATABASE_ID_SQL,
    FRESH,
    ID_PREFIX,
    LAYOUTS,
    META_SQL,
    SCHEMA_VERSION,
    Adoption,
    ChangeSource,
    Component,
    migrate,
    split_sql,
)
from agenthold.db.sqlite_schema import ADOPTIONS, MIGRATIONS
from agenthold.db.wal import (
    file_alone,
    log_is_foreign,
    names_another_id,
    opened_by_another_process,
    posix_locks,
    quote_path,
    read_database_id,
    read_wal,
    wal_alone,
)

if TYPE_CHECKING:
    from agenthold.db.feed import FeedSubscription
    from agenthold.db.sqlite_feed import SQLiteFeed

__all__ = ["PAGE_SIZE", "SQLITE_MAX_PATH", "SQLiteConnection", "SQLiteDatabase"]

log = LazyLogger("agenthold.db.sqlite")  # logging is imported with the first message


def _random_hex() -> str:
    """32 random hex digits (a database id, a temporary name). uuid is imported here, not at
    the top: it pulls in the platform module, and an edit hook (a new process on every edit,
    which makes no id) opens a database."""
    import uuid

    return uuid.uuid4().hex


def _run_script(conn: Any, script: str) -> None:
    """How the migration runner runs a script here: sqlite3 runs one statement per execute
    (executescript would commit the transaction first)."""
    for statement in split_sql(script):
        conn.execute(statement)


SQLITE_MAGIC = b"SQLite format 3\x00"
_HAS_PREAD = hasattr(os, "pread")  # Windows has none: the in-place copy check is POSIX's
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# New files get 2 KiB pages instead of SQLite's 4 KiB. A commit writes every page it changed to
# the WAL and checksums it; a typical write changes three pages (the live row, the history row
# and its index entry), so halving the page halves that work: small writes run about 15% faster.
# Values of tens of kilobytes pay a little for the longer overflow chains. Files made with another
# page size keep theirs.
PAGE_SIZE = 2048
# SQLite's unix file system layer takes paths of up to 512 bytes (SQLITE_MAX_PATHNAME) and
# refuses a database whose full path leaves no room for "-journal" within them.
SQLITE_MAX_PATH = 512 - len("-journal")

# Connection settings, applied to every connection. Durability is the caller's choice.
PRAGMAS: dict[str, str] = {
    "journal_mode": "wal",  # readers never wait for the writer; set once, stored in the file
    "cache_size": "-16000",  # 16 MB page cache per connection
    "temp_store": "memory",  # sorts and temporary indexes stay off the disk
    "journal_size_limit": str(64 * 1024 * 1024),  # truncate a checkpointed WAL beyond 64 MB
}
SYNCHRONOUS = {
    "normal": "NORMAL",  # survives a process crash; a power loss may drop the last commits
    "full": "FULL",  # fsync at every commit: survives a power loss too
}


_NOT_UTF8 = "Could not decode to UTF-8"  # how sqlite3 fails a row with such text


def _lenient_text(data: bytes) -> Any:
    """A text_factory that reads text that is not UTF-8 as UndecodableText instead of failing
    the whole query (sqlite3's own decoding raises for the row and every row after it)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return UndecodableText(data.decode("utf-8", "replace"))


class SQLiteConnection(sqlite3.Connection):
    """The connection ``snapshot`` and ``write`` yield (``base.Connection``): sqlite3's own,
    with ``fetchall`` reading rows whose text is not UTF-8 again with that text as
    UndecodableText, so that only their values count as damaged. A subclass, not a wrapper:
    ``execute`` stays sqlite3's, at no cost on the write path."""

    def fetchall(self, sql: str, params: Sequence[Any] = (), /) -> list[Any]:
        try:
            rows: list[Any] = self.execute(sql, params).fetchall()
            return rows
        except sqlite3.OperationalError as exc:
            if not str(exc).startswith(_NOT_UTF8):
                raise
        self.text_factory = _lenient_text
        try:
            rows = self.execute(sql, params).fetchall()
            return rows
        finally:
            self.text_factory = str


def _fetch_one(cursor: sqlite3.Cursor, sql: str, params: Sequence[Any]) -> Any:
    """``cursor.execute(sql, params).fetchone()``, reading text that is not UTF-8 as
    ``SQLiteConnection.fetchall`` does."""
    try:
        return cursor.execute(sql, params).fetchone()
    except sqlite3.OperationalError as exc:
        if not str(exc).startswith(_NOT_UTF8):
            raise
    connection: SQLiteConnection = cursor.connection  # type: ignore[assignment]
    rows = connection.fetchall(sql, params)
    return rows[0] if rows else None


class _FileState:
    """What every store of this process shares about one database file."""

    def __init__(
        self, uri: str | None, identity: tuple[int, int] | None = None, path: str | None = None
    ) -> None:
        self.write_lock = threading.Lock()
        self.uri, self.path = uri, path
        # The change feed starts with the first subscriber (sqlite_feed.py is imported then):
        # until then the change sources are only noted, and a commit has no one to notify.
        self.feed: SQLiteFeed | None = None
        self.sources: dict[str, ChangeSource] = {}
        self.feed_lock = threading.Lock()
        self.identity = identity  # the file's (device, inode), once it exists
        self.stores = 0  # open SQLiteDatabases of this process on the file
        # Where the database id's page is (page number, page size), the id, and a descriptor of
        # the file that reads it; kept open until the last store of the file closes (closing a
        # descriptor of a file drops this process's POSIX locks on it, SQLite's included).
        self.id_page: tuple[int, int] | None = None
        self.database_id: str | None = None
        self.id_bytes = b""  # database_id encoded, as the page read from the file is searched
        self.raw_fd: int | None = None
        self.replaced = False  # another file's contents were found in this one
        self.id_on_disk = False  # the id was read from the file itself once
        self.verified: tuple[int, ...] | None = None  # its stat when the id was last read there

    def the_feed(self) -> SQLiteFeed:
        """The file's change feed, made on first use."""
        with self.feed_lock:
            if self.feed is None:
                from agenthold.db.sqlite_feed import SQLiteFeed

                self.feed = SQLiteFeed(self.uri, self.path, self.sources)
            return self.feed

    def add_source(self, source: ChangeSource) -> None:
        with self.feed_lock:
            self.sources.setdefault(source.name, source)
            feed = self.feed
        if feed is not None:
            feed.add_source(source)


_files: dict[str, _FileState] = {}
_files_lock = threading.Lock()
_open_databases: weakref.WeakSet[SQLiteDatabase] = weakref.WeakSet()
# A connection must not be used or closed in a child process after fork(); a child keeps the
# ones it inherited here, unused, so that garbage collection never closes them.
_inherited: list[Any] = []


def _file_state(real_path: str, uri: str) -> _FileState:
    """The shared state of the file now at ``real_path``. If another file stood there before
    (deleted or replaced since), it gets a state of its own: the old one's poller reads the
    old file, and stores still open on that keep it."""
    identity = _identity(real_path)
    with _files_lock:
        state = _files.get(real_path)
        if state is None or (state.identity is not None and state.identity != identity):
            state = _files[real_path] = _FileState(uri, identity, real_path)
        return state


def _open_here(real_path: str) -> bool:
    """Whether a store of this process has the file now at ``real_path`` open."""
    identity = _identity(real_path)
    with _files_lock:
        state = _files.get(real_path)
        return (
            identity is not None
            and state is not None
            and state.stores > 0
            and state.identity == identity
        )


def _after_fork_in_child() -> None:
    # Connections, locks and threads do not survive fork(): start afresh in the child.
    global _files_lock
    _files_lock = threading.Lock()
    for state in _files.values():
        state.write_lock = threading.Lock()
        state.feed_lock = threading.Lock()
        if state.feed is not None:
            state.feed.reset_after_fork()
    for db in list(_open_databases):
        db._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _translate(exc: sqlite3.Error, busy_timeout: float, path: str = "") -> AgentholdError:
    """Turn a SQLite error into an error the caller can act on, with a hint saying how."""
    text = str(exc)
    lowered = text.lower()
    error: AgentholdError
    if "locked" in lowered or "busy" in lowered:
        error = BusyError(
            f"the database stayed locked by another writer for more than {busy_timeout:g} s "
            "(busy_timeout); nothing was written; retry in a moment"
        )
        error.hint = "Another writer holds the database; nothing was changed. Retry in a moment."
    elif "disk is full" in lowered or "database or disk is full" in lowered:
        error = UnavailableError(
            "the database cannot grow (the disk is full or its page limit is reached); "
            "nothing was written"
        )
        error.hint = "Free disk space; writes work again as soon as there is room."
        error.transient = True
    elif "readonly" in lowered or "read-only" in lowered:
        stuck = _unwritable(path)
        error = UnavailableError(
            "the database is read-only here"
            + (f" ({', '.join(stuck)} cannot be written)" if stuck else "")
            + "; nothing was written"
        )
        error.hint = (
            "Make the database file, its -wal and -shm files and their directory writable, "
            "then restart agenthold."
        )
    elif "i/o error" in lowered:
        error = UnavailableError(
            "the database could not be written (an I/O error: a full disk, a file-size limit "
            "or a failing disk); nothing was written"
        )
        error.hint = "Check the disk and its free space, then retry."
        error.transient = True
    elif "malformed" in lowered or "corrupt" in lowered:
        error = UnavailableError(f"the database file is damaged: {text}")
        error.hint = (
            "Stop agenthold and restore the file from a backup (sqlite3's .recover command can "
            "save what is readable)."
        )
    else:
        error = UnavailableError(f"the database failed: {text}")
        error.hint = "Retry in a moment; if it keeps failing, check the database file."
    return error


def _unwritable(path: str) -> list[str]:
    """Which of the database's files (and its directory) this process may not write."""
    if not path or path == ":memory:":
        return []
    files = [path, path + "-wal", path + "-shm"]
    stuck = [f for f in files if os.path.exists(f) and not os.access(f, os.W_OK)]
    folder = os.path.dirname(os.path.abspath(path))
    if not os.access(folder, os.W_OK):
        stuck.append(folder)
    return stuck


class _Write:
    """``SQLiteDatabase.write``'s context: a class instead of a generator, since every write
    of every store and claim passes through it (a generator's context costs about 1.5 µs)."""

    __slots__ = ("_changed", "_conn", "_db", "_lock", "_use")

    def __init__(self, db: SQLiteDatabase) -> None:
        self._db = db

    def __enter__(self) -> tuple[SQLiteConnection, list[Topic]]:
        self._conn, self._use, self._lock = self._db._begin_write()
        self._changed: list[Topic] = []
        return self._conn, self._changed

    def __exit__(self, kind: object, failed: BaseException | None, trace: object) -> None:
        self._db._end_write(self._conn, self._use, self._lock, self._changed, failed)


class SQLiteDatabase:
    """Connections, transactions and change notification for one SQLite database.

    Stores and claims use only this interface, so a different backend means a different class
    with the same methods: ``fetchone``, ``fetchall``, ``snapshot``, ``write``, ``subscribe``,
    ``notify``, ``add_change_source`` and ``close``.
    """

    dialect = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        read_only: bool = False,
        durability: str = "normal",
        busy_timeout: float = 5.0,
    ) -> None:
        path = os.fspath(path) if isinstance(path, os.PathLike) else path
        if not isinstance(path, str) or not path or "\x00" in path:
            raise InvalidInputError(
                f"path must be a file path or ':memory:' (a non-empty string without NUL "
                f"characters), got {path!r}"
            )
        if not isinstance(durability, str) or durability not in SYNCHRONOUS:
            raise InvalidInputError(f"durability must be 'normal' or 'full', got {durability!r}")
        if not isinstance(read_only, bool):
            raise InvalidInputError(f"read_only must be True or False, got {read_only!r}")
        self.busy_timeout = check_seconds("busy_timeout", busy_timeout, maximum=3600)
        self.clock = DatabaseClock()
        self.path = path
        self.read_only = read_only
        self.durability = durability
        self.memory = path == ":memory:"
        self._closed = False
        self._identity: tuple[int, int] | None = None  # the file's (device, inode), once open
        self._real = ""
        self._local = threading.local()
        # Every connection opened, by the thread that owns it, with the lock held while it is in
        # use: close() takes it before closing the connection, since closing one that another
        # thread is executing on crashes the process. A thread's connection is closed once the
        # thread has ended (checked whenever a new connection opens) or at close().
        self._connections: dict[threading.Thread, tuple[SQLiteConnection, threading.RLock]] = {}
        self._connections_lock = threading.Lock()
        self._mem_lock: threading.RLock | None = None
        if self.memory:
            if read_only:
                raise InvalidInputError("a ':memory:' database cannot be opened read-only")
            self._uri = f"file:agenthold-{_random_hex()}?mode=memory&cache=private"
            self._file = _FileState(None)
            self._mem_lock = threading.RLock()
            self._shared: SQLiteConnection | None = self._connect()[0]
        else:
            self._shared = None
            self._check_file()
            real = os.path.realpath(path)
            mode = "ro" if read_only else "rwc"
            if read_only and self._needs_immutable(real):
                mode = "ro&immutable=1"
            self._uri = f"file:{quote_path(real)}?mode={mode}"
            self._file = _file_state(real, f"file:{quote_path(real)}?mode={mode}")
            self._real = real
            if self._file.stores == 0:  # the first store of this process on the file
                self._check_wal(real)
            elif self._holds_another_database():  # copied over in place under our stores
                error = IncompatibleDatabaseError(
                    f"the database file {path!r} was replaced while this process had it open: "
                    "another database was copied over it; agenthold did not open it"
                )
                error.hint = (
                    "Close the stores of this process that had the file open (stop the "
                    "server), then open it again."
                )
                raise error
        with _files_lock:
            self._file.stores += 1  # from here on, close() counts it out again
        self._prepare_schema()
        if not self.memory:
            # From now on a thread's new connection must find this very file: never create an
            # empty one in its place (the file was deleted), and no write may go to it unseen.
            self._uri = self._uri.replace("?mode=rwc", "?mode=rw")
            self._identity = _identity(real)
            if self._file.identity is None:  # this store made the file
                self._file.identity = self._identity
        _open_databases.add(self)

    # -- opening -----------------------------------------------------------------------------

    def _check_file(self) -> None:
        path = self.path
        for name in (path, path + "-wal"):  # SQLite also opens the write-ahead log by name
            try:
                os.stat(name)
            except OSError as exc:
                if exc.errno == errno.ENAMETOOLONG:  # SQLite would say only "unable to open"
                    shown = path if len(path) <= 120 else path[:60] + "..." + path[-40:]
                    raise IncompatibleDatabaseError(
                        f"cannot open database {shown!r}: the path, or one of its names with the"
                        " '-wal' suffix SQLite adds, is longer than this system allows; use a"
                        " shorter path"
                    ) from None
        full = len(os.fsencode(os.path.abspath(os.path.realpath(path))))
        if full > SQLITE_MAX_PATH:  # SQLite would say only "unable to open database file"
            shown = path if len(path) <= 120 else path[:60] + "..." + path[-40:]
            error = IncompatibleDatabaseError(
                f"cannot open database {shown!r}: its full path is {full} bytes long, and SQLite "
                f"opens no database whose full path is over {SQLITE_MAX_PATH} bytes (its limit "
                "of 512, less the '-journal' it adds for the journal's name)"
            )
            error.hint = (
                "Move the database to a shorter path (SQLite follows symbolic links to the "
                "real path, so a short link to it does not help)."
            )
            raise error
        # The directory named in the path, and the one a symbolic link at the path points into.
        for parent in dict.fromkeys(
            os.path.dirname(p) for p in (os.path.abspath(path), os.path.realpath(path))
        ):
            if not os.path.isdir(parent):
                raise IncompatibleDatabaseError(
                    f"cannot open database {path!r}: the directory {parent!r} does not exist"
                )
        if os.path.isdir(path):
            raise IncompatibleDatabaseError(f"cannot open database {path!r}: it is a directory")
        if not os.path.exists(path):
            if self.read_only:
                raise IncompatibleDatabaseError(
                    f"no database at {path!r} (read-only opening never creates one)"
                )
            self._check_orphaned_wal()
            return
        if _open_here(os.path.realpath(path)):
            # SQLite has this very file open in this process, so it is a SQLite database; and
            # opening it here would be harmful: closing any descriptor of a file drops every
            # POSIX lock the process holds on it, the locks of those connections included.
            return
        try:
            with open(path, "rb") as f:
                header = f.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise IncompatibleDatabaseError(
                f"cannot read database {path!r}: {exc.strerror}"
            ) from None
        if header and header != SQLITE_MAGIC:
            raise IncompatibleDatabaseError(
                f"{path!r} is not a SQLite database, so not an agenthold database; "
                "give another --db path"
            )

    def _needs_immutable(self, real: str) -> bool:
        """Whether a read-only opening must read the file alone (SQLite's ``immutable``): a WAL
        database whose -shm file is missing and cannot be made (a read-only directory), where
        SQLite would only say "unable to open database file". That is exact while the log
        holds no commit: no writer can open the file either (it needs that -shm file), so
        nothing changes it. A log with commits cannot be read that way: refused, saying why."""
        folder = os.path.dirname(real)
        if os.path.exists(real + "-shm") or os.access(folder, os.W_OK | os.X_OK):
            return False
        try:
            with open(real, "rb") as f:
                header = f.read(20)
        except OSError:  # pragma: no cover - _check_file has just read it
            return False
        if len(header) < 20 or header[18] != 2:  # not in WAL mode: SQLite needs no -shm file
            return False
        if os.path.lexists(real + "-wal"):  # read_wal says None of a log it cannot read too
            try:
                os.close(os.open(real + "-wal", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
            except OSError as exc:  # it may hold commits: the file alone could be stale
                error = IncompatibleDatabaseError(
                    f"cannot read {self.path!r}: its write-ahead log {self.path + '-wal'!r} "
                    f"cannot be read ({exc.strerror}), and it may hold commits that are not in "
                    "the file yet; agenthold does not read the file without it"
                )
                error.hint = "Let this user read the -wal file (or the owner open it once)."
                raise error from None
        wal = read_wal(real + "-wal")
        if wal is None or wal.committed == 0:
            return True
        error = IncompatibleDatabaseError(
            f"cannot read {self.path!r}: its write-ahead log {self.path + '-wal'!r} holds "
            "commits that are not in the file yet, and SQLite reads those only through a "
            f"shared-memory file {self.path + '-shm'!r}, which cannot be created in the "
            f"read-only directory {folder!r}"
        )
        error.hint = (
            "Make the directory writable (a read-only opening adds the -shm file and changes "
            "nothing else), or copy the database file and its -wal file together into a "
            "writable directory and read the copy."
        )
        raise error

    def _check_orphaned_wal(self) -> None:
        """Refuse to make a new file beside the -wal and -shm of a deleted one. SQLite would
        take them for the new file's: it would share a running server's log (failing with a
        misleading I/O error and resetting that server's log), or apply a killed one's to an
        empty file. An empty log nobody holds (what a server leaves when its file was deleted
        under it) is harmless."""
        path, real = self.path, os.path.realpath(self.path)
        if not os.path.exists(path + "-shm") and not os.path.exists(path + "-wal"):
            return
        guard = wal_alone(real) if os.path.exists(path + "-shm") else None
        in_use = guard is None and os.path.exists(path + "-shm") and posix_locks()
        held_here = _files.get(real)  # this process's own locks never conflict: ask its stores
        in_use = in_use or (held_here is not None and held_here.stores > 0)
        if guard is not None:
            os.close(guard)
        try:
            logged = os.path.getsize(path + "-wal")
        except OSError:
            logged = 0
        if not in_use and logged == 0:
            return
        if in_use:
            error = IncompatibleDatabaseError(
                f"the database file {path!r} is missing, but another process still has its "
                f"write-ahead log {path + '-wal'!r} open: the file was deleted while a server "
                "was using it; agenthold created nothing and changed nothing"
            )
            error.hint = (
                "Stop the agenthold processes still using the deleted file (on Linux its data "
                "can be copied from /proc/PID/fd/ while they run), then start again to make a "
                "new, empty database."
            )
        else:
            error = IncompatibleDatabaseError(
                f"the database file {path!r} is missing, but its write-ahead log "
                f"{path + '-wal'!r} is there (left by a server stopped after the file was "
                "deleted); it cannot be applied to a new file; agenthold created nothing"
            )
            error.hint = (
                "Put the database file back, or move its -wal and -shm files away to start a "
                "new, empty database."
            )
        raise error

    def _connect(self) -> tuple[SQLiteConnection, threading.RLock]:
        """A new connection, registered with the lock of its use (in memory, the shared one)."""
        try:
            conn = sqlite3.connect(
                self._uri,
                uri=True,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
                factory=SQLiteConnection,
            )
        except sqlite3.Error as exc:
            self._check_file_is_ours()
            raise self._error(exc) from None
        try:
            conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[self.durability]}")
            for name, value in PRAGMAS.items():
                if name != "journal_mode":
                    conn.execute(f"PRAGMA {name} = {value}")
            if self.read_only:
                conn.execute("PRAGMA query_only = 1")
        except sqlite3.Error as exc:
            conn.close()
            raise self._opening_error(exc) from None
        use = self._mem_lock or threading.RLock()  # memory: one for all
        with self._connections_lock:
            if self._closed:  # closed while it opened: it must not outlive close()
                conn.close()
                raise AgentholdError("the store is closed")
            for thread in [t for t in self._connections if not t.is_alive()]:
                self._connections.pop(thread)[0].close()
            self._connections[threading.current_thread()] = (conn, use)
        return conn, use

    def _error(self, exc: sqlite3.Error) -> AgentholdError:
        """The error a caller can act on for a SQLite error on this database (on a closed
        store, that it is closed: a read that waited for close() meets a closed connection)."""
        if self._closed:
            return AgentholdError("the store is closed")
        return _translate(exc, self.busy_timeout, self.path)

    def _opening_error(self, exc: sqlite3.Error) -> AgentholdError:
        """Translate an error met while opening: a file SQLite cannot read as a database
        (SQLITE_NOTADB, SQLITE_CORRUPT) is incompatible; busy and I/O errors stay what they are."""
        if type(exc) is sqlite3.DatabaseError:
            return IncompatibleDatabaseError(f"cannot open database {self.path!r}: {exc}")
        return _translate(exc, self.busy_timeout, self.path)  # the store is closed by now

    def _prepare_schema(self) -> None:
        """Check that the file is ours (or empty) and set it up (page size, WAL); the tables
        come with ``ensure``. On any error every connection is closed before it is raised."""
        with self._closed_on_failure():
            conn = self._shared or self._thread_conn()
            app_id, layout, _, tables = _describe(conn)
            self._check_identity(app_id, layout, tables)
            if self.read_only:
                return
            if not self.memory:
                if layout == 0 and not tables:  # a new file: its page size can still change
                    conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                    # and so can this: pages compaction frees can go back (retention.py)
                    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                self._enable_wal(conn)
                if app_id == APPLICATION_ID:  # a new file gets its id with its first tables
                    self._ensure_database_id(conn)

    def _check_wal(self, real: str) -> None:
        """Refuse a write-ahead log that cannot belong to the file, before any connection that
        could apply it opens (see META_SQL). Nothing here reads through the log with SQLite,
        whose view of a foreign log mixed into the file can be unreadable: the file's id is read
        from the file alone (immutable: the log is not read), and the log is read as SQLite's
        recovery would read it (read_wal). The log is foreign when its committed
        frames write the id's page with another id, or when it holds commits while the file is
        still as `agenthold backup` wrote it (a writer's first commit on such a file drops FRESH
        from its id: that commit, and only that, is a fresh file's own).

        A log beside a fresh file that another process holds open is refused too, commits or
        none: that process opened the file this one replaced, and its next commit would land in
        the log of this one. It may be a server on its way out (a warm server that found its
        file replaced); so this waits up to busy_timeout for it to let go first."""
        if not os.path.exists(real + "-wal") and not os.path.exists(real + "-shm"):
            return
        deadline = time.monotonic() + self.busy_timeout
        while True:
            alone = file_alone(real)
            if alone is None:
                return  # not an agenthold file with an id yet: nothing to compare
            database_id, id_page, _ = alone
            fresh = database_id.endswith(FRESH)
            if fresh:  # its log may hold one commit of its own: the first, which writes the id
                wal = read_wal(real + "-wal", {id_page}, first_commit=True)
            else:  # only a commit that rewrites the id's page can show another file's log
                wal = read_wal(
                    real + "-wal", {id_page}, written=id_page, telling=names_another_id(alone)
                )
            foreign = wal is not None and wal.committed > 0 and log_is_foreign(wal, alone)
            if not fresh and not foreign:
                return  # this file's own log, as far as anything can tell (the usual case)
            if wal is not None and wal.committed > 0 and not foreign:
                return  # the first writer's own commit (it dropped FRESH, in the log so far)
            in_use = self._wal_in_use_elsewhere(real)
            if not in_use and not foreign:
                return
            if not foreign and not self._held_here(real) and opened_by_another_process(real):
                return  # a reader of this copy holds the log (it passed this check itself)
            if not in_use or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if foreign:
            error = IncompatibleDatabaseError(
                f"the write-ahead log {self.path + '-wal'!r} does not belong to the database "
                f"file {self.path!r} (it was left by the file this one replaced: a backup "
                "restored while a server ran, or over a server that was killed); agenthold did "
                "not apply it and changed nothing"
                + ("; a process still has it open" if in_use else "")
            )
        else:
            error = IncompatibleDatabaseError(
                f"the database file {self.path!r} is a restored backup that no server has opened "
                f"yet, but another process still has the write-ahead log {self.path + '-wal'!r} "
                "beside it open: a server of the file it replaced is still running; agenthold "
                "did not open it and changed nothing"
            )
        error.hint = (
            "Stop every agenthold process that used the file before the restore (warm servers "
            "too: SIGTERM stops one), then, if the -wal and -shm files are still there, move "
            "them away and start again; or restore the backup again with every server stopped."
        )
        raise error

    def _held_here(self, real: str) -> bool:
        """Whether a store of this process is open on a file that stood at ``real`` before."""
        return any(
            db is not self and db._real == real and not db._closed for db in list(_open_databases)
        )

    def _wal_in_use_elsewhere(self, real: str) -> bool:
        """Whether another connection holds the log at ``real``: another process (by the lock
        every SQLite connection holds on the -shm file), or a store of this process on a file
        that stood at this name before (asked directly: probing the -shm file here would drop
        that store's own locks when the probe's descriptor closes)."""
        if self._held_here(real):
            return True
        if not os.path.exists(real + "-shm") or not posix_locks():
            return False
        try:  # only a descriptor that may write can test for another's shared lock
            os.close(os.open(real + "-shm", os.O_RDWR | getattr(os, "O_CLOEXEC", 0)))
        except OSError:
            return False  # a -shm this process may not write: it cannot tell, as before
        guard = wal_alone(real)
        if guard is None:
            return True
        os.close(guard)
        return False

    def _ensure_database_id(self, conn: SQLiteConnection) -> None:
        """Give the file a database id if it has none (a file made by an older agenthold), or
        drop FRESH from it (the first writer to open a backup). The id's page is then
        checkpointed into the file at once, where the checks of ``_check_contents`` read it."""
        try:
            row = conn.execute(DATABASE_ID_SQL).fetchone()
        except sqlite3.OperationalError:  # no agenthold_meta table yet
            row = None
        if row is not None and not str(row[0]).endswith(FRESH):
            self._remember_id(conn)
            return
        with self._file.write_lock:
            try:
                conn.execute("BEGIN IMMEDIATE")
                _write_database_id(conn)
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                # Another writer held the file all along: open without the id for now (the
                # checks that need it wait for an opening that can write it).
                log.warning("%s: could not write its database id yet: %s", self.path, exc)
                return
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        self._remember_id(conn)

    def _remember_id(self, conn: SQLiteConnection) -> None:
        """Note where the database id's page is and what it says (once per file and process)."""
        state = self._file
        if state.id_page is not None:
            return
        row = conn.execute(
            "SELECT rootpage, (" + DATABASE_ID_SQL + ") FROM sqlite_master "
            "WHERE type = 'table' AND name = 'agenthold_meta'"
        ).fetchone()
        if row is None or not isinstance(row[1], str):
            return
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        state.database_id = row[1].removesuffix(FRESH)
        state.id_bytes = state.database_id.encode()
        state.id_page = (int(row[0]), int(size))

    def _check_contents(self, conn: SQLiteConnection, seen: tuple[int, ...] | None) -> None:
        """Inside a write: raise UnavailableError if the file now holds another database's
        contents (copied over it in place, so its inode is the same): the page of its id, read
        from the file itself, names another id. SQLite cannot see this: its cache and its WAL
        still show the file it opened, and it would go on acknowledging writes into a WAL that
        mixes the two.

        ``seen`` is the file's stat from this write's _check_file_is_ours: a copy put over the
        file changes its change time (and its size or modification time), so while they are
        those of the last check that found our id, and that change time was over SETTLED_NS
        old then, the page is not read again. In WAL mode the file itself changes only at
        checkpoints: writes spaced out skip the read, a burst reads it after a checkpoint."""
        state = self._file
        if seen is not None and seen == state.verified:
            return
        if not _HAS_PREAD:  # pragma: no cover - Windows has no pread
            return
        if state.id_page is None:
            self._remember_id(conn)
            if state.id_page is None or state.database_id is None:
                return  # a file without an id: made before ids, opened read-only so far
        if not self._holds_another_database(seen):
            return
        error = UnavailableError(
            f"the database file {self.path!r} was replaced while agenthold was running: it now "
            "holds another database (a backup copied over it?); nothing was written"
        )
        error.hint = (
            "Stop every agenthold process using this file, then start again: the file that is "
            "there now is opened, and the log of the one it replaced is not applied to it."
        )
        raise error

    def _holds_another_database(self, seen: tuple[int, ...] | None = None) -> bool:
        """Whether the file now holds another database's contents (copied over it in place):
        the page of its id, read from the file itself, names another id. Needs the id's page
        (``_remember_id``); without it, False. Sets ``replaced`` when it finds so."""
        state = self._file
        if not _HAS_PREAD:  # pragma: no cover - Windows has no pread
            return False
        if state.id_page is None or state.database_id is None:
            return False
        page, size = state.id_page
        if state.raw_fd is None:
            state.raw_fd = os.open(self._real, os.O_RDONLY | _O_CLOEXEC)
        content = os.pread(state.raw_fd, size, (page - 1) * size)
        if state.id_bytes in content:
            state.id_on_disk = True
            # only a stat whose change time is past: a copy put over the file in the same
            # timestamp tick (up to a second on some file systems) could leave it unchanged
            if seen is not None and time.time_ns() - seen[4] > SETTLED_NS:
                state.verified = seen
            return False
        if ID_PREFIX.encode() not in content:
            # No id on that page: either it is not in the file yet (its checkpoint is still
            # to come), or another database's file is there, whose id (if it has one) lives
            # on another page. The file's own schema, read without the WAL, tells which.
            there = read_database_id(f"file:{quote_path(self._real)}?immutable=1")
            if there is None and not state.id_on_disk:
                return False  # not checkpointed yet
            if there is not None and there.removesuffix(FRESH) == state.database_id:
                return False
        state.replaced = True
        return True

    def replaced(self) -> bool:
        """Whether the file at this store's path is no longer the one it opened: deleted,
        another file moved to its name, or another database copied over it in place. A warm
        server asks this to know it must not serve on (warm.py)."""
        return not self._closed and self._replaced_now()

    def _replaced_now(self) -> bool:
        if self.memory:
            return False
        if self._file.replaced:
            return True
        if self._identity is not None and _identity(self._real) != self._identity:
            return True
        return self._holds_another_database()

    @contextmanager
    def _closed_on_failure(self) -> Iterator[None]:
        """While opening: a failure closes this store again, and a SQLite error becomes the
        error that says what is wrong with the file."""
        try:
            yield
        except sqlite3.Error as exc:
            self.close()
            raise self._opening_error(exc) from None
        except AgentholdError:
            self.close()
            raise

    def migrations(self, component: str) -> tuple[str, ...]:
        """``component``'s migration scripts on SQLite, in order (sqlite_schema.py)."""
        return MIGRATIONS.get(component, ())

    def adoption(self, component: str) -> Adoption | None:
        """What runs first when ``component``'s tables are made or migrated (the store's:
        agenthold 0.10's file taken over, legacy.py)."""
        return ADOPTIONS.get(component)

    def ensure(self, component: Component, *, required: bool = True) -> int:
        """Create ``component``'s tables or migrate them to its version (one transaction, which
        also imports an agenthold 0.10 file the first time the store's tables are made).
        Returns the version the tables are at: read-only and not ``required``, 0 when they
        were never made."""
        with self._closed_on_failure(), self._in_use() as conn:
            have = self._component_version(conn, component)
            if have == component.version or (self.read_only and have == 0 and not required):
                return have
            if self.read_only:
                raise IncompatibleDatabaseError(
                    f"{self.path!r} has the {component.name} tables at version {have}, older "
                    f"than this agenthold's {component.version}; open it once without "
                    "read-only to migrate it"
                )
            with self._mem_lock or self._file.write_lock:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    have = self._component_version(conn, component)  # another process may win
                    if have < component.version:
                        self._migrate(conn, component, have)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                if not self.memory:  # the database id's page goes into the file now
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                return component.version

    def _component_version(self, conn: SQLiteConnection, component: Component) -> int:
        app_id, layout, versions, tables = _describe(conn)
        self._check_identity(app_id, layout, tables)
        have = versions.get(component.name, 0)
        if have > component.version:
            raise IncompatibleDatabaseError(
                f"{self.path!r} has the {component.name} tables at version {have}, newer than "
                f"this agenthold supports ({component.version}); upgrade agenthold to open it"
            )
        return have

    def _migrate(self, conn: SQLiteConnection, component: Component, have: int) -> None:
        """Inside ``ensure``'s transaction: the one runner (schema.migrate), then what marks
        the file as agenthold's (application id, layout, database id)."""
        _, _, versions, _ = _describe(conn)
        migrate(conn, component, have, self, _run_script, versions)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if not self.memory:
            _write_database_id(conn)

    def _enable_wal(self, conn: SQLiteConnection) -> None:
        """Switch the file to WAL (a lasting setting). Processes opening a new file together
        can make SQLite refuse the switch at once, without waiting: retry for busy_timeout."""
        deadline = time.monotonic() + self.busy_timeout
        while conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                conn.execute("PRAGMA journal_mode = wal")
                continue
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc).lower():
                    raise
            if time.monotonic() > deadline:
                raise sqlite3.OperationalError("database is locked")
            time.sleep(0.005)

    def _check_identity(self, app_id: int, version: int, tables: list[str]) -> None:
        """Raise IncompatibleDatabaseError unless the database is ours (at a schema version this
        code knows) or, when we may create the schema, a new and empty one."""
        if app_id == APPLICATION_ID:
            if version > SCHEMA_VERSION:
                raise IncompatibleDatabaseError(
                    f"{self.path!r} has schema version {version}, newer than this agenthold "
                    f"supports ({SCHEMA_VERSION}); upgrade agenthold to open it"
                )
            return
        if app_id == 0 and not tables and not self.read_only:
            return  # a new, empty database
        if app_id == 0 and version == 0 and set(tables) == LEGACY_TABLES:
            if self.read_only:
                raise IncompatibleDatabaseError(
                    f"{self.path!r} was written by agenthold 0.10 or older; open it once without "
                    "read-only (for example, start the server on it) to upgrade it"
                )
            return  # an agenthold 0.10 database: its records are imported
        held = f"it holds tables {', '.join(sorted(tables)[:5])}" if tables else "it is empty"
        raise IncompatibleDatabaseError(
            f"{self.path!r} is a SQLite database but not an agenthold database ({held}); "
            "give another --db path"
        )

    # -- connections ---------------------------------------------------------------------------

    def _thread_conn(self) -> SQLiteConnection:
        return self._thread_pair()[0]

    def _thread_pair(self) -> tuple[SQLiteConnection, threading.RLock]:
        """This thread's connection and the lock of its use (opened on first use), read from
        one thread-local object: close() may put a new one in its place at any moment."""
        local = self._local
        try:
            return local.conn, local.use
        except AttributeError:
            cursor, use = self._thread_cursor()
            conn: SQLiteConnection = cursor.connection  # type: ignore[assignment]
            return conn, use

    def _thread_cursor(self) -> tuple[sqlite3.Cursor, threading.RLock]:
        """Open this thread's connection and the cursor its reads reuse (on first use), with
        the lock of its use."""
        if self._closed:
            raise AgentholdError("the store is closed")
        local = self._local
        conn, use = self._connect()
        cursor: sqlite3.Cursor = conn.cursor()
        local.conn, local.use = conn, use
        local.reader = (cursor, use)  # one lookup for a read (fetchone)
        return cursor, use

    def _reset_after_fork(self) -> None:
        _inherited.extend(conn for conn, _ in self._connections.values())
        if self._shared is not None:
            _inherited.append(self._shared)
            self._shared = None
            self._closed = True  # a private in-memory database does not survive fork()
        self._local = threading.local()
        self._connections = {}
        self._connections_lock = threading.Lock()
        if self._mem_lock is not None:
            self._mem_lock = threading.RLock()

    # -- the interface -------------------------------------------------------------------------

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one read statement and return its first row (or None)."""
        try:
            if self._mem_lock is None:
                try:
                    cursor, use = self._local.reader
                except AttributeError:
                    cursor, use = self._thread_cursor()
                # held while the statement runs, so close() never closes the connection under
                # it; a connection close() has closed raises, which _error calls "closed". A
                # with-statement, not acquire() and a try: the interpreter runs signal handlers
                # (Ctrl-C) as a call returns, so a KeyboardInterrupt could land between
                # acquire() and the try and leave the lock held, while one raised right after a
                # with's __enter__ is already inside its block (and a with costs no more)
                with use:
                    try:
                        return cursor.execute(sql, params).fetchone()
                    except sqlite3.OperationalError as exc:
                        if not str(exc).startswith(_NOT_UTF8):
                            raise
                        return _fetch_one(cursor, sql, params)  # text that is not UTF-8
            with self._mem_lock:  # the shared connection's lock (not _in_use: a hot path)
                return _fetch_one(self._live_shared().cursor(), sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one read statement and return all its rows."""
        try:
            if self._mem_lock is None:
                try:
                    cursor, use = self._local.reader
                except AttributeError:
                    cursor, use = self._thread_cursor()
                with use:  # as in fetchone
                    try:
                        rows: list[Any] = cursor.execute(sql, params).fetchall()
                        return rows
                    except sqlite3.OperationalError as exc:
                        if not str(exc).startswith(_NOT_UTF8):
                            raise
                        return cursor.connection.fetchall(sql, params)  # type: ignore[no-any-return]
            with self._mem_lock:  # as in fetchone
                return self._live_shared().fetchall(sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    @contextmanager
    def snapshot(self) -> Iterator[SQLiteConnection]:
        """A read transaction: every statement inside sees the same committed state."""
        with self._in_use() as conn:
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    if conn.in_transaction:
                        conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    def write(self) -> _Write:
        """A write transaction (``BEGIN IMMEDIATE``), committed when the block ends normally and
        rolled back if it raises. Append the topics the block changed to the yielded list; they
        are notified after the commit."""
        if self.read_only:
            raise UnavailableError("the store was opened read-only; it cannot write")
        return _Write(self)

    def _begin_write(self) -> tuple[SQLiteConnection, threading.RLock | None, Any]:
        """``write``'s start: the process's write lock, the checks that the file is still ours,
        this thread's connection (its use lock taken, so close() waits for it) and ``BEGIN
        IMMEDIATE``. Returns the connection, its use lock and the write lock, all held."""
        lock = self._mem_lock or self._file.write_lock
        waited = 0.0
        if not lock.acquire(blocking=False):
            started = time.monotonic()
            if not lock.acquire(timeout=self.busy_timeout):
                raise BusyError(
                    f"another writer in this process held the database for more than "
                    f"{self.busy_timeout:g} s (busy_timeout); retry in a moment"
                )
            waited = time.monotonic() - started
        use = None
        try:
            seen = self._check_file_is_ours()
            # in memory the lock taken above is the shared connection's own
            if self._mem_lock is None:
                conn, use = self._thread_pair()
                use.acquire()
            else:
                conn = self._live_shared()
            try:
                if waited > 0.001:  # the wait for the lock counts against busy_timeout
                    left = max(0, int((self.busy_timeout - waited) * 1000))
                    conn.execute(f"PRAGMA busy_timeout = {left}")
                    try:
                        conn.execute("BEGIN IMMEDIATE")
                    finally:
                        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                else:
                    conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._error(exc) from None
            try:
                if not self.memory:
                    self._check_contents(conn, seen)
            except BaseException as exc:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc) from None
                raise
        except BaseException:
            if use is not None:
                use.release()
            lock.release()
            raise
        return conn, use, lock

    def _end_write(
        self, conn: SQLiteConnection, use: threading.RLock | None, lock: Any,
        changed: list[Topic], failed: BaseException | None,
    ) -> None:  # fmt: skip
        """``write``'s end: COMMIT (or, after ``failed``, ROLLBACK), the locks released, then
        the topics ``changed`` notified. Raises the commit's error; a block's own error is left
        to propagate, translated first if it is SQLite's."""
        try:
            commit_failed = False
            if failed is None:
                try:
                    conn.execute("COMMIT")
                except BaseException as exc:
                    failed, commit_failed = exc, True
            if failed is not None:
                if conn.in_transaction:
                    with suppress(sqlite3.Error):  # SQLite may have rolled back already
                        conn.execute("ROLLBACK")
                if isinstance(failed, sqlite3.Error):
                    raise self._error(failed) from None
                if commit_failed:
                    raise failed
                return
        finally:
            if use is not None:
                use.release()
            lock.release()
        if changed and self._file.feed is not None:
            self._file.feed.notify(changed)

    def subscribe(
        self, topics: Iterable[Topic] | None, callback: Callable[[], None]
    ) -> FeedSubscription:
        """Call ``callback`` (from any thread, so it must be quick) whenever one of ``topics``
        changes, in this process or another; None listens to every change."""
        return self._file.the_feed().subscribe(topics, callback)

    def notify(self, topics: Iterable[Topic]) -> None:
        feed = self._file.feed
        if feed is not None:
            feed.notify(topics)

    def add_change_source(self, source: ChangeSource) -> None:
        self._file.add_source(source)

    def serialize(self, conn: Any, exclusive: Sequence[str], shared: Sequence[str] = ()) -> float:
        """Inside ``write``: make writers of the same names take turns until commit, and return
        the database's clock. SQLite has one writer at a time already: nothing to lock."""
        return self.clock.read(time.time())

    def now(self) -> float:
        """The database's clock, unix seconds: leases are judged by it (here, the host's)."""
        return self.clock.read(time.time())

    def feed_window(self, conn: Any, table: str, after: Any) -> tuple[str, tuple[Any, ...], Any]:
        """Inside ``snapshot``: a condition on the rows of the event table ``table`` that
        committed after position ``after`` (None: since the start) and up to now, its
        parameters, and the position to give next time. Here ids commit in order."""
        newest = conn.execute(f"SELECT max(id) FROM {table}").fetchone()[0] or 0
        if after is None:
            return "id <= ?", (newest,), newest
        return "id > ? AND id <= ?", (after, newest), newest

    def byte_length(self, column: str) -> str:
        """The size in bytes of a text column: SQLite before 3.43 has no octet_length, and the
        length of the text as a blob is its UTF-8 size."""
        return f"length(CAST({column} AS BLOB))"

    def side_file(self, name: str) -> str | None:
        """A file beside the database file (``<file>-<name>``); None in memory."""
        return None if self.memory else os.path.realpath(self.path) + "-" + name

    def has_table(self, table: str) -> bool:
        row = self.fetchone(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        )
        return bool(row[0])

    def give_space_back(
        self, step: int, dry_run: bool, between: Callable[[float], None]
    ) -> tuple[int, str]:
        """Give the file's free pages back to the file system by incremental vacuum, ``step``
        pages per write transaction, calling ``between(began)`` (the monotonic time the write
        began) after each so that other writers get in; the pages freed and what happened."""
        if self.memory:
            return 0, "in memory: nothing to give back"
        mode = int(self.fetchone("PRAGMA auto_vacuum")[0])
        if mode != 2:
            free = int(self.fetchone("PRAGMA freelist_count")[0])
            return 0, (
                f"{free} free pages stay in the file for new rows (it was made without "
                "incremental auto-vacuum); to give space back, stop the servers and run: sqlite3 "
                "FILE 'PRAGMA auto_vacuum = INCREMENTAL; VACUUM'"
            )
        if dry_run:
            free = int(self.fetchone("PRAGMA freelist_count")[0])
            return 0, f"{free} free pages would be given back to the file system"
        freed = 0
        while True:
            began = time.monotonic()
            with self.write() as (conn, _):
                free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
                if free == 0:
                    break
                # Python's sqlite3 steps this pragma once per execute, and each step frees one
                # page, whatever N says: so one execute per page, a step's worth per write
                for _ in range(min(free, step)):
                    conn.execute("PRAGMA incremental_vacuum(1)")
                left = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
            freed += free - left
            between(began)
            if left >= free:  # pragma: no cover - nothing moved (SQLite refused): do not spin
                break
        return freed, f"{freed} pages given back to the file system (incremental vacuum)"

    def close(self) -> None:
        last = False
        if not self._closed:
            with _files_lock:
                self._file.stores -= 1
                last = self._file.stores == 0
            if last and self._file.feed is not None:
                self._file.feed.stop()
        self._closed = True
        guard = self._forget_stale_wal() if last and not self.memory else None
        with self._connections_lock:
            conns, self._connections = list(self._connections.values()), {}
        for conn, use in conns:
            # a connection another thread is executing on is closed once that thread lets go of
            # it; one held longer than a busy timeout is left to that thread (garbage collection
            # closes it when the thread drops it) rather than closed under it
            if use.acquire(timeout=self.busy_timeout):
                try:
                    with suppress(sqlite3.Error):
                        conn.close()
                finally:
                    use.release()
        self._shared = None
        self._local = threading.local()
        _open_databases.discard(self)
        if last and self._file.raw_fd is not None:  # no connection of ours is left on the file
            with suppress(OSError):
                os.close(self._file.raw_fd)
            self._file.raw_fd = None
        if guard is not None:
            os.close(guard)

    def _forget_stale_wal(self) -> int | None:
        """When the last store of this process closes a file that was replaced under it: empty
        the WAL it leaves, unless another process uses it. That log holds the replaced file's
        last commits; SQLite keeps it when the file was moved away (and would copy it into a
        file copied over in place), so the next opener would apply it to the new file. Returns
        a descriptor that holds the log alone until the connections are closed (or None)."""
        if self.read_only or not self._real:
            return None
        # a copy put over the file in place, with no write since to find it: SQLite's last
        # connection would checkpoint the old file's log into the copy as it closes
        if not self._replaced_now():
            return None
        guard = wal_alone(self._real)
        if guard is None:
            log.warning("the WAL of the replaced database %s is in use elsewhere: kept", self.path)
            return None
        with suppress(OSError):
            os.truncate(self._real + "-wal", 0)
        log.warning(
            "the database file %s was replaced while agenthold ran: the write-ahead log of the "
            "file it replaced was emptied, so it is never applied to the new one",
            self.path,
        )
        return guard

    def backup(self, dest: str | os.PathLike[str]) -> str:
        """Copy the database into a new file ``dest`` with SQLite's online backup API: one
        consistent snapshot, taken while other connections and processes go on writing. The
        copy gets a database id of its own, marked FRESH (see META_SQL), so that a WAL of the
        file it is later restored over is never applied to it. It is written beside ``dest``
        and renamed into place, so ``dest`` is either the whole copy or absent. Returns the
        path written. Refuses a ``dest`` that exists."""
        if self.memory:
            raise InvalidInputError("a ':memory:' database has no file to back up")
        target = os.path.abspath(os.path.expanduser(os.fspath(dest)))
        if os.path.lexists(target):
            raise InvalidInputError(
                f"{os.fspath(dest)!r} already exists; give a new file name for the backup"
            )
        folder = os.path.dirname(target)
        if not os.path.isdir(folder):
            raise InvalidInputError(f"the directory {folder!r} for the backup does not exist")
        partial = f"{target}.{_random_hex()[:8]}.partial"
        try:
            try:
                copy = sqlite3.connect(partial, isolation_level=None)
                copy.execute("PRAGMA user_version").fetchone()  # opened for real, or fails here
            except sqlite3.Error as exc:
                raise UnavailableError(f"cannot write the backup {target!r}: {exc}") from None
            try:
                with self._in_use() as conn:
                    conn.backup(copy)
                copy.execute("BEGIN IMMEDIATE")
                copy.execute(META_SQL)
                copy.execute(
                    "INSERT INTO agenthold_meta (name, value) VALUES ('database_id', ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (ID_PREFIX + _random_hex() + FRESH,),
                )
                copy.execute("COMMIT")
                copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                copy.close()  # the last connection: SQLite checkpoints and removes its WAL
            with open(partial, "rb") as f:
                os.fsync(f.fileno())
            _put_in_place(partial, target, os.fspath(dest))
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        except OSError as exc:
            raise UnavailableError(f"cannot write the backup {target!r}: {exc.strerror}") from None
        finally:
            for leftover in (partial, partial + "-wal", partial + "-shm"):
                with suppress(OSError):
                    os.unlink(leftover)
        return target

    # -- helpers -------------------------------------------------------------------------------

    def _check_file_is_ours(self) -> tuple[int, ...] | None:
        """Raise UnavailableError if the file opened was deleted or replaced since (writes
        would go to a file no one can open again, and be lost when the process ends). Returns
        what the file's stat says of it now (None in memory), for _check_contents."""
        if self._identity is None:
            return None
        try:
            st = os.stat(self._real)
            seen: tuple[int, ...] | None = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                            st.st_ctime_ns)  # fmt: skip
        except OSError:
            seen = None
        if seen is None or seen[:2] != self._identity:
            error = UnavailableError(
                f"the database file {self.path!r} was deleted or replaced while agenthold was "
                "running; nothing was written"
            )
            error.hint = "Restart agenthold to open the file that is there now."
            raise error
        return seen

    def _live_shared(self) -> SQLiteConnection:
        if self._shared is None:
            raise AgentholdError("the store is closed")
        return self._shared

    @contextmanager
    def _in_use(self) -> Iterator[SQLiteConnection]:
        """This thread's connection (in memory, the one shared connection), held for the
        block: close() waits for it. A store closed meanwhile raises its clean error."""
        if self._mem_lock is not None:
            with self._mem_lock:
                yield self._live_shared()
            return
        conn, use = self._thread_pair()
        with use:
            if self._closed:  # closed while this thread waited for the lock
                raise AgentholdError("the store is closed")
            yield conn


#: How old a file's change time must be before a stat of it vouches for its contents: more
#: than one timestamp tick of any file system (a second on the coarsest).
SETTLED_NS = 2_000_000_000


def _identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``, or None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _write_database_id(conn: Any) -> None:
    """Inside a write transaction: give the file a new database id if it has none, and drop
    FRESH from the one it has (see META_SQL)."""
    conn.execute(META_SQL)
    row = conn.execute(DATABASE_ID_SQL).fetchone()
    if row is None:
        conn.execute(
            "INSERT INTO agenthold_meta (name, value) VALUES ('database_id', ?)",
            (ID_PREFIX + _random_hex(),),
        )
    elif str(row[0]).endswith(FRESH):
        conn.execute(
            "UPDATE agenthold_meta SET value = ? WHERE name = 'database_id'",
            (str(row[0]).removesuffix(FRESH),),
        )


def _put_in_place(partial: str, target: str, shown: str) -> None:
    """Give the finished copy ``partial`` its name ``target``, never over a file that appeared
    there meanwhile (a hard link fails if the name exists; a rename would replace it), and make
    the name durable."""
    try:
        os.link(partial, target)
    except FileExistsError:
        raise InvalidInputError(
            f"{shown!r} already exists; give a new file name for the backup"
        ) from None
    except OSError:  # a file system without hard links: a rename, checked just before
        if os.path.lexists(target):
            raise InvalidInputError(
                f"{shown!r} already exists; give a new file name for the backup"
            ) from None
        os.replace(partial, target)
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(os.path.dirname(target), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _describe(conn: SQLiteConnection) -> tuple[int, int, dict[str, int], list[str]]:
    """The file's application id, layout (user_version), component versions and tables, read
    in one snapshot (another process may be creating the schema at this very moment)."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        layout = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        versions: dict[str, int] = {}
        if app_id == APPLICATION_ID:
            versions = dict(LAYOUTS.get(layout, {}))
        if "agenthold_components" in tables:
            versions.update(conn.execute("SELECT component, version FROM agenthold_components"))
    finally:
        if own:
            conn.execute("COMMIT")
    return app_id, layout, versions, tables
