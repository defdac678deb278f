"""Records, names and values: what the store reads and writes, and the checks at its door.

- Records are frozen dataclasses with ``to_dict``; reads build them through ``make_record`` and
  ``make_history_entry``, which set the slots directly (half the time of ``__init__``).
- Names (namespaces, keys, writers) are checked by ``check_text``: printable, no invisible
  characters that make two names look alike, valid Unicode. Integers and seconds by
  ``check_int`` and ``check_seconds``.
- Values are strict JSON both ways: ``encode_value`` refuses NaN, Infinity, non-JSON types,
  cycles and oversized texts; ``read_json`` reads a stored text with the C scanner and raises
  ``NotJsonError`` for anything a reply could not carry, which the store reports as a damaged
  record. A backend that cannot decode a stored text hands it over as ``UndecodableText``.
- Times are UTC ISO-8601 strings of fixed width (``utc_iso``), so they sort as text.
Standard library only (the copyable store carries this module).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from agenthold.db.errors import InvalidInputError

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "MAX_SQL_INT",
    "MAX_WAIT_SECONDS",
    "MAX_WRITER_LENGTH",
    "DeleteResult",
    "Export",
    "ExportedRecord",
    "HistoryEntry",
    "NamespaceInfo",
    "NotJsonError",
    "Record",
    "SetResult",
    "Topic",
    "UndecodableText",
    "check_int",
    "check_seconds",
    "check_text",
    "decode_value",
    "encode_value",
    "make_history_entry",
    "make_record",
    "read_json",
    "refused_name",
    "utc_iso",
]

MAX_NAMESPACE_LENGTH = 512  # 0.10's limit: a namespace it wrote stays reachable
MAX_KEY_LENGTH = 1024
MAX_WRITER_LENGTH = 256
MAX_DEPTH = 256  # nesting of lists and objects inside one value
DEFAULT_MAX_VALUE_BYTES = 1_048_576  # UTF-8 size of a value's compact JSON text
MAX_WAIT_SECONDS = 86_400.0  # longest watch the library accepts (the MCP tools allow 300 s)
DEFAULT_PAGE_LIMIT = 100  # records in a page of list_page
MAX_PAGE_BYTES = 4 * 1024 * 1024  # stored text in a page, past its first record

Topic = tuple[str, ...]  # what the change feed wakes on: ("k", namespace, key), ...


@dataclass(frozen=True, slots=True)
class Record:
    """A key's live value and who wrote it. ``deleted`` is True only for a watched delete."""

    namespace: str
    key: str
    value: Any
    version: int
    updated_by: str
    updated_at: str
    deleted: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = {
            "namespace": self.namespace,
            "key": self.key,
            "value": self.value,
            "version": self.version,
            "updated_by": self.updated_by,
            "updated_at": self.updated_at,
        }
        if self.deleted:
            d["deleted"] = True
        return d


