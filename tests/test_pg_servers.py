"""agenthold servers on PostgreSQL, as separate processes: two ``--transport http`` servers (as on
two hosts) sharing one database coordinate through it, and a server keeps answering while the
database goes away and comes back. Also the faults of the database seen from the library:
connections ended by an administrator at random while writes run, a role whose password is
wrong, a database that does not exist.

Every client is a real ``mcp.Client`` over Streamable HTTP on 127.0.0.1; every server a real
``python -m agenthold`` process; the database the throwaway server of tests/pgserver.py.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import psycopg
import pytest
from mcp import Client
from pgserver import Cluster
from support import REPO, HttpServerProcess, free_port, sdk_client

from agenthold.store import StateStore, UnavailableError

pytestmark = pytest.mark.anyio


@contextlib.contextmanager
def servers(url: str, cwd: Path, count: int, *args: str) -> Iterator[list[HttpServerProcess]]:
    started = [HttpServerProcess(url, cwd, *args) for _ in range(count)]
    try:
        for server in started:
            server.wait_serving()
        yield started
    finally:
        for server in started:
            server.kill()


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Client]:
    async with sdk_client(url) as client:
        await client.list_tools()
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    return result.structured_content


# -- two servers, one database ---------------------------------------------------------------


async def test_two_http_servers_on_one_database_coordinate_fully(
    pg_url: str, tmp_path: Path
) -> None:
    """A claim through one server is busy through the other, naming the holder; a release
    through one wakes a wait through the other at once (by NOTIFY, long before the backstop
    poll), with the outcome the releaser gave; and what one server writes the other reads."""
    with servers(pg_url, tmp_path, 2) as (one, two):
        async with connect(one.url) as a, connect(two.url) as b:
            alice = (await call(a, "agenthold_register", name="alice"))["agent_id"]
            bob = (await call(b, "agenthold_register", name="bob"))["agent_id"]
            assert (await call(a, "agenthold_claim", resource="custom://doc", agent_id=alice))[
                "status"
            ] == "claimed"
            busy = await call(b, "agenthold_claim", resource="custom://doc", agent_id=bob)
            assert busy["status"] == "busy" and busy["held_by"] == alice, busy
            status = await call(b, "agenthold_status", resource="custom://doc")
            assert status["status"] == "claimed" and status["held_by"] == alice

            for round_ in range(3):  # each wait is woken by its own release, not a leftover
                woken: list[tuple[float, dict[str, Any]]] = []

                async def wait_on(woken: list[tuple[float, dict[str, Any]]]) -> None:
                    reply = await call(
                        b, "agenthold_wait", resource="custom://doc", timeout_seconds=30
                    )
                    woken.append((time.monotonic(), reply))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait_on, woken)
                    await anyio.sleep(0.3)  # the wait is blocked on the other server by now
                    assert not woken
                    released = await call(
                        a, "agenthold_release", resource="custom://doc", agent_id=alice,
                        outcome="modified",
                    )  # fmt: skip
                    released_at = time.monotonic()
                    assert released["status"] == "released", released
                at, reply = woken[0]
                assert reply["status"] == "available", reply
                assert reply["previous_outcome"] == "modified"
                assert at - released_at < 1.5, "woken by NOTIFY, not by the 2 s backstop poll"
                if round_ < 2:
                    assert (
                        await call(a, "agenthold_claim", resource="custom://doc", agent_id=alice)
                    )["status"] == "claimed"

            taken = await call(b, "agenthold_claim", resource="custom://doc", agent_id=bob)
            assert taken["status"] == "claimed", taken
            assert (await call(a, "agenthold_claim", resource="custom://doc", agent_id=alice))[
                "status"
            ] == "busy"
            status = await call(a, "agenthold_status", resource="custom://doc")
            assert status["held_by"] == bob, status


# -- the database goes away -----------------------------------------------------------------


async def test_a_server_answers_unavailable_while_postgresql_is_down_and_recovers_by_itself(
    pg_url: str, pg_cluster: Cluster, tmp_path: Path
) -> None:
    """While the database is stopped, every call is answered (``unavailable`` with a hint),
    quickly; once it is back the same server process serves again, claims held before the
    outage still hold, and a wait that spanned the outage still sees its release."""
    with servers(pg_url, tmp_path, 1) as (server,):
        async with connect(server.url) as client:
            agent = (await call(client, "agenthold_register", name="a"))["agent_id"]
            await call(client, "agenthold_claim", resource="custom://held", agent_id=agent)
            pg_cluster.stop("fast")
            try:
                for tool, args in [
                    ("agenthold_status", {"resource": "custom://held"}),
                    ("agenthold_claim", {"resource": "custom://other", "agent_id": agent}),
                    ("agenthold_register", {"name": "during"}),
                ]:
                    started = time.monotonic()
                    with anyio.fail_after(30):
                        reply = await call(client, tool, **args)
                    assert reply["status"] == "unavailable", (tool, reply)
                    assert "PostgreSQL" in reply["message"] and reply["hint"], reply
                    assert "\n" not in reply["message"]
                    # the first call may wait for the pool (at most 5 s, see docs/postgres.md), the
                    # later ones DOWN_WAIT; never the 30 s of a hung connection
                    assert time.monotonic() - started < 8, "answered in seconds, not after a hang"
            finally:
                pg_cluster.start()
            with anyio.fail_after(30):
                while True:  # the pool reconnects by itself; no restart of agenthold
                    reply = await call(client, "agenthold_status", resource="custom://held")
                    if reply["status"] != "unavailable":
                        break
                    await anyio.sleep(0.2)
            assert reply["status"] == "claimed" and reply["held_by"] == agent
            async with connect(server.url) as other:
                waiter = (await call(other, "agenthold_register", name="w"))["agent_id"]
                busy = await call(
                    other, "agenthold_claim", resource="custom://held", agent_id=waiter
                )
                assert busy["status"] == "busy"
                woken: list[dict[str, Any]] = []

                async def wait_on() -> None:
                    woken.append(
                        await call(
                            other, "agenthold_wait", resource="custom://held", timeout_seconds=40
                        )
                    )

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait_on)
                    await anyio.sleep(0.3)
                    pg_cluster.restart()  # the listener's connection dies and comes back
                    await anyio.sleep(0.5)
                    with anyio.fail_after(30):
                        while True:
                            reply = await call(
                                client, "agenthold_release", resource="custom://held",
                                agent_id=agent,
                            )  # fmt: skip
                            if reply["status"] != "unavailable":
                                break
                            await anyio.sleep(0.2)
                assert reply["status"] == "released", reply
                assert woken and woken[0]["status"] in ("available", "unavailable"), woken
                if woken[0]["status"] == "unavailable":  # the wait hit the outage: it said so
                    assert woken[0]["hint"]
                now = await call(
                    other, "agenthold_claim", resource="custom://held", agent_id=waiter
                )
                assert now["status"] == "claimed"


# -- connections ended by an administrator ---------------------------------------------------


def test_sessions_ended_at_random_while_writes_run_lose_nothing_acknowledged(pg_url: str) -> None:
    """Threads write counters with the OCC loop while an administrator ends every agenthold
    session again and again (pg_terminate_backend). Each call either succeeds, conflicts, or
    says ``unavailable`` with a hint; every acknowledged version is in the history exactly
    once, each key's versions run 1, 2, 3... unbroken, and the live value is the last one."""
    stop = threading.Event()
    acknowledged: dict[str, list[int]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    with StateStore(pg_url, busy_timeout=2) as store:
        for k in range(4):
            store.set("faults", f"k{k}", 0, updated_by="init")

        def writer(n: int) -> None:
            rng = random.Random(n)
            key = f"k{n % 4}"
            while not stop.is_set():
                try:
                    version = store.get("faults", key).version
                    result = store.set(
                        "faults", key, {"by": n}, updated_by=f"w{n}", expected_version=version
                    )
                except UnavailableError as exc:  # BusyError included
                    if not exc.hint:
                        errors.append(f"no hint: {exc}")
                    elif "may or may not" in str(exc):
                        errors.append("ambiguous")  # counted: the commit itself was cut off
                    continue
                except Exception as exc:  # ConflictError is the OCC loop's business
                    if type(exc).__name__ != "ConflictError":
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with lock:
                    acknowledged.setdefault(key, []).append(result.version)
                time.sleep(rng.random() * 0.002)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        killed = 0
        try:
            with psycopg.connect(pg_url, autocommit=True) as admin:
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    time.sleep(random.uniform(0.02, 0.1))
                    killed += len(
                        admin.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE pid <> pg_backend_pid() AND datname = current_database() "
                            "AND backend_type = 'client backend'"
                        ).fetchall()
                    )
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert killed > 10
        unexpected = [e for e in errors if e != "ambiguous"]
        assert not unexpected, unexpected[:5]
        total = 0
        for key, versions in acknowledged.items():
            history = [h.version for h in store.history("faults", key, limit=100_000)]
            assert sorted(history) == list(range(1, len(history) + 1)), f"{key}: versions broken"
            assert set(versions) <= set(history), f"{key}: an acknowledged write is gone"
            assert len(versions) == len(set(versions)), f"{key}: a version given twice"
            assert store.get("faults", key).version == max(history)
            total += len(versions)
        assert total > 20, "too few writes got through to prove anything"


