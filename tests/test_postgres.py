"""What only PostgreSQL needs proving: many writers on many connections and processes, the
server's clock, the event feed under transactions that commit late, LISTEN/NOTIFY wake-ups
across processes, connection failures, and secrets kept out of messages.

The contract tests of test_store.py, test_claims.py and test_server.py run on PostgreSQL too
(marked ``backends``); everything here runs on the throwaway server of tests/pgserver.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from pgserver import Cluster
from support import run_threads

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.claims.pending import clock
from agenthold.claims.schema import resource_topic
from agenthold.db.postgres import MAX_PAYLOAD, PostgresDatabase, lock_key, redact
from agenthold.store import (
    MAX_KEY_LENGTH,
    AgentholdError,
    BusyError,
    ConflictError,
    IncompatibleDatabaseError,
    InvalidInputError,
    StateStore,
    UnavailableError,
    Waiter,
    key_topic,
    wait_until,
)

STORE_WORKER = Path(__file__).parent / "helpers" / "store_worker.py"


@pytest.fixture
def pg(pg_url: str) -> Iterator[StateStore]:
    with StateStore(pg_url) as s:
        yield s


def coordinator(store: StateStore, root: Path, claim_ttl: float | None = None) -> Coordinator:
    return Coordinator(
        store, resolver=Resolver([Workspace("default", str(root))]), claim_ttl=claim_ttl
    )


def raw(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


# -- many writers ---------------------------------------------------------------------------


def test_no_update_is_lost_between_threads_on_separate_pools(pg_url: str) -> None:
    """Threads on two stores (two pools, as two hosts would be) increment one counter with the
    read-check-retry loop: every increment lands once and versions run 1, 2, 3... unbroken."""
    stores = [StateStore(pg_url), StateStore(pg_url)]
    try:
        stores[0].set("counters", "n", 0, updated_by="init")

        def add(i: int) -> int:
            store = stores[i % 2]
            conflicts = 0
            for _ in range(15):
                while True:
                    record = store.get("counters", "n")
                    try:
                        store.set(
                            "counters", "n", record.value + 1, updated_by=f"t{i}",
                            expected_version=record.version,
                        )  # fmt: skip
                        break
                    except ConflictError:
                        conflicts += 1
            return conflicts

        run_threads(8, add)
        record = stores[0].get("counters", "n")
        assert record.value == 8 * 15
        versions = [h.version for h in stores[1].history("counters", "n", limit=1000)]
        assert versions == list(range(8 * 15 + 1, 0, -1))
    finally:
        for s in stores:
            s.close()


def test_no_update_is_lost_between_processes(pg: StateStore, pg_url: str) -> None:
    pg.set("counters", "n", 0, updated_by="init")
    procs = [
        subprocess.Popen(
            [sys.executable, str(STORE_WORKER), "increment", pg_url, "20"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for p in procs:
        p.communicate(timeout=120)
        assert p.returncode == 0
    assert pg.get("counters", "n").value == 60
    assert len(pg.history("counters", "n", limit=1000)) == 61


def test_concurrent_first_writes_of_one_key_get_distinct_versions(pg: StateStore) -> None:
    """Unconditional writes of a key that does not exist yet race on the insert: none fails,
    none reuses a version."""
    versions = run_threads(10, lambda i: pg.set("ns", "new", i, updated_by=f"w{i}").version)
    assert sorted(versions) == list(range(1, 11))


def test_only_one_of_many_creators_wins_expected_version_zero(pg: StateStore) -> None:
    def create(i: int) -> str:
        try:
            pg.set("ns", "once", i, updated_by=f"w{i}", expected_version=0)
            return "won"
        except ConflictError as exc:
            assert exc.detail["actual_version"] == 1
            return "conflict"

    assert sorted(run_threads(8, create)) == ["conflict"] * 7 + ["won"]


def test_clear_namespace_and_writes_in_parallel_never_reuse_a_version(pg: StateStore) -> None:
    def work(i: int) -> None:
        for n in range(10):
            if i == 0:
                pg.clear_namespace("ns", deleted_by="clearer")
            else:
                pg.set("ns", f"k{n % 3}", n, updated_by=f"w{i}")

    run_threads(4, work)
    for key in ("k0", "k1", "k2"):
        versions = [h.version for h in pg.history("ns", key, limit=1000)]
        assert versions == list(range(len(versions), 0, -1))


def test_one_of_many_claimants_gets_the_resource(
    pg: StateStore, pg_url: str, tmp_path: Path
) -> None:
    coords = [coordinator(pg, tmp_path), coordinator(StateStore(pg_url), tmp_path)]
    try:
        agents = [coords[i % 2].register(f"a{i}").agent_id for i in range(6)]
        replies = run_threads(6, lambda i: coords[i % 2].claim("x.py", agents[i]).status)
        assert sorted(replies) == ["busy"] * 5 + ["claimed"]
        assert coords[1].status("x.py").version == 1
    finally:
        coords[1].store.close()


def test_a_lock_held_past_busy_timeout_is_busy_and_writes_nothing(pg_url: str) -> None:
    with StateStore(pg_url, busy_timeout=0.2) as store, raw(pg_url) as other:
        store.set("ns", "k", 1, updated_by="w")
        other.execute("BEGIN")
        other.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("state\x1fns\x1fk"),))
        started = time.monotonic()
        with pytest.raises(BusyError, match="busy_timeout"):
            store.set("ns", "k", 2, updated_by="w", expected_version=1)
        assert time.monotonic() - started < 5
        other.execute("ROLLBACK")
        assert store.get("ns", "k").version == 1
        assert store.set("ns", "k", 2, updated_by="w", expected_version=1).version == 2


# -- the database's clock ------------------------------------------------------------------


def test_leases_are_judged_by_the_servers_clock(
    pg: StateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose clock runs an hour ahead still sees a 60 s claim as held."""
    coord = coordinator(pg, tmp_path, claim_ttl=60)
    agent = coord.register("a").agent_id
    coord.claim("x.py", agent)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert coord.status("x.py").status == "claimed"
    assert [s.status for s in coord.status_many(["x.py", "y.py"])] == ["claimed", "available"]
    other = coord.register("b").agent_id
    assert coord.claim("x.py", other).status == "busy"
    from agenthold.inspect.commands import Inspector

    assert abs(Inspector(pg, as_json=True).now - real()) < 60  # its "ends in" and "ended"


