"""The tables of agenthold.claims, their migrations, the SQL more than one module runs on them
(by public names), and the change-feed topics of a claim write.

Decisions behind it:
- One ``Component`` ("claims") at its version; each backend owns its numbered migrations
  (agenthold.db), a step never edited once released, a change a new step.
- Topics: a write about a resource notifies ``("r", key)``; one about an agent's lease
  ``("a", agent_id)``. Waiters listen to the resource and to its holder's lease.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any

from agenthold.store import ChangeSource, Component, Topic


def resource_topic(key: str) -> Topic:
    return ("r", key)


def agent_topic(agent_id: str) -> Topic:
    return ("a", agent_id)


def _event_topics(row: tuple[Any, ...]) -> Iterable[Topic]:
    _, resource, agent_id = row
    return (resource_topic(resource),) if resource else (agent_topic(agent_id),)


CLAIMS_LOCK = ("claims",)  # every claim write holds it: claims take turns, on any engine

# The claims tables (agents, claims, claim_events, claim_shares, claim_waiters, claim_patterns)
# are made by each backend's scripts (agenthold/db/sqlite_schema.py, postgres_schema.py); the
# agents table's rows are the agent registry's (agenthold.identity.agents), its lease columns
# the Coordinator's.
CLAIMS_SCHEMA = Component("claims", 8)

CLAIM_CHANGES = ChangeSource(
    name="claims",
    max_sql="SELECT max(id) FROM claim_events",
    since_sql="SELECT id, resource, agent_id FROM claim_events WHERE id > ? ORDER BY id",
    topics=_event_topics,
)

# -- the statements ----------------------------------------------------------------------------
# Every statement that more than one place runs, or that a benchmark's raw baseline runs as the
# library does, is here, by a public name; a one-off statement stays in the method that runs it.

# A claim row as agenthold.claims.rows.claim_info reads it (14 columns: the holder's name and
# lease joined in); a condition follows.
CLAIM_ROW = (
    "SELECT c.resource, c.uri, c.holder, c.claimed_at, c.version, c.last_outcome, "
    "c.last_holder, c.last_outcome_at, c.moved_to, a.name, a.model, a.lease_ends_at, "
    "a.lease_end_outcome, c.scope FROM claims AS c LEFT JOIN agents AS a ON a.agent_id = c.holder "
)
# Held pattern claims lying under the directories given (a file's ancestors; the caller adds
# the placeholders), and held claims whose keys lie in a range (all that a pattern may cover,
# patterns included: a pattern's key starts with its scope).
PATTERNS_AT = CLAIM_ROW + "WHERE c.holder IS NOT NULL AND c.scope IN ({marks})"
# Only the keys and scopes of those patterns: a file is covered by few of the patterns above it,
# so they are matched on these two columns and only the rows of those that cover it are read.
PATTERN_KEYS_AT = (
    "SELECT resource, scope FROM claims WHERE holder IS NOT NULL AND scope IN ({marks})"
)
HELD_UNDER = CLAIM_ROW + "WHERE c.holder IS NOT NULL AND c.resource >= ? AND c.resource < ?"
# Held claims on other names of one file (hard links): see agenthold.claims.rows.
ALIASES = CLAIM_ROW + "WHERE c.file_id = ? AND c.resource != ? AND c.holder IS NOT NULL"
# A claim row with the file it was taken on (a 15th column), for rows.Prefetched: one statement
# reads a set's own rows, the patterns above its files and the claims on other names of its
# files (the conditions are joined with OR; each has its index).
LOOK_COLUMNS = (
    "c.resource, c.uri, c.holder, c.claimed_at, c.version, c.last_outcome, c.last_holder, "
    "c.last_outcome_at, c.moved_to, a.name, a.model, a.lease_ends_at, a.lease_end_outcome, "
    "c.scope, c.file_id"
)
LOOK_ROW = f"SELECT {LOOK_COLUMNS} FROM claims AS c LEFT JOIN agents AS a ON a.agent_id = c.holder "
# The same columns as CLAIM_ROW (so claim_info reads them), for shared holds.
SHARE_ROW = (
    "SELECT s.resource, s.uri, s.agent_id, s.claimed_at, c.version, c.last_outcome, "
    "c.last_holder, c.last_outcome_at, c.moved_to, a.name, a.model, a.lease_ends_at, "
    "a.lease_end_outcome, s.scope FROM claim_shares AS s JOIN claims AS c ON "
    "c.resource = s.resource LEFT JOIN agents AS a ON a.agent_id = s.agent_id "
)
# A wait in the queue with its agent's name, lease end and principal (19 columns).
WAITER_ROW = (
    "SELECT w.seq, w.resource, w.uri, w.scope, w.file_id, w.agent_id, w.mode, w.since, w.until, "
    "w.granted, w.alive_until, w.granted_as, w.prev_outcome, w.prev_holder, w.prev_at, "
    "w.prev_moved_to, a.name, a.lease_ends_at, a.principal FROM claim_waiters AS w "
    "LEFT JOIN agents AS a ON a.agent_id = w.agent_id "
)
# What a claim write asks of the database before it decides (write.Activity), as columns that
# are read with the agent's lease, in one statement (TOUCH), or alone.
ACTIVITY = (
    "EXISTS (SELECT 1 FROM claim_waiters), EXISTS (SELECT 1 FROM claim_shares), "
    "(SELECT token FROM claim_patterns)"
)
TOUCH = (
    f"SELECT last_seen_at, lease_ends_at, lease_end_outcome, {ACTIVITY} FROM agents "
    "WHERE agent_id = ?"
)
EVENT = (
    "INSERT INTO claim_events (at, agent_id, event, resource, uri, outcome, moved_to, version) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
EVENT_BY = (
    "INSERT INTO claim_events (at, agent_id, event, resource, uri, outcome, moved_to, version, "
    "principal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
EVENT_MODE = (
    "INSERT INTO claim_events (at, agent_id, event, resource, uri, outcome, moved_to, version, "
    "principal, mode) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# The rows a grant or a release writes (agenthold.claims.write), one statement per table.
INSERT = (
    "INSERT INTO claims (resource, uri, holder, claimed_at, version, file_id, scope) "
    "VALUES (?, ?, ?, ?, 1, ?, ?)"
)
TAKE = (
    "UPDATE claims SET holder = ?, claimed_at = ?, version = ?, uri = ?, file_id = ?, scope = ? "
    "WHERE resource = ?"
)
BUMP = "UPDATE claims SET version = ? WHERE resource = ?"
FREE = (
    "UPDATE claims SET holder = NULL, claimed_at = NULL, version = ?, last_outcome = ?, "
    "last_holder = ?, last_outcome_at = ?, moved_to = ? WHERE resource = ?"
)
SHARE = (
    "INSERT INTO claim_shares (resource, agent_id, uri, claimed_at, scope, file_id) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
UNSHARE_ALL = "DELETE FROM claim_shares WHERE resource = ?"
UNSHARE = "DELETE FROM claim_shares WHERE resource = ? AND agent_id = ?"


# -- one statement for many rows ---------------------------------------------------------------
# A set of n claims or releases writes n rows into each table it touches. One statement per row
# (executemany) costs SQLite several microseconds of binding and stepping per row; one statement
# for all of them costs about a third. The single-row statements above stay the source: these
# turn one into its n-row form, as SQL both engines run.

_ASSIGNMENT = re.compile(r"(\w+) = \?")
_INTEGER_COLUMNS = ("version",)  # VALUES columns are text to PostgreSQL unless cast


@functools.lru_cache(maxsize=256)
def rows_statement(sql: str, n: int) -> str:
    """``sql``, an ``INSERT ... VALUES (...)`` or an ``UPDATE ... SET c = ?, ... WHERE
    resource = ?`` of one row, as one statement for ``n`` rows whose parameters follow one
    another in the order of the single-row statement's."""
    if sql.startswith("INSERT"):
        head, values = sql.split(" VALUES ", 1)
        return f"{head} VALUES {', '.join([values] * n)}"
    head, where = sql.split(" WHERE ", 1)
    table = head.split()[1]
    column = iter(range(1, sql.count("?") + 1))

    def assign(match: re.Match[str]) -> str:
        name, k = match.group(1), next(column)
        value = f"v.column{k}"
        cast = f"CAST({value} AS BIGINT)" if name in _INTEGER_COLUMNS else value
        return f"{name} = {cast}"

    sets = _ASSIGNMENT.sub(assign, head)
    key, last = where.split(" = ", 1)
    assert last == "?" and " " not in key, f"not a single-row UPDATE by one key: {sql!r}"
    marks = "(" + ", ".join("?" * sql.count("?")) + ")"
    return (
        f"{sets} FROM (VALUES {', '.join([marks] * n)}) AS v "
        f"WHERE {table}.{key} = v.column{next(column)}"
    )


def write_rows(conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run the single-row statement ``sql`` for every one of ``rows``, in one statement."""
    if len(rows) == 1:
        conn.execute(sql, rows[0])
    elif rows:
        conn.execute(rows_statement(sql, len(rows)), [v for row in rows for v in row])
