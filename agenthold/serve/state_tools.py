"""The advanced tool set: the versioned state store (get, set, list, history, delete, watch,
clear_namespace, export) over store.StateStore, with the wording agents read.

Decisions behind it:
- Writes check versions unless the call says ``force``; a conflict is a reply, not an error,
  carrying the current value so the agent can merge and retry.
- A watch holds no thread: it reads the key in a short read and sleeps on the change feed
  (``App.wait_for``) until the key's topic changes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agenthold.serve.toolkit import (
    MAX_REPLY_BYTES,
    PAGE_BYTES,
    PAGE_MAX_BYTES,
    WAIT_TIMEOUT,
    App,
    Param,
    Reply,
    ToolCall,
    ToolError,
    ToolSpec,
    fit_page,
)
from agenthold.store import (
    MAX_KEY_LENGTH,
    MAX_SQL_INT,
    ConflictError,
    DamagedRecordError,
    HistoryCompactedError,
    KeyTooLargeError,
    NotFoundError,
    Record,
    key_topic,
)

MAX_HISTORY_LIMIT = 1000
MAX_VERSION = 2**63 - 1  # SQLite's largest integer: no key's version can be above it

NAMESPACE = Param("namespace", "string", "the namespace: a group of keys, e.g. order-1234")
KEY = Param("key", "string", "the key within the namespace")
MAX_PAGE = 1000
PAGE_LIMIT = Param(
    "limit", "integer", f"records in this page (1 to {MAX_PAGE})", False, 100, minimum=1,
    maximum=MAX_PAGE,
)  # fmt: skip
CURSOR = Param(
    "cursor", "string", "next_cursor of the previous page, to read on from there", False,
    max_length=MAX_KEY_LENGTH,
)  # fmt: skip
HISTORY_CURSOR = Param(
    "cursor", "string", "next_cursor of the previous page, to read older entries from there",
    False, max_length=20,
)  # fmt: skip
MORE_HINT = "More records remain: call again with cursor set to next_cursor."
MORE_HISTORY_HINT = "Older entries remain: call again with cursor set to next_cursor."

# What an agent is told to do about a library error, in tool names (the library's own hints
# name its methods); the server uses these for calls of this set's tools.
ERROR_HINTS: dict[type[Exception], str] = {
    DamagedRecordError: (
        "Only this key is affected; the rest of its namespace reads as usual. Overwrite it with "
        "agenthold_set (force: true) or remove it with agenthold_delete; its earlier values are "
        "in agenthold_history."
    ),
    HistoryCompactedError: (
        "The database's retention rules removed those versions. Call agenthold_history without "
        "cursor for what is kept, or agenthold_get and watch from the version it returns."
    ),
}

ADVANCED_NAMES = frozenset(
    {"agenthold_get", "agenthold_set", "agenthold_list", "agenthold_history",
     "agenthold_delete", "agenthold_watch", "agenthold_clear_namespace", "agenthold_export"}
)  # fmt: skip


class StoreHandlers:
    """The handlers of the advanced tools, over one application."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.store = app.store

    async def get(self, call: ToolCall) -> Reply:
        ns, key = call.args["namespace"], call.args["key"]
        try:
            record: Record = await self.app.read(self.store.get, ns, key)
        except NotFoundError:
            return {
                "status": "not_found",
                "namespace": ns,
                "key": key,
                "hint": "No live value. To create it, call agenthold_set with expected_version 0.",
            }
        return {"status": "ok", **record.to_dict()}

    async def set(self, call: ToolCall) -> Reply:
        a = call.args
        expected = _expected_version(
            "agenthold_set",
            a,
            "Pass the version you read with agenthold_get, or 0 to create a new key.",
        )
        try:
            done = await self.app.write(
                lambda: self.store.set(
                    a["namespace"], a["key"], a["value"], updated_by=a["updated_by"],
                    expected_version=expected, principal=call.by,
                )
            )  # fmt: skip
        except ConflictError as exc:
            return conflict_reply(exc)
        return {"status": "ok", **done.to_dict()}

    async def list(self, call: ToolCall) -> Reply:
        a = call.args
        damaged: list[DamagedRecordError] = []
        records, after = await self.app.read(
            lambda: self.store.list_page(a["namespace"], **_page(a), damaged=damaged)
        )
        reply: Reply = {
            "status": "ok",
            "namespace": a["namespace"],
            "count": len(records),
            "records": [_without_namespace(r) for r in records],
        }
        keys = [r.key for r in records]
        return fit_page(reply, "records", a["max_bytes"], _keys_paged(keys, after, damaged))

    async def history(self, call: ToolCall) -> Reply:
        a = call.args
        damaged: list[DamagedRecordError] = []
        cursor = a["cursor"]
        if cursor is not None and not (
            cursor.isascii() and cursor.isdigit() and 0 < int(cursor) <= MAX_SQL_INT
        ):
            raise ToolError(
                f"cursor {cursor!r} is not a next_cursor that agenthold_history gave",
                "Leave cursor out to read from the newest entry, or pass the next_cursor of "
                "the previous page as it came.",
            )
        entries, before = await self.app.read(
            lambda: self.store.history_page(
                a["namespace"],
                a["key"],
                before=None if cursor is None else int(cursor),
                limit=a["limit"],
                max_bytes=a["max_bytes"],
                damaged=damaged,
            )
        )
        reply: Reply = {
            "status": "ok",
            "namespace": a["namespace"],
            "key": a["key"],
            "history": [e.to_dict() for e in entries],
        }
        if before is None and entries and entries[-1].version > 1:  # older ones compacted?
            kept = await self.app.read(self.store.compacted_before, a["namespace"], a["key"])
            if kept > 1:
                reply["compacted_before"] = kept

        def finish(reply: Reply, kept: int) -> Reply:
            cursor = None if before is None else str(before)
            shown = damaged
            if kept < len(entries):  # cut to fit: read on below the last entry kept
                oldest = entries[kept - 1].version
                cursor = str(oldest)
                shown = [d for d in damaged if d.version > oldest]
            return _paged(_with_damaged(reply, shown), cursor, MORE_HISTORY_HINT)

        return fit_page(reply, "history", a["max_bytes"], finish)

    async def delete(self, call: ToolCall) -> Reply:
        a = call.args
        expected = _expected_version(
            "agenthold_delete", a, "Pass the version you read with agenthold_get."
        )
        try:
            done = await self.app.write(
                lambda: self.store.delete(
                    a["namespace"],
                    a["key"],
                    deleted_by=a["deleted_by"],
                    expected_version=expected,
                    principal=call.by,
                )
            )
        except NotFoundError:
            return {
                "status": "not_found",
                "namespace": a["namespace"],
                "key": a["key"],
                "hint": "The key has no live value, so there is nothing to delete.",
            }
        except ConflictError as exc:
            return conflict_reply(exc)
        return {"status": "ok", **done.to_dict()}

    async def watch(self, call: ToolCall) -> Reply:
        a = call.args
        ns, key, since = a["namespace"], a["key"], a["since_version"]
        store = self.store
        await self.app.read(store.changed_since, ns, key, since)  # checks the names up front
        start = time.monotonic()
        topics = [key_topic(ns, key)]

        async def look() -> tuple[Reply | None, Iterable[tuple[str, ...]], float | None]:
            record = await self.app.read(store.changed_since, ns, key, since)
            return (None if record is None else watched_reply(record)), topics, None

        async def give_up() -> Reply:
            record = await self.app.read(store.changed_since, ns, key, since)
            if record is not None:
                return watched_reply(record)
            return {
                "status": "timeout",
                "namespace": ns,
                "key": key,
                "since_version": since,
                "elapsed_seconds": round(time.monotonic() - start, 3),
                "hint": (
                    "The key did not change in time. Watch again with the same since_version, "
                    "or read it with agenthold_get."
                ),
            }

        timeout = a["timeout_seconds"]
        progress = call.progress(timeout, f"{key!r} in {ns!r} to change after version {since}")
        return await self.app.wait_for(look, give_up, timeout, progress)

    async def clear_namespace(self, call: ToolCall) -> Reply:
        a = call.args
        keys = await self.app.write(
            lambda: self.store.clear_namespace(
                a["namespace"], deleted_by=a["deleted_by"], principal=call.by
            )
        )
        reply: Reply = {
            "status": "ok",
            "namespace": a["namespace"],
            "deleted_count": len(keys),
            "deleted_keys": keys,
            "deleted_by": a["deleted_by"],
        }

        def finish(reply: Reply, kept: int) -> Reply:
            if kept < len(keys):  # a write cannot be paged: the count says how many there were
                reply["hint"] = (
                    f"deleted_keys lists the first {kept:,} of the {len(keys):,} keys deleted, "
                    f"to keep this reply under {PAGE_BYTES:,} bytes; each key's delete is in "
                    "its agenthold_history."
                )
            return reply

        return fit_page(reply, "deleted_keys", PAGE_BYTES, finish)

    async def export(self, call: ToolCall) -> Reply:
        a = call.args
        damaged: list[DamagedRecordError] = []
        try:
            snapshot = await self.app.read(
                lambda: self.store.export(a["namespace"], **_page(a), damaged=damaged)
            )
        except KeyTooLargeError as exc:  # a smaller limit cannot help: the key alone is over
            raise ToolError(
                str(exc),
                f"Call again with a larger max_bytes (up to {MAX_REPLY_BYTES:,}) to export it "
                f"whole, or read this key's history a page at a time with agenthold_history "
                f"(namespace "
                f"{exc.namespace!r}, key {exc.key!r}; follow its next_cursor) and its value "
                f"with agenthold_get. To export the keys after it, call agenthold_export "
                f"again with cursor set to {json.dumps(exc.key, ensure_ascii=False)}.",
                kind="key_too_large",
            ) from None
        reply: Reply = {"status": "ok", **snapshot.to_dict()}
        keys = [r.record.key for r in snapshot.records]
        finish = _keys_paged(keys, snapshot.next_after, damaged)
        return fit_page(reply, "records", a["max_bytes"], finish)


