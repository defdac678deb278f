"""How long a database keeps what it only appends to, and the compaction that trims it.

State history, claim events and bus messages are append-only; left alone they grow for as
long as a team's server runs. This module keeps the rules that bound them and removes what they
let go. Decisions behind it:
- The rules live in the database (the ``agenthold_retention`` table, a ``store.Component`` of
  its own), so every server and command on one database agrees on them. No row means "keep
  everything": a database that never set a rule behaves exactly as before this module.
- A rule is set for the whole database and may be overridden for one namespace (state
  history) or one thread (messages). A value of 0 means "keep everything", so an override can
  lift a database-wide bound; removing an override (``inherit``) falls back to the database's.
- Compaction never holds the write lock for long: it walks each table by id in ranges of
  ``batch`` rows and commits after each range, so a writer waits for one range at most. It
  removes only history rows: a key's row in ``state`` stays, so its next version continues
  after the last one (versions are never reused, even when all of a key's history goes) and a
  deleted key's tombstone, its newest history row, is the last of its rows to go. The live
  version of a live key is never removed. The newest row of ``state_history`` and of
  ``claim_events`` (the largest id) always stays, so SQLite never hands its id out again and
  change feeds in other processes, which follow a table by id, miss no row. Claims' rows (and
  their fencing versions) and read cursors are never touched.
- Space: SQLite gives freed pages back only in a file made with ``auto_vacuum=INCREMENTAL``,
  which a file can be switched to only by a full ``VACUUM`` (which blocks writers while it
  runs). New files are made that way by this version; for them ``compact`` runs
  ``PRAGMA incremental_vacuum`` in small steps, each its own short write. PostgreSQL's
  autovacuum takes the dead rows back on its own; compaction leaves that to it.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agenthold.store import (
    MAX_NAMESPACE_LENGTH,
    Component,
    Database,
    InvalidInputError,
    check_text,
    utc_iso,
)

__all__ = [
    "RETENTION_SCHEMA",
    "SETTINGS",
    "CompactReport",
    "Retention",
    "compact",
    "parse_setting",
    "read_retention",
    "retention_summary",
    "set_retention",
]

RETENTION_SCHEMA = Component("retention", 1)  # agenthold_retention; its scripts: db/*_schema.py

#: Every setting, what it bounds, and the scopes that may override it.
SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "history.versions": ("state history: versions kept per key", ("database", "namespace")),
    "history.age": ("state history: how long a version is kept", ("database", "namespace")),
    "claims.age": ("claim events: how long an event is kept", ("database",)),
    "messages.count": ("the bus: messages kept per thread", ("database", "thread")),
    "messages.age": ("the bus: how long a message is kept", ("database", "thread")),
}
_AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_MAX_VALUE = 2**62
DEFAULT_BATCH = 1000  # rows per committed range: a few milliseconds of the write lock
VACUUM_STEP = 256  # pages freed per incremental_vacuum write


@dataclass(frozen=True)
class Retention:
    """The rules in force: the database's (``database``, setting to value) and each
    namespace's and thread's overrides. A value of 0, or a setting absent, keeps everything."""

    database: dict[str, int] = field(default_factory=dict)
    namespaces: dict[str, dict[str, int]] = field(default_factory=dict)
    threads: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def keeps_everything(self) -> bool:
        """Whether no rule bounds anything (compaction then has nothing to do)."""
        groups = [self.database, *self.namespaces.values(), *self.threads.values()]
        return not any(v for group in groups for v in group.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "database": {name: self.database.get(name, 0) for name in SETTINGS},
            "namespaces": self.namespaces,
            "threads": self.threads,
            "keeps_everything": self.keeps_everything,
        }


def parse_setting(text: str) -> tuple[str, int | None]:
    """``NAME=VALUE`` from the command line: a count, an age (``30d``, ``12h``, ``90m``,
    ``3600s`` or seconds), ``keep`` (0: keep everything) or ``inherit`` (None: drop an
    override). Raises InvalidInputError naming what is wrong."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip().lower()
    if not sep or name not in SETTINGS:
        raise InvalidInputError(
            f"retention setting {text!r} is not NAME=VALUE with NAME one of " + ", ".join(SETTINGS)
        )
    if value == "inherit":
        return name, None
    if value == "keep":
        return name, 0
    if name.endswith(".age"):
        match = re.fullmatch(r"(\d{1,12})([smhdw]?)", value)
        if match is None:
            raise InvalidInputError(
                f"{name}={value!r} is not an age; give seconds or a number with s, m, h, d or "
                "w (say 30d), or keep"
            )
        number = int(match.group(1)) * _AGES[match.group(2) or "s"]
    elif re.fullmatch(r"\d{1,18}", value):
        number = int(value)
    else:
        raise InvalidInputError(f"{name}={value!r} is not a count; give a whole number or keep")
    return name, number  # at most 18 digits (or 12 of weeks): below _MAX_VALUE