SKEWS = (3600.0, -3600.0)  # a database server whose clock is an hour ahead of ours, or behind


@pytest.fixture(params=SKEWS, ids=["db-ahead", "db-behind"])
def skewed(request: pytest.FixtureRequest, pg_cluster: Cluster) -> Iterator[StateStore]:
    """A store on a database whose clock disagrees with this host's by an hour (see
    Cluster.skewed_url: the server's own clock_timestamp() is shifted, not our code)."""
    with StateStore(pg_cluster.skewed_url(request.param)) as s:
        yield s


def test_a_skewed_database_clock_is_what_the_library_reads(skewed: StateStore) -> None:
    """The setup is real: the library reads the shifted clock, and stamps history with it
    (the time a write took its locks), as it judges leases by it."""
    skew = skewed.db.now() - time.time()
    assert abs(abs(skew) - 3600) < 5
    skewed.set("ns", "k", 1, updated_by="w")
    stamp = datetime.fromisoformat(skewed.history("ns", "k")[0].updated_at).timestamp()
    assert abs(stamp - time.time() - skew) < 5
    assert abs(datetime.fromisoformat(skewed.get("ns", "k").updated_at).timestamp() - stamp) < 1


def test_a_wake_at_on_the_databases_clock_is_converted_not_compared_with_ours(
    skewed: StateStore,
) -> None:
    """A waiter asked to wake one second from now on the database's clock sleeps one second:
    not the whole timeout (clock ahead) nor a busy loop (clock behind)."""
    db = skewed.db
    with Waiter(db, 30.0, lambda: None) as waiter:
        in_a_second = db.now() + 1.0
        pause = waiter.pause(in_a_second)
        assert pause is not None and 0.8 < pause <= 1.01
        assert not waiter.due(in_a_second) and not waiter.due(None)
        assert waiter.due(db.now() - 0.01)
        assert waiter.pause(db.now() + 3600) == pytest.approx(30.0, abs=1.0)  # the timeout


