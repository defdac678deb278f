"""The versioned state store: JSON values with per-key versions and an append-only history.

``StateStore`` and its SQL; everything else it stands on is the database seam in
``agenthold.db`` (errors, records and their checks, the change feed, the backends), whose
public names this module re-exports: ``agenthold.store`` stays the one import a user needs.
To vendor the store into another project as one file, see ``tools/build_store_file.py``.

Decisions behind it:
- Optimistic concurrency. A write names the version it read (``expected_version``); the check and
  the write happen in one write transaction, so a stale write always gets a conflict.
- Versions are never reused. A deleted key keeps a tombstone row that remembers its last version,
  so a delete and every later write continue the same sequence.
- History first, atomically. The history row and the live row change in the same transaction.
- One SQL for both engines: ``?`` placeholders and syntax SQLite and PostgreSQL share; the
  tables are the ``STORE_SCHEMA`` component, whose scripts each backend owns; errors and
  undecodable text are the backend's to translate (a damaged value is a DamagedRecordError
  for its key alone).
- Waiting is pushed: a watch sleeps on the change feed (``wait_until``), woken by commits to
  its key in this process or another.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

from agenthold.db.backends import (
    POSTGRES_PREFIXES,
    close_all,
    open_database,
)
from agenthold.db.base import (
    Connection,
    Database,
    DatabaseClock,
    Subscription,
)
from agenthold.db.errors import (
    AgentholdError,
    BusyError,
    ConflictDetail,
    ConflictError,
    DamagedRecordError,
    HistoryCompactedError,
    IncompatibleDatabaseError,
    InvalidInputError,
    KeyTooLargeError,
    NotFoundError,
    UnavailableError,
)
from agenthold.db.legacy import (
    LEGACY_TABLES,
)
from agenthold.db.records import (
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_PAGE_LIMIT,
    INVISIBLE,
    MAX_DEPTH,
    MAX_KEY_LENGTH,
    MAX_NAMESPACE_LENGTH,
    MAX_PAGE_BYTES,
    MAX_SQL_INT,
    MAX_WAIT_SECONDS,
    MAX_WRITER_LENGTH,
    DeleteResult,
    Export,
    ExportedRecord,
    HistoryEntry,
    NamespaceInfo,
    NotJsonError,
    Record,
    SetResult,
    Topic,
    check_int,
    check_seconds,
    check_text,
    decode_value,
    encode_value,
    make_history_entry,
    make_record,
    read_json,
    refused_name,
    utc_iso,
)
from agenthold.db.schema import (
    APPLICATION_ID,
    COMPONENTS_SQL,
    FRESH,
    ID_PREFIX,
    LAYOUTS,
    META_SQL,
    SCHEMA_VERSION,
    ChangeSource,
    Component,
)
from agenthold.db.sqlite import (
    PAGE_SIZE,
    PRAGMAS,
    SQLITE_MAGIC,
    SQLITE_MAX_PATH,
    SYNCHRONOUS,
    SQLiteDatabase,
)
from agenthold.db.wait import (
    Waiter,
    wait_until,
)
from agenthold.db.wal import (
    FRAME_HEADER,
    WAL_HEADER,
    WalLog,
    read_wal,
)

__all__ = [
    "APPLICATION_ID",
    "COMPONENTS_SQL",
    "DEFAULT_MAX_VALUE_BYTES",
    "FRAME_HEADER",
    "FRESH",
    "ID_PREFIX",
    "INVISIBLE",
    "LAYOUTS",
    "LEGACY_TABLES",
    "MAX_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "MAX_PAGE_BYTES",
    "MAX_SQL_INT",
    "MAX_WAIT_SECONDS",
    "MAX_WRITER_LENGTH",
    "META_SQL",
    "PAGE_SIZE",
    "POSTGRES_PREFIXES",
    "PRAGMAS",
    "SCHEMA_VERSION",
    "SIZE_BATCH",
    "SQLITE_MAGIC",
    "SQLITE_MAX_PATH",
    "STORE_SCHEMA",
    "SYNCHRONOUS",
    "WAL_HEADER",
    "AgentholdError",
    "BusyError",
    "ChangeSource",
    "Component",
    "ConflictDetail",
    "ConflictError",
    "DamagedRecordError",
    "Database",
    "DatabaseClock",
    "DeleteResult",
    "Export",
    "ExportedRecord",
    "HistoryCompactedError",
    "HistoryEntry",
    "IncompatibleDatabaseError",
    "InvalidInputError",
    "KeyTooLargeError",
    "NamespaceInfo",
    "NotFoundError",
    "Record",
    "SQLiteDatabase",
    "SetResult",
    "StateStore",
    "Subscription",
    "Topic",
    "UnavailableError",
    "Waiter",
    "WalLog",
    "check_int",
    "check_seconds",
    "check_text",
    "close_all",
    "decode_value",
    "encode_value",
    "key_topic",
    "open_database",
    "page_end",
    "read_events",
    "read_wal",
    "sizes_sql",
    "utc_iso",
    "wait_until",
]

# The tables' scripts are each backend's (agenthold/db/sqlite_schema.py, postgres_schema.py);
# on SQLite an agenthold 0.10 file's records come in first (db/legacy.py).
STORE_SCHEMA = Component("store", 2)


# --------------------------------------------------------------------------------------------

_GET = (
    "SELECT value, version, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND key = ? AND deleted = 0"
)
_CURRENT = (
    "SELECT version, deleted, value, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND key = ?"
)
_INSERT_HISTORY = (
    "INSERT INTO state_history (namespace, key, version, value, updated_by, updated_at, "
    "event_type) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_HISTORY_BY = (
    "INSERT INTO state_history (namespace, key, version, value, updated_by, updated_at, "
    "event_type, principal) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_UPSERT = (
    "INSERT INTO state (namespace, key, value, version, updated_by, updated_at, deleted) "
    "VALUES (?, ?, ?, ?, ?, ?, 0) ON CONFLICT (namespace, key) DO UPDATE SET "
    "value = excluded.value, version = excluded.version, updated_by = excluded.updated_by, "
    "updated_at = excluded.updated_at, deleted = 0"
)
_TOMBSTONE = (
    "UPDATE state SET value = NULL, version = ?, updated_by = ?, updated_at = ?, deleted = 1 "
    "WHERE namespace = ? AND key = ?"
)
_LIST = (
    "SELECT key, value, version, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND deleted = 0 ORDER BY key"
)
_HISTORY = (
    "SELECT version, value, updated_by, updated_at, event_type, principal FROM state_history "
    "WHERE namespace = ? AND key = ? ORDER BY version DESC LIMIT ?"
)
# A page's reads: first the sizes of its candidate rows (never their values: see page_end), in
# bytes of UTF-8 (a text's length counts characters, and the engines spell a byte count apart:
# each statement names the column, and the backend supplies the expression, Database.byte_length),
# then the values of the rows that fit, by the range page_end found.
_LIST_SIZES = (  # keys are never empty, so after = '' starts at the first
    "SELECT key, {value} FROM state "
    "WHERE namespace = ? AND deleted = 0 AND key > ? ORDER BY key LIMIT ?"
)
_LIST_RANGE = (
    "SELECT key, value, version, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND deleted = 0 AND key > ? AND key <= ? ORDER BY key"
)
_EXPORT_SIZES = (  # a key's live value and its whole history, as one export page holds them
    "SELECT s.key, {s.value} + "
    "(SELECT coalesce(sum({h.value}), 0) "
    "FROM state_history AS h WHERE h.namespace = s.namespace AND h.key = s.key) FROM state AS s "
    "WHERE s.namespace = ? AND s.deleted = 0 AND s.key > ? ORDER BY s.key LIMIT ?"
)
# The oldest version a key's history holds, or (none left) the one after the key's last.
_KEPT_FROM = (
    "SELECT coalesce((SELECT min(version) FROM state_history WHERE namespace = ? AND key = ?), "
    "(SELECT version + 1 FROM state WHERE namespace = ? AND key = ?))"
)
_HISTORY_SIZES = (
    "SELECT version, {value} FROM state_history "
    "WHERE namespace = ? AND key = ? AND version < ? ORDER BY version DESC LIMIT ?"
)
_HISTORY_RANGE = (
    "SELECT version, value, updated_by, updated_at, event_type, principal FROM state_history "
    "WHERE namespace = ? AND key = ? AND version < ? AND version >= ? ORDER BY version DESC"
)
SIZE_BATCH = 1000  # rows whose sizes one statement of page_end reads
_BYTES = re.compile(r"\{([\w.]+)\}")


def sizes_sql(db: Database, template: str) -> str:
    """``template`` with each ``{column}`` replaced by ``db``'s expression for the size in
    bytes of that text column (``Database.byte_length``): how a component writes a page's
    size statement once for every engine."""
    return _BYTES.sub(lambda m: db.byte_length(m.group(1)), template)


def page_end(
    conn: Connection | Database,  # a snapshot's connection, or a database (reads outside one)
    sizes_sql: str,
    params: Sequence[Any],
    start: Any,
    limit: int,
    max_bytes: int | None,
    too_large: Callable[[Any, int], Exception] | None = None,
) -> tuple[Any, int, bool]:
    """Where a page that starts after ``start`` ends, read from its rows' sizes alone, so that
    no value past the page's byte budget is ever fetched: ``sizes_sql`` gives ``(position,
    stored size)`` rows in page order after a position (its last two parameters: the position
    and a row limit), SIZE_BATCH at a time. A page takes rows while it has fewer than
    ``limit`` and, past its first, their sizes add up to at most ``max_bytes`` (None: no
    bound). Returns the last position taken (``start`` if none), how many rows were taken,
    and whether rows remain after it. With ``too_large``, a first row over ``max_bytes`` is
    not taken: ``too_large(position, size)`` is raised, before any value is read."""
    taken, total, last = 0, 0, start
    while True:
        want = min(limit - taken, SIZE_BATCH) + 1
        args = (*params, last, want)
        rows = conn.fetchall(sizes_sql, args)
        for position, size in rows:
            size = int(size or 0)
            if not taken and too_large is not None and max_bytes is not None and size > max_bytes:
                raise too_large(position, size)
            if taken == limit or (taken and max_bytes is not None and total + size > max_bytes):
                return last, taken, True
            last, taken, total = position, taken + 1, total + size
        if len(rows) < want:
            return last, taken, False


STATE_CHANGES = ChangeSource(
    name="state",
    max_sql="SELECT max(id) FROM state_history",
    since_sql="SELECT id, namespace, key FROM state_history WHERE id > ? ORDER BY id",
    topics=lambda row: (("k", row[1], row[2]),),
)


def key_topic(namespace: str, key: str) -> Topic:
    """The change-feed topic of one key."""
    return ("k", namespace, key)


def _check_page(namespace: str, after: str, limit: int | None, max_bytes: int | None) -> None:
    """The arguments of a paged read (list_page, export); None: not bounded that way."""
    check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
    if after:
        check_text("after", after, MAX_KEY_LENGTH)
    if limit is not None:
        check_int("limit", limit, minimum=1)
    if max_bytes is not None:
        check_int("max_bytes", max_bytes, minimum=1)


class StateStore:
    """A versioned key-value store of JSON values, safe across threads and processes.

    ``path`` is a file path, ``":memory:"`` (one process only; gone when closed), a
    ``postgresql://`` URL (needs the ``agenthold[postgres]`` extra) or an open ``Database``.
    ``read_only`` opens an existing database without ever writing or creating it.
    ``durability`` is "normal" (survives a process crash; a power loss may drop the last
    commits) or "full" (fsync on every commit). ``busy_timeout`` is how long a write waits for
    another writer before raising BusyError. ``max_value_bytes`` caps one value's JSON size.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Database,
        *,
        read_only: bool = False,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout: float = 5.0,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self.max_value_bytes = check_int("max_value_bytes", max_value_bytes, minimum=1)
        if not isinstance(path, (str, os.PathLike)) and hasattr(path, "ensure"):
            self.db: Database = path  # a Database opened by the caller
        else:
            target: Any = path  # SQLiteDatabase checks its type
            self.db = open_database(
                target, read_only=read_only, durability=durability, busy_timeout=busy_timeout
            )
        self.db.ensure(STORE_SCHEMA)
        self.db.add_change_source(STATE_CHANGES)
        self._list_sizes = sizes_sql(self.db, _LIST_SIZES)
        self._history_sizes = sizes_sql(self.db, _HISTORY_SIZES)
        self._export_sizes = sizes_sql(self.db, _EXPORT_SIZES)

    @property
    def path(self) -> str:
        return self.db.path

    @property
    def read_only(self) -> bool:
        return self.db.read_only

    def close(self) -> None:
        """Close every connection. The store cannot be used afterwards."""
        self.db.close()

    def backup(self, dest: str | os.PathLike[str]) -> str:
        """Copy a SQLite database into the new file ``dest`` while it is in use (see
        ``SQLiteDatabase.backup``); returns the path written. PostgreSQL has pg_dump."""
        backup = getattr(self.db, "backup", None)
        if backup is None:
            raise InvalidInputError(
                f"{self.path} is not a SQLite file; back up a PostgreSQL database with pg_dump"
            )
        written: str = backup(dest)
        return written

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StateStore({self.path!r}, read_only={self.read_only})"

    # -- reading -------------------------------------------------------------------------------

    def get(self, namespace: str, key: str) -> Record:
        """Return the live record of ``key``. Raises NotFoundError if it has none, and
        DamagedRecordError if its stored value is not strict JSON."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        row = self.db.fetchone(_GET, (namespace, key))
        if row is None:
            raise NotFoundError(namespace, key)
        try:
            value = read_json(row[0])
        except NotJsonError as exc:
            raise DamagedRecordError(namespace, key, row[1], str(exc), row[2], row[3]) from None
        return make_record(namespace, key, value, row[1], row[2], row[3])

    def list_keys(
        self, namespace: str, *, damaged: list[DamagedRecordError] | None = None
    ) -> list[Record]:
        """Return the live records of ``namespace``, sorted by key (empty if there are none).

        A key whose stored value is not strict JSON raises DamagedRecordError, unless a list
        is given as ``damaged``: then the key is left out and its error appended there."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        records: list[Record] = []
        for k, v, ver, by, at in self.db.fetchall(_LIST, (namespace,)):
            try:
                records.append(make_record(namespace, k, read_json(v), ver, by, at))
            except NotJsonError as exc:
                _damaged(damaged, DamagedRecordError(namespace, k, ver, str(exc), by, at))
        return records

    def list_page(
        self,
        namespace: str,
        *,
        after: str = "",
        limit: int = DEFAULT_PAGE_LIMIT,
        max_bytes: int = MAX_PAGE_BYTES,
        damaged: list[DamagedRecordError] | None = None,
    ) -> tuple[list[Record], str | None]:
        """One page of ``list_keys``: the live records with keys after ``after``, at most
        ``limit`` of them and, past the first, no more than about ``max_bytes`` of stored values;
        and the key to pass as ``after`` for the next page (None: there is none). A namespace
        of any size is listed in bounded pieces this way. Damaged keys count towards ``limit``
        and are raised or collected in ``damaged`` as in ``list_keys``."""
        _check_page(namespace, after, limit, max_bytes)
        with self.db.snapshot() as conn:
            last, taken, more = page_end(
                conn, self._list_sizes, (namespace,), after, min(limit, 2**62), max_bytes
            )
            rows = conn.fetchall(_LIST_RANGE, (namespace, after, last)) if taken else []
        records: list[Record] = []
        for k, v, ver, by, at in rows:
            try:
                records.append(make_record(namespace, k, read_json(v), ver, by, at))
            except NotJsonError as exc:
                _damaged(damaged, DamagedRecordError(namespace, k, ver, str(exc), by, at))
        return records, (last if more else None)

    def list_namespaces(self) -> list[NamespaceInfo]:
        """Return every namespace with live records and how many it holds, sorted by name."""
        rows = self.db.fetchall(
            "SELECT namespace, count(*) FROM state WHERE deleted = 0 "
            "GROUP BY namespace ORDER BY namespace"
        )
        return [NamespaceInfo(ns, n) for ns, n in rows]

    def namespace_summaries(self) -> list[dict[str, Any]]:
        """Every namespace ever written, sorted: its live and deleted key counts, and the time
        and writer of its latest change (for the inspector)."""
        rows = self.db.fetchall(
            "SELECT g.namespace, g.live, g.deleted, g.at, (SELECT s.updated_by FROM state AS s "
            "WHERE s.namespace = g.namespace ORDER BY s.updated_at DESC LIMIT 1) FROM ("
            "SELECT namespace, sum(CASE WHEN deleted = 0 THEN 1 ELSE 0 END) AS live, "
            "sum(deleted) AS deleted, max(updated_at) AS at FROM state GROUP BY namespace"
            ") AS g ORDER BY g.namespace"
        )
        return [
            {
                "namespace": ns,
                "record_count": int(live),
                "deleted_count": int(deleted),
                "updated_at": at,
                "updated_by": by,
            }
            for ns, live, deleted, at, by in rows
        ]

    def was_written(self, namespace: str, key: str | None = None) -> bool:
        """Whether ``namespace`` (or ``key`` in it) was ever written; deleted keys count."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        if key is None:
            sql, params = "SELECT 1 FROM state WHERE namespace = ? LIMIT 1", [namespace]
        else:
            check_text("key", key, MAX_KEY_LENGTH)
            sql, params = "SELECT 1 FROM state WHERE namespace = ? AND key = ?", [namespace, key]
        return self.db.fetchone(sql, params) is not None

    def read_log(
        self,
        conn: Connection,
        namespace: str | None,
        *,
        after: Any = None,
        limit: int | None = None,
        before: int | None = None,
        writer: str | None = None,
    ) -> tuple[list[Any], Any]:
        """History rows ``(id, namespace, key, version, value, updated_by, updated_at,
        event_type)`` in the snapshot ``conn``, oldest first: the last ``limit`` (``after``
        None; below id ``before``, if given), or those committed after ``after``; and the
        position to follow from. ``writer``, if given, keeps only its writes."""
        where = [("namespace = ?", namespace), ("updated_by = ?", writer)]
        where = [(w, p) for w, p in where if p is not None]
        return read_events(
            self.db,
            conn,
            "state_history",
            "id, namespace, key, version, value, updated_by, updated_at, event_type, principal",
            after=after,
            limit=limit,
            before=before,
            where=" AND ".join(w for w, _ in where),
            params=tuple(p for _, p in where),
        )

    def history(
        self,
        namespace: str,
        key: str,
        limit: int = 10,
        *,
        damaged: list[DamagedRecordError] | None = None,
    ) -> list[HistoryEntry]:
        """Return up to ``limit`` writes and deletes of ``key``, newest first. A key that was
        never written has an empty history. An entry whose text is not strict JSON raises
        DamagedRecordError (naming its version), unless a list is given as ``damaged``: then
        the entry is left out and its error appended there."""
        return self.history_page(namespace, key, limit=limit, max_bytes=None, damaged=damaged)[0]

    def history_page(
        self,
        namespace: str,
        key: str,
        *,
        before: int | None = None,
        limit: int = 10,
        max_bytes: int | None = MAX_PAGE_BYTES,
        damaged: list[DamagedRecordError] | None = None,
    ) -> tuple[list[HistoryEntry], int | None]:
        """One page of ``history``: the entries below version ``before`` (None: from the
        newest), newest first, at most ``limit`` of them and, past the first, no more than
        about ``max_bytes`` of stored values (None: no bound); and the version to pass as
        ``before`` for the next page (None: there is none). Damaged entries count towards
        ``limit`` and are raised or collected in ``damaged`` as in ``history``."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_int("limit", limit, minimum=1)
        if before is not None:
            check_int("before", before, minimum=1, maximum=MAX_SQL_INT)
        if max_bytes is not None:
            check_int("max_bytes", max_bytes, minimum=1)
        top = 2**63 - 1 if before is None else before  # versions are below SQLite's largest
        if max_bytes is None and before is None:  # history(): no byte bound, one statement
            rows = self.db.fetchall(_HISTORY, (namespace, key, min(limit, 2**62) + 1))
            more = len(rows) > limit
            rows = rows[:limit]
            last = rows[-1][0] if rows else top
        else:
            with self.db.snapshot() as conn:
                last, taken, more = page_end(
                    conn, self._history_sizes, (namespace, key), top, min(limit, 2**62), max_bytes
                )
                rows = conn.fetchall(_HISTORY_RANGE, (namespace, key, top, last)) if taken else []
        if not rows:  # nothing below ``before``: never written, or compacted away?
            kept = self.compacted_before(namespace, key)
            if kept > 1:
                raise HistoryCompactedError(namespace, key, kept)
        entries: list[HistoryEntry] = []
        for v, val, by, at, *rest in rows:
            try:
                entries.append(make_history_entry(v, read_json(val), by, at, *rest))
            except NotJsonError as exc:
                _damaged(damaged, DamagedRecordError(namespace, key, v, str(exc), by, at))
        return entries, (last if more else None)

    def compacted_before(self, namespace: str, key: str) -> int:
        """The oldest version of ``key`` its history still holds: 1 when compaction removed
        none (or the key was never written), the version after its last one when all of it
        went. Compaction (retention.py) removes only the oldest versions first."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        row = self.db.fetchone(_KEPT_FROM, (namespace, key, namespace, key))
        if row is None or row[0] is None:
            return 1
        return int(row[0])

    def export(
        self,
        namespace: str,
        *,
        after: str = "",
        limit: int | None = None,
        max_bytes: int | None = None,
        damaged: list[DamagedRecordError] | None = None,
    ) -> Export:
        """Return the live records of ``namespace`` with their full histories, read in one
        snapshot so no write can slip between the records and their histories.

        Paged like ``list_page`` when ``limit`` or ``max_bytes`` is given: the keys after
        ``after``, at most ``limit`` of them and at most ``max_bytes`` of stored values and
        history; ``next_after`` says where the next page starts. Each page is one snapshot;
        pages taken one after another are not one. A page holds each key whole, with its whole
        history, so a page that would start with a key over ``max_bytes`` by itself raises
        KeyTooLargeError before reading any of it (a list or history page may go over by its
        first row, which a value's size limit bounds; a key's history has no bound).

        A key whose live value, or an entry of its history, holds text that is not strict JSON
        raises DamagedRecordError, unless a list is given as ``damaged``: then the error is
        appended there, and the key (its live value damaged: it still counts towards
        ``limit``) or that history entry is left out."""
        _check_page(namespace, after, limit, max_bytes)
        paged = limit is not None or max_bytes is not None
        with self.db.snapshot() as conn:
            exported_at = utc_iso()
            last, taken, more = page_end(
                conn,
                self._export_sizes,
                (namespace,),
                after,
                min(limit, 2**62) if limit is not None else 2**62,
                max_bytes,
                lambda key, size: KeyTooLargeError(namespace, key, size, max_bytes or 0),
            )
            live = conn.fetchall(_LIST_RANGE, (namespace, after, last)) if taken else []
            rows = (
                conn.fetchall(
                    "SELECT h.key, h.version, h.value, h.updated_by, h.updated_at, h.event_type, "
                    "h.principal FROM state_history AS h JOIN state AS s "
                    "ON s.namespace = h.namespace AND s.key = h.key "
                    "WHERE s.namespace = ? AND s.deleted = 0 AND h.key > ? AND h.key <= ? "
                    "ORDER BY h.key, h.version DESC",
                    (namespace, after, last),
                )
                if taken
                else []
            )
        histories: dict[str, list[HistoryEntry]] = {}
        broken: dict[str, list[DamagedRecordError]] = {}
        oldest: dict[str, int] = {}  # newest first: the last row of a key is its oldest kept
        for k, v, val, by, at, *rest in rows:
            oldest[k] = v
            try:
                entry = make_history_entry(v, read_json(val), by, at, *rest)
            except NotJsonError as exc:
                error = DamagedRecordError(namespace, k, v, str(exc), by, at)
                broken.setdefault(k, []).append(error)
                continue
            histories.setdefault(k, []).append(entry)
        records: list[ExportedRecord] = []
        for k, v, ver, by, at in live:
            try:
                record = make_record(namespace, k, read_json(v), ver, by, at)
            except NotJsonError as exc:
                _damaged(damaged, DamagedRecordError(namespace, k, ver, str(exc), by, at))
                continue
            for error in broken.get(k, ()):  # the record goes out without that entry
                _damaged(damaged, error)
            kept = tuple(histories.get(k, ()))
            records.append(ExportedRecord(record, kept, oldest.get(k, ver + 1)))
        next_after = last if paged and more and taken else None
        return Export(namespace, exported_at, tuple(records), next_after)

    def changed_since(self, namespace: str, key: str, since_version: int) -> Record | None:
        """Return the key's state if its version is above ``since_version``: the live record,
        or, if the newest event was a delete, a Record with ``deleted=True`` and value None.
        ``since_version`` 0 means "no value yet": only a live record answers it, so a key that
        was deleted (say by clear_namespace) is waited for until it is written again."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_int("since_version", since_version)
        return self._changed_since(namespace, key, since_version)

    def _changed_since(self, namespace: str, key: str, since_version: int) -> Record | None:
        row = self.db.fetchone(_CURRENT, (namespace, key))
        if row is None or row[0] <= since_version or (since_version == 0 and row[1]):
            return None  # since_version 0 knows of no value: it waits for one, not a tombstone
        version, deleted, value, by, at = row
        if 0 < since_version < version - 1:  # versions were skipped: are they still kept?
            kept = self.compacted_before(namespace, key)
            if kept > since_version + 1:
                raise HistoryCompactedError(namespace, key, kept)
        try:
            return Record(namespace, key, read_json(value), version, by, at, bool(deleted))
        except NotJsonError as exc:
            raise DamagedRecordError(namespace, key, version, str(exc), by, at) from None

    def watch(
        self, namespace: str, key: str, *, since_version: int, timeout: float
    ) -> Record | None:
        """Wait until ``key``'s version goes above ``since_version`` and return its new state
        (see ``changed_since``), or None after ``timeout`` seconds. Returns at once if the key
        is already past ``since_version``. Woken by commits, not by polling the key."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_int("since_version", since_version)
        seconds = check_seconds("timeout", timeout, maximum=MAX_WAIT_SECONDS)
        topics = [key_topic(namespace, key)]

        def look() -> tuple[Record | None, list[Topic], None]:
            return self._changed_since(namespace, key, since_version), topics, None

        found: Record | None = wait_until(self.db, look, seconds, topics)
        return found

    # -- writing -------------------------------------------------------------------------------

    def set(
        self,
        namespace: str,
        key: str,
        value: Any,
        *,
        updated_by: str,
        expected_version: int | None = None,
        principal: str | None = None,
    ) -> SetResult:
        """Write ``value`` and return the new version.

        ``expected_version``: None writes unconditionally; 0 writes only if the key has no live
        record; N writes only if the live version is N. Otherwise raises ConflictError, whose
        ``detail`` carries the current version, value, writer and time. ``principal`` (who
        called, as authenticated) goes into the history entry beside ``updated_by``.
        """
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_text("updated_by", updated_by, MAX_WRITER_LENGTH)
        if expected_version is not None:
            check_int("expected_version", expected_version)
        text = encode_value(value, self.max_value_bytes)
        with self.db.write() as (conn, changed):
            locks = (_key_lock(namespace, key),), (_namespace_lock(namespace),)
            now = utc_iso(self.db.serialize(conn, *locks))  # the database's clock, as leases
            row = conn.execute(_CURRENT, (namespace, key)).fetchone()
            if row is None:
                last, live = 0, 0
            else:
                last = row[0]
                live = 0 if row[1] else last
            if expected_version is not None and expected_version != live:
                raise ConflictError(
                    expected_version, _livemake_record(namespace, key, row), namespace, key
                )
            version = last + 1
            conn.execute(
                _INSERT_HISTORY_BY,
                (namespace, key, version, text, updated_by, now, "write", principal),
            )
            conn.execute(_UPSERT, (namespace, key, text, version, updated_by, now))
            changed.append(("k", namespace, key))
        return SetResult(namespace, key, version, live)

    def delete(
        self,
        namespace: str,
        key: str,
        *,
        deleted_by: str,
        expected_version: int | None = None,
        principal: str | None = None,
    ) -> DeleteResult:
        """Delete ``key``'s live record, leaving a tombstone in its history.

        Raises NotFoundError if the key has no live record, and ConflictError if
        ``expected_version`` is given and is not the live version.
        """
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_text("deleted_by", deleted_by, MAX_WRITER_LENGTH)
        if expected_version is not None:
            check_int("expected_version", expected_version)
        with self.db.write() as (conn, changed):
            locks = (_key_lock(namespace, key),), (_namespace_lock(namespace),)
            now = utc_iso(self.db.serialize(conn, *locks))  # the database's clock, as leases
            row = conn.execute(_CURRENT, (namespace, key)).fetchone()
            if row is None or row[1]:
                raise NotFoundError(namespace, key)
            live = row[0]
            if expected_version is not None and expected_version != live:
                raise ConflictError(
                    expected_version, _livemake_record(namespace, key, row), namespace, key
                )
            version = live + 1
            conn.execute(
                _INSERT_HISTORY_BY,
                (namespace, key, version, None, deleted_by, now, "delete", principal),
            )
            conn.execute(_TOMBSTONE, (version, deleted_by, now, namespace, key))
            changed.append(("k", namespace, key))
        return DeleteResult(namespace, key, live, version, deleted_by, now)

    def clear_namespace(
        self, namespace: str, *, deleted_by: str, principal: str | None = None
    ) -> list[str]:
        """Delete every live record of ``namespace`` in one transaction, a tombstone per key.
        Returns the deleted keys, sorted. There is no version check.

        A namespace name this version refuses (blank, or with a control or invisible character)
        is taken here if it holds live keys: only an agenthold 0.10 database can have brought
        one in, and this is how it is removed (docs/upgrading.md)."""
        refused = refused_name("namespace", namespace, MAX_NAMESPACE_LENGTH)
        if refused is not None and not _0_10_name(namespace):
            raise refused
        check_text("deleted_by", deleted_by, MAX_WRITER_LENGTH)
        with self.db.write() as (conn, changed):
            # no write of the namespace runs now; the time is the database's clock, as leases'
            now = utc_iso(self.db.serialize(conn, (_namespace_lock(namespace),)))
            rows = conn.execute(
                "SELECT key, version FROM state WHERE namespace = ? AND deleted = 0 ORDER BY key",
                (namespace,),
            ).fetchall()
            if refused is not None and not rows:
                raise refused  # nothing stored under it: the name is refused as everywhere
            conn.executemany(
                _INSERT_HISTORY_BY,
                [
                    (namespace, k, v + 1, None, deleted_by, now, "delete", principal)
                    for k, v in rows
                ],
            )
            conn.executemany(_TOMBSTONE, [(v + 1, deleted_by, now, namespace, k) for k, v in rows])
            changed.extend(("k", namespace, k) for k, _ in rows)
        return [k for k, _ in rows]


def _0_10_name(value: object) -> bool:
    """Whether agenthold 0.10 could have stored ``value`` as a name: 1 to 512 characters, no
    NUL (all it checked), and text SQLite can hold."""
    if not isinstance(value, str) or not 0 < len(value) <= 512 or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _namespace_lock(namespace: str) -> str:
    """The name a write of ``namespace`` holds shared, and clear_namespace exclusively."""
    return "state\x1f" + namespace


def _key_lock(namespace: str, key: str) -> str:
    return "state\x1f" + namespace + "\x1f" + key


def read_events(
    db: Database,
    conn: Connection,
    table: str,
    columns: str,
    *,
    after: Any = None,
    limit: int | None = None,
    where: str = "",
    params: tuple[Any, ...] = (),
    before: int | None = None,
) -> tuple[list[Any], Any]:
    """Rows of the append-only event table ``table`` (its first column must be ``id``) that
    committed after position ``after`` (None: the last ``limit`` ever), oldest first, read in
    the snapshot ``conn``; and the position to read from next time. A row that commits late
    is never skipped: the database's ``feed_window`` says which rows are settled. ``before``
    (an id) keeps the rows below it: a page further back."""
    cond, cond_params, position = db.feed_window(conn, table, after)
    if before is not None:
        where, params = " AND ".join(filter(None, ("id < ?", where))), (before, *params)
    sql = f"SELECT {columns} FROM {table} WHERE {cond} " + (f"AND {where} " if where else "")
    if limit is None:
        rows = conn.fetchall(sql + "ORDER BY id", (*cond_params, *params))
    else:
        rows = conn.fetchall(sql + "ORDER BY id DESC LIMIT ?", (*cond_params, *params, limit))
        rows.reverse()
    return rows, position


def _livemake_record(namespace: str, key: str, row: Any) -> Record | None:
    if row is None or row[1]:
        return None
    version, _, value, by, at = row
    try:
        return Record(namespace, key, read_json(value), version, by, at)
    except NotJsonError as exc:
        raise DamagedRecordError(namespace, key, version, str(exc), by, at) from None


def _damaged(into: list[DamagedRecordError] | None, error: DamagedRecordError) -> None:
    """Collect a damaged key's error in ``into``, or raise it if there is no list."""
    if into is None:
        raise error
    into.append(error)
