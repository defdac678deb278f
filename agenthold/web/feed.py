"""Server-sent events for the live page, fed by the database's change feed.

Decisions behind it:
- One subscription to every topic (``db.subscribe(None, ...)``, as ``agenthold log --follow``
  does) for the whole process, however many pages are open. The change feed calls back from
  its own thread; the callback only sets an asyncio event on the loop.
- One reader: on a change, the hub reads the overview and the new events once, in a worker
  thread (the reads block), and hands the result to every stream. Changes that arrive while it
  reads are gathered into the next read, and reads are at least ``SETTLE`` apart, so a burst of
  a thousand commits costs a few reads, not a thousand.
- A stream never holds back the others: each has a small queue of its own. When a browser
  reads too slowly and its queue is full, its oldest overview is dropped for the newest (only
  the latest state matters) and, if events were dropped too, it is told to page the log again
  (``resync``). sse-starlette's ``send_timeout`` ends a stream whose socket has not taken a
  message within that time, so a stuck browser holds at most one task and one socket.
- A safety net: the hub also looks every ``RECHECK`` seconds, and sends the overview when it
  differs from the last one sent. Besides catching anything the feed missed, this is how the
  page hears of a wait that joins a queue: that write names no change-feed topic (no event row
  is written for it), so it shows within ``RECHECK`` rather than at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio.to_thread

if TYPE_CHECKING:
    from agenthold.identity.principals import Principal
    from agenthold.web.views import View

SETTLE = 0.05  # seconds between two reads at most once
RECHECK = 1.0  # seconds between looks when the feed says nothing
QUEUE = 8  # messages waiting for one stream before it is resynced
SEND_TIMEOUT = 30.0  # seconds a stream's socket may take to accept one message
PING = 15  # seconds between keep-alive comments


class Hub:
    """The change feed of one View, fanned out to the streams of open pages."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.streams: set[Stream] = set()
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscription: Any = None
        self.positions: list[Any] = []
        self.overview: dict[str, Any] | None = None
        self.reads = 0

    async def run(self) -> None:
        """Follow the database until cancelled."""
        self._loop = asyncio.get_running_loop()
        # subscribed first, then the positions read: no commit falls between the two
        self._subscription = self.view.store.db.subscribe(None, self._nudge)
        try:
            self.positions = await anyio.to_thread.run_sync(self.view.positions)
            while True:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), RECHECK)
                self._changed.clear()
                await self.look()
                await asyncio.sleep(SETTLE)
        finally:
            self._subscription.close()

    def close_streams(self) -> None:
        """End every open stream (the server is stopping): each gets its last message."""
        for stream in list(self.streams):
            while not stream.queue.empty():
                stream.queue.get_nowait()
            stream.queue.put_nowait(("close", None))

    def _nudge(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed between the two
                loop.call_soon_threadsafe(self._changed.set)

    async def look(self) -> None:
        """Read what changed and hand it to every stream."""
        events, overview = await anyio.to_thread.run_sync(self._read)
        self.reads += 1
        same = self.overview is not None and _facts(self.overview) == _facts(overview)
        self.overview = overview
        if same and not events:
            return
        for stream in list(self.streams):
            stream.offer(overview, events)

    def _read(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        events = self.view.new_events(self.positions)
        return events, self.view.overview()


def _facts(overview: dict[str, Any]) -> dict[str, Any]:
    """An overview without its clock reading: what is compared to tell whether it changed."""
    return {k: v for k, v in overview.items() if k != "now"}


class Stream:
    """One open page's stream: what it has not been sent yet."""

    def __init__(self, hub: Hub, principal: Principal | None) -> None:
        self.hub = hub
        self.principal = principal
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(QUEUE)
        self.opened = time.monotonic()

    def offer(self, overview: dict[str, Any], events: list[dict[str, Any]]) -> None:
        shown = [e for e in events if self.hub.view.visible(e, self.principal)]
        items: list[tuple[str, Any]] = [("overview", overview)]
        if shown:
            items.append(("events", shown))
        for item in items:
            if self.queue.full():  # a slow reader: start it again from the latest state
                while not self.queue.empty():
                    self.queue.get_nowait()
                self.queue.put_nowait(("resync", {}))
            if not self.queue.full():
                self.queue.put_nowait(item)

    async def messages(self) -> AsyncIterator[dict[str, str]]:
        """The server-sent events of this stream, the current overview first."""
        self.hub.streams.add(self)
        try:
            overview = self.hub.overview
            if overview is None:
                overview = await anyio.to_thread.run_sync(self.hub.view.overview, self.principal)
            yield self.event("overview", overview)
            while True:
                kind, data = await self.queue.get()
                if kind == "close":
                    return
                yield self.event(kind, data)
        finally:
            self.hub.streams.discard(self)

    def event(self, kind: str, data: Any) -> dict[str, str]:
        if kind == "overview" and self.principal is not None:
            data = self.hub.view.scoped(data, self.principal)
        return {"event": kind, "data": json.dumps(data, ensure_ascii=False)}
