"""Warm servers (serve/warm.py), the front that hands them calls (serve/front.py), and the
protocol the two speak (serve/warm_protocol.py).

Every test here runs real ``python -m agenthold`` processes on real pipes, with a runtime
directory of its own (short, for the socket path limit) whose warm servers are stopped at the
end. A call is one process run to its end with its requests on stdin, as a client that starts a
server per call makes it; ``--log-level info`` makes a warm server say on the call's stderr
that it served it, which is how a test tells the fast path from the slow one. What the warm
path serves is the stdio protocol itself, which all of test_stdio.py checks in both ways.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import REPO, child_env, stop_warm_servers, warm_pids

from agenthold.serve import front
from agenthold.serve import warm_protocol as protocol

SERVED = "serving this call"


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime directory for this test's warm servers, warm servers on (without waiting),
    the test's directory as the current one; every warm server is stopped at the end."""
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="ah-"))
    monkeypatch.setenv(front.RUNTIME_DIR, str(directory))
    monkeypatch.delenv(front.NO_WARM)
    monkeypatch.chdir(tmp_path)
    try:
        yield directory
    finally:
        left = stop_warm_servers(directory)
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()
        assert not left


def argv(tmp_path: Path, *flags: str) -> list[str]:
    return ["--db", str(tmp_path / "warm.db"), "--log-level", "info", *flags]


