"""Tests for issue 15: shared claims (``mode: "shared"``) and the fair hand-off of waits that
claim (``claim: true``), through the library and a real mcp.Client, on both backends.

Other processes: stdio servers (``python -m agenthold``) on the test's database, and
tests/helpers/queue_worker.py (a Coordinator taking shared and exclusive claims, by claims and
by waits in the queue); a history checker replays the claim events they left.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from support import (
    REPO,
    Coordinators,
    OverlapOracle,
    agents,
    child_env,
    in_process_client,
    reply_of,
)

from agenthold.claims import Coordinator
from agenthold.claims.schema import CLAIMS_LOCK
from agenthold.store import InvalidInputError

WORKER = Path(__file__).parent / "helpers" / "queue_worker.py"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "src" / "api").mkdir(parents=True)
    return path


def queued(coord: Coordinator) -> int:
    return int(coord.db.fetchone("SELECT count(*) FROM claim_waiters")[0])


def in_line(coord: Coordinator, agent: str) -> int:
    """The queue rows of ``agent``'s waits."""
    sql = "SELECT count(*) FROM claim_waiters WHERE agent_id = ?"
    return int(coord.db.fetchone(sql, (agent,))[0])


def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.005)


class Waits:
    """Library waits that claim, each in a thread of its own; ``results`` by name."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.results: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []

    def start(self, name: str, resource: str, agent: str, timeout: float = 10, **kw: Any) -> None:
        """Start the wait, and return once it is in line (its own row, not a count of rows: a
        short wait started before it may leave the queue meanwhile, on a loaded machine) or
        has answered."""
        before = in_line(self.coord, agent)

        def run() -> None:
            self.results[name] = self.coord.wait(
                resource, timeout, agent_id=agent, claim=True, **kw
            )

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)
        until(lambda: in_line(self.coord, agent) > before or name in self.results)  # in order

    def join(self) -> None:
        for thread in self.threads:
            thread.join(30)


# --------------------------------------------------------------------------------------------
# Shared claims
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_readers_share_a_resource_and_a_writer_is_busy_behind_them(coord: Coordinator) -> None:
    r1, r2, w = agents(coord, "r1", "r2", "w")
    first = coord.claim("src/a.py", r1, mode="shared")
    second = coord.claim("src/a.py", r2, mode="shared")
    assert (first.status, first.version, second.status, second.version) == (
        "claimed", 1, "claimed", 2,
    )  # fmt: skip
    assert coord.claim("src/a.py", r2, mode="shared").status == "already_claimed"
    busy = coord.claim("src/a.py", w)
    assert busy.status == "busy"
    assert {h.agent_id for h in busy.conflicts} == {r1, r2}
    assert {h.mode for h in busy.conflicts} == {"shared"}
    status = coord.status("src/a.py")
    assert (status.status, status.mode) == ("claimed", "shared")
    assert {h.agent_id for h in status.holders} == {r1, r2}
    # a release of a shared claim ends that reader's hold only
    released = coord.release("src/a.py", r1, "released")
    assert (released.status, released.version) == ("released", 3)
    still = coord.status("src/a.py")
    assert [h.agent_id for h in still.holders] == [r2]
    assert coord.claim("src/a.py", w).status == "busy"
    coord.release("src/a.py", r2)
    taken = coord.claim("src/a.py", w)
    assert (taken.status, taken.version) == ("claimed", 5)
    assert coord.status("src/a.py").mode == "exclusive"


@pytest.mark.backends
def test_a_reader_is_busy_behind_a_writer_and_a_lone_reader_may_upgrade(
    coord: Coordinator,
) -> None:
    w, r1, r2 = agents(coord, "w", "r1", "r2")
    coord.claim("src/a.py", w)
    busy = coord.claim("src/a.py", r1, mode="shared")
    assert busy.status == "busy" and busy.holder is not None
    assert (busy.holder.agent_id, busy.holder.mode) == (w, "exclusive")
    # a holder that asks again for less keeps what it has
    assert coord.claim("src/a.py", w, mode="shared").status == "already_claimed"
    coord.release("src/a.py", w)
    coord.claim("src/a.py", r1, mode="shared")
    coord.claim("src/a.py", r2, mode="shared")
    assert coord.claim("src/a.py", r1).status == "busy"  # r2 reads too
    coord.release("src/a.py", r2)
    up = coord.claim("src/a.py", r1)  # the last reader becomes the writer
    assert up.status == "claimed"
    status = coord.status("src/a.py")
    assert (status.mode, status.holder and status.holder.agent_id, status.holders) == (
        "exclusive", r1, (),
    )  # fmt: skip


@pytest.mark.backends
def test_shared_and_exclusive_conflict_through_directories_and_globs(coord: Coordinator) -> None:
    r, w, r2 = agents(coord, "r", "w", "r2")
    assert coord.claim("src/api/", r, mode="shared").status == "claimed"
    below = coord.claim("src/api/x.py", w)
    assert below.status == "busy" and below.holder is not None
    assert (below.holder.agent_id, below.holder.held_as) == (r, "file://default/src/api/")
    assert coord.claim("src/**/*.py", w).status == "busy"  # the glob overlaps the directory
    assert coord.claim("src/api/x.py", r2, mode="shared").status == "claimed"  # readers mix
    assert coord.claim("src/b.py", w).status == "claimed"  # outside the directory
    looked = coord.status("src/api/x.py")
    assert looked.mode == "shared" and {h.agent_id for h in looked.holders} == {r, r2}
    coord.release("src/api/", r)
    coord.release("src/api/x.py", r2)
    # the other way: an exclusive glob makes readers of what it covers busy
    assert coord.claim("src/**/*.py", w).status == "claimed"
    assert coord.claim("src/api/y.py", r, mode="shared").status == "busy"
    assert coord.claim("src/api/", r, mode="shared").status == "busy"
    assert coord.claim("src/api/notes.md", r, mode="shared").status == "claimed"


@pytest.mark.backends
def test_a_reader_of_a_hard_link_holds_off_a_writer_of_the_other_name(
    coord: Coordinator, root: Path
) -> None:
    (root / "AGENTS.md").write_text("x")
    os.link(root / "AGENTS.md", root / "CLAUDE.md")
    r, w = agents(coord, "r", "w")
    coord.claim("AGENTS.md", r, mode="shared")
    busy = coord.claim("CLAUDE.md", w)
    assert busy.status == "busy" and busy.holder is not None
    assert (busy.holder.agent_id, busy.holder.held_as) == (r, "file://default/AGENTS.md")
    assert coord.claim("CLAUDE.md", w, mode="shared").status == "claimed"


@pytest.mark.backends
def test_a_shared_claim_lapses_with_its_readers_lease(opened: Coordinators) -> None:
    coord = opened(claim_ttl=0.2)
    r, w = agents(coord, "r", "w")
    coord.claim("src/a.py", r, mode="shared")
    assert coord.claim("src/a.py", w).status == "busy"
    time.sleep(0.3)
    taken = coord.claim("src/a.py", w)
    assert taken.status == "claimed"
    coord.release("src/a.py", w)
    gone = coord.release("src/a.py", r)
    assert gone.status == "already_free"
    assert coord.claim("src/a.py", r, mode="shared").status == "claimed"
    assert coord.release_all(r) == ["file://default/src/a.py"]
    assert coord.status("src/a.py").status == "available"


@pytest.mark.backends
def test_bad_modes_and_waits_are_invalid_input(coord: Coordinator) -> None:
    (a,) = agents(coord, "a")
    with pytest.raises(InvalidInputError, match="mode must be"):
        coord.claim("src/a.py", a, mode="read")
    with pytest.raises(InvalidInputError, match="needs agent_id"):
        coord.wait("src/a.py", 0, claim=True)
    with pytest.raises(InvalidInputError, match="mode must be"):
        coord.wait("src/a.py", 0, agent_id=a, claim=True, mode="both")
    with pytest.raises(InvalidInputError, match="claim=True"):
        coord.wait("src/a.py", 0, agent_id=a)
    with pytest.raises(InvalidInputError, match="not an agent_id"):
        coord.wait("src/a.py", 0, agent_id="me", claim=True)
    assert queued(coord) == 0


# --------------------------------------------------------------------------------------------
# The queue, through the library
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_waits_that_claim_are_handed_the_claim_in_arrival_order(coord: Coordinator) -> None:
    h, w1, w2, w3 = agents(coord, "h", "w1", "w2", "w3")
    coord.claim("src/a.py", h)
    waits = Waits(coord)
    for name, agent in (("w1", w1), ("w2", w2), ("w3", w3)):
        waits.start(name, "src/a.py", agent)
    assert coord.claim("src/a.py", h).status == "already_claimed"
    coord.release("src/a.py", h, "modified")
    until(lambda: "w1" in waits.results)
    got = waits.results["w1"]
    assert (got.status, got.version) == ("claimed", 3)
    assert got.previous is not None and (got.previous.outcome, got.previous.holder) == (
        "modified", h,
    )  # fmt: skip
    assert "w2" not in waits.results
    coord.release("src/a.py", w1)
    until(lambda: "w2" in waits.results)
    assert waits.results["w2"].previous.outcome == "released"  # a plain release is told too
    coord.release("src/a.py", w2)
    waits.join()
    assert waits.results["w3"].status == "claimed"
    assert queued(coord) == 0
    order = coord.db.fetchall(
        "SELECT agent_id FROM claim_events WHERE event = 'claimed' ORDER BY id"
    )
    assert [r[0] for r in order] == [h, w1, w2, w3]


@pytest.mark.backends
def test_the_first_waiter_is_handed_a_claim_whose_holders_lease_ran_out(
    opened: Coordinators,
) -> None:
    """No release comes: the holder's TTL ends, and the oldest waiter in line gets the claim
    (told it expired, at the next fencing version), the one behind it still waits."""
    short, plain = opened(claim_ttl=0.5), opened()
    holder = short.register("holder").agent_id
    first, second = agents(plain, "first", "second")
    granted = short.claim("src/a.py", holder)
    assert granted.status == "claimed"
    waits = Waits(plain)
    started = time.monotonic()
    waits.start("first", "src/a.py", first)
    waits.start("second", "src/a.py", second, timeout=1.5)
    until(lambda: "first" in waits.results)
    got = waits.results["first"]
    assert time.monotonic() - started < 5  # woken at the lease end, not by its own timeout
    assert got.status == "claimed" and got.version is not None
    assert got.version > (granted.version or 0)
    assert got.previous is not None and (got.previous.outcome, got.previous.holder) == (
        "expired", holder,
    )  # fmt: skip
    waits.join()
    assert waits.results["second"].status == "timeout"  # still held, by the first waiter
    assert plain.status("src/a.py").holder.agent_id == first  # type: ignore[union-attr]


@pytest.mark.backends
def test_a_free_resource_is_claimed_at_once_and_a_timed_out_waiter_is_skipped(
    coord: Coordinator,
) -> None:
    coord.waiter_liveness = 1.5  # how long a timed-out wait's place is kept
    h, w1, w2 = agents(coord, "h", "w1", "w2")
    at_once = coord.wait("src/a.py", 5, agent_id=h, claim=True)
    assert (at_once.status, at_once.version, at_once.previous) == ("claimed", 1, None)
    again = coord.wait("src/a.py", 5, agent_id=h, claim=True)
    assert again.status == "already_claimed"
    no_time = coord.wait("src/b.py", 0, agent_id=h, claim=True)  # one look, and it is free
    assert no_time.status == "claimed"
    waits = Waits(coord)
    waits.start("w1", "src/a.py", w1, timeout=0.2)
    waits.start("w2", "src/a.py", w2, timeout=10)
    until(lambda: "w1" in waits.results)
    late = waits.results["w1"]
    assert late.status == "timeout" and late.holder is not None and late.holder.agent_id == h
    assert queued(coord) == 2  # w1's place is kept a moment for its next wait
    coord.release("src/a.py", h)  # w2 is handed the claim once w1's kept place ends
    waits.join()
    assert waits.results["w2"].status == "claimed"
    assert coord.status("src/a.py").holder.agent_id == w2  # type: ignore[union-attr]


@pytest.mark.backends
def test_a_waiter_whose_process_died_and_whose_lease_ended_is_skipped(
    coord: Coordinator, db_url: str, root: Path
) -> None:
    h, w1, w2 = agents(coord, "h", "w1", "w2")
    coord.claim("src/a.py", h)
    code = (
        "import sys; from agenthold.claims import Coordinator; from agenthold.store import "
        "StateStore; from agenthold.claims.names import Resolver, Workspace; "
        "c = Coordinator(StateStore(sys.argv[1]), resolver=Resolver([Workspace('default', "
        "sys.argv[2])])); c.wait('src/a.py', 60, agent_id=sys.argv[3], claim=True)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, db_url, str(root), w1], cwd=REPO, env=child_env()
    )
    try:
        until(lambda: queued(coord) == 1, timeout=30)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    waits = Waits(coord)
    waits.start("w2", "src/a.py", w2)
    coord.end_lease(w1, 0)  # what a server does for the connection of an agent that is gone
    coord.release("src/a.py", h)
    waits.join()
    assert waits.results["w2"].status == "claimed"
    assert queued(coord) == 0  # the dead waiter's row went with the hand-off


@pytest.mark.backends
def test_a_queued_writer_is_not_starved_by_new_readers(coord: Coordinator) -> None:
    r1, r2, w, late = agents(coord, "r1", "r2", "w", "late")
    coord.claim("src/a.py", r1, mode="shared")
    waits = Waits(coord)
    waits.start("w", "src/a.py", w)
    refused = coord.claim("src/a.py", r2, mode="shared")
    assert refused.status == "busy" and refused.holder is not None
    assert (refused.holder.agent_id, refused.holder.queued) == (w, True)
    # nor by a reader that waits in line behind it, nor a directory reader above it
    waits.start("reader", "src/a.py", r2, mode="shared")
    assert coord.claim("src/", late, mode="shared").status == "busy"
    assert coord.claim("src/b.py", late, mode="shared").status == "claimed"
    coord.release("src/a.py", r1)
    until(lambda: "w" in waits.results)
    assert waits.results["w"].status == "claimed" and "reader" not in waits.results
    coord.release("src/a.py", w)
    waits.join()
    assert waits.results["reader"].status == "claimed"


@pytest.mark.backends
def test_readers_at_the_head_of_the_queue_are_handed_the_claim_together(
    coord: Coordinator,
) -> None:
    w, r1, r2, w2 = agents(coord, "w", "r1", "r2", "w2")
    coord.claim("src/api/", w)
    waits = Waits(coord)
    waits.start("r1", "src/api/x.py", r1, mode="shared")
    waits.start("r2", "src/api/", r2, mode="shared")
    waits.start("w2", "src/api/x.py", w2)
    coord.release("src/api/", w)
    until(lambda: "r1" in waits.results and "r2" in waits.results)
    assert {waits.results[n].status for n in ("r1", "r2")} == {"claimed"}
    assert "w2" not in waits.results
    coord.release("src/api/x.py", r1)
    coord.release("src/api/", r2)
    waits.join()
    assert waits.results["w2"].status == "claimed"


@pytest.mark.backends
def test_a_live_waiter_whose_lease_ends_is_skipped_and_told_so(coord: Coordinator) -> None:
    h, w1, w2 = agents(coord, "h", "w1", "w2")
    coord.claim("src/a.py", h)
    waits = Waits(coord)
    waits.start("w1", "src/a.py", w1)
    waits.start("w2", "src/a.py", w2)
    coord.end_lease(w1, 0)
    coord.release("src/a.py", h)
    waits.join()
    skipped = waits.results["w1"]
    assert skipped.status == "timeout" and skipped.elapsed_seconds < 5
    assert skipped.holder is not None and skipped.holder.agent_id == w2
    assert waits.results["w2"].status == "claimed"


@pytest.mark.backends
def test_a_wait_in_line_renews_its_agents_lease(opened: Coordinators) -> None:
    coord = opened(claim_ttl=0.3)
    h, w = agents(coord, "h", "w")
    coord.claim("custom://lock", h)
    waits = Waits(coord)
    waits.start("w", "custom://lock", w)

    def hold() -> None:  # the holder keeps its own lease alive by calling, for 1 s
        for _ in range(10):
            coord.claim("custom://lock", h)
            time.sleep(0.1)
        coord.release("custom://lock", h)

    hold()
    waits.join()
    assert waits.results["w"].status == "claimed"


@pytest.mark.backends
def test_a_glob_claim_is_busy_behind_a_queued_directory_writer(coord: Coordinator) -> None:
    h, w, late = agents(coord, "h", "w", "late")
    coord.claim("src/api/x.py", h)
    waits = Waits(coord)
    waits.start("w", "src/api/", w)
    jumped = coord.claim("src/**/*.py", late, mode="shared")
    assert jumped.status == "busy" and [c.agent_id for c in jumped.conflicts] == [h, w]
    assert jumped.conflicts[1].queued and jumped.conflicts[1].held_as == "file://default/src/api/"
    coord.release("src/api/x.py", h)
    waits.join()
    assert waits.results["w"].status == "claimed"


class Interrupted(Exception):
    """What a thread-level cancellation raises inside a waiting thread, here."""


def interrupt(thread: threading.Thread) -> None:
    """Raise Interrupted in ``thread`` at its next Python instruction (the C API a debugger or
    a thread-cancelling library uses)."""
    assert thread.ident is not None
    raised = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(Interrupted)
    )
    assert raised == 1


def asleep(thread: threading.Thread) -> bool:
    """Whether ``thread`` sleeps between two looks of store.wait_until, blocked in C, where an
    exception set for it waits until it wakes."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or frame.f_code.co_name != "wait":
        return False
    while frame is not None and frame.f_code.co_name != "wait_until":
        frame = frame.f_back
    return frame is not None


