"""A coordinator and two workers talking through agenthold's message bus, each in its own process,
sharing nothing but the database file.

The coordinator creates a thread of itself and the two workers and posts tasks ("worker-1
square 7"). Each worker runs the worker loop:

1. get its agent by name (``get_or_create_agent``);
2. take the thread id (given on its command line here);
3. read its cursor (``get_thread_read_state``);
4. poll after the cursor;
5. process its tasks (it answers with the result), then ``mark_read`` the last seq;
6. ``wait`` for a message after that seq, and back to 4, until the coordinator says "done".

The coordinator waits for the four answers with ``wait`` (woken by the workers' appends, which
reach it through the database file within milliseconds), says "done" and prints the thread.

    python examples/message_bus.py [--db PATH]

By default the database lives in a fresh temporary directory, removed at the end. (The same
loop over MCP uses the messages tool set once it is served; see issue 13.)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE_TREE = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("agenthold") is None:  # a source checkout without agenthold installed
    sys.path.insert(0, str(SOURCE_TREE))

from agenthold.messages import MessageBus  # noqa: E402

WORKERS = ("worker-1", "worker-2")
TASKS = {"worker-1": [3, 7], "worker-2": [4, 12]}


def say(who: str, text: str) -> None:
    print(f"{who:>11}: {text}", flush=True)


def work(db: Path, name: str, thread_id: str) -> None:
    """One worker, in its own process."""
    with MessageBus(db) as bus:
        me = bus.get_or_create_agent(name)  # 1
        state = bus.get_thread_read_state(thread_id, me)  # 3
        assert state is not None, "the thread is missing from this database"
        cursor = state.cursor
        while True:
            page = bus.poll(thread_id, after_seq=cursor)  # 4
            for message in page:  # 5
                words = message.content.split()
                if message.sender.name != "coordinator":
                    continue
                if words == ["done"]:
                    bus.mark_read(thread_id, me, message.seq)
                    return
                if words[:2] == [name, "square"]:
                    n = int(words[2])
                    bus.append(thread_id, me, f"{n} squared is {n * n}")
            if page:
                cursor = page.next_after_seq
                bus.mark_read(thread_id, me, cursor)
            if not page.more:
                bus.wait(thread_id, after_seq=cursor, timeout=30)  # 6


def start_worker(db: Path, name: str, thread_id: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(SOURCE_TREE)}
    return subprocess.Popen(
        [sys.executable, __file__, "--db", str(db), "--worker", name, "--thread", thread_id],
        env=env,
    )


def coordinate(db: Path) -> int:
    with MessageBus(db) as bus:
        thread = bus.create_thread_by_names(["coordinator", *WORKERS])
        names = ", ".join(a.name for a in thread.participants)
        say("coordinator", f"created thread {thread.id} with {names}")
        workers = [start_worker(db, name, thread.id) for name in WORKERS]
        expected = set()
        for name, numbers in TASKS.items():
            for n in numbers:
                bus.append(thread.id, "coordinator", f"{name} square {n}")
                expected.add((name, f"{n} squared is {n * n}"))
        say("coordinator", f"posted {len(expected)} tasks; waiting for the answers")
        answers: list[tuple[str, str]] = []
        cursor = 0
        while len(answers) < len(expected):
            page = bus.wait(thread.id, after_seq=cursor, timeout=60)
            if not page:
                raise SystemExit("the workers did not answer within 60 s")
            answers.extend((m.sender.name, m.content) for m in page if m.sender.name in WORKERS)
            cursor = page.next_after_seq
        bus.mark_read(thread.id, "coordinator", cursor)
        bus.append(thread.id, "coordinator", "done")
        codes = [w.wait(timeout=60) for w in workers]
        print("\nThe thread, in order:")
        for m in bus.poll(thread.id):
            say(m.sender.name, f"[{m.seq}] {m.content}")
        for name in WORKERS:
            state = bus.get_thread_read_state(thread.id, name)
            assert state is not None
            say(name, f"cursor {state.cursor} of {state.last_seq}, unread {state.unread_count}")
        right = sorted(answers) == sorted(expected) and codes == [0, 0]
        print("\nEvery task answered exactly once, as expected." if right else "\nWrong answers.")
        return 0 if right else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="database file (default: in a temp directory)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # run as a worker (internal)
    parser.add_argument("--thread", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        work(args.db, args.worker, args.thread)
        return 0
    with tempfile.TemporaryDirectory(prefix="agenthold-message-bus-") as tmp:
        return coordinate((args.db or Path(tmp) / "agenthold.db").resolve())


if __name__ == "__main__":
    sys.exit(main())
