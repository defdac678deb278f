"""``agenthold backup DEST``: a consistent copy of a SQLite database, taken while servers run.

It uses SQLite's online backup API through ``SQLiteDatabase.backup`` (one snapshot; writers go
on meanwhile) and opens the database read-only, so it never changes the file it copies. The
copy gets a database id of its own, which is what makes restoring it safe (docs/upgrading.md,
"Backing up and restoring"). Like the inspector it never imports mcp, and an error is one line
on standard error: exit status 2 for a bad command line (a PostgreSQL URL included: that is
pg_dump's job), 1 for a database or destination that cannot be used.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_backup_command", "run_backup"]


def add_backup_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``agenthold backup DEST [--db PATH]`` to the ``agenthold`` parser."""
    backup = subparsers.add_parser(
        "backup",
        help="copy the database into a new file, safely while servers run",
        description="Copy the SQLite database into the new file DEST in one consistent "
        "snapshot (SQLite's online backup API), while servers go on using it. To restore the "
        "copy, stop every server on the database and copy it over the database file; see "
        "docs/upgrading.md. A PostgreSQL database is backed up with pg_dump.",
    )
    backup.add_argument("dest", metavar="DEST", help="the file to write; must not exist yet")
    backup.add_argument(
        "--db",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the database to copy (default: the server's, $AGENTHOLD_DB or the per-user one; "
        "may also be given before the subcommand)",
    )


def run_backup(db: str, dest: str) -> int:
    """Copy ``db`` into ``dest``; print where on standard output. Returns the exit status."""
    from agenthold.store import POSTGRES_PREFIXES, AgentholdError, SQLiteDatabase

    if db.startswith(POSTGRES_PREFIXES):
        return _error(
            "backup copies SQLite files; back up a PostgreSQL database with pg_dump "
            "(for example: pg_dump --format=custom --file=agenthold.dump DBNAME)",
            2,
        )
    if db == ":memory:":
        return _error("backup needs a database file; ':memory:' has none", 2)
    if not dest.strip():
        return _error("backup: DEST is empty; give the file to write", 2)
    try:
        source = SQLiteDatabase(db, read_only=True)
        try:
            written = source.backup(dest)
        finally:
            source.close()
    except AgentholdError as exc:
        return _error(str(exc), 1)
    print(f"agenthold: backed up {db} to {written}")
    return 0


def _error(message: str, status: int) -> int:
    print(f"agenthold: {message}", file=sys.stderr)
    return status
