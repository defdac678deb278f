"""What a front (front.py) and a warm server (warm.py) say to each other, and how each knows the
other is the right one: where a warm server for a call lives (``Plan``), what code each side
runs (``code_stamp``), whose process is at the other end (``peer_uid``), and the conversation.

The conversation, one JSON line at a time on the Unix socket, front first:
1. hello: ``{"agenthold": PROTOCOL, "identity": ..., "stamp": ...}`` (``Plan.hello``);
2. the answer: ``{"ok": true, "warnings": [...]}`` (``accepted``), or
   ``{"ok": false, "why": ...}`` (``refused``): the call is then served by the front's own
   process, with nothing of stdin read;
3. the pipes: one byte ``F`` carrying stdin, stdout and stderr (SCM_RIGHTS; ``send_pipes``,
   ``pipes_in``);
4. while the session runs, each signal the front gets: ``{"signal": N}`` (``signal_line``);
5. at its end, the session's exit status: ``{"exit": N}`` (``exit_line``).

Decisions behind it:
- Standard library only, and not much of it: front.py imports this module on every warm call,
  before anything else of agenthold; warm.py, which imports the SDK, speaks it too, so neither
  side owns the other's words.
- Trust: the socket lives in a directory of this user only (front.runtime_dir), the socket
  file must belong to this user, and the peer's credentials must be this user's too:
  SO_PEERCRED on Linux, LOCAL_PEERCRED on macOS (not run by our tests, which run on Linux);
  elsewhere the directory and the file vouch alone.
"""

from __future__ import annotations

import array
import json
import os
import socket
import stat
import struct
import sys
import zlib

PROTOCOL = 1  # of the hello between a front and a warm server
RUNTIME_DIR = "AGENTHOLD_RUNTIME_DIR"  # where the sockets live (default: see front.runtime_dir)
NO_WARM = "AGENTHOLD_NO_WARM"  # 1: never use or leave a warm server
WARM = "AGENTHOLD_WARM"  # "wait": the first call too waits for the warm server (for tests)
IDLE = "AGENTHOLD_WARM_IDLE"  # seconds a warm server waits for its next client
CHECK = "AGENTHOLD_WARM_CHECK"  # seconds between an idle warm server's looks (for tests)
NOT_KEYED = {RUNTIME_DIR, NO_WARM, WARM, IDLE, CHECK}  # settings of warm serving, not a call's
HANDSHAKE_TIMEOUT = 1.0  # seconds a warm server gets to answer the hello
PIPES = b"F"  # the byte that carries the pipes
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # agenthold itself


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


def code_stamp() -> str:
    """What the running code is: the interpreter, and the size and time of every module of
    agenthold (its subpackages too) and of the mcp SDK's entry points. Any upgrade or edit
    changes it."""
    parts = [sys.version, sys.executable]
    _stamp_modules(PACKAGE, parts)
    from importlib.util import find_spec  # loaded at start-up already: no cost

    for name in ("mcp", "mcp_types"):
        spec = find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin is not None:
            st = os.stat(origin)
            parts.append(f"{origin}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def _stamp_modules(directory: str, parts: list[str]) -> None:
    with os.scandir(directory) as scanned:
        entries = sorted(scanned, key=lambda e: e.name)
    for entry in entries:
        if entry.name.endswith(".py"):
            st = entry.stat()
            parts.append(f"{entry.path}:{st.st_size}:{st.st_mtime_ns}")
        elif entry.name != "__pycache__" and entry.is_dir(follow_symlinks=False):
            _stamp_modules(entry.path, parts)


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


def read_line(sock: socket.socket, limit: int = 1 << 16) -> bytes:
    """One line of the conversation, from a blocking socket."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk or len(data) > limit:
            raise ConnectionError("the warm server closed the connection")
        data += chunk
    return data


def _line(message: dict[str, object]) -> bytes:
    return json.dumps(message).encode() + b"\n"


class Hello:
    """A front's hello, as the warm server reads it."""

    def __init__(self, message: dict[str, object]) -> None:
        self.protocol = message.get("agenthold")
        self.identity = message.get("identity")
        self.stamp = message.get("stamp")

    def is_for(self, found: Plan) -> bool:
        """Whether the call is one the server of ``found`` serves (whatever its code)."""
        return self.protocol == PROTOCOL and self.identity == found.identity


def hello_in(data: bytes) -> Hello | None:
    """The hello in ``data`` (one line), or None if it is not one."""
    try:
        message = json.loads(data)
    except ValueError:
        return None
    return Hello(message) if isinstance(message, dict) else None


def accepted(warnings: list[str]) -> bytes:
    """The warm server takes the call; ``warnings``: the command line's, for the front to print."""
    return _line({"ok": True, "warnings": warnings})


def refused(why: str) -> bytes:
    return _line({"ok": False, "why": why})


def send_pipes(sock: socket.socket) -> None:
    """Pass this process's stdin, stdout and stderr to the warm server."""
    fds = array.array("i", [0, 1, 2]).tobytes()
    sock.sendmsg([PIPES], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])


PIPES_SPACE = socket.CMSG_SPACE(3 * struct.calcsize("i"))  # recvmsg's room for the three


def pipes_in(message: bytes, ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The three descriptors a front passed (what ``recvmsg(1, PIPES_SPACE)`` received), or []
    if it was not that (any descriptors received are closed then)."""
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += list(struct.unpack(f"{usable // 4}i", payload[:usable]))
    if message != PIPES or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return []
    return fds


def signal_line(signum: int) -> bytes:
    return _line({"signal": signum})


def signal_in(data: bytes) -> int | None:
    """The signal a front forwarded, or None if ``data`` names none."""
    try:
        signum = json.loads(data)["signal"]
    except (ValueError, TypeError, KeyError):
        return None
    return signum if isinstance(signum, int) else None


def exit_line(status: int) -> bytes:
    return _line({"exit": status})


def exit_status_in(line: bytes) -> int:
    """The session's exit status in the warm server's last line (1 if it names none); a
    ValueError if the line is no JSON object."""
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    status = message.get("exit")
    return status if isinstance(status, int) else 1


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
        answer = json.loads(read_line(sock))
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
