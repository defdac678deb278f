"""docs/advanced-tools.md shows real replies: every example in it is run and compared.

The document tells one story: each ``**Request** to `tool`:`` block followed by a ``**Reply**``
block is a call made, in order, against a fresh in-process server in advanced mode, through a
real ``mcp.Client``. The actual reply must have exactly the documented keys and the documented
values, except timestamps (keys ending in ``_at``) and ``elapsed_seconds``, which only need the
right type. The table of tools and their annotations is checked against the server too.
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import coordinator_at, in_process_client

from agenthold.claims import Coordinator
from agenthold.store import StateStore
from agenthold.uris import Resolver, Workspace

pytestmark = pytest.mark.anyio

DOC = Path(__file__).resolve().parents[1] / "docs" / "advanced-tools.md"
EXAMPLE = re.compile(
    r"\*\*Request\*\* to `(?P<tool>agenthold_\w+)`:\s*```json\n(?P<request>.*?)```"
    r"\s*\*\*Reply\*\*[^\n]*\n\s*```json\n(?P<reply>.*?)```",
    re.DOTALL,
)


def examples() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    text = DOC.read_text(encoding="utf-8")
    found = [
        (m["tool"], json.loads(m["request"]), json.loads(m["reply"]))
        for m in EXAMPLE.finditer(text)
    ]
    assert text.count("**Request**") == len(found), "a request without a reply block"
    return found


def assert_like(documented: Any, actual: Any, where: str) -> None:
    """``actual`` is ``documented`` apart from timestamps and elapsed times."""
    key = where.rsplit(".", 1)[-1]
    if isinstance(documented, dict):
        assert isinstance(actual, dict) and set(actual) == set(documented), (
            f"{where}: documented keys {sorted(documented)}, actual {sorted(actual)}"
        )
        for k, v in documented.items():
            assert_like(v, actual[k], f"{where}.{k}")
    elif isinstance(documented, list):
        assert isinstance(actual, list) and len(actual) == len(documented), where
        for i, (d, a) in enumerate(zip(documented, actual, strict=True)):
            assert_like(d, a, f"{where}[{i}]")
    elif key.endswith("_at") and isinstance(documented, str):
        assert isinstance(actual, str) and datetime.fromisoformat(actual).tzinfo, where
    elif key == "elapsed_seconds":
        assert isinstance(actual, (int, float)) and actual >= 0, where
    else:
        assert actual == documented and type(actual) is type(documented), (
            f"{where}: documented {documented!r}, actual {actual!r}"
        )


async def test_every_example_in_the_advanced_tools_doc_gives_the_documented_reply(
    tmp_path: Path,
) -> None:
    story = examples()
    assert len(story) >= 20
    assert {tool for tool, _, _ in story} >= {
        "agenthold_get", "agenthold_set", "agenthold_list", "agenthold_history",
        "agenthold_delete", "agenthold_watch", "agenthold_clear_namespace", "agenthold_export",
    }  # fmt: skip
    with StateStore(tmp_path / "doc.db") as store:
        coordinator = coordinator_at(store, tmp_path)
        async with in_process_client(coordinator, tools="advanced") as (_, client):
            assert not client.instructions  # the doc says advanced mode sends none
            for number, (tool, request, documented) in enumerate(story, 1):
                result = await client.call_tool(tool, request)
                actual = json.loads(result.content[0].text)
                assert actual == result.structured_content
                assert bool(result.is_error) == (documented["status"] == "error")
                assert_like(documented, actual, f"example {number} ({tool})")


async def test_the_tool_table_of_the_doc_matches_the_servers_annotations(tmp_path: Path) -> None:
    rows = re.findall(
        r"^\| `(agenthold_\w+)` \| [^|]+ \| (yes|no) \| (yes|no) \| (yes|no) \|$",
        DOC.read_text(encoding="utf-8"),
        re.MULTILINE,
    )
    documented = {name: tuple(cell == "yes" for cell in cells) for name, *cells in rows}
    with StateStore(tmp_path / "doc.db") as store:
        coordinator = Coordinator(store, resolver=Resolver([Workspace("d", str(tmp_path))]))
        async with in_process_client(coordinator, tools="advanced") as (_, client):
            tools = (await client.list_tools()).tools
    served = {
        t.name: (
            t.annotations.read_only_hint,
            t.annotations.destructive_hint,
            t.annotations.idempotent_hint,
        )
        for t in tools
        if t.annotations is not None
    }
    assert documented == served


# --------------------------------------------------------------------------------------------
# docs/tools.md: the standard tools' replies
# --------------------------------------------------------------------------------------------

TOOLS_DOC = DOC.parent / "tools.md"
STANDARD_EXAMPLE = re.compile(
    r"\*\*Request\*\* to `(?P<tool>agenthold_\w+)`:\s*```json\n(?P<request>.*?)```"
    r"\s*\*\*Reply\*\*(?P<label>[^\n]*)\n\s*```json\n(?P<reply>.*?)```",
    re.DOTALL,
)
DOC_AGENT_ID = re.compile(r"agent-[0-9a-f]{16}")
MESSAGES_PART = "\n# The messages tools"


def tools_doc_parts() -> tuple[str, str]:
    """docs/tools.md's two parts: the standard tools, then the messages tools."""
    standard, messages = TOOLS_DOC.read_text(encoding="utf-8").split(MESSAGES_PART, 1)
    return standard, messages


