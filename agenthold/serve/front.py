"""The first milliseconds of ``agenthold``: hand a stdio call to a warm server, if one is there.

Clients that start a server for every tool call pay its start-up on every call, and almost all of
that is importing the mcp SDK. So ``agenthold`` over stdio first looks for a warm server (see
warm.py) started earlier for the same user, interpreter, agenthold, directory, arguments,
AGENTHOLD_* variables and libpq's PG* variables (as a digest). If one answers and confirms that
it is of this very code and still sees the same database, this process passes it its stdin,
stdout and stderr (SCM_RIGHTS), and then only waits: for the session's exit status, or for a
signal, which it forwards. The warm server
serves those pipes as the stdio server would, through the SDK, so the protocol stays the SDK's.
Otherwise ``agenthold.cli.main`` serves the call as it always did, and leaves a warm server behind.
What the two say to each other, and how each knows the other, is warm_protocol.py's.

Decisions behind it:
- Standard library only, and not much of it (no argparse): this module and warm_protocol.py
  are all that a warm call imports of agenthold. Whatever it does not understand goes to the
  command line as before.
- No byte of stdin is read here: the pipes are handed over only after the warm server has
  answered the hello, so a warm server that is gone, hung (HANDSHAKE_TIMEOUT) or of another
  version costs nothing but the attempt, and the call is served here with nothing lost.
- Trust: the socket lives in a directory of this user only (mode 0700, checked, never followed
  through a symbolic link); warm_protocol.connect checks the socket file and the peer.
- ``--no-warm`` or AGENTHOLD_NO_WARM=1 turn it off; a database in memory, a terminal or a file
  on stdin, and every subcommand (the inspector, ``--help``, ``--version``) never use it; a
  first word that is a subcommand or ``-h``, ``--help``, ``--version`` does not even import
  this module (see __main__.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
from typing import TYPE_CHECKING

from agenthold.serve.warm_protocol import (
    NO_WARM,
    NOT_KEYED,
    PACKAGE,
    RUNTIME_DIR,
    WARM,
    Plan,
    code_stamp,
    connect,
    exit_status_in,
    read_line,
    send_pipes,
    signal_line,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes on Linux

__all__ = [  # with the protocol's names a call's command line reads (cli.main)
    "NO_WARM",
    "RUNTIME_DIR",
    "WARM",
    "Plan",
    "libpq_settings",
    "plan",
    "plan_for",
    "runtime_dir",
    "serves_stdio",
    "through_warm",
    "try_warm",
]

# The serving options of the command line (see cli.build_parser): these take a value ...
_VALUED = {
    "--db", "--tools", "--claim-ttl", "--workspace", "--disconnect-grace", "--reap-idle",
    "--durability", "--busy-timeout", "--transport", "--log-level", "--host", "--port",
    "--path", "--allowed-host", "--auth-token",
}  # fmt: skip
_FLAGS = {"--json-response"}  # ... and these none. Anything else is not for the front.


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "no", "false", "off")


def serves_stdio(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether ``argv`` serves MCP over stdio on a database file: only such calls go warm."""
    transport, db = "stdio", environ.get("AGENTHOLD_DB") or "agenthold.db"
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=")
        if name in _VALUED and name.startswith("--"):
            if not eq:
                if i + 1 >= len(argv):
                    return False
                value = argv[i + 1]
                i += 1
            if name == "--transport":
                transport = value
            elif name == "--db":
                db = value
        elif token not in _FLAGS:  # --no-warm, --help, a subcommand, a typo: not here
            return False
        i += 1
    return transport == "stdio" and db != ":memory:" and not db.startswith("file:")