def test_a_lock_held_past_busy_timeout_is_busy_through_a_server(
    pg_url: str, tmp_path: Path
) -> None:
    """Another session holds the claims lock longer than the server's busy timeout: the claim
    is answered ``unavailable`` (busy, with a hint) within the timeout, nothing is written, and
    it succeeds once the lock is let go."""

    async def run(admin: psycopg.Connection[Any]) -> None:
        async with connect(server.url) as client:
            agent = (await call(client, "agenthold_register", name="a"))["agent_id"]
            from agenthold.db.postgres import lock_key

            admin.execute("BEGIN")
            admin.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("claims"),))
            started = time.monotonic()
            reply = await call(client, "agenthold_claim", resource="custom://x", agent_id=agent)
            assert reply["status"] == "unavailable" and reply["hint"], reply
            assert "busy_timeout" in reply["message"]
            assert time.monotonic() - started < 10
            admin.execute("ROLLBACK")
            reply = await call(client, "agenthold_status", resource="custom://x")
            assert reply["status"] == "available", reply
            reply = await call(client, "agenthold_claim", resource="custom://x", agent_id=agent)
            assert reply["status"] == "claimed", reply

    with (
        servers(pg_url, tmp_path, 1, "--busy-timeout", "0.5") as (server,),
        psycopg.connect(pg_url, autocommit=True) as admin,
    ):
        anyio.run(run, admin)


