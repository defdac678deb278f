"""Tests for agenthold.claims.coordinator: agents, resource claims, leases and waiting.

Everything runs on real databases, real threads and real processes; nothing of ours is mocked:
the contract tests (marked ``backends``) on a SQLite file and on PostgreSQL, the rest on SQLite.
Other processes are tests/helpers/claims_worker.py, a Coordinator on the test's database file that
obeys JSON commands on stdin, started with the running interpreter. Time-based checks use leases
and timeouts of tenths of a second and generous bounds, because the machine that runs them may be
busy: they prove "woken, not timed out" or "expired, not kept", never a speed. Latencies of
cross-process wake-ups are printed (run with -s to see them); bench/perf/claims_bench.py measures
them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support import (
    REPO,
    Coordinators,
    LineProcess,
    WireCoordinator,
    child_env,
    coordinator_at,
    run_threads,
)

from agenthold.claims import (
    OUTCOMES,
    Agent,
    ClaimInfo,
    Coordinator,
    NotHolderError,
    UnknownAgentError,
)
from agenthold.claims import coordinator as claims
from agenthold.claims.names import Resolver, Workspace
from agenthold.serve import claim_tools
from agenthold.store import InvalidInputError, StateStore

HELPER = Path(__file__).parent / "helpers" / "claims_worker.py"
BENCH = REPO / "bench" / "perf" / "claims_bench.py"

RES = "src/a.py"
URI = "file://default/src/a.py"
AGENT_ID = re.compile(r"agent-[0-9a-f]{8,}")
PREVIOUS_FIELDS = {"previous_outcome", "previous_holder", "previous_outcome_at", "hint"}


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The root of the "default" workspace."""
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def db_file(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> Any:
    """The test's database: a file, or (``backends`` tests on PostgreSQL) a new schema's URL."""
    if backend == "postgresql":
        return request.getfixturevalue("pg_url")
    return tmp_path / "claims.db"


@pytest.fixture
def open_coordinator(db_file: Path, root: Path) -> Iterator[Coordinators]:
    """Open a Coordinator on the test's database file, each on its own StateStore (as another
    server process would), with the given claim TTL, answering with tool replies. Every store
    is closed at the end."""
    coordinators = Coordinators(db_file, root, replies=True)
    yield coordinators
    coordinators.close()


@pytest.fixture
def coord(open_coordinator: Callable[..., Coordinator]) -> Coordinator:
    """A Coordinator without a claim TTL."""
    return open_coordinator()


def register(coord: Coordinator, name: str = "agent", model: str = "") -> str:
    agent_id: str = coord.register(name, model)["agent_id"]
    return agent_id


def event_count(coord: Coordinator) -> int:
    count: int = coord.db.fetchone("SELECT count(*) FROM claim_events")[0]
    return count


def events(coord: Coordinator, uri: str) -> list[tuple[Any, ...]]:
    """(event, agent_id, outcome, version) of every event about ``uri``, in commit order."""
    return coord.db.fetchall(
        "SELECT event, agent_id, outcome, version FROM claim_events WHERE uri = ? ORDER BY id",
        (uri,),
    )


def unix(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


class Worker(LineProcess):
    """A claims_worker.py process: a Coordinator on the same file in another process."""

    def __init__(self, db: Path, root: Path, claim_ttl: float | None) -> None:
        args = [sys.executable, str(HELPER), str(db), str(root)]
        if claim_ttl is not None:
            args.append(str(claim_ttl))
        super().__init__(args, stdin=subprocess.PIPE, cwd=REPO, env=child_env())

    def ready(self) -> Worker:
        assert self.next_line() == "ready"
        return self

    def send(self, **command: Any) -> None:
        self.write_line(json.dumps(command))

    def reply(self, timeout: float = 30.0) -> dict[str, Any]:
        reply: dict[str, Any] = json.loads(self.next_line(timeout))
        return reply

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``Coordinator.method`` in the worker and return its result."""
        self.send(op="call", method=method, args=args, kwargs=kwargs)
        reply = self.reply()
        assert "error" not in reply, reply
        return reply["result"]

    def stop(self) -> None:
        """Close stdin so the worker ends normally (and writes its coverage data)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def spawn(db_file: Path, root: Path) -> Iterator[Callable[..., Worker]]:
    """Start claims_worker.py processes (call ``.ready()`` on each); all are stopped at the end."""
    started: list[Worker] = []

    def start(claim_ttl: float | None = None) -> Worker:
        worker = Worker(db_file, root, claim_ttl)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def assert_no_overlap(intervals: list[list[float]] | list[tuple[float, ...]]) -> None:
    """Holding intervals [start, end, claimed version, released version] never overlap, and
    the versions follow the holders in order with no gap and no reuse."""
    ordered = sorted(intervals, key=lambda i: i[0])
    for before, after in itertools.pairwise(ordered):
        assert before[1] <= after[0], f"two holders at once: {before} and {after}"
    versions = [v for interval in ordered for v in interval[2:]]
    assert versions == list(range(1, 2 * len(ordered) + 1))


# --------------------------------------------------------------------------------------------
# Claims live in their own tables
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_claims_are_not_state_store_records(coord: Coordinator) -> None:
    agent = register(coord)
    coord.claim(RES, agent)
    coord.release(RES, agent, "modified")
    assert coord.store.list_namespaces() == []


@pytest.mark.backends
def test_state_store_writes_to_any_namespace_or_key_cannot_forge_or_steal_a_claim(
    coord: Coordinator, root: Path
) -> None:
    owner, thief = register(coord, "owner"), register(coord, "thief")
    coord.claim(RES, owner)
    coord.claim("custom://lock", owner)
    coord.claim("src/b.py", thief)
    coord.release("src/b.py", thief, "deleted")
    key = coord.resolver.resolve(RES).key

    def snapshot() -> Any:
        return (
            [i.to_dict() for i in coord.list_claims(include_free=True)],
            [a.to_dict() for a in coord.list_agents()],
            event_count(coord),
        )

    before = snapshot()
    store = coord.store
    namespaces = ["claims", "agents", "claim_events", "state", "default", URI, key, owner, thief]
    keys = [RES, URI, key, "custom://lock", owner, thief, "holder", "'; DROP TABLE claims; --"]
    forged = {"holder": thief, "held_by": thief, "version": 99, "status": "claimed"}
    for ns in namespaces:
        for k in keys:
            store.set(ns, k, forged, updated_by=thief)
            store.set(ns, k, forged, updated_by=owner, expected_version=1)
        store.delete(ns, keys[0], deleted_by=thief)
        store.clear_namespace(ns, deleted_by=thief)

    assert snapshot() == before
    assert coord.status(RES)["held_by"] == owner
    assert coord.claim(RES, thief)["status"] == "busy"
    with pytest.raises(NotHolderError):
        coord.release("custom://lock", thief)
    assert coord.release(RES, owner)["version"] == 2


# --------------------------------------------------------------------------------------------
# register
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_register_returns_an_unguessable_agent_id_and_the_registration_time(
    coord: Coordinator,
) -> None:
    before = time.time()
    reply = coord.register("editor-agent", "claude-sonnet-4-6", "edits the docs")
    assert reply["status"] == "registered"
    assert AGENT_ID.fullmatch(reply["agent_id"])
    assert reply["name"] == "editor-agent"
    assert reply["model"] == "claude-sonnet-4-6"
    assert before - 0.01 <= unix(reply["registered_at"]) <= time.time() + 0.01
    agent = coord.agent(reply["agent_id"])
    assert (agent.name, agent.model, agent.purpose) == (
        "editor-agent",
        "claude-sonnet-4-6",
        "edits the docs",
    )
    assert agent.registered_at == reply["registered_at"]


@pytest.mark.backends
def test_two_registrations_never_share_an_agent_id_even_with_one_name(coord: Coordinator) -> None:
    ids = {register(coord, "same-name") for _ in range(50)}
    assert len(ids) == 50
    assert all(AGENT_ID.fullmatch(i) for i in ids)


@pytest.mark.backends
def test_register_allows_an_empty_model_and_purpose(coord: Coordinator) -> None:
    reply = coord.register("bare")
    assert "model" not in reply
    agent = coord.agent(reply["agent_id"])
    assert (agent.model, agent.purpose) == ("", "")


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("name", "", "empty"),
        ("name", "   ", "blank"),
        ("name", "x" * (claims.MAX_AGENT_NAME + 1), "limit"),
        ("name", "two\nlines", "control"),
        ("name", "nul\x00", "control"),
        ("name", 42, "string"),
        ("name", None, "string"),
        ("model", "  ", "blank"),
        ("model", "m" * (claims.MAX_MODEL + 1), "limit"),
        ("model", "tab\there", "control"),
        ("model", 4, "string"),
        ("model", 0, "string"),
        ("model", [], "string"),
        ("purpose", "p" * (claims.MAX_PURPOSE + 1), "limit"),
        ("purpose", "bell\x07", "control"),
        ("purpose", False, "string"),
    ],
)
def test_register_rejects_a_bad_name_model_or_purpose(
    coord: Coordinator, field: str, value: object, problem: str
) -> None:
    args: dict[str, Any] = {"name": "ok", "model": "", "purpose": ""}
    args[field] = value
    with pytest.raises(InvalidInputError, match=f"{field}.*{problem}"):
        coord.register(**args)
    assert coord.list_agents() == []


