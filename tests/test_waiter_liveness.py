"""Tests for issue 27's "claims handed to waiters that will never use them", on both backends: a
queued wait is alive only while its waiter keeps looking (``alive_until``), a claim handed to a
row nobody reads goes back, a waiter whose process was SIGKILLed or whose token was revoked is
handed nothing it keeps, and an agent's own claim of what its wait was handed survives the
wait's cancel.

A wait whose server answered "unavailable" (the database down) and could not take its row out
leaves exactly what ``one_look`` leaves: a row that nobody looks after any more. The database
outage itself is not re-enacted here (PostgreSQL is shared by the suite's workers).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import (
    Coordinators,
    StdioPipes,
    agenthold_args,
    another_process_holds_the_write_lock,
    in_process_client,
    reply_of,
    token_server,
)
from test_claim_queue import Waits, agents, queued, until

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.claims.records import Unheard
from agenthold.claims.schema import CLAIMS_SCHEMA
from agenthold.claims.write import LIVENESS
from agenthold.identity.principals import TokenTable, add_token, revoke
from agenthold.store import AgentholdError, StateStore

SHORT = 1.5  # seconds: the liveness of the library tests' queued rows (a look every 0.5 s)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "src").mkdir(parents=True)
    return path


@pytest.fixture
def coord(opened: Coordinators) -> Coordinator:
    """A Coordinator whose queued waits are kept SHORT seconds between looks."""
    return opened(waiter_liveness=SHORT)


def alive_until(coord: Coordinator, seq: int) -> float:
    return float(
        coord.db.fetchone("SELECT alive_until FROM claim_waiters WHERE seq = ?", (seq,))[0]
    )


def past(coord: Coordinator, when: float) -> None:
    """Wait until the database's clock is past ``when``."""
    until(lambda: coord.db.now() > when, timeout=30)


def events_of(coord: Coordinator, agent_id: str) -> list[tuple[str, str | None]]:
    rows = coord.db.fetchall(
        "SELECT event, outcome FROM claim_events WHERE agent_id = ? AND resource IS NOT NULL "
        "ORDER BY id",
        (agent_id,),
    )
    return [(r[0], r[1]) for r in rows]


@pytest.mark.backends
def test_a_queued_wait_nobody_looks_after_is_dropped_not_handed_the_claim(
    coord: Coordinator,
) -> None:
    """The row of a wait that ended without leaving (its answer was "unavailable") dies once
    its waiter stops renewing it: the next release hands it nothing."""
    h, w = agents(coord, "h", "w")
    coord.claim("src/a.py", h)
    step = coord.queue_look(coord.target("src/a.py"), w, "exclusive", None, 60)
    assert step.result is None and queued(coord) == 1
    past(coord, alive_until(coord, step.seq))
    released = coord.release("src/a.py", h)
    assert released.status == "released"
    assert coord.status("src/a.py").status == "available"
    assert queued(coord) == 0 and events_of(coord, w) == []


@pytest.mark.backends
def test_a_claim_handed_to_a_waiter_that_never_reads_it_goes_back(coord: Coordinator) -> None:
    """A release hands the claim to a row whose waiter then never looks (it died just after
    its last look): once the row's liveness passes, the claim goes back, and the next waiter
    in line is handed it with what the holder before left, without anyone else writing."""
    h, w, x = agents(coord, "h", "w", "x")
    coord.claim("src/a.py", h)
    step = coord.queue_look(coord.target("src/a.py"), w, "exclusive", None, 60)
    coord.release("src/a.py", h, "modified")
    held = coord.status("src/a.py")
    assert held.holder is not None and held.holder.agent_id == w  # handed, unheard
    waits = Waits(coord)
    waits.start("x", "src/a.py", x, timeout=30)
    waits.join()
    got = waits.results["x"]
    assert got.status == "claimed" and got.previous is not None
    assert (got.previous.outcome, got.previous.holder) == ("modified", h)
    assert events_of(coord, w) == [("claimed", None), ("released", "released")]
    assert (
        coord.db.fetchone("SELECT count(*) FROM claim_waiters WHERE seq = ?", (step.seq,))[0] == 0
    )