# -- clear errors at start -------------------------------------------------------------------


@pytest.fixture
def password_role(pg_cluster: Cluster) -> tuple[str, str]:
    """A role that must log in with a password (scram-sha-256 on the Unix socket), and its
    password; the cluster's other roles keep trust authentication."""
    hba = pg_cluster.data / "pg_hba.conf"
    rule = "local all pw_user scram-sha-256\n"
    with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
        if rule not in hba.read_text():
            admin.execute("DROP ROLE IF EXISTS pw_user")
            admin.execute("CREATE ROLE pw_user LOGIN PASSWORD 'right-pw'")
            hba.write_text(rule + hba.read_text())
            admin.execute("SELECT pg_reload_conf()")
            time.sleep(0.2)
    return "pw_user", "right-pw"


def agenthold_once(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "agenthold", "--db", url, *args],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize("case", ["wrong password", "missing database", "server down"])
def test_a_server_that_cannot_connect_at_start_says_why_in_one_line(
    case: str, pg_cluster: Cluster, password_role: tuple[str, str], tmp_path: Path
) -> None:
    user, password = password_role
    host = quote(pg_cluster.socket_dir, safe="")
    url, why = {
        "wrong password": (
            f"postgresql://{user}:wrong-pw@/postgres?host={host}",
            "password authentication failed",
        ),
        "missing database": (
            f"postgresql://{user}:{password}@/no_such_db?host={host}",
            'database "no_such_db" does not exist',
        ),
        "server down": (
            f"postgresql://{user}:{password}@/postgres?host={quote(str(tmp_path), safe='')}",
            "No such file or directory",
        ),
    }[case]
    with pytest.raises(UnavailableError, match="cannot connect to PostgreSQL") as caught:
        StateStore(url)
    assert why in str(caught.value) and "\n" not in str(caught.value)
    started = time.monotonic()
    done = agenthold_once(url, "--transport", "http", "--port", str(free_port()))
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and lines[0].startswith("agenthold: "), lines
    assert "wrong-pw" not in done.stderr and "right-pw" not in done.stderr
    assert time.monotonic() - started < 30


def own_schema(pg_cluster: Cluster, user: str) -> str:
    """A new schema that ``user`` owns, for its tables."""
    with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
        schema = f"pw_{os.getpid()}_{random.randrange(10**9)}"
        admin.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {user}")
    return schema


def no_password_url(pg_cluster: Cluster, user: str) -> str:
    """A URL for ``user`` without a password: libpq must find it elsewhere."""
    host = quote(pg_cluster.socket_dir, safe="")
    schema = own_schema(pg_cluster, user)
    return f"postgresql://{user}@/postgres?host={host}&options=-csearch_path%3D{schema}"


def inspector(url: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``agenthold claims`` (an inspector command) on ``url`` in its own process, with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "agenthold", *args, "--db", url],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )  # fmt: skip


