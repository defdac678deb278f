"""The id of a JSON-RPC message that could not be parsed, so its error can still carry it.

A client waits for the answer with its request's id; an error with ``id: null`` leaves it waiting
(or guessing). stdio answers its unparseable lines with it (stdio.py), and HTTP puts it into the
SDK's parse and validation errors (http.py). Standard library only.
"""

from __future__ import annotations

import json
import re

__all__ = ["top_level_id"]


def top_level_id(text: str) -> str | int | None:
    """The ``id`` member of the JSON object ``text``, found without parsing its other members
    (a line too deep or too odd for any parser still has its id answered): a scan that skips
    strings and counts brackets, so only a member at the top level counts."""
    depth, i, n = 0, 0, len(text)
    expect_key = False
    while i < n:
        c = text[i]
        if c == '"':
            end = _string_end(text, i)
            if end < 0:
                return None
            if depth == 1 and expect_key:
                j = end + 1
                while j < n and text[j] in " \t\r\n":
                    j += 1
                if text[i : end + 1] == '"id"' and j < n and text[j] == ":":
                    return _id_value(text[j + 1 :])
            expect_key = False
            i = end + 1
            continue
        if c in "[{":
            depth += 1
            expect_key = depth == 1 and c == "{"
        elif c in "]}":
            depth -= 1
        elif c == "," and depth == 1:
            expect_key = True
        i += 1
    return None


def _string_end(text: str, start: int) -> int:
    """Where the JSON string opening at ``start`` closes, or -1."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    return -1


_ID_VALUE = re.compile(r'\s*(-?\d{1,30}(?![\d.eE])|"(?:[^"\\]|\\.){0,200}")')


def _id_value(rest: str) -> str | int | None:
    found = _ID_VALUE.match(rest)
    if found is None:
        return None
    value = json.loads(found.group(1))
    return value if isinstance(value, (str, int)) else None