def test_a_wait_sleeps_until_the_lease_end_on_the_databases_clock(
    skewed: StateStore, tmp_path: Path
) -> None:
    """A wait for a claim whose holder's 1 s lease runs out answers 'available' about a second
    later, having looked a handful of times (a clock behind ours once made it look every
    millisecond, one ahead made it sleep until the backstop poll)."""
    coord = coordinator(skewed, tmp_path, claim_ttl=1.0)
    holder = coord.register("holder").agent_id
    coord.claim("x.py", holder)
    looks: list[float] = []
    res = coord.target("x.py")

    def look() -> tuple[str | None, Any, float | None]:
        looks.append(time.monotonic())
        probe = coord.probe(res)
        return ("available" if probe.available else None), probe.topics, probe.lease_ends_at

    start = time.monotonic()
    assert wait_until(skewed.db, look, 10.0, {resource_topic(res.key)}) == "available"
    assert 0.9 < time.monotonic() - start < 3.0
    assert len(looks) <= 8, len(looks)
    result = coord.wait("x.py", 10.0)  # and the library's own wait agrees at once
    assert result.status == "available" and result.previous is not None
    assert result.previous.outcome == "expired"


def test_a_queued_wait_is_handed_the_claim_at_the_lease_end_on_the_databases_clock(
    skewed: StateStore, tmp_path: Path
) -> None:
    coord = coordinator(skewed, tmp_path, claim_ttl=1.0)
    holder, waiter = coord.register("holder").agent_id, coord.register("waiter").agent_id
    coord.claim("x.py", holder)
    start = time.monotonic()
    got = coord.wait("x.py", 10.0, agent_id=waiter, claim=True)
    assert got.status == "claimed" and got.previous is not None
    assert got.previous.outcome == "expired"
    assert 0.9 < time.monotonic() - start < 3.0


def test_lease_ends_noted_while_the_database_is_down_use_its_clock(skewed: StateStore) -> None:
    """The side file's time of leaving, when the database cannot be asked, is its clock as
    last read, not this host's."""
    skew = skewed.db.now() - time.time()
    skewed.db.close()
    assert abs(clock(skewed.db) - time.time() - skew) < 5


# -- the event feed ------------------------------------------------------------------------


def test_the_event_feed_never_skips_a_row_that_commits_late(pg: StateStore, pg_url: str) -> None:
    """A transaction takes an early history id and commits after a later one: the reader does
    not move past it before it commits, and then reads it once."""
    with pg.db.snapshot() as conn:
        _, position = pg.read_log(conn, None)
    late = raw(pg_url)
    late.execute("BEGIN")
    late.execute(
        "INSERT INTO state_history (namespace, key, version, value, updated_by, updated_at, "
        "event_type) VALUES ('ns', 'late', 1, '1', 'late', 'now', 'write')"
    )
    pg.set("ns", "early", 1, updated_by="early")  # a later id, committed first
    seen: list[str] = []
    with pg.db.snapshot() as conn:
        rows, position = pg.read_log(conn, None, after=position)
    seen += [r[2] for r in rows]
    late.execute("COMMIT")
    late.close()
    for _ in range(50):
        with pg.db.snapshot() as conn:
            rows, position = pg.read_log(conn, None, after=position)
        seen += [r[2] for r in rows]
        if len(seen) >= 2:
            break
        time.sleep(0.02)
    assert sorted(seen) == ["early", "late"]
    with pg.db.snapshot() as conn:
        rows, _ = pg.read_log(conn, None, after=position)
    assert rows == []  # nothing twice


