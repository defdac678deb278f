"""``agenthold retention``, ``agenthold retention set NAME=VALUE ...`` and ``agenthold compact``.

The rules and the compaction are retention.py's; this is their command line. Like the
inspector it never imports mcp and imports the store only inside ``run_retention_command``. An
error is one line on standard error: exit status 2 for a bad command line (an unknown setting,
a value that is not a count or an age), 1 for a database that cannot be opened or written.
``agenthold retention`` only reads (the database is opened read-only); ``set`` and
``compact`` write.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_retention_commands", "run_retention_command"]

_DB_HELP = (
    "the database (default: the server's, $AGENTHOLD_DB or the per-user one; may also be "
    "given before the subcommand)"
)


def add_retention_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Add ``retention`` (with ``set``) and ``compact`` to the ``agenthold`` parser."""
    retention = subparsers.add_parser(
        "retention",
        help="show or set how long history, claim events and messages are kept",
        description="Show the retention rules stored in the database (every server on it "
        "follows them), or set them with 'agenthold retention set NAME=VALUE ...'. Settings: "
        "history.versions, history.age, claims.age, messages.count, messages.age. A value is a "
        "count, an age (30d, 12h, 90m, 3600s), keep (no bound) or inherit (drop an override). "
        "The defaults keep everything. See docs/retention.md.",
    )
    retention.add_argument("--db", default=argparse.SUPPRESS, metavar="PATH", help=_DB_HELP)
    retention.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    actions = retention.add_subparsers(dest="retention_action", metavar="ACTION")
    setter = actions.add_parser("set", help="store retention rules in the database")
    setter.add_argument("settings", nargs="+", metavar="NAME=VALUE")
    where = setter.add_mutually_exclusive_group()
    where.add_argument("--namespace", metavar="NS", help="override for one namespace")
    where.add_argument("--thread", metavar="THREAD_ID", help="override for one thread")
    setter.add_argument("--db", default=argparse.SUPPRESS, metavar="PATH", help=_DB_HELP)

    compact = subparsers.add_parser(
        "compact",
        help="remove what the retention rules no longer keep",
        description="Remove the history, claim events and messages the stored retention rules "
        "no longer keep, in small committed batches, safely while servers run; then give the "
        "space back (SQLite files made with incremental auto-vacuum; PostgreSQL leaves it to "
        "autovacuum). --dry-run only counts.",
    )
    compact.add_argument("--dry-run", action="store_true", help="say what would be removed")
    compact.add_argument("--db", default=argparse.SUPPRESS, metavar="PATH", help=_DB_HELP)
    compact.add_argument("--json", action="store_true", default=argparse.SUPPRESS)


def _error(message: str, status: int) -> int:
    print(f"agenthold: {message}", file=sys.stderr)
    return status


def run_retention_command(args: argparse.Namespace) -> int:
    """Run ``retention`` or ``compact`` as parsed; returns the exit status."""
    from agenthold.retention import (
        compact,
        parse_setting,
        retention_summary,
        set_retention,
    )
    from agenthold.store import AgentholdError, InvalidInputError, open_database

    as_json = bool(getattr(args, "json", False))
    setting = args.command == "retention" and getattr(args, "retention_action", None) == "set"
    writing = setting or (args.command == "compact" and not args.dry_run)
    try:
        settings = {}
        if setting:
            settings = dict(parse_setting(s) for s in args.settings)
    except InvalidInputError as exc:
        return _error(str(exc), 2)
    try:
        # a read-only opening first: a missing file is an error here, never a new database
        db = open_database(args.db, read_only=True)
        if writing:
            db.close()
            db = open_database(args.db)
    except AgentholdError as exc:
        return _error(str(exc), 1)
    try:
        if args.command == "compact":
            report = compact(db, dry_run=args.dry_run)
            if as_json:
                print(json.dumps(report.to_dict()))
            else:
                verb = "would remove" if report.dry_run else "removed"
                print(
                    f"{verb}: {report.history} history rows, {report.claim_events} claim "
                    f"events, {report.messages} messages"
                )
                print(f"space: {report.space}")
            return 0
        if setting:
            set_retention(db, settings, namespace=args.namespace, thread=args.thread)
        rows = retention_summary(db)
    except InvalidInputError as exc:
        return _error(str(exc), 2)
    except AgentholdError as exc:
        return _error(str(exc), 1)
    finally:
        db.close()
    if as_json:
        print(json.dumps(rows))
        return 0
    header = ["SCOPE", "NAME", "SETTING", "VALUE", "BOUNDS"]
    cells = [[r["scope"], r["name"] or "-", r["setting"], r["value"], r["bounds"]] for r in rows]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    for line in [header, *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    return 0
