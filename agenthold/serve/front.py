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

Decisions behind it:
- Standard library only, and not much of it (no argparse): this module is all that a warm call
  imports of agenthold. Whatever it does not understand goes to the command line as before.
- No byte of stdin is read here: the pipes are handed over only after the warm server has
  answered the hello, so a warm server that is gone, hung (HANDSHAKE_TIMEOUT) or of another
  version costs nothing but the attempt, and the call is served here with nothing lost.
- Trust: the socket lives in a directory of this user only (mode 0700, checked, never followed
  through a symbolic link), the socket file must belong to this user, and the peer's
  credentials must be this user's too: SO_PEERCRED on Linux, LOCAL_PEERCRED on macOS (not
  run by our tests, which run on Linux); elsewhere the directory and the file vouch alone.
- ``--no-warm`` or AGENTHOLD_NO_WARM=1 turn it off; a database in memory, a terminal or a file
  on stdin, and every subcommand (the inspector, ``--help``, ``--version``) never use it; a
  first word that is a subcommand or ``-h``, ``--help``, ``--version`` does not even import
  this module (see __main__.py).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import stat
import struct
import sys
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

PROTOCOL = 1  # of the hello between a front and a warm server
RUNTIME_DIR = "AGENTHOLD_RUNTIME_DIR"  # where the sockets live (default: see runtime_dir)
NO_WARM = "AGENTHOLD_NO_WARM"  # 1: never use or leave a warm server
WARM = "AGENTHOLD_WARM"  # "wait": the first call too waits for the warm server (for tests)
IDLE = "AGENTHOLD_WARM_IDLE"  # seconds a warm server waits for its next client
CHECK = "AGENTHOLD_WARM_CHECK"  # seconds between an idle warm server's looks (for tests)
HANDSHAKE_TIMEOUT = 1.0  # seconds a warm server gets to answer the hello
MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes on Linux
_NOT_KEYED = {RUNTIME_DIR, NO_WARM, WARM, IDLE, CHECK}

# The serving options of the command line (see cli.build_parser): these take a value ...
_VALUED = {
    "--db", "--tools", "--claim-ttl", "--workspace", "--disconnect-grace", "--reap-idle",
    "--durability", "--busy-timeout", "--transport", "--log-level", "--host", "--port",
    "--path", "--allowed-host", "--auth-token",
}  # fmt: skip
_FLAGS = {"--json-response"}  # ... and these none. Anything else is not for the front.


class Plan:
    """Where the warm server for this call lives, and how it is recognised (a plain class:
    dataclasses would import inspect and re, which a warm call does not need)."""

    def __init__(self, directory: str, identity: str, stamp: str) -> None:
        self.directory = directory
        self.identity = identity  # who, where, with which arguments: a JSON text
        data = identity.encode()  # the socket's name: a checksum is enough (the hello carries
        self.key = f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"  # the whole identity)
        self.stamp = stamp  # the code: a warm server of other code refuses

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, self.key + ".sock")

    @property
    def lock(self) -> str:
        return os.path.join(self.directory, self.key + ".lock")

    def pid_file(self, pid: int) -> str:
        return os.path.join(self.directory, f"{self.key}.{pid}.pid")

    @property
    def log(self) -> str:
        return os.path.join(self.directory, self.key + ".log")

    def hello(self) -> bytes:
        message = {"agenthold": PROTOCOL, "identity": self.identity, "stamp": self.stamp}
        return json.dumps(message).encode() + b"\n"


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


