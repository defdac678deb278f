"""The ``agenthold`` command: with no subcommand it serves MCP; with one it inspects a database.

Decisions behind it:
- Every flag is checked, and the database opened, before any transport starts, so a bad value
  fails with one line naming it and a non-zero exit, never a traceback.
- Nothing here imports ``mcp`` (half a second): the server module is imported only to serve,
  and the inspector subcommands never import it, so ``--help`` and the inspector start fast.
- One database per user by default (locations.py's ``database_path``); the server and the
  inspector resolve it the same way; only the server creates its directory.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from agenthold.cli.backup import add_backup_command, run_backup
from agenthold.cli.completion import add_completion_command
from agenthold.cli.retention import add_retention_commands, run_retention_command
from agenthold.cli.tokens import CommandFailed, add_token_commands, run_token_command
from agenthold.db.locations import (  # noqa: F401 - DB_*, state_directory: importable from here too
    DB_ENV,
    DB_FILE,
    UsageError,
    check_db,
    database_path,
    state_directory,
    workspace_spec,
)
from agenthold.serve.limits import Bounds, add_arguments, bounds_from

if TYPE_CHECKING:
    from agenthold.claims.coordinator import Coordinator
    from agenthold.claims.names import Workspace
    from agenthold.identity.principals import TokenTable

DEFAULT_PORT = 8417
DEFAULT_DISCONNECT_GRACE = 300.0
DEFAULT_REAP_IDLE = 86_400.0
HTTP_ONLY: tuple[str, ...] = ("host", "port", "path", "json_response", "allowed_hosts", "auth_file")
HTTP_ONLY += ("connection_limit", "session_limit", "session_idle", "send_timeout")  # limits.py
MAX_SECONDS = 10 * 365 * 86400  # the longest TTL, grace or idle time the claims layer takes
MAX_BUSY_TIMEOUT = 3600  # the longest busy timeout the store takes


@dataclass
class ServeOptions:
    """Everything the server needs to know, checked."""

    db: str = ":memory:"  # serve_options always sets it; tests that pass a Coordinator do not
    create_db_dir: bool = False  # the default location: make its directory (0700) if missing
    tools: str = "standard"
    claim_ttl: float | None = None
    workspaces: list[Workspace] = field(default_factory=list)
    transport: str = "stdio"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    path: str = "/mcp"
    json_response: bool = False
    allowed_hosts: list[str] = field(default_factory=list)
    auth_tokens: list[str] = field(default_factory=list)
    auth_file: TokenTable | None = None
    bounds: Bounds = field(default_factory=Bounds)
    disconnect_grace: float | None = DEFAULT_DISCONNECT_GRACE
    reap_idle: float | None = DEFAULT_REAP_IDLE
    durability: str = "normal"
    busy_timeout: float = 5.0
    log_level: str = "warning"


def _seconds(
    text: str,
    *,
    flag: str,
    allow_off: bool = False,
    allow_zero: bool = False,
    maximum: float = MAX_SECONDS,
) -> float:
    if allow_off and text.strip().lower() == "off":
        return math.inf
    try:
        value = float(text)
    except ValueError:
        extra = " or 'off'" if allow_off else ""
        raise UsageError(f"{flag}: {text!r} is not a number of seconds{extra}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "0 or more" if allow_zero else "more than 0"
        raise UsageError(f"{flag}: {text!r} must be a number of seconds, {bound}")
    if value > maximum:
        raise UsageError(f"{flag}: {text!r} is too long; the most is {maximum:.0f} seconds")
    return value


# The tool sets of tools.TOOL_SETS, named here because tools.py imports mcp (half a second) and
# a bad flag must fail fast; tests/test_package.py keeps the two equal.
TOOL_SET_NAMES = ("standard", "advanced", "messages")


def _tool_sets(text: str) -> str:
    """``--tools``: one tool set or a comma list of them, each once."""
    names = [part.strip() for part in text.split(",")]
    for name in names:
        if name not in TOOL_SET_NAMES:
            known = ", ".join(TOOL_SET_NAMES)
            raise argparse.ArgumentTypeError(f"{name!r} is not a tool set (choose from {known})")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r} names a tool set twice")
    return ",".join(names)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag or value is one line naming it (exit status 2), without the
    usage block; the subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        _fail(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog="agenthold",
        allow_abbrev=False,
        description=(
            "Shared, versioned state and resource claims for AI agents. With no subcommand, "
            "serve MCP (stdio by default); with a subcommand, show what is in a database "
            "(read-only). Start with 'agenthold status': the database, its agents, claims, "
            "queues, latest events and unread messages on one screen."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  agenthold status                               start here: what the database "
            "holds\n"
            "  agenthold --db ./state.db                      serve the five standard tools\n"
            "  agenthold --db ./state.db --tools advanced     serve the state-store tools\n"
            "  agenthold --tools standard,messages            claims and the message bus\n"
            "  agenthold --transport http --claim-ttl 1800    one server for many agents\n"
            "  agenthold claims --db ./state.db               who holds what, right now\n"
        ),
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    # `agenthold --json claims` means `agenthold claims --json` (the inspector reads args.json)
    parser.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--db",
        metavar="PATH",
        help="SQLite database file, created if missing (default: $AGENTHOLD_DB, else "
        "agenthold.db in the per-user state directory, such as ~/.local/state/agenthold); "
        "':memory:' keeps everything in this process only",
    )
    serve = parser.add_argument_group("serving")
    serve.add_argument(
        "--tools",
        type=_tool_sets,
        default="standard",
        metavar="SET[,SET]",
        help="standard: register/claim/release/status/wait (default); advanced: the "
        "versioned state store (get/set/list/history/delete/watch/clear_namespace/export); "
        "messages: the message bus (threads, append, poll, mark_read, wait_messages); "
        "a comma list serves several sets",
    )
    serve.add_argument(
        "--claim-ttl",
        metavar="SECONDS",
        help="an agent's claims expire this long after its last call that names it "
        "(default: never)",
    )
    serve.add_argument(
        "--workspace",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a workspace that file paths resolve in: NAME=PATH, or an absolute PATH named "
        "after its last component; repeatable (default: 'default' at the current directory)",
    )
    serve.add_argument(
        "--disconnect-grace",
        metavar="SECONDS",
        default=str(int(DEFAULT_DISCONNECT_GRACE)),
        help="when a client goes away, the claims of the agents it served are freed as "
        "'abandoned' unless one of those agents makes a call within this time (default: "
        "%(default)s); 'off' leaves it to --claim-ttl",
    )
    serve.add_argument(
        "--reap-idle",
        metavar="SECONDS",
        default=str(int(DEFAULT_REAP_IDLE)),
        help="remove agents that hold no claim and made no call for this long (default: "
        "%(default)s); 'off' keeps them forever",
    )
    serve.add_argument(
        "--durability",
        choices=("normal", "full"),
        default="normal",
        help="normal: survive a crash of the process (default); full: also a power loss "
        "(fsync on every commit, slower)",
    )
    serve.add_argument(
        "--busy-timeout",
        metavar="SECONDS",
        default="5",
        help="how long a write waits for another writer before the call answers "
        "'unavailable' (default: %(default)s)",
    )
    serve.add_argument(
        "--no-warm",
        action="store_true",
        help="do not use or leave behind a warm server for the next call (see docs/warm.md); "
        "also AGENTHOLD_NO_WARM=1",
    )
    serve.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio: a server per client process (default); http: one long-lived Streamable "
        "HTTP server for many agents",
    )
    serve.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="what the server logs to standard error (default: info with --transport http, "
        "which logs where it serves and when it stops; warning on stdio)",
    )
    http = parser.add_argument_group("HTTP (with --transport http)")
    http.add_argument("--host", help="address to bind (default: 127.0.0.1)")
    http.add_argument("--port", help=f"port to bind (default: {DEFAULT_PORT})")
    http.add_argument(
        "--path",
        help="endpoint path of the MCP transport (default: /mcp; 'mcp' is taken as '/mcp')",
    )
    http.add_argument(
        "--json-response",
        action="store_true",
        default=None,
        help="answer with plain JSON instead of SSE streams",
    )
    http.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        metavar="HOST",
        help="accept only this Host header (DNS-rebinding protection); repeatable",
    )
    http.add_argument(
        "--auth-token",
        action="append",
        dest="auth_tokens",
        metavar="TOKEN",
        help="require 'Authorization: Bearer TOKEN' on every request; repeatable. Prefer the "
        "AGENTHOLD_AUTH_TOKEN variable (comma-separated): flags show in process listings. "
        "Everyone with such a token is one all-access caller: agenthold cannot tell them apart",
    )
    http.add_argument(
        "--auth-file",
        metavar="PATH",
        help="a token file of principals, each with its own tokens and scopes (see 'agenthold "
        "token --help'); read again whenever it changes",
    )
    add_arguments(http)

    from agenthold.inspect import commands as inspector

    subcommands = parser.add_subparsers(
        dest="command", title="inspecting a database (read-only)", metavar="COMMAND"
    )
    inspector.add_subcommands(subcommands)
    add_backup_command(subcommands)
    from agenthold.web import add_web_command  # the live page (never imports mcp)

    add_web_command(subcommands)
    add_token_commands(subcommands)
    subcommands.add_parser(  # listed for --help; main() hands "hook" to agenthold.hooks
        "hook",
        help="a coding host's edit hook: refuse edits to files other agents hold "
        "('agenthold hook install HOST' wires it in; see docs/hooks.md)",
        add_help=False,
    )
    add_completion_command(subcommands)
    add_retention_commands(subcommands)
    return parser


def serve_options(
    args: argparse.Namespace, environ: dict[str, str]
) -> tuple[ServeOptions, list[str]]:
    """Check the serving flags; returns the options and the warnings to print."""
    from agenthold.claims.names import Workspace
    from agenthold.serve.auth import is_loopback
    from agenthold.store import InvalidInputError

    warnings: list[str] = []
    db, default = database_path(args.db, environ)
    if not default:  # the default's directory is made when the database is
        check_db(db, creates=True)
    opts = ServeOptions(db=db, create_db_dir=default, tools=args.tools, transport=args.transport)
    if args.claim_ttl is not None:
        opts.claim_ttl = _seconds(args.claim_ttl, flag="--claim-ttl")
    grace = _seconds(
        args.disconnect_grace, flag="--disconnect-grace", allow_off=True, allow_zero=True
    )
    opts.disconnect_grace = None if math.isinf(grace) else grace
    reap = _seconds(args.reap_idle, flag="--reap-idle", allow_off=True)
    opts.reap_idle = None if math.isinf(reap) else reap
    opts.busy_timeout = _seconds(
        args.busy_timeout, flag="--busy-timeout", allow_zero=True, maximum=MAX_BUSY_TIMEOUT
    )
    opts.durability = args.durability
    opts.log_level = args.log_level or ("info" if opts.transport == "http" else "warning")
    for spec in args.workspace:
        try:
            opts.workspaces.append(Workspace.parse(workspace_spec(spec)))
        except InvalidInputError as exc:
            raise UsageError(f"--workspace: {exc}") from None
    names = [w.name for w in opts.workspaces]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise UsageError(f"--workspace: the name {dup[0]!r} is given more than once")

    given_http = [name for name in HTTP_ONLY if getattr(args, name) is not None]
    env_tokens = environ.get("AGENTHOLD_AUTH_TOKEN")
    if opts.transport == "stdio":
        if given_http:
            flags = ", ".join("--" + n.replace("_", "-").removesuffix("s") for n in given_http)
            verb = "applies" if len(given_http) == 1 else "apply"
            warnings.append(f"warning: {flags} only {verb} with --transport http; ignored")
        if args.auth_tokens or env_tokens:
            warnings.append(
                "warning: auth tokens apply to --transport http only; stdio is a local, "
                "trusted transport, so they are ignored"
            )
        return opts, warnings

    opts.host = args.host if args.host is not None else "127.0.0.1"
    if not opts.host.strip():
        raise UsageError("--host: an empty address")
    if args.port is not None:
        try:
            opts.port = int(args.port)
        except ValueError:
            raise UsageError(f"--port: {args.port!r} is not a port number") from None
        if not 0 <= opts.port < 65536:
            raise UsageError(
                f"--port: {args.port!r} must be between 0 and 65535 (0: any free port)"
            )
    if args.path is not None:
        # 'mcp' means /mcp, as 0.10 took it: a leading slash forgotten is not worth a refusal
        opts.path = args.path if args.path.startswith("/") or not args.path else "/" + args.path
        bad = any(c in opts.path for c in " ?#\\") or "//" in opts.path
        if not opts.path.startswith("/") or bad:
            raise UsageError(
                f"--path: {args.path!r} must be a URL path such as /mcp "
                "(no spaces, '?', '#' or '//')"
            )
        if len(opts.path) > 1 and opts.path.endswith("/"):
            opts.path = opts.path.rstrip("/")
    opts.json_response = bool(args.json_response)
    try:
        opts.bounds = bounds_from(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    opts.allowed_hosts = list(args.allowed_hosts or [])
    requested = list(args.auth_tokens or [])
    if env_tokens is not None:
        requested += env_tokens.split(",")
    opts.auth_tokens = [t.strip() for t in requested if t.strip()]
    if requested and not opts.auth_tokens:
        raise UsageError(
            "authentication was requested (--auth-token or AGENTHOLD_AUTH_TOKEN) but every "
            "token is blank; refusing to serve without authentication"
        )
    if args.auth_file is not None:
        from agenthold.identity.principals import AuthFileError, TokenTable, exposure_warning

        try:
            opts.auth_file = TokenTable(args.auth_file)
        except AuthFileError as exc:
            raise UsageError(f"--auth-file: {exc}") from None
        if (warning := exposure_warning(args.auth_file)) is not None:
            warnings.append(warning)
        if not len(opts.auth_file.current() or ()):
            warnings.append(
                f"warning: the token file {args.auth_file} lists no principal yet: every request "
                "is refused until 'agenthold token add' adds one"
            )
    if not opts.auth_tokens and opts.auth_file is None and not is_loopback(opts.host):
        warnings.append(
            f"warning: serving on {opts.host} beyond this machine without an auth token: anyone "
            "who can reach the port can use it; set AGENTHOLD_AUTH_TOKEN"
        )
    if opts.claim_ttl is None:
        warnings.append(
            "warning: --transport http without --claim-ttl: claims of agents that vanish "
            "without a session end are never reclaimed; consider --claim-ttl 1800"
        )
    return opts, warnings


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"agenthold: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> int:
    if argv and argv[0] == "hook":  # agenthold.hooks reads its own options (a lean path)
        from agenthold.hooks import main as hook_main

        return hook_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from agenthold import _installed_version

        print(f"agenthold {_installed_version()}")
        return 0
    if args.command is None and getattr(args, "json", False):
        _fail("--json is for the inspector subcommands, as in 'agenthold claims --json'")
    if args.command == "token":
        try:
            return run_token_command(args)
        except CommandFailed as exc:
            _fail(str(exc), code=exc.status)
    if args.command == "completion":
        from agenthold.cli.completion import script

        print(script(parser, args.shell), end="")
        return 0
    if args.command is not None:
        from agenthold.inspect import commands as inspector

        try:
            args.db, default = database_path(args.db, dict(os.environ))
            if not default:  # a per-user database not made yet is not a usage error
                check_db(args.db, creates=False)
        except UsageError as exc:
            _fail(str(exc))
        if args.command == "backup":
            return run_backup(args.db, args.dest)
        if args.command == "web":
            from agenthold.web import run as run_web

            return run_web(args, args.db, workspace_spec, listen, stop_signals)
        if args.command in ("retention", "compact"):
            return run_retention_command(args)
        follow = getattr(args, "follow", False)
        if follow:
            ctrl_c_stops()
        with _terminate_as_interrupt(follow):
            return inspector.run(args)
    ctrl_c_stops()  # before the SDK's import: Ctrl-C while starting stops it too
    try:
        opts, warnings = serve_options(args, dict(os.environ))
    except UsageError as exc:
        _fail(str(exc))
    sock = None
    if opts.transport == "http":  # a port that cannot be had stops us before the database opens
        raise_descriptor_limit()  # connections are capped below it (limits.py)
        try:
            sock = listen(opts.host, opts.port)
        except OSError as exc:
            _fail(str(exc))
    if opts.transport == "stdio":  # before this process opens the database: see warm.py
        status = _leave_warm_server(argv, opts, warnings)
        if status is not None:
            return status
    if opts.transport == "stdio" and os.isatty(0):
        print(TERMINAL_BANNER, file=sys.stderr, flush=True)
        if not _first_input():  # looked, and quit: no database made for that
            return 0
    coordinator = open_coordinator(opts)
    for line in warnings:  # once nothing can fail any more: a failure is one line alone
        print(f"agenthold: {line}", file=sys.stderr)
    return serve(opts, coordinator, sock)


def exit_now(status: int) -> NoReturn:
    """End this process with ``status`` once what must outlast it is done, without the
    interpreter's teardown: every database still open is closed (SQLite then checkpoints and
    removes its write-ahead log), and the logs and standard streams are flushed. Tearing down
    the modules a server imports (the SDK, pydantic) takes 100-160 ms and leaves nothing
    behind: a fifth of a call of a client that starts a server per call, and most of what a
    first call pays for the warm server it forks (whose pages that teardown would copy)."""
    store = sys.modules.get("agenthold.store")  # never imported: no database was opened, and
    if store is not None:  # importing it only to close nothing would cost --version 60 ms
        store.close_all()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # a reader that has gone: nothing to flush to
            pass
        except (OSError, ValueError):  # output that could not be written (a full disk...)
            status = status or 120  # as the interpreter's own exit says it
    os._exit(status)


@contextlib.contextmanager
def _terminate_as_interrupt(wanted: bool) -> Iterator[None]:
    """While ``log --follow`` runs, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so that
    either ends it quietly with status 0 (see inspect.py's follow)."""
    import threading

    previous = None
    if wanted and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def ctrl_c_stops() -> None:
    """Give SIGINT back its default handling (KeyboardInterrupt) if this process was started
    with it ignored, as a shell without job control starts its background jobs. A server
    listens for SIGINT itself (``stop_signals``) and stopped on it either way, while ``log
    --follow`` and a server still starting went on: now each of them stops on Ctrl-C and
    SIGINT however it was started."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _first_input() -> bool:
    """On a terminal, wait for the first line before the database is opened, so that typing
    ``agenthold`` to see what it is makes no database (the per-user one included): False if
    input ends (Ctrl-D) or Ctrl-C comes before anything was typed. The SDK is imported
    meanwhile, as the server needs it next."""
    try:
        from agenthold.serve import app as server  # noqa: F401 - the import the server makes anyway

        if os.name != "posix":  # pragma: no cover - no select() on a console there
            return True
        import fcntl
        import select
        import struct
        import termios

        select.select([0], [], [])
    except KeyboardInterrupt:  # Ctrl-C, as the banner says: quit
        return False
    try:  # readable with nothing to read: the end of input
        waiting = fcntl.ioctl(0, termios.FIONREAD, b"\0\0\0\0")
    except OSError:  # pragma: no cover - a terminal that will not say
        return True
    return bool(struct.unpack("i", waiting)[0])


#: What someone who typed ``agenthold`` in a shell reads: it looks hung otherwise.
TERMINAL_BANNER = (
    "agenthold: this is an MCP server: it waits for an MCP client (Claude Code, Cursor, ...)\n"
    "agenthold: to speak to it on stdin. Add it to your client's configuration (README,\n"
    "agenthold: 'Connect an MCP client'), or see 'agenthold --help'. Ctrl-C quits."
)


def _leave_warm_server(
    argv: Sequence[str] | None, opts: ServeOptions, warnings: list[str]
) -> int | None:
    """Leave a warm server behind for the next call (see warm.py). With AGENTHOLD_WARM=wait,
    this call too goes through it: its exit status; else None, and this process serves."""
    from agenthold.serve import front

    found = front.plan(list(sys.argv[1:] if argv is None else argv), os.environ)
    if found is None:
        return None
    from agenthold.serve import warm

    wait = os.environ.get(front.WARM, "").strip().lower() == "wait"
    sys.stderr.flush()

    def setup(app: Any) -> None:  # what serve() sets on its app, for each warm session
        app.progress_every = _progress_every(os.environ.get("AGENTHOLD_PROGRESS_EVERY"), app)

    logs = functools.partial(log_to, level=opts.log_level)
    if warm.leave_behind(
        opts, warnings, found, open_coordinator, setup, logs=logs, signals=stop_signals, wait=wait
    ):
        return front.through_warm(found)  # the warm server has opened the database: no error
    return None


def serve(opts: ServeOptions, coordinator: Coordinator, sock: socket.socket | None = None) -> int:
    """Serve MCP as ``opts`` says until the client goes away or a signal arrives; the exit
    status. ``sock``: for HTTP, a socket already listening (see ``listen``); without one the
    server binds. This is where the process-wide settings are made: logging, and the garbage
    collector's frozen startup objects for a long-lived HTTP server."""
    import anyio

    from agenthold.serve.app import Agenthold

    logging.basicConfig(stream=sys.stderr, level=opts.log_level.upper(), format=LOG_FORMAT)
    _quiet_sdk(opts.log_level)
    app = Agenthold(coordinator, tools=opts.tools, disconnect_grace=opts.disconnect_grace)
    app.transport = opts.transport
    app.reap_idle = opts.reap_idle
    app.progress_every = _progress_every(os.environ.get("AGENTHOLD_PROGRESS_EVERY"), app)
    try:
        if opts.transport == "stdio":
            from agenthold.serve.stdio import serve_stdio

            anyio.run(serve_stdio, app, stop_signals)
            return 0
        from agenthold.serve.http import serve_http

        if sock is None:
            try:
                sock = listen(opts.host, opts.port)
            except OSError as exc:
                print(f"agenthold: {exc}", file=sys.stderr)
                return 2
        anyio.run(
            functools.partial(
                serve_http, app, opts, sock, signals=stop_signals, ready=freeze_startup_objects
            )
        )
        return 0
    except KeyboardInterrupt:  # a signal before the handlers were in place
        return 0
    finally:
        coordinator.store.close()


LOG_FORMAT = "agenthold: %(levelname)s: %(message)s"


def _quiet_sdk(level: str) -> None:
    if level == "info":  # the SDK's own session chatter is for debugging
        logging.getLogger("mcp").setLevel(logging.WARNING)


def log_to(handler: logging.Handler, level: str) -> None:
    """The warm server's logging: ``handler`` (warm.py's, which writes each record to the
    stderr of the session it comes from) alone on the root logger, with serve()'s format and
    level, so a warm session logs as a stdio server of its own would."""
    root = logging.getLogger()
    for old in list(root.handlers):  # whatever the forking process had set up
        root.removeHandler(old)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())
    _quiet_sdk(level)