def read_retention(db: Database) -> Retention:
    """The rules stored in ``db`` (all absent if it never had any)."""
    if not db.has_table("agenthold_retention"):
        return Retention()
    found = Retention()
    rows = db.fetchall(
        "SELECT scope, name, setting, value FROM agenthold_retention ORDER BY scope, name, setting"
    )
    for scope, name, setting, value in rows:
        if setting not in SETTINGS:  # a newer agenthold's rule: not ours to apply
            continue
        if scope == "database":
            found.database[setting] = int(value)
        elif scope == "namespace":
            found.namespaces.setdefault(name, {})[setting] = int(value)
        elif scope == "thread":
            found.threads.setdefault(name, {})[setting] = int(value)
    return found


def set_retention(
    db: Database,
    settings: dict[str, int | None],
    *,
    namespace: str | None = None,
    thread: str | None = None,
) -> Retention:
    """Store ``settings`` (name to value; None drops the override) for the database, one
    namespace or one thread, in one transaction; returns the rules now in force."""
    if namespace is not None and thread is not None:
        raise InvalidInputError("retention: give a namespace or a thread, not both")
    if not settings:
        raise InvalidInputError("retention set: give at least one NAME=VALUE")
    scope, name = "database", ""
    if namespace is not None:
        scope, name = "namespace", check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
    elif thread is not None:
        scope, name = "thread", check_text("thread", thread, MAX_NAMESPACE_LENGTH)
    for setting, value in settings.items():
        if setting not in SETTINGS:
            raise InvalidInputError(f"unknown retention setting {setting!r}")
        if scope not in SETTINGS[setting][1]:
            where = " or ".join(s for s in SETTINGS[setting][1] if s != "database")
            also = f"only per {where} or for the database" if where else "only for the database"
            raise InvalidInputError(f"{setting} cannot be set per {scope}; {also}")
        if value is not None and (not isinstance(value, int) or not 0 <= value <= _MAX_VALUE):
            raise InvalidInputError(f"{setting}: {value!r} is not a whole number from 0")
    db.ensure(RETENTION_SCHEMA)
    with db.write() as (conn, _):
        for setting, value in settings.items():
            conn.execute(
                "DELETE FROM agenthold_retention WHERE scope = ? AND name = ? AND setting = ?",
                (scope, name, setting),
            )
            if value is not None and not (scope == "database" and value == 0):
                conn.execute(
                    "INSERT INTO agenthold_retention (scope, name, setting, value) "
                    "VALUES (?, ?, ?, ?)",
                    (scope, name, setting, value),
                )
    return read_retention(db)


def describe_value(setting: str, value: int) -> str:
    """A value as people read it: ``keep``, a count, or an age in its largest whole unit."""
    if value == 0:
        return "keep"
    if not setting.endswith(".age"):
        return str(value)
    for unit in ("w", "d", "h", "m"):
        if value % _AGES[unit] == 0:
            return f"{value // _AGES[unit]}{unit}"
    return f"{value}s"


