"""``agenthold web``: a live, read-only page of one database for the people running the agents.

The page shows who is registered and how long their leases last, who holds what and who waits
behind whom, the event log as it happens, the namespaces and keys, and the bus's threads; a
resource's own view lists every claim and wait in line that would refuse a claim of it now.

This module is the command's face: its flags and its ``run``, and ``View``, the page's reads for a
program that wants them without the page (bench/perf/web_bench.py times them). It imports only the
standard library at module level (``agenthold --help`` builds its parser), and neither it nor the
modules it loads to serve (app.py, feed.py, views.py: starlette, uvicorn, sse-starlette and the
library) import ``mcp``. The page runs in its own process, on its own listener, and opens the
database read-only as the inspector does (docs/inspector.md, "The live page").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket

    from agenthold.web.views import View

DEFAULT_PORT = 8418  # one above the HTTP server's, so both can run with their defaults

__all__ = ["DEFAULT_PORT", "View", "add_web_command", "run"]


def __getattr__(name: str) -> Any:
    if name == "View":  # loaded on first use: the face imports only the standard library
        from agenthold.web.views import View

        return View
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_web_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``agenthold web`` to the ``agenthold`` parser. Its options default to
    ``argparse.SUPPRESS``, so that the same options given before the subcommand still count."""
    web = subparsers.add_parser(
        "web",
        help="serve a live, read-only page of the database in the browser",
        description="Serve a live, read-only page of the database: agents and their leases, "
        "claims and who waits for them, the event log, namespaces and keys, and the bus's "
        "threads. It prints the page's URL and opens nothing. It never writes to the database.",
    )
    quiet = argparse.SUPPRESS
    web.add_argument("--db", default=quiet, metavar="PATH", help="the database to show")
    web.add_argument(
        "--workspace",
        action="append",
        default=quiet,
        metavar="NAME=PATH",
        help="a workspace, as the server takes it: resource names typed in the page resolve "
        "in it, and directory claims are drawn over its files; repeatable",
    )
    web.add_argument("--host", default=quiet, help="address to bind (default: 127.0.0.1)")
    web.add_argument("--port", default=quiet, help=f"port to bind (default: {DEFAULT_PORT})")
    web.add_argument(
        "--auth-file",
        default=quiet,
        metavar="PATH",
        help="a token file (see 'agenthold token --help'): the page then asks for a token",
    )


def run(
    args: argparse.Namespace,
    db: str,
    workspace_spec: Callable[[str], str],
    listen: Callable[[str, int], socket.socket],
    signals: Callable[[], AbstractContextManager[AsyncIterator[int]]],
) -> int:
    """Serve the page of ``db`` until one of ``signals`` (cli.py's SIGINT and SIGTERM)
    arrives; the exit status. Errors are one line on standard error: 2 for a bad flag, 1 for a
    database or port that cannot be had. cli.py hands over its helpers (the database's path,
    workspaces, the listening socket, the signals), so this module never imports it."""
    from agenthold.claims.names import Workspace
    from agenthold.store import AgentholdError, InvalidInputError

    def fail(message: str, status: int) -> int:
        print(f"agenthold: {message}", file=sys.stderr)
        return status

    host = getattr(args, "host", None) or "127.0.0.1"
    port_text = getattr(args, "port", None)
    port = DEFAULT_PORT
    if port_text is not None:
        if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
            return fail(f"--port: {port_text!r} must be a port number from 0 to 65535", 2)
        port = int(port_text)
    workspaces = []
    for spec in getattr(args, "workspace", None) or []:
        try:
            workspaces.append(Workspace.parse(workspace_spec(spec)))
        except InvalidInputError as exc:
            return fail(f"--workspace: {exc}", 2)
    table = None
    auth_file = getattr(args, "auth_file", None)
    if auth_file is not None:
        from agenthold.identity.principals import AuthFileError, TokenTable

        try:
            table = TokenTable(auth_file)
        except AuthFileError as exc:
            return fail(f"--auth-file: {exc}", 2)
    warning = None
    if table is None and not _is_loopback(host):
        warning = f"the page on {host} is open to anyone who can reach the port; give --auth-file"
    try:
        sock = listen(host, port)
    except OSError as exc:
        return fail(str(exc), 1)
    try:
        return _serve(db, workspaces, sock, table, signals, warning)
    except AgentholdError as exc:
        return fail(str(exc), 1)
    finally:
        sock.close()


def _is_loopback(host: str) -> bool:
    from agenthold.serve.auth import is_loopback

    return is_loopback(host)


def _serve(
    db: str,
    workspaces: list[Any],
    sock: socket.socket,
    table: Any,
    signals: Any,
    warning: str | None,
) -> int:
    import anyio

    from agenthold.web.app import serve
    from agenthold.web.views import View

    view = View(db, workspaces)
    try:
        if warning is not None:  # once nothing can fail any more: a failure is one line alone
            print(f"agenthold: warning: {warning}", file=sys.stderr)
        name, port = sock.getsockname()[:2]
        shown = f"[{name}]" if ":" in str(name) else str(name)
        print(f"http://{shown}:{port}/", flush=True)
        anyio.run(lambda: serve(view, sock, table=table, signals=signals))
    finally:
        view.close()
    return 0