# -- wake-ups across processes -------------------------------------------------------------


def set_from_another_process(url: str, key: str, delay: float = 0.2) -> subprocess.Popen[str]:
    script = (
        "import sys, time\n"
        "from agenthold.store import StateStore\n"
        f"time.sleep({delay})\n"
        f"s = StateStore({url!r})\n"
        f"s.set('ns', {key!r}, 'there', updated_by='other')\n"
        "s.close()\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], text=True)


def test_a_watch_is_woken_by_a_commit_of_another_process(pg: StateStore, pg_url: str) -> None:
    proc = set_from_another_process(pg_url, "w")
    started = time.monotonic()
    record = pg.watch("ns", "w", since_version=0, timeout=30)
    assert record is not None and record.value == "there"
    proc.wait(30)
    assert time.monotonic() - started < 20


def test_a_dropped_listener_reconnects_and_waiters_still_wake(pg: StateStore, pg_url: str) -> None:
    woken = threading.Event()
    with pg.db.subscribe([key_topic("ns", "d")], woken.set), raw(pg_url) as admin:
        for _ in range(100):
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
            ).fetchall()
            if killed:
                break
            time.sleep(0.02)
        assert killed, "no listening connection found"
        assert woken.wait(10), "a listener that reconnects wakes everyone to look again"
        woken.clear()
        proc = set_from_another_process(pg_url, "d", delay=0.5)
        assert woken.wait(20)
        proc.wait(30)
    assert pg.get("ns", "d").value == "there"


class HeldProxy:
    """A Unix socket of its own that passes connections through to the cluster's, except
    that a connection made while ``held`` is accepted and left unanswered (as an overloaded or
    distant server leaves it) until ``release``."""

    def __init__(self, cluster: Cluster) -> None:
        self.directory = tempfile.mkdtemp(prefix="ahp-")  # short: socket paths are limited
        name = next(Path(cluster.socket_dir).glob(".s.PGSQL.*")).name
        self.target = os.path.join(cluster.socket_dir, name)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(os.path.join(self.directory, name))
        self.listener.listen()
        self.open = threading.Event()
        self.open.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str, cluster: Cluster) -> str:
        return url.replace(quote(cluster.socket_dir, safe=""), quote(self.directory, safe=""))

    def hold(self) -> None:
        self.open.clear()

    def release(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.listener.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self.open.wait()
        server = socket.socket(socket.AF_UNIX)
        server.connect(self.target)
        back = threading.Thread(target=self._pipe, args=(server, client), daemon=True)
        back.start()
        self._pipe(client, server)
        back.join()
        client.close()
        server.close()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_subscribing_never_waits_for_the_listener_to_connect(
    pg_cluster: Cluster, pg_url: str
) -> None:
    """The first subscriber starts the listener, whose connect may take seconds (here a proxy
    leaves it unanswered): subscribing returns at once, since in a server it runs on the event
    loop. A commit of another process made before the listener's LISTEN is on still wakes the
    subscriber as soon as it is on (long before the BACKSTOP look)."""
    proxy = HeldProxy(pg_cluster)
    try:
        with StateStore(proxy.url(pg_url, pg_cluster)) as store, StateStore(pg_url) as other:
            woken = threading.Event()
            proxy.hold()
            started = time.monotonic()
            with store.db.subscribe([key_topic("ns", "held")], woken.set):
                assert time.monotonic() - started < 0.2, "subscribing waited for the connect"
                other.set("ns", "held", 1, updated_by="other")  # no one listens yet
                time.sleep(0.5)
                assert not woken.is_set()
                proxy.release()
                assert woken.wait(1.0), "the listener woke no one once it listened"
            assert store.get("ns", "held").value == 1
    finally:
        proxy.close()


def test_a_commit_of_many_topics_notifies_within_the_payload_limit(
    pg: StateStore, pg_url: str
) -> None:
    """A clear of hundreds of long keys would pass NOTIFY's 8,000 bytes: it wakes everyone."""
    for i in range(300):
        pg.set("big", f"{'x' * 40}{i}", i, updated_by="w")
    woken = threading.Event()
    with pg.db.subscribe([key_topic("unrelated", "k")], woken.set):
        script = (
            "from agenthold.store import StateStore\n"
            f"s = StateStore({pg_url!r})\n"
            "print(len(s.clear_namespace('big', deleted_by='c')))\n"
        )
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert done.stdout.strip() == "300", done.stderr
        assert woken.wait(10)
    assert MAX_PAYLOAD < 8000


# -- connections ---------------------------------------------------------------------------


def test_killed_pool_connections_are_replaced_without_an_error(pg: StateStore, pg_url: str) -> None:
    pg.set("ns", "k", 1, updated_by="w")
    with raw(pg_url) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = '' AND pid <> pg_backend_pid() AND datname = 'postgres'"
        )
    time.sleep(0.1)
    assert pg.get("ns", "k").value == 1
    assert pg.set("ns", "k", 2, updated_by="w", expected_version=1).version == 2