def _expected_version(tool: str, args: dict[str, Any], hint: str) -> int | None:
    """The version check a write asks for: None with force (no check), else the
    expected_version, which is then required."""
    if args["force"]:
        return None
    if args["expected_version"] is None:
        raise ToolError(f"{tool} needs expected_version (or force: true)", hint)
    return int(args["expected_version"])


def _page(args: dict[str, Any]) -> dict[str, Any]:
    """Which page a paged tool's call asks for, as list_page and export take it: no more
    stored text than the reply may hold (fit_page then bounds the reply itself)."""
    return {"after": args["cursor"] or "", "limit": args["limit"], "max_bytes": args["max_bytes"]}


def _keys_paged(
    keys: Sequence[str], after: str | None, damaged: list[DamagedRecordError]
) -> Callable[[Reply, int], Reply]:
    """How fit_page finishes a page of keys (list, export): cut to ``kept`` records, it reads
    on after the last key kept, counts what it kept, and names only the damaged keys before
    that one (the next page names the others)."""

    def finish(reply: Reply, kept: int) -> Reply:
        cursor, shown = after, damaged
        if kept < len(keys):
            cursor = keys[kept - 1]
            shown = [d for d in damaged if d.key < cursor]
        if "count" in reply:
            reply["count"] = kept
        if "record_count" in reply:  # an export's page
            reply["record_count"] = kept
            reply["history_count"] = sum(len(r["history"]) for r in reply["records"])
        return _paged(_with_damaged(reply, shown), cursor)

    return finish


