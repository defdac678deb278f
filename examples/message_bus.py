"""A coordinator and two workers talking through agenthold's message bus over MCP: three
processes, each an MCP client with its own agenthold stdio server (``--tools messages``),
sharing nothing but the database file.

The coordinator creates a thread of itself and the two workers and posts tasks ("worker-1
square 7"). Each worker runs the worker loop the tools teach:

1. ``agenthold_create_agent`` with its name;
2. the thread id (given on its command line here);
3. ``agenthold_thread_status`` for its cursor;
4. ``agenthold_poll`` after the cursor;
5. process its tasks (it answers with the result), then ``agenthold_mark_read`` the last seq;
6. ``agenthold_wait_messages`` after that seq, and back to 4, until the coordinator says "done".

The coordinator waits for the four answers with ``agenthold_wait_messages`` (woken by the
workers' appends, which reach its server through the database file within milliseconds), says
"done" and prints the thread.

    python examples/message_bus.py [--db PATH]

By default the database lives in a fresh temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

SOURCE_TREE = Path(__file__).resolve().parents[1]
FROM_SOURCE = importlib.util.find_spec("agenthold") is None  # a checkout, agenthold not installed
WORKERS = ("worker-1", "worker-2")
TASKS = {"worker-1": [3, 7], "worker-2": [4, 12]}
WAIT = 30  # seconds any one agenthold_wait_messages may take


def environment() -> dict[str, str]:
    env = dict(os.environ)
    if FROM_SOURCE:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_TREE), env.get("PYTHONPATH")]))
    return env


def server(db: Path) -> StdioServerParameters:
    """How an MCP client starts agenthold's message tools (the same for every agent here).

    ``--no-warm``: an example should leave nothing running once it has ended. Without it, the
    first server would fork a warm server (docs/warm.md), which the workers'
    servers would then go through, and which would stay behind after the example: up to 20 s
    on the temporary database (it notices the file is gone), 10 minutes on a ``--db`` of yours.
    Each agent here keeps one session for the whole run, so a warm server saves little; it is
    for clients that start a server for every call."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "agenthold", "--db", str(db), "--tools", "messages", "--no-warm"],
        env=environment(),
    )


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool; its reply is a dict with a "status" (an error ends the example)."""
    result = await client.call_tool(tool, arguments)
    reply: dict[str, Any] = result.structured_content or {}
    if result.is_error:
        raise SystemExit(f"{tool} failed: {reply.get('message')} ({reply.get('hint')})")
    return reply


def say(who: str, text: str) -> None:
    print(f"{who:>11}: {text}", flush=True)


# --------------------------------------------------------------------------------------------
# A worker: its own process, its own server
# --------------------------------------------------------------------------------------------


async def work(db: Path, name: str, thread_id: str) -> None:
    async with Client(server(db)) as client:
        await call(client, "agenthold_create_agent", name=name)  # 1
        state = await call(client, "agenthold_thread_status", thread_id=thread_id, agent_name=name)
        cursor = state["cursor"]  # 3
        while True:
            page = await call(client, "agenthold_poll", thread_id=thread_id, after_seq=cursor)  # 4
            for message in page["messages"]:  # 5
                words = message["content"].split()
                if message["sender"] != "coordinator":
                    continue
                if words == ["done"]:
                    await call(
                        client,
                        "agenthold_mark_read",
                        thread_id=thread_id,
                        agent_name=name,
                        seq=message["seq"],
                    )
                    return
                if words[:2] == [name, "square"]:
                    n = int(words[2])
                    answer = f"{n} squared is {n * n}"
                    await call(
                        client,
                        "agenthold_append",
                        thread_id=thread_id,
                        sender_name=name,
                        content=answer,
                    )
            if page["messages"]:
                cursor = page["next_after_seq"]
                await call(
                    client, "agenthold_mark_read", thread_id=thread_id, agent_name=name, seq=cursor
                )
            if not page["more"]:  # 6
                await call(
                    client,
                    "agenthold_wait_messages",
                    thread_id=thread_id,
                    after_seq=cursor,
                    timeout_seconds=WAIT,
                )


# --------------------------------------------------------------------------------------------
# The coordinator
# --------------------------------------------------------------------------------------------


def start_worker(db: Path, name: str, thread_id: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--db", str(db), "--worker", name, "--thread", thread_id],
        env=environment(),
    )


async def coordinate(db: Path) -> int:
    async with Client(server(db)) as client:
        await call(client, "agenthold_create_agent", name="coordinator")
        thread = await call(
            client, "agenthold_create_thread", participant_names=["coordinator", *WORKERS]
        )
        tid = thread["thread_id"]
        say("coordinator", f"created thread {tid} with {', '.join(thread['participants'])}")
        workers = [start_worker(db, name, tid) for name in WORKERS]
        try:
            return await run_the_work(client, tid, workers)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()


async def run_the_work(client: Client, tid: str, workers: list[subprocess.Popen[bytes]]) -> int:
    expected = set()
    for name, numbers in TASKS.items():
        for n in numbers:
            content = f"{name} square {n}"
            await call(
                client,
                "agenthold_append",
                thread_id=tid,
                sender_name="coordinator",
                content=content,
            )
            expected.add((name, f"{n} squared is {n * n}"))
    say("coordinator", f"posted {len(expected)} tasks; waiting for the answers")
    answers: list[tuple[str, str]] = []
    cursor = 0
    while len(answers) < len(expected):
        page = await call(
            client, "agenthold_wait_messages", thread_id=tid, after_seq=cursor, timeout_seconds=WAIT
        )
        if page["status"] == "timeout":
            raise SystemExit(f"the workers did not answer within {WAIT} s")
        answers.extend(
            (m["sender"], m["content"]) for m in page["messages"] if m["sender"] in WORKERS
        )
        cursor = page["next_after_seq"]
    await call(client, "agenthold_mark_read", thread_id=tid, agent_name="coordinator", seq=cursor)
    await call(client, "agenthold_append", thread_id=tid, sender_name="coordinator", content="done")
    codes = [await anyio.to_thread.run_sync(lambda w=w: w.wait(timeout=60)) for w in workers]
    print("\nThe thread, in order:")
    page = await call(client, "agenthold_poll", thread_id=tid, after_seq=0)
    for m in page["messages"]:
        say(m["sender"], f"[{m['seq']}] {m['content']}")
    for name in WORKERS:
        state = await call(client, "agenthold_thread_status", thread_id=tid, agent_name=name)
        say(
            name, f"cursor {state['cursor']} of {state['last_seq']}, unread {state['unread_count']}"
        )
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
        anyio.run(work, args.db, args.worker, args.thread)
        return 0
    with tempfile.TemporaryDirectory(prefix="agenthold-message-bus-") as tmp:
        db = (args.db or Path(tmp) / "agenthold.db").resolve()
        code: int = anyio.run(coordinate, db)
        return code


if __name__ == "__main__":
    sys.exit(main())
