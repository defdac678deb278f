"""The warm server: a stdio server left behind for the next call of a client that starts one
per call (see front.py, which hands it each call's pipes).

A call that finds no warm server serves itself, as ever, and forks this server first, once the
command line has been checked and the SDK imported: the child imports nothing, binds its
socket at once and then waits, with no CPU, until the call that forked it has exited (or a
call comes to its socket) before it opens the database, so that on a machine with few cores it
takes no CPU time from that call's own answer. The fork comes before the call opens the
database: SQLite's locks are per process, and a connection opened in a child on a file that the
parent had open would share the parent's lock bookkeeping without holding its locks (the parent
closing its connection would then delete the WAL under the child). A database that cannot be
opened ends the child quietly; the call then reports it as ever. It then lives in a
session of its own (a client that ends its server's process group does not end it), listens on
a Unix socket in this user's runtime directory, and exits after IDLE_SECONDS without a client
(AGENTHOLD_WARM_IDLE), on SIGTERM or SIGINT (heard from the moment it has its socket, the
wait for its turn included), and once it is stale: the code on disk is no
longer the code it runs, or its database file or a workspace directory was replaced or removed.
A call's hello finds that at once; without calls, the server looks for itself every
CHECK_SECONDS (AGENTHOLD_WARM_CHECK, for tests). A timer rather than file events: it covers the
code and the workspaces as well as the database, with one rule on every platform, and events on
the database's directory would wake it on every commit of every other process, whereas a look
is a few stat calls (a tenth of a millisecond) every CHECK_SECONDS.

An exiting server takes its files with it (socket, pid file, lock, and its log unless that
holds a warning or an error) unless another server has its key meanwhile; a killed one
cannot, so each new server removes what gone ones left (``sweep``): a key whose pid files
name no living process and whose lock nobody holds.

Each accepted connection is one stdio session: the front's stdin, stdout and stderr, served by
``stdio.serve_session``, the runner of ``agenthold`` on stdio too (the SDK's server,
agenthold's pipe reader and writer and its guard), with an Agenthold of its own over the shared
database, so the disconnect grace, the end-of-input rules, signals (forwarded by the front) and
the logs (to the session's stderr) are those of a stdio server of its own. While no client is
connected nothing runs but that look every CHECK_SECONDS.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import functools
import logging
import math
import os
import select
import signal
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio

from agenthold.hooks.ancestry import host_of, parent_of
from agenthold.serve.app import Agenthold, SignalSource
from agenthold.serve.stdio import pipes_on, serve_session
from agenthold.serve.warm_protocol import (
    CHECK,
    IDLE,
    PIPES_SPACE,
    Plan,
    accepted,
    code_stamp,
    connect,
    exit_line,
    hello_in,
    peer_uid,
    pipes_in,
    refused,
    signal_in,
)

if TYPE_CHECKING:
    from agenthold.claims.coordinator import Coordinator

log = logging.getLogger("agenthold.serve.warm")

IDLE_SECONDS = 600.0  # how long a warm server waits for its next client before it exits
CHECK_SECONDS = 20.0  # how often a warm server without a client checks whether it is stale
HELLO_TIMEOUT = 5.0  # seconds a connection may take to say hello and pass its pipes
SERVED = "serving this call"  # what a warm server says, on the call's stderr and in its log
UNOPENED = "the database cannot be opened"  # in its log, when it ends before serving
TAKEN = "its socket was taken over before it could serve"  # likewise
STOPPED = "stopped by a signal before it served"  # likewise
STALE_AFTER = 60.0  # seconds: the files of a key no server has, this old, are a gone one's
READY_TIMEOUT = 10.0  # seconds a call that waits for its warm server (AGENTHOLD_WARM=wait) waits
STOPPING = {signal.SIGTERM, signal.SIGINT}  # what stops a warm server (as cli.STOP_SIGNALS)
_session_stderr: contextvars.ContextVar[int] = contextvars.ContextVar("stderr", default=2)


def idle_seconds(environ: dict[str, str]) -> float:
    return _seconds(environ, IDLE, IDLE_SECONDS)


def check_seconds(environ: dict[str, str]) -> float:
    return _seconds(environ, CHECK, CHECK_SECONDS)


def _seconds(environ: dict[str, str], name: str, default: float) -> float:
    try:
        value = float(environ.get(name, default))
    except ValueError:
        return default
    return value if math.isfinite(value) and value > 0 else default


def _client_host(conn: socket.socket) -> str | None:
    """The host process of the front at the other end of ``conn`` (its parent, past any
    launcher: agenthold.hooks.ancestry), by the pid SO_PEERCRED gives; None where it cannot."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:  # pragma: no cover - not Linux
        return None
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    except OSError:  # pragma: no cover
        return None
    parent = parent_of(struct.unpack("3i", creds)[0])
    return None if parent is None else host_of(parent)