def handed_events(coord: Coordinator) -> list[tuple[str, str, str | None]]:
    return coord.db.fetchall(  # type: ignore[no-any-return]
        "SELECT agent_id, event, outcome FROM claim_events "
        "WHERE event IN ('claimed', 'released') ORDER BY id"
    )


def raising_wait(
    coord: Coordinator, agent: str, mode: str = "exclusive"
) -> tuple[threading.Thread, list[BaseException]]:
    """A wait with claim for src/a.py in a thread of its own, in line once this returns; the
    list gets what it raises."""
    raised: list[BaseException] = []
    before = queued(coord)

    def run() -> None:
        try:
            coord.wait("src/a.py", 30, agent_id=agent, claim=True, mode=mode)
        except Interrupted as exc:
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    until(lambda: queued(coord) > before)
    return thread, raised


def interrupt_asleep(thread: threading.Thread) -> None:
    """Once ``thread`` sleeps between two looks, set Interrupted for it: it is raised as the
    thread wakes, before it reads what the write that woke it left."""
    time.sleep(0.2)  # let it settle, should anything have woken it
    until(lambda: asleep(thread))
    interrupt(thread)


@pytest.fixture
def untraced() -> Iterator[None]:
    """No tracer (coverage's) in this test's threads while it runs. An exception set for a
    thread is raised where the interpreter next looks for one, and a tracer adds looks of its
    own: the exception then lands before the release that should wake the thread, not as it
    wakes, which is the moment these tests are about. Lines run here are not counted."""
    before, threads_before = sys.gettrace(), threading.gettrace()
    sys.settrace(None)
    threading.settrace(None)
    try:
        yield
    finally:
        threading.settrace(threads_before)
        sys.settrace(before)