def retention_summary(db: Database) -> list[dict[str, str]]:
    """The rules as rows for a status page or ``agenthold retention``: scope, name, setting,
    value (``keep`` where nothing is bounded) and what the setting bounds."""
    rules = read_retention(db)
    rows = [
        {
            "scope": "database",
            "name": "",
            "setting": s,
            "value": describe_value(s, rules.database.get(s, 0)),
            "bounds": SETTINGS[s][0],
        }
        for s in SETTINGS
    ]
    for scope, groups in (("namespace", rules.namespaces), ("thread", rules.threads)):
        for name, group in groups.items():
            for s, v in group.items():
                rows.append(
                    {
                        "scope": scope,
                        "name": name,
                        "setting": s,
                        "value": describe_value(s, v),
                        "bounds": SETTINGS[s][0],
                    }
                )
    return rows


# -- compaction -----------------------------------------------------------------------------


@dataclass
class CompactReport:
    """What a compaction removed (or, dry run, would remove), per kind, and what it did about
    the space: ``space`` says it in words, ``pages_freed`` counts SQLite pages given back."""

    dry_run: bool
    history: int = 0
    claim_events: int = 0
    messages: int = 0
    batches: int = 0
    pages_freed: int = 0
    space: str = ""
    stopped: bool = False  # ``stop`` ended the pass before it was done

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "removed": {
                "history": self.history,
                "claim_events": self.claim_events,
                "messages": self.messages,
            },
            "batches": self.batches,
            "pages_freed": self.pages_freed,
            "space": self.space,
            "stopped": self.stopped,
        }


@dataclass(frozen=True)
class _Pass:
    """One DELETE over one table: its condition (on the table's own columns, with ``t`` the
    table's name in correlated subqueries) and parameters."""

    kind: str
    table: str
    condition: str
    params: tuple[Any, ...]


def _cutoff(db: Database, age: int) -> str:
    return utc_iso(max(db.now() - age, 0.0))


def _scoped(
    groups: dict[str, dict[str, int]], column: str
) -> list[tuple[str, tuple[Any, ...], str]]:
    """(extra condition, its params, override name or '') for the database-wide pass, which
    leaves every overridden name out, then one per override."""
    names = sorted(groups)
    default = (
        (f"{column} NOT IN ({', '.join('?' for _ in names)})", tuple(names), "")
        if names
        else ("1 = 1", (), "")
    )
    return [default, *((f"{column} = ?", (n,), n) for n in names)]


def _history_passes(db: Database, rules: Retention) -> list[_Pass]:
    passes = []
    for extra, params, name in _scoped(rules.namespaces, "namespace"):
        group = {**rules.database, **rules.namespaces.get(name, {})}
        versions, age = group.get("history.versions", 0), group.get("history.age", 0)
        bounds: list[str] = []
        bound_params: list[Any] = []
        if versions:
            bounds.append("state_history.version <= s.version - ?")
            bound_params.append(versions)
        if age:  # the live version stays; a deleted key's tombstone goes last
            bounds.append(
                "(state_history.updated_at < ? AND "
                "(state_history.version < s.version OR s.deleted = 1))"
            )
            bound_params.append(_cutoff(db, age))
        if bounds:
            passes.append(
                _Pass(
                    "history",
                    "state_history",
                    f"{extra} AND EXISTS (SELECT 1 FROM state AS s WHERE "
                    "s.namespace = state_history.namespace AND s.key = state_history.key AND ("
                    + " OR ".join(bounds)
                    + "))",
                    (*params, *bound_params),
                )
            )
    return passes


def _message_passes(db: Database, rules: Retention) -> list[_Pass]:
    passes = []
    for extra, params, name in _scoped(rules.threads, "thread_id"):
        group = {**rules.database, **rules.threads.get(name, {})}
        count, age = group.get("messages.count", 0), group.get("messages.age", 0)
        bounds: list[str] = []
        bound_params: list[Any] = []
        if count:
            bounds.append(
                "seq <= (SELECT t.last_seq FROM msg_threads AS t "
                "WHERE t.thread_id = msg_messages.thread_id) - ?"
            )
            bound_params.append(count)
        if age:
            bounds.append("created_at < ?")
            bound_params.append(_cutoff(db, age))
        if bounds:
            passes.append(
                _Pass(
                    "messages",
                    "msg_messages",
                    f"{extra} AND (" + " OR ".join(bounds) + ")",
                    (*params, *bound_params),
                )
            )
    return passes