def _wire(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def runtime_dir(environ: Mapping[str, str]) -> str | None:
    """This user's directory for warm servers, made if missing: $AGENTHOLD_RUNTIME_DIR, else
    $XDG_RUNTIME_DIR/agenthold, else agenthold-<uid> in $TMPDIR or /tmp. None unless it is a
    real directory (not a link) of this user that nobody else may enter."""
    path = environ.get(RUNTIME_DIR)
    uid = os.geteuid()
    if not path:
        xdg = environ.get("XDG_RUNTIME_DIR")
        if xdg and os.path.isabs(xdg):
            path = os.path.join(xdg, "agenthold")
        else:
            path = os.path.join(environ.get("TMPDIR") or "/tmp", f"agenthold-{uid}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:  # pragma: no cover - removed in between
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        return None
    return path


def plan(argv: Sequence[str], environ: Mapping[str, str]) -> Plan | None:
    """The warm server this call may use or leave behind; None where none may be: stdin and
    stdout must be pipes or sockets (a terminal or a file on stdin is served as ever)."""
    if not (_wire(0) and _wire(1)) or os.name != "posix":
        return None
    return plan_for(argv, environ)


def libpq_settings(environ: Mapping[str, str]) -> str | None:
    """A digest of every PG* variable (libpq reads them when it connects: user, password,
    host, service, ...), so that a call with other ones is not served by a server connected
    with these; a digest, as PGPASSWORD must not be written out. None if there are none."""
    found = sorted((k, v) for k, v in environ.items() if k.startswith("PG"))
    if not found:
        return None
    import hashlib  # only then: most calls have no PG* variable

    return hashlib.sha256(json.dumps(found).encode()).hexdigest()


def plan_for(argv: Sequence[str], environ: Mapping[str, str]) -> Plan | None:
    """The warm server of a call with ``argv`` and ``environ`` here, whatever its stdin."""
    if _truthy(environ.get(NO_WARM)) or not serves_stdio(argv, environ):
        return None
    directory = runtime_dir(environ)
    if directory is None:
        return None
    identity = {
        "uid": os.geteuid(),
        "python": sys.executable,
        "package": PACKAGE,
        "cwd": os.getcwd(),
        "home": [environ.get("HOME"), environ.get("XDG_STATE_HOME")],  # the default database
        "argv": list(argv),
        "env": sorted(
            (k, v) for k, v in environ.items() if k.startswith("AGENTHOLD_") and k not in NOT_KEYED
        ),
        "pg": libpq_settings(environ),
    }
    found = Plan(directory, json.dumps(identity), code_stamp())
    if len(found.socket.encode()) > MAX_SOCKET_PATH:
        return None
    return found


def through_warm(found: Plan, *, quiet: bool = False) -> int | None:
    """Serve this call through the warm server of ``found``: its exit status, or None (and
    nothing read from stdin) if no warm server took the call. ``quiet``: the warnings of the
    command line were printed already."""
    connected = connect(found)
    if connected is None:
        return None
    sock, answer = connected
    warnings = answer.get("warnings")
    if not quiet and isinstance(warnings, list):
        for line in warnings:
            print(f"agenthold: {line}", file=sys.stderr, flush=True)
    try:
        send_pipes(sock)
    except OSError:
        sock.close()
        return None
    # From here on the session is the warm server's. This process keeps no copy of the wire
    # (so a client sees the end of stdout when the session ends) and forwards signals.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)

    def forward(signum: int, frame: object) -> None:
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)  # a second signal ends this process, as before
        with contextlib.suppress(OSError):  # the warm server has gone: nothing to end
            sock.sendall(signal_line(signum))

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        return exit_status_in(read_line(sock))
    except (OSError, ValueError):
        print("agenthold: the warm server ended without finishing the session", file=sys.stderr)
        return 1
    finally:
        sock.close()


def try_warm(argv: Sequence[str]) -> int | None:
    """The exit status of this call served through a warm server, or None: the command line
    (agenthold.cli.main) serves it (see agenthold/__main__.py, the command's entry point)."""
    found = plan(argv, os.environ)
    return None if found is None else through_warm(found)
