"""The database seam: everything below the components, behind one protocol.

The room's modules, each one job: errors (``errors.py``), records and the checks of names and
values (``records.py``), components and the one migration runner (``schema.py``), the
``Database`` protocol and its typed connection (``base.py``), waits (``wait.py``), the change
feed's base (``feed.py``) and file events (``watch.py``), the backends (``sqlite.py`` with its
feed ``sqlite_feed.py``, its write-ahead-log reader ``wal.py`` and the 0.10 importer
``legacy.py``; ``postgres.py``), the registry that opens one by a URL's scheme
(``backends.py``), and where a command's database is (``locations.py``). Nothing here imports
a component above it. This face names the seam's public API; names load on first use, so that
a process that needs one module (the edit hook opens a SQLite file) pays for no other.
"""

from __future__ import annotations

from agenthold.lazy import loader

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:
    from agenthold.db.backends import (
        BACKENDS,
        close_all,
        open_database,
    )
    from agenthold.db.base import (
        Connection,
        Cursor,
        Database,
        DatabaseClock,
        Subscription,
    )
    from agenthold.db.errors import (
        AgentholdError,
        BusyError,
        ConflictError,
        DamagedRecordError,
        HistoryCompactedError,
        IncompatibleDatabaseError,
        InvalidInputError,
        KeyTooLargeError,
        NotFoundError,
        UnavailableError,
    )
    from agenthold.db.feed import (
        ChangeFeed,
        FeedSubscription,
    )
    from agenthold.db.postgres import (
        PostgresDatabase,
    )
    from agenthold.db.records import (
        DeleteResult,
        Export,
        ExportedRecord,
        HistoryEntry,
        NamespaceInfo,
        Record,
        SetResult,
        Topic,
        check_int,
        check_seconds,
        check_text,
        decode_value,
        encode_value,
        utc_iso,
    )
    from agenthold.db.schema import (
        ChangeSource,
        Component,
        migrate,
    )
    from agenthold.db.sqlite import (
        SQLiteDatabase,
    )
    from agenthold.db.wait import (
        Waiter,
        wait_until,
    )

__all__ = [
    "BACKENDS",
    "AgentholdError",
    "BusyError",
    "ChangeFeed",
    "ChangeSource",
    "Component",
    "ConflictError",
    "Connection",
    "Cursor",
    "DamagedRecordError",
    "Database",
    "DatabaseClock",
    "DeleteResult",
    "Export",
    "ExportedRecord",
    "FeedSubscription",
    "HistoryCompactedError",
    "HistoryEntry",
    "IncompatibleDatabaseError",
    "InvalidInputError",
    "KeyTooLargeError",
    "NamespaceInfo",
    "NotFoundError",
    "PostgresDatabase",
    "Record",
    "SQLiteDatabase",
    "SetResult",
    "Subscription",
    "Topic",
    "UnavailableError",
    "Waiter",
    "check_int",
    "check_seconds",
    "check_text",
    "close_all",
    "decode_value",
    "encode_value",
    "migrate",
    "open_database",
    "utc_iso",
    "wait_until",
]

_LAZY = {
    "AgentholdError": "agenthold.db.errors",
    "BusyError": "agenthold.db.errors",
    "ConflictError": "agenthold.db.errors",
    "DamagedRecordError": "agenthold.db.errors",
    "HistoryCompactedError": "agenthold.db.errors",
    "IncompatibleDatabaseError": "agenthold.db.errors",
    "InvalidInputError": "agenthold.db.errors",
    "KeyTooLargeError": "agenthold.db.errors",
    "NotFoundError": "agenthold.db.errors",
    "UnavailableError": "agenthold.db.errors",
    "Record": "agenthold.db.records",
    "SetResult": "agenthold.db.records",
    "DeleteResult": "agenthold.db.records",
    "HistoryEntry": "agenthold.db.records",
    "NamespaceInfo": "agenthold.db.records",
    "Export": "agenthold.db.records",
    "ExportedRecord": "agenthold.db.records",
    "Topic": "agenthold.db.records",
    "check_int": "agenthold.db.records",
    "check_seconds": "agenthold.db.records",
    "check_text": "agenthold.db.records",
    "decode_value": "agenthold.db.records",
    "encode_value": "agenthold.db.records",
    "utc_iso": "agenthold.db.records",
    "ChangeSource": "agenthold.db.schema",
    "Component": "agenthold.db.schema",
    "migrate": "agenthold.db.schema",
    "Connection": "agenthold.db.base",
    "Cursor": "agenthold.db.base",
    "Database": "agenthold.db.base",
    "DatabaseClock": "agenthold.db.base",
    "Subscription": "agenthold.db.base",
    "Waiter": "agenthold.db.wait",
    "wait_until": "agenthold.db.wait",
    "ChangeFeed": "agenthold.db.feed",
    "FeedSubscription": "agenthold.db.feed",
    "BACKENDS": "agenthold.db.backends",
    "close_all": "agenthold.db.backends",
    "open_database": "agenthold.db.backends",
    "SQLiteDatabase": "agenthold.db.sqlite",
    "PostgresDatabase": "agenthold.db.postgres",
}


__getattr__ = loader(__name__, _LAZY)
