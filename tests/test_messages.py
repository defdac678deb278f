"""The message bus (agenthold.bus.messagebus): the AgentMsgs examples as written, its guarantees
(sequences, visibility order, crashes, pushed waits) and a clear error for every bad input.

Everything runs on real databases with real threads and processes: the ``bus`` fixture's tests on
SQLite in memory, on a SQLite file and on a PostgreSQL schema; the contract tests marked
``backends`` on a SQLite file and on PostgreSQL; the rest (SQLite-only behaviour) on SQLite.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import REPO, LineProcess, child_env, run_threads

from agenthold.bus import messagebus as messages
from agenthold.bus.schema import MESSAGES_SCHEMA
from agenthold.claims import Coordinator, UnknownAgentError
from agenthold.messages import (
    DEFAULT_POLL_LIMIT,
    MAX_POLL_LIMIT,
    BusAgent,
    ForeignBusAgentError,
    MessageBus,
    NameTakenError,
    NotParticipantError,
    TooFewParticipantsError,
    UnknownThreadError,
)
from agenthold.store import SCHEMA_VERSION as store_schema
from agenthold.store import Component, IncompatibleDatabaseError, InvalidInputError, StateStore

BUS_WORKER = REPO / "tests" / "helpers" / "bus_worker.py"
BENCH = REPO / "bench" / "perf" / "messages_bench.py"
posix_only = pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")


@pytest.fixture(params=["memory", "file", "postgresql"])
def bus(request: pytest.FixtureRequest, db_path: Path) -> Iterator[MessageBus]:
    """A bus on a private in-memory database, on a fresh file, and on a new PostgreSQL schema:
    every test that takes it is a contract test of all three."""
    where: str | Path = {"memory": ":memory:", "file": db_path}.get(request.param, "")
    if request.param == "postgresql":
        where = str(request.getfixturevalue("pg_url"))
    with MessageBus(where) as b:
        yield b


@pytest.fixture
def pair(bus: MessageBus) -> tuple[MessageBus, BusAgent, BusAgent, str]:
    alice = bus.get_or_create_agent("Alice")
    bob = bus.get_or_create_agent("Bob")
    return bus, alice, bob, bus.create_thread(alice, bob).id


def worker(*args: str) -> LineProcess:
    return LineProcess(
        [sys.executable, str(BUS_WORKER), *args], env=child_env(), stderr=subprocess.PIPE
    )


# --------------------------------------------------------------------------------------------
# The spec's examples, as written (only the imports adapted)
# --------------------------------------------------------------------------------------------

IMPORTS = """
from agenthold.messages import MessageBus as App
from agenthold.store import StateStore as SQLiteStore
InMemoryStore = lambda: SQLiteStore(":memory:")
"""

QUICK_START = """
app = App(store=InMemoryStore())

alice = app.get_or_create_agent("Alice")
bob = app.get_or_create_agent("Bob")
thread = app.create_thread(alice, bob)

app.append(thread.id, alice, "Hello from Alice")
messages = app.poll(thread.id)

for message in messages:
    print(message.seq, message.sender.name, message.content)

app.mark_read(thread.id, bob, messages[-1].seq)
assert app.has_unread(thread.id, bob) is False
"""

PERSISTENT = """
from pathlib import Path

app = App(store=SQLiteStore(Path(".agentmsgs.db")))
"""

CONCEPTS = """
alice = app.get_or_create_agent("Alice")
bob = app.get_or_create_agent("Bob")
thread = app.create_thread(alice, bob)
message = app.append(thread.id, alice, "Starting work")
assert message.seq == 1
messages = app.poll(thread.id, after_seq=message.seq)
app.mark_read(thread.id, bob, message.seq)

info = app.get_thread_info(thread.id)
state = app.get_thread_read_state(thread.id, bob)

if info is not None and info.message_count:
    print("Message count:", info.message_count)

if state is not None and state.unread_from_others_count:
    print("Bob has unread messages from other agents")