def swap_ids(value: Any, ids: dict[str, str]) -> Any:
    """``value`` with every documented agent id replaced by the real one it stands for."""
    text = json.dumps(value)
    for documented, real in ids.items():
        text = text.replace(documented, real)
    return json.loads(text)


async def test_every_reply_in_the_standard_tools_doc_is_the_servers(tmp_path: Path) -> None:
    import os
    import sqlite3

    text = tools_doc_parts()[0]
    story = list(STANDARD_EXAMPLE.finditer(text))
    assert text.count("**Request**") == len(story), "a request without a reply block"
    statuses = {json.loads(m["reply"])["status"] for m in story}
    assert statuses == {
        "registered", "claimed", "already_claimed", "busy", "released", "already_free",
        "not_found", "available", "timeout", "unavailable", "error",
    }  # fmt: skip
    root = tmp_path / "proj"
    root.mkdir()
    (root / "AGENTS.md").write_text("rules")
    os.link(root / "AGENTS.md", root / "CLAUDE.md")
    ids: dict[str, str] = {}

    def check(number: int, tool: str, label: str, documented: Any, result: Any) -> None:
        actual = json.loads(result.content[0].text)
        assert actual == result.structured_content
        assert bool(result.is_error) == (documented["status"] == "error")
        assert ("isError" in label) == bool(result.is_error), f"example {number}"
        if tool == "agenthold_register":
            ids[documented["agent_id"]] = actual["agent_id"]
            documented["agent_id"] = actual["agent_id"]
        where = f"example {number} ({tool})"
        assert_like(swap_ids(documented, ids), actual, where)
        assert list(actual) == list(documented), f"{where}: field order"

    async def in_line() -> None:
        """Until a wait with claim is in the queue (the example after it must find it)."""
        with anyio.fail_after(5), contextlib.closing(sqlite3.connect(tmp_path / "doc.db")) as db:
            sql = "SELECT count(*) FROM claim_waiters WHERE granted IS NULL"
            while db.execute(sql).fetchone()[0] == 0:
                await anyio.sleep(0.01)

    with StateStore(tmp_path / "doc.db", busy_timeout=0.1) as store:
        coordinator = coordinator_at(store, root, claim_ttl=1800)
        async with (
            in_process_client(coordinator, tools="standard") as (_, client),
            anyio.create_task_group() as tg,
        ):
            waits: list[tuple[int, str, str, Any, dict[str, Any]]] = []  # answered later
            for number, match in enumerate(story, 1):
                tool, label = match["tool"], match["label"]
                request = swap_ids(json.loads(match["request"]), ids)
                documented = json.loads(match["reply"])
                if "meanwhile the wait is in line" in label:  # answered by a later example
                    box: dict[str, Any] = {}

                    async def wait(
                        tool: str = tool, request: Any = request, box: Any = box
                    ) -> None:
                        box["result"] = await client.call_tool(tool, request)

                    tg.start_soon(wait)
                    await in_line()
                    waits.append((number, tool, label, documented, box))
                    continue
                locker = None
                if "write lock" in label:  # another process holds the lock past the timeout
                    locker = sqlite3.connect(tmp_path / "doc.db", isolation_level=None)
                    locker.execute("BEGIN IMMEDIATE")
                try:
                    result = await client.call_tool(tool, request)
                finally:
                    if locker is not None:
                        locker.execute("ROLLBACK")
                        locker.close()
                check(number, tool, label, documented, result)
                if "the wait above answers" in label:
                    number, tool, label, documented, box = waits.pop()
                    with anyio.fail_after(5):
                        while "result" not in box:
                            await anyio.sleep(0.01)
                    check(number, tool, label, documented, box["result"])
            assert not waits, "a wait in line that no later example answered"
    assert len(ids) == 2 and all(DOC_AGENT_ID.fullmatch(i) for i in ids)