class _SessionLog(logging.Handler):
    """Log records go to the stderr of the session they come from (a contextvar, which anyio
    carries into worker threads), and the rest to the warm server's own log file."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError):  # a client that closed its stderr
            os.write(_session_stderr.get(), (self.format(record) + "\n").encode())


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class WarmServer:
    def __init__(
        self,
        opts: Any,
        coordinator: Coordinator,
        found: Plan,
        warnings: list[str],
        listener: socket.socket,
        idle: float,
        signals: SignalSource,
        socket_inode: int,
        check: float = CHECK_SECONDS,
    ) -> None:
        self.opts = opts
        self.coordinator = coordinator
        self.plan = found
        self.warnings = warnings
        self.listener = listener
        self.idle = idle
        self.check = check  # seconds between its looks at the files while it has no client
        self.signals = signals
        self.sessions: set[anyio.CancelScope] = set()
        self.accepting = True
        self._waiting: anyio.CancelScope | None = None
        self.deadline = time.monotonic() + idle  # when this server exits if no client comes
        self.lock: int | None = None  # released once this server answers calls
        self.setup: Callable[[Agenthold], None] = lambda app: None  # as cli.serve sets an app
        self._socket_inode = socket_inode  # of the file it bound: the path may be another's now
        self._files = self._watched()

    def _watched(self) -> dict[str, tuple[int, int] | None]:
        """The files whose replacement makes this server stale: the database, the roots."""
        paths = [os.path.abspath(self.opts.db)]
        paths += [ws.root for ws in self.coordinator.resolver.workspaces]
        return {path: _identity(path) for path in paths}

    def stale(self) -> str | None:
        """Why this server may serve no more calls, or None."""
        if code_stamp() != self.plan.stamp:
            return "the code on disk has changed"
        for path, identity in self._files.items():
            if _identity(path) != identity:
                return f"{path} was replaced or removed"
        # a copy put over the database in place keeps its inode: the store reads its id
        replaced = getattr(self.coordinator.store.db, "replaced", None)
        if replaced is not None and replaced():
            return f"{os.path.abspath(self.opts.db)} was replaced (another database copied over it)"
        return None

    def stop_accepting(self) -> None:
        """Take the socket away (if it is still ours) so that no new call comes here."""
        if not self.accepting:
            return
        self.accepting = False
        if _own_socket(self.plan, self._socket_inode):
            with contextlib.suppress(OSError):  # gone meanwhile
                os.unlink(self.plan.socket)
        self.listener.close()
        if self._waiting is not None:
            self._waiting.cancel()

    async def run(self, arriving: AsyncIterator[int]) -> None:
        """Serve until idle, stale or stopped; ``arriving``: the stop signals (already heard
        since the start-up, see ``_life``)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._signals, arriving)
            if self.lock is not None:
                os.close(self.lock)
                self.lock = None
            self.deadline = time.monotonic() + self.idle
            look_at = time.monotonic() + self.check
            while self.accepting:
                # with a client, a stale server is found by the next call's hello; without
                # one, it looks every ``check`` seconds (a few stats: no CPU worth measuring)
                # rather than keep a replaced database open until its idle time is over
                wake = min(self.deadline, look_at)
                timeout = math.inf if self.sessions else wake - time.monotonic()
                with anyio.CancelScope(deadline=anyio.current_time() + timeout) as waiting:
                    self._waiting = waiting
                    await anyio.wait_readable(self.listener)
                self._waiting = None
                if not self.accepting:
                    break
                if waiting.cancelled_caught:  # a session ended, a look is due, or idle time over
                    now = time.monotonic()
                    if self.sessions:
                        continue
                    if now >= self.deadline:
                        log.info("idle for %g s: exiting", self.idle)
                        self.stop_accepting()
                    elif now >= look_at:
                        look_at = now + self.check
                        stale = self.stale()
                        if stale is not None:
                            log.info("stale, exiting: %s", stale)
                            self.stop_accepting()
                    continue
                try:
                    conn, _ = self.listener.accept()
                except BlockingIOError:  # pragma: no cover - another wake-up took it
                    continue
                tg.start_soon(self._serve_connection, conn)
            while self.sessions:  # let sessions in flight finish (signals end them)
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    async def _signals(self, arriving: AsyncIterator[int]) -> None:
        async for signum in arriving:
            log.info("%s: stopping", signal.Signals(signum).name)
            self.stop_accepting()
            for session in list(self.sessions):
                session.cancel()

    def _session_ended(self) -> None:
        if not self.sessions:  # the idle time starts again when the last session ends,
            self.deadline = time.monotonic() + self.idle  # however long that session was
            if self._waiting is not None:
                self._waiting.cancel()

    async def _serve_connection(self, conn: socket.socket) -> None:
        scope = anyio.CancelScope()
        self.sessions.add(scope)
        fds: list[int] = []
        try:
            conn.setblocking(False)
            with anyio.move_on_after(HELLO_TIMEOUT):
                fds = await self._handshake(conn)
            if len(fds) == 3:
                status = 0  # also when this server's stop signal ends it, as for a stdio server
                with scope:
                    status = await self._session(conn, fds, scope)
                with contextlib.suppress(OSError):
                    conn.setblocking(True)
                    conn.sendall(exit_line(status))
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()
            self.sessions.discard(scope)
            self._session_ended()

    async def _handshake(self, conn: socket.socket) -> list[int]:
        """Check the hello, answer it, and receive the pipes: [] if it comes to nothing."""
        if peer_uid(conn) not in (None, os.geteuid()):  # pragma: no cover - the dir is 0700
            return []
        data = b""
        while not data.endswith(b"\n"):
            await anyio.wait_readable(conn)
            chunk = conn.recv(4096)
            if not chunk or len(data) > 1 << 16:
                return []
            data += chunk
        hello = hello_in(data)
        if hello is None:
            return []
        if not hello.is_for(self.plan):
            why: str | None = "not the server for this call"
        else:
            # a caller of other code is refused; whether this server is still good (the code on
            # disk moved on to the caller's, its database was replaced) is checked either way
            stale = self.stale()
            if stale is not None:
                log.info("stale, exiting: %s", stale)
                self.stop_accepting()
            why = "of other code" if hello.stamp != self.plan.stamp else stale
        if why is not None or not self.accepting:
            conn.sendall(refused(why or "stopping"))
            return []
        conn.sendall(accepted(self.warnings))
        await anyio.wait_readable(conn)
        try:
            message, ancillary, _, _ = conn.recvmsg(1, PIPES_SPACE)
        except OSError:  # pragma: no cover
            return []
        return pipes_in(message, ancillary)

    async def _session(self, conn: socket.socket, fds: list[int], scope: anyio.CancelScope) -> int:
        """One stdio session on the pipes ``fds`` (stdin, stdout, stderr), until its input
        ends or the front forwards a signal (or goes away)."""
        with contextlib.suppress(OSError):  # its own log keeps a line per call it served
            os.write(2, f"warm server {os.getpid()}: {SERVED}\n".encode())
        _session_stderr.set(fds[2])
        log.info("warm server %d: %s", os.getpid(), SERVED)
        app = Agenthold(
            self.coordinator, tools=self.opts.tools, disconnect_grace=self.opts.disconnect_grace
        )
        app.transport = "stdio"
        app.host = _client_host(conn)
        app.reap_idle = self.opts.reap_idle
        self.setup(app)
        stop = functools.partial(self._front_signals, conn)
        await serve_session(app, pipes_on(fds[0], fds[1]), stop)
        return 0

    async def _front_signals(self, conn: socket.socket, scope: anyio.CancelScope) -> None:
        """A signal the front forwards, or the front's end, ends the session as a signal
        ends a stdio server."""
        while True:
            await anyio.wait_readable(conn)
            try:
                chunk = conn.recv(4096)
            except BlockingIOError:  # pragma: no cover
                continue
            except OSError:  # pragma: no cover
                chunk = b""
            signum = signal_in(chunk) if chunk else None
            if signum is not None:
                with contextlib.suppress(ValueError):  # a number that names no signal
                    log.info("%s: stopping", signal.Signals(signum).name)
            scope.cancel()
            return