def one_call(
    tmp_path: Path, *flags: str, env: dict[str, str] | None = None, tool: str = "agenthold_status"
) -> tuple[dict[str, Any], str]:
    """One call as a per-call client makes it: initialize, one tool call, end of input. The
    tool's reply and the call's stderr."""
    arguments = {"resource": "a.md"} if tool == "agenthold_status" else {"name": "w"}
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "per-call", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": tool, "arguments": arguments}},
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "agenthold", *argv(tmp_path, *flags)],
        input="".join(json.dumps(line) + "\n" for line in lines).encode(),
        capture_output=True,
        cwd=tmp_path,
        env={**child_env(), **(env or {})},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    replies = {r["id"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert sorted(replies) == [0, 1]
    return replies[1]["result"]["structuredContent"], done.stderr.decode()


def wait_for(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def plan_of(tmp_path: Path, *flags: str) -> protocol.Plan:
    found = front.plan_for(argv(tmp_path, *flags), os.environ)
    assert found is not None
    return found


def test_a_call_leaves_a_warm_server_that_serves_the_next_calls_and_exits_when_idle(
    tmp_path: Path, runtime: Path
) -> None:
    # AGENTHOLD_WARM=wait: this call goes through the server it leaves, so the idle time starts
    # when it ends, not while a slow first call is still serving itself
    first, err = one_call(tmp_path, env={protocol.IDLE: "5", front.WARM: "wait"})
    (pid,) = warm_pids(runtime)
    assert first["status"] == "available" and f"warm server {pid}: {SERVED}" in err
    for _ in range(3):
        reply, err = one_call(tmp_path, tool="agenthold_register")
        assert reply["status"] == "registered"
        assert f"warm server {pid}: {SERVED}" in err
    assert warm_pids(runtime) == [pid]
    assert plan_of(tmp_path).key != plan_of(tmp_path, "--tools", "advanced").key
    wait_for(lambda: not warm_pids(runtime), timeout=20)  # idle for 5 s: gone
    wait_for(lambda: not list(runtime.iterdir()))  # with its socket, lock and log


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_no_warm_turns_it_off(tmp_path: Path, runtime: Path, how: str) -> None:
    flags = ("--no-warm",) if how == "flag" else ()
    env = {front.NO_WARM: "1"} if how == "variable" else {}
    for _ in range(2):
        _, err = one_call(tmp_path, *flags, env=env)
        assert SERVED not in err
    time.sleep(0.3)
    assert not warm_pids(runtime) and not list(runtime.iterdir())


def test_a_replaced_database_ends_the_warm_server_and_the_call_is_served_afresh(
    tmp_path: Path, runtime: Path
) -> None:
    one_call(tmp_path)
    wait_for(lambda: len(warm_pids(runtime)) == 1)
    (old,) = warm_pids(runtime)
    _, err = one_call(tmp_path, tool="agenthold_register")
    assert SERVED in err
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / 'warm.db'}{suffix}").unlink(missing_ok=True)
    reply, err = one_call(tmp_path, tool="agenthold_register")
    assert reply["status"] == "registered" and SERVED not in err  # the new file, served here
    wait_for(lambda: warm_pids(runtime) not in ([], [old]))
    (new,) = warm_pids(runtime)
    _, err = one_call(tmp_path)
    assert f"warm server {new}: {SERVED}" in err


def test_a_hung_warm_server_costs_one_timeout_and_loses_nothing(
    tmp_path: Path, runtime: Path
) -> None:
    found = plan_of(tmp_path)
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(found.socket)
    hung.listen(8)  # accepts connections (the kernel does) and never answers
    try:
        started = time.monotonic()
        reply, err = one_call(tmp_path)
        assert reply["status"] == "available" and SERVED not in err
        assert time.monotonic() - started >= protocol.HANDSHAKE_TIMEOUT
        # its socket was taken away, and the call left a warm server of its own there
        wait_for(lambda: len(warm_pids(runtime)) == 1)
        _, err = one_call(tmp_path)
        assert SERVED in err
    finally:
        hung.close()


def fake_server(path: str, answer: bytes, heard: list[bytes]) -> socket.socket:
    """A socket at ``path`` that answers each connection's first line with ``answer``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                heard.append(conn.recv(65536))
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_warm_server_that_refuses_the_hello_leaves_the_call_to_this_process(
    tmp_path: Path, runtime: Path
) -> None:
    found = plan_of(tmp_path)
    heard: list[bytes] = []
    listener = fake_server(found.socket, b'{"ok": false, "why": "of other code"}\n', heard)
    try:
        reply, err = one_call(tmp_path, "--no-warm")  # another key: a control call
        reply, err = one_call(tmp_path)
        assert reply["status"] == "available" and SERVED not in err
        hello = json.loads(heard[0])
        assert hello == {
            "agenthold": protocol.PROTOCOL,
            "identity": found.identity,
            "stamp": found.stamp,
        }
    finally:
        listener.close()


def test_a_real_warm_server_refuses_a_hello_of_other_code_and_keeps_serving(
    tmp_path: Path, runtime: Path
) -> None:
    one_call(tmp_path)
    wait_for(lambda: len(warm_pids(runtime)) == 1)
    found = plan_of(tmp_path)
    other = protocol.Plan(found.directory, found.identity, "other code")
    assert protocol.connect(other) is None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(found.socket)
        sock.sendall(b"not json\n")
        assert sock.recv(100) == b""  # hung up on
    _, err = one_call(tmp_path)
    assert SERVED in err


def test_a_socket_or_directory_of_another_user_is_never_used(tmp_path: Path, runtime: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make files of another user")
    nobody = 65534
    found = plan_of(tmp_path)
    heard: list[bytes] = []
    listener = fake_server(found.socket, b'{"ok": true, "warnings": []}\n', heard)
    try:
        os.chown(found.socket, nobody, nobody)  # a socket file of another user
        reply, _ = one_call(tmp_path)
        assert reply["status"] == "available" and heard == []
        os.chown(found.socket, 0, 0)
        os.chmod(runtime, 0o755)  # a directory others may enter
        reply, _ = one_call(tmp_path)
        assert reply["status"] == "available" and heard == []
        assert front.runtime_dir({front.RUNTIME_DIR: str(runtime)}) is None
        os.chmod(runtime, 0o700)
        os.chown(runtime, nobody, nobody)  # a directory of another user
        assert front.runtime_dir({front.RUNTIME_DIR: str(runtime)}) is None
        os.chown(runtime, 0, 0)
    finally:
        listener.close()
        os.unlink(found.socket)


def test_a_listener_of_another_user_is_refused_by_its_credentials(
    tmp_path: Path, runtime: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    found = plan_of(tmp_path)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, as another user
        try:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(found.socket)
            os.setgid(65534)
            os.setuid(65534)
            listener.listen(8)  # the credentials a peer sees are those of listen()
            os.write(ready_w, b"1")
            conn, _ = listener.accept()
            conn.settimeout(5)
            got = conn.recv(100)
            os._exit(3 if got else 0)
        finally:
            os._exit(1)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    try:
        assert protocol.connect(found) is None
    finally:
        _, status = os.waitpid(pid, 0)
        os.unlink(found.socket)
    assert os.waitstatus_to_exitcode(status) == 0  # it heard nothing


def test_credentials_the_system_will_not_give_refuse_the_peer() -> None:
    # what macOS's LOCAL_PEERCRED answers, a struct xucred, is decoded here on Linux too (the
    # getsockopt itself runs only on macOS, which our tests do not run on)
    groups = struct.pack("=16I", *range(16))
    assert protocol.xucred_uid(struct.pack("=2Ih2x", 0, 501, 1) + groups) == 501
    assert protocol.xucred_uid(struct.pack("=2Ih2x", 1, 501, 1) + groups) == -1  # other version
    assert protocol.xucred_uid(b"\0\0\0") == -1  # short
    closed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    closed.close()
    assert protocol.peer_uid(closed) == -1  # getsockopt fails: nobody's, so refused


@pytest.mark.usefixtures("no_child_coverage")  # coverage itself would import sqlite3
def test_the_front_imports_nothing_heavy_and_help_and_the_inspector_never_go_warm(
    tmp_path: Path, runtime: Path
) -> None:
    one_call(tmp_path)
    wait_for(lambda: len(warm_pids(runtime)) == 1)
    hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
             "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": {"name": "imports", "version": "1"}}}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "agenthold", *argv(tmp_path)],
        input=json.dumps(hello).encode() + b"\n",
        capture_output=True,
        cwd=tmp_path,
        env=child_env(),
        timeout=60,
    )
    err = done.stderr.decode()
    assert SERVED in err and json.loads(done.stdout)["id"] == 0
    imported = {line.split("|")[-1].strip() for line in err.splitlines() if "|" in line}
    ours = {m for m in imported if m.split(".")[0] == "agenthold"}
    assert ours == {"agenthold", "agenthold.lazy", "agenthold.serve", "agenthold.serve.front",
                    "agenthold.serve.warm_protocol"}  # fmt: skip
    heavy = {m for m in imported if m.split(".")[0] in ("mcp", "pydantic", "anyio", "sqlite3")}
    assert not heavy and "agenthold.cli.main" not in imported and "argparse" not in imported
    for args in (["--help"], ["claims", "--db", str(tmp_path / "warm.db")]):
        shown = subprocess.run(
            [sys.executable, "-m", "agenthold", *args],
            capture_output=True,
            cwd=tmp_path,
            env=child_env(),
            timeout=60,
        )
        assert shown.returncode == 0 and SERVED not in shown.stderr.decode()
    assert front.serves_stdio(["--db", "x.db", "--json-response", "--tools=advanced"], {})
    assert front.serves_stdio([], {}) and not front.serves_stdio([], {"AGENTHOLD_DB": ":memory:"})
    for never in (
        ["--help"], ["--version"], ["claims"], ["--db", ":memory:"], ["--db", "file:x"],
        ["--transport", "http"], ["--db"], ["--no-warm"], ["--unknown"], ["-h"],
    ):  # fmt: skip
        assert not front.serves_stdio(never, {}), never


@pytest.mark.usefixtures("no_child_coverage")  # coverage itself would import more
def test_help_version_and_the_subcommands_skip_the_front_and_import_no_store(
    tmp_path: Path, runtime: Path
) -> None:
    # a first word that never serves stdio goes straight to the command line, as before the
    # warm server existed: not even the front's imports (json, socket) are paid
    db = str(tmp_path / "x.db")
    for args in (["--help"], ["-h"], ["--version"], ["claims", "--db", db], ["token", "--help"]):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "agenthold", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd=tmp_path,
            env=child_env(),
            timeout=60,
        )
        err = done.stderr.decode()
        imported = {line.split("|")[-1].strip() for line in err.splitlines() if "|" in line}
        assert "agenthold.cli.main" in imported and "agenthold.serve.front" not in imported, args
        if args[0] != "claims":  # nothing opened a database: ending does not import the store
            assert done.returncode == 0 and "agenthold.store" not in imported, args
    # a command line that may serve stdio tries the front first, even with a subcommand's
    # name further on (the front then finds it is not its own and hands it on)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "agenthold", "--db", db, "claims"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=tmp_path,
        env=child_env(),
        timeout=60,
    )
    assert "agenthold.serve.front" in done.stderr.decode()


def initialized_front(tmp_path: Path, client: str) -> subprocess.Popen[bytes]:
    """``agenthold`` over stdio with pipes, its session initialized (2025-11-25) and left open."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthold", *argv(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=child_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None
    hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
             "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": {"name": client, "version": "1"}}}  # fmt: skip
    proc.stdin.write(json.dumps(hello).encode() + b"\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["id"] == 0
    return proc


def test_sigterm_at_the_front_ends_the_session_and_the_warm_server_serves_on(
    tmp_path: Path, runtime: Path
) -> None:
    one_call(tmp_path)
    wait_for(lambda: len(warm_pids(runtime)) == 1)
    proc = initialized_front(tmp_path, "signals")
    assert proc.stdin is not None and proc.stdout is not None
    proc.terminate()
    assert proc.wait(timeout=15) == 0
    proc.stdin.close()
    proc.stdout.close()
    assert proc.stderr is not None
    assert b"SIGTERM: stopping" in proc.stderr.read()
    proc.stderr.close()
    _, err = one_call(tmp_path)
    assert SERVED in err


def test_the_package_entry_points_go_through_the_front() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert 'agenthold = "agenthold.__main__:main"' in text
    assert (
        "agenthold.serve.front import try_warm" in (REPO / "agenthold" / "__main__.py").read_text()
    )


def test_the_code_stamp_changes_with_any_module_of_any_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    copy = tmp_path / "agenthold"
    shutil.copytree(REPO / "agenthold", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(protocol, "PACKAGE", str(copy))
    stamp = protocol.code_stamp()
    assert str(copy / "claims" / "coordinator.py") in stamp  # a room's module, not only serve/
    (copy / "db" / "__pycache__").mkdir()
    (copy / "db" / "__pycache__" / "x.cpython.pyc").write_bytes(b"")  # compiled: not code
    assert protocol.code_stamp() == stamp
    module = copy / "claims" / "coordinator.py"
    later = module.stat().st_mtime_ns + 5_000_000_000
    os.utime(module, ns=(later, later))
    edited = protocol.code_stamp()
    assert edited != stamp
    (copy / "bus" / "extra.py").write_text("")  # a module more
    assert protocol.code_stamp() != edited


@pytest.mark.usefixtures("no_child_coverage")  # the copy's modules are not the measured ones
def test_an_upgrade_on_disk_ends_the_old_warm_server_at_the_next_call(
    tmp_path: Path, runtime: Path
) -> None:
    import shutil

    site = tmp_path / "site"
    shutil.copytree(REPO / "agenthold", site / "agenthold", ignore=shutil.ignore_patterns("*.pyc"))
    env = {"PYTHONPATH": str(site)}
    _, err = one_call(tmp_path, env={**env, front.WARM: "wait"})
    (old,) = warm_pids(runtime)
    assert f"warm server {old}: {SERVED}" in err
    module = site / "agenthold" / "store.py"
    later = module.stat().st_mtime_ns + 5_000_000_000
    os.utime(module, ns=(later, later))  # what an upgrade does to the code stamp
    reply, err = one_call(tmp_path, env=env)
    assert reply["status"] == "available" and SERVED not in err  # refused: served here
    wait_for(lambda: old not in warm_pids(runtime), timeout=10)  # and it exits at once
    wait_for(lambda: len(warm_pids(runtime)) == 1)  # the call left a warm server of the new code
    (new,) = warm_pids(runtime)
    _, err = one_call(tmp_path, env=env)
    assert f"warm server {new}: {SERVED}" in err


@pytest.mark.parametrize("change", ["removed", "replaced", "upgraded"])
def test_a_warm_server_without_a_client_notices_by_itself_that_it_is_stale_and_exits(
    tmp_path: Path, runtime: Path, change: str, request: pytest.FixtureRequest
) -> None:
    # no call comes to tell it: it looks by itself every AGENTHOLD_WARM_CHECK seconds (20 by
    # default; shortened here), instead of holding the old file open until its idle time
    import shutil

    from agenthold.serve import warm

    assert warm.check_seconds({}) == warm.CHECK_SECONDS == 20.0  # as docs/warm.md says
    nan, negative = {protocol.CHECK: "nan"}, {protocol.CHECK: "-1"}
    assert warm.check_seconds(nan) == warm.check_seconds(negative) == 20
    check = 0.5
    env = {front.WARM: "wait", protocol.CHECK: str(check)}
    if change == "upgraded":
        request.getfixturevalue("no_child_coverage")  # the copy's modules are not measured
        site = tmp_path / "site"
        shutil.copytree(
            REPO / "agenthold", site / "agenthold", ignore=shutil.ignore_patterns("*.pyc")
        )
        env["PYTHONPATH"] = str(site)
    _, err = one_call(tmp_path, env=env)
    (pid,) = warm_pids(runtime)
    assert f"warm server {pid}: {SERVED}" in err
    (log_path,) = runtime.glob("*.log")  # the one warm server of this test: open, it can be
    log = log_path.open(errors="replace")  # read after the server removed it as it exited
    db = tmp_path / "warm.db"
    if change == "removed":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    elif change == "replaced":  # another file under the same name, as a restore does
        shutil.copyfile(db, tmp_path / "other.db")
        os.replace(tmp_path / "other.db", db)
    else:
        module = tmp_path / "site" / "agenthold" / "store.py"
        later = module.stat().st_mtime_ns + 5_000_000_000
        os.utime(module, ns=(later, later))
    wait_for(lambda: not warm_pids(runtime), timeout=check + 9.5)  # gone without a call
    why = "the code on disk has changed" if change == "upgraded" else f"{db} was replaced or"
    with log:
        assert f"stale, exiting: {why}" in log.read()
    # it took its socket, pid file and lock with it (and its log, unless the replaced
    # database made it write a warning there, which is kept for a person to read)
    wait_for(lambda: [p.suffix for p in runtime.iterdir()] in ([], [".log"]))


def test_the_idle_time_starts_again_after_a_session_longer_than_it(
    tmp_path: Path, runtime: Path
) -> None:
    idle = 3.0
    one_call(tmp_path, env={protocol.IDLE: str(idle), front.WARM: "wait"})
    (pid,) = warm_pids(runtime)
    proc = initialized_front(tmp_path, "long")
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    time.sleep(idle + 1.5)  # a session that outlives the idle time
    proc.stdin.close()
    assert proc.wait(timeout=15) == 0
    assert f"warm server {pid}: {SERVED}".encode() in proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    _, err = one_call(tmp_path)  # the server did not exit when that session ended
    assert f"warm server {pid}: {SERVED}" in err
    started = time.monotonic()
    wait_for(lambda: not warm_pids(runtime), timeout=20)  # it exits once idle again
    assert time.monotonic() - started >= idle - 1.0


def test_other_libpq_variables_make_another_warm_server(tmp_path: Path, runtime: Path) -> None:
    args = ["--db", "postgresql://localhost/agenthold"]
    keys = {
        front.plan_for(args, {**os.environ, **extra}).key  # type: ignore[union-attr]
        for extra in (
            {},
            {"PGUSER": "alice"},
            {"PGUSER": "bob"},
            {"PGUSER": "bob", "PGPASSWORD": "secret"},
            {"PGSERVICE": "other"},
            {"PGGSSENCMODE": "prefer"},
        )
    }
    assert len(keys) == 6
    found = front.plan_for(args, {**os.environ, "PGPASSWORD": "s3cr3t-w0rd"})
    assert found is not None and "s3cr3t-w0rd" not in found.identity  # a digest, not the text
    assert front.libpq_settings({"HOME": "/x"}) is None


def test_a_killed_warm_server_leaves_its_socket_and_the_next_call_is_served_here(
    tmp_path: Path, runtime: Path
) -> None:
    import signal

    one_call(tmp_path, env={front.WARM: "wait"})
    (pid,) = warm_pids(runtime)
    reply, err = one_call(tmp_path, tool="agenthold_register")
    assert reply["status"] == "registered" and f"warm server {pid}: {SERVED}" in err
    os.kill(pid, signal.SIGKILL)  # no clean-up at all: the socket file stays
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid))
    found = plan_of(tmp_path)
    assert Path(found.socket).is_socket()
    Path(found.pid_file(pid)).unlink()  # what it would have removed itself
    reply, err = one_call(tmp_path, tool="agenthold_register")  # refused by the dead socket
    assert reply["status"] == "registered" and SERVED not in err
    wait_for(lambda: len(warm_pids(runtime)) == 1)  # and a fresh warm server took its place
    (new,) = warm_pids(runtime)
    reply, err = one_call(tmp_path)
    assert reply["status"] == "available" and f"warm server {new}: {SERVED}" in err


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def test_the_warm_server_opens_its_database_once_its_call_has_ended_or_a_call_comes(
    tmp_path: Path, runtime: Path
) -> None:
    # a cold call in progress: its warm server listens, but takes no CPU from it (no database
    # opened, so no pid file) until a call comes to its socket, which it then serves
    proc = initialized_front(tmp_path, "long session")
    found = plan_of(tmp_path)
    wait_for(lambda: Path(found.socket).is_socket())
    time.sleep(0.3)
    assert warm_pids(runtime) == []
    reply, err = one_call(tmp_path, tool="agenthold_register")
    (pid,) = warm_pids(runtime)
    assert reply["status"] == "registered" and f"warm server {pid}: {SERVED}" in err
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.close()
    assert proc.wait(timeout=15) == 0
    assert SERVED not in proc.stderr.read().decode()  # the long session served itself
    proc.stdout.close()
    proc.stderr.close()


def test_a_stop_signal_as_soon_as_the_warm_server_is_there_stops_it_cleanly(
    tmp_path: Path, runtime: Path
) -> None:
    import signal

    for _ in range(3):  # the pid file appears just before the server hears signals
        one_call(tmp_path)  # it starts once this call has ended
        deadline = time.monotonic() + 15
        while not warm_pids(runtime):
            assert time.monotonic() < deadline, "no warm server"
            time.sleep(0.001)
        (pid,) = warm_pids(runtime)
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not warm_pids(runtime))  # its pid file removed: a clean stop


