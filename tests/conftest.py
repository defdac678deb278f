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
from support import stop_warm_servers

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
    go through the warm server it leaves behind. Each test has a runtime directory of its own
    (short: socket paths are limited to 107 bytes), and its warm servers are stopped after it."""
    directory = tempfile.mkdtemp(prefix="ah-")
    monkeypatch.setenv("AGENTHOLD_RUNTIME_DIR", directory)
    if request.param == "warm":
        monkeypatch.delenv("AGENTHOLD_NO_WARM")
        monkeypatch.setenv("AGENTHOLD_WARM", "wait")
    try:
        yield str(request.param)
    finally:
        killed = stop_warm_servers(Path(directory))
        shutil.rmtree(directory, ignore_errors=True)
        assert not killed, f"warm servers {killed} did not stop on SIGTERM"


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


@pytest.fixture
def store(db_path: Path) -> Iterator[StateStore]:
    """A StateStore on a fresh database file."""
    with StateStore(db_path) as s:
        yield s


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