@dataclass(frozen=True, slots=True)
class SetResult:
    """The outcome of a write: the new version, and the live version it replaced (0 if none)."""

    namespace: str
    key: str
    version: int
    previous_version: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "key": self.key,
            "version": self.version,
            "previous_version": self.previous_version,
        }


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """The outcome of a delete: the version that was deleted and the tombstone's own version."""

    namespace: str
    key: str
    deleted_version: int
    version: int
    deleted_by: str
    deleted_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "key": self.key,
            "deleted_by": self.deleted_by,
            "deleted_version": self.deleted_version,
            "tombstone_version": self.version,
            "deleted_at": self.deleted_at,
        }


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One write (``event_type`` "write") or delete ("delete", value None) of a key."""

    version: int
    value: Any
    updated_by: str
    updated_at: str
    event_type: Literal["write", "delete"]
    principal: str | None = None  # who made it, as authenticated (None: no authentication)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "version": self.version,
            "value": self.value,
            "updated_by": self.updated_by,
            "updated_at": self.updated_at,
            "event_type": self.event_type,
        }
        if self.principal is not None:
            d["principal"] = self.principal
        return d


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """A namespace that holds live records, and how many."""

    namespace: str
    record_count: int

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "record_count": self.record_count}


@dataclass(frozen=True, slots=True)
class ExportedRecord:
    """A live record with its whole history, newest first. ``compacted_before`` is the
    oldest version compaction kept (1: none was removed; see retention.py)."""

    record: Record
    history: tuple[HistoryEntry, ...]
    compacted_before: int = 1

    def to_dict(self) -> dict[str, Any]:
        d = self.record.to_dict()
        del d["namespace"]
        d["history"] = [h.to_dict() for h in self.history]
        if self.compacted_before > 1:
            d["compacted_before"] = self.compacted_before
        return d


@dataclass(frozen=True, slots=True)
class Export:
    """A consistent snapshot of a namespace: live records (sorted by key) and their histories."""

    namespace: str
    exported_at: str
    records: tuple[ExportedRecord, ...]
    next_after: str | None = None  # a page of a larger export: where the next one starts

    @property
    def record_count(self) -> int:
        return len(self.records)

    @property
    def history_count(self) -> int:
        return sum(len(r.history) for r in self.records)

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "exported_at": self.exported_at,
            "record_count": self.record_count,
            "history_count": self.history_count,
            "records": [r.to_dict() for r in self.records],
        }


# Reads build many records. A frozen dataclass's __init__ sets every field through
# object.__setattr__; setting the slots directly builds the same object in half the time.
_new = object.__new__
(
    _set_namespace,
    _set_key,
    _set_value,
    _set_version,
    _set_updated_by,
    _set_updated_at,
    _set_deleted,
) = (
    Record.__dict__[name].__set__
    for name in ("namespace", "key", "value", "version", "updated_by", "updated_at", "deleted")
)
_set_h_version, _set_h_value, _set_h_by, _set_h_at, _set_h_event, _set_h_principal = (
    HistoryEntry.__dict__[name].__set__
    for name in ("version", "value", "updated_by", "updated_at", "event_type", "principal")
)


def make_record(
    namespace: str, key: str, value: Any, version: int, by: str, at: str, deleted: bool = False
) -> Record:
    r: Record = _new(Record)
    _set_namespace(r, namespace)
    _set_key(r, key)
    _set_value(r, value)
    _set_version(r, version)
    _set_updated_by(r, by)
    _set_updated_at(r, at)
    _set_deleted(r, deleted)
    return r


def make_history_entry(
    version: int, value: Any, by: str, at: str, event: str, principal: str | None = None
) -> HistoryEntry:
    h: HistoryEntry = _new(HistoryEntry)
    _set_h_version(h, version)
    _set_h_value(h, value)
    _set_h_by(h, by)
    _set_h_at(h, at)
    _set_h_event(h, event)
    _set_h_principal(h, principal)
    return h


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Characters that change how a name looks without being seen: bidirectional controls (which can
# show "txt.exe" as "exe.txt"), zero-width spaces and joiners that are not needed to spell a word
# (ZWJ and ZWNJ are: Persian, Indic scripts, emoji sequences), and line and paragraph separators.
INVISIBLE = re.compile(
    "[\u061c\u200b\u200e\u200f\u202a-\u202e\u2028\u2029\u2060\u2066-\u2069\ufeff]"
)


def _excerpt(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")


def check_text(what: str, value: object, max_length: int) -> str:
    """Return ``value`` if it is a usable name: a non-blank string of at most ``max_length``
    characters, without control characters, invisible characters that disguise text (see
    ``INVISIBLE``) or lone surrogates. Else raise InvalidInputError."""
    if (
        type(value) is str
        and 0 < len(value) <= max_length
        and value.isprintable()
        and not value.isspace()
    ):
        return value  # the fast path: printable strings have no control characters
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{what} must not be empty or blank")
    if len(value) > max_length:
        raise InvalidInputError(
            f"{what} is {len(value)} characters long; the limit is {max_length}: {_excerpt(value)}"
        )
    if "\x00" in value:
        raise InvalidInputError(
            f"{what} contains a control character, and null bytes are never stored: "
            f"{_excerpt(value)}"
        )
    if _CONTROL.search(value):
        raise InvalidInputError(
            f"{what} contains a control character (newline, tab, NUL...): {_excerpt(value)}"
        )
    invisible = INVISIBLE.search(value)
    if invisible is not None:
        raise InvalidInputError(
            f"{what} contains the invisible character U+{ord(invisible.group()):04X} at index "
            f"{invisible.start()} (a bidirectional control, zero-width space or line separator, "
            f"which would let two different names look alike): {_excerpt(value)}; remove it"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(
            f"{what} is not valid Unicode (it holds a lone surrogate): {_excerpt(value)}"
        ) from None
    return value


MAX_SQL_INT = 2**63 - 1  # the largest integer SQLite and PostgreSQL's bigint take


def check_int(what: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool) of at least ``minimum`` and at most
    ``maximum`` (None: no bound; a value passed to SQL needs MAX_SQL_INT)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{what} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise InvalidInputError(f"{what} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        shown = value if value.bit_length() < 200 else "a larger integer"
        raise InvalidInputError(f"{what} must be at most {maximum}, got {shown}")
    return value


def check_seconds(what: str, value: object, *, maximum: float) -> float:
    """Return ``value`` as a float if it is a finite number of seconds in [0, maximum]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"{what} must be a number of seconds, got {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not 0 <= seconds <= maximum:  # also False for NaN
        raise InvalidInputError(f"{what} must be between 0 and {maximum:g} seconds, got {value}")
    return seconds


