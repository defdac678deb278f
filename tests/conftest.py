"""Shared fixtures: real state stores on real SQLite files or ":memory:", closed after each test;
a watchdog, so that a test that hangs ends the run with every thread's traceback instead of
hanging CI; and asyncio for every async test. Helpers that are not fixtures live in support.py."""

from __future__ import annotations

import faulthandler
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lanes import assign
from pgserver import SKIP_REASON, Cluster, find_bindir
from support import Coordinators, stop_warm_servers

from agenthold.claims import Coordinator
from agenthold.serve.warm import SERVED, UNOPENED
from agenthold.store import StateStore

HANG_SECONDS = 180.0  # far beyond any test's duration, even on a slow, busy machine


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    """Dump every thread's stack and exit if this test runs for HANG_SECONDS."""
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def no_warm_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test leaves a warm server behind unless it asks for one (``stdio_path``)."""
    monkeypatch.setenv("AGENTHOLD_NO_WARM", "1")
    monkeypatch.delenv("AGENTHOLD_WARM", raising=False)


@pytest.fixture(params=["cold", "warm"])
def stdio_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test twice: with stdio servers that serve their calls themselves ("cold"), and
    through warm servers ("warm"): AGENTHOLD_WARM=wait makes even the first call of each kind
    go through the warm server it leaves behind, and a warm run that left one (its log) must
    have had a call served by it. Each test has a runtime directory of its own (short: socket
    paths are limited to 107 bytes), and its warm servers are stopped after it.

    A third value, "forks", is what a user gets by default: the first call of each kind serves
    itself while the warm server it forked waits, and later calls (a second server on the same
    file, the next call of a per-call client) go through that warm server, which starts on the
    first of them. Its run must have forked one (a log). Most of what it adds over the other
    two is the hand-over between them, so only the tests of test_stdio.py that
    parametrize it (``EVERY_STDIO_PATH`` there: both protocol eras, every tool, errors, the
    per-call client, two servers on one file, the disconnect grace, signals and EOF) run it,
    not every user of this fixture: a third run of everything would add minutes to CI for what
    the cold and warm runs already check."""
    directory = tempfile.mkdtemp(prefix="ah-")
    monkeypatch.setenv("AGENTHOLD_RUNTIME_DIR", directory)
    if request.param in ("warm", "forks"):
        monkeypatch.delenv("AGENTHOLD_NO_WARM")
    if request.param == "warm":
        monkeypatch.setenv("AGENTHOLD_WARM", "wait")
    try:
        yield str(request.param)
    finally:
        # read before they stop: a warm server that exits removes its log (warm.tidy)
        logged = list(Path(directory).glob("*.log"))  # one per warm server forked
        logs = "".join(p.read_text(errors="replace") for p in logged)
        killed = stop_warm_servers(Path(directory))
        shutil.rmtree(directory, ignore_errors=True)
        assert not killed, f"warm servers {killed} did not stop on SIGTERM"
    # calls that forked a warm server must have gone through one, not quietly served cold
    # (unless its database could not be opened: then the call reports that itself)
    if request.param == "warm" and logged:
        assert SERVED in logs or UNOPENED in logs, f"no call went through a warm server: {logs}"
    if request.param == "forks":
        assert logged, "no call forked a warm server: the default path was not taken"


@pytest.fixture(autouse=True, scope="session")
def private_state_directory(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The per-user default database of every process the tests start is in a temporary
    directory, never the real user's (on Linux; tests of other platforms pass their own)."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    os.environ.pop("AGENTHOLD_DB", None)


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (marked anyio) run on asyncio, as agenthold's servers do."""
    return "asyncio"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where a test's database file lives (not created yet)."""
    return tmp_path / "state.db"


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL server for this test process (each xdist worker has its own),
    started on first use; tests that need it are skipped only when no server binaries exist."""
    bindir = find_bindir()
    if bindir is None:
        pytest.skip(SKIP_REASON)
    # started without the runtime directory of a stdio_path test that may be running (the
    # first to need the server starts it): that test's teardown ends every process that names
    # its directory, and would end the server with it
    runtime = os.environ.pop("AGENTHOLD_RUNTIME_DIR", None)
    try:
        cluster = Cluster(bindir)
    finally:
        if runtime is not None:
            os.environ["AGENTHOLD_RUNTIME_DIR"] = runtime
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> str:
    """The URL of a new, empty PostgreSQL database (a schema of its own) for this test."""
    return pg_cluster.fresh_url()


BACKENDS = ("sqlite", "postgresql")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "backends: a contract test, run on SQLite and on PostgreSQL")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks given here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test joins the lanes its fixtures and code put it in (lanes.py)."""
    assign(items)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked ``backends`` run once per backend; the others on SQLite alone."""
    if metafunc.definition.get_closest_marker("backends") and "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The backend of this test: "sqlite", or each of BACKENDS for a ``backends`` test."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a contract test's database lives: a new SQLite file, or a new PostgreSQL schema."""
    if backend == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "state.db")


@pytest.fixture
def store(db_url: str) -> Iterator[StateStore]:
    """A StateStore on a fresh database: the file db_path, or (``backends`` tests) also a new
    PostgreSQL schema."""
    with StateStore(db_url) as s:
        yield s


@pytest.fixture
def opened(db_url: str, root: Path) -> Iterator[Coordinators]:
    """Opens Coordinators on the test's database (``db_url``), each on a store of its own,
    whose workspace "default" is the test module's ``root``; every store is closed after."""
    coordinators = Coordinators(db_url, root)
    yield coordinators
    coordinators.close()


@pytest.fixture
def coord(opened: Coordinators) -> Coordinator:
    """A Coordinator on the test's database, without a claim TTL."""
    return opened()


@pytest.fixture
def memory_store() -> Iterator[StateStore]:
    """A StateStore on a private in-memory database."""
    with StateStore(":memory:") as s:
        yield s


@pytest.fixture
def no_child_coverage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes this test starts run without coverage measurement: for benchmark smoke runs
    and long soaks, whose code paths other tests cover, and which coverage would slow down."""
    monkeypatch.delenv("COVERAGE_PROCESS_CONFIG", raising=False)
    monkeypatch.delenv("COVERAGE_PROCESS_START", raising=False)
