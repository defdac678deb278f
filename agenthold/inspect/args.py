"""The inspector's command line: its subcommands and their arguments, and the checks of
``--limit`` and ``--after``. Only argparse at module level: ``agenthold --help`` builds these
parsers, so this must stay cheap to import (nothing of the store, nothing of mcp).
"""

from __future__ import annotations

import argparse

DEFAULT_LIMIT = 20  # lines of `history` and `log` when --limit is not given
MAX_LIMIT = 2**62  # larger limits are treated as "everything" (SQLite takes 64-bit integers)

COMMANDS: tuple[str, ...] = ("status", "agents", "claims", "namespaces", "keys", "history")
COMMANDS += ("log", "threads", "messages")


def add_subcommands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the inspector's subcommands to the ``agenthold`` parser.

    ``--db`` and ``--json`` default to ``argparse.SUPPRESS`` so that, given after the
    subcommand, they override the top-level options and, not given, they leave them alone.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the agenthold database to read, never created or changed (default: the "
        "server's, $AGENTHOLD_DB or the per-user one; may also be given before the subcommand)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print JSON for programs instead of a table",
    )

    def add(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = subparsers.add_parser(
            name, parents=[common], help=summary, description=description
        )
        return parser

    add(
        "status",
        "start here: the database, live agents, claims and queues, latest events, unread",
        "One screen about the database: which one it is (path and backend), the agents whose "
        "lease is live, the claims held and the waits queued to claim, the latest events, "
        "and the message-bus threads where someone has unread messages. Each section shows "
        "its first rows and names the subcommand that lists them all.",
    )
    add(
        "agents",
        "who is registered, their leases and how many claims they hold",
        "List every registered agent, oldest registration first: id, name, model, when it "
        "registered and last made a call, when its lease ends and how many claims it holds.",
    )
    claims = add(
        "claims",
        "what is claimed right now, and by whom",
        "List the resources held right now. An agent whose lease has ended holds nothing.",
    )
    claims.add_argument(
        "--all",
        action="store_true",
        help="every resource ever claimed: free ones show how their last claim ended",
    )
    add(
        "namespaces",
        "namespaces with their key counts",
        "List every namespace ever written: live keys, deleted keys, the last change and who "
        "made it. A namespace whose keys were all deleted is listed with 0 keys.",
    )
    keys = add(
        "keys",
        "the live keys of a namespace",
        "List the live keys of NAMESPACE with their versions, writers and values.",
    )
    keys.add_argument("namespace", metavar="NAMESPACE")
    history = add(
        "history",
        "the writes and deletes of one key, newest first",
        "Show the writes and deletes of KEY in NAMESPACE, newest first. A deleted key still "
        "has its history.",
    )
    history.add_argument("namespace", metavar="NAMESPACE")
    history.add_argument("key", metavar="KEY")
    history.add_argument(
        "--limit", metavar="N", help=f"show at most N entries (default: {DEFAULT_LIMIT})"
    )
    log = add(
        "log",
        "the latest events in the whole database; --follow to watch",
        "Show the latest events, oldest first: writes and deletes of keys, registrations, "
        "claims, releases with their outcomes, lease ends and removals of idle agents. "
        "With --follow, keep printing new events as agents make them, until Ctrl-C.",
    )
    log.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new events as they are committed, until Ctrl-C",
    )
    log.add_argument(
        "--namespace",
        metavar="NS",
        help="only writes and deletes in namespace NS (no claim events)",
    )
    log.add_argument(
        "--limit", metavar="N", help=f"show the last N events (default: {DEFAULT_LIMIT})"
    )
    add(
        "threads",
        "message-bus threads: participants, message count, last activity",
        "List every thread of the message bus, oldest first: its id, participants, how many "
        "messages it holds and when it was last active.",
    )
    messages = add(
        "messages",
        "the messages of one thread, in order",
        "Show the messages of THREAD_ID in sequence order: seq, sender, time and content.",
    )
    messages.add_argument("thread_id", metavar="THREAD_ID")
    messages.add_argument(
        "--after", metavar="N", help="only messages after seq N (default: 0, from the start)"
    )
    messages.add_argument(
        "--limit", metavar="N", help=f"show at most N messages (default: {DEFAULT_LIMIT})"
    )


class UsageError(Exception):
    """A bad command-line value: one line on standard error, exit status 2."""


def parse_limit(text: str | None) -> int:
    """The value of ``--limit``: a whole number, 1 or more."""
    return DEFAULT_LIMIT if text is None else _whole_number("--limit", text, 1)


def parse_after(text: str | None) -> int:
    """The value of ``--after``: a whole number, 0 or more."""
    return 0 if text is None else _whole_number("--after", text, 0)


def _whole_number(flag: str, text: str, least: int) -> int:
    """``text`` as a whole number of at least ``least`` (numbers past MAX_LIMIT are
    "everything"), or a UsageError naming ``flag``."""
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a whole number; give {least} or more") from None
    if value < least:
        raise UsageError(f"{flag}: {text!r} must be {least} or more")
    return min(value, MAX_LIMIT)