@pytest.mark.backends
@pytest.mark.usefixtures("untraced")
@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_a_wait_interrupted_as_it_is_handed_the_claim_gives_it_back(
    coord: Coordinator, mode: str
) -> None:
    """A thread-level cancellation lands in a waiting thread as a release hands it the claim:
    the wait raises, so its caller never hears of the claim. The claim goes back in the same
    transaction, and the next wait in line gets it, told what the holder before did."""
    h, w1, w2 = agents(coord, "h", "w1", "w2")
    coord.claim("src/a.py", h)
    thread, raised = raising_wait(coord, w1, mode)
    waits = Waits(coord)
    waits.start("w2", "src/a.py", w2, timeout=5)
    interrupt_asleep(thread)
    coord.release("src/a.py", h, "modified")
    thread.join(10)
    waits.join()
    assert len(raised) == 1
    got = waits.results["w2"]
    assert got.status == "claimed" and got.previous is not None
    assert (got.previous.outcome, got.previous.holder) == ("modified", h)
    assert handed_events(coord) == [
        (h, "claimed", None), (h, "released", "modified"),
        (w1, "claimed", None), (w1, "released", "released"),  # handed, then given back
        (w2, "claimed", None),
    ]  # fmt: skip
    assert coord.status("src/a.py").holder.agent_id == w2  # type: ignore[union-attr]
    assert queued(coord) == 0


