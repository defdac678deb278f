"""What several test modules need alike: servers, clients and child processes, made one way.

Test modules import it as ``support`` (pytest puts tests/ on sys.path: the directory has no
__init__.py and the default import mode prepends it, in xdist workers too). Fixtures stay in
conftest.py; everything here is a plain function or class, so a test reads what it starts.

The pieces are the real ones, as everywhere in the suite: agenthold's HTTP application on
uvicorn in the test's own event loop (configured as ``agenthold --transport http`` configures
it), SDK clients, stdio servers in child processes, and child processes read line by line with
a timeout on every read. Nothing of agenthold's is mocked here.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from starlette.types import ASGIApp

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.cli.main import listen, main
from agenthold.serve.app import Agenthold, build_server
from agenthold.serve.claim_tools import reply
from agenthold.serve.compat import sse
from agenthold.serve.compat.uvicorn_h11 import QuietServer
from agenthold.serve.http import ConnectionGuard, web_config
from agenthold.store import StateStore

REPO = Path(__file__).resolve().parents[1]
STORE_WORKER = REPO / "tests" / "helpers" / "store_worker.py"
LEGACY, MODERN = "2025-11-25", "2026-07-28"  # the protocol eras: handshake, and per request
ACCEPT = "application/json, text/event-stream"
ANSWER_LIMIT = 10.0  # seconds any one call may take to be answered (milliseconds in practice)
STARTUP = 30.0  # seconds a server process may take to start on a busy machine (it takes ~0.6)
ERROR_KEYS = {"status", "error", "message", "hint"}


# --------------------------------------------------------------------------------------------
# A store, a coordinator, and an in-process server
# --------------------------------------------------------------------------------------------


class WireCoordinator(Coordinator):
    """A Coordinator whose register, claim, release, status and wait answer with the reply an
    agent reads (``claim_tools.reply`` of the typed result), for the tests written against
    those replies: they check the library and the tools' wording of its results together."""

    def register(self, *args: Any, **kwargs: Any) -> Any:
        return reply(super().register(*args, **kwargs))

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        return reply(super().claim(*args, **kwargs))

    def release(self, *args: Any, **kwargs: Any) -> Any:
        return reply(super().release(*args, **kwargs))

    def status(self, *args: Any, **kwargs: Any) -> Any:
        return reply(super().status(*args, **kwargs))

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return reply(super().wait(*args, **kwargs))


def coordinator_at(
    store: StateStore, root: Path, *, claim_ttl: float | None = None, replies: bool = False
) -> Coordinator:
    """A Coordinator on ``store`` whose one workspace, "default", is ``root`` (a
    WireCoordinator, answering with tool replies, if ``replies``)."""
    kind = WireCoordinator if replies else Coordinator
    return kind(store, resolver=Resolver([Workspace("default", str(root))]), claim_ttl=claim_ttl)


class Coordinators:
    """Opens Coordinators on one database (a file or a PostgreSQL URL) whose workspace
    "default" is ``root``, each on a StateStore of its own, as another server process would
    have; ``close`` closes every store. ``replies``: WireCoordinators (coordinator_at)."""

    def __init__(self, db: Path | str, root: Path, *, replies: bool = False) -> None:
        self.db, self.root, self.replies = db, root, replies
        self.stores: list[StateStore] = []

    def __call__(
        self, claim_ttl: float | None = None, *, waiter_liveness: float | None = None
    ) -> Coordinator:
        """A new Coordinator, with ``claim_ttl`` and (if given) ``waiter_liveness``, the
        seconds a queued wait's place is kept between its waiter's looks."""
        store = StateStore(self.db)
        self.stores.append(store)
        coord = coordinator_at(store, self.root, claim_ttl=claim_ttl, replies=self.replies)
        if waiter_liveness is not None:
            coord.waiter_liveness = waiter_liveness
        return coord

    def close(self) -> None:
        for store in self.stores:
            store.close()


def agents(coord: Coordinator, *names: str) -> list[str]:
    """The ids of new agents of these names, registered through ``coord``."""
    return [coord.register(n).agent_id for n in names]