def test_a_server_restart_mid_run_loses_nothing_acknowledged(
    pg: StateStore, pg_cluster: Cluster
) -> None:
    acknowledged: list[int] = []
    failures: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                pg.set("restart", f"k{n}", n, updated_by="w")
                acknowledged.append(n)
            except UnavailableError as exc:
                assert exc.hint
                failures.append(str(exc))
                time.sleep(0.05)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.3)
        pg_cluster.restart()
        deadline = time.monotonic() + 20
        before = len(acknowledged)
        while len(acknowledged) < before + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)
    assert len(acknowledged) > before, "writes never worked again after the restart"
    live = {r.key for r in pg.list_keys("restart")}
    assert {f"k{n}" for n in acknowledged} <= live


def test_a_server_that_is_down_at_start_is_one_clear_error(tmp_path: Path) -> None:
    url = f"postgresql://postgres@/postgres?host={quote(str(tmp_path), safe='')}"
    with pytest.raises(UnavailableError, match="cannot connect to PostgreSQL") as caught:
        StateStore(url)
    assert "\n" not in str(caught.value)


def test_a_name_too_large_for_an_index_entry_is_invalid_input_not_an_outage(
    pg: StateStore,
) -> None:
    """A key within the length limits whose UTF-8 does not fit one index entry (PostgreSQL
    keeps about 2,700 bytes, after compression: random CJK text does not compress) is refused
    as the caller's to fix, not reported as a server that cannot be reached; nothing is
    written, and the store goes on."""
    chosen = random.Random(7)
    key = "".join(chr(chosen.randint(0x4E00, 0x9FFF)) for _ in range(MAX_KEY_LENGTH))
    with pytest.raises(InvalidInputError, match="too large for PostgreSQL") as caught:
        pg.set("ns", key, 1, updated_by="t")
    assert "unreachable" not in str(caught.value)
    assert "Nothing was written" in (caught.value.hint or "")
    assert not isinstance(caught.value, UnavailableError)
    assert pg.list_namespaces() == []
    assert pg.set("ns", key[:400], 1, updated_by="t").version == 1  # 1,200 bytes: it fits