# The row holding a table's largest id stays. SQLite gives a new row of a table without
# AUTOINCREMENT (state_history, claim_events) the largest id plus one: were that row removed,
# its id would be handed out again, and a change feed in another process, which follows the
# table by the newest id it has read, would never see the new row (a watch or a queued wait
# there sleeps to its deadline). msg_messages has AUTOINCREMENT, so its ids are never reused.
_KEEP_NEWEST = " AND {table}.id < (SELECT max(newest.id) FROM {table} AS newest)"


def _passes(db: Database, rules: Retention) -> list[_Pass]:
    passes = _history_passes(db, rules)
    age = rules.database.get("claims.age", 0)
    if age and db.has_table("claim_events"):
        passes.append(_Pass("claim_events", "claim_events", "at < ?", (_cutoff(db, age),)))
    passes = [
        dataclasses.replace(p, condition=p.condition + _KEEP_NEWEST.format(table=p.table))
        for p in passes
    ]
    if db.has_table("msg_messages"):
        passes.extend(_message_passes(db, rules))
    return passes


def compact(
    db: Database,
    *,
    dry_run: bool = False,
    batch: int = DEFAULT_BATCH,
    vacuum_step: int = VACUUM_STEP,
    stop: Callable[[], bool] | None = None,
) -> CompactReport:
    """Remove what the stored rules no longer keep (``dry_run``: only count it), walking each
    table by id in ranges of ``batch`` ids, one short committed write per range; then, on a
    SQLite file made with incremental auto-vacuum, give the freed pages back ``vacuum_step``
    pages per write. Safe while servers read and write the database. ``stop``, if given, is
    asked before each batch: True ends the pass there (``stopped`` on the report)."""
    if not isinstance(batch, int) or batch < 1:
        raise InvalidInputError(f"batch must be a whole number from 1, not {batch!r}")
    rules = read_retention(db)
    report = CompactReport(dry_run)
    for p in _passes(db, rules):
        if dry_run:
            row = db.fetchone(f"SELECT count(*) FROM {p.table} WHERE {p.condition}", p.params)
            setattr(report, p.kind, getattr(report, p.kind) + int(row[0]))
            continue
        low, high = db.fetchone(f"SELECT min(id), max(id) FROM {p.table}")
        if low is None:
            continue
        sql = f"DELETE FROM {p.table} WHERE id >= ? AND id < ? AND {p.condition}"
        start = int(low)
        while start <= int(high):
            if stop is not None and stop():
                report.stopped = True
                return report
            began = time.monotonic()
            with db.write() as (conn, _):
                removed = conn.execute(sql, (start, start + batch, *p.params)).rowcount
            _let_writers_in(began)
            report.batches += 1
            setattr(report, p.kind, getattr(report, p.kind) + max(removed, 0))
            start += batch
    report.space = _give_space_back(db, report, vacuum_step)
    return report


def _let_writers_in(began: float) -> None:
    """Pause after a batch for as long as it held the write lock (1 ms at least). A writer of
    another process that found the lock taken sleeps in SQLite's busy handler and retries; a
    compaction that took the lock again at once could win every retry, and that writer would
    wait for many batches instead of one."""
    time.sleep(max(time.monotonic() - began, 0.001))


def _give_space_back(db: Database, report: CompactReport, step: int) -> str:
    """Hand the pages compaction freed back to the file system, as the backend can (SQLite's
    incremental vacuum, ``step`` pages per write; PostgreSQL's autovacuum does it by itself)."""
    freed, said = db.give_space_back(step, report.dry_run, _let_writers_in)
    report.pages_freed += freed
    return said