@pytest.mark.slow  # waits out several liveness periods
@pytest.mark.backends
def test_a_waiter_that_keeps_looking_stays_in_line_past_its_liveness(coord: Coordinator) -> None:
    h, w = agents(coord, "h", "w")
    coord.claim("src/a.py", h)
    waits = Waits(coord)
    waits.start("w", "src/a.py", w, timeout=30)
    start = coord.db.now()
    past(coord, start + 3 * SHORT)  # three liveness periods: only its renewals keep it
    assert "w" not in waits.results and queued(coord) == 1
    coord.release("src/a.py", h)
    waits.join()
    assert waits.results["w"].status == "claimed"


@pytest.mark.backends
def test_an_agents_own_claim_of_what_its_wait_was_handed_survives_the_waits_cancel(
    coord: Coordinator,
) -> None:
    """The agent claims R itself while its wait with claim on R is queued, and is told
    "already_claimed" of the claim the queue had just handed its wait: the wait, cancelled, must
    not give back a claim the agent was told it holds."""
    h, w = agents(coord, "h", "w")
    coord.claim("src/a.py", h)
    target = coord.target("src/a.py")
    step = coord.queue_look(target, w, "exclusive", None, 60)
    coord.release("src/a.py", h)  # handed to the wait, which has not read it yet
    own = coord.claim("src/a.py", w)
    assert own.status == "already_claimed"
    assert coord.leave_queue(step.seq, Unheard(target, w, "exclusive")) is None
    held = coord.status("src/a.py")
    assert held.holder is not None and held.holder.agent_id == w
    assert events_of(coord, w) == [("claimed", None)]
    # and without its own claim in between, the cancel still gives the handed claim back
    coord.release("src/a.py", w)
    coord.claim("src/a.py", h)
    step = coord.queue_look(target, w, "exclusive", None, 60)
    coord.release("src/a.py", h)
    coord.leave_queue(step.seq, Unheard(target, w, "exclusive"))
    assert coord.status("src/a.py").status == "available"


@pytest.mark.backends
def test_a_cold_stdio_server_killed_in_line_is_handed_nothing_it_keeps(
    opened: Coordinators, db_url: str, root: Path, tmp_path: Path
) -> None:
    """With default settings: a stdio server waiting in line is SIGKILLed, the holder releases
    at once (the claim is handed to the dead waiter), and a third agent waiting with claim gets
    it within about one liveness period, not never."""
    coord = opened(waiter_liveness=LIVENESS)
    h, w, x = agents(coord, "h", "w", "x")
    coord.claim("src/a.py", h)
    pipes = StdioPipes([sys.executable, *agenthold_args(db_url, root, "--no-warm")], tmp_path)
    try:
        pipes.handshake("killed-waiter")
        arguments = {"resource": "src/a.py", "agent_id": w, "claim": True, "timeout_seconds": 120}
        line = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "agenthold_wait", "arguments": arguments}}  # fmt: skip
        pipes.send(json.dumps(line))
        until(lambda: queued(coord) == 1, timeout=30)
    finally:
        os.kill(pipes.proc.pid, signal.SIGKILL)
        pipes.close()
    coord.release("src/a.py", h)
    waits = Waits(coord)
    started = coord.db.now()
    waits.start("x", "src/a.py", x, timeout=60)
    waits.join()
    got = waits.results["x"]
    assert got.status == "claimed"
    assert coord.db.now() - started < 3 * LIVENESS  # generous: one liveness and a look
    assert ("released", "released") in events_of(coord, w)  # what it was handed went back