def test_a_warm_server_whose_socket_was_taken_while_it_started_ends_and_leaves_it(
    tmp_path: Path, runtime: Path
) -> None:
    # a call that found it slow to answer took its socket away and left another server there
    # (here a listener of the test's): once up, it must neither serve nor remove that one
    from agenthold.serve.warm import TAKEN

    proc = initialized_front(tmp_path, "long session")  # its warm server waits for its end
    found = plan_of(tmp_path)
    wait_for(lambda: Path(found.socket).is_socket())
    os.unlink(found.socket)
    heard: list[bytes] = []
    listener = fake_server(found.socket, b'{"ok": false, "why": "busy"}\n', heard)
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.close()
        assert proc.wait(timeout=15) == 0
        proc.stdout.close()
        proc.stderr.close()
        wait_for(lambda: TAKEN in Path(found.log).read_text())
        assert Path(found.socket).is_socket() and warm_pids(runtime) == []
    finally:
        listener.close()
        os.unlink(found.socket)


# --------------------------------------------------------------------------------------------
# What warm servers leave in the runtime directory, and stop signals at any point
# --------------------------------------------------------------------------------------------


def _warm_starting(runtime: Path, front_pid: int) -> int:
    """The pid of the warm server a call forked, while it still waits for its turn (no pid
    file yet): the process started with this runtime directory that is not the call."""
    from support import _born_in

    deadline = time.monotonic() + 15
    while True:
        found = [pid for pid in _born_in(runtime) if pid != front_pid]
        if len(found) == 1 and list(runtime.glob("*.sock")):
            return found[0]
        assert time.monotonic() < deadline, "no warm server started"
        time.sleep(0.01)


