"""Two agents, two agenthold stdio servers, one database file: a claim, a wait, a hand-over.

Each agent is what an MCP client (Claude Code, Cursor, an agent framework) runs for itself: its
own ``agenthold`` server process on stdio, driven here by ``mcp.Client``. The two servers share
nothing but the SQLite file, and that is enough:

1. the writer claims notes.md and starts editing it;
2. the reviewer tries to claim it too, is told it is busy, and waits;
3. the writer saves its edit and releases notes.md as "modified";
4. the reviewer's wait ends at once (the release reaches the other process through the
   database), and the reviewer learns that the file was modified, so it reads it again before
   claiming and reviewing it.

    python examples/two_agents.py [--db PATH] [--workdir DIR]

By default both live in a fresh temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

SOURCE_TREE = Path(__file__).resolve().parents[1]


def server(db: Path, workdir: Path) -> StdioServerParameters:
    """How an MCP client starts agenthold for one agent: ``agenthold --db ... --workspace ...``."""
    env = {k: v for k, v in os.environ.items() if k.startswith("AGENTHOLD_")}  # AGENTHOLD_NO_WARM
    if (SOURCE_TREE / "agenthold" / "__init__.py").exists():  # run from a source checkout
        env["PYTHONPATH"] = str(SOURCE_TREE)
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "agenthold", "--db", str(db), "--workspace", f"default={workdir}"],
        cwd=str(workdir),
        env=env,
    )


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool; its reply is a dict with a "status" (an error ends the example)."""
    result = await client.call_tool(tool, arguments)
    reply: dict[str, Any] = result.structured_content or {}
    if result.is_error:
        raise SystemExit(f"{tool} failed: {reply.get('message')} ({reply.get('hint')})")
    return reply


def say(text: str) -> None:
    print(text, flush=True)


async def run(db: Path, workdir: Path) -> None:
    notes = workdir / "notes.md"
    notes.write_text("# Notes\n\nRelease: some day.\n")
    async with Client(server(db, workdir)) as writer, Client(server(db, workdir)) as reviewer:
        w = await call(writer, "agenthold_register", name="writer", purpose="edit notes")
        r = await call(reviewer, "agenthold_register", name="reviewer", purpose="review")
        writer_id, reviewer_id = w["agent_id"], r["agent_id"]
        say(f"writer registered as {writer_id}; reviewer registered as {reviewer_id}")

        reply = await call(writer, "agenthold_claim", resource="notes.md", agent_id=writer_id)
        say(f"writer claims notes.md: {reply['status']}")
        reply = await call(reviewer, "agenthold_claim", resource="notes.md", agent_id=reviewer_id)
        say(f"reviewer claims notes.md: {reply['status']} (held by {reply['agent_name']})")

        waited: dict[str, Any] = {}

        async def reviewer_waits() -> None:
            say("reviewer waits for notes.md ...")
            waited.update(
                await call(reviewer, "agenthold_wait", resource="notes.md", timeout_seconds=60)
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(reviewer_waits)
            await anyio.sleep(0.3)  # the writer at work
            notes.write_text("# Notes\n\nRelease: Friday, after the last review.\n")
            reply = await call(
                writer,
                "agenthold_release",
                resource="notes.md",
                agent_id=writer_id,
                outcome="modified",
            )
            say(f"writer released notes.md as {reply['outcome']}")

        say(f"reviewer's wait ended: {waited['status']} after {waited['elapsed_seconds']:.2f} s")
        say(f"  previous outcome: {waited['previous_outcome']}; hint: {waited['hint']}")
        reply = await call(reviewer, "agenthold_claim", resource="notes.md", agent_id=reviewer_id)
        say(
            f"reviewer claims notes.md: {reply['status']} "
            f"(previous outcome: {reply['previous_outcome']})"
        )
        text = notes.read_text()  # read again, as the hint says
        say(f"reviewer reads the new text: {text.splitlines()[-1]!r}")
        notes.write_text(text + "\nReviewed: looks good.\n")
        reply = await call(
            reviewer,
            "agenthold_release",
            resource="notes.md",
            agent_id=reviewer_id,
            outcome="modified",
        )
        say(f"reviewer released notes.md as {reply['outcome']}; nobody overwrote anybody")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="database file (default: in a temp directory)")
    parser.add_argument("--workdir", type=Path, help="the agents' workspace (default: temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agenthold-two-agents-") as tmp:
        workdir = (args.workdir or Path(tmp)).resolve()
        db = (args.db or Path(tmp) / "agenthold.db").resolve()
        anyio.run(run, db, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
