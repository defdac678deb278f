"""Pages of large values are built without reading past their byte budget, on both backends.

A page (list_page, export, history_page, poll) first reads its candidate rows' sizes, then the
values of those that fit, so a namespace, history or thread of many 1 MB values costs the memory
of one page, not of all of it. The memory is measured with tracemalloc around each call (every
str the database driver hands over is counted there), beside what the whole would take.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from agenthold.messages import MessageBus
from agenthold.store import MAX_PAGE_BYTES, InvalidInputError, KeyTooLargeError, StateStore

T = TypeVar("T")

BIG = 1_000_000  # characters of each value: 1 MB of JSON, under the 1 MiB value limit
COUNT = 24  # values of it: 24 MB, six times a page's budget
FITS = MAX_PAGE_BYTES // (BIG + 2)  # values a 4 MiB page holds: 4
CEILING = 3 * MAX_PAGE_BYTES  # a page's values, their decoded copies and the rest, with room


def peak_of(run: Callable[[], T]) -> tuple[T, int]:
    """What ``run`` returns, and the most memory Python held while it ran, in bytes."""
    tracemalloc.start()
    try:
        found = run()
        return found, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def big(i: int) -> str:
    return f"{i:02d}" + "x" * (BIG - 2)


@pytest.fixture
def bus(store: StateStore) -> Iterator[MessageBus]:
    with MessageBus(store) as b:
        yield b


@pytest.mark.slow  # megabytes of values: seconds in one process
@pytest.mark.backends
def test_list_and_export_pages_of_large_values_read_only_what_they_return(
    store: StateStore,
) -> None:
    keys = [f"k{i:02d}" for i in range(COUNT)]
    for i, key in enumerate(keys):
        store.set("ns", key, big(i), updated_by="w")
    (page, nxt), peak = peak_of(lambda: store.list_page("ns", limit=1000))
    assert [r.key for r in page] == keys[:FITS] and nxt == keys[FITS - 1]
    assert peak < CEILING < COUNT * BIG, f"{peak / 2**20:.1f} MiB for one page"
    part, peak = peak_of(lambda: store.export("ns", limit=1000, max_bytes=MAX_PAGE_BYTES))
    fits = FITS // 2  # a key's live value and its one history entry both count
    assert [r.record.key for r in part.records] == keys[:fits]
    assert part.next_after == keys[fits - 1]
    assert [len(r.history) for r in part.records] == [1] * fits
    assert peak < CEILING, f"{peak / 2**20:.1f} MiB for one export page"
    listed, exported, after = [], [], ""  # following the cursors covers every key once
    while True:
        page, nxt = store.list_page("ns", after=after)
        listed += [r.key for r in page]
        if nxt is None:
            break
        after = nxt
    after = ""
    while True:
        part = store.export("ns", after=after, max_bytes=MAX_PAGE_BYTES)
        exported += [r.record.key for r in part.records]
        assert all(r.record.value == big(keys.index(r.record.key)) for r in part.records)
        if part.next_after is None:
            break
        after = part.next_after
    assert listed == exported == keys
    whole, peak = peak_of(lambda: store.export("ns"))  # unpaged, as asked: all of it
    assert whole.record_count == COUNT and peak > COUNT * BIG


@pytest.mark.backends
def test_an_export_page_refuses_a_key_over_its_budget_without_reading_it(
    store: StateStore,
) -> None:
    """A key written six times at 1 MB (7 MB of value and history, over a page's 4 MiB) cannot
    be exported whole within the budget: the page that would start with it raises
    KeyTooLargeError from the sizes alone, its values never read (the peak stays under one
    value). A page before it stops short of it; after=key exports on past it; its history
    reads in pages."""
    store.set("ns", "a", 1, updated_by="w")
    for i in range(6):
        store.set("ns", "huge", big(i), updated_by="w")
    store.set("ns", "z", 2, updated_by="w")
    part = store.export("ns", max_bytes=MAX_PAGE_BYTES)
    assert [r.record.key for r in part.records] == ["a"] and part.next_after == "a"

    def refused() -> KeyTooLargeError:
        with pytest.raises(KeyTooLargeError) as caught:
            store.export("ns", after="a", max_bytes=MAX_PAGE_BYTES)
        return caught.value

    error, peak = peak_of(refused)
    assert peak < BIG, f"{peak / 2**20:.1f} MiB read to refuse it"
    assert (error.namespace, error.key, error.max_bytes) == ("ns", "huge", MAX_PAGE_BYTES)
    assert error.size == 7 * (BIG + 2)  # six history entries and the live value, as JSON
    assert "history_page" in (error.hint or "") and "after" in (error.hint or "")
    rest = store.export("ns", after="huge", max_bytes=MAX_PAGE_BYTES)
    assert [r.record.key for r in rest.records] == ["z"] and rest.next_after is None
    entries, before = store.history_page("ns", "huge", max_bytes=MAX_PAGE_BYTES)
    assert len(entries) == FITS and before is not None
    assert store.export("ns").record_count == 3  # unpaged, as asked: all of it


@pytest.mark.slow  # megabytes of values: seconds in one process
@pytest.mark.backends
def test_a_history_page_of_large_values_stops_at_its_budget_and_pages_cover_it_once(
    store: StateStore,
) -> None:
    for i in range(12):
        store.set("ns", "k", big(i), updated_by="w")
    store.delete("ns", "k", deleted_by="w")  # a tombstone has no value: it costs nothing
    (entries, before), peak = peak_of(lambda: store.history_page("ns", "k", limit=1000))
    assert [e.version for e in entries] == list(range(13, 13 - FITS - 1, -1))
    assert before == 13 - FITS and peak < CEILING, f"{peak / 2**20:.1f} MiB"
    seen: list[int] = []
    before = None
    while True:
        entries, before = store.history_page("ns", "k", before=before, limit=3)
        assert 1 <= len(entries) <= 3
        seen += [e.version for e in entries]
        if before is None:
            break
    assert seen == list(range(13, 0, -1))
    assert store.history_page("ns", "k", before=1) == ([], None)
    assert [e.version for e in store.history("ns", "k", limit=20)] == seen  # no byte bound
    unbounded, before = store.history_page("ns", "k", limit=5, max_bytes=None)
    assert ([e.version for e in unbounded], before) == ([13, 12, 11, 10, 9], 9)
    for bad in ({"before": 0}, {"before": 2**63}, {"max_bytes": 0}, {"limit": 0}):
        with pytest.raises(InvalidInputError):  # 2**63: past SQL's integers, not an OverflowError
            store.history_page("ns", "k", **bad)  # type: ignore[arg-type]


@pytest.mark.backends
def test_a_poll_of_large_messages_stops_at_its_budget_and_more_says_so(bus: MessageBus) -> None:
    alice = bus.get_or_create_agent("Alice")
    bob = bus.get_or_create_agent("Bob")
    thread = bus.create_thread(alice, bob).id
    for i in range(12):
        bus.append(thread, alice, big(i))
    page, peak = peak_of(lambda: bus.poll(thread, limit=1000))
    assert [m.seq for m in page] == list(range(1, FITS + 1))
    assert page.more and page.next_after_seq == FITS
    assert peak < CEILING, f"{peak / 2**20:.1f} MiB for one poll"
    waited = bus.wait(thread, after_seq=FITS, timeout=0, limit=1000)
    assert [m.seq for m in waited] == list(range(FITS + 1, 2 * FITS + 1)) and waited.more
    seqs: list[int] = []
    after = 0
    while True:
        page = bus.poll(thread, after, limit=5, max_bytes=3 * BIG)  # three fit, never more
        assert 1 <= len(page) <= 3
        seqs += [m.seq for m in page]
        assert [m.content for m in page] == [big(s - 1) for s in (m.seq for m in page)]
        if not page.more:
            break
        after = page.next_after_seq
    assert seqs == list(range(1, 13))
    one = bus.poll(thread, limit=1000, max_bytes=1)  # past the first, nothing fits: one a page
    assert [m.seq for m in one] == [1] and one.more
    with pytest.raises(InvalidInputError):
        bus.poll(thread, max_bytes=0)


def test_a_page_longer_than_one_batch_of_sizes_is_read_whole(store: StateStore) -> None:
    """page_end reads sizes SIZE_BATCH rows at a time: a page of 2,100 keys takes three
    statements and still stops exactly at its limit."""
    from agenthold.store import SIZE_BATCH

    keys = [f"k{i:04d}" for i in range(2 * SIZE_BATCH + 100)]
    for key in keys:
        store.set("ns", key, 1, updated_by="w")
    page, nxt = store.list_page("ns", limit=2 * SIZE_BATCH + 50)
    assert [r.key for r in page] == keys[: 2 * SIZE_BATCH + 50] and nxt == page[-1].key
    page, nxt = store.list_page("ns", limit=10**6)
    assert len(page) == len(keys) and nxt is None
    part = store.export("ns", after=keys[SIZE_BATCH - 1], limit=SIZE_BATCH + 1)
    assert part.records[-1].record.key == keys[2 * SIZE_BATCH] and part.next_after is not None


@pytest.mark.backends
def test_the_budget_counts_bytes_of_utf_8_not_characters(store: StateStore) -> None:
    """A value of 250,000 four-byte characters is 1 MB of UTF-8 (the value limit counts those
    bytes too): a page holds as many of them as of 1 MB ASCII values, not four times as many.
    The same holds for the export, history and poll pages, which share the rule."""
    wide = "\U0001f600" * (BIG // 4 - 1)  # under the 1 MiB limit as UTF-8 JSON
    keys = [f"k{i:02d}" for i in range(12)]
    for key in keys:
        store.set("ns", key, wide, updated_by="w")
        store.set("one", "k", wide, updated_by="w")
    page, nxt = store.list_page("ns", limit=1000)
    assert [r.key for r in page] == keys[:FITS] and nxt == keys[FITS - 1]
    part = store.export("ns", limit=1000, max_bytes=MAX_PAGE_BYTES)
    assert len(part.records) == FITS // 2
    history, _ = store.history_page("one", "k", limit=1000, max_bytes=MAX_PAGE_BYTES)
    assert len(history) == FITS
    with MessageBus(store) as bus:
        alice = bus.get_or_create_agent("Alice")
        thread = bus.create_thread(alice, bus.get_or_create_agent("Bob")).id
        for _ in range(8):
            bus.append(thread, alice, wide)
        assert len(bus.poll(thread, limit=1000)) == FITS