@pytest.mark.backends
@pytest.mark.anyio
async def test_a_waiter_whose_token_is_revoked_is_handed_no_claim_it_keeps(
    tmp_path: Path, db_url: str, root: Path
) -> None:
    """alice waits in line over HTTP; her token is revoked; a release by another process (which
    knows no tokens) hands her wait the claim: her wait ends with a "forbidden" error and the
    claim goes back, so bob can claim it."""
    resolver = Resolver([Workspace("default", str(root))])
    scoped: dict[str, list[str] | None] = {"alice": None, "bob": None}
    async with token_server(tmp_path, scoped, tools="standard", resolver=resolver, db=db_url) as s:
        with StateStore(db_url) as store:
            other = Coordinator(store, resolver=resolver)
            h = other.register("h").agent_id
            other.claim("src/a.py", h)
            async with s.client("alice", "auto") as alice, s.client("bob", "auto") as bob:
                w = reply_of(await alice.call_tool("agenthold_register", {"name": "w"}))
                b = reply_of(await bob.call_tool("agenthold_register", {"name": "b"}))
                replies: list[dict[str, Any]] = []

                async def wait() -> None:
                    args = {"resource": "src/a.py", "agent_id": w["agent_id"], "claim": True,
                            "timeout_seconds": 60}  # fmt: skip
                    replies.append(reply_of(await alice.call_tool("agenthold_wait", args)))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    with anyio.fail_after(30):
                        while queued(other) == 0:
                            await anyio.sleep(0.01)
                    assert revoke(s.auth_file, "alice") == 1
                    other.release("src/a.py", h)
            (answer,) = replies
            assert answer["status"] == "error" and answer["error"] == "forbidden", answer
            assert "revoked" in answer["message"] and answer["hint"]
            assert other.status("src/a.py").status == "available"
            assert queued(other) == 0
            claimed = other.claim("src/a.py", b["agent_id"])
            assert claimed.status == "claimed"


@pytest.mark.backends
def test_the_queue_drops_the_waits_of_a_principal_no_longer_known(coord: Coordinator) -> None:
    """A server that knows the tokens hands nothing to a wait whose principal lost its token,
    and gives back what another server handed it."""
    gone: set[str] = set()
    coord.principal_live = lambda name: name not in gone
    h = coord.register("h").agent_id
    w1 = coord.register("w1", principal="alice").agent_id
    w2 = coord.register("w2", principal="carol").agent_id
    coord.claim("src/a.py", h)
    coord.claim("src/b.py", h)
    s1 = coord.queue_look(coord.target("src/a.py"), w1, "exclusive", None, 60, principal="alice")
    s2 = coord.queue_look(coord.target("src/b.py"), w2, "exclusive", None, 60, principal="carol")
    coord.release("src/b.py", h)  # handed to carol's wait
    gone.update({"alice", "carol"})
    coord.release("src/a.py", h)
    assert coord.status("src/a.py").status == "available"
    assert coord.status("src/b.py").status == "available"  # given back
    assert queued(coord) == 0
    assert events_of(coord, w2) == [("claimed", None), ("released", "released")]
    # the dropped waits' next looks end them: a principal that is gone does not join again
    for w, resource, p, seq in (
        (w1, "src/a.py", "alice", s1.seq),
        (w2, "src/b.py", "carol", s2.seq),
    ):
        late = coord.queue_look(coord.target(resource), w, "exclusive", seq, 60, principal=p)
        assert not late.in_line and late.result is None
    assert queued(coord) == 0