def _gone(pid: int) -> bool:
    from support import _zombie

    entry = Path(f"/proc/{pid}")
    return not entry.exists() or _zombie(entry)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds processes in /proc")
def test_a_starting_warm_server_stops_on_sigterm_at_once(tmp_path: Path, runtime: Path) -> None:
    """The warm server a long session forked waits for that session's end before it opens
    the database; SIGTERM in that wait stops it now, and takes its files with it, while the
    session (served by the call itself) goes on."""
    import signal

    proc = initialized_front(tmp_path, "long session")
    try:
        pid = _warm_starting(runtime, proc.pid)
        assert warm_pids(runtime) == []  # still starting: no pid file yet
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: _gone(pid))  # at once, not when the session ends
        assert proc.poll() is None  # the session goes on
        wait_for(lambda: not list(runtime.iterdir()))  # socket, lock and log gone
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:  # pragma: no cover - only when the test failed
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_a_warm_session_ended_by_sigterm_to_its_server_exits_0_as_a_cold_one(
    tmp_path: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    monkeypatch.setenv(front.WARM, "wait")  # this session too goes through the warm server
    proc = initialized_front(tmp_path, "stopped by its server")
    try:
        wait_for(lambda: len(warm_pids(runtime)) == 1)  # its pid file may come a moment later
        (pid,) = warm_pids(runtime)
        os.kill(pid, signal.SIGTERM)  # as a shutdown or stop_warm_servers would
        assert proc.wait(timeout=15) == 0
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert "ended without finishing" not in err and SERVED in err
        wait_for(lambda: not list(runtime.iterdir()))
    finally:
        if proc.poll() is None:  # pragma: no cover - only when the test failed
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_an_exited_warm_server_leaves_nothing_behind(tmp_path: Path, runtime: Path) -> None:
    import signal

    for flags in ((), ("--tools", "advanced"), ("--tools", "messages")):  # three keys
        one_call(tmp_path, *flags, env={front.WARM: "wait"})
    pids = warm_pids(runtime)
    assert len(pids) == 3 and len(list(runtime.glob("*.log"))) == 3
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not list(runtime.iterdir()))