"""


def run_example(code: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_quick_start_runs_as_written_in_memory(tmp_path: Path) -> None:
    assert run_example(IMPORTS + QUICK_START, tmp_path) == "1 Alice Hello from Alice\n"


def test_the_examples_run_as_written_on_a_file_and_persist(tmp_path: Path) -> None:
    out = run_example(IMPORTS + PERSISTENT + CONCEPTS, tmp_path)
    assert out == "Message count: 1\n"
    again = run_example(IMPORTS + PERSISTENT + CONCEPTS, tmp_path)  # same names, a new thread
    assert again == "Message count: 1\n"
    with MessageBus(tmp_path / ".agentmsgs.db") as bus:
        assert len(bus.list_agents()) == 2
        assert len(bus.find_threads("Alice", "Bob")) == 2


def test_the_examples_run_on_an_in_memory_bus(tmp_path: Path) -> None:
    out = run_example(IMPORTS + "app = App(store=InMemoryStore())\n" + CONCEPTS, tmp_path)
    assert out == "Message count: 1\n"


# --------------------------------------------------------------------------------------------
# Agents and threads
# --------------------------------------------------------------------------------------------


def test_get_or_create_agent_reuses_a_name_and_create_agent_refuses_it(bus: MessageBus) -> None:
    alice = bus.get_or_create_agent("Alice")
    assert bus.get_or_create_agent("Alice") == alice
    assert uuid.UUID(alice.id)
    with pytest.raises(NameTakenError, match=r"agent name taken.*get_or_create_agent") as info:
        bus.create_agent("Alice")
    assert isinstance(info.value, ValueError) and info.value.hint
    assert bus.create_agent("alice").id != alice.id  # names are case-sensitive


def test_threads_have_their_own_ids_and_may_repeat_participants(pair: Any) -> None:
    bus, alice, bob, tid = pair
    other = bus.create_thread(bob, alice)
    assert other.id != tid and uuid.UUID(other.id)
    assert [t.id for t in bus.find_threads(alice, bob)] == [tid, other.id]
    carol = bus.get_or_create_agent("Carol")
    assert bus.find_threads(alice, carol) == []
    assert bus.find_threads("nobody") == []
    assert len(bus.find_threads()) == 2
    thread = bus.get_thread(tid)
    assert thread is not None and thread.participants == (alice, bob)
    assert bus.get_thread(str(uuid.uuid4())) is None
    assert bus.get_thread(uuid.UUID(tid)) == thread  # a uuid.UUID works as well as its text
    assert bus.get_thread(thread) == thread  # and so does the record
    assert bus.get_thread(tid.upper()) == thread  # any spelling of the UUID


def test_join_and_leave_thread(pair: Any) -> None:
    bus, alice, bob, tid = pair
    carol = bus.get_or_create_agent("Carol")
    bus.append(tid, alice, "one")
    thread = bus.join_thread(tid, carol)
    assert [a.name for a in thread.participants] == ["Alice", "Bob", "Carol"]
    assert bus.join_thread(tid, "Carol") == thread  # joining again changes nothing
    assert bus.has_unread(tid, carol)  # a newcomer's cursor starts at 0
    bus.append(tid, carol, "hello")
    assert [a.name for a in bus.leave_thread(tid, carol).participants] == ["Alice", "Bob"]
    with pytest.raises(NotParticipantError, match=r"sender not in thread.*join_thread"):
        bus.append(tid, carol, "again")
    with pytest.raises(NotParticipantError, match="not a participant"):
        bus.leave_thread(tid, carol)
    bus.leave_thread(tid, bob)  # a thread may drop below two participants; it keeps its messages
    assert bus.poll(tid)[-1].content == "hello"


def test_join_thread_with_create_makes_the_agent_only_when_the_join_succeeds(pair: Any) -> None:
    bus, alice, _, tid = pair
    with pytest.raises(UnknownThreadError):
        bus.join_thread(str(uuid.uuid4()), "Dora", create=True)
    assert bus.get_agent("Dora") is None  # the failed join left no agent behind
    with pytest.raises(UnknownAgentError):
        bus.join_thread(tid, "Dora")  # without create, an unknown name is not made
    assert bus.get_agent("Dora") is None
    thread = bus.join_thread(tid, "Dora", create=True)
    dora = bus.get_agent("Dora")
    assert dora is not None and dora in thread.participants
    assert bus.join_thread(tid, "Dora", create=True) == thread  # again: the same agent, no change
    with pytest.raises(ForeignBusAgentError):  # and it is the trusted caller's, not adoptable
        bus.join_thread(tid, "Dora", principal="mallory", create=True)
    assert alice in thread.participants


def test_delete_agent_keeps_its_messages_and_frees_its_name(pair: Any) -> None:
    bus, alice, bob, tid = pair
    bus.append(tid, bob, "from bob")
    assert bus.delete_agent(bob) == bob
    thread = bus.get_thread(tid)
    assert thread is not None and thread.participants == (alice,)
    [message] = bus.poll(tid)
    assert message.sender == bob and message.content == "from bob"
    assert bus.get_agent("Bob") is None
    new_bob = bus.get_or_create_agent("Bob")
    assert new_bob.id != bob.id
    with pytest.raises(NotParticipantError):
        bus.has_unread(tid, new_bob)  # the new Bob is not the old one: no membership, no cursor
    with pytest.raises(UnknownAgentError, match="unknown agent"):
        bus.delete_agent(bob)


def test_the_message_count_stays_the_row_count_when_agents_leave_or_are_deleted(
    pair: Any,
) -> None:
    """thread_info's count is the thread's counter, not a count(*): true only because no path
    but delete_thread removes messages. Leaving and deleting agents keep theirs."""
    bus, alice, bob, tid = pair
    carol = bus.get_or_create_agent("Carol")
    bus.join_thread(tid, carol)
    for agent in (alice, bob, carol, bob):
        bus.append(tid, agent, f"from {agent.name}")
    bus.leave_thread(tid, carol)
    bus.delete_agent(bob)
    rows = bus.db.fetchone("SELECT count(*) FROM msg_messages WHERE thread_id = ?", (tid,))[0]
    info = bus.get_thread_info(tid)
    assert info is not None and (info.message_count, info.last_seq, rows) == (4, 4, 4)


def test_delete_thread_removes_its_messages_and_cursors(pair: Any) -> None:
    bus, alice, bob, tid = pair
    bus.append(tid, alice, "x")
    bus.mark_read(tid, bob, 1)
    bus.delete_thread(tid)
    assert bus.get_thread(tid) is None and bus.get_thread_info(tid) is None
    assert bus.get_thread_read_state(tid, bob) is None
    with pytest.raises(UnknownThreadError):
        bus.poll(tid)
    with pytest.raises(UnknownThreadError):
        bus.delete_thread(tid)
    rows = bus.db.fetchone("SELECT count(*) FROM msg_messages WHERE thread_id = ?", (tid,))
    assert rows[0] == 0
    assert bus.db.fetchone("SELECT count(*) FROM msg_participants")[0] == 0


def test_agents_are_found_by_record_name_or_uuid(pair: Any) -> None:
    bus, alice, bob, tid = pair
    assert bus.get_agent(alice) == alice
    assert bus.get_agent("Alice") == alice
    assert bus.get_agent(alice.id) == alice
    assert bus.get_agent(str(uuid.uuid4())) is None
    assert bus.append(tid, alice.id, "by id").sender == alice
    assert bus.append(tid, "Bob", "by name").sender == bob


@pytest.mark.backends
def test_a_claims_agent_id_stands_for_the_bus_agent_of_its_name(db_url: str) -> None:
    with StateStore(db_url) as store:
        coordinator = Coordinator(store)
        agent_id = coordinator.register("worker-1").agent_id
        bus = MessageBus(store)
        me = bus.get_or_create_agent(agent_id)
        assert me.name == "worker-1"
        assert bus.get_or_create_agent("worker-1") == me  # one name, one agent
        other = bus.get_or_create_agent("lead")
        tid = bus.create_thread(agent_id, other).id
        assert bus.append(tid, agent_id, "hi").sender == me
        assert bus.get_agent(agent_id) == me
        with pytest.raises(UnknownAgentError, match="no claims agent has this id"):
            bus.get_or_create_agent("agent-0123456789abcdef")
        with pytest.raises(InvalidInputError, match="looks like a claims agent id"):
            messages.check_name("agent-0123456789abcdef")
        bus.close()
        assert store.get  # the store given to the bus stays open
        assert store.list_namespaces() == []


def test_agents_belong_to_their_caller_and_participants_to_the_first_to_act(
    bus: MessageBus,
) -> None:
    lead = bus.get_or_create_agent("lead", principal="p1")
    thread = bus.create_thread_by_names(["lead", "w"], name="team/x", principal="p1")
    assert (thread.name, bus.get_thread(thread.id).name) == ("team/x", "team/x")  # type: ignore[union-attr]
    with pytest.raises(NameTakenError, match="thread name taken"):
        bus.create_thread_by_names(["lead", "w"], name="team/x")
    sent = bus.append(thread.id, lead, "task", principal="p1")
    assert sent.principal == "p1" and bus.poll(thread.id)[0].principal == "p1"
    for act in (
        lambda: bus.append(thread.id, "lead", "forged", principal="p2"),
        lambda: bus.mark_read(thread.id, "lead", 1, principal="p2"),
        lambda: bus.has_unread(thread.id, "lead", principal="p2"),
        lambda: bus.get_thread_read_state(thread.id, "lead", principal="p2"),
        lambda: bus.leave_thread(thread.id, "lead", principal="p2"),
        lambda: bus.get_or_create_agent("lead", principal="p2"),
        lambda: bus.delete_agent("lead", principal="p2"),
    ):
        with pytest.raises(ForeignBusAgentError, match="belongs to another caller"):
            act()
    assert bus.has_unread(thread.id, "w", principal="p1")  # reading adopts nothing
    assert bus.mark_read(thread.id, "w", 1, principal="p2").cursor == 1  # acting adopts
    with pytest.raises(ForeignBusAgentError):
        bus.append(thread.id, "w", "forged", principal="p1")
    assert bus.append(thread.id, "w", "done", principal="p2").seq == 2
    assert bus.append(thread.id, "w", "trusted").principal is None  # None: a trusted caller
    assert [m.content for m in bus.poll(thread.id)] == ["task", "done", "trusted"]


# --------------------------------------------------------------------------------------------
# Messages, polling and cursors
# --------------------------------------------------------------------------------------------


def test_poll_pages_through_a_long_thread(pair: Any) -> None:
    bus, alice, _, tid = pair
    for n in range(250):
        bus.append(tid, alice, f"m{n}")
    first = bus.poll(tid)
    assert len(first) == DEFAULT_POLL_LIMIT and first.more
    assert [m.seq for m in first] == list(range(1, 101))
    seen = list(first)
    after = first.next_after_seq
    while True:
        page = bus.poll(tid, after, limit=70)
        seen.extend(page)
        after = page.next_after_seq
        if not page.more:
            break
    assert [m.content for m in seen] == [f"m{n}" for n in range(250)]
    empty = bus.poll(tid, 250)
    assert list(empty) == [] and not empty.more and empty.next_after_seq == 250
    assert len(bus.poll(tid, limit=MAX_POLL_LIMIT)) == 250
    assert not bus.poll(tid, 240, limit=10).more


def test_a_wait_past_the_threads_end_is_refused_at_once(pair: Any) -> None:
    bus, alice, _, tid = pair
    bus.append(tid, alice, "m0")
    started = time.monotonic()
    with pytest.raises(InvalidInputError, match="ends at seq 1") as caught:
        bus.wait(tid, after_seq=2, timeout=60)
    assert time.monotonic() - started < 30 and "0 to 1" in str(caught.value.hint)
    assert list(bus.wait(tid, after_seq=1, timeout=0.05)) == []  # at the end: waits, times out


def test_mark_read_moves_only_forward_and_never_past_the_end(pair: Any) -> None:
    bus, alice, bob, tid = pair
    for n in range(3):
        bus.append(tid, alice, f"m{n}")
    state = bus.mark_read(tid, bob, 2)
    assert (state.cursor, state.unread_count, state.unread_from_others_count) == (2, 1, 1)
    assert bus.mark_read(tid, bob, 1).cursor == 2  # behind the cursor: a no-op
    assert bus.mark_read(tid, bob, 2).cursor == 2  # marking again is harmless
    with pytest.raises(InvalidInputError, match="ends at seq 3"):
        bus.mark_read(tid, bob, 4)
    assert bus.mark_read(tid, bob, 3).unread_count == 0
    with pytest.raises(InvalidInputError, match="at least 0"):
        bus.mark_read(tid, bob, -1)
    carol = bus.get_or_create_agent("Carol")
    with pytest.raises(NotParticipantError, match="agent not in thread"):
        bus.mark_read(tid, carol, 1)


def test_read_state_counts_unread_from_others(pair: Any) -> None:
    bus, alice, bob, tid = pair
    empty = bus.get_thread_read_state(tid, bob)
    assert empty is not None and (empty.cursor, empty.last_seq, empty.unread_count) == (0, 0, 0)
    assert bus.has_unread(tid, bob) is False
    bus.append(tid, alice, "a")
    bus.append(tid, bob, "b")
    state = bus.get_thread_read_state(tid, bob)
    assert state is not None
    assert (state.unread_count, state.unread_from_others_count) == (2, 1)
    assert state.to_dict()["agent_name"] == "Bob"
    assert bus.has_unread(tid, alice)  # its own message counts as unread until marked
    assert bus.has_unread(tid, "Alice") and bus.has_unread(tid, alice.id)
    assert bus.get_thread_read_state(str(uuid.uuid4()), bob) is None
    assert bus.get_thread_read_state(str(uuid.uuid4()), "Nobody") is None  # the thread first


def test_thread_info_has_count_and_latest_message(pair: Any) -> None:
    bus, alice, bob, tid = pair
    info = bus.get_thread_info(tid)
    assert info is not None and info.message_count == 0 and info.latest_message is None
    assert info.latest_activity_at == info.created_at
    bus.append(tid, alice, "first")
    last = bus.append(tid, bob, "second\nwith a newline\tand a tab")
    info = bus.get_thread_info(tid)
    assert info is not None
    assert (info.message_count, info.last_seq, info.latest_message) == (2, 2, last)
    assert info.latest_activity_at == last.created_at
    assert info.to_dict()["latest_message"]["sender"] == "Bob"
    assert info.to_dict()["participants"] == ["Alice", "Bob"]


def test_content_is_text_within_the_limit(tmp_path: Path) -> None:
    with MessageBus(":memory:", max_content_bytes=10) as bus:
        a, b = bus.get_or_create_agent("a"), bus.get_or_create_agent("b")
        tid = bus.create_thread(a, b).id
        assert bus.append(tid, a, "é" * 5).content == "é" * 5  # 10 bytes of UTF-8
        for bad, match in [
            ("é" * 6, "12 bytes as UTF-8; the limit is 10"),
            ("", "must not be empty"),
            ("a\x00b", "NUL"),
            ("\ud800", "lone surrogate"),
            (b"bytes", "must be a string, got bytes"),
            (None, "must be a string"),
        ]:
            with pytest.raises(InvalidInputError, match=match):
                bus.append(tid, a, bad)  # type: ignore[arg-type]
        assert bus.get_thread_info(tid).message_count == 1  # type: ignore[union-attr]


def test_every_common_error_is_a_clear_value_error(pair: Any) -> None:
    bus, alice, _, tid = pair
    carol = bus.get_or_create_agent("Carol")
    cases: list[tuple[Any, type[Exception], str]] = [
        (lambda: bus.create_thread(alice), TooFewParticipantsError, "need >=2 participants"),
        (lambda: bus.create_thread(alice, "Alice"), TooFewParticipantsError, "got 1"),
        (lambda: bus.create_thread(), TooFewParticipantsError, "got 0"),
        (lambda: bus.create_agent("Alice"), NameTakenError, "agent name taken"),
        (lambda: bus.append(tid, carol, "x"), NotParticipantError, "sender not in thread"),
        (lambda: bus.append(str(uuid.uuid4()), alice, "x"), UnknownThreadError, "unknown thread"),
        (lambda: bus.append(tid, "Nobody", "x"), UnknownAgentError, "unknown agent 'Nobody'"),
        (lambda: bus.create_thread(alice, "Nobody"), UnknownAgentError, "unknown agent"),
        (lambda: bus.join_thread(str(uuid.uuid4()), alice), UnknownThreadError, "unknown"),
        (lambda: bus.mark_read(str(uuid.uuid4()), alice, 0), UnknownThreadError, "unknown"),
        (lambda: bus.poll("not-a-uuid"), InvalidInputError, "must be a UUID"),
        (lambda: bus.poll(tid, -1), InvalidInputError, "after_seq must be at least 0"),
        (lambda: bus.poll(tid, True), InvalidInputError, "after_seq must be an integer"),
        (lambda: bus.poll(tid, 2**63), InvalidInputError, "after_seq must be at most"),
        (
            lambda: bus.wait(tid, after_seq=10**5000, timeout=0),
            InvalidInputError,
            "got a larger integer",
        ),
        (lambda: bus.poll(tid, limit=0), InvalidInputError, "limit must be at least 1"),
        (lambda: bus.poll(tid, limit=MAX_POLL_LIMIT + 1), InvalidInputError, "in pages"),
        (lambda: bus.get_or_create_agent(""), InvalidInputError, "must not be empty"),
        (lambda: bus.get_or_create_agent("a\nb"), InvalidInputError, "control character"),
        (lambda: bus.get_or_create_agent("x" * 200), InvalidInputError, "the limit is 128"),
        (lambda: bus.get_or_create_agent(7), InvalidInputError, "must be a string"),
        (lambda: bus.has_unread(tid, carol), NotParticipantError, "join_thread"),
        (lambda: bus.wait(tid, after_seq=0, timeout=-1), InvalidInputError, "between 0"),
        (lambda: bus.create_thread_by_names("Alice"), InvalidInputError, "a list of agent"),
    ]
    for call, kind, match in cases:
        with pytest.raises(kind, match=match) as info:
            call()
        assert isinstance(info.value, ValueError), match
        assert info.value.hint or kind is InvalidInputError, match


def test_create_thread_by_names_creates_missing_agents(bus: MessageBus) -> None:
    thread = bus.create_thread_by_names(["Ann", "Ben", "Ann"])
    assert [a.name for a in thread.participants] == ["Ann", "Ben"]
    assert {a.name for a in bus.list_agents()} == {"Ann", "Ben"}
    with pytest.raises(TooFewParticipantsError):
        bus.create_thread_by_names(["Solo"])
    assert bus.get_agent("Solo") is None  # the failed call left nothing behind


# --------------------------------------------------------------------------------------------
# Guarantees: sequences, visibility order, crashes
# --------------------------------------------------------------------------------------------


def check_contiguous(bus: MessageBus, tid: str, expected: int) -> None:
    seqs = [r[0] for r in bus.db.fetchall(
        "SELECT seq FROM msg_messages WHERE thread_id = ? ORDER BY seq", (tid,)
    )]  # fmt: skip
    assert seqs == list(range(1, expected + 1))
    info = bus.get_thread_info(tid)
    assert info is not None and info.last_seq == info.message_count == expected


def test_sequences_have_no_gaps_under_many_threads(bus: MessageBus) -> None:
    agents = [bus.get_or_create_agent(f"w{i}") for i in range(6)]
    threads = [bus.create_thread(*agents).id for _ in range(3)]

    def body(i: int) -> list[int]:
        return [bus.append(threads[n % 3], agents[i], f"{i}:{n}").seq for n in range(60)]

    results = run_threads(6, body)
    for tid in threads:
        check_contiguous(bus, tid, 120)
    assert all(len(r) == 60 for r in results)


@pytest.mark.backends
def test_sequences_have_no_gaps_under_many_processes(db_url: str) -> None:
    with MessageBus(db_url) as bus:
        senders = [f"p{i}" for i in range(4)]
        threads = [bus.create_thread_by_names(senders).id for _ in range(2)]
        procs = [worker("append", db_url, s, "40", *threads) for s in senders]
        stop = threading.Event()

        def local(_: int) -> None:  # a thread of this process appends meanwhile
            while not stop.is_set():
                bus.append(threads[0], "p0", "local")

        appender = threading.Thread(target=local, args=(0,))
        appender.start()
        try:
            for p in procs:
                assert p.next_line(60) == "done"
        finally:
            stop.set()
            appender.join()
        local_sql = "SELECT count(*) FROM msg_messages WHERE content = 'local'"
        local_count = bus.db.fetchone(local_sql)[0]
        check_contiguous(bus, threads[0], 160 + local_count)
        check_contiguous(bus, threads[1], 160)
        for p in procs:
            p.kill()


@pytest.mark.backends
def test_a_reader_never_sees_a_gap_while_processes_append(db_url: str) -> None:
    """Polling after the last seq seen never skips a message that commits later."""
    with MessageBus(db_url) as bus:
        senders = [f"p{i}" for i in range(3)]
        tid = bus.create_thread_by_names(senders).id
        procs = [worker("append", db_url, s, "80", tid) for s in senders]
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while len(seen) < 240 and time.monotonic() < deadline:
            page = bus.poll(tid, seen[-1] if seen else 0)
            assert [m.seq for m in page] == list(range(len(seen) + 1, len(seen) + 1 + len(page)))
            seen.extend(m.seq for m in page)
        assert seen == list(range(1, 241))
        for p in procs:
            assert p.next_line(60) == "done"
            p.kill()


@posix_only
@pytest.mark.backends
def test_a_killed_appender_leaves_every_acknowledged_message(db_url: str) -> None:
    with MessageBus(db_url) as bus:
        tid = bus.create_thread_by_names(["crasher", "peer"]).id
    acknowledged: dict[int, str] = {}
    for round_ in range(4):
        proc = worker("crash-append", db_url, "crasher", tid)
        assert proc.next_line() == "ready"
        for _ in range(20 + 10 * round_):
            seq, content = proc.next_line().split(" ", 1)
            acknowledged[int(seq)] = content
        proc.proc.send_signal(signal.SIGKILL)
        proc.kill()
        assert proc.proc.returncode == -signal.SIGKILL
    with MessageBus(db_url) as bus:
        info = bus.get_thread_info(tid)
        assert info is not None
        check_contiguous(bus, tid, info.last_seq)
        stored = {m.seq: m.content for m in bus.poll(tid, limit=MAX_POLL_LIMIT)}
        for seq, content in acknowledged.items():
            assert stored[seq] == content
        assert bus.append(tid, "peer", "after").seq == info.last_seq + 1


# --------------------------------------------------------------------------------------------
# Waiting: pushed by the change feed
# --------------------------------------------------------------------------------------------


def test_wait_returns_at_once_when_a_message_is_past_after_seq(pair: Any) -> None:
    bus, alice, _, tid = pair
    bus.append(tid, alice, "one")
    bus.append(tid, alice, "two")
    page = bus.wait(tid, after_seq=1, timeout=5)
    assert [m.content for m in page] == ["two"]
    started = time.monotonic()
    assert list(bus.wait(tid, after_seq=2, timeout=0.2)) == []  # a timeout: an empty page
    assert 0.15 < time.monotonic() - started < 5


def test_wait_is_woken_by_an_append_in_this_process(pair: Any) -> None:
    bus, alice, _, tid = pair
    timer = threading.Timer(0.1, lambda: bus.append(tid, alice, "late"))
    started = time.monotonic()
    timer.start()
    page = bus.wait(tid, after_seq=0, timeout=20)
    assert [m.content for m in page] == ["late"]
    assert time.monotonic() - started < 10
    timer.join()


def test_the_deletions_a_feed_reads_are_kept_to_the_newest(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, alice, bob, _ = pair
    monkeypatch.setattr(messages, "KEPT_DELETIONS", 2)
    for _ in range(5):
        bus.delete_thread(bus.create_thread(alice, bob).id)
    ids = [r[0] for r in bus.db.fetchall("SELECT id FROM msg_deletions ORDER BY id")]
    assert len(ids) == 2 and ids == sorted(ids)  # the two newest


def test_wait_ends_with_an_error_when_its_thread_is_deleted(pair: Any) -> None:
    bus, _, _, tid = pair
    threading.Timer(0.1, lambda: bus.delete_thread(tid)).start()
    with pytest.raises(UnknownThreadError):
        bus.wait(tid, after_seq=0, timeout=20)


@pytest.mark.backends
def test_wait_is_woken_by_an_append_in_another_process(db_url: str) -> None:
    with MessageBus(db_url) as bus:
        tid = bus.create_thread_by_names(["a", "b"]).id
        waiter = worker("wait", db_url, tid, "0")
        assert waiter.next_line() == "ready"
        time.sleep(0.2)
        sent = time.monotonic_ns()
        bus.append(tid, "a", "wake up")
        line = waiter.next_line(20).split()
        assert line[:2] == ["woken", "1"]
        assert (int(line[2]) - sent) / 1e9 < 5  # milliseconds in practice (bench measures it)
        waiter.kill()


@pytest.mark.backends
def test_a_wait_in_another_process_ends_when_its_thread_is_deleted(db_url: str) -> None:
    with MessageBus(db_url) as bus:
        tid = bus.create_thread_by_names(["a", "b"]).id
        waiter = worker("wait", db_url, tid, "0")
        assert waiter.next_line() == "ready"
        time.sleep(0.2)
        started = time.monotonic()
        bus.delete_thread(tid)
        assert waiter.next_line(20) == "gone"  # not a 30 s timeout
        assert time.monotonic() - started < 5
        waiter.kill()


@pytest.mark.backends
def test_wait_in_this_process_is_woken_by_another_process(db_url: str) -> None:
    with MessageBus(db_url) as bus:
        tid = bus.create_thread_by_names(["a", "b"]).id
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(bus.wait(tid, after_seq=0, timeout=30)))
        t.start()
        time.sleep(0.1)
        appender = worker("append", db_url, "b", "1", tid)
        assert appender.next_line() == "done"
        t.join(30)
        assert [m.content for m in result[0]] == ["b 0"]
        appender.kill()


# --------------------------------------------------------------------------------------------
# Schema: versioned on its own, beside the store's and claims' tables
# --------------------------------------------------------------------------------------------


def test_the_bus_tables_sit_beside_the_store_and_claims(db_path: Path) -> None:
    with StateStore(db_path) as store:
        store.set("ns", "k", 1, updated_by="t")
        Coordinator(store).register("x")
    with MessageBus(db_path) as bus:
        tid = bus.create_thread_by_names(["a", "b"]).id
        bus.append(tid, "a", "hello")
    conn = sqlite3.connect(db_path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"state", "agents", "claims", "msg_agents", "msg_threads", "msg_messages"} <= tables
    components = conn.execute("SELECT * FROM agenthold_components").fetchall()
    assert ("messages", messages.SCHEMA_VERSION) in components
    assert conn.execute("PRAGMA user_version").fetchone()[0] == store_schema  # the store's own
    conn.close()
    with StateStore(db_path) as store:
        assert store.get("ns", "k").value == 1


def test_a_read_only_bus_on_a_file_without_bus_tables_finds_nothing(db_path: Path) -> None:
    StateStore(db_path).close()
    with MessageBus(db_path, read_only=True) as bus:
        assert bus.find_threads() == [] and bus.list_agents() == []
        assert bus.get_thread(str(uuid.uuid4())) is None
        assert bus.get_thread_info(str(uuid.uuid4())) is None
        assert bus.get_thread_read_state(str(uuid.uuid4()), "a") is None
        assert bus.get_agent("a") is None
        with pytest.raises(UnknownThreadError):
            bus.poll(str(uuid.uuid4()))
        with pytest.raises(UnknownThreadError):
            bus.wait(str(uuid.uuid4()), after_seq=0, timeout=0)
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'msg%'").fetchall() == []
    conn.close()


def test_a_newer_bus_schema_is_refused(db_path: Path) -> None:
    MessageBus(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE agenthold_components SET version = 99 WHERE component = 'messages'")
    conn.commit()
    conn.close()
    with pytest.raises(IncompatibleDatabaseError, match="messages tables at version 99, newer"):
        MessageBus(db_path)


TID = "0b6c2a1e-4d3f-4a5b-8c7d-9e0f1a2b3c4d"


def test_an_older_bus_schema_needs_a_writable_open(db_path: Path, monkeypatch: Any) -> None:
    """A file made by the first bus (version 1: no principals, no thread names) is migrated by
    a writable open and keeps its messages; a read-only open refuses it."""
    first = Component(MESSAGES_SCHEMA.name, 1)
    monkeypatch.setattr(messages, "MESSAGES_SCHEMA", first)
    MessageBus(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("INSERT INTO msg_agents VALUES ('a1', 'a', 'x'), ('b1', 'b', 'x')")
    conn.execute("INSERT INTO msg_threads VALUES (?, 'x', 1, 'x')", (TID,))
    members = [(TID, "a1"), (TID, "b1")]
    conn.executemany("INSERT INTO msg_participants VALUES (?, ?, 'x', 0)", members)
    conn.execute(
        "INSERT INTO msg_messages (thread_id, seq, sender_id, sender_name, content, created_at) "
        "VALUES (?, 1, 'a1', 'a', 'from version 1', 'x')",
        (TID,),
    )
    conn.commit()
    conn.close()
    monkeypatch.undo()
    with pytest.raises(IncompatibleDatabaseError, match="older than"):
        MessageBus(db_path, read_only=True)
    with MessageBus(db_path) as bus:  # a writable open migrates
        version = "SELECT version FROM agenthold_components WHERE component = 'messages'"
        assert bus.db.fetchone(version)[0] == messages.SCHEMA_VERSION == 3
        [old] = bus.poll(TID)
        assert (old.content, old.principal) == ("from version 1", None)
        assert bus.append(TID, "b", "after").seq == 2
        with pytest.raises(ForeignBusAgentError):  # version 1 agents had no token: trusted only
            bus.append(TID, "a", "x", principal="p")


@pytest.mark.backends
def test_threads_opening_a_new_file_together_migrate_it_once(db_url: str) -> None:
    StateStore(db_url).close()

    def body(_: int) -> str:
        with MessageBus(db_url) as bus:
            return bus.get_or_create_agent("same").id

    assert len(set(run_threads(4, body))) == 1


def test_a_bus_that_fails_to_open_closes_its_store(db_path: Path) -> None:
    MessageBus(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE agenthold_components SET version = 99 WHERE component = 'messages'")
    conn.commit()
    conn.close()
    with pytest.raises(IncompatibleDatabaseError):
        MessageBus(db_path)


def test_records_are_frozen_and_repr_names_the_file(pair: Any) -> None:
    bus, alice, _, tid = pair
    message = bus.append(tid, alice, "x")
    with pytest.raises(AttributeError):
        message.seq = 5  # type: ignore[misc]
    assert message.to_dict()["sender"] == "Alice"
    assert alice.to_dict() == {"agent_id": alice.id, "name": "Alice"}
    assert bus.get_thread(tid).to_dict()["participants"] == ["Alice", "Bob"]  # type: ignore[union-attr]
    assert "MessageBus(" in repr(bus)


@pytest.mark.usefixtures("no_child_coverage")
@pytest.mark.backends
def test_the_benchmark_quick_run_prints_its_tables(
    backend: str, db_url: str, tmp_path: Path
) -> None:
    env = {**child_env(), "TMPDIR": str(tmp_path)}
    on = ["--db", db_url] if backend == "postgresql" else []
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick", *on],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    rows = (
        "append",
        "poll 10 messages",
        "has_unread, thread of 20,000 messages",
        "get_thread_info, thread of 1 message",
        "get_thread_info, thread of 20,000 messages",
    )
    for row in rows:
        assert re.search(rf"{row} +[\d,]+ +[\d,]+ +\d+%", run.stdout), row
    assert re.search(r"append in another process +[\d.]+ ms +[\d.]+ ms", run.stdout)
    raw = "raw psycopg" if backend == "postgresql" else "raw sqlite3"
    assert f"append >= 0.6 of {raw}" in run.stdout


def test_the_benchmark_refuses_a_db_that_is_not_a_postgresql_url() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--db", "state.db"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=child_env(),
    )
    assert run.returncode == 2
    assert "--db takes a postgresql:// URL" in run.stderr


def test_the_readme_example_of_the_bus_runs(tmp_path: Path) -> None:
    page = (REPO / "docs" / "bus.md").read_text(encoding="utf-8")
    section = page.split("# The message bus", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace("timeout=30", "timeout=0.1")  # nobody else appends: let it time out
    assert run_example(code, tmp_path) == "1 lead Please review src/app.py\n"


def test_every_test_the_guarantees_doc_names_for_the_bus_exists() -> None:
    doc = (REPO / "docs" / "guarantees.md").read_text(encoding="utf-8")
    section = doc.split("## The message bus", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(test_\w+)`", section))
    assert len(named) > 10
    others = ("test_inspect_messages.py", "test_message_tools.py", "test_docs.py")
    defined = set(globals()) | {
        name
        for other in others
        for name in re.findall(
            r"^(?:async )?def (test_\w+)", (REPO / "tests" / other).read_text(), re.M
        )
    }
    named = {n.split("::")[-1] for n in named}
    assert named <= defined, named - defined


def test_the_message_bus_example_runs_a_coordinator_and_two_worker_processes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "example.db"
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / "message_bus.py"), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=child_env(),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip().endswith("Every task answered exactly once, as expected.")
    with MessageBus(db, read_only=True) as bus:
        [thread] = bus.find_threads("coordinator", "worker-1", "worker-2")
        contents = [m.content for m in bus.poll(thread.id)]
        assert contents[-1] == "done" and len(contents) == 9
        assert "7 squared is 49" in contents and "12 squared is 144" in contents
        for name in ("worker-1", "worker-2"):
            assert bus.has_unread(thread.id, name) is False


def test_a_page_is_read_only_like_every_record(pair: Any) -> None:
    bus, alice, _, tid = pair
    bus.append(tid, alice, "one")
    page = bus.poll(tid)
    with pytest.raises(AttributeError, match="read-only"):
        page.more = True  # type: ignore[misc]
    with pytest.raises(AttributeError, match="read-only"):
        page.next_after_seq = 0  # type: ignore[misc]
    import copy
    import pickle

    for again in (copy.copy(page), pickle.loads(pickle.dumps(page))):
        assert list(again) == list(page)
        assert (again.more, again.next_after_seq) == (page.more, page.next_after_seq) == (False, 1)
