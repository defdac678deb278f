"""Text for terminals: widths of wide and combining characters, cutting with "…", escaping
what a terminal would not show as itself, short ages and times, and aligned tables whose
columns shrink by rank to fit the terminal. The standard library only, imported lazily where it
costs (the inspector must start in tens of milliseconds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

GAP = "  "  # between table columns

# --------------------------------------------------------------------------------------------
# Showing text: widths, cuts, ages
# --------------------------------------------------------------------------------------------


def _char_width(char: str) -> int:
    """Terminal cells one character takes: 2 for wide (CJK, most emoji), 0 for combining."""
    import unicodedata

    if unicodedata.combining(char) or char in "\u200b\u200c\u200d\ufeff":
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def text_width(text: str) -> int:
    """Terminal cells ``text`` takes."""
    if text.isascii():
        return len(text)
    return sum(_char_width(c) for c in text)


def cut(text: str, width: int) -> str:
    """``text`` if it fits in ``width`` cells, else its start and "…" in ``width`` cells."""
    if text_width(text) <= width:
        return text
    if width <= 0:
        return ""
    kept: list[str] = []
    used = 0
    for char in text:
        w = _char_width(char)
        if used + w > width - 1:
            break
        kept.append(char)
        used += w
    return "".join(kept) + "…"


def clean(text: str, limit: int) -> str:
    """``text`` made safe for a terminal (control characters shown as escapes, so a value can
    never move the cursor or change colours) and cut to at most about ``limit`` cells."""
    import re

    if len(text) > limit:
        text = text[:limit] + "…"
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", text)


def compact_json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


DAMAGED = "(damaged: not valid JSON)"  # a stored value another tool wrote, or a damaged one


def flagged(read: Callable[[list[Any]], Iterable[Any]], **shape: Any) -> list[dict[str, Any]]:
    """The records ``read(damaged)`` returns as dicts, and the values the store left out as
    damaged (it appends their DamagedRecordErrors to ``damaged``) as dicts with ``shape``'s
    fields and ``"damaged": true``; sorted by key, or (history) newest version first."""
    damaged: list[Any] = []
    records = [r.to_dict() for r in read(damaged)]
    records += [{**e.to_dict(), **shape, "damaged": True} for e in damaged]
    if "namespace" in shape:
        records.sort(key=lambda r: str(r["key"]))
    else:
        records.sort(key=lambda r: -int(r["version"]))
    return records


def shown_value(record: dict[str, Any]) -> str:
    """A key's or history entry's value in a table: "-" for a delete, DAMAGED for stored text
    that is not JSON (the store names such values in its ``damaged`` lists)."""
    if record.get("event_type") == "delete":
        return "-"
    return DAMAGED if record.get("damaged") else compact_json(record["value"])


def by_whom(actor: str, principal: str | None) -> str:
    """An actor as the tables show it: with the principal that made the call, if one did, in
    parentheses (a name in parentheses already, such as the shared token's, is shown as is)."""
    if principal is None:
        return actor
    return f"{actor} {principal}" if principal.startswith("(") else f"{actor} ({principal})"


def parse_time(iso: str) -> float | None:
    """Unix time of an ISO-8601 string the store wrote, or None if it is not one."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def span(seconds: float) -> str:
    """A short duration: "4s", "5m", "3h", "2d"."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86_400:
        return f"{s // 3600}h"
    return f"{s // 86_400}d"


def age(iso: str | None, now: float) -> str:
    """How long ago ``iso`` was: "2s ago" (or "in 2s" for a time ahead of this clock)."""
    if not iso:
        return "-"
    moment = parse_time(iso)
    if moment is None:
        return iso
    delta = now - moment
    return f"{span(delta)} ago" if delta >= 0 else f"in {span(-delta)}"


def clock(iso: str) -> str:
    """A stored UTC time as "2026-05-09 07:35:25.123" (the log's TIME column)."""
    if len(iso) >= 23 and iso[10] == "T":
        return f"{iso[:10]} {iso[11:23]}"
    return iso


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


class Column(NamedTuple):
    """A table column. One with a ``cut`` rank may be cut short (with "…") when the table is
    wider than the terminal: rank 1 first, down to MIN_CUT cells, then rank 2, and so on. A
    ``right`` column is right-aligned (numbers); ``least`` keeps it this wide while cutting
    the columns of the later ranks (down to their own ``least``) makes the table fit."""

    header: str
    cut: int = 0
    right: bool = False
    least: int = 0  # cut no narrower than this while the other columns can give way


MIN_CUT = 12  # a column is never cut narrower than this (or its header)


def printable(text: str) -> str:
    """``text`` with every character a terminal would not show as itself escaped (``\\x1b``,
    ``\\u202e``): control, format (bidirectional overrides, zero-width), separator and
    unassigned characters. Every table cell passes through here, so a stored name can neither
    move the cursor nor reorder or hide what is printed around it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def layout(columns: Sequence[Column], rows: Sequence[Sequence[str]], total: int) -> list[int]:
    """Column widths: each as wide as its widest cell; then, while the table is wider than
    ``total`` cells, the widest column of the lowest cut rank that can still shrink loses one:
    first down to each column's ``least``, then, if that was not enough, to MIN_CUT."""
    widths = [text_width(c.header) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], text_width(printable(cell)))
    excess = sum(widths) + len(GAP) * (len(columns) - 1) - total
    for keep_least in (True, False):  # a column's ``least`` goes only if nothing else fits
        for rank in sorted({c.cut for c in columns if c.cut}):
            members = [i for i, c in enumerate(columns) if c.cut == rank]
            floors = {
                i: min(
                    widths[i],
                    max(MIN_CUT, text_width(columns[i].header), columns[i].least * keep_least),
                )
                for i in members
            }
            while excess > 0:
                shrinkable = [i for i in members if widths[i] > floors[i]]
                if not shrinkable:
                    break
                widest = max(shrinkable, key=lambda i: widths[i])
                widths[widest] -= 1
                excess -= 1
    return widths


def format_row(columns: Sequence[Column], widths: Sequence[int], cells: Sequence[str]) -> str:
    parts = []
    for column, width, cell in zip(columns, widths, cells, strict=True):
        text = cut(printable(cell), width)
        pad = " " * (width - text_width(text))
        parts.append(pad + text if column.right else text + pad)
    return GAP.join(parts).rstrip()


def header_lines(columns: Sequence[Column], widths: Sequence[int]) -> list[str]:
    return [
        format_row(columns, widths, [c.header for c in columns]),
        GAP.join("-" * w for w in widths),
    ]


def table(columns: Sequence[Column], rows: Sequence[Sequence[str]], total: int) -> list[str]:
    """The lines of an aligned table with a header and a dashed rule."""
    widths = layout(columns, rows, total)
    return header_lines(columns, widths) + [format_row(columns, widths, r) for r in rows]