def test_a_new_warm_server_removes_what_killed_ones_left(tmp_path: Path, runtime: Path) -> None:
    """A warm server killed (SIGKILL, a crash) leaves its socket, pid file, lock and log; the
    next warm server to start removes them (and pairs of lock and log), once a minute old and
    with no living process and no lock held; it leaves whatever has a server."""
    import fcntl
    import signal

    from agenthold.serve.warm import STALE_AFTER

    one_call(tmp_path, "--tools", "advanced", env={front.WARM: "wait"})
    wait_for(lambda: len(warm_pids(runtime)) == 1)
    (killed,) = warm_pids(runtime)
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: _gone(killed))
    left = sorted(p.name for p in runtime.iterdir())
    assert sorted(n.rsplit(".", 1)[-1] for n in left) == ["lock", "log", "pid", "sock"]
    old = time.time() - STALE_AFTER - 5
    pairs = [f"{n:016x}" for n in range(5)]
    for key in pairs:  # what clean exits of older versions left: 166 pairs seen in one place
        for suffix in (".lock", ".log"):
            (runtime / (key + suffix)).write_text("")
    fresh, held = "f" * 16, "e" * 16
    for key in (fresh, held):
        (runtime / f"{key}.lock").write_text("")
    for path in runtime.iterdir():
        if not path.name.startswith(fresh):
            os.utime(path, (old, old))
    holder = os.open(runtime / f"{held}.lock", os.O_RDONLY)  # as a server starting under it
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        one_call(tmp_path, env={front.WARM: "wait"})  # a server of another key starts
        # (on a loaded machine the call may be served cold when the new server answers its
        # hello late; the server starts all the same, and it is its start that cleans up)
        wait_for(lambda: warm_pids(runtime) not in ([], [killed]))  # the new one's pid file
        wait_for(lambda: killed not in warm_pids(runtime))  # and the killed one's gone
        (serving,) = warm_pids(runtime)
        names = {p.name for p in runtime.iterdir()}
        assert not any(n.startswith(tuple(pairs)) for n in names)
        assert not any(n.startswith(left[0].split(".")[0]) for n in names)  # the killed one's
        assert {f"{fresh}.lock", f"{held}.lock"} <= names  # too new; held
        assert f"{plan_of(tmp_path).key}.{serving}.pid" in names  # its own, untouched
    finally:
        os.close(holder)