@pytest.mark.backends
@pytest.mark.usefixtures("untraced")
def test_an_interrupted_wait_leaves_a_claim_its_agent_was_told_of(coord: Coordinator) -> None:
    """An agent waits twice for one resource: the first wait is handed the claim and answers;
    the second, handed it as already claimed in the same pass, is interrupted. The claim the
    first wait told the agent of stays the agent's."""
    h, w = agents(coord, "h", "w")
    coord.claim("src/a.py", h)
    waits = Waits(coord)
    waits.start("told", "src/a.py", w)
    thread, raised = raising_wait(coord, w)
    interrupt_asleep(thread)
    coord.release("src/a.py", h)
    thread.join(10)
    waits.join()
    assert len(raised) == 1 and waits.results["told"].status == "claimed"
    assert handed_events(coord)[2:] == [(w, "claimed", None)]
    assert coord.status("src/a.py").holder.agent_id == w  # type: ignore[union-attr]
    assert queued(coord) == 0


# --------------------------------------------------------------------------------------------
# Many processes, shared and exclusive, claims and queued waits: a history checker
# --------------------------------------------------------------------------------------------

UNIVERSE = ["src/a.py", "src/b.py", "src/api/c.py", "src/api/", "custom://lock"]


def check_modes(coord: Coordinator) -> int:
    """Replay the claim events in commit order: never two agents hold conflicting claims
    exclusively, nor one exclusively while another reads. Returns the grants replayed."""
    rows = coord.db.fetchall(
        "SELECT agent_id, event, uri, mode FROM claim_events "
        "WHERE event IN ('claimed', 'released') ORDER BY id"
    )
    overlap = OverlapOracle(UNIVERSE)
    held: dict[tuple[str, str], str] = {}  # (name, agent): mode
    grants = 0
    for agent, event, uri, mode in rows:
        name = uri.removeprefix("file://default/")
        if event == "released":
            assert held.pop((name, agent), None) == (mode or "exclusive"), (name, agent)
            continue
        grants += 1
        mode = mode or "exclusive"
        for (other, holder), other_mode in held.items():
            if holder == agent or "exclusive" not in (mode, other_mode):
                continue
            assert not overlap(name, other), (
                f"{name} granted {mode} to {agent} while {holder} held {other} {other_mode}"
            )
        held[(name, agent)] = mode
    return grants


