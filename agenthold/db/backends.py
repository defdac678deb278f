"""Which backend opens a database: a registry keyed by the URL's scheme, loaded lazily.

A path or ``:memory:`` opens the SQLite backend (imported here: the store needs it for every
file). ``open_database("postgresql://...")`` imports ``agenthold.db.postgres`` by name only then
(it needs psycopg, an optional extra); each such backend module names its class ``BACKEND``.
The backends import only the seam's base modules, never this one, so nothing here is a cycle.
``close_all`` closes whatever was opened here. Standard library only (the copyable store
carries this module, with an empty registry: SQLite alone).
"""

from __future__ import annotations

import importlib
import os
import weakref
from typing import Any

from agenthold.db.base import Database
from agenthold.db.errors import InvalidInputError
from agenthold.db.sqlite import SQLiteDatabase

__all__ = ["BACKENDS", "POSTGRES_PREFIXES", "close_all", "open_database"]

# scheme: the module whose BACKEND opens it; a path (or a scheme not listed) is SQLite's. Named
# _LAZY, as the faces' tables of lazily loaded modules are: tests/test_package.py counts what it
# names as imports of this module.
_LAZY = {"postgresql": "agenthold.db.postgres", "postgres": "agenthold.db.postgres"}
BACKENDS: dict[str, str] = _LAZY
POSTGRES_PREFIXES = ("postgresql://", "postgres://")

_MISSING = {
    "agenthold.db.postgres": (
        # Not 'pip install "agenthold[postgres]"': until 0.11 is published that installs
        # the registry's 0.10, which has no such extra. psycopg itself is on the registry.
        "a postgresql:// database needs psycopg 3, which is not installed: "
        'pip install "psycopg[binary,pool]>=3.3,<4" into agenthold\'s environment '
        '(from a checkout: pip install ".[postgres]")'
    ),
}

#: Every database opened through open_database that may still be open, of either engine.
_opened: weakref.WeakSet[Any] = weakref.WeakSet()


def backend_of(target: str) -> str | None:
    """The module of the backend for ``target`` (a URL), or None: a path, SQLite's."""
    scheme, found, _ = target.partition("://")
    return BACKENDS.get(scheme) if found else None


def open_database(
    target: str | os.PathLike[str],
    *,
    read_only: bool = False,
    durability: str = "normal",
    busy_timeout: float = 5.0,
) -> Database:
    """The Database for a file path, ":memory:" or a ``postgresql://`` URL."""
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    name = backend_of(target) if isinstance(target, str) else None  # SQLite says what is wrong
    backend: Any = SQLiteDatabase
    if name is not None:
        try:
            backend = importlib.import_module(name).BACKEND
        except ImportError:
            if name not in _MISSING:
                raise
            raise InvalidInputError(_MISSING[name]) from None
    database: Database = backend(
        target, read_only=read_only, durability=durability, busy_timeout=busy_timeout
    )
    _opened.add(database)
    return database


def close_all() -> None:
    """Close every database this process still has open: for a process about to end without
    the interpreter's teardown (which would close them), since the last connection to close
    is what makes SQLite checkpoint its write-ahead log and remove it. Closing is idempotent."""
    for database in list(_opened):
        database.close()
