"""Components and their migrations: the one runner every backend uses, with its hooks.

Each part of agenthold (the store, claims, the message bus, retention) declares a ``Component``:
its name and version, no SQL. Each backend owns its scripts (``sqlite_schema.py``,
``postgres_schema.py``) and hands them out by component name (``Migrations``). ``migrate`` is
the one runner: inside a backend's write transaction it runs the backend's adoption step for
the component (if any), the backend's scripts from the version the database has, and records
the new version in ``agenthold_components``. The backend also supplies how a script runs
(``run``: SQLite splits it, PostgreSQL sends it whole), the transaction and lock around it,
and checks of whose database it is.

Also here: a component's ``ChangeSource`` (its append-only event table, for the change feed),
and the constants of agenthold's SQLite files: the application id, the layouts (``PRAGMA
user_version``) and the database id that tells a restored file from the one a process opened.
Standard library only (the copyable store carries this module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agenthold.db.records import Topic

__all__ = [
    "APPLICATION_ID",
    "COMPONENTS_SQL",
    "DATABASE_ID_SQL",
    "FRESH",
    "ID_PREFIX",
    "LAYOUTS",
    "META_SQL",
    "SCHEMA_VERSION",
    "Adoption",
    "ChangeSource",
    "Component",
    "Migrations",
    "migrate",
    "split_sql",
]

APPLICATION_ID = 0x41474844  # "AGHD" in PRAGMA application_id marks a file as ours
# PRAGMA user_version is the layout of a file. Files of agenthold 0.11 before components: 1 (the
# store's and claims' tables at version 1 each), 2 (claims at version 2) and 3 (principal
# columns: store 2, claims 3). 4: the table agenthold_components names each component's
# version. Files of layouts 1 to 3 open as they are (a component that keeps its version in
# agenthold_components, such as the message bus, may add that table to them); the first store or
# claims migration moves a file to layout 4.
SCHEMA_VERSION = 4
LAYOUTS = {1: {"store": 1, "claims": 1}, 2: {"store": 1, "claims": 2}, 3: {"store": 2, "claims": 3}}
COMPONENTS_SQL = (
    "CREATE TABLE IF NOT EXISTS agenthold_components ("
    "component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
)
# Every SQLite file of agenthold carries a database id of its own, so that a file replaced by
# another (a backup restored over it) is told apart from the file a process opened, even when
# it has the same inode (cp) or the same contents up to some moment. The id's row lives alone
# on a page that is written only when the id is made, so reading that page from the file
# itself (not through SQLite's cache or the WAL) says which file is there now. A copy made by
# `agenthold backup` gets a new id ending in FRESH until a writer first opens it: a WAL found
# beside a file that no writer ever opened cannot be that file's.
META_SQL = "CREATE TABLE IF NOT EXISTS agenthold_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
ID_PREFIX = "agenthold-id:"
FRESH = ":fresh"


@dataclass(frozen=True)
class Component:
    """One part of agenthold whose tables a database holds, at ``version``.

    A database records each component's version apart, so a program that uses only the store
    (say a copied store) creates only the store's tables, and claims add theirs later. The
    scripts that take a component from version n to n + 1 are each backend's
    (``Migrations.migrations``): the component names no dialect.
    """

    name: str
    version: int


Adoption = Callable[[Any], Callable[[], None] | None]


class Migrations(Protocol):
    """What a backend tells the runner about a component's tables.

    ``migrations(name)[n]`` is the script that takes component ``name`` from version n to
    n + 1 on this backend. ``adoption(name)``, if not None, runs before the scripts of a
    migration (inside its transaction) and may return a step to run after them: how a
    component takes over the tables of an older layout (SQLite's store imports agenthold
    0.10's, see legacy.py).
    """

    def migrations(self, component: str) -> tuple[str, ...]: ...
    def adoption(self, component: str) -> Adoption | None: ...


@dataclass(frozen=True)
class ChangeSource:
    """An append-only table whose new rows tell the change feed what changed.

    ``max_sql`` returns the newest id; ``since_sql`` takes an id and returns ``(id, ...)`` rows
    after it; ``topics`` turns such a row into the topics to wake.
    """

    name: str
    max_sql: str
    since_sql: str
    topics: Callable[[tuple[Any, ...]], Iterable[Topic]]


def split_sql(script: str) -> list[str]:
    """The statements of a migration script, one per ``;`` at a line's end (comment lines
    dropped), for drivers that run one statement per call."""
    statements, current = [], []
    for line in script.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        current.append(line)
        if stripped.endswith(";"):
            statements.append("\n".join(current))
            current = []
    return statements


DATABASE_ID_SQL = "SELECT value FROM agenthold_meta WHERE name = 'database_id'"


def migrate(
    conn: Any,
    component: Component,
    have: int,
    backend: Migrations,
    run: Callable[[Any, str], None],
    implied: Mapping[str, int] | None = None,
) -> None:
    """Take ``component`` from version ``have`` to its own, inside the caller's transaction on
    ``conn`` (a connection of the seam, ``?`` placeholders): the backend's adoption step for
    it, ``run(conn, script)`` for each of the backend's scripts from ``have`` on, then its
    version written down, with ``implied`` (the versions an older layout implied, say 1 to 3
    on SQLite) written where none is yet."""
    scripts = backend.migrations(component.name)
    if len(scripts) < component.version:  # a step added to one backend's file and not another's
        raise RuntimeError(
            f"this backend has {len(scripts)} migration scripts for {component.name!r}, "
            f"not the {component.version} of its version"
        )
    adopt = backend.adoption(component.name)
    finish = adopt(conn) if adopt is not None else None
    for step in range(have, component.version):
        run(conn, scripts[step])
    if finish is not None:
        finish()
    conn.execute(COMPONENTS_SQL)
    if implied:
        conn.executemany(
            "INSERT INTO agenthold_components (component, version) VALUES (?, ?) "
            "ON CONFLICT (component) DO NOTHING",
            list(implied.items()),
        )
    conn.execute(
        "INSERT INTO agenthold_components (component, version) VALUES (?, ?) "
        "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
        (component.name, component.version),
    )