def _paged(reply: Reply, next_after: str | None, more: str = MORE_HINT) -> Reply:
    """``reply`` with where the next page starts (None on the last), and the hint ``more``
    while more remain."""
    reply["next_cursor"] = next_after
    if next_after is not None:
        reply["hint"] = f"{reply['hint']} {more}" if "hint" in reply else more
    return reply


def _with_damaged(reply: Reply, damaged: list[DamagedRecordError]) -> Reply:
    """``reply`` naming the values it left out (a key's live value, or a history entry)
    because their stored text is not strict JSON; only when there are some, so a healthy
    namespace's reply is as the spec shows it."""
    if damaged:
        reply["damaged"] = [e.to_dict() for e in damaged]
        reply["hint"] = (
            f"{len(damaged)} stored value(s) were left out: they are not valid JSON (see "
            "damaged; the rest is complete). A damaged live value is repaired by overwriting it "
            "with agenthold_set (force: true) or deleting it."
        )
    return reply


def _without_namespace(record: Record) -> Reply:
    d = record.to_dict()
    del d["namespace"]
    return d


def conflict_reply(exc: ConflictError) -> Reply:
    d = exc.detail
    live = d["actual_version"] != 0
    return {
        "status": "conflict",
        **d,
        "hint": (
            "Another agent wrote first. Apply your change to actual_value (or call "
            "agenthold_get) and retry with expected_version set to actual_version."
            if live
            else "The key has no live value now (it was deleted, or never written). To create "
            "it, retry with expected_version 0."
        ),
    }


def watched_reply(record: Record) -> Reply:
    if record.deleted:
        return {
            "status": "deleted",
            "namespace": record.namespace,
            "key": record.key,
            "version": record.version,
            "deleted_by": record.updated_by,
            "deleted_at": record.updated_at,
            "hint": (
                f"The key was deleted. To wait for it to be written again, watch with "
                f"since_version {record.version}."
            ),
        }
    return {"status": "ok", **record.to_dict()}