# --------------------------------------------------------------------------------------------
# Leaving one behind
# --------------------------------------------------------------------------------------------


def _lock(path: str) -> int | None:
    """A descriptor holding an exclusive lock on ``path``, or None if another process holds
    it for more than two seconds."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    for _ in range(100):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            time.sleep(0.02)
    os.close(fd)
    return None


def _listen(found: Plan) -> tuple[socket.socket, int, int] | None:
    """The listening socket of the warm server of ``found``, unless a good one answers there
    already, and the lock under which it was made: two calls starting at once leave one
    server, not two. The lock is held until the server answers (WarmServer.run). Last, the
    inode of the socket file, by which the server knows whether the path is still its own."""
    lock = _lock(found.lock)
    if lock is None:
        return None
    answered = connect(found)  # one that answers is kept; a hung or stale one is replaced
    if answered is not None:
        answered[0].close()
        os.close(lock)
        return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(found.socket)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(found.socket)  # in a directory of this user only (0700, see front.py)
    os.chmod(found.socket, 0o600)  # the socket too is this user's alone (not by the umask:
    # that is the whole process's, and cli.py owns what is process-wide)
    listener.listen(64)
    listener.setblocking(False)
    return listener, lock, os.stat(found.socket).st_ino


def leave_behind(
    opts: Any,
    warnings: list[str],
    found: Plan,
    opener: Callable[[Any], Coordinator],
    setup: Callable[[Agenthold], None],
    *,
    logs: Callable[[logging.Handler], None],
    signals: SignalSource,
    wait: bool = False,
) -> bool:
    """Fork the warm server for ``found`` (the caller has checked ``opts``, and has not opened
    the database yet). The caller owns what is process-wide: ``logs`` makes the handler it is
    given the warm server's only log handler, ``signals`` is where it hears its stop signals.
    With ``wait``, return once it listens (True) or failed to (False); else at once.

    Without ``wait`` the warm server binds its socket at once but opens the database only when
    this process has exited (the write end of ``turn``, which only this process keeps, closes
    then) or a call comes to the socket, whichever is first: on a machine with few cores, its
    start-up would otherwise take CPU time from this call's own answer. The next call of a
    per-call client then waits for the end of that start-up (the database opening, some tens of
    milliseconds) in the hello, within front.HANDSHAKE_TIMEOUT."""
    ready_r, ready_w = os.pipe()
    turn_r, turn_w = os.pipe()  # never closed here without ``wait``: this process's exit does
    pid = os.fork()
    if pid == 0:  # pragma: no cover - measured in the grandchild, not here
        try:
            os.close(ready_r)
            os.close(turn_w)
            os.setsid()  # out of the client's process group and session
            if os.fork() != 0:
                os._exit(0)
            _become_warm(opts, warnings, found, ready_w, turn_r, opener, setup, logs, signals)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(turn_r)
    os.waitpid(pid, 0)
    if not wait:
        os.close(ready_r)
        return False
    os.close(turn_w)  # this call goes through the warm server: it starts now
    try:
        readable, _, _ = select.select([ready_r], [], [], READY_TIMEOUT)
        return bool(readable) and os.read(ready_r, 1) == b"1"
    finally:
        os.close(ready_r)


def _own_socket(found: Plan, inode: int) -> bool:
    try:
        return os.stat(found.socket).st_ino == inode
    except OSError:
        return False


def _give_up(found: Plan, listener: socket.socket, inode: int, lock: int, ready: int) -> None:
    """End before serving: the socket file goes if it is still this server's, and the key's
    lock and log if no other server has the key."""
    listener.close()
    if _own_socket(found, inode):
        with contextlib.suppress(OSError):  # gone meanwhile
            os.unlink(found.socket)
    os.close(lock)
    os.close(ready)
    tidy(found.directory, found.key)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a living process: not gone, and (where /proc says) not a zombie, as
    a killed warm server is until init reaps it (the double fork made init its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # pragma: no cover - another user's: not ours to judge
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[:1]
    except OSError:  # no /proc (macOS, the BSDs), or gone meanwhile
        return True
    return state not in ([b"Z"], [b"X"])


def tidy(directory: str, key: str, names: list[str] | None = None, older: float = 0.0) -> bool:
    """Remove the files of ``key`` in the runtime directory (socket, pid files, lock, log)
    when no server has the key: none of its pid files names a living process, and its lock
    is free (taken here without waiting: a server starting under it holds it). ``names``: the
    directory's listing, when sweeping (see ``sweep``); else this server is ending and has
    removed its own socket, so a socket there is another's, which keeps them all. ``older``:
    and the lock is at least this many seconds old (one opened a moment ago may be taken
    next). Whether it removed them."""
    base = os.path.join(directory, key)
    if names is None and os.path.lexists(base + ".sock"):
        return False
    listed = os.listdir(directory) if names is None else names
    pids = [n for n in listed if n.startswith(key + ".") and n.endswith(".pid")]
    if any(_alive(int(n.split(".")[1])) for n in pids if n.split(".")[1].isdigit()):
        return False
    try:
        fd: int | None = os.open(base + ".lock", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            if time.time() - os.fstat(fd).st_mtime < older:
                return False
        kept = [key + ".log"] if _worth_reading(base + ".log") else []
        for name in [*pids, key + ".sock", key + ".log", key + ".lock"]:
            if name not in kept:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))
        return True
    finally:
        if fd is not None:
            os.close(fd)


def _worth_reading(log_path: str) -> bool:
    """Whether a warm server's log says something went wrong (a warning, an error, a
    traceback), which is kept for a person to read; lines of calls served and INFO are not."""
    try:
        with open(log_path, "rb") as f:
            text = f.read(1 << 20)
    except OSError:
        return False
    return any(
        word in text for word in (b": WARNING: ", b": ERROR: ", b": CRITICAL: ", b"Traceback")
    )


def sweep(directory: str, own: str) -> list[str]:
    """Remove what warm servers that are gone left in the runtime directory (see ``tidy``),
    other than key ``own``'s: those that exited leave nothing, but a killed one leaves its
    files. The keys removed."""
    names = os.listdir(directory)
    keys = {n.split(".", 1)[0] for n in names if n.endswith((".lock", ".log", ".sock", ".pid"))}
    return [k for k in sorted(keys - {own}) if tidy(directory, k, names, older=STALE_AFTER)]


def _become_warm(
    opts: Any,
    warnings: list[str],
    found: Plan,
    ready: int,
    turn: int,
    opener: Callable[[Any], Coordinator],
    setup: Callable[[Agenthold], None],
    logs: Callable[[logging.Handler], None],
    signals: SignalSource,
) -> None:
    """The warm server's life, in the forked grandchild. ``turn``: readable (at its end) when
    the call that forked it has exited, or has no more use for the CPU (see leave_behind)."""
    # a stop signal before its handler is in place would end this process without a word,
    # its pid file left behind: held back until then (see WarmServer._signals)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # appended to, and emptied only by the server that takes the socket: a call that finds a
    # good server there already must not wipe that server's log
    logfile = os.open(found.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(logfile, 1)  # the client's pipes are no longer held here
    os.dup2(logfile, 2)
    os.close(logfile)
    listening = _listen(found)
    if listening is None:
        os.close(ready)
        return
    listener, lock, inode = listening
    os.ftruncate(1, 0)
    with contextlib.suppress(OSError):  # a runtime directory we cannot list: nothing to tidy
        sweep(found.directory, found.key)
    start = functools.partial(_life, opts, warnings, found, ready, turn, opener, setup, logs)
    try:
        anyio.run(start, signals, listener, lock, inode)
    except Exception:  # pragma: no cover - a bug: say what it was in the log
        log.exception("the warm server failed")


async def _turn_or_stop(turn: int, listener: socket.socket, arriving: AsyncIterator[int]) -> bool:
    """Wait for this server's turn to start (the call that forked it has exited, or a call is
    waiting at the socket); False if a stop signal came first."""
    stopped = [False]
    async with anyio.create_task_group() as tg:

        async def readable(fd: int) -> None:
            await anyio.wait_readable(fd)
            tg.cancel_scope.cancel()

        async def stop() -> None:
            async for _ in arriving:
                stopped[0] = True
                tg.cancel_scope.cancel()

        tg.start_soon(readable, turn)
        tg.start_soon(readable, listener.fileno())
        tg.start_soon(stop)
    return not stopped[0]


async def _life(
    opts: Any,
    warnings: list[str],
    found: Plan,
    ready: int,
    turn: int,
    opener: Callable[[Any], Coordinator],
    setup: Callable[[Agenthold], None],
    logs: Callable[[logging.Handler], None],
    signals: SignalSource,
    listener: socket.socket,
    lock: int,
    inode: int,
) -> None:
    """The warm server from its socket on: its stop signals are heard from here to its end,
    so SIGTERM stops it at any point, also while it waits for its turn to start."""
    with signals() as arriving:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)  # one held back arrives now
        if not await _turn_or_stop(turn, listener, arriving):
            os.close(turn)
            with contextlib.suppress(OSError):
                os.write(2, f"warm server {os.getpid()}: {STOPPED}\n".encode())
            _give_up(found, listener, inode, lock, ready)
            return
        os.close(turn)
        await _serve(opts, warnings, found, ready, opener, setup, logs, signals, listener, lock,
                     inode, arriving)  # fmt: skip


async def _serve(
    opts: Any,
    warnings: list[str],
    found: Plan,
    ready: int,
    opener: Callable[[Any], Coordinator],
    setup: Callable[[Agenthold], None],
    logs: Callable[[logging.Handler], None],
    signals: SignalSource,
    listener: socket.socket,
    lock: int,
    inode: int,
    arriving: AsyncIterator[int],
) -> None:
    try:
        coordinator = opener(opts)  # cli.open_coordinator
    except SystemExit:  # the call itself says why
        with contextlib.suppress(OSError):
            os.write(2, f"warm server {os.getpid()}: {UNOPENED}\n".encode())
        _give_up(found, listener, inode, lock, ready)
        return
    if not _own_socket(found, inode):  # a call that found this server slow to start took its
        coordinator.store.close()  # socket away (front.connect) and left another: no use now
        with contextlib.suppress(OSError):
            os.write(2, f"warm server {os.getpid()}: {TAKEN}\n".encode())
        _give_up(found, listener, inode, lock, ready)
        return
    logs(_SessionLog())  # cli.py sets up the logging around it, as for any server
    server = WarmServer(
        opts,
        coordinator,
        found,
        warnings,
        listener,
        idle_seconds(dict(os.environ)),
        signals,
        socket_inode=inode,
        check=check_seconds(dict(os.environ)),
    )
    server.lock = lock
    server.setup = setup
    pid_file = found.pid_file(os.getpid())
    with open(pid_file, "w") as out:
        out.write(f"{os.getpid()}\n")
    with contextlib.suppress(OSError):  # nobody reads it unless the call waits
        os.write(ready, b"1")
    os.close(ready)
    try:
        await server.run(arriving)
    finally:
        server.stop_accepting()
        coordinator.store.close()
        with contextlib.suppress(OSError):
            os.unlink(pid_file)
        tidy(found.directory, found.key)  # unless another server has taken the key