@contextlib.asynccontextmanager
async def in_process_client(
    coordinator: Coordinator, *, tools: str, mode: str = "auto", **options: Any
) -> AsyncIterator[tuple[Agenthold, Client]]:
    """agenthold on ``coordinator`` (``options`` go to Agenthold) and an ``mcp.Client``
    connected to it over the SDK's in-process transport, in protocol era ``mode``."""
    app = Agenthold(coordinator, tools=tools, **options)
    async with Client(build_server(app), mode=mode) as client:  # type: ignore[arg-type]
        yield app, client


def refuse_constant(name: str) -> Any:
    """For json.loads: text that holds NaN or Infinity is not JSON."""
    raise ValueError(f"reply text holds {name}, which is not JSON")


def reply_of(result: CallToolResult) -> dict[str, Any]:
    """The reply of a tool call, checked for what every reply must be: one strict-JSON text
    (no NaN) equal to the structured content, a status, and isError exactly when the status is
    "error", in which case the reply carries a message and a hint."""
    assert len(result.content) == 1 and result.content[0].type == "text"
    parsed = json.loads(result.content[0].text, parse_constant=refuse_constant)
    assert parsed == result.structured_content
    assert isinstance(parsed, dict) and isinstance(parsed.get("status"), str), parsed
    assert bool(result.is_error) == (parsed["status"] == "error"), parsed
    if parsed["status"] == "error":
        # a not_holder error names the holder in a field of its own, as busy does
        allowed = ERROR_KEYS | ({"held_by"} if parsed.get("error") == "not_holder" else set())
        assert set(parsed) == allowed, parsed
        assert parsed["message"] and parsed["hint"]
    return parsed


# --------------------------------------------------------------------------------------------
# agenthold's HTTP application on uvicorn in the test's event loop, and its clients
# --------------------------------------------------------------------------------------------


@dataclass
class Web:
    url: str  # the MCP endpoint
    port: int
    server: uvicorn.Server | None = None  # its connections: server.server_state.connections


@contextlib.asynccontextmanager
async def uvicorn_serving(
    app: Agenthold,
    asgi: ASGIApp,
    *,
    path: str = "/mcp",
    keep_alive: float | None = None,
    guard: ConnectionGuard | None = None,
) -> AsyncIterator[Web]:
    """``asgi``, the HTTP application of ``app`` (``http_app`` or ``_http_stack`` builds it),
    served with the MCP endpoint at ``path`` on uvicorn in this event loop, on a free loopback
    port, until the block ends. uvicorn is configured as ``agenthold --transport http``
    configures it, but for a 2-second bound on its shutdown (and ``keep_alive`` and the
    connection cap ``guard``, if given);
    sse-starlette's process-wide "close every stream" flag is cleared first."""
    app.transport = "http"
    sse.clear_exit_flag()
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = web_config(asgi, guard=guard)
    config.timeout_graceful_shutdown = 2
    if keep_alive is not None:
        config.timeout_keep_alive = keep_alive  # type: ignore[assignment]
    web = QuietServer(config)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(web.serve, [sock])
            while not web.started:
                await anyio.sleep(0.01)
            try:
                yield Web(f"http://127.0.0.1:{port}{path}", port, web)
            finally:
                web.should_exit = True
    finally:
        sock.close()