def advanced_tools(app: App) -> list[ToolSpec]:
    a = StoreHandlers(app)
    expected = Param(
        "expected_version",
        "integer",
        "the version you read with agenthold_get, or 0 for a key that must not exist yet "
        "(ignored with force: true)",
        required=False,
        advertised=True,
        minimum=0,
        maximum=MAX_VERSION,
    )
    force = Param(
        "force",
        "boolean",
        "true skips the version check (expected_version is then ignored)",
        required=False,
        default=False,
    )
    return [
        ToolSpec(
            "agenthold_get",
            "Read a value",
            "Read a value from the shared store, with its version. Keep the version: pass it "
            "as expected_version to agenthold_set, so your write is refused if another agent "
            "wrote in between. Replies 'ok' or 'not_found'.",
            (NAMESPACE, KEY),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.get,
        ),
        ToolSpec(
            "agenthold_set",
            "Write a value, checking its version",
            "Write a JSON value. expected_version is the version you read (agenthold_get), or "
            "0 to create a key that must not exist yet. If another agent wrote first, the "
            "reply is 'conflict' with actual_value and actual_version: apply your change to "
            "that value and retry with expected_version set to actual_version. force: true "
            "writes without the check; use it only to seed a value or for writes that are "
            "safe to repeat.",
            (
                NAMESPACE,
                KEY,
                Param("value", "json", "the new value: any JSON"),
                Param("updated_by", "string", "who is writing: your name or agent_id"),
                expected,
                force,
            ),
            read_only=False,
            destructive=True,
            idempotent=False,
            handler=a.set,
        ),
        ToolSpec(
            "agenthold_list",
            "List a namespace",
            "List the live values of a namespace, sorted by key, with versions, writers and "
            "times, a page at a time: while next_cursor is not null, call again with it.",
            (NAMESPACE, PAGE_LIMIT, CURSOR, PAGE_MAX_BYTES),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.list,
        ),
        ToolSpec(
            "agenthold_history",
            "A key's history",
            "Show a key's writes and deletes, newest first, with who made each and when. "
            "Deletes have event_type 'delete' and value null. An empty list means the key "
            "was never written. Large values come a page at a time: while next_cursor is "
            "not null, call again with it for older entries.",
            (
                NAMESPACE,
                KEY,
                Param(
                    "limit",
                    "integer",
                    f"how many entries, newest first (1 to {MAX_HISTORY_LIMIT})",
                    False,
                    10,
                    minimum=1,
                    maximum=MAX_HISTORY_LIMIT,
                ),
                HISTORY_CURSOR,
                PAGE_MAX_BYTES,
            ),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.history,
        ),
        ToolSpec(
            "agenthold_delete",
            "Delete a key, checking its version",
            "Delete a key. expected_version must be the version you read (or pass force: "
            "true). The delete stays in the key's history, and the key's version keeps "
            "counting up if it is written again.",
            (
                NAMESPACE,
                KEY,
                Param("deleted_by", "string", "who is deleting: your name or agent_id"),
                expected,
                force,
            ),
            read_only=False,
            destructive=True,
            idempotent=False,
            handler=a.delete,
        ),
        ToolSpec(
            "agenthold_watch",
            "Wait for a key to change",
            "Wait until a key's version goes above since_version, then get its new value "
            "('ok'), 'deleted' if it was deleted, or 'timeout' after timeout_seconds. Use "
            "since_version 0 to wait until a key has a value (also after it was deleted). Your "
            "turn is blocked while you wait: watch only when you have nothing else to do.",
            (
                NAMESPACE,
                KEY,
                Param(
                    "since_version",
                    "integer",
                    "the version you already know (0: none)",
                    minimum=0,
                    maximum=MAX_VERSION,
                ),
                WAIT_TIMEOUT,
            ),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.watch,
        ),
        ToolSpec(
            "agenthold_clear_namespace",
            "Delete a whole namespace",
            "Delete every key of a namespace in one step (each delete stays in history). "
            "There is no version check, so use it only when you mean to wipe the namespace.",
            (NAMESPACE, Param("deleted_by", "string", "who is deleting: your name or agent_id")),
            read_only=False,
            destructive=True,
            idempotent=True,
            handler=a.clear_namespace,
        ),
        ToolSpec(
            "agenthold_export",
            "Export a namespace with its history",
            "Return the live values of a namespace with their complete histories, a page of "
            "keys at a time (each page one consistent snapshot); while next_cursor is not "
            "null, call again with it. Prefer agenthold_list for a quick look.",
            (NAMESPACE, PAGE_LIMIT, CURSOR, PAGE_MAX_BYTES),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.export,
        ),
    ]
