"""Taking over an agenthold 0.10 SQLite file: its records imported into the store's tables.

SQLite's schema (sqlite_schema.py, ``ADOPTIONS``) names ``adopt_0_10`` as the store's
adoption step: the one migration runner calls it inside the transaction that first creates
the store's tables, and when the file holds 0.10's tables (``state_records`` and its
``state_history``, no application id) it moves the old history aside and returns the import,
run after the scripts. SQLite only: 0.10 knew no other engine. Standard library only (the
copyable store carries this module).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

from agenthold.db.base import LazyLogger
from agenthold.db.records import MAX_KEY_LENGTH, MAX_NAMESPACE_LENGTH, refused_name

__all__ = ["LEGACY_TABLES", "adopt_0_10"]

log = LazyLogger("agenthold.db.legacy")  # logging is imported with the first message

_INSERT = (
    "INSERT INTO state_history (namespace, key, version, value, updated_by, updated_at, "
    "event_type) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def adopt_0_10(conn: Any) -> Callable[[], None] | None:
    """If the file is agenthold 0.10's, move its history table aside (the store's scripts make
    one of the same name) and return the import to run after them; else None."""
    if conn.execute("PRAGMA application_id").fetchone()[0] != 0:
        return None
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'state_records'"
    ).fetchone()
    if found is None:
        return None
    conn.execute("ALTER TABLE state_history RENAME TO legacy_history")
    return lambda: _import_legacy(conn)


LEGACY_TABLES = {"state_records", "state_history"}  # agenthold 0.10 and older
LEGACY_INTERNAL = ("claims", "_agents")  # namespaces where 0.10 kept claims and agents


def _import_legacy(conn: Any) -> None:
    """Import the records of an agenthold 0.10 database (tables state_records and, renamed
    before this runs, legacy_history) into the current schema, then drop the old tables.

    0.10 restarted a key's versions at 1 after a delete and gave a delete the deleted version.
    Each key's events are renumbered 1, 2, 3... in commit order, so every version is unique
    and a writer holding a version from before the upgrade gets a conflict, never a silent
    overwrite. Claims and agents (0.10 kept them as records) are not imported: agents
    register again. NaN and Infinity, which 0.10 let through, become null.
    """
    columns = {row[1] for row in conn.execute("PRAGMA table_info(legacy_history)")}
    event = "event_type" if "event_type" in columns else "'write'"
    skip = ", ".join("?" for _ in LEGACY_INTERNAL)
    last: dict[tuple[str, str], tuple[int, str | None, str, str, bool]] = {}

    def history_rows() -> Iterator[tuple[Any, ...]]:
        rows = conn.execute(
            f"SELECT namespace, key, value, updated_by, updated_at, {event} FROM legacy_history "
            f"WHERE namespace NOT IN ({skip}) ORDER BY namespace, key, id",
            LEGACY_INTERNAL,
        )
        for ns, key, value, by, at, kind in rows:
            deleted = kind == "delete"
            version = last[(ns, key)][0] + 1 if (ns, key) in last else 1
            text = None if deleted else _strict_json(value)
            last[(ns, key)] = (version, text, by, at, deleted)
            yield ns, key, version, text, by, at, "delete" if deleted else "write"

    conn.executemany(_INSERT, history_rows())
    live = conn.execute(
        f"SELECT namespace, key, value, updated_by, updated_at FROM state_records "
        f"WHERE namespace NOT IN ({skip})",
        LEGACY_INTERNAL,
    ).fetchall()
    for ns, key, value, by, at in live:
        text = _strict_json(value)
        known = last.get((ns, key))
        if known is None or known[4] or known[1] != text:  # the history misses this write
            version = known[0] + 1 if known else 1
            conn.execute(_INSERT, (ns, key, version, text, by, at, "write"))
            last[(ns, key)] = (version, text, by, at, False)
    conn.executemany(
        "INSERT INTO state (namespace, key, value, version, updated_by, updated_at, deleted) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(ns, key, text, v, by, at, int(d)) for (ns, key), (v, text, by, at, d) in last.items()],
    )
    conn.execute("DROP TABLE legacy_history")
    conn.execute("DROP TABLE state_records")
    _report_refused_names([name for name, (*_, deleted) in last.items() if not deleted])


def _report_refused_names(names: list[tuple[str, str]]) -> None:
    """Warn of imported live names that this version refuses: 0.10 checked only for emptiness, NUL
    and length, so it may have stored a blank name or one with a newline. They are imported as
    they are (dropping them would lose data), listed and exported with the rest of their
    namespace; but no call can name them, so say once, now, how to remove them."""
    spaces = sorted({ns for ns, _ in names if refused_name("n", ns, MAX_NAMESPACE_LENGTH)})
    keys = [
        f"{key!r} in {ns!r}"
        for ns, key in sorted(names)
        if ns not in spaces and refused_name("k", key, MAX_KEY_LENGTH)
    ]
    if not spaces and not keys:
        return

    def some(items: list[str]) -> str:
        shown = ", ".join(items[:5])
        return shown + (f" and {len(items) - 5} more" if len(items) > 5 else "")

    found = ([f"namespaces {some([repr(n) for n in spaces])}"] if spaces else []) + (
        [f"keys {some(keys)}"] if keys else []
    )
    log.warning(
        "the agenthold 0.10 database holds names this version refuses (blank, or with a "
        "control or invisible character): %s. They were imported and are listed, but no call "
        "can name them but clear_namespace, which removes them with the rest of their namespace "
        "(docs/upgrading.md)",
        "; ".join(found),
    )


def _strict_json(text: str | None) -> str:
    """``text`` if it is strict JSON; else the same value with NaN and Infinity as null."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        json.loads(text or "null", parse_constant=refuse)
        return text or "null"
    except ValueError:
        pass
    try:
        value = json.loads(text or "null")
    except ValueError:
        return json.dumps(text)  # not JSON at all: keep the text as a string
    return json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value