@contextlib.asynccontextmanager
async def sdk_client(
    url: str,
    *,
    mode: str = "auto",
    headers: dict[str, str] | None = None,
    terminate_on_close: bool = True,
    statuses: list[int] | None = None,
) -> AsyncIterator[Client]:
    """An ``mcp.Client`` over Streamable HTTP (``mode`` "auto" speaks 2026-07-28, "legacy" the
    initialize handshake), sending ``headers``; the HTTP status of each answer goes to
    ``statuses``, if given."""

    async def note(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    async with (
        httpx2.AsyncClient(
            headers=headers or {},
            timeout=httpx2.Timeout(30, read=300),
            event_hooks={"response": [note]},
        ) as http,
        Client(
            streamable_http_client(url, http_client=http, terminate_on_close=terminate_on_close),
            mode=mode,  # type: ignore[arg-type]
        ) as client,
    ):
        yield client


@dataclass
class TokenServer:
    """An HTTP server with a token file of several principals (``tokens``: name to token) and
    the all-access ``shared`` token beside it."""

    url: str
    tokens: dict[str, str]
    db: Path | str
    auth_file: Path
    shared: str = "shared-token-for-everyone"

    def client(self, who: str, mode: str) -> contextlib.AbstractAsyncContextManager[Client]:
        token = self.shared if who == "shared" else self.tokens[who]
        return sdk_client(self.url, mode=mode, headers={"Authorization": f"Bearer {token}"})


@contextlib.asynccontextmanager
async def token_server(
    tmp_path: Path,
    scoped: dict[str, list[str] | None],
    *,
    tools: str,
    resolver: Resolver,
    disconnect_grace: float | None = None,
    db: Path | str | None = None,
) -> AsyncIterator[TokenServer]:
    """Serve ``tools`` over HTTP on 127.0.0.1 with a token file that gives each principal of
    ``scoped`` a token and its scopes (None: every scope), on ``db`` (None: a fresh file). A
    session that ends ends its agents' leases after ``disconnect_grace`` seconds (None:
    never)."""
    from agenthold.cli.main import ServeOptions
    from agenthold.identity.principals import TokenTable, add_token
    from agenthold.serve.http import http_app

    auth_file = tmp_path / "tokens.json"
    tokens = {name: add_token(auth_file, name, scopes)[0] for name, scopes in scoped.items()}
    db = tmp_path / "state.db" if db is None else db
    with StateStore(db) as store:
        app = Agenthold(
            Coordinator(store, resolver=resolver), tools=tools, disconnect_grace=disconnect_grace
        )
        opts = ServeOptions(
            transport="http",
            tools=tools,
            auth_tokens=[TokenServer.shared],
            auth_file=TokenTable(auth_file),
        )
        async with uvicorn_serving(app, http_app(app, opts), path=opts.path) as web:
            yield TokenServer(web.url, tokens, db, auth_file)


async def tools_seen(server: TokenServer, principals: list[str], mode: str) -> dict[str, set[str]]:
    """The names tools/list shows each of ``principals``, one connection each."""
    seen = {}
    for who in principals:
        async with server.client(who, mode) as c:
            seen[who] = {t.name for t in (await c.list_tools()).tools}
    return seen


async def flagged_call(client: Client, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """(isError, the reply's JSON) of one call."""
    done = await client.call_tool(tool, arguments)
    assert done.structured_content is not None, done.content
    return bool(done.is_error), done.structured_content


def initialize_request(request_id: int = 1, client: str = "raw-test") -> dict[str, Any]:
    """A 2025-11-25 initialize request, as JSON-RPC."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": client, "version": "0"},
        },
    }


async def open_session(http: httpx2.AsyncClient, url: str, client: str = "raw-test") -> str:
    """A 2025-11-25 session over raw HTTP: initialize, then the initialized notification; its
    id."""
    init = await http.post(
        url,
        json=initialize_request(client=client),
        headers={"Content-Type": "application/json", "Accept": ACCEPT},
    )
    session = init.headers["mcp-session-id"]
    done = await http.post(
        url,
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        headers={
            "Content-Type": "application/json",
            "Accept": ACCEPT,
            "MCP-Protocol-Version": LEGACY,
            "Mcp-Session-Id": session,
        },
    )
    assert done.status_code == 202
    return session


def sse_messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a text/event-stream body."""
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


async def raw_connection(port: int) -> anyio.abc.SocketStream:
    """A bare TCP connection to the server on ``port``, for what no HTTP client sends."""
    return await anyio.connect_tcp("127.0.0.1", port)


def post_head(port: int, *headers: str) -> bytes:
    """The head of a JSON POST to /mcp, with ``headers`` (``Name: value``) after the usual ones."""
    lines = [
        "POST /mcp HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Accept: {ACCEPT}",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def free_port() -> int:
    """A loopback port that is free now, for a server process to take."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------------------------
# An agenthold 0.10 database
# --------------------------------------------------------------------------------------------

# The tables agenthold 0.10.0 created (its store.SCHEMA), which 0.11 imports on first open.
LEGACY_SCHEMA = """
CREATE TABLE state_records (
    namespace TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, version INTEGER NOT NULL,
    updated_by TEXT NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY (namespace, key));
CREATE TABLE state_history (
    id INTEGER PRIMARY KEY AUTOINCREMENT, namespace TEXT NOT NULL, key TEXT NOT NULL,
    value TEXT NOT NULL, version INTEGER NOT NULL, updated_by TEXT NOT NULL,
    updated_at TEXT NOT NULL, event_type TEXT NOT NULL DEFAULT 'write');
CREATE INDEX idx_history_ns_key ON state_history (namespace, key);
"""


def write_0_10_database(path: Path, names: list[tuple[str, str]]) -> None:
    """A database as 0.10 leaves it after one write of the value 1 to each (namespace, key):
    names 0.10 accepted and 0.11 may not."""
    import sqlite3

    at = "2026-01-01T00:00:00.000000+00:00"
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA)
    conn.executemany(
        "INSERT INTO state_history (namespace, key, value, version, updated_by, updated_at) "
        "VALUES (?, ?, '1', 1, 'old', ?)",
        [(ns, key, at) for ns, key in names],
    )
    conn.executemany(
        "INSERT INTO state_records VALUES (?, ?, '1', 1, 'old', ?)",
        [(ns, key, at) for ns, key in names],
    )
    conn.commit()
    conn.close()


# --------------------------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------------------------


def run_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run ``target(i)`` in ``count`` threads released together; return their results in
    order, re-raising the first failure (and failing if a thread never finishes)."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


# --------------------------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment of a child process: this one's (coverage settings included), with this
    source tree first on PYTHONPATH, so it imports agenthold from here, installed or not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def agenthold_args(db: Path | str, root: Path, *flags: str) -> list[str]:
    """The arguments of ``python`` that serve ``db`` over stdio, with one workspace "default"
    at ``root``."""
    return ["-m", "agenthold", "--db", str(db), "--workspace", f"default={root}", *flags]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``agenthold ARGV`` run in this process (the command line's main): its exit status,
    stdout and stderr."""
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return status, out, err


def run_agenthold(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m agenthold --db tmp_path/state.db ARGS`` to its end, with empty stdin."""
    return subprocess.run(
        [sys.executable, "-m", "agenthold", "--db", str(tmp_path / "state.db"), *args],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )


def run_python(
    code: str, *args: Path | str, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    """``python -c code ARGS`` to its end (its output not captured)."""
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], env=child_env(), timeout=timeout
    )


@contextlib.contextmanager
def python_child(code: str, *args: Path | str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -c code ARGS``, which says it is ready by printing a line, then holds what it
    opened until its stdin ends: yields it and that first line (stripped) once printed; its
    stdin is closed when the block ends, and it is waited for (its ``returncode`` then set)."""
    child = subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    try:
        yield child, child.stdout.readline().strip()
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        child.stdout.close()


def backed_up_store(source: Path, dest: Path, key: str = "k", value: Any = "backed-up") -> None:
    """A new database at ``source`` whose one record is ns/``key`` = ``value``, backed up to
    ``dest``: a fresh copy, as ``agenthold backup`` leaves it, that no store has opened."""
    with StateStore(source) as store:
        store.set("ns", key, value, updated_by="t")
        store.backup(dest)


class LineProcess:
    """A child process whose stdout a thread reads line by line into a queue (None at its
    end), so that every read can have a timeout. ``popen`` goes to subprocess.Popen."""

    def __init__(self, argv: list[str], **popen: Any) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, **popen)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout: float = 30.0) -> str:
        """The next line it writes. If none comes within ``timeout`` seconds, or it ends, the
        test fails with what it wrote on stderr (where that is piped), and it is killed."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None:
            self.kill()
            stderr = self.proc.stderr.read() if self.proc.stderr is not None else "(see stderr)"
            pytest.fail(f"{self.proc.args} said nothing more: {stderr}")
        return line

    def write_line(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


class HttpServerProcess:
    """``python -m agenthold --db DB --transport http ARGS`` in ``cwd`` on a free loopback
    port (``env`` over this process's environment); its stderr is read live, its stdout
    dropped."""

    def __init__(
        self, db: Path | str, cwd: Path, *args: str, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.db = db
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agenthold", "--db", str(db), "--transport", "http",
             "--port", str(self.port), *args],
            cwd=cwd, env={**child_env(), **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._serving = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "serving" in line:
                self._serving.set()
        self._serving.set()  # the process ended

    def wait_serving(self) -> None:
        assert self._serving.wait(STARTUP), "the server never started"
        assert self.proc.poll() is None, self.stderr

    def wait(self, timeout: float = 15) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(5)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.proc.send_signal(signum)
        return self.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)


@contextlib.contextmanager
def another_process_holds_the_write_lock(db: Path) -> Iterator[None]:
    """SQLite's write lock (BEGIN IMMEDIATE and an uncommitted change), held by another
    process (tests/helpers/store_worker.py hold-lock) until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, str(STORE_WORKER), "hold-lock", str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.write("done\n")
        holder.stdin.close()
        holder.wait(10)
        holder.stdout.close()


class StdioPipes:
    """An agenthold stdio server process (``argv``, in ``cwd``) spoken to in raw JSON-RPC
    lines over its pipes. A thread files what it writes by id (a line without an id under
    None); its stderr goes to a file in ``cwd``, read when it is closed."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.errors = (cwd / f"stderr-{time.monotonic_ns()}.txt").open("w+b")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            cwd=cwd,
            env=child_env(),
        )
        self.replies: dict[Any, list[dict[str, Any]]] = {}
        self.arrived = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.next_id = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.arrived:
                self.replies.setdefault(message.get("id"), []).append(message)
                self.arrived.notify_all()

    def send(self, text: str | bytes) -> None:
        """Write one line to the server's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((text.encode() if isinstance(text, str) else text) + b"\n")
        self.proc.stdin.flush()

    def reply(self, request_id: Any, timeout: float = ANSWER_LIMIT) -> dict[str, Any]:
        """The first message with ``request_id`` not taken yet (waiting ``timeout`` seconds)."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: self.replies.get(request_id), timeout), (
                f"no answer to request {request_id!r} within {timeout} s"
            )
            return self.replies[request_id].pop(0)

    def request(
        self,
        method: str,
        params: dict[str, Any],
        timeout: float = ANSWER_LIMIT,
        request_id: int | str | None = None,
    ) -> Any:
        """Send a request (numbered in turn unless ``request_id`` is given); its result."""
        if request_id is None:
            self.next_id += 1
            request_id = self.next_id
        line = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        self.send(json.dumps(line))
        reply = self.reply(request_id, timeout)
        assert "result" in reply, reply
        return reply["result"]

    def handshake(self, client: str) -> None:
        """The 2025-11-25 initialize handshake."""
        init = initialize_request(client=client)
        self.request("initialize", init["params"], STARTUP, request_id="init")
        self.send('{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def close(self) -> tuple[int, str]:
        """End the server as a client does (EOF on stdin); its exit status and stderr."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            status = self.proc.wait(timeout=STARTUP)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.reader.join(timeout=10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.errors.seek(0)
        err = self.errors.read().decode(errors="replace")
        self.errors.close()
        return status, err


# --------------------------------------------------------------------------------------------
# Warm servers
# --------------------------------------------------------------------------------------------


def warm_pids(directory: Path) -> list[int]:
    """The warm servers living in the runtime directory ``directory``: the pid in each pid
    file's name (KEY.PID.pid), never its text, which a server may be writing as we read (a
    prefix of a pid is somebody else's process)."""
    pids = []
    for pid_file in directory.glob("*.pid"):
        with contextlib.suppress(ValueError):
            pids.append(int(pid_file.name.rsplit(".", 2)[-2]))
    return sorted(pids)


def _born_in(directory: Path) -> list[int]:
    """Processes (other than this one) whose environment names ``directory`` as their runtime
    directory: the calls a test started and the warm servers they forked, including one still
    starting, which has no pid file yet but may yet bind a socket or write one. Linux only
    (/proc); elsewhere, none."""
    wanted = f"AGENTHOLD_RUNTIME_DIR={directory}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if wanted in (entry / "environ").read_bytes().split(b"\0") and not _zombie(entry):
                pids.append(int(entry.name))
    return sorted(set(pids) - {os.getpid()})


def _zombie(entry: Path) -> bool:
    """A process that has exited but was not reaped (a double-forked warm server's parent is
    init, which may reap late): it holds no file and can do nothing more."""
    stat = (entry / "stat").read_text()
    return stat[stat.rindex(")") + 2 :].startswith(("Z", "X"))


def _living(directory: Path) -> list[int]:
    return sorted(set(warm_pids(directory)) | set(_born_in(directory)))


def stop_warm_servers(directory: Path, timeout: float = 15.0) -> list[int]:
    """SIGTERM every warm server of ``directory`` and wait until each has exited (its pid
    file goes last), and every process started with ``directory`` as its runtime directory:
    a warm server a call forked may still be starting when the call has ended, and would bind
    its socket or write its pid file after the test has looked. Those still there after
    ``timeout`` are killed and returned, the warm servers among them by the pid in their pid
    file. Once this returns, nothing writes to ``directory`` any more."""
    for pid in _living(directory):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _living(directory) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = _living(directory)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


# --------------------------------------------------------------------------------------------
# An overlap oracle for the history checkers, written without agenthold's matching
# --------------------------------------------------------------------------------------------


def glob_matches(pattern: str, path: str) -> bool:
    """Whether the file ``path`` (relative, segments split by /) is covered by a claim of
    ``pattern`` as the docs define it: a name ending in / is a directory (every file beneath
    it); in a segment, * is any run of characters, ? one character, [abc], [a-z] and [!abc]
    one character of a class (a ] first in the class is itself); ** as a whole segment is any
    number of segments, none included; anything else is itself. Written here rather than
    taken from agenthold.claims.patterns, so that a checker using it can catch a bug there."""
    parts = path.split("/")
    if pattern.endswith("/"):
        above = pattern[:-1].split("/")
        return any(_match_segments(above, parts[:i]) for i in range(1, len(parts)))
    return _match_segments(pattern.split("/"), parts)


def _match_segments(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match_segments(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return (
        bool(parts)
        and _match_segment(pattern[0], parts[0])
        and _match_segments(pattern[1:], parts[1:])
    )


def _match_segment(pattern: str, name: str) -> bool:
    if not pattern:
        return not name
    first = pattern[0]
    if first == "*":
        return any(_match_segment(pattern[1:], name[i:]) for i in range(len(name) + 1))
    if not name:
        return False
    if first == "[":
        negated = pattern[1:2] == "!"
        start = 2 if negated else 1
        end = pattern.find("]", start + 1)  # a ] right after [ or [! is a member
        if end != -1:
            inside = _in_class(name[0], pattern[start:end]) != negated
            return inside and _match_segment(pattern[end + 1 :], name[1:])
    if first == "?" or first == name[0]:
        return _match_segment(pattern[1:], name[1:])
    return False


def _in_class(char: str, members: str) -> bool:
    i = 0
    while i < len(members):
        if i + 2 < len(members) and members[i + 1] == "-":  # a range, a-z
            if members[i] <= char <= members[i + 2]:
                return True
            i += 3
        else:
            if members[i] == char:
                return True
            i += 1
    return False


def _instance(segment: str) -> str:
    """A name that the glob segment ``segment`` matches and its literal segments do not
    contain: * as "new", ? as "n", a class as a member of it (or "~" if negated)."""
    out, i = "", 0
    while i < len(segment):
        c = segment[i]
        end = segment.find("]", i + 2) if c == "[" else -1
        if end != -1:
            out += "~" if segment[i + 1] == "!" else segment[i + 1]
            i = end + 1
            continue
        out += {"*": "new", "?": "n"}.get(c, c)
        i += 1
    return out


class OverlapOracle:
    """Whether two claim targets, given as the names the random workers claim them by
    (relative paths, directories ending in /, globs, custom:// names), cover a file in common.
    Decided by brute force: every path of up to one segment more than the deepest name,
    built from the names' own segments, an instance of each glob segment and "new", is
    matched against each name (glob_matches); two names overlap when some path matches
    both. Custom names are literal: they overlap only themselves. This finds every overlap
    among such small universes, whose witnesses never need more segments than that."""

    def __init__(self, names: list[str]) -> None:
        files = [n for n in names if "://" not in n]
        depth = max(len(n.split("/")) for n in files) + 1  # a directory's file counts
        segments = {part for n in files for part in n.rstrip("/").split("/") if part != "**"}
        alphabet = sorted(segments | {_instance(part) for part in segments} | {"new"})
        paths = ["/".join(p) for k in range(1, depth + 1) for p in product(alphabet, repeat=k)]
        self.names = set(names)
        self.covered = {n: frozenset(p for p in paths if glob_matches(n, p)) for n in files}

    def __call__(self, x: str, y: str) -> bool:
        assert x in self.names and y in self.names, (x, y)
        if "://" in x or "://" in y:
            return x == y
        return bool(self.covered[x] & self.covered[y])