def test_the_password_comes_from_pgpassword(
    password_role: tuple[str, str],
    pg_cluster: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """libpq's PGPASSWORD is the password of a URL without one: in the library, and in a
    command's process; without it the role is refused, and a wrong one is never shown."""
    user, password = password_role
    url = no_password_url(pg_cluster, user)
    nowhere = str(tmp_path / "no-pgpass")
    monkeypatch.setenv("PGPASSFILE", nowhere)  # no ~/.pgpass of this machine's user helps
    monkeypatch.delenv("PGPASSWORD", raising=False)
    with pytest.raises(UnavailableError, match="password"):
        StateStore(url)
    monkeypatch.setenv("PGPASSWORD", password)
    with StateStore(url) as store:
        assert store.set("ns", "k", 1, updated_by="w").version == 1
    done = inspector(url, {"PGPASSWORD": password, "PGPASSFILE": nowhere}, "claims", "--json")
    assert done.returncode == 0, done.stderr
    wrong = inspector(url, {"PGPASSWORD": "wr0ng-env-pw", "PGPASSFILE": nowhere}, "claims")
    assert wrong.returncode == 1 and "password authentication failed" in wrong.stderr
    assert "wr0ng-env-pw" not in wrong.stderr + wrong.stdout
    assert len(wrong.stderr.strip().splitlines()) == 1


def test_the_password_comes_from_a_pgpass_file(
    password_role: tuple[str, str],
    pg_cluster: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A password file named by PGPASSFILE (libpq's ~/.pgpass, elsewhere) is read when it is
    private (mode 0600), and ignored, as libpq ignores it, when others may read it."""
    user, password = password_role
    url = no_password_url(pg_cluster, user)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"*:*:*:{user}:{password}\n")
    pgpass.chmod(0o644)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    with pytest.raises(UnavailableError, match="password"):
        StateStore(url)  # a file that others can read is not trusted
    pgpass.chmod(0o600)
    with StateStore(url) as store:
        assert store.set("ns", "k", 1, updated_by="w").version == 1
    done = inspector(url, {"PGPASSFILE": str(pgpass)}, "claims", "--json")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("form", ["userinfo", "parameter"])
async def test_a_password_in_the_url_is_in_no_output_of_a_server_or_the_inspector(
    form: str, password_role: tuple[str, str], pg_cluster: Cluster, tmp_path: Path
) -> None:
    """With the password in the URL (``user:password@`` or ``?password=``): a server's log
    (debug level, from start to stop, a call and a claim between), its ``unavailable`` answer
    while the role may not connect, and the inspector's output, tables and JSON, never show
    it."""
    user, password = password_role
    host = quote(pg_cluster.socket_dir, safe="")
    schema = own_schema(pg_cluster, user)
    url = f"postgresql://{user}@/postgres?host={host}&options=-csearch_path%3D{schema}"
    if form == "userinfo":
        url = url.replace(f"{user}@", f"{user}:{password}@")
    else:
        url += f"&password={password}"
    with servers(url, tmp_path, 1, "--log-level", "debug") as (server,):
        async with connect(server.url) as client:
            agent = (await call(client, "agenthold_register", name="alice"))["agent_id"]
            claimed = await call(client, "agenthold_claim", resource="custom://x", agent_id=agent)
            assert claimed["status"] == "claimed"
            status = await call(client, "agenthold_status", resource="custom://x")
            assert password not in repr(status)
            with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
                admin.execute(f"ALTER ROLE {user} CONNECTION LIMIT 0")
                try:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                        (user,),
                    )
                    down = await call(client, "agenthold_status", resource="custom://x")
                finally:
                    admin.execute(f"ALTER ROLE {user} CONNECTION LIMIT -1")
            assert down["status"] == "unavailable" and "unreachable" in repr(down), down
            assert password not in repr(down)
        server.proc.terminate()
        server.proc.wait(30)
        server.kill()
    logged = "".join(server.lines)
    assert "serving" in logged and password not in logged
    shown = ""
    for args in (["claims"], ["claims", "--json"], ["agents"], ["log"], ["log", "--json"]):
        done = inspector(url, {}, *args)
        assert done.returncode == 0, (args, done.stderr)
        shown += done.stdout + done.stderr
    assert "custom://x" in shown and "alice" in shown
    assert password not in shown


def test_the_right_password_connects(password_role: tuple[str, str], pg_cluster: Cluster) -> None:
    user, password = password_role
    host = quote(pg_cluster.socket_dir, safe="")
    with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
        schema = f"pw_{os.getpid()}_{random.randrange(10**9)}"
        admin.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {user}")
    url = f"postgresql://{user}:{password}@/postgres?host={host}&options=-csearch_path%3D{schema}"
    with StateStore(url) as store:
        assert store.set("ns", "k", 1, updated_by="w").version == 1
        assert "right-pw" not in store.path and "right-pw" not in repr(store)
        with pytest.raises(UnavailableError, match="refused") as caught:
            store.db.fetchone("SELECT * FROM pg_authid")  # a superuser's table
        assert caught.value.hint and "Grant" in caught.value.hint