def test_the_standard_tools_doc_lists_every_field_the_replies_have() -> None:
    text = tools_doc_parts()[0]
    fields = set(re.findall(r"^\| `(\w+)` \|", text.split("### Fields", 1)[1], re.MULTILINE))
    in_examples = {
        key for m in STANDARD_EXAMPLE.finditer(text) for key in json.loads(m["reply"])
    } - {"status"}
    assert in_examples <= fields, in_examples - fields


# --------------------------------------------------------------------------------------------
# docs/tools.md, second part: the messages tools' replies
# --------------------------------------------------------------------------------------------

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def learn_ids(documented: Any, actual: Any, ids: dict[str, str]) -> None:
    """Map each documented UUID to the one the server gave in the same place, the first time
    it appears (the ids of agents and threads are random)."""
    if isinstance(documented, dict) and isinstance(actual, dict):
        for key, value in documented.items():
            if key in actual:
                learn_ids(value, actual[key], ids)
    elif isinstance(documented, list) and isinstance(actual, list):
        for d, a in zip(documented, actual, strict=False):
            learn_ids(d, a, ids)
    elif isinstance(documented, str) and UUID_RE.fullmatch(documented):
        found = UUID_RE.fullmatch(actual) if isinstance(actual, str) else None
        if found is not None:
            ids.setdefault(documented, found.group())


async def test_every_reply_in_the_messages_tools_doc_is_the_servers(tmp_path: Path) -> None:
    text = tools_doc_parts()[1]
    story = list(STANDARD_EXAMPLE.finditer(text))
    assert text.count("**Request**") == len(story), "a request without a reply block"
    from agenthold.message_tools import MESSAGES_NAMES

    assert {m["tool"] for m in story} == MESSAGES_NAMES  # every tool is shown
    ids: dict[str, str] = {}
    with StateStore(tmp_path / "doc.db") as store:
        async with in_process_client(coordinator_at(store, tmp_path), tools="messages") as (
            _,
            client,
        ):
            for number, match in enumerate(story, 1):
                tool, label = match["tool"], match["label"]
                request = swap_ids(json.loads(match["request"]), ids)
                documented = json.loads(match["reply"])
                result = await client.call_tool(tool, request)
                actual = json.loads(result.content[0].text)
                assert actual == result.structured_content
                assert ("isError" in label) == bool(result.is_error), f"example {number}"
                assert bool(result.is_error) == (documented["status"] == "error")
                learn_ids(documented, actual, ids)
                where = f"example {number} ({tool})"
                assert_like(swap_ids(documented, ids), actual, where)
                assert list(actual) == list(documented), f"{where}: field order"
    assert len(ids) >= 3  # two agents and a thread at least