def _check_json(value: Any, depth: int, path: set[int]) -> None:
    """Raise InvalidInputError unless ``value`` is strict JSON (see ``encode_value``).

    Strings, ints, booleans and None inside lists and objects are skipped without a call,
    which keeps the walk cheap next to the JSON encoding it guards."""
    kind = type(value)
    if kind is dict or kind is list or isinstance(value, (dict, list)):
        if depth >= MAX_DEPTH:
            raise InvalidInputError(
                f"value is nested deeper than {MAX_DEPTH} levels of lists and objects"
            )
        ident = id(value)
        if ident in path:
            raise InvalidInputError("value contains a circular reference")
        path.add(ident)
        if isinstance(value, dict):
            for k, v in value.items():
                if type(k) is not str and not isinstance(k, str):
                    raise InvalidInputError(
                        f"value has an object key {k!r} of type {type(k).__name__}; "
                        "JSON object keys must be strings"
                    )
                leaf = type(v)
                if leaf is not str and leaf is not int and leaf is not bool and v is not None:
                    _check_json(v, depth + 1, path)
        else:
            for v in value:
                leaf = type(v)
                if leaf is not str and leaf is not int and leaf is not bool and v is not None:
                    _check_json(v, depth + 1, path)
        path.discard(ident)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(
                f"value contains {value!r}; JSON has no NaN or Infinity (store null or a string)"
            )
        return
    if isinstance(value, (str, int)) or value is None:  # bool is an int
        return
    hint = "use a list" if isinstance(value, (tuple, set, frozenset)) else "convert it first"
    raise InvalidInputError(
        f"value contains a {type(value).__name__}, which is not a JSON type "
        f"(null, boolean, number, string, list or object with string keys); {hint}"
    )


