"""Replies sized for the hosts that read them: every listing tool's default page is at most
PAGE_BYTES of JSON (hosts refuse long tool replies; Claude Code at 25,000 tokens), says where to
read on, and paging through gives every item once, in order, on both backends. A caller that
asks for more (max_bytes) gets more, up to the 16 MiB every reply is held to.

Through a real MCP client (in-process), measuring the reply's text as the client received it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from support import coordinator_at, in_process_client, reply_of

from agenthold.serve.toolkit import MAX_REPLY_BYTES, PAGE_BYTES, fit_page, json_size
from agenthold.store import StateStore

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

# Values of a few kilobytes, with two-byte characters, so that a default page of any tool is
# cut by its bytes, well before its count limit: 100 list records of 3 kB are 300 kB.
VALUE = "é" * 700 + "v" * 1600


@asynccontextmanager
async def served(tmp_path: Path, db_url: str) -> AsyncIterator[Client]:
    with StateStore(db_url) as store:
        coordinator = coordinator_at(store, tmp_path)
        async with in_process_client(coordinator, tools="standard,advanced,messages") as (
            _,
            client,
        ):
            yield client


async def sized_call(client: Client, tool: str, **arguments: Any) -> tuple[dict[str, Any], int]:
    """A call's reply, and the bytes of its JSON text as the client got it (what a host
    counts against its limit)."""
    result = await client.call_tool(tool, arguments)
    text = result.content[0]
    assert text.type == "text"
    return reply_of(result), len(text.text.encode())


async def pages(
    client: Client, tool: str, cursor_field: str, cursor_arg: str, first: Any, **arguments: Any
) -> tuple[list[dict[str, Any]], list[int]]:
    """Every page of ``tool`` from ``first``, following its cursor: the pages, and their
    sizes. A page that says there is more always names a cursor past the last."""
    replies, sizes = [], []
    cursor = first
    for _ in range(1000):  # bounded: a cursor that never moved would loop forever
        more = {} if cursor is None else {cursor_arg: cursor}
        reply, size = await sized_call(client, tool, **arguments, **more)
        assert reply["status"] == "ok", reply
        replies.append(reply)
        sizes.append(size)
        ended = reply.get("more") is False if "more" in reply else reply[cursor_field] is None
        if ended:
            return replies, sizes
        assert reply[cursor_field] != cursor
        assert "more" in reply or "next_cursor" in reply["hint"]
        cursor = reply[cursor_field]
    raise AssertionError("the pages never ended")


async def test_list_pages_fit_the_default_figure_and_give_every_key_once(
    tmp_path: Path, db_url: str
) -> None:
    """100 keys of 3 kB: a default page (limit 100) is cut to at most PAGE_BYTES, and the
    pages give every key once, in order. One key of 200 kB comes alone, over the figure (a
    page holds at least one item). max_bytes asks for more: the whole namespace at once."""
    keys = [f"k{n:03d}" for n in range(100)]
    async with served(tmp_path, db_url) as client:
        for key in keys:
            await client.call_tool(
                "agenthold_set",
                {"namespace": "n", "key": key, "value": VALUE, "updated_by": "t", "force": True},
            )
        replies, sizes = await pages(client, "agenthold_list", "next_cursor", "cursor", None,
                                     namespace="n")  # fmt: skip
        assert len(replies) > 5 and max(sizes) <= PAGE_BYTES, sizes
        seen = [r["key"] for reply in replies for r in reply["records"]]
        assert seen == keys
        assert all(reply["count"] == len(reply["records"]) for reply in replies)
        assert all(r["value"] == VALUE for reply in replies for r in reply["records"])
        whole, size = await sized_call(
            client, "agenthold_list", namespace="n", max_bytes=MAX_REPLY_BYTES
        )
        assert [r["key"] for r in whole["records"]] == keys and whole["next_cursor"] is None
        assert size > PAGE_BYTES
        await client.call_tool(
            "agenthold_set",
            {"namespace": "n", "key": "k050", "value": "x" * 200_000, "updated_by": "t",
             "force": True},
        )  # fmt: skip
        alone, size = await sized_call(client, "agenthold_list", namespace="n", cursor="k049")
        assert [r["key"] for r in alone["records"]] == ["k050"] and size > PAGE_BYTES
        assert alone["next_cursor"] == "k050"


async def test_export_pages_fit_the_default_figure_and_give_every_key_and_entry_once(
    tmp_path: Path, db_url: str
) -> None:
    keys = [f"k{n:02d}" for n in range(40)]
    async with served(tmp_path, db_url) as client:
        for key in keys:
            for _ in range(2):
                await client.call_tool(
                    "agenthold_set",
                    {"namespace": "n", "key": key, "value": VALUE, "updated_by": "t",
                     "force": True},
                )  # fmt: skip
        replies, sizes = await pages(client, "agenthold_export", "next_cursor", "cursor", None,
                                     namespace="n")  # fmt: skip
        assert len(replies) > 5 and max(sizes) <= PAGE_BYTES, sizes
        assert [r["key"] for reply in replies for r in reply["records"]] == keys
        for reply in replies:
            assert reply["record_count"] == len(reply["records"])
            assert reply["history_count"] == 2 * len(reply["records"])
            assert all([h["version"] for h in r["history"]] == [2, 1] for r in reply["records"])


async def test_history_pages_fit_the_default_figure_and_give_every_entry_once(
    tmp_path: Path, db_url: str
) -> None:
    async with served(tmp_path, db_url) as client:
        for n in range(60):
            await client.call_tool(
                "agenthold_set",
                {"namespace": "n", "key": "k", "value": f"{n}{VALUE}", "updated_by": "t",
                 "force": True},
            )  # fmt: skip
        replies, sizes = await pages(client, "agenthold_history", "next_cursor", "cursor", None,
                                     namespace="n", key="k", limit=1000)  # fmt: skip
        assert len(replies) > 5 and max(sizes) <= PAGE_BYTES, sizes
        versions = [h["version"] for reply in replies for h in reply["history"]]
        assert versions == list(range(60, 0, -1))
        default, size = await sized_call(client, "agenthold_history", namespace="n", key="k")
        assert size <= PAGE_BYTES and default["next_cursor"] is not None  # limit 10: cut too


async def test_poll_and_wait_pages_fit_the_default_figure_and_give_every_message_once(
    tmp_path: Path, db_url: str
) -> None:
    async with served(tmp_path, db_url) as client:
        thread = reply_of(
            await client.call_tool("agenthold_create_thread", {"participant_names": ["a", "b"]})
        )
        tid = thread["thread_id"]
        for n in range(100):
            await client.call_tool(
                "agenthold_append", {"thread_id": tid, "sender_name": "a", "content": f"{n}{VALUE}"}
            )
        for tool, extra in (("agenthold_poll", {}), ("agenthold_wait_messages",
                                                     {"timeout_seconds": 0})):  # fmt: skip
            replies, sizes = await pages(client, tool, "next_after_seq", "after_seq", 0,
                                         thread_id=tid, **extra)  # fmt: skip
            replies = [r for r in replies if r["messages"]]  # wait's last: none after the end
            assert len(replies) > 5 and max(sizes) <= PAGE_BYTES, (tool, sizes)
            seqs = [m["seq"] for reply in replies for m in reply["messages"]]
            assert seqs == list(range(1, 101)), tool
            assert all(r["more"] for r in replies[:-1])
        # a poll that names its page size asks for more: it gets it, up to the reply's cap
        whole, size = await sized_call(client, "agenthold_poll", thread_id=tid, limit=100)
        assert len(whole["messages"]) == 100 and whole["more"] is False and size > PAGE_BYTES


async def test_a_status_of_many_long_names_is_cut_to_the_figure_and_names_the_rest(
    tmp_path: Path, db_url: str
) -> None:
    """A hundred claimed resources with 400-character names are about 80 kB of status: the
    reply holds the first ones that fit in PAGE_BYTES and says how many; asking again for
    the others answers each resource exactly once."""
    names = [f"src/{n:03d}-{'d' * 400}.py" for n in range(100)]
    async with served(tmp_path, db_url) as client:
        agent = reply_of(await client.call_tool("agenthold_register", {"name": "holder"}))
        for chunk in range(0, 100, 50):
            claimed = reply_of(
                await client.call_tool(
                    "agenthold_claim",
                    {"agent_id": agent["agent_id"], "resources": names[chunk : chunk + 50]},
                )
            )
            assert claimed["status"] == "claimed", claimed
        answered: list[str] = []
        asked = names
        for _ in range(100):
            reply, size = await sized_call(client, "agenthold_status", resources=asked)
            assert size <= PAGE_BYTES and reply["status"] == "claimed"
            answered += [r["resource"] for r in reply["resources"]]
            if "answered" not in reply:
                break
            kept = reply["answered"]
            assert kept == len(reply["resources"]) and f"after the first {kept}" in reply["hint"]
            assert reply["unanswered_count"] == len(asked) - kept
            asked = asked[kept:]
        assert answered == [f"file://default/{name}" for name in names]
        assert len(answered) == 100 and len(set(answered)) == 100


async def test_clearing_a_large_namespace_lists_the_keys_it_deleted_up_to_the_figure(
    tmp_path: Path, db_url: str
) -> None:
    keys = [f"key-{n:04d}-{'k' * 60}" for n in range(1000)]  # 70 kB of names
    async with served(tmp_path, db_url) as client:
        for key in keys:
            await client.call_tool(
                "agenthold_set",
                {"namespace": "n", "key": key, "value": 1, "updated_by": "t", "force": True},
            )
        reply, size = await sized_call(
            client, "agenthold_clear_namespace", namespace="n", deleted_by="t"
        )
        assert size <= PAGE_BYTES and reply["deleted_count"] == 1000
        shown = reply["deleted_keys"]
        assert 0 < len(shown) < 1000 and shown == keys[: len(shown)]
        assert f"first {len(shown):,} of the 1,000" in reply["hint"]
        listed = reply_of(await client.call_tool("agenthold_list", {"namespace": "n"}))
        assert listed["records"] == []


def test_a_page_is_cut_to_its_budget_whatever_its_cursor_adds() -> None:
    """fit_page counts the items, then checks the whole reply: a cursor that is long for the
    item it points after (a 3,000-character key) makes it keep one item fewer, never go over,
    and a single item over the budget still comes alone."""

    def finish(reply: dict[str, Any], kept: int) -> dict[str, Any]:
        if kept < 10:
            reply["next_cursor"] = "c" * (3000 if kept == 3 else 10)
        return reply

    items = ["x" * 300] * 10
    page = fit_page({"items": items}, "items", 1000, finish)
    assert json_size(page) <= 1000 and len(page["items"]) == 2, json_size(page)
    assert page["next_cursor"] == "c" * 10
    alone = fit_page({"items": ["y" * 5000, "z"]}, "items", 1000, finish)
    assert alone["items"] == ["y" * 5000] and "next_cursor" in alone
    whole = fit_page({"items": items}, "items", 10_000, finish)
    assert whole["items"] == items and "next_cursor" not in whole