def test_a_claims_schema_of_version_6_migrates_and_keeps_its_queued_rows(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A database from before the liveness column opens; a row it left (no alive_until) lives
    until its own deadline, as it did."""
    path = tmp_path / "old.db"
    with StateStore(path) as store:
        old = Coordinator(store)
        h, w = old.register("h").agent_id, old.register("w").agent_id
        old.claim("custom://lock", h)
    # Back to version 6: without the columns of versions 7 (liveness) and 8 (an agent's host).
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP INDEX agents_by_host; ALTER TABLE agents DROP COLUMN host; "
        "ALTER TABLE claim_waiters DROP COLUMN alive_until; "
        "UPDATE agenthold_components SET version = 6 WHERE component = 'claims';"
    )
    conn.execute(
        "INSERT INTO claim_waiters (resource, uri, agent_id, mode, since, until) "
        "VALUES ('custom://lock', 'custom://lock', ?, 'exclusive', 'x', 4e9)",
        (w,),
    )
    conn.commit()
    conn.close()
    with StateStore(path) as store:
        new = Coordinator(store)
        version = "SELECT version FROM agenthold_components WHERE component = 'claims'"
        assert store.db.fetchone(version)[0] == CLAIMS_SCHEMA.version
        new.release("custom://lock", h)
        held = new.status("custom://lock")
        assert held.holder is not None and held.holder.agent_id == w  # its deadline is ahead


def first_in_line(coord: Coordinator) -> str:
    return str(coord.db.fetchone("SELECT agent_id FROM claim_waiters ORDER BY seq LIMIT 1")[0])


@pytest.mark.backends
def test_a_timed_out_wait_keeps_its_place_for_its_agents_next_wait(
    opened: Coordinators,
) -> None:
    coord = opened(
        waiter_liveness=5.0
    )  # the place is kept 5 s: the next wait comes well within that
    h, w1, w2 = agents(coord, "h", "w1", "w2")
    coord.claim("src/a.py", h)
    timed_out = coord.wait("src/a.py", 0.1, agent_id=w1, claim=True)
    assert timed_out.status == "timeout" and queued(coord) == 1
    waits = Waits(coord)
    waits.start("w2", "src/a.py", w2, timeout=30)
    behind = coord.claim("src/a.py", w2)  # the kept place is in line: nobody jumps it
    assert behind.status == "busy" and behind.holder is not None
    assert behind.holder.agent_id == h
    seq = coord.db.fetchone("SELECT min(seq) FROM claim_waiters")[0]
    back = threading.Thread(
        target=lambda: waits.results.update(w1=coord.wait("src/a.py", 30, agent_id=w1, claim=True))
    )
    back.start()
    waits.threads.append(back)
    live = "SELECT count(*) FROM claim_waiters WHERE seq = ? AND until > ?"
    until(lambda: coord.db.fetchone(live, (seq, coord.db.now()))[0] == 1)  # its place back
    assert queued(coord) == 2 and first_in_line(coord) == w1
    coord.release("src/a.py", h)
    until(lambda: "w1" in waits.results)
    assert waits.results["w1"].status == "claimed" and "w2" not in waits.results
    coord.release("src/a.py", w1)
    waits.join()
    assert waits.results["w2"].status == "claimed"


@pytest.mark.backends
def test_a_kept_place_nobody_comes_back_for_ends_and_the_next_waiter_goes(
    coord: Coordinator,
) -> None:
    h, w1, w2 = agents(coord, "h", "w1", "w2")
    coord.claim("src/a.py", h)
    assert coord.wait("src/a.py", 0.1, agent_id=w1, claim=True).status == "timeout"
    waits = Waits(coord)
    waits.start("w2", "src/a.py", w2, timeout=30)
    coord.release("src/a.py", h)  # w1's kept place is first: handed nothing, it holds w2
    waits.join()
    assert waits.results["w2"].status == "claimed"
    assert events_of(coord, w1) == [] and queued(coord) == 0
    # a wait for another mode or target does not take the place: it joins the end
    coord.release("src/a.py", w2)


@pytest.mark.backends
@pytest.mark.anyio
async def test_a_wait_over_mcp_that_times_out_keeps_its_place_for_the_next_call(
    opened: Coordinators,
) -> None:
    coord = opened(waiter_liveness=5.0)
    h, w2 = agents(coord, "h", "w2")
    coord.claim("src/a.py", h)
    async with in_process_client(coord, tools="standard") as (_, client):
        w = reply_of(await client.call_tool("agenthold_register", {"name": "w"}))["agent_id"]
        args = {"resource": "src/a.py", "agent_id": w, "claim": True, "timeout_seconds": 0.1}
        first = reply_of(await client.call_tool("agenthold_wait", args))
        assert first["status"] == "timeout" and queued(coord) == 1
        seq = coord.db.fetchone("SELECT seq FROM claim_waiters")[0]
        waits = Waits(coord)
        waits.start("w2", "src/a.py", w2, timeout=30)
        replies: list[dict[str, Any]] = []

        async def wait_again() -> None:
            again = {**args, "timeout_seconds": 30}
            replies.append(reply_of(await client.call_tool("agenthold_wait", again)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_again)
            with anyio.fail_after(30):  # its row is live again, still first
                while (
                    coord.db.fetchone(
                        "SELECT count(*) FROM claim_waiters WHERE seq = ? AND until > ?",
                        (seq, coord.db.now()),
                    )[0]
                    == 0
                ):
                    await anyio.sleep(0.01)
            coord.release("src/a.py", h)
        assert replies[0]["status"] == "claimed"
        coord.release("src/a.py", w)
        await anyio.to_thread.run_sync(waits.join)
        assert waits.results["w2"].status == "claimed"


@pytest.mark.anyio
async def test_a_wait_answered_unavailable_leaves_no_row_that_a_release_hands_the_claim(
    tmp_path: Path, root: Path
) -> None:
    """The database stops taking writes while a wait with claim is in line over MCP (another
    process holds SQLite's write lock): the wait answers "unavailable" and cannot take its row
    out. Once writes work again, the holder's release hands the row nothing: the claim is free
    and the agent holds nothing it never heard of."""
    path = tmp_path / "outage.db"
    with StateStore(path, busy_timeout=0.2) as store:
        coord = Coordinator(store, resolver=Resolver([Workspace("default", str(root))]))
        coord.waiter_liveness = SHORT
        h, w = agents(coord, "h", "w")
        coord.claim("src/a.py", h)
        async with in_process_client(coord, tools="standard") as (_, client):
            replies: list[dict[str, Any]] = []

            async def wait() -> None:
                args = {"resource": "src/a.py", "agent_id": w, "claim": True,
                        "timeout_seconds": 60}  # fmt: skip
                replies.append(reply_of(await client.call_tool("agenthold_wait", args)))

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                with anyio.fail_after(30):
                    while queued(coord) == 0:
                        await anyio.sleep(0.01)
                with another_process_holds_the_write_lock(path):
                    with anyio.fail_after(30):  # its next look (within SHORT / 3) fails
                        while not replies:
                            await anyio.sleep(0.01)
            (answer,) = replies
            assert answer["status"] == "unavailable", answer
            assert queued(coord) == 1  # its row stayed: the lock refused its leaving too
            # the server's next write that works takes it out, long before its liveness ends
            reply_of(await client.call_tool("agenthold_register", {"name": "next"}))
            assert queued(coord) == 0
            coord.release("src/a.py", h)
            assert coord.status("src/a.py").status == "available"
            assert events_of(coord, w) == []


@pytest.mark.anyio
async def test_a_deferred_write_refused_again_is_kept_and_one_past_its_time_is_dropped(
    tmp_path: Path, root: Path
) -> None:
    """What write_later keeps: a write refused again waits for the next write that succeeds;
    one whose time is up is not run at all."""
    with StateStore(tmp_path / "later.db") as store:
        coord = Coordinator(store, resolver=Resolver([Workspace("default", str(root))]))
        async with in_process_client(coord, tools="standard") as (app, client):
            tries: list[int] = []
            late: list[int] = []

            def refused_once() -> None:
                tries.append(1)
                if len(tries) == 1:
                    raise AgentholdError("the database refused it again")

            app.write_later(refused_once, 60)
            app.write_later(lambda: late.append(1), 0)  # its time is up at once
            reply_of(await client.call_tool("agenthold_register", {"name": "a"}))
            assert tries == [1] and late == []
            reply_of(await client.call_tool("agenthold_register", {"name": "b"}))
            assert tries == [1, 1] and late == []
            reply_of(await client.call_tool("agenthold_register", {"name": "c"}))
            assert tries == [1, 1]  # done: not run again


def test_a_token_table_knows_a_principal_until_a_readable_file_drops_it(tmp_path: Path) -> None:
    """What the queue asks of a token file (TokenTable.knows): a revoked principal is no longer
    known; a file that cannot be read says nothing either way, so waits in line go on."""
    path = tmp_path / "tokens.json"
    add_token(path, "alice")
    add_token(path, "bob")
    table = TokenTable(path)
    assert table.knows("alice") and table.knows("bob") and not table.knows("carol")
    revoke(path, "alice")
    assert not table.knows("alice") and table.knows("bob")
    path.write_text("{ not json")
    assert table.knows("alice") and table.knows("bob")


@pytest.mark.backends
def test_a_plain_wait_is_not_kept_waiting_by_a_claim_handed_to_a_waiter_that_never_reads_it(
    coord: Coordinator,
) -> None:
    """A wait without claim only reads; the claim handed to a dead waiter must still go back
    for it once that waiter's liveness passes, not when some other agent next writes a claim
    (nobody may: the plain waiter would see a holder until its own timeout)."""
    h, w, x = agents(coord, "h", "w", "x")
    coord.claim("src/a.py", h)
    coord.queue_look(coord.target("src/a.py"), w, "exclusive", None, 60)
    coord.release("src/a.py", h, "modified")
    held = coord.status("src/a.py")
    assert held.holder is not None and held.holder.agent_id == w  # handed, unheard
    got = coord.wait("src/a.py", timeout=120)  # x only waits for it to be free
    assert got.status == "available"
    assert events_of(coord, w) == [("claimed", None), ("released", "released")]
    assert x


@pytest.mark.backends
@pytest.mark.anyio
async def test_a_plain_wait_over_mcp_gets_back_a_claim_handed_to_a_waiter_that_never_reads_it(
    coord: Coordinator,
) -> None:
    h, w = agents(coord, "h", "w")
    coord.claim("src/a.py", h)
    coord.queue_look(coord.target("src/a.py"), w, "exclusive", None, 60)
    coord.release("src/a.py", h, "modified")
    held = coord.status("src/a.py")
    assert held.holder is not None and held.holder.agent_id == w  # handed, unheard
    async with in_process_client(coord, tools="standard") as (_, client):
        args = {"resource": "src/a.py", "timeout_seconds": 120}
        got = reply_of(await client.call_tool("agenthold_wait", args))
    assert got["status"] == "available"
    assert events_of(coord, w) == [("claimed", None), ("released", "released")]


@pytest.mark.backends
def test_a_waiter_dropped_for_looking_late_joins_again_instead_of_ending_early(
    coord: Coordinator,
) -> None:
    """A live waiter whose next look came after its row's liveness (a loaded machine, a stalled
    process) lost its place when another write served the queue; its wait, with time left, goes
    on at the end of the line instead of answering before its timeout."""
    h, w, x = agents(coord, "h", "w", "x")
    coord.claim("src/a.py", h)
    target = coord.target("src/a.py")
    first = coord.queue_look(target, w, "exclusive", None, 600)
    past(coord, alive_until(coord, first.seq))
    assert coord.claim("src/b.py", x).status == "claimed"  # a claim write serves the queue
    assert queued(coord) == 0  # the late waiter's row was dropped
    late = coord.queue_look(target, w, "exclusive", first.seq, 500)
    assert late.in_line and late.result is None and late.seq != first.seq
    assert queued(coord) == 1
    coord.release("src/a.py", h)
    got = coord.queue_look(target, w, "exclusive", late.seq, 500)
    assert got.result is not None and got.result.status == "claimed"