# --------------------------------------------------------------------------------------------
# claim
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_first_claim_of_a_resource_is_claimed_at_version_1(coord: Coordinator) -> None:
    agent = register(coord)
    assert coord.claim(RES, agent) == {"status": "claimed", "resource": URI, "version": 1}


@pytest.mark.backends
def test_claiming_a_held_resource_again_is_already_claimed_and_changes_nothing(
    coord: Coordinator,
) -> None:
    agent = register(coord)
    coord.claim(RES, agent)
    count = event_count(coord)
    assert coord.claim(RES, agent) == {"status": "already_claimed", "resource": URI, "version": 1}
    assert coord.claim("./src/a.py", agent)["status"] == "already_claimed"
    assert event_count(coord) == count


@pytest.mark.backends
def test_claim_of_a_resource_another_agent_holds_is_busy_naming_the_holder(
    coord: Coordinator,
) -> None:
    holder, other = register(coord, "editor"), register(coord, "reviewer")
    coord.claim(RES, holder)
    claimed_at = coord.status(RES)["claimed_at"]
    reply = coord.claim(RES, other)
    assert reply == {
        "status": "busy",
        "resource": URI,
        "held_by": holder,
        "agent_name": "editor",
        "claimed_at": claimed_at,
        "hint": claim_tools.BUSY_HINT,
    }
    assert "agenthold_wait" in reply["hint"]
    assert coord.status(RES)["version"] == 1