def encode_value(value: Any, max_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> str:
    """Return the compact JSON text of ``value``, or raise InvalidInputError.

    Rejected: NaN and Infinity, object keys that are not strings, types JSON lacks (sets, tuples,
    bytes, other objects), circular structures, nesting deeper than MAX_DEPTH, integers too long
    to convert, lone surrogates, and texts over ``max_bytes`` UTF-8 bytes.
    """
    _check_json(value, 0, set())
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        raise InvalidInputError(
            "value holds an integer too long to write as JSON (thousands of digits); "
            "store it as a string"
        ) from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInputError("value holds a string with a lone surrogate") from None
    if size > max_bytes:
        raise InvalidInputError(
            f"value is {size:,} bytes as JSON; the limit is {max_bytes:,} bytes"
        )
    return text


class NotJsonError(ValueError):
    """A stored text that is not strict JSON; the reader names the key (DamagedRecordError)."""


def _refuse_constant(constant: str) -> Any:
    raise NotJsonError(f"it holds {constant}, which JSON does not have")


# The C scanner behind json.loads (typeshed does not declare it), strict as encode_value is:
# NaN and Infinity are refused, not read as floats that no reply could carry.
_STRICT = json.JSONDecoder(parse_constant=_refuse_constant)
_scan: Callable[[str, int], tuple[Any, int]] = _STRICT.scan_once  # type: ignore[attr-defined]


def _finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise NotJsonError(f"it holds the number {_excerpt(text, 40)}, too large for a float")
    return number


# A number too large for a float (1e999) reads as infinity, which no reply can carry. Only a
# number with an exponent of three digits or an integer part of 200 digits can be that large
# (10**(199 + 99) is well within range), so the fast scan above stays, and a text in which
# _HUGE finds such a run (perhaps inside a string: then merely read twice) is read again with
# every float checked.
_HUGE = re.compile(r"[eE]\+?\d{3}|\d{200}")
_FINITE = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def read_json(text: str | None) -> Any:
    """The value of a stored JSON text (None for a tombstone's NULL). Raises NotJsonError for text
    that is not strict JSON (a row written by another tool, a damaged one).

    Stored texts come from json.dumps, so they have no surrounding whitespace and the C
    scanner can read them directly, without json.loads's Python-level wrapper (which costs
    three times as much as the scan for a small value). Anything else gets the full parse."""
    if text is None:
        return None
    if type(text) is not str:
        raise NotJsonError(_not_text(text))
    try:
        try:
            value, end = _scan(text, 0)
        except StopIteration:  # nothing the scanner reads at the start: whitespace, or junk
            if not text[:1].isspace():
                raise NotJsonError(f"it reads {_excerpt(text, 40)}") from None
            end = -1
        if end != len(text):
            value = _STRICT.decode(text)  # whitespace around it, or junk after it
    except NotJsonError:
        raise
    except json.JSONDecodeError as exc:
        raise NotJsonError(f"{exc.msg} at character {exc.pos}") from None
    except RecursionError:
        raise NotJsonError("it is nested too deeply to read") from None
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits()
        raise NotJsonError(str(exc).split(";")[0]) from None
    if _HUGE.search(text) is not None:
        _FINITE.decode(text)  # raises NotJsonError for a number that overflows
    if "\\u" in text:  # an escaped lone surrogate reads as a string no reply can carry
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise NotJsonError("it holds a lone surrogate (\\ud800-\\udfff) escape") from None
    return value


def decode_value(text: str | None, *, damaged: Any = None) -> Any:
    """The value of a stored JSON text (None for NULL), or ``damaged`` if the text is not
    strict JSON (for readers that show every row, such as the inspector's log)."""
    try:
        return read_json(text)
    except NotJsonError:
        return damaged


class UndecodableText(str):
    """A stored text whose bytes are not UTF-8 (SQLite keeps whatever it is given), as a
    backend reads it: with U+FFFD for each bad byte. A str, so that in a column other than the
    value (a writer's name, a key) it is shown like any text; as a value, it is a damaged record
    (read_json)."""


def _not_text(stored: object) -> str:
    if isinstance(stored, UndecodableText):
        return "its bytes are not UTF-8 text"
    kind = {int: "an integer", float: "a real number", bytes: "a blob"}.get(type(stored))
    return f"it is stored as {kind or type(stored).__name__}, not as JSON text"


# The whole-second part of the last time utc_iso formatted (a write formats several times a
# second, and building a datetime for each cost about half of a claim's bookkeeping).
_last_second: tuple[int, str] = (-1, "")
_LAST_SECOND = 253402300799  # 9999-12-31T23:59:59Z, the last second an ISO year of 4 digits has


def utc_iso(timestamp: float | None = None) -> str:
    """An ISO-8601 UTC time with microseconds (fixed width, so strings sort by time): what
    ``datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="microseconds")``
    gives, the microsecond rounded half to even as there (``None``: now, truncated)."""
    global _last_second
    if timestamp is None:
        whole, us = divmod(time.time_ns() // 1000, 1_000_000)
    else:
        fraction, seconds = math.modf(timestamp)  # raises for NaN and infinities, as datetime
        us = round(fraction * 1e6)
        whole = int(seconds)
        if us >= 1_000_000:
            whole, us = whole + 1, us - 1_000_000
        elif us < 0:
            whole, us = whole - 1, us + 1_000_000
    second, prefix = _last_second
    if whole != second:
        if not 0 <= whole <= _LAST_SECOND:  # before 1970 or after 9999: datetime's own answer
            moment = datetime.fromtimestamp(whole if timestamp is None else timestamp, timezone.utc)
            return moment.isoformat(timespec="microseconds")
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(whole))
        _last_second = (whole, prefix)
    return f"{prefix}{us:06d}+00:00"


def refused_name(what: str, value: object, max_length: int) -> InvalidInputError | None:
    """The error check_text raises for ``value``, or None if it is a usable name."""
    try:
        check_text(what, value, max_length)
    except InvalidInputError as exc:
        return exc
    return None