#: The signals that stop a server (stdio, HTTP or warm): the first asks for a clean stop, and an
#: HTTP server takes a second and a third as "end the calls in flight now" and "drop everything".
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_signals() -> AbstractContextManager[AsyncIterator[int]]:
    """Where every transport hears STOP_SIGNALS (anyio's receiver, so a signal wakes the event
    loop rather than raising KeyboardInterrupt in whatever code it lands on)."""
    import anyio

    return anyio.open_signal_receiver(*STOP_SIGNALS)


def _progress_every(text: str | None, app: Any) -> float:
    """Seconds between the progress reports of a wait: the server's default, unless the
    (internal, undocumented) AGENTHOLD_PROGRESS_EVERY shortens it, which tests do."""
    try:
        every = float(text) if text else 0.0
    except ValueError:
        every = 0.0
    return every if 0 < every < app.progress_every else float(app.progress_every)


def freeze_startup_objects() -> None:
    """Keep the garbage collector's full passes short in a long-lived server: the objects of
    the modules, schemas and app made at startup live as long as the process, yet each full
    pass walked them all (50-100 ms measured, stalling every request in flight)."""
    import gc  # here, not at the top: only the HTTP server wants it

    gc.collect()
    gc.freeze()


def raise_descriptor_limit() -> int | None:
    """Raise this process's soft limit of open files to its hard limit; the soft limit now in
    force, or None where there is no such limit (Windows). A hard limit of "unlimited" is met
    with the most the platform takes (macOS refuses more than OPEN_MAX for the soft limit)."""
    if sys.platform == "win32":
        return None
    import resource

    unlimited = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for wanted in (hard,) if hard != unlimited else (unlimited, 1_048_576, 65_536, 10_240):
        if soft == unlimited or (wanted != unlimited and wanted <= soft):
            break  # as high as it goes already
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            continue
        soft = wanted
        break
    return None if soft == unlimited else int(soft)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``; OSError (with a readable message) if not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"--host: cannot use {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        reason = "the port is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise OSError(f"cannot listen on {host}:{port}: {reason}") from None
    return sock


def open_coordinator(opts: ServeOptions) -> Coordinator:
    """Open the database and set up claims as ``opts`` says; a problem ends the process with
    one line on standard error (exit status 1), before anything is served."""
    from agenthold.claims.coordinator import Coordinator
    from agenthold.claims.names import Resolver
    from agenthold.store import AgentholdError, StateStore

    if opts.create_db_dir:
        directory = os.path.dirname(opts.db)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            _fail(f"cannot create the database directory {directory!r}: {exc.strerror}", code=1)
    try:
        store = StateStore(opts.db, durability=opts.durability, busy_timeout=opts.busy_timeout)  # type: ignore[arg-type]
    except AgentholdError as exc:
        _fail(f"--db: {exc}", code=1)
    try:
        resolver = Resolver(opts.workspaces)
        return Coordinator(store, resolver=resolver, claim_ttl=opts.claim_ttl)
    except AgentholdError as exc:
        store.close()
        _fail(str(exc), code=1)