def test_a_password_in_the_url_is_never_shown(pg_cluster: Cluster) -> None:
    """In the userinfo or as a ``password=`` parameter (in capitals, percent-encoded, or not
    decodable): not in the URL shown, the error at opening, or a command's one line."""
    host = quote(pg_cluster.socket_dir, safe="")
    forms = [
        f"postgresql://postgres:s3cret-pw@/no_such_db?host={host}",
        f"postgresql://postgres@/no_such_db?host={host}&password=s3cret-pw",
        f"postgresql://postgres@/no_such_db?PASSWORD=s3cret-pw&host={host}",  # libpq refuses it
        f"postgresql://postgres@/no_such_db?host={host}&pass%77ord=s3cret-pw",
        # libpq quotes a value it cannot decode, and the whole of a URL it cannot parse
        f"postgresql://postgres@/no_such_db?host={host}&password=s3cret-pw%zz",
        "postgresql://postgres:s3cret-pw@[::1/no_such_db",
    ]
    for url in forms:
        assert "s3cret-pw" not in redact(url) and "no_such_db" in redact(url)
        with pytest.raises(UnavailableError) as caught:
            StateStore(url)
        assert "s3cret-pw" not in str(caught.value) and "no_such_db" in str(caught.value)
    for url in forms[:2]:
        done = subprocess.run(
            [sys.executable, "-m", "agenthold", "claims", "--db", url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1
        assert "s3cret-pw" not in done.stderr + done.stdout and "no_such_db" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_a_password_in_the_url_is_in_no_error_or_log_line_while_serving(
    pg_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The database's name is the password here, so that the server's errors quote it, as
    libpq's could quote a password: once the database is gone, the ``unavailable`` error and
    the log lines of the pool and of the listener (which loses its connection and cannot
    listen again) show neither."""
    secret = f"s3cret_{os.getpid()}_{int(time.monotonic() * 1e6)}"
    url = f"{pg_cluster.url().replace('/postgres?', f'/{secret}?')}&password={secret}"
    caplog.set_level(logging.DEBUG)
    with raw(pg_cluster.url()) as admin:
        admin.execute(f"CREATE DATABASE {secret}")
        with StateStore(url, busy_timeout=0.5) as store:
            assert secret not in store.path
            with store.db.subscribe([key_topic("ns", "k")], lambda: None):
                assert wait_for(lambda: admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND query LIKE 'LISTEN%%'",
                    (secret,),
                ).fetchone()), "the listener never listened"  # fmt: skip
                admin.execute(f"DROP DATABASE {secret} WITH (FORCE)")
                with pytest.raises(UnavailableError, match="unreachable") as caught:
                    store.get("ns", "k")
                assert secret not in str(caught.value) and '"***" does not exist' in str(
                    caught.value
                )
                assert wait_for(lambda: "cannot listen" in caplog.text)
    assert "lost its connection" in caplog.text and '"***" does not exist' in caplog.text
    assert secret not in caplog.text


def wait_for(condition: Any, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_libpq_environment_variables_name_the_server(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pg_cluster.fresh_url().rpartition("%3D")[2]
    monkeypatch.setenv("PGHOST", pg_cluster.socket_dir)
    monkeypatch.setenv("PGUSER", "postgres")
    url = f"postgresql:///postgres?options=-csearch_path%3D{schema}"
    with StateStore(url) as store:
        assert store.set("ns", "k", 1, updated_by="w").version == 1
        assert store.path == url


# -- opening -------------------------------------------------------------------------------


def test_a_database_of_another_program_is_refused_and_left_untouched(pg_url: str) -> None:
    with raw(pg_url) as conn:
        conn.execute("CREATE TABLE invoices (id int)")
    with pytest.raises(IncompatibleDatabaseError, match="not an agenthold database"):
        StateStore(pg_url)
    with raw(pg_url) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    assert tables == [("invoices",)]


def test_newer_tables_are_refused(pg: StateStore, pg_url: str) -> None:
    with raw(pg_url) as conn:
        conn.execute("UPDATE agenthold_components SET version = 99 WHERE component = 'store'")
    with pytest.raises(IncompatibleDatabaseError, match="newer"):
        StateStore(pg_url)


def test_read_only_opening_writes_nothing_and_refuses_writes(pg: StateStore, pg_url: str) -> None:
    pg.set("ns", "k", 1, updated_by="w")
    with StateStore(pg_url, read_only=True) as reader:
        assert reader.get("ns", "k").value == 1
        with pytest.raises(UnavailableError, match="read-only"):
            reader.set("ns", "k", 2, updated_by="w")


def test_a_store_creates_only_its_tables_and_claims_add_theirs(pg_url: str, tmp_path: Path) -> None:
    def tables() -> list[str]:
        with raw(pg_url) as conn:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    with StateStore(pg_url) as store:
        assert tables() == ["agenthold_components", "state", "state_history"]
        coordinator(store, tmp_path)
        assert tables() == [
            "agenthold_components", "agents", "claim_events", "claim_patterns", "claim_shares",
            "claim_waiters", "claims", "state", "state_history",
        ]  # fmt: skip


def test_bad_arguments_are_invalid_input() -> None:
    with pytest.raises(InvalidInputError):
        PostgresDatabase("mysql://x")
    with pytest.raises(InvalidInputError, match="durability"):
        PostgresDatabase("postgresql://x", durability="fast")
    with pytest.raises(InvalidInputError, match="read_only"):
        PostgresDatabase("postgresql://x", read_only=1)  # type: ignore[arg-type]


def test_without_psycopg_a_postgresql_url_names_the_extra(tmp_path: Path) -> None:
    """Where psycopg is missing (and where store.py was copied alone), one clear error."""
    shutil.copy(Path(__file__).parents[1] / "agenthold" / "store.py", tmp_path / "store.py")
    script = (
        "import sys\n"
        "sys.modules['psycopg'] = None\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import store, agenthold.store as packaged\n"
        "for module in (store, packaged):\n"
        "    try:\n"
        "        module.StateStore('postgresql://u@h/db')\n"
        "    except module.InvalidInputError as e:\n"
        "        print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    # what to install that works today: psycopg from the registry, or the extra from a checkout
    # (the registry's agenthold 0.10 has no postgres extra)
    assert all('pip install "psycopg[binary,pool]>=3.3,<4"' in line for line in lines)
    assert all('pip install ".[postgres]"' in line for line in lines)
    assert not any("agenthold[postgres]" in line for line in lines)


# -- the inspector -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["agents", "claims", "namespaces", "keys", "history", "log"])
def test_every_inspector_subcommand_reads_postgresql(
    pg: StateStore, pg_url: str, tmp_path: Path, command: str
) -> None:
    pg.set("ns", "k", {"v": 1}, updated_by="w")
    coord = coordinator(pg, tmp_path)
    agent = coord.register("inspected").agent_id
    coord.claim("a.py", agent)
    args = {"keys": ["ns"], "history": ["ns", "k"]}.get(command, [])
    done = subprocess.run(
        [sys.executable, "-m", "agenthold", command, *args, "--json", "--db", pg_url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    expected = {"agents": "inspected", "claims": "a.py", "log": '"actor": "inspected"'}.get(
        command, '"updated_by": "w"'
    )
    assert json.loads(done.stdout) and expected in done.stdout


def test_log_follow_on_postgresql_prints_new_events(pg: StateStore, pg_url: str) -> None:
    """``log --follow`` prints each new event pushed by NOTIFY within half a second of its
    commit (its own recheck is once a second; a push takes milliseconds), and every read of
    its output is bounded, so a follower that hears nothing fails the test instead of hanging."""
    pg.set("ns", "before", 0, updated_by="w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthold", "log", "--follow", "--json", "--db", pg_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
    reader.start()
    try:
        # the last events come first, read after it subscribed: from now on it is listening
        assert json.loads(lines.get(timeout=30))["key"] == "before"
        latencies = []
        for n in range(3):
            committed = time.monotonic()
            pg.set("ns", f"followed-{n}", n, updated_by="w")
            line = lines.get(timeout=10)  # far beyond the bound below: a clear failure, no hang
            latencies.append(time.monotonic() - committed)
            assert json.loads(line)["key"] == f"followed-{n}"
        assert max(latencies) < 0.5, latencies
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0


def test_errors_of_the_database_are_agenthold_errors(pg: StateStore) -> None:
    with pytest.raises(AgentholdError, match="does not exist"):
        pg.db.fetchone("SELECT * FROM no_such_table")
    with pytest.raises(AgentholdError), pg.db.snapshot() as conn:
        conn.execute("SELECT * FROM no_such_table")


# -- fork ----------------------------------------------------------------------------------


def test_a_forked_child_uses_sessions_of_its_own_and_leaves_the_parents_alone(
    pg: StateStore, pg_url: str
) -> None:
    """A child forked with the store open (multiprocessing's default start method on Linux)
    writes and waits through it on new sessions; the parent's sessions still work after the
    child has written, closed its store and exited."""
    pg.set("fork", "k", "parent", updated_by="p")
    session = pg.db.fetchone("SELECT pg_backend_pid()")[0]  # the parent's pooled session
    woken = threading.Event()
    with pg.db.subscribe([key_topic("fork", "child")], woken.set):  # the parent's listener
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child (coverage does not follow os._exit)
            code = 1
            try:
                record = pg.get("fork", "k")
                result = pg.set("fork", "child", "hello", updated_by="c")
                watched = pg.watch("fork", "child", since_version=0, timeout=5)
                pg.close()
                ok = record.value == "parent" and result.version == 1 and watched is not None
                code = 0 if ok else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert woken.wait(10), "the parent's listener still hears commits"
    with raw(pg_url) as admin:
        alive = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (session,))
        assert alive.fetchone() == (1,), "the child ended a session of its parent"
    assert pg.get("fork", "child").value == "hello"
    assert pg.set("fork", "k", "again", updated_by="p", expected_version=1).version == 2


def test_every_test_the_guarantees_doc_names_for_postgresql_exists() -> None:
    """The PostgreSQL column of docs/guarantees.md names real tests."""
    import re

    repo = Path(__file__).resolve().parents[1]
    doc = (repo / "docs" / "guarantees.md").read_text(encoding="utf-8")
    section = doc.split("## On PostgreSQL", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(test_\w+)`", section))
    assert len(named) > 15
    defined = {
        name
        for path in (repo / "tests").glob("test_*.py")
        for name in re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M)
    }
    assert named <= defined, named - defined


def test_connections_turn_gssapi_encryption_off_unless_the_url_or_environment_chooses(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq's Kerberos probe at connect is not safe across threads and forks: it is off by
    default, and a mode given in the URL or in PGGSSENCMODE is kept."""

    def mode(url: str) -> str:
        db = PostgresDatabase(url)
        try:
            with db._pool.connection() as conn:
                found = [o.val for o in conn.pgconn.info if o.keyword == b"gssencmode"]
                return b"".join(v or b"" for v in found).decode()
        finally:
            db.close()

    assert mode(pg_url) == "disable"
    assert mode(pg_url + "&gssencmode=prefer") == "prefer"
    monkeypatch.setenv("PGGSSENCMODE", "prefer")
    assert mode(pg_url) == "prefer"


def test_the_inspectors_message_ages_are_not_judged_by_a_skewed_database_clock(
    skewed: StateStore,
) -> None:
    """Messages and threads are stamped by the writing host's wall clock (docs/architecture.md,
    "Which clock measures what"), so the inspector shows their ages by this host's clock: a
    message just written is seconds old, not an hour, on a server whose clock is an hour off."""
    from agenthold.messages import MessageBus

    bus = MessageBus(skewed.db)
    thread = bus.create_thread(bus.create_agent("ann"), bus.create_agent("bob"))
    bus.append(thread.id, "ann", "hello")
    url = skewed.db.url  # type: ignore[attr-defined]
    for command in (["threads"], ["messages", thread.id]):
        done = subprocess.run(
            [sys.executable, "-m", "agenthold", *command, "--db", url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert "s ago" in done.stdout, done.stdout  # not "1h ago", nor " in 59m" (behind)
        assert "h ago" not in done.stdout and " in " not in done.stdout, done.stdout