def code_stamp() -> str:
    """What the running code is: the interpreter, and the size and time of every module of
    agenthold and of the mcp SDK's entry points. Any upgrade or edit changes it."""
    parts = [sys.version, sys.executable]
    # the whole package, every room: this module lives in agenthold/serve/
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folders = [package]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name.endswith(".py"):
                    st = entry.stat()
                    parts.append(f"{entry.path}:{st.st_size}:{st.st_mtime_ns}")
                elif entry.is_dir() and entry.name != "__pycache__":
                    folders.append(entry.path)
    from importlib.util import find_spec  # loaded at start-up already: no cost

    for name in ("mcp", "mcp_types"):
        spec = find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin is not None:
            st = os.stat(origin)
            parts.append(f"{origin}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


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
        "package": os.path.dirname(os.path.abspath(__file__)),
        "cwd": os.getcwd(),
        "home": [environ.get("HOME"), environ.get("XDG_STATE_HOME")],  # the default database
        "argv": list(argv),
        "env": sorted(
            (k, v) for k, v in environ.items() if k.startswith("AGENTHOLD_") and k not in _NOT_KEYED
        ),
        "pg": libpq_settings(environ),
    }
    found = Plan(directory, json.dumps(identity), code_stamp())
    if len(found.socket.encode()) > MAX_SOCKET_PATH:
        return None
    return found


def peer_uid(sock: socket.socket) -> int | None:
    """The user id of the process at the other end: SO_PEERCRED on Linux, LOCAL_PEERCRED on
    macOS; -1 (nobody's) if the system will not say, so the caller refuses; None on other
    systems, where only the 0700 directory and the socket file's owner vouch for the peer."""
    try:
        option = getattr(socket, "SO_PEERCRED", None)
        if option is not None:
            creds = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
            return int(struct.unpack("3i", creds)[1])
        if sys.platform == "darwin":  # pragma: no cover - not run here: our tests run on Linux
            # getsockopt(SOL_LOCAL, LOCAL_PEERCRED), both from <sys/un.h>: level 0, option 1
            # (the stdlib does not name them on every version); the answer is a struct xucred
            return xucred_uid(sock.getsockopt(0, getattr(socket, "LOCAL_PEERCRED", 1), 76))
    except OSError:
        return -1
    return None  # pragma: no cover - not Linux


def xucred_uid(data: bytes) -> int:
    """cr_uid of a struct xucred (<sys/ucred.h>: u_int cr_version, then uid_t cr_uid, then the
    groups), or -1 when it is short or of a version other than XUCRED_VERSION (0)."""
    if len(data) < 8:
        return -1
    version, uid = struct.unpack("=2I", data[:8])
    return int(uid) if version == 0 else -1


def _read_line(sock: socket.socket, limit: int = 1 << 16) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk or len(data) > limit:
            raise ConnectionError("the warm server closed the connection")
        data += chunk
    return data


def connect(found: Plan) -> tuple[socket.socket, dict[str, object]] | None:
    """A connection to the warm server of ``found`` that has accepted the hello, and its
    answer; None if there is none, it is not this user's, or it does not answer in time."""
    uid = os.geteuid()
    try:
        st = os.lstat(found.socket)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HANDSHAKE_TIMEOUT)
    try:
        sock.connect(found.socket)
        if peer_uid(sock) not in (None, uid):
            raise ConnectionError("a warm server of another user")
        sock.sendall(found.hello())
        answer = json.loads(_read_line(sock))
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            raise ConnectionError("refused")
    except TimeoutError:  # hung: take its socket away, so later calls do not wait for it too
        sock.close()
        try:
            if os.lstat(found.socket).st_ino == st.st_ino:
                os.unlink(found.socket)
        except OSError:  # pragma: no cover - gone already
            pass
        return None
    except (OSError, ValueError):
        sock.close()
        return None
    sock.settimeout(None)
    return sock, answer


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
        fds = array.array("i", [0, 1, 2]).tobytes()
        sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
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
            sock.sendall(json.dumps({"signal": signum}).encode() + b"\n")

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        line = _read_line(sock)
        status = json.loads(line).get("exit")
        return status if isinstance(status, int) else 1
    except (OSError, ValueError, AttributeError):
        print("agenthold: the warm server ended without finishing the session", file=sys.stderr)
        return 1
    finally:
        sock.close()


def try_warm(argv: Sequence[str]) -> int | None:
    """The exit status of this call served through a warm server, or None: the command line
    (agenthold.cli.main) serves it (see agenthold/__main__.py, the command's entry point)."""
    found = plan(argv, os.environ)
    return None if found is None else through_warm(found)
