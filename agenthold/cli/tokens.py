"""``agenthold token add|list|revoke``: the principals of a token file, from the command line.

The server reads the file (principals.py); these commands write it. They never import mcp, so
they start fast. A problem is a ``CommandFailed`` carrying its one line and exit status (2 for a
bad command line, 1 for a file that cannot be used), which cli.py prints and exits with: the
process-wide part stays there.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["CommandFailed", "add_token_commands", "run_token_command"]


class CommandFailed(Exception):
    """What went wrong, in one line, and the exit status it ends the command with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def add_token_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``agenthold token add|list|revoke``: the principals of a token file."""
    token = subparsers.add_parser(
        "token",
        help="add, list or revoke the tokens of a token file (--auth-file)",
        description="Manage the principals of a token file for 'agenthold --transport http "
        "--auth-file PATH'. A running server reads the file again when it changes.",
    )
    actions = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--auth-file",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the token file (created by 'add' with mode 0600 if missing)",
    )
    add = actions.add_parser(
        "add",
        parents=[where],
        help="a new token for NAME, printed once",
        description="Create a random token for principal NAME (created if missing) and print "
        "it once, alone on the last line of standard output; the file keeps only its SHA-256. "
        "A principal without scopes may do everything.",
    )
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--scope",
        action="append",
        dest="scopes",
        metavar="SCOPE",
        help="repeatable; replaces NAME's scopes. tools:SET[,SET] (standard, advanced, "
        "messages), read:GLOB / write:GLOB (namespaces), claim:PATTERN (a workspace name, or "
        "a URI glob with ':'), thread-read:GLOB / thread-write:GLOB",
    )
    listing = actions.add_parser(
        "list", parents=[where], help="the principals, their token counts and scopes"
    )
    listing.add_argument("--json", action="store_true", help="print JSON for programs")
    revoke = actions.add_parser("revoke", parents=[where], help="remove NAME and every token of it")
    revoke.add_argument("name", metavar="NAME")


def run_token_command(args: argparse.Namespace) -> int:
    """Run ``agenthold token …``; problems are one line on standard error (exit status 1)."""
    import json

    from agenthold.identity import principals

    path = getattr(args, "auth_file", None)
    if not path:
        raise CommandFailed(f"token {args.token_command}: --auth-file PATH is required", 2)
    try:
        if args.token_command == "add":
            token, created = principals.add_token(path, args.name, args.scopes)
            what = "added principal" if created else "added a token to principal"
            scopes = ", ".join(args.scopes) if args.scopes else None
            shown = scopes or ("everything" if created else "unchanged")
            print(
                f"agenthold: {what} {args.name!r} in {path} (scopes: {shown}); its token, "
                "shown only this once:",
                file=sys.stderr,
            )
            print(token, flush=True)
        elif args.token_command == "revoke":
            gone = principals.revoke(path, args.name)
            print(f"agenthold: revoked principal {args.name!r} ({gone} token(s))", file=sys.stderr)
        else:
            entries = principals.load_file(path)
            if args.json:
                rows = [
                    {
                        "name": e.name,
                        "tokens": len(e.tokens),
                        "created_at": [t.get("created_at") for t in e.tokens],
                        "scopes": e.scopes,
                    }
                    for e in entries
                ]
                print(json.dumps(rows, indent=2))
            elif not entries:
                print("no principals")
            else:
                width = max(len(e.name) for e in entries)
                print(f"{'NAME':<{width}}  TOKENS  SCOPES")
                for e in entries:
                    scopes = " ".join(e.scopes) or "(everything)"
                    print(f"{e.name:<{width}}  {len(e.tokens):>6}  {scopes}")
    except principals.AuthFileError as exc:
        raise CommandFailed(str(exc), 1) from None
    except OSError as exc:
        raise CommandFailed(f"{path}: {exc.strerror or exc}", 1) from None
    if (warning := principals.exposure_warning(path)) is not None:
        print(f"agenthold: {warning}", file=sys.stderr)
    return 0