@pytest.mark.backends
def test_processes_mixing_modes_and_queued_waits_never_hold_conflicting_claims(
    coord: Coordinator, db_url: str, root: Path
) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), db_url, str(root), str(seed), "30", *UNIVERSE],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=child_env(),
        )
        for seed in range(4)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    handed = sum(r["handed"] for r in reports)
    assert handed > 0 and sum(r["granted"] for r in reports) > 0
    assert sum(r["busy"] + r["timeouts"] for r in reports) > 0  # they did contend
    assert check_modes(coord) == handed + sum(r["granted"] for r in reports)
    # nothing in line but the places kept a moment for waits that timed out
    live = "SELECT count(*) FROM claim_waiters WHERE until >= ? OR granted IS NOT NULL"
    assert coord.db.fetchone(live, (coord.db.now(),))[0] == 0


# --------------------------------------------------------------------------------------------
# Through a real mcp.Client
# --------------------------------------------------------------------------------------------


pytestmark = pytest.mark.anyio


async def call(client: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    return reply_of(await client.call_tool(tool, arguments))


@pytest.fixture
async def client(coord: Coordinator) -> AsyncIterator[Any]:
    async with in_process_client(coord, tools="standard") as (_, c):
        yield c


@pytest.mark.backends
async def test_shared_claims_and_status_over_mcp(client: Any) -> None:
    r1 = (await call(client, "agenthold_register", name="r1"))["agent_id"]
    r2 = (await call(client, "agenthold_register", name="r2"))["agent_id"]
    w = (await call(client, "agenthold_register", name="w"))["agent_id"]
    one = await call(client, "agenthold_claim", resource="src/a.py", agent_id=r1, mode="shared")
    assert one == {"status": "claimed", "resource": "file://default/src/a.py", "version": 1}
    await call(client, "agenthold_claim", resource="src/a.py", agent_id=r2, mode="shared")
    busy = await call(client, "agenthold_claim", resource="src/a.py", agent_id=w)
    assert busy["status"] == "busy" and busy["mode"] == "shared"
    assert {c["held_by"] for c in busy["conflicts"]} == {r1, r2}
    assert {c["mode"] for c in busy["conflicts"]} == {"shared"}
    status = await call(client, "agenthold_status", resource="src/a.py")
    assert (status["status"], status["mode"], status["version"]) == ("claimed", "shared", 2)
    assert {h["held_by"] for h in status["holders"]} == {r1, r2}
    assert {h["agent_name"] for h in status["holders"]} == {"r1", "r2"}
    await call(client, "agenthold_claim", resource="src/b.py", agent_id=w)
    plain = await call(client, "agenthold_status", resource="src/b.py")
    assert plain["mode"] == "exclusive" and "holders" not in plain
    behind = await call(client, "agenthold_claim", resource="src/b.py", agent_id=r1, mode="shared")
    assert behind["status"] == "busy" and behind["held_by"] == w and "mode" not in behind
    released = await call(client, "agenthold_release", resource="src/a.py", agent_id=r1)
    assert (released["status"], released["version"]) == ("released", 3)


@pytest.mark.backends
async def test_a_wait_that_claims_over_mcp_is_handed_the_claim(client: Any) -> None:
    h = (await call(client, "agenthold_register", name="h"))["agent_id"]
    w = (await call(client, "agenthold_register", name="w"))["agent_id"]
    r = (await call(client, "agenthold_register", name="r"))["agent_id"]
    await call(client, "agenthold_claim", resource="src/a.py", agent_id=h)
    replies: list[dict[str, Any]] = []

    async def wait() -> None:
        replies.append(
            await call(
                client,
                "agenthold_wait",
                resource="src/a.py",
                agent_id=w,
                claim=True,
                timeout_seconds=10,
            )
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        with anyio.fail_after(10):
            while True:
                refused = await call(
                    client, "agenthold_claim", resource="src/a.py", agent_id=r, mode="shared"
                )
                if refused.get("queued"):
                    break
                await anyio.sleep(0.01)
        assert refused["queued"] == [w]
        await call(client, "agenthold_release", resource="src/a.py", agent_id=h, outcome="modified")
    (got,) = replies
    assert (got["status"], got["resource"], got["version"]) == (
        "claimed", "file://default/src/a.py", 3,
    )  # fmt: skip
    assert (got["previous_outcome"], got["previous_holder"]) == ("modified", h)
    assert got["hint"] and got["elapsed_seconds"] >= 0
    timed_out = await call(
        client, "agenthold_wait", resource="src/a.py", agent_id=h, claim=True, timeout_seconds=0.1
    )
    assert timed_out["status"] == "timeout" and timed_out["held_by"] == w
    plain = await call(client, "agenthold_wait", resource="src/a.py", timeout_seconds=0)
    assert plain["status"] == "timeout"  # without claim, as before


@pytest.mark.backends
async def test_a_cancelled_wait_over_mcp_leaves_the_queue(client: Any, coord: Coordinator) -> None:
    h = (await call(client, "agenthold_register", name="h"))["agent_id"]
    w1 = (await call(client, "agenthold_register", name="w1"))["agent_id"]
    w2 = (await call(client, "agenthold_register", name="w2"))["agent_id"]
    await call(client, "agenthold_claim", resource="src/a.py", agent_id=h)
    with anyio.move_on_after(0.3) as scope:
        await client.call_tool(
            "agenthold_wait",
            {"resource": "src/a.py", "agent_id": w1, "claim": True, "timeout_seconds": 30},
        )
    assert scope.cancelled_caught
    with anyio.fail_after(5):
        while queued(coord):
            await anyio.sleep(0.01)
    replies: list[dict[str, Any]] = []

    async def wait() -> None:
        replies.append(
            await call(
                client,
                "agenthold_wait",
                resource="src/a.py",
                agent_id=w2,
                claim=True,
                timeout_seconds=10,
            )
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        with anyio.fail_after(10):
            while not queued(coord):
                await anyio.sleep(0.01)
        await call(client, "agenthold_release", resource="src/a.py", agent_id=h)
    assert replies[0]["status"] == "claimed"
    assert replies[0]["previous_outcome"] == "released" and "hint" not in replies[0]


@contextmanager
def claims_locked(coord: Coordinator) -> Iterator[None]:
    """A write transaction in another thread that holds the claims lock until the block ends:
    every claim write waits for it meanwhile."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with coord.db.write() as (conn, _):
            coord.db.serialize(conn, CLAIMS_LOCK)
            held.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        yield
    finally:
        done.set()
        thread.join(30)


def looking(agent_id: str) -> bool:
    """Whether a thread of this process runs a queue look (Coordinator.queue_look) for
    ``agent_id``."""
    for top in sys._current_frames().values():
        frame: Any = top
        while frame is not None:
            code = frame.f_code
            if code.co_name == "queue_look" and frame.f_locals.get("agent_id") == agent_id:
                return True
            frame = frame.f_back
    return False


@pytest.mark.backends
async def test_a_wait_cancelled_over_mcp_as_it_is_handed_the_claim_gives_it_back(
    client: Any, coord: Coordinator
) -> None:
    """A release hands a queued wait the claim, and its client cancels the call while the
    write that reads the hand-off runs (held back by a transaction that holds the claims lock).
    The SDK never answers a cancelled call, so the claim goes back and the next wait in line
    gets it, told what the holder before did."""
    h, w1, w2 = agents(coord, "h", "w1", "w2")
    coord.claim("src/a.py", h)
    replies: list[dict[str, Any]] = []
    cancel = anyio.CancelScope()

    async def cancelled() -> None:
        with cancel:
            await client.call_tool(
                "agenthold_wait",
                {"resource": "src/a.py", "agent_id": w1, "claim": True, "timeout_seconds": 30},
            )

    async def wait() -> None:
        replies.append(await call(client, "agenthold_wait", resource="src/a.py", agent_id=w2,
                                  claim=True, timeout_seconds=5))  # fmt: skip

    async with anyio.create_task_group() as tg:
        for n, task in enumerate((cancelled, wait), 1):
            tg.start_soon(task)
            with anyio.fail_after(10):
                while queued(coord) < n:
                    await anyio.sleep(0.01)
        await anyio.sleep(0.1)  # w1 looks again when w2 joins the line behind it
        coord.release("src/a.py", h, "modified")  # no await until the lock is held
        with claims_locked(coord):
            with anyio.fail_after(10):  # woken by the release, w1's look waits for the lock
                while not looking(w1):
                    await anyio.sleep(0.01)
            cancel.cancel()
            await anyio.sleep(0.3)  # the cancel reaches the server while the look waits
    (got,) = replies
    assert got["status"] == "claimed"
    assert (got["previous_outcome"], got["previous_holder"]) == ("modified", h)
    assert handed_events(coord)[2:] == [
        (w1, "claimed", None), (w1, "released", "released"), (w2, "claimed", None),
    ]  # fmt: skip
    status = await call(client, "agenthold_status", resource="src/a.py")
    assert status["held_by"] == w2 and queued(coord) == 0


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"resource": "src/a.py", "mode": "read"}, "one of"),
        ({"resource": "src/a.py", "mode": 3}, "must be"),
    ],
)
async def test_a_bad_mode_over_mcp_is_an_error_with_a_hint(
    client: Any, arguments: dict[str, Any], said: str
) -> None:
    agent = (await call(client, "agenthold_register", name="x"))["agent_id"]
    result = await client.call_tool("agenthold_claim", {**arguments, "agent_id": agent})
    reply = reply_of(result)
    assert result.is_error and reply["status"] == "error" and said in reply["message"], reply
    assert reply["hint"]


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"claim": True}, "needs agent_id"),
        ({"agent_id": "AGENT"}, "add claim true"),
        ({"mode": "shared"}, "add claim true"),
        ({"claim": True, "agent_id": "AGENT", "mode": "both"}, "one of"),
        ({"claim": "yes", "agent_id": "AGENT"}, "must be a boolean"),
        ({"claim": True, "agent_id": "agent-0123456789abcdef"}, "unknown agent_id"),
    ],
)
async def test_bad_waits_that_claim_over_mcp_are_errors_with_hints(
    client: Any, coord: Coordinator, arguments: dict[str, Any], said: str
) -> None:
    agent = (await call(client, "agenthold_register", name="x"))["agent_id"]
    arguments = {k: agent if v == "AGENT" else v for k, v in arguments.items()}
    result = await client.call_tool(
        "agenthold_wait", {"resource": "src/a.py", "timeout_seconds": 1, **arguments}
    )
    reply = reply_of(result)
    assert result.is_error and said in reply["message"], reply
    assert reply["hint"]
    assert queued(coord) == 0


# --------------------------------------------------------------------------------------------
# Two server processes on one database
# --------------------------------------------------------------------------------------------


def stdio(db: str, root: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "agenthold", "--db", db, "--workspace", f"default={root}"],
        cwd=str(root),
        env=child_env(),
    )


@asynccontextmanager
async def server(db: str, root: Path) -> AsyncIterator[Client]:
    async with Client(stdio(db, root), read_timeout_seconds=60) as c:  # type: ignore[arg-type]
        yield c


@pytest.mark.backends
@pytest.mark.usefixtures("stdio_path")  # also as two sessions of one warm server
async def test_hand_off_is_in_arrival_order_across_two_server_processes(
    coord: Coordinator, db_url: str, root: Path
) -> None:
    h = coord.register("h").agent_id
    coord.claim("src/a.py", h)
    async with server(db_url, root) as one, server(db_url, root) as two:
        names = [("w1", one), ("w2", two), ("w3", one), ("w4", two)]
        ids = {n: (await call(c, "agenthold_register", name=n))["agent_id"] for n, c in names}
        order: list[str] = []
        replies: dict[str, dict[str, Any]] = {}

        async def wait(name: str, c: Client) -> None:
            got = await call(c, "agenthold_wait", resource="src/a.py", agent_id=ids[name],
                             claim=True, timeout_seconds=60)  # fmt: skip
            order.append(name)
            replies[name] = got
            await call(c, "agenthold_release", resource="src/a.py", agent_id=ids[name],
                       outcome="modified")  # fmt: skip

        async with anyio.create_task_group() as tg:
            for n, (name, c) in enumerate(names):
                tg.start_soon(wait, name, c)
                with anyio.fail_after(30):  # each joins the queue before the next one starts
                    while queued(coord) <= n:
                        await anyio.sleep(0.01)
            coord.release("src/a.py", h)
    assert order == ["w1", "w2", "w3", "w4"]
    assert [replies[n]["version"] for n in order] == [3, 5, 7, 9]
    assert replies["w1"]["previous_holder"] == h
    assert [replies[n]["previous_holder"] for n in order[1:]] == [ids[n] for n in order[:-1]]
    assert {replies[n]["previous_outcome"] for n in order[1:]} == {"modified"}
    assert queued(coord) == 0