@pytest.mark.backends
def test_already_claimed_is_a_heartbeat_that_renews_the_lease(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord = open_coordinator(claim_ttl=0.6)
    agent = register(coord)
    coord.claim(RES, agent)
    first_end = unix(coord.status(RES)["lease_ends_at"])
    time.sleep(0.3)
    assert coord.claim(RES, agent)["status"] == "already_claimed"
    renewed_end = unix(coord.status(RES)["lease_ends_at"])
    assert renewed_end >= first_end + 0.25
    sleep_until(first_end + 0.05)
    assert coord.status(RES)["status"] == "claimed"  # past the first end, kept by the heartbeat


def test_every_call_naming_the_agent_pushes_its_lease_and_looks_do_not(
    open_coordinator: Callable[..., Coordinator], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "RENEW_EVERY", 0.0)  # write every renewal, however small
    coord = open_coordinator(claim_ttl=60)
    before = time.time()
    agent = register(coord)
    ends = [coord.agent(agent).lease_ends_at]
    for call in (
        lambda: coord.claim(RES, agent),
        lambda: coord.claim(RES, agent),  # already_claimed
        lambda: coord.release("src/other.py", agent),  # not_found, still a call by the agent
        lambda: coord.release(RES, agent),
    ):
        time.sleep(0.01)
        call()
        ends.append(coord.agent(agent).lease_ends_at)
    for look in (
        lambda: coord.status(RES),
        lambda: coord.wait(RES, 0),
        lambda: coord.list_claims(include_free=True),
    ):
        time.sleep(0.01)
        look()
        assert coord.agent(agent).lease_ends_at == ends[-1]
    assert all(end is not None for end in ends)
    assert ends == sorted(set(ends))  # each call moved the end later
    assert before + 60 <= ends[0] and ends[-1] <= time.time() + 60


# --------------------------------------------------------------------------------------------
# release
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_release_frees_the_resource_at_the_next_version(coord: Coordinator) -> None:
    agent = register(coord)
    coord.claim(RES, agent)
    assert coord.release(RES, agent) == {
        "status": "released",
        "resource": URI,
        "version": 2,
        "outcome": "released",
    }
    assert coord.status(RES) == {"status": "available", "resource": URI}
    assert coord.claim(RES, register(coord)) == {
        "status": "claimed",
        "resource": URI,
        "version": 3,
    }


@pytest.mark.backends
@pytest.mark.parametrize("outcome", [o for o in OUTCOMES if o != "released"])
def test_release_outcome_is_told_to_status_wait_and_the_next_claimant(
    coord: Coordinator, outcome: str
) -> None:
    holder, next_agent = register(coord, "holder"), register(coord, "next")
    coord.claim(RES, holder)
    moved_to = "src/b.py" if outcome == "moved" else None
    before = time.time()
    reply = coord.release(RES, holder, outcome, moved_to)
    assert reply["outcome"] == outcome
    expected = {
        "previous_outcome": outcome,
        "previous_holder": holder,
    }
    if outcome == "moved":
        assert reply["moved_to"] == "file://default/src/b.py"
        expected["moved_to"] = "file://default/src/b.py"
    for seen in (coord.status(RES), coord.wait(RES, 1), coord.claim(RES, next_agent)):
        assert seen.items() >= expected.items()
        assert before - 0.01 <= unix(seen["previous_outcome_at"]) <= time.time()
        assert seen["hint"] == claim_tools.HINTS[outcome].format(moved_to=expected.get("moved_to"))
    assert coord.status(RES)["status"] == "claimed"


@pytest.mark.backends
def test_a_plain_release_leaves_no_previous_outcome(coord: Coordinator) -> None:
    holder = register(coord)
    coord.claim(RES, holder)
    coord.release(RES, holder, "released")
    for seen in (coord.status(RES), coord.wait(RES, 1), coord.claim(RES, register(coord))):
        assert not PREVIOUS_FIELDS & seen.keys()
        assert "moved_to" not in seen


@pytest.mark.backends
def test_release_by_an_agent_that_does_not_hold_the_claim_names_the_holder(
    coord: Coordinator,
) -> None:
    holder, other = register(coord, "editor"), register(coord, "intruder")
    coord.claim(RES, holder)
    count = event_count(coord)
    with pytest.raises(NotHolderError, match=f"held by {holder} \\(editor\\)") as caught:
        coord.release(RES, other, "deleted")
    assert isinstance(caught.value, InvalidInputError)
    assert caught.value.held_by == holder
    # the library's hint names its method; over MCP the standard tools name agenthold_status
    assert "Coordinator.status" in caught.value.hint
    assert event_count(coord) == count
    assert coord.status(RES)["held_by"] == holder


@pytest.mark.backends
def test_release_of_a_free_resource_is_already_free(coord: Coordinator) -> None:
    holder = register(coord)
    coord.claim(RES, holder)
    coord.release(RES, holder)
    count = event_count(coord)
    reply = coord.release(RES, holder)
    assert reply["status"] == "already_free"
    assert reply["version"] == 2
    assert "not claimed" in reply["hint"]
    assert event_count(coord) == count


@pytest.mark.backends
def test_release_of_a_never_claimed_resource_is_not_found(coord: Coordinator) -> None:
    reply = coord.release(RES, register(coord))
    assert reply["status"] == "not_found"
    assert reply["resource"] == URI
    assert reply["hint"]


@pytest.mark.parametrize(
    ("outcome", "moved_to", "message"),
    [
        ("bogus", None, "outcome must be one of"),
        ("expired", None, "outcome must be one of"),
        ("abandoned", None, "outcome must be one of"),
        ("", None, "outcome must be one of"),
        (None, None, "outcome must be one of"),
        ("moved", None, "needs moved_to"),
        ("moved", "", "needs moved_to"),
        ("moved", "./src//a.py", "is the released resource itself"),
        ("moved", "../escape.py", "dot segments"),
        ("modified", "src/b.py", "only for outcome 'moved'"),
        ("released", "src/b.py", "only for outcome 'moved'"),
    ],
)
def test_release_rejects_a_bad_outcome_or_moved_to(
    coord: Coordinator, outcome: Any, moved_to: Any, message: str
) -> None:
    holder = register(coord)
    coord.claim(RES, holder)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        coord.release(RES, holder, outcome, moved_to)
    assert coord.status(RES)["held_by"] == holder


@pytest.mark.backends
def test_an_empty_moved_to_is_tolerated_as_absent(coord: Coordinator) -> None:
    holder = register(coord)
    coord.claim(RES, holder)
    reply = coord.release(RES, holder, "modified", "")
    assert reply == {"status": "released", "resource": URI, "version": 2, "outcome": "modified"}
    assert "moved_to" not in coord.status(RES)


@pytest.mark.backends
def test_rename_recipe_tells_the_next_claimant_where_the_source_went(coord: Coordinator) -> None:
    mover, later = register(coord, "mover"), register(coord, "later")
    assert coord.claim("src/old.py", mover)["status"] == "claimed"
    assert coord.claim("src/new.py", mover)["status"] == "claimed"
    moved = coord.release("src/old.py", mover, outcome="moved", moved_to="src/new.py")
    assert moved["moved_to"] == "file://default/src/new.py"
    assert coord.release("src/new.py", mover, outcome="created")["outcome"] == "created"

    source = coord.claim("src/old.py", later)
    assert source["status"] == "claimed"
    assert source["previous_outcome"] == "moved"
    assert source["previous_holder"] == mover
    assert source["moved_to"] == "file://default/src/new.py"
    assert "file://default/src/new.py" in source["hint"]
    destination = coord.claim("src/new.py", later)
    assert destination["previous_outcome"] == "created"
    assert "moved_to" not in destination


# --------------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_status_of_a_never_claimed_resource_is_available(coord: Coordinator) -> None:
    assert coord.status("./src/a.py") == {"status": "available", "resource": URI}


@pytest.mark.backends
def test_status_of_a_claimed_resource_names_holder_model_time_and_version(
    coord: Coordinator,
) -> None:
    holder = register(coord, "editor-agent", "claude-sonnet-4-6")
    earlier = register(coord, "earlier")
    coord.claim(RES, earlier)
    coord.release(RES, earlier)
    before = time.time()
    coord.claim(RES, holder)
    reply = coord.status(RES)
    assert before - 0.01 <= unix(reply.pop("claimed_at")) <= time.time()
    assert reply == {
        "status": "claimed",
        "resource": URI,
        "held_by": holder,
        "agent_name": "editor-agent",
        "agent_model": "claude-sonnet-4-6",
        "version": 3,
        "mode": "exclusive",
    }  # no lease_ends_at: without a claim TTL the lease has no end


@pytest.mark.backends
def test_status_under_a_claim_ttl_shows_when_the_lease_ends(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord = open_coordinator(claim_ttl=30)
    holder = register(coord)
    before = time.time()
    coord.claim(RES, holder)
    ends = unix(coord.status(RES)["lease_ends_at"])
    assert before + 29 <= ends <= time.time() + 30.01


# --------------------------------------------------------------------------------------------
# wait
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_wait_on_a_never_claimed_resource_is_available_at_once(coord: Coordinator) -> None:
    started = time.monotonic()
    reply = coord.wait(RES, 5)
    assert time.monotonic() - started < 1
    assert reply["status"] == "available"
    assert reply["resource"] == URI
    assert reply["elapsed_seconds"] < 1


@pytest.mark.backends
def test_wait_times_out_naming_the_holder(coord: Coordinator) -> None:
    holder = register(coord, "slow-editor")
    coord.claim(RES, holder)
    started = time.monotonic()
    reply = coord.wait(RES, 0.2)
    assert time.monotonic() - started >= 0.2
    assert reply == {
        "status": "timeout",
        "resource": URI,
        "held_by": holder,
        "agent_name": "slow-editor",
        "elapsed_seconds": reply["elapsed_seconds"],
        "hint": claim_tools.TIMEOUT_HINT,
    }
    assert 0.2 <= reply["elapsed_seconds"] < 2


@pytest.mark.backends
def test_wait_with_zero_timeout_reports_at_once(coord: Coordinator) -> None:
    holder = register(coord)
    coord.claim(RES, holder)
    assert coord.wait(RES, 0)["status"] == "timeout"


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf"), "5", True, None])
def test_wait_rejects_a_bad_timeout(coord: Coordinator, timeout: Any) -> None:
    with pytest.raises(InvalidInputError, match="timeout"):
        coord.wait(RES, timeout)


@pytest.mark.backends
def test_release_in_another_thread_wakes_the_waiter_promptly(coord: Coordinator) -> None:
    holder = register(coord)
    coord.claim(RES, holder)
    released_at: list[float] = []

    def release_later() -> None:
        time.sleep(0.1)
        coord.release(RES, holder, "modified")
        released_at.append(time.monotonic())

    thread = threading.Thread(target=release_later)
    thread.start()
    reply = coord.wait(RES, 10)
    returned = time.monotonic()
    thread.join()
    latency = returned - released_at[0]
    print(f"\nwait woken by a release in another thread after {latency * 1000:.2f} ms")
    assert reply["status"] == "available"
    assert reply["previous_outcome"] == "modified"
    assert 0.05 <= reply["elapsed_seconds"] < 5
    assert latency < 0.5


@pytest.mark.backends
def test_release_in_another_process_wakes_the_waiter_within_milliseconds(
    coord: Coordinator, spawn: Callable[..., Worker]
) -> None:
    worker = spawn().ready()
    holder = worker.call("register", "remote-holder")["agent_id"]
    latencies = []
    for _ in range(5):
        assert worker.call("claim", RES, holder)["status"] == "claimed"
        worker.send(op="call", method="release", args=[RES, holder, "modified"], delay=0.15)
        reply = coord.wait(RES, 10)
        returned = time.time()
        released = worker.reply()
        assert released["result"]["status"] == "released"
        assert reply["status"] == "available"
        assert reply["previous_outcome"] == "modified"
        assert reply["elapsed_seconds"] > 0.02  # it really waited for the release
        latencies.append(returned - released["at"])
    print(
        f"\nwait woken by a release in another process: median "
        f"{statistics.median(latencies) * 1000:.2f} ms, max {max(latencies) * 1000:.2f} ms"
    )
    assert max(latencies) < 0.5


@pytest.mark.backends
def test_wait_returns_when_the_holders_lease_expires(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord = open_coordinator(claim_ttl=0.3)
    holder = register(coord)
    coord.claim(RES, holder)
    lease_end = unix(coord.status(RES)["lease_ends_at"])
    reply = coord.wait(RES, 5)
    assert time.time() >= lease_end
    assert reply["status"] == "available"
    assert reply["previous_outcome"] == "expired"
    assert reply["previous_holder"] == holder
    assert reply["elapsed_seconds"] < 3


@pytest.mark.backends
def test_end_lease_during_a_wait_wakes_the_waiter_at_the_end_of_the_grace(
    coord: Coordinator,
) -> None:
    holder = register(coord)
    coord.claim(RES, holder)  # no claim TTL: without end_lease the wait would time out

    def end_later() -> None:
        time.sleep(0.1)
        coord.end_lease(holder, 0.1)

    thread = threading.Thread(target=end_later)
    thread.start()
    reply = coord.wait(RES, 10)
    thread.join()
    assert reply["status"] == "available"
    assert reply["previous_outcome"] == "abandoned"
    assert 0.15 <= reply["elapsed_seconds"] < 5


@pytest.mark.backends
def test_end_lease_in_another_process_during_a_wait_wakes_the_waiter(
    coord: Coordinator, spawn: Callable[..., Worker]
) -> None:
    worker = spawn().ready()
    holder = register(coord)
    coord.claim(RES, holder)
    worker.send(op="call", method="end_lease", args=[holder, 0.05], delay=0.1)
    reply = coord.wait(RES, 10)
    assert worker.reply()["result"] is None
    assert reply["status"] == "available"
    assert reply["previous_outcome"] == "abandoned"
    assert 0.1 <= reply["elapsed_seconds"] < 5


# --------------------------------------------------------------------------------------------
# agent ids
# --------------------------------------------------------------------------------------------

MALFORMED_IDS = ["", "bob", "agent-", "agent-1234567", "agent-XYZW1234", "agent-ab12cd34\n", 7]


@pytest.mark.parametrize("agent_id", MALFORMED_IDS)
@pytest.mark.parametrize("call", ["claim", "release", "agent", "end_lease", "release_all"])
def test_a_malformed_agent_id_is_an_unknown_agent_with_a_hint_to_register(
    coord: Coordinator, call: str, agent_id: Any
) -> None:
    calls: dict[str, Callable[[], object]] = {
        "claim": lambda: coord.claim(RES, agent_id),
        "release": lambda: coord.release(RES, agent_id),
        "agent": lambda: coord.agent(agent_id),
        "end_lease": lambda: coord.end_lease(agent_id, 1),
        "release_all": lambda: coord.release_all(agent_id),
    }
    with pytest.raises(UnknownAgentError, match="registering an agent") as caught:
        calls[call]()
    assert isinstance(caught.value, InvalidInputError)
    assert isinstance(caught.value, ValueError)
    assert "Coordinator.register" in caught.value.hint  # over MCP: agenthold_register


@pytest.mark.backends
def test_an_unregistered_agent_id_is_an_unknown_agent(coord: Coordinator) -> None:
    stranger = "agent-0123456789abcdef"
    for call in (
        lambda: coord.claim(RES, stranger),
        lambda: coord.release(RES, stranger),
        lambda: coord.agent(stranger),
    ):
        with pytest.raises(UnknownAgentError, match="register again"):
            call()
    assert event_count(coord) == 0


@pytest.mark.backends
def test_an_agent_id_from_another_database_is_unknown(
    coord: Coordinator, tmp_path: Path, root: Path
) -> None:
    with StateStore(tmp_path / "other.db") as other_store:
        other = WireCoordinator(other_store, resolver=coord.resolver)
        foreign = register(other)
    with pytest.raises(UnknownAgentError):
        coord.claim(RES, foreign)


# --------------------------------------------------------------------------------------------
# Versions are fencing tokens
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_version_grows_with_every_claim_and_release_and_is_never_reused(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord = open_coordinator(claim_ttl=0.3)
    a, b = register(coord, "a"), register(coord, "b")
    versions = [coord.claim(RES, a)["version"], coord.release(RES, a, "modified")["version"]]
    versions.append(coord.claim(RES, a)["version"])
    time.sleep(0.35)  # a's lease lapses while it holds the claim
    takeover = coord.claim(RES, b)  # +1 for the implied release, +1 for the claim
    assert takeover["previous_outcome"] == "expired"
    versions.append(takeover["version"])
    assert coord.release_all(b) == [URI]
    versions.append(coord.claim(RES, a)["version"])
    versions.append(coord.release(RES, a)["version"])
    assert versions == [1, 2, 3, 5, 7, 8]

    logged = [v for *_, v in events(coord, URI)]
    assert logged == list(range(1, 9))  # every version is in the log once, in order
    assert [(e, o) for e, _, o, _ in events(coord, URI)] == [
        ("claimed", None),
        ("released", "modified"),
        ("claimed", None),
        ("released", "expired"),
        ("claimed", None),
        ("released", "abandoned"),
        ("claimed", None),
        ("released", "released"),
    ]


# --------------------------------------------------------------------------------------------
# Leases
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_claim_ttl_must_be_a_positive_number_of_seconds(coord: Coordinator) -> None:
    for bad in (0, -1, float("nan"), "10", True):
        with pytest.raises(InvalidInputError, match="claim_ttl"):
            Coordinator(coord.store, resolver=coord.resolver, claim_ttl=bad)


@pytest.mark.backends
def test_a_claim_whose_holders_lease_ended_is_free_everywhere(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord = open_coordinator(claim_ttl=0.3)
    holder, taker = register(coord, "holder"), register(coord, "taker")
    coord.claim(RES, holder)
    assert [i.uri for i in coord.list_claims()] == [URI]
    time.sleep(0.35)
    status = coord.status(RES)
    assert status["status"] == "available"
    assert status["previous_outcome"] == "expired"
    assert status["previous_holder"] == holder
    assert coord.list_claims() == []
    [info] = coord.list_claims(include_free=True)
    assert (info.state, info.holder, info.last_outcome) == ("free", None, "expired")
    assert coord.wait(RES, 0)["status"] == "available"
    count = event_count(coord)
    reply = coord.claim(RES, taker)
    assert reply["status"] == "claimed"
    assert reply["version"] == 3
    assert reply["previous_outcome"] == "expired"
    assert reply["previous_holder"] == holder
    assert "claim TTL" in reply["hint"]
    assert event_count(coord) == count + 2  # the implied release, then the claim


@pytest.mark.backends
def test_calls_more_often_than_a_short_ttl_keep_the_claim_alive(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord = open_coordinator(claim_ttl=0.4)
    agent = register(coord)
    coord.claim(RES, agent)
    until = time.monotonic() + 1.0
    while time.monotonic() < until:  # over two TTLs of heartbeats every 0.1 s
        time.sleep(0.1)
        assert coord.claim(RES, agent)["status"] == "already_claimed"
    assert coord.release(RES, agent)["status"] == "released"


@pytest.mark.backends
def test_coordinators_with_different_ttls_agree_on_expiry(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    short = open_coordinator(claim_ttl=0.3)
    no_ttl, long_ttl = open_coordinator(), open_coordinator(claim_ttl=3600)
    holder = register(short)
    short.claim(RES, holder)
    for coord in (no_ttl, long_ttl):
        assert coord.status(RES)["status"] == "claimed"
    time.sleep(0.35)
    for coord in (short, no_ttl, long_ttl):
        assert coord.status(RES)["previous_outcome"] == "expired"
        assert coord.list_claims() == []
    reply = no_ttl.claim(RES, register(no_ttl))
    assert (reply["status"], reply["version"], reply["previous_outcome"]) == (
        "claimed",
        3,
        "expired",
    )


@pytest.mark.backends
def test_an_agent_outlives_the_process_that_registered_it(
    open_coordinator: Callable[..., Coordinator], spawn: Callable[..., Worker]
) -> None:
    worker = spawn().ready()
    agent = worker.call("register", "stdio-agent", "m")["agent_id"]
    assert worker.call("claim", RES, agent)["status"] == "claimed"
    worker.stop()
    coord = open_coordinator()  # a new server process would open the file afresh
    assert coord.status(RES)["held_by"] == agent
    assert coord.claim(RES, agent)["status"] == "already_claimed"
    assert coord.release(RES, agent, "modified")["status"] == "released"
    assert coord.agent(agent).name == "stdio-agent"


@pytest.mark.backends
def test_activity_in_another_process_renews_the_lease(
    open_coordinator: Callable[..., Coordinator], spawn: Callable[..., Worker]
) -> None:
    worker = spawn(claim_ttl=0.8).ready()
    coord = open_coordinator(claim_ttl=0.8)
    agent = register(coord)
    coord.claim(RES, agent)
    first_end = unix(coord.status(RES)["lease_ends_at"])
    sleep_until(first_end - 0.4)
    worker.send(op="call", method="claim", args=["src/b.py", agent])
    renewal = worker.reply()
    assert renewal["result"]["status"] == "claimed"
    renewed_end = unix(coord.status(RES)["lease_ends_at"])
    assert renewed_end == pytest.approx(renewal["at"] + 0.8, abs=0.1)
    sleep_until(first_end + 0.05)
    assert coord.status(RES)["held_by"] == agent  # past the first end: kept by the renewal
    reply = coord.wait(RES, 5)
    assert reply["previous_outcome"] == "expired"
    assert time.time() >= renewed_end


@pytest.mark.backends
def test_end_lease_frees_the_claims_as_abandoned_after_the_grace(coord: Coordinator) -> None:
    holder = register(coord)
    coord.claim(RES, holder)
    coord.claim("custom://lock", holder)
    before = time.time()
    coord.end_lease(holder, 0.3)
    after = time.time()
    assert coord.agent(holder).lease_end_outcome == "abandoned"
    assert before + 0.3 <= unix(coord.status(RES)["lease_ends_at"]) <= after + 0.3
    assert coord.status(RES)["status"] == "claimed"  # still held during the grace
    reply = coord.wait(RES, 5)
    assert reply["previous_outcome"] == "abandoned"
    assert "disconnected" in reply["hint"]
    assert coord.status("custom://lock")["previous_outcome"] == "abandoned"
    assert events(coord, URI)[-1] == ("claimed", holder, None, 1)  # nothing written yet
    assert coord.claim(RES, register(coord))["version"] == 3


@pytest.mark.backends
def test_acting_again_from_another_process_within_the_grace_loses_nothing(
    coord: Coordinator, spawn: Callable[..., Worker]
) -> None:
    worker = spawn().ready()
    holder = register(coord)
    coord.claim(RES, holder)
    coord.end_lease(holder, 0.3)
    assert "lease_ends_at" in coord.status(RES)
    assert worker.call("claim", RES, holder)["status"] == "already_claimed"
    assert "lease_ends_at" not in coord.status(RES)  # the end is gone
    time.sleep(0.35)
    assert coord.status(RES)["held_by"] == holder
    assert coord.release(RES, holder)["version"] == 2


@pytest.mark.backends
def test_end_lease_keeps_a_lease_that_already_ends_sooner(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord = open_coordinator(claim_ttl=60)
    holder = register(coord)
    ttl_end = coord.agent(holder).lease_ends_at
    count = event_count(coord)
    coord.end_lease(holder, 600)
    agent = coord.agent(holder)
    assert (agent.lease_ends_at, agent.lease_end_outcome) == (ttl_end, "expired")
    assert event_count(coord) == count
    coord.end_lease(holder, 5, outcome="expired")
    coord.end_lease(holder, 10)  # later than the new end: kept too
    agent = coord.agent(holder)
    assert agent.lease_ends_at is not None and ttl_end is not None
    assert agent.lease_ends_at < ttl_end - 50
    assert agent.lease_end_outcome == "expired"
    coord.end_lease("agent-0123456789abcdef", 1)  # an agent that is gone: nothing to end
    assert event_count(coord) == count + 1


@pytest.mark.parametrize(
    ("grace", "outcome", "message"),
    [(-1, "abandoned", "grace"), (float("nan"), "abandoned", "grace"), (1, "released", "outcome")],
)
def test_end_lease_rejects_a_bad_grace_or_outcome(
    coord: Coordinator, grace: float, outcome: str, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        coord.end_lease(register(coord), grace, outcome)


@pytest.mark.backends
def test_an_agent_back_after_its_lease_lapsed_does_not_regain_its_claims(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord = open_coordinator(claim_ttl=0.3)
    agent = register(coord)
    coord.claim(RES, agent)
    coord.claim("src/b.py", agent)
    time.sleep(0.35)
    late = coord.release(RES, agent, "modified")
    assert late["status"] == "already_free"
    assert late["version"] == 2
    assert "Your claim ended (expired)" in late["hint"]
    assert coord.status("src/b.py")["previous_outcome"] == "expired"  # released with the other
    again = coord.claim(RES, agent)
    assert again["status"] == "claimed"  # a new claim, not "already_claimed"
    assert (again["version"], again["previous_holder"]) == (3, agent)
    assert coord.status(RES)["held_by"] == agent  # and the new claim is held


# --------------------------------------------------------------------------------------------
# release_all and reaping
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_release_all_frees_every_claim_of_the_agent(coord: Coordinator) -> None:
    leaver, stayer = register(coord, "leaver"), register(coord, "stayer")
    for res in ("src/b.py", RES, "custom://lock"):
        coord.claim(res, leaver)
    coord.claim("src/c.py", stayer)
    released = coord.release_all(leaver)
    assert released == ["custom://lock", URI, "file://default/src/b.py"]
    for uri in released:
        status = coord.status(uri)
        assert (status["status"], status["previous_outcome"]) == ("available", "abandoned")
    assert coord.status("src/c.py")["held_by"] == stayer
    assert coord.release_all(leaver) == []
    coord.claim(RES, leaver)
    assert coord.release_all(leaver, "modified") == [URI]
    assert coord.claim(RES, stayer)["previous_outcome"] == "modified"


@pytest.mark.parametrize("outcome", ["moved", "bogus", ""])
def test_release_all_rejects_a_bad_outcome(coord: Coordinator, outcome: str) -> None:
    with pytest.raises(InvalidInputError, match="release_all"):
        coord.release_all(register(coord), outcome)


def test_reap_idle_agents_removes_idle_agents_and_keeps_holders_of_live_claims(
    open_coordinator: Callable[..., Coordinator], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "RENEW_EVERY", 0.0)  # record every call's time exactly
    coord, short = open_coordinator(), open_coordinator(claim_ttl=0.1)
    idle, holder, active = register(coord, "idle"), register(coord, "holder"), register(coord)
    lapsed = register(short, "lapsed")
    coord.claim(RES, holder)
    short.claim("src/b.py", lapsed)
    time.sleep(0.5)
    coord.claim("src/c.py", active)
    coord.release("src/c.py", active)

    reaped = coord.reap_idle_agents(0.4)  # idle for 0.5 s and more; active just now

    assert sorted(reaped) == sorted([idle, lapsed])
    assert {a.agent_id for a in coord.list_agents()} == {holder, active}
    for gone in reaped:
        with pytest.raises(UnknownAgentError):
            coord.claim("src/d.py", gone)
        with pytest.raises(UnknownAgentError):
            coord.agent(gone)
    assert coord.status(RES)["held_by"] == holder
    lapsed_claim = coord.status("src/b.py")
    assert (lapsed_claim["previous_outcome"], lapsed_claim["previous_holder"]) == (
        "expired",
        lapsed,
    )
    assert events(coord, "file://default/src/b.py")[-1] == ("released", lapsed, "expired", 2)
    assert coord.db.fetchone("SELECT count(*) FROM claim_events WHERE event = 'reaped'") == (2,)
    assert coord.reap_idle_agents(3600) == []


@pytest.mark.backends
def test_reap_idle_agents_rejects_a_bad_age(coord: Coordinator) -> None:
    with pytest.raises(InvalidInputError, match="older_than"):
        coord.reap_idle_agents(-5)


# --------------------------------------------------------------------------------------------
# Transactions and the event log
# --------------------------------------------------------------------------------------------


def test_each_claim_and_release_is_one_transaction_with_one_event_row(
    coord: Coordinator,
) -> None:
    holder, other = register(coord), register(coord)
    with coord.db.snapshot() as conn:  # this thread's connection, which writes too
        pass
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        for call in (
            lambda: coord.claim(RES, holder),
            lambda: coord.release(RES, holder, "modified"),
        ):
            statements.clear()
            count = event_count(coord)
            call()
            assert event_count(coord) == count + 1
            transactions = [s for s in statements if s.startswith(("BEGIN", "COMMIT"))]
            assert transactions == ["BEGIN IMMEDIATE", "COMMIT"]
    finally:
        conn.set_trace_callback(None)
    assert events(coord, URI) == [
        ("claimed", holder, None, 1),
        ("released", holder, "modified", 2),
    ]
    count = event_count(coord)
    coord.claim(RES, holder)
    coord.claim(RES, holder)  # already_claimed
    coord.claim(RES, other)  # busy
    coord.release("src/never.py", holder)  # not_found
    coord.status(RES)
    coord.wait(RES, 0)
    assert event_count(coord) == count + 1


# --------------------------------------------------------------------------------------------
# Races
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_eight_threads_claiming_one_resource_at_once_get_exactly_one_claim(
    coord: Coordinator,
) -> None:
    agents = [register(coord, f"thread-{i}") for i in range(8)]
    for round_ in range(5):
        resource = f"src/race{round_}.py"
        replies = run_threads(8, lambda i, res=resource: coord.claim(res, agents[i]))
        winners = [agents[i] for i, r in enumerate(replies) if r["status"] == "claimed"]
        assert len(winners) == 1
        assert sorted(r["status"] for r in replies) == ["busy"] * 7 + ["claimed"]
        assert all(r["held_by"] == winners[0] for r in replies if r["status"] == "busy")


@pytest.mark.backends
def test_four_processes_claiming_one_resource_at_once_get_exactly_one_claim(
    coord: Coordinator, spawn: Callable[..., Worker]
) -> None:
    workers = [spawn() for _ in range(4)]
    for worker in workers:
        worker.ready()
    agents = [w.call("register", f"process-{i}")["agent_id"] for i, w in enumerate(workers)]
    for round_ in range(3):
        resource = f"src/race{round_}.py"
        start_at = time.time() + 0.2
        for worker, agent in zip(workers, agents, strict=True):
            worker.send(op="race", resource=resource, agent_id=agent, start_at=start_at)
        replies = [w.reply()["result"] for w in workers]
        statuses = sorted(r["status"] for r in replies)
        assert statuses == ["busy"] * 3 + ["claimed"]
        winner = agents[[r["status"] for r in replies].index("claimed")]
        assert coord.status(resource)["held_by"] == winner


@pytest.mark.backends
def test_threads_holding_and_releasing_one_resource_never_overlap(coord: Coordinator) -> None:
    agents = [register(coord, f"t{i}") for i in range(4)]

    def hold_and_release(i: int) -> list[tuple[float, float, int, int]]:
        intervals = []
        for _ in range(15):
            while (reply := coord.claim(RES, agents[i]))["status"] != "claimed":
                coord.wait(RES, 10)
            start = time.monotonic()
            time.sleep(0.001)
            end = time.monotonic()
            released = coord.release(RES, agents[i])
            intervals.append((start, end, reply["version"], released["version"]))
        return intervals

    results = run_threads(4, hold_and_release)
    assert_no_overlap([interval for intervals in results for interval in intervals])


@pytest.mark.backends
def test_processes_holding_and_releasing_one_resource_never_overlap(
    coord: Coordinator, spawn: Callable[..., Worker]
) -> None:
    workers = [spawn() for _ in range(3)]
    for worker in workers:
        worker.ready()
    agents = [register(coord, f"p{i}") for i in range(3)]  # registered here, used there
    for worker, agent in zip(workers, agents, strict=True):
        worker.send(op="stress", resource=RES, agent_id=agent, rounds=15, hold=0.002)
    intervals = [interval for w in workers for interval in w.reply(timeout=60)["result"]]
    assert len(intervals) == 45
    assert_no_overlap(intervals)


# --------------------------------------------------------------------------------------------
# Resources
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_every_spelling_of_a_path_is_one_claim(coord: Coordinator, root: Path) -> None:
    holder, other = register(coord), register(coord)
    spellings = ["./src/a.py", "src\\a.py", "src//a.py", str(root / "src" / "a.py"), URI]
    assert coord.claim(spellings[0], holder)["status"] == "claimed"
    for spelling in spellings:
        assert coord.claim(spelling, holder)["status"] == "already_claimed"
        assert coord.claim(spelling, other)["status"] == "busy"
        assert coord.status(spelling)["held_by"] == holder
    assert [i.uri for i in coord.list_claims()] == [URI]
    assert coord.release(spellings[3], holder)["status"] == "released"
    assert coord.claim(spellings[1], other)["version"] == 3


@pytest.mark.backends
def test_custom_resource_names_are_case_sensitive(coord: Coordinator) -> None:
    a, b = register(coord), register(coord)
    assert coord.claim("custom://Lock", a)["status"] == "claimed"
    assert coord.claim("custom://lock", b)["status"] == "claimed"
    assert coord.claim("custom://Lock", b)["held_by"] == a
    assert [i.uri for i in coord.list_claims()] == ["custom://Lock", "custom://lock"]


@pytest.mark.parametrize("resource", ["../etc/passwd", "src/./a.py", "", "ftp://x", "/elsewhere/a"])
def test_a_bad_resource_is_rejected_before_anything_is_written(
    coord: Coordinator, resource: str
) -> None:
    agent = register(coord)
    count = event_count(coord)
    for call in (coord.claim, coord.release):
        with pytest.raises(InvalidInputError):
            call(resource, agent)
    for look in (coord.status, lambda r: coord.wait(r, 0)):
        with pytest.raises(InvalidInputError):
            look(resource)
    assert event_count(coord) == count


def test_without_a_resolver_paths_resolve_against_the_current_directory(
    coord: Coordinator, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(root)
    default = WireCoordinator(coord.store)
    agent = register(default)
    assert default.claim(str(root / "src" / "a.py"), agent)["resource"] == URI
    assert coord.status(RES)["held_by"] == agent


# --------------------------------------------------------------------------------------------
# Listings
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_list_claims_shows_held_claims_and_with_include_free_every_resource(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord = open_coordinator()
    short = open_coordinator(claim_ttl=0.1)
    holder, brief = register(coord, "holder", "m1"), register(short, "brief")
    coord.claim("src/b.py", holder)
    coord.claim(RES, holder)
    coord.release(RES, holder, "deleted")
    short.claim("custom://job", brief)
    coord.claim("custom://held", holder)
    time.sleep(0.15)  # brief's lease ends

    held = coord.list_claims()
    assert [i.uri for i in held] == ["custom://held", "file://default/src/b.py"]
    assert all(isinstance(i, ClaimInfo) and i.state == "claimed" for i in held)
    assert held[1].to_dict() == {
        "resource": "file://default/src/b.py",
        "state": "claimed",
        "version": 1,
        "held_by": holder,
        "agent_name": "holder",
        "agent_model": "m1",
        "claimed_at": held[1].claimed_at,
        "lease_ends_at": None,
        "last_outcome": None,
        "last_holder": None,
        "last_outcome_at": None,
        "moved_to": None,
    }
    every = {i.uri: i for i in coord.list_claims(include_free=True)}
    assert list(every) == ["custom://held", "custom://job", URI, "file://default/src/b.py"]
    assert (every[URI].state, every[URI].last_outcome, every[URI].version) == ("free", "deleted", 2)
    job = every["custom://job"].to_dict()
    assert (job["state"], job["held_by"], job["last_outcome"], job["last_holder"]) == (
        "free",
        None,
        "expired",
        brief,
    )


@pytest.mark.backends
def test_list_agents_shows_every_agent_oldest_first(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    coord, timed = open_coordinator(), open_coordinator(claim_ttl=60)
    first = coord.register("first", "model-a", "reads")["agent_id"]
    second = register(timed, "second")
    agents = coord.list_agents()
    assert [a.agent_id for a in agents] == [first, second]
    assert all(isinstance(a, Agent) for a in agents)
    one = agents[0].to_dict()
    assert one == {
        "agent_id": first,
        "name": "first",
        "model": "model-a",
        "purpose": "reads",
        "registered_at": one["registered_at"],
        "last_seen_at": one["registered_at"],
        "lease_ends_at": None,
        "lease_end_outcome": None,
    }
    two = agents[1].to_dict()
    assert two["lease_end_outcome"] == "expired"
    assert unix(two["lease_ends_at"]) == pytest.approx(time.time() + 60, abs=5)


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_child_coverage")
def test_claims_benchmark_quick_run_prints_its_tables(tmp_path: Path) -> None:
    env = {**child_env(), "TMPDIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert "claim + release pairs" in run.stdout
    assert "wake-up latency" in run.stdout
    assert "raw sqlite3" in run.stdout
    assert re.search(r"the statements the library runs today +[\d,]+ +\d+%", run.stdout)
    assert re.search(r"70% of raw sqlite3 writing the same rows \(issue 24\): \d+%", run.stdout)
    assert re.search(r"by another process: median <= 10 ms: [\d.]+ ms", run.stdout), run.stdout
    assert re.search(r"globs held in the file's own directory +[\d,]+ +\d+%", run.stdout)
    assert re.search(r"a set of 20, against those of one +[\d,]+ +\d+%", run.stdout)
    assert re.search(r"20 resources at once \(resources lists\) +[\d.]+ ms +\d+%", run.stdout)
    assert re.search(r"\(one call over MCP\): at most 3x one claim: [\d.]+x", run.stdout)


def _statement_pattern(sql: str) -> re.Pattern[str]:
    """A statement with ``?`` parameters, as SQLite's trace shows it run: each a literal."""
    literal = r"(?:'(?:[^']|'')*'|-?[\d.e+]+|NULL)"
    return re.compile("".join(literal if part == "?" else re.escape(part)
                              for part in re.split(r"(\?)", sql)))  # fmt: skip


def test_the_claims_benchmarks_copies_of_the_library_statements_are_what_a_claim_runs(
    tmp_path: Path, root: Path
) -> None:
    # bench/perf/claims_bench.py writes out the statements of a claim and a release to time
    # them on a raw connection (a bench imports faces only): they must stay what a claim runs
    spec = importlib.util.spec_from_file_location("claims_bench_copy", BENCH)
    assert spec is not None and spec.loader is not None
    sys.path[:0] = [str(BENCH.parent), str(BENCH.parent.parent)]
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.path[:2]
        del sys.modules[spec.name]
    coord = bench.coordinator(tmp_path / "traced.db", root)
    try:
        agent = coord.register("bench").agent_id
        assert coord.claim(bench.RESOURCE, agent).status == "claimed"
        coord.release(bench.RESOURCE, agent)  # the claim row exists: later pairs update it
        ran: list[str] = []
        with coord.store.db.write() as (conn, _):
            conn.set_trace_callback(ran.append)  # this thread's write connection, reused
        assert coord.claim(bench.RESOURCE, agent).status == "claimed"
        coord.release(bench.RESOURCE, agent)
        with coord.store.db.write() as (conn, _):
            conn.set_trace_callback(None)
    finally:
        coord.store.close()
    shapes = {n: _statement_pattern(getattr(bench, n)) for n in
              ("LIBRARY_LOOK", "LIBRARY_TAKE", "LIBRARY_FREE", "LIBRARY_EVENT")}  # fmt: skip
    for name, pattern in shapes.items():
        assert any(pattern.fullmatch(sql) for sql in ran), (name, ran)
    # and nothing else is written or read by the pair
    others = {sql for sql in ran if not any(p.fullmatch(sql) for p in shapes.values())}
    # (a lease renewal writes the agent's row at most once a second: a slow machine may see one)
    others = {sql for sql in others if not sql.startswith("UPDATE agents SET last_seen_at = ")}
    assert others <= {"BEGIN IMMEDIATE", "COMMIT"}, others


@pytest.mark.backends
def test_a_wait_wakes_when_a_process_with_a_shorter_ttl_shortens_the_holders_lease(
    open_coordinator: Callable[..., Coordinator],
) -> None:
    long_ttl = open_coordinator(claim_ttl=60)
    short_ttl = open_coordinator(claim_ttl=0.2)
    holder = register(long_ttl)
    long_ttl.claim("x.py", holder)

    def renew_through_the_short_ttl() -> None:
        time.sleep(0.1)
        short_ttl.claim("y.py", holder)  # the holder's lease now ends 0.2 s later

    thread = threading.Thread(target=renew_through_the_short_ttl)
    thread.start()
    started = time.monotonic()
    reply = long_ttl.wait("x.py", 3)
    elapsed = time.monotonic() - started
    thread.join()
    assert reply["status"] == "available"
    assert reply["previous_outcome"] == "expired"
    assert elapsed < 1.5, f"the wait slept past the shortened lease: {elapsed:.2f} s"


def test_a_heartbeat_that_waited_past_its_lease_end_for_the_lock_does_not_revive_it(
    open_coordinator: Callable[..., Coordinator], db_file: Path
) -> None:
    coord = open_coordinator(claim_ttl=0.3)
    agent = register(coord)
    assert coord.claim(RES, agent)["status"] == "claimed"
    blocker = sqlite3.connect(db_file, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    answers: list[dict[str, Any]] = []
    heartbeat = threading.Thread(target=lambda: answers.append(coord.claim(RES, agent)))
    heartbeat.start()
    time.sleep(0.5)  # the lease ends while the heartbeat waits for the lock
    assert coord.status(RES)["previous_outcome"] == "expired"
    blocker.execute("ROLLBACK")
    blocker.close()
    heartbeat.join()
    # The heartbeat is judged at the time it runs: the claim had lapsed, so it claims anew and
    # says so, and what everyone else saw (expired) stays on the record.
    assert answers[0]["status"] == "claimed"
    assert (answers[0]["previous_outcome"], answers[0]["previous_holder"]) == ("expired", agent)
    assert events(coord, URI)[-2:] == [
        ("released", agent, "expired", 2),
        ("claimed", agent, None, 3),
    ]


def test_one_workspace_name_over_two_roots_keeps_the_two_files_apart(
    tmp_path: Path, db_file: Path
) -> None:
    one, two = tmp_path / "project-one", tmp_path / "project-two"
    one.mkdir()
    two.mkdir()
    with StateStore(db_file) as first_store, StateStore(db_file) as second_store:
        first, second = (
            coordinator_at(first_store, one, replies=True),
            coordinator_at(second_store, two, replies=True),
        )
        a, b = register(first, "a"), register(second, "b")
        assert first.claim("x.py", a)["status"] == "claimed"
        mine = second.claim("x.py", b)  # another file that happens to have the same name
        assert (mine["status"], mine["resource"]) == ("claimed", "file://default/x.py")
        assert first.status("x.py")["held_by"] == a
        assert second.status("x.py")["held_by"] == b
        # ...while one root under two names is one file: a third server calls it "proj".
        third = WireCoordinator(first_store, resolver=Resolver([Workspace("proj", str(one))]))
        busy = third.claim("file://proj/x.py", register(third, "c"))
        assert (busy["status"], busy["held_by"]) == ("busy", a)


@pytest.mark.backends
def test_a_short_reap_age_never_reaps_an_agent_that_just_made_a_call(coord: Coordinator) -> None:
    agent = register(coord)
    time.sleep(0.3)  # last_seen_at is not rewritten by calls within RENEW_EVERY of it
    coord.claim("custom://r", agent)
    coord.release("custom://r", agent)
    assert coord.reap_idle_agents(0.2) == []  # its last call was just now
    assert coord.agent(agent).name == "agent"
    assert coord.reap_idle_agents(0) == [agent]  # 0: every agent not in a call right now


def test_an_agent_is_never_reaped_before_older_than_has_passed_since_its_last_call(
    coord: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "RENEW_EVERY", 0.2)  # last-seen times lag by up to this much
    agent = register(coord)
    time.sleep(0.1)
    coord.claim("custom://r", agent)  # too soon after registering to rewrite last_seen_at
    coord.release("custom://r", agent)
    time.sleep(0.1)
    assert coord.reap_idle_agents(0.5) == []  # its last call was only 0.1 s ago
    time.sleep(0.55)
    assert coord.reap_idle_agents(0.3) == [agent]  # idle for 0.55 s now


# --------------------------------------------------------------------------------------------
# Aliases: one file under several names is one claim
# --------------------------------------------------------------------------------------------


@pytest.fixture
def linked(root: Path) -> tuple[str, str]:
    """AGENTS.md and its hard link CLAUDE.md in the workspace."""
    (root / "AGENTS.md").write_text("rules")
    os.link(root / "AGENTS.md", root / "CLAUDE.md")
    return "AGENTS.md", "CLAUDE.md"


posix_only = pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges there")


@posix_only
def test_a_symlink_is_the_same_claim_as_its_target(coord: Coordinator, root: Path) -> None:
    (root / "AGENTS.md").write_text("rules")
    (root / "CLAUDE.md").symlink_to("AGENTS.md")
    first, second = register(coord, "first"), register(coord, "second")
    assert coord.claim("AGENTS.md", first)["status"] == "claimed"
    busy = coord.claim("CLAUDE.md", second)
    assert (busy["status"], busy["held_by"], busy["resource"]) == (
        "busy",
        first,
        "file://default/AGENTS.md",
    )


@posix_only
def test_a_symlink_out_of_the_workspace_cannot_be_claimed(
    coord: Coordinator, root: Path, tmp_path: Path
) -> None:
    (tmp_path / "shadow").write_text("secret")
    (root / "etc-link").mkdir()
    (root / "etc-link" / "shadow").symlink_to(tmp_path / "shadow")
    with pytest.raises(InvalidInputError, match="symbolic link"):
        coord.claim("etc-link/shadow", register(coord))
    assert coord.list_claims(include_free=True) == []


def test_a_hard_link_of_a_claimed_file_is_busy(coord: Coordinator, linked: tuple[str, str]) -> None:
    first, second = register(coord, "first"), register(coord, "second")
    assert coord.claim(linked[0], first)["status"] == "claimed"
    busy = coord.claim(linked[1], second)
    assert busy["status"] == "busy"
    assert (busy["resource"], busy["held_as"], busy["held_by"], busy["agent_name"]) == (
        "file://default/CLAUDE.md",
        "file://default/AGENTS.md",
        first,
        "first",
    )
    status = coord.status(linked[1])
    assert (status["status"], status["held_by"], status["held_as"]) == (
        "claimed",
        first,
        "file://default/AGENTS.md",
    )
    assert coord.wait(linked[1], 0.05)["status"] == "timeout"
    assert coord.claim(linked[1], first)["status"] == "claimed"  # the holder may take both names
    coord.release(linked[1], first)
    coord.release(linked[0], first)
    assert coord.claim(linked[1], second)["status"] == "claimed"


def test_releasing_through_one_hard_link_wakes_a_waiter_on_the_other(
    coord: Coordinator, linked: tuple[str, str]
) -> None:
    first, second = register(coord, "first"), register(coord, "second")
    coord.claim(linked[0], first)
    replies: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: replies.append(coord.wait(linked[1], 10)))
    waiter.start()
    time.sleep(0.1)
    coord.release(linked[0], first, "modified")
    waiter.join(10)
    assert replies and replies[0]["status"] == "available"
    assert replies[0]["elapsed_seconds"] < 5
    assert coord.claim(linked[1], second)["status"] == "claimed"


def test_a_hard_link_no_longer_blocks_once_the_claimed_name_is_another_file(
    coord: Coordinator, root: Path, linked: tuple[str, str]
) -> None:
    first, second = register(coord, "first"), register(coord, "second")
    coord.claim(linked[0], first)
    (root / "AGENTS.md").unlink()  # the claimed name now leads nowhere, then to a new file
    assert coord.status(linked[1])["status"] == "available"
    (root / "AGENTS.md").write_text("new")
    assert coord.claim(linked[1], second)["status"] == "claimed"
    assert coord.status(linked[0])["held_by"] == first


def test_a_file_claimed_before_it_existed_is_keyed_by_its_path(
    coord: Coordinator, root: Path
) -> None:
    first, second = register(coord, "first"), register(coord, "second")
    assert coord.claim("new.py", first)["status"] == "claimed"
    (root / "new.py").write_text("created")
    assert coord.claim("new.py", second)["status"] == "busy"
    assert coord.release("new.py", first, "created")["status"] == "released"


@posix_only
def test_a_claim_on_a_name_that_later_became_a_symlink_is_released_by_its_holder(
    coord: Coordinator, root: Path, tmp_path: Path
) -> None:
    holder, other = register(coord, "holder"), register(coord, "other")
    (root / "target.md").write_text("")
    assert coord.claim("later.md", holder)["resource"] == "file://default/later.md"
    (root / "later.md").symlink_to("target.md")
    assert coord.claim("later.md", other)["resource"] == "file://default/target.md"
    released = coord.release("later.md", holder, "modified")
    assert (released["status"], released["resource"]) == ("released", "file://default/later.md")
    assert coord.status("target.md")["held_by"] == other
    (root / "gone.md").touch()
    coord.claim("gone.md", holder)
    (root / "gone.md").unlink()
    (root / "gone.md").symlink_to(tmp_path)  # now leads out of the workspace
    assert coord.release("gone.md", holder)["status"] == "released"
    with pytest.raises(InvalidInputError, match="symbolic link"):
        coord.release("gone.md", other)


# --------------------------------------------------------------------------------------------
# The library's results are typed and carry no tool wording
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_the_library_returns_typed_results_that_name_no_tool(
    coord: Coordinator, root: Path
) -> None:
    plain = Coordinator(coord.store, resolver=coord.resolver)
    registration = plain.register("typed", "m")
    assert isinstance(registration, claims.Registration)
    holder, other = registration.agent_id, plain.register("other").agent_id
    claimed = plain.claim(RES, holder)
    assert (claimed.status, claimed.resource, claimed.version) == ("claimed", URI, 1)
    busy = plain.claim(RES, other)
    assert busy.status == "busy" and busy.holder is not None
    assert (busy.holder.agent_id, busy.holder.name, busy.version) == (holder, "typed", None)
    status = plain.status(RES)
    assert status.holder is not None and status.holder.model == "m" and status.version == 1
    timed_out = plain.wait(RES, 0.05)
    assert timed_out.status == "timeout" and timed_out.holder is not None
    released = plain.release(RES, holder, "moved", moved_to="src/b.py")
    assert (released.status, released.version, released.outcome) == ("released", 2, "moved")
    assert released.moved_to == "file://default/src/b.py"
    waited = plain.wait(RES, 1)
    assert waited.status == "available" and waited.previous is not None
    assert (waited.previous.outcome, waited.previous.holder) == ("moved", holder)
    again = plain.claim(RES, other)
    assert again.previous == waited.previous and again.version == 3
    assert plain.release("src/never.py", other).status == "not_found"
    for result in (registration, claimed, busy, status, timed_out, released, waited, again):
        assert "agenthold_" not in repr(result)  # the wording is the tool layer's
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.status = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError, match="not a Coordinator result"):
        claim_tools.reply(object())
