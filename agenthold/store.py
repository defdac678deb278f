"""The versioned state store: JSON values with per-key versions and an append-only history.

This one file is the whole library layer of agenthold's state store. It uses the standard library
only and imports nothing from the package, so it can be copied into another project as is.

Decisions behind it:
- Optimistic concurrency. A write names the version it read (``expected_version``); the check and
  the write happen in one ``BEGIN IMMEDIATE`` transaction, so a stale write always gets a conflict.
- Versions are never reused. A deleted key keeps a tombstone row that remembers its last version,
  so a delete and every later write continue the same sequence.
- History first, atomically. The history row and the live row change in the same transaction.
- One connection per thread; WAL lets readers run beside the one writer, and threads of one process
  queue for writing on a lock instead of in SQLite's sleeping busy handler.
- Waiting is pushed: a commit in this process wakes waiters at once; commits from other processes
  are seen by one feed thread per file, running while anyone waits, that checks ``PRAGMA
  data_version`` when a file event (inotify on Linux, kqueue on macOS and the BSDs, one watcher
  thread per process) says the file changed, and every 0.5 s as a safety net; where there are no
  events it checks every 2 ms. An event is only a hint: the tables say what changed.
- Everything SQLite-specific (pragmas, schema, connections, locking, error translation, change
  notification) lives in ``SQLiteDatabase``: the seam that another backend would replace.
"""

from __future__ import annotations

import errno
import importlib
import json
import logging
import math
import os
import re
import sqlite3
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, NamedTuple, Protocol, TypedDict


def _random_hex() -> str:
    """32 random hex digits (a database id, a temporary name). uuid is imported here, not at
    the top: it pulls in the platform module, and an edit hook (a new process on every edit,
    which makes no id) imports the store."""
    import uuid

    return uuid.uuid4().hex


__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "MAX_WAIT_SECONDS",
    "MAX_WRITER_LENGTH",
    "PAGE_SIZE",
    "SCHEMA_VERSION",
    "STORE_SCHEMA",
    "AgentholdError",
    "BusyError",
    "Component",
    "ConflictDetail",
    "ConflictError",
    "DamagedRecordError",
    "Database",
    "DatabaseClock",
    "DeleteResult",
    "Export",
    "ExportedRecord",
    "HistoryCompactedError",
    "HistoryEntry",
    "IncompatibleDatabaseError",
    "InvalidInputError",
    "NamespaceInfo",
    "NotFoundError",
    "Record",
    "SQLiteDatabase",
    "SetResult",
    "StateStore",
    "Subscription",
    "UnavailableError",
    "Waiter",
    "open_database",
    "wait_until",
]

log = logging.getLogger("agenthold.store")

# --------------------------------------------------------------------------------------------
# Limits
# --------------------------------------------------------------------------------------------

MAX_NAMESPACE_LENGTH = 512  # 0.10's limit: a namespace it wrote stays reachable
MAX_KEY_LENGTH = 1024
MAX_WRITER_LENGTH = 256
MAX_DEPTH = 256  # nesting of lists and objects inside one value
DEFAULT_MAX_VALUE_BYTES = 1_048_576  # UTF-8 size of a value's compact JSON text
MAX_WAIT_SECONDS = 86_400.0  # longest watch the library accepts (the MCP tools allow 300 s)
DEFAULT_PAGE_LIMIT = 100  # records in a page of list_page
MAX_PAGE_BYTES = 4 * 1024 * 1024  # stored text in a page, past its first record
POLL_INTERVAL = 0.002  # how often the poller checks for commits by other processes
FEED_LINGER = 1.0  # seconds the poller goes on after the last subscriber left

# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class AgentholdError(Exception):
    """Base class of every error agenthold raises on purpose. ``hint``, where set, says what
    the caller can do about it."""

    hint: str | None = None


class InvalidInputError(AgentholdError, ValueError):
    """An argument is malformed. The message names it, says what was expected and what to do."""


class IncompatibleDatabaseError(InvalidInputError):
    """The file is missing, is not SQLite, is not an agenthold database, or has a newer schema."""


class HistoryCompactedError(InvalidInputError):
    """A history read or a watch asked for versions of a key that compaction removed (see
    agenthold/retention.py). ``before`` is the oldest version still kept: every version below
    it is gone (when all of a key's history went, the version after its last one)."""

    def __init__(self, namespace: str, key: str, before: int) -> None:
        self.namespace, self.key, self.before = namespace, key, before
        super().__init__(
            f"the history of {key!r} in namespace {namespace!r} was compacted before version "
            f"{before}: older versions are no longer kept (the database's retention rules)"
        )
        self.hint = (
            f"Read from version {before} on: history without before, or get the key and watch "
            "from its version."
        )


class NotFoundError(AgentholdError):
    """The key has no live record."""

    def __init__(self, namespace: str, key: str) -> None:
        super().__init__(f"no record for key {key!r} in namespace {namespace!r}")
        self.namespace = namespace
        self.key = key


class ConflictDetail(TypedDict):
    """What :attr:`ConflictError.detail` holds (a plain dict)."""

    namespace: str
    key: str
    expected_version: int
    actual_version: int
    actual_value: Any
    actual_updated_by: str | None
    actual_updated_at: str | None


class ConflictError(AgentholdError):
    """The key's live version is not the one the writer expected.

    ``detail`` holds what a retry needs: ``namespace``, ``key``, ``expected_version``,
    ``actual_version`` (0 when the key has no live record), ``actual_value``,
    ``actual_updated_by`` and ``actual_updated_at``. ``current`` is the live record, or None.
    """

    def __init__(self, expected_version: int, current: Record | None, namespace: str, key: str):
        actual = current.version if current else 0
        # who wrote it, as 0.10's message said: often all a log reader needs to see the race
        super().__init__(
            f"version conflict on {namespace!r}/{key!r}: expected version {expected_version}, "
            f"the live version is {actual}"
            + (f" (written by {current.updated_by!r})" if current else " (no live record)")
        )
        self.current = current
        self.detail: ConflictDetail = {
            "namespace": namespace,
            "key": key,
            "expected_version": expected_version,
            "actual_version": actual,
            "actual_value": current.value if current else None,
            "actual_updated_by": current.updated_by if current else None,
            "actual_updated_at": current.updated_at if current else None,
        }


class DamagedRecordError(AgentholdError, ValueError):
    """A key's stored value is not strict JSON: a row written by another tool, a damaged row,
    NaN or Infinity, text that is not UTF-8. Only that key is affected: the rest of its
    namespace reads as usual (``list_page``, ``list_keys`` and ``export`` report damaged keys
    in their ``damaged`` list). ``reason`` says what is wrong with the text; writing the key
    again (or deleting it) repairs it."""

    def __init__(
        self,
        namespace: str,
        key: str,
        version: int | None,
        reason: str,
        updated_by: str | None = None,
        updated_at: str | None = None,
    ) -> None:
        at = f" (version {version})" if version is not None else ""
        super().__init__(
            f"the stored value of key {key!r} in namespace {namespace!r}{at} is not valid JSON "
            f"({reason}); it was damaged or written by another tool"
        )
        self.namespace = namespace
        self.key = key
        self.version = version
        self.reason = reason
        self.updated_by = updated_by
        self.updated_at = updated_at
        self.hint = (
            "Only this key is affected. Write it again without a version check, or delete it; "
            "its earlier values are in its history."
        )

    def to_dict(self) -> dict[str, Any]:
        """What list and export replies say about a damaged key they left out."""
        return {
            "key": self.key,
            "version": self.version,
            "updated_by": self.updated_by,
            "updated_at": self.updated_at,
            "message": str(self),
        }


class KeyTooLargeError(AgentholdError):
    """A page of ``export`` would start with a key whose live value and history together are
    over the page's ``max_bytes``: nothing was read (the sizes come first), since a page either
    holds a key whole or not at all. ``size`` is the key's stored bytes; ``history_page`` reads
    its history in bounded pages, and ``after=key`` exports on past it."""

    def __init__(self, namespace: str, key: str, size: int, max_bytes: int) -> None:
        super().__init__(
            f"key {key!r} in namespace {namespace!r} holds {size:,} bytes of value and "
            f"history, over the {max_bytes:,} bytes this export page may hold; nothing was read"
        )
        self.namespace = namespace
        self.key = key
        self.size = size
        self.max_bytes = max_bytes
        self.hint = (
            "Read its history a page at a time with history_page(namespace, key, before=...) "
            "and its value with get; export the keys after it with after set to this key."
        )


class UnavailableError(AgentholdError):
    """The database cannot serve the call right now (locked, full, read-only, I/O error).
    ``transient`` says whether the same call may succeed later by itself (a lock released, room
    made), rather than only after someone fixes something (permissions, a replaced file)."""

    transient = False


class BusyError(UnavailableError):
    """Another writer held the database longer than ``busy_timeout``."""

    transient = True


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


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


def _record(
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


def _history_entry(
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
_INVISIBLE = re.compile(
    "[\u061c\u200b\u200e\u200f\u202a-\u202e\u2028\u2029\u2060\u2066-\u2069\ufeff]"
)


def _excerpt(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")


def check_text(what: str, value: object, max_length: int) -> str:
    """Return ``value`` if it is a usable name: a non-blank string of at most ``max_length``
    characters, without control characters, invisible characters that disguise text (see
    ``_INVISIBLE``) or lone surrogates. Else raise InvalidInputError."""
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
    invisible = _INVISIBLE.search(value)
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


class _NotJson(ValueError):
    """A stored text that is not strict JSON; the reader names the key (DamagedRecordError)."""


def _refuse_constant(constant: str) -> Any:
    raise _NotJson(f"it holds {constant}, which JSON does not have")


# The C scanner behind json.loads (typeshed does not declare it), strict as encode_value is:
# NaN and Infinity are refused, not read as floats that no reply could carry.
_STRICT = json.JSONDecoder(parse_constant=_refuse_constant)
_scan: Callable[[str, int], tuple[Any, int]] = _STRICT.scan_once  # type: ignore[attr-defined]


def _finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise _NotJson(f"it holds the number {_excerpt(text, 40)}, too large for a float")
    return number


# A number too large for a float (1e999) reads as infinity, which no reply can carry. Only a
# number with an exponent of three digits or an integer part of 200 digits can be that large
# (10**(199 + 99) is well within range), so the fast scan above stays, and a text in which
# _HUGE finds such a run (perhaps inside a string: then merely read twice) is read again with
# every float checked.
_HUGE = re.compile(r"[eE]\+?\d{3}|\d{200}")
_FINITE = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def _decode(text: str | None) -> Any:
    """The value of a stored JSON text (None for a tombstone's NULL). Raises _NotJson for text
    that is not strict JSON (a row written by another tool, a damaged one).

    Stored texts come from json.dumps, so they have no surrounding whitespace and the C
    scanner can read them directly, without json.loads's Python-level wrapper (which costs
    three times as much as the scan for a small value). Anything else gets the full parse."""
    if text is None:
        return None
    if type(text) is not str:
        raise _NotJson(_not_text(text))
    try:
        try:
            value, end = _scan(text, 0)
        except StopIteration:  # nothing the scanner reads at the start: whitespace, or junk
            if not text[:1].isspace():
                raise _NotJson(f"it reads {_excerpt(text, 40)}") from None
            end = -1
        if end != len(text):
            value = _STRICT.decode(text)  # whitespace around it, or junk after it
    except _NotJson:
        raise
    except json.JSONDecodeError as exc:
        raise _NotJson(f"{exc.msg} at character {exc.pos}") from None
    except RecursionError:
        raise _NotJson("it is nested too deeply to read") from None
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits()
        raise _NotJson(str(exc).split(";")[0]) from None
    if _HUGE.search(text) is not None:
        _FINITE.decode(text)  # raises _NotJson for a number that overflows
    if "\\u" in text:  # an escaped lone surrogate reads as a string no reply can carry
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise _NotJson("it holds a lone surrogate (\\ud800-\\udfff) escape") from None
    return value


def decode_value(text: str | None, *, damaged: Any = None) -> Any:
    """The value of a stored JSON text (None for NULL), or ``damaged`` if the text is not
    strict JSON (for readers that show every row, such as the inspector's log)."""
    try:
        return _decode(text)
    except _NotJson:
        return damaged


_NOT_UTF8 = "Could not decode to UTF-8"  # how sqlite3 fails a row with such text


class _NotUtf8(str):
    """A stored text whose bytes are not UTF-8 (SQLite keeps whatever it is given), read with
    U+FFFD for each bad byte. A str, so that in a column other than the value (a writer's
    name, a key) it is shown like any text; as a value, it is a damaged record (_decode)."""


def _lenient_text(data: bytes) -> Any:
    """A text_factory that reads text that is not UTF-8 as _NotUtf8 instead of failing the
    whole query (sqlite3's own decoding raises for the row and every row after it)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return _NotUtf8(data.decode("utf-8", "replace"))


def _not_text(stored: object) -> str:
    if isinstance(stored, _NotUtf8):
        return "its bytes are not UTF-8 text"
    kind = {int: "an integer", float: "a real number", bytes: "a blob"}.get(type(stored))
    return f"it is stored as {kind or type(stored).__name__}, not as JSON text"


def _fetch_one(cursor: sqlite3.Cursor, sql: str, params: Sequence[Any]) -> Any:
    """``cursor.execute(sql, params).fetchone()``, reading text that is not UTF-8 as
    _fetch_all does."""
    try:
        return cursor.execute(sql, params).fetchone()
    except sqlite3.OperationalError as exc:
        if not str(exc).startswith(_NOT_UTF8):
            raise
    rows = _fetch_all(cursor.connection, sql, params)
    return rows[0] if rows else None


def _fetch_all(conn: Any, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """``conn.execute(sql, params).fetchall()``; on SQLite, rows with text that is not UTF-8
    are read again with that text as _NotUtf8, so that only their keys count as damaged."""
    try:
        rows: list[Any] = conn.execute(sql, params).fetchall()
        return rows
    except sqlite3.OperationalError as exc:
        if not str(exc).startswith(_NOT_UTF8):
            raise
    conn.text_factory = _lenient_text
    try:
        rows = conn.execute(sql, params).fetchall()
        return rows
    finally:
        conn.text_factory = str


def utc_iso(timestamp: float | None = None) -> str:
    """An ISO-8601 UTC time with microseconds (fixed width, so strings sort by time)."""
    moment = (
        datetime.now(timezone.utc)
        if timestamp is None
        else datetime.fromtimestamp(timestamp, timezone.utc)
    )
    return moment.isoformat(timespec="microseconds")


# --------------------------------------------------------------------------------------------
# Schema: each component (the store here; claims and messages in their modules) owns its tables
# --------------------------------------------------------------------------------------------

APPLICATION_ID = 0x41474844  # "AGHD" in PRAGMA application_id marks a file as ours
# PRAGMA user_version is the layout of a file. Files of agenthold 0.11 before components: 1 (the
# store's and claims' tables at version 1 each), 2 (claims at version 2) and 3 (principal
# columns: store 2, claims 3). 4: the table agenthold_components names each component's
# version. Files of layouts 1 to 3 open as they are (a component that keeps its version in
# agenthold_components, such as the message bus, may add that table to them); the first store or
# claims migration moves a file to layout 4.
SCHEMA_VERSION = 4
LAYOUTS = {1: {"store": 1, "claims": 1}, 2: {"store": 1, "claims": 2}, 3: {"store": 2, "claims": 3}}
COMPONENTS_SQL = (
    "CREATE TABLE IF NOT EXISTS agenthold_components ("
    "component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
)
# Every SQLite file of agenthold carries a database id of its own, so that a file replaced by
# another (a backup restored over it) is told apart from the file a process opened, even when
# it has the same inode (cp) or the same contents up to some moment. The id's row lives alone
# on a page that is written only when the id is made, so reading that page from the file
# itself (not through SQLite's cache or the WAL) says which file is there now. A copy made by
# `agenthold backup` gets a new id ending in FRESH until a writer first opens it: a WAL found
# beside a file that no writer ever opened cannot be that file's.
META_SQL = "CREATE TABLE IF NOT EXISTS agenthold_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
ID_PREFIX = "agenthold-id:"
FRESH = ":fresh"


@dataclass(frozen=True)
class Component:
    """The tables of one part of agenthold and how to create or migrate them.

    ``migrations[dialect][n]`` is the SQL script that takes the component from version n to
    n + 1 ("sqlite" and "postgresql"); the component's version is the number of scripts. A
    database records each component's version apart, so a program that uses only the store
    (say a copied store.py) creates only the store's tables, and claims add theirs later.
    """

    name: str
    migrations: dict[str, tuple[str, ...]]

    @property
    def version(self) -> int:
        return len(self.migrations["sqlite"])


STORE_SCHEMA = Component(
    "store",
    {
        "sqlite": (
            """
    -- The live value of every key ever written. A deleted key keeps its row (deleted = 1,
    -- value NULL) so that its version sequence continues: versions are never reused.
    CREATE TABLE state (
        namespace   TEXT    NOT NULL,
        key         TEXT    NOT NULL,
        value       TEXT,
        version     INTEGER NOT NULL,
        updated_by  TEXT    NOT NULL,
        updated_at  TEXT    NOT NULL,
        deleted     INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (namespace, key)
    ) WITHOUT ROWID;

    -- Every write and delete, append-only. id is the commit order (the change feed's cursor).
    CREATE TABLE state_history (
        id          INTEGER PRIMARY KEY,
        namespace   TEXT    NOT NULL,
        key         TEXT    NOT NULL,
        version     INTEGER NOT NULL,
        value       TEXT,
        updated_by  TEXT    NOT NULL,
        updated_at  TEXT    NOT NULL,
        event_type  TEXT    NOT NULL CHECK (event_type IN ('write', 'delete')),
        UNIQUE (namespace, key, version)
    );
    """,
            """
    -- The principal (the caller a token names, agenthold.identity.principals) that made each write;
    -- NULL where no token said who called.
    ALTER TABLE state_history ADD COLUMN principal TEXT;
    """,
        ),
        "postgresql": (
            """
    -- As in SQLite. Names sort by code point (COLLATE "C"), as SQLite and Python sort them.
    CREATE TABLE state (
        namespace   TEXT COLLATE "C" NOT NULL,
        key         TEXT COLLATE "C" NOT NULL,
        value       TEXT,
        version     BIGINT  NOT NULL,
        updated_by  TEXT    NOT NULL,
        updated_at  TEXT    NOT NULL,
        deleted     INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (namespace, key)
    );

    -- ids do not commit in order under concurrent writers: readers of the feed go by xid,
    -- the writing transaction's id (see PostgresDatabase.feed_window).
    CREATE TABLE state_history (
        id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        namespace   TEXT COLLATE "C" NOT NULL,
        key         TEXT COLLATE "C" NOT NULL,
        version     BIGINT  NOT NULL,
        value       TEXT,
        updated_by  TEXT    NOT NULL,
        updated_at  TEXT    NOT NULL,
        event_type  TEXT    NOT NULL CHECK (event_type IN ('write', 'delete')),
        xid         XID8    NOT NULL DEFAULT pg_current_xact_id(),
        UNIQUE (namespace, key, version)
    );
    CREATE INDEX state_history_by_xid ON state_history (xid);
    """,
            """
    -- The principal (the caller a token names, agenthold.identity.principals) that made each write;
    -- NULL where no token said who called.
    ALTER TABLE state_history ADD COLUMN principal TEXT;
    """,
        ),
    },
)

SQLITE_MAGIC = b"SQLite format 3\x00"

# New files get 2 KiB pages instead of SQLite's 4 KiB. A commit writes every page it changed to
# the WAL and checksums it; a typical write changes three pages (the live row, the history row
# and its index entry), so halving the page halves that work: small writes run about 15% faster.
# Values of tens of kilobytes pay a little for the longer overflow chains. Files made with another
# page size keep theirs.
PAGE_SIZE = 2048
# SQLite's unix file system layer takes paths of up to 512 bytes (SQLITE_MAX_PATHNAME) and
# refuses a database whose full path leaves no room for "-journal" within them.
SQLITE_MAX_PATH = 512 - len("-journal")

# Connection settings, applied to every connection. Durability is the caller's choice.
PRAGMAS: dict[str, str] = {
    "journal_mode": "wal",  # readers never wait for the writer; set once, stored in the file
    "cache_size": "-16000",  # 16 MB page cache per connection
    "temp_store": "memory",  # sorts and temporary indexes stay off the disk
    "journal_size_limit": str(64 * 1024 * 1024),  # truncate a checkpointed WAL beyond 64 MB
}
SYNCHRONOUS = {
    "normal": "NORMAL",  # survives a process crash; a power loss may drop the last commits
    "full": "FULL",  # fsync at every commit: survives a power loss too
}

Topic = tuple[str, ...]


@dataclass(frozen=True)
class ChangeSource:
    """An append-only table whose new rows tell the change feed what changed.

    ``max_sql`` returns the newest id; ``since_sql`` takes an id and returns ``(id, ...)`` rows
    after it; ``topics`` turns such a row into the topics to wake.
    """

    name: str
    max_sql: str
    since_sql: str
    topics: Callable[[tuple[Any, ...]], Iterable[Topic]]


class _Subscription:
    __slots__ = ("callback", "closed", "feed", "topics")

    def __init__(
        self, feed: _ChangeFeed, topics: frozenset[Topic] | None, callback: Callable[[], None]
    ) -> None:
        self.feed = feed
        self.topics = topics
        self.callback = callback
        self.closed = False

    def update(self, topics: Iterable[Topic] | None) -> None:
        """Listen to other topics from now on (None: every change)."""
        self.feed._retopic(self, None if topics is None else frozenset(topics))

    def close(self) -> None:
        self.feed._remove(self)

    def __enter__(self) -> _Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DatabaseClock:
    """How this host's monotonic clock maps onto its database's clock, so that a wait can sleep
    until a time on the database's clock (a holder's lease end) without comparing it with this
    host's wall clock, which may disagree with the database's host by any amount.

    Every read of the database's clock (``Database.now`` and ``serialize``) passes through
    ``read``, which notes the offset between that reading and ``time.monotonic()`` taken just
    after it. The reading was taken before that moment, so the offset is at most one round trip
    too small, and a wake-up it times comes at most that late, never early. Until the first
    reading it assumes the database's clock is this host's wall clock.
    """

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = time.time() - time.monotonic()  # database time = monotonic + offset

    def read(self, at: float) -> float:
        """Note ``at``, the database's clock just read; returns it."""
        self.offset = at - time.monotonic()
        return at

    def until(self, at: float) -> float:
        """Seconds from now until ``at`` on the database's clock (negative once it passed)."""
        return at - self.offset - time.monotonic()

    def estimate(self) -> float:
        """The database's clock now, from the last reading (when the database cannot answer)."""
        return time.monotonic() + self.offset


class Waiter:
    """One wait on the change feed, the mechanism behind every wait in agenthold
    (``StateStore.watch``, ``Coordinator.wait``, the MCP server's async waits): it listens to
    the topics the waiter's last look named and says how long to sleep before the next look.

    A loop looks at the database, passes the topics it depends on to ``listen`` (True means
    they changed, so look again: a commit may have come between the look and the subscription),
    then sleeps for ``pause()`` seconds, or until ``wake`` is called (from any thread) by a
    commit to one of those topics. ``pause`` is None once the deadline has passed. See
    ``wait_until`` for the blocking form; an async form only swaps the sleep.
    """

    __slots__ = ("_clock", "_subscription", "_topics", "deadline", "start")

    def __init__(
        self,
        db: Any,
        timeout: float,
        wake: Callable[[], None],
        topics: Iterable[Topic] = (),
    ) -> None:
        # two clocks, never compared with each other: the timeout is this host's (monotonic),
        # a wake_at is the database's (see DatabaseClock)
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self._clock: DatabaseClock = db.clock
        self._topics = frozenset(topics)
        self._subscription = db.subscribe(self._topics, wake)

    @property
    def elapsed(self) -> float:
        """Seconds since the wait began, rounded to the millisecond (as replies show it)."""
        return round(time.monotonic() - self.start, 3)

    def listen(self, topics: Iterable[Topic]) -> bool:
        """Listen to ``topics`` from now on; True if they differ from the last ones."""
        wanted = frozenset(topics)
        if wanted == self._topics:
            return False
        self._subscription.update(wanted)
        self._topics = wanted
        return True

    def pause(self, wake_at: float | None = None) -> float | None:
        """Seconds to sleep before looking again: until the deadline, or until ``wake_at`` (a
        unix time on the database's clock, say a holder's lease end) if that comes first; None
        once the deadline has passed."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return None
        if wake_at is not None:
            remaining = min(remaining, max(0.0, self._clock.until(wake_at)) + 0.001)
        return remaining

    def due(self, wake_at: float | None) -> bool:
        """Whether ``wake_at`` (the database's clock, or None: never) has come."""
        return wake_at is not None and self._clock.until(wake_at) <= 0

    def close(self) -> None:
        self._subscription.close()

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(
    db: Any,
    look: Callable[[], tuple[Any, Iterable[Topic], float | None]],
    timeout: float,
    topics: Iterable[Topic] = (),
) -> Any:
    """Call ``look`` until it returns something other than None, or ``timeout`` seconds pass
    (then None), blocking this thread in between on the change feed (see ``Waiter``). ``look``
    returns (what it found or None, the topics to listen to, a unix time on the database's
    clock to look again at, or None); ``topics`` are listened to before the first look."""
    woken = threading.Event()
    with Waiter(db, timeout, woken.set, topics) as waiter:
        while True:
            woken.clear()
            found, wanted, wake_at = look()
            if found is not None:
                return found
            if waiter.listen(wanted):
                continue
            pause = waiter.pause(wake_at)
            if pause is None:
                return None
            woken.wait(pause)


# --------------------------------------------------------------------------------------------
# File-system events: the hint that another process may have committed
# --------------------------------------------------------------------------------------------

# The change feed learns of another process's commit from an event on the database's files
# (inotify on Linux, kqueue on macOS and the BSDs), then checks ``PRAGMA data_version`` as a
# poll would: the tables are the truth, an event only says when to look. Events come when the
# WAL is written, which is a moment before the commit is visible to readers (SQLite updates the
# shared-memory index after the write), so after an event the feed looks again a few times over
# the next quarter second (FOLLOW_UPS), and every FEED_SAFETY_NET seconds in any case. Without
# events (another platform, a failure to set them up, or FILE_EVENTS_VARIABLE set to "off") the
# feed polls every POLL_INTERVAL as before.
FEED_SAFETY_NET = 0.5  # seconds: with file events, the feed still looks this often
FOLLOW_UPS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128)  # looks after an event
FILE_EVENTS_VARIABLE = "AGENTHOLD_FILE_EVENTS"  # "off": no file events, poll (tests use it)


def _file_names(path: str) -> tuple[str, str, frozenset[str]]:
    """The directory of the database at ``path`` and the names there whose changes matter:
    the file itself (checkpoints, rollback-journal commits, a replacement), its WAL and its
    rollback journal (not the -shm file, which SQLite changes through shared memory)."""
    directory, name = os.path.split(path)
    return directory or ".", name, frozenset((name, f"{name}-wal", f"{name}-journal"))


class _InotifyWatch(NamedTuple):
    wd: int
    names: frozenset[str]
    nudge: Callable[[], None]


class _Inotify:
    """One inotify instance for the whole process (the kernel allows a user only a few, 128 by
    default), read by one daemon thread. Each database's directory is watched, not its files:
    that also sees a WAL created after the watch began, a WAL removed and a file replaced by a
    rename. Reads make no events, so waiting readers do not wake each other."""

    kind = "inotify"
    alive = True  # False once its thread failed
    IN_MODIFY, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x2, 0x40, 0x80, 0x100, 0x200
    IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = (
        0x400, 0x800, 0x2000, 0x4000, 0x8000)  # fmt: skip
    IN_ONLYDIR, IN_CLOEXEC = 0x1000000, 0o2000000
    MASK = (IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
            | IN_MOVE_SELF | IN_ONLYDIR)  # fmt: skip
    EVERYONE = IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT

    def __init__(self) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        self._init = libc.inotify_init1
        self._add = libc.inotify_add_watch
        self._rm = libc.inotify_rm_watch
        self._init.argtypes = [ctypes.c_int]
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
        self._errno = ctypes.get_errno
        fd = self._init(self.IN_CLOEXEC)
        if fd < 0:
            raise self._error("inotify_init1")
        self._fd = fd
        self._lock = threading.Lock()
        self._dirs: dict[int, dict[str, set[Callable[[], None]]]] = {}  # wd: name: nudges
        threading.Thread(target=self._run, name="agenthold-file-events", daemon=True).start()

    def _error(self, call: str) -> OSError:
        number = self._errno()
        return OSError(number, f"{call}: {os.strerror(number)}")

    def add(self, path: str, nudge: Callable[[], None]) -> object:
        """Call ``nudge`` (from the reader thread) whenever the database at ``path`` may have
        changed; returns what ``remove`` takes."""
        directory, _, names = _file_names(path)
        with self._lock:
            wd = self._add(self._fd, os.fsencode(directory), self.MASK)
            if wd < 0:
                raise self._error(f"inotify_add_watch {directory!r}")
            by_name = self._dirs.setdefault(wd, {})
            for name in names:
                by_name.setdefault(name, set()).add(nudge)
        return _InotifyWatch(wd, names, nudge)

    def remove(self, handle: object) -> None:
        assert isinstance(handle, _InotifyWatch)
        wd, names, nudge = handle
        with self._lock:
            by_name = self._dirs.get(wd)
            if by_name is None:
                return
            for name in names:
                nudges = by_name.get(name)
                if nudges is not None:
                    nudges.discard(nudge)
                    if not nudges:
                        del by_name[name]
            if not by_name:
                del self._dirs[wd]
                self._rm(self._fd, wd)  # may fail if the directory is gone: nothing to undo

    def _run(self) -> None:
        _read_events(self, self._read)

    def _read(self) -> set[Callable[[], None]]:
        """Block for the next events; the nudges they call for."""
        data = os.read(self._fd, 65536)
        woken: set[Callable[[], None]] = set()
        with self._lock:
            offset = 0
            while offset + 16 <= len(data):
                wd, mask, _, size = struct.unpack_from("iIII", data, offset)
                name = os.fsdecode(data[offset + 16 : offset + 16 + size].rstrip(b"\0"))
                offset += 16 + size
                if wd == -1:  # the queue overflowed: events were lost
                    for by_name in self._dirs.values():
                        woken.update(*by_name.values())
                elif mask & self.EVERYONE:  # the directory itself went
                    woken.update(*self._dirs.get(wd, {}).values())
                    if mask & self.IN_IGNORED:  # the watch is gone with it
                        self._dirs.pop(wd, None)
                else:
                    woken.update(self._dirs.get(wd, {}).get(name, ()))
        return woken

    def nudges(self) -> set[Callable[[], None]]:
        with self._lock:
            return {n for by_name in self._dirs.values() for ns in by_name.values() for n in ns}

    def close_in_child(self) -> None:
        with suppress(OSError):
            os.close(self._fd)


class _KqueueWatch:  # pragma: no cover - macOS and the BSDs only; CI runs Linux
    __slots__ = ("dir_fd", "directory", "nudge", "wal", "wal_fd", "wal_id")

    def __init__(self, directory: str, wal: str, dir_fd: int, nudge: Callable[[], None]):
        self.directory = directory
        self.wal = wal
        self.dir_fd = dir_fd
        self.wal_fd = -1
        self.wal_id: tuple[int, int] | None = None
        self.nudge = nudge


class _Kqueue:  # pragma: no cover - macOS and the BSDs only; CI runs Linux
    """One kqueue for the whole process (macOS and the BSDs), read by one daemon thread. kqueue
    watches open files, so each database gets two: its directory (a WAL created or removed, a
    file replaced) and its WAL (every commit writes it), reopened whenever the directory changes.
    The database file itself is never opened: closing a descriptor of a file drops every POSIX
    lock this process holds on it, SQLite's among them. Nothing locks the WAL."""

    kind = "kqueue"
    alive = True  # False once its thread failed

    def __init__(self) -> None:
        import select

        self._select: Any = select  # typed loosely: mypy on Linux does not know kqueue
        self._kq = self._select.kqueue()
        self._lock = threading.Lock()
        self._by_fd: dict[int, _KqueueWatch] = {}
        self._evtonly = getattr(os, "O_EVTONLY", os.O_RDONLY)  # does not keep a volume busy
        threading.Thread(target=self._run, name="agenthold-file-events", daemon=True).start()

    def _register(self, fd: int, watch: _KqueueWatch) -> None:
        s = self._select
        flags = s.KQ_NOTE_WRITE | s.KQ_NOTE_EXTEND | s.KQ_NOTE_ATTRIB | s.KQ_NOTE_DELETE
        flags |= s.KQ_NOTE_RENAME | s.KQ_NOTE_REVOKE
        event = s.kevent(fd, s.KQ_FILTER_VNODE, s.KQ_EV_ADD | s.KQ_EV_CLEAR, flags)
        self._kq.control([event], 0, 0)
        self._by_fd[fd] = watch

    def add(self, path: str, nudge: Callable[[], None]) -> object:
        directory, name, _ = _file_names(path)
        dir_fd = os.open(directory, self._evtonly)
        watch = _KqueueWatch(directory, os.path.join(directory, f"{name}-wal"), dir_fd, nudge)
        with self._lock:
            try:
                self._register(dir_fd, watch)
            except OSError:
                os.close(dir_fd)
                raise
            self._follow_wal(watch)
        return watch

    def _follow_wal(self, watch: _KqueueWatch) -> None:
        """Watch the WAL now at the path (a new one after a removal); called with the lock."""
        try:
            st = os.stat(watch.wal)
            wal_id: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            wal_id = None
        if wal_id == watch.wal_id and (wal_id is None or watch.wal_fd >= 0):
            return
        self._drop_wal(watch)
        if wal_id is None:
            return
        try:
            fd = os.open(watch.wal, self._evtonly)
        except OSError:  # removed meanwhile: the directory's event comes
            return
        try:
            self._register(fd, watch)
        except OSError:
            os.close(fd)
            return
        watch.wal_fd, watch.wal_id = fd, wal_id

    def _drop_wal(self, watch: _KqueueWatch) -> None:
        if watch.wal_fd >= 0:
            self._by_fd.pop(watch.wal_fd, None)
            with suppress(OSError):
                os.close(watch.wal_fd)  # closing a descriptor ends its kqueue watch
        watch.wal_fd, watch.wal_id = -1, None

    def remove(self, handle: object) -> None:
        assert isinstance(handle, _KqueueWatch)
        with self._lock:
            self._drop_wal(handle)
            if self._by_fd.pop(handle.dir_fd, None) is not None:
                with suppress(OSError):
                    os.close(handle.dir_fd)

    def _run(self) -> None:
        _read_events(self, self._read)

    def _read(self) -> set[Callable[[], None]]:
        events = self._kq.control(None, 64, None)
        woken: set[Callable[[], None]] = set()
        with self._lock:
            for event in events:
                watch = self._by_fd.get(event.ident)
                if watch is None:  # removed since the event came
                    continue
                if event.ident == watch.dir_fd or event.fflags & (
                    self._select.KQ_NOTE_DELETE | self._select.KQ_NOTE_RENAME
                ):
                    self._follow_wal(watch)
                woken.add(watch.nudge)
        return woken

    def nudges(self) -> set[Callable[[], None]]:
        with self._lock:
            return {watch.nudge for watch in self._by_fd.values()}

    def close_in_child(self) -> None:
        # The descriptors of files are inherited by a child of fork(), a kqueue is not: its
        # number may be reused there, so the object is kept, never closed (see _inherited).
        for fd in list(self._by_fd):
            with suppress(OSError):
                os.close(fd)
        _inherited.append(self._kq)


def _read_events(watcher: _Inotify | _Kqueue, read: Callable[[], set[Callable[[], None]]]) -> None:
    """The watcher thread: call the nudges of each batch of events. If reading ever fails, the
    watcher is dead: every feed is nudged and polls every POLL_INTERVAL from then on."""
    try:
        while True:
            for nudge in read():
                nudge()
    except Exception as exc:  # a closed descriptor, a bug: never a silent loss of wake-ups
        watcher.alive = False
        log.warning("file events stopped (%s); the change feed polls every %g s",
                    exc, POLL_INTERVAL)  # fmt: skip
        for nudge in watcher.nudges():
            nudge()


_watcher: _Inotify | _Kqueue | None = None
_watcher_tried = False
_watcher_lock = threading.Lock()


def _events_alive() -> bool:
    return _watcher is not None and _watcher.alive


def _file_events() -> _Inotify | _Kqueue | None:
    """This process's file-event watcher, started on first use; None where there are none."""
    global _watcher, _watcher_tried
    if os.environ.get(FILE_EVENTS_VARIABLE, "").strip().lower() in ("off", "0", "no", "false"):
        return None
    with _watcher_lock:
        if not _watcher_tried:
            _watcher_tried = True
            try:
                if sys.platform.startswith("linux"):
                    _watcher = _Inotify()
                elif sys.platform == "darwin" or "bsd" in sys.platform:
                    _watcher = _Kqueue()
            except Exception as exc:  # no inotify in this libc, a kernel without it, ...
                log.warning("no file events (%s); the change feed polls every %g s",
                            exc, POLL_INTERVAL)  # fmt: skip
        return _watcher


class _ChangeFeed:
    """Wakes subscribers when a topic they listen to changes.

    Commits made through this process call ``notify`` directly. For a file database, a poller
    thread also runs while anyone listens: it checks ``PRAGMA data_version`` when a file event
    says the database may have changed (and every FEED_SAFETY_NET seconds), or every
    POLL_INTERVAL where there are no file events, and when another connection committed, reads
    the new rows of each change source to learn the topics. One feed serves every store of the
    process on the same file.
    """

    def __init__(self, uri: str | None, path: str | None = None) -> None:
        self._uri = uri  # None: a private in-memory database, so there is nothing to poll
        self._path = path  # the file whose events wake the poller; None: poll (or no poller)
        self._nudge = threading.Event()  # set by a file event: look now
        self._watch: object | None = None  # the poller's file watch, if it has one
        self._lock = threading.Lock()
        self._by_topic: dict[Topic, set[_Subscription]] = {}
        self._everything: set[_Subscription] = set()
        self._count = 0
        self._sources: dict[str, ChangeSource] = {}
        self._cursors: dict[str, int] = {}
        self._poller: threading.Thread | None = None
        self._poll_conn: sqlite3.Connection | None = None
        self._data_version = -1

    def add_source(self, source: ChangeSource) -> None:
        with self._lock:
            if source.name in self._sources:
                return
            self._sources[source.name] = source
            if self._poll_conn is not None:
                self._cursors[source.name] = (
                    self._poll_conn.execute(source.max_sql).fetchone()[0] or 0
                )

    def subscribe(
        self, topics: Iterable[Topic] | None, callback: Callable[[], None]
    ) -> _Subscription:
        sub = _Subscription(self, None if topics is None else frozenset(topics), callback)
        with self._lock:
            self._attach(sub)
            self._count += 1
            if self._uri is not None and self._poller is None:
                self._start_poller()
        return sub

    def _attach(self, sub: _Subscription) -> None:
        if sub.topics is None:
            self._everything.add(sub)
        else:
            for t in sub.topics:
                self._by_topic.setdefault(t, set()).add(sub)

    def _detach(self, sub: _Subscription) -> None:
        if sub.topics is None:
            self._everything.discard(sub)
        else:
            for t in sub.topics:
                subs = self._by_topic.get(t)
                if subs is not None:
                    subs.discard(sub)
                    if not subs:
                        del self._by_topic[t]

    def _retopic(self, sub: _Subscription, topics: frozenset[Topic] | None) -> None:
        with self._lock:
            if sub.closed:
                return
            self._detach(sub)
            sub.topics = topics
            self._attach(sub)

    def _remove(self, sub: _Subscription) -> None:
        with self._lock:
            if sub.closed:
                return
            sub.closed = True
            self._detach(sub)
            self._count -= 1

    def notify(self, topics: Iterable[Topic]) -> None:
        if not self._count:
            return
        with self._lock:
            woken = set(self._everything)
            for t in topics:
                subs = self._by_topic.get(t)
                if subs:
                    woken.update(subs)
        for sub in woken:
            try:
                sub.callback()
            except Exception:  # a subscriber's bug must not break the writer
                log.exception("change callback failed")

    # -- the poller ---------------------------------------------------------------------------

    def _start_poller(self) -> None:
        """Open the poller's connection and set its cursors. Called with the lock held, before
        the subscriber's first check, so no commit after that check can be missed."""
        assert self._uri is not None
        # The watch begins before the first look, so every later write makes an event.
        self._nudge = nudge = threading.Event()
        self._watch = self._watch_file(nudge.set)
        try:
            if self._poll_conn is None:
                conn = sqlite3.connect(
                    self._uri, uri=True, isolation_level=None, check_same_thread=False
                )
                conn.execute("PRAGMA query_only = 1")
                self._poll_conn = conn
            conn = self._poll_conn
            self._data_version = conn.execute("PRAGMA data_version").fetchone()[0]
            for name, src in self._sources.items():
                self._cursors[name] = conn.execute(src.max_sql).fetchone()[0] or 0
        except sqlite3.Error as exc:
            log.warning(
                "change feed cannot read the database (%s); waiters rely on local commits", exc
            )
            self._unwatch()
            return
        self._poller = threading.Thread(
            target=self._poll, args=(nudge, self._watch is not None),
            name="agenthold-change-feed", daemon=True,
        )  # fmt: skip
        self._poller.start()

    def _watch_file(self, nudge: Callable[[], None]) -> object | None:
        """Ask for file events on the database; None where there are none (then poll)."""
        path = self._path
        watcher = _file_events() if path is not None else None
        if path is None or watcher is None:
            return None
        try:
            return watcher.add(path, nudge)
        except Exception as exc:  # too many watches, a file system without events, ...
            log.warning("no file events for %s (%s); the change feed polls every %g s",
                        self._path, exc, POLL_INTERVAL)  # fmt: skip
            return None

    def _unwatch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None and _watcher is not None:
            _watcher.remove(watch)

    def _poll(self, nudge: threading.Event, events: bool) -> None:
        idle_since: float | None = None
        failures = 0
        # After an event, look again a few times: the commit that wrote the WAL may not be
        # visible yet. The watch's own start counts as one (a commit may be half written).
        follow_ups = iter(FOLLOW_UPS if events else ())
        while True:
            if failures:
                delay = min(1.0, POLL_INTERVAL * 2**failures)
            elif events and _events_alive():
                delay = next(follow_ups, FEED_SAFETY_NET)
            else:
                delay = POLL_INTERVAL
            if nudge.wait(delay):
                nudge.clear()  # before the look: an event during it means look again
                follow_ups = iter(FOLLOW_UPS)
            with self._lock:
                if self._poller is not threading.current_thread():  # stopped by stop()
                    return
                if not self._count:
                    now = time.monotonic()
                    idle_since = idle_since or now
                    if now - idle_since > FEED_LINGER:  # nobody listened for a while: stop
                        self._stop()
                        return
                    continue
                idle_since = None
                conn = self._poll_conn
                assert conn is not None
                # A cursor moves only past rows whose topics are notified below, and the data
                # version is remembered only once every source was read: a failed read is
                # retried at the next poll instead of waiting for another commit.
                topics: set[Topic] = set()
                try:
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                    if version != self._data_version:
                        for name, src in self._sources.items():
                            for row in conn.execute(src.since_sql, (self._cursors[name],)):
                                self._cursors[name] = max(self._cursors[name], row[0])
                                topics.update(src.topics(row))
                        self._data_version = version
                    failures = 0
                except sqlite3.Error as exc:
                    failures = min(failures + 1, 9)
                    log.warning("change feed poll failed: %s", exc)
            if topics:
                self.notify(topics)

    def stop(self) -> None:
        """End the poller and close its connection (the last store on the file has closed: a
        connection left open would keep SQLite from removing the -wal file at exit)."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        self._poller = None
        self._unwatch()
        self._nudge.set()  # the poller ends now rather than at its next look
        if self._poll_conn is not None:
            with suppress(sqlite3.Error):
                self._poll_conn.close()
            self._poll_conn = None

    def reset_after_fork(self) -> None:
        if self._poll_conn is not None:
            _inherited.append(self._poll_conn)
        self._watch = None  # the child has a watcher of its own, started when needed
        self._nudge = threading.Event()
        self._lock = threading.Lock()
        self._by_topic.clear()
        self._everything.clear()
        self._count = 0
        self._poller = None
        self._poll_conn = None


class _FileState:
    """What every store of this process shares about one database file."""

    def __init__(
        self, uri: str | None, identity: tuple[int, int] | None = None, path: str | None = None
    ) -> None:
        self.write_lock = threading.Lock()
        self.feed = _ChangeFeed(uri, path)
        self.identity = identity  # the file's (device, inode), once it exists
        self.stores = 0  # open SQLiteDatabases of this process on the file
        # Where the database id's page is (page number, page size), the id, and a descriptor of
        # the file that reads it; kept open until the last store of the file closes (closing a
        # descriptor of a file drops this process's POSIX locks on it, SQLite's included).
        self.id_page: tuple[int, int] | None = None
        self.database_id: str | None = None
        self.raw_fd: int | None = None
        self.replaced = False  # another file's contents were found in this one
        self.id_on_disk = False  # the id was read from the file itself once
        self.verified: tuple[int, ...] | None = None  # its stat when the id was last read there


_files: dict[str, _FileState] = {}
_files_lock = threading.Lock()
_open_databases: weakref.WeakSet[SQLiteDatabase] = weakref.WeakSet()
# A connection must not be used or closed in a child process after fork(); a child keeps the
# ones it inherited here, unused, so that garbage collection never closes them.
_inherited: list[Any] = []


def _file_state(real_path: str, uri: str) -> _FileState:
    """The shared state of the file now at ``real_path``. If another file stood there before
    (deleted or replaced since), it gets a state of its own: the old one's poller reads the
    old file, and stores still open on that keep it."""
    identity = _identity(real_path)
    with _files_lock:
        state = _files.get(real_path)
        if state is None or (state.identity is not None and state.identity != identity):
            state = _files[real_path] = _FileState(uri, identity, real_path)
        return state


def _open_here(real_path: str) -> bool:
    """Whether a store of this process has the file now at ``real_path`` open."""
    identity = _identity(real_path)
    with _files_lock:
        state = _files.get(real_path)
        return (
            identity is not None
            and state is not None
            and state.stores > 0
            and state.identity == identity
        )


def _after_fork_in_child() -> None:
    # Connections, locks and threads do not survive fork(): start afresh in the child.
    global _files_lock, _watcher, _watcher_lock, _watcher_tried
    _files_lock = threading.Lock()
    if _watcher is not None:
        _watcher.close_in_child()
    _watcher, _watcher_tried, _watcher_lock = None, False, threading.Lock()
    for state in _files.values():
        state.write_lock = threading.Lock()
        state.feed.reset_after_fork()
    for db in list(_open_databases):
        db._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _translate(exc: sqlite3.Error, busy_timeout: float, path: str = "") -> AgentholdError:
    """Turn a SQLite error into an error the caller can act on, with a hint saying how."""
    text = str(exc)
    lowered = text.lower()
    error: AgentholdError
    if "locked" in lowered or "busy" in lowered:
        error = BusyError(
            f"the database stayed locked by another writer for more than {busy_timeout:g} s "
            "(busy_timeout); nothing was written; retry in a moment"
        )
        error.hint = "Another writer holds the database; nothing was changed. Retry in a moment."
    elif "disk is full" in lowered or "database or disk is full" in lowered:
        error = UnavailableError(
            "the database cannot grow (the disk is full or its page limit is reached); "
            "nothing was written"
        )
        error.hint = "Free disk space; writes work again as soon as there is room."
        error.transient = True
    elif "readonly" in lowered or "read-only" in lowered:
        stuck = _unwritable(path)
        error = UnavailableError(
            "the database is read-only here"
            + (f" ({', '.join(stuck)} cannot be written)" if stuck else "")
            + "; nothing was written"
        )
        error.hint = (
            "Make the database file, its -wal and -shm files and their directory writable, "
            "then restart agenthold."
        )
    elif "i/o error" in lowered:
        error = UnavailableError(
            "the database could not be written (an I/O error: a full disk, a file-size limit "
            "or a failing disk); nothing was written"
        )
        error.hint = "Check the disk and its free space, then retry."
        error.transient = True
    elif "malformed" in lowered or "corrupt" in lowered:
        error = UnavailableError(f"the database file is damaged: {text}")
        error.hint = (
            "Stop agenthold and restore the file from a backup (sqlite3's .recover command can "
            "save what is readable)."
        )
    else:
        error = UnavailableError(f"the database failed: {text}")
        error.hint = "Retry in a moment; if it keeps failing, check the database file."
    return error


def _unwritable(path: str) -> list[str]:
    """Which of the database's files (and its directory) this process may not write."""
    if not path or path == ":memory:":
        return []
    files = [path, path + "-wal", path + "-shm"]
    stuck = [f for f in files if os.path.exists(f) and not os.access(f, os.W_OK)]
    folder = os.path.dirname(os.path.abspath(path))
    if not os.access(folder, os.W_OK):
        stuck.append(folder)
    return stuck


class Subscription(Protocol):
    """What ``Database.subscribe`` returns: change its topics, or close it (also on exit)."""

    def update(self, topics: Iterable[Topic] | None) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Subscription: ...
    def __exit__(self, *exc: object) -> None: ...


class Database(Protocol):
    """The seam between agenthold's components (store, claims, messages) and a database engine:
    ``SQLiteDatabase`` below, ``agenthold.db.postgres.PostgresDatabase`` for PostgreSQL.

    Components write their SQL once, with ``?`` placeholders and the syntax both engines share;
    their tables come from a ``Component`` given to ``ensure``. The connection that ``snapshot``
    and ``write`` yield has ``execute(sql, params)`` (returning a cursor with ``fetchone``,
    ``fetchall`` and iteration) and ``executemany``. Correctness must not rest on one writer at
    a time: a write that reads before it changes calls ``serialize`` first with the names it
    reads, so that concurrent writers of those names take turns (PostgreSQL runs READ
    COMMITTED with many writers). Errors are AgentholdErrors: BusyError when another writer
    held a lock past ``busy_timeout``, UnavailableError (with a hint) when the database cannot
    serve, never an error of the driver.
    """

    dialect: str  # "sqlite" or "postgresql"
    path: str  # what to show the user: a file path, or a URL without its password
    read_only: bool
    busy_timeout: float
    clock: DatabaseClock  # fed by every reading of now() and serialize()

    def ensure(self, component: Component, *, required: bool = True) -> int: ...
    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
    def snapshot(self) -> AbstractContextManager[Any]: ...
    def write(self) -> AbstractContextManager[tuple[Any, list[Topic]]]: ...
    def serialize(
        self, conn: Any, exclusive: Sequence[str], shared: Sequence[str] = ()
    ) -> float: ...
    def now(self) -> float: ...
    def feed_window(
        self, conn: Any, table: str, after: Any
    ) -> tuple[str, tuple[Any, ...], Any]: ...
    def subscribe(
        self, topics: Iterable[Topic] | None, callback: Callable[[], None]
    ) -> Subscription: ...
    def notify(self, topics: Iterable[Topic]) -> None: ...
    def add_change_source(self, source: ChangeSource) -> None: ...
    def close(self) -> None: ...


POSTGRES_PREFIXES = ("postgresql://", "postgres://")


#: Every database opened through open_database that may still be open, of either engine.
_opened: weakref.WeakSet[Any] = weakref.WeakSet()


def open_database(
    target: str | os.PathLike[str],
    *,
    read_only: bool = False,
    durability: str = "normal",
    busy_timeout: float = 5.0,
) -> Database:
    """The Database for a file path, ":memory:" or a ``postgresql://`` URL."""
    database: Database
    if isinstance(target, str) and target.startswith(POSTGRES_PREFIXES):
        try:  # by name: the backend imports this module, not the other way round
            backend = importlib.import_module("agenthold.db.postgres")
        except ImportError:
            # Not 'pip install "agenthold[postgres]"': until 0.11 is published that installs
            # the registry's 0.10, which has no such extra. psycopg itself is on the registry.
            raise InvalidInputError(
                "a postgresql:// database needs psycopg 3, which is not installed: "
                'pip install "psycopg[binary,pool]>=3.3,<4" into agenthold\'s environment '
                '(from a checkout: pip install ".[postgres]")'
            ) from None
        database = backend.PostgresDatabase(
            target, read_only=read_only, durability=durability, busy_timeout=busy_timeout
        )
    else:
        database = SQLiteDatabase(
            os.fspath(target) if isinstance(target, os.PathLike) else target,
            read_only=read_only,
            durability=durability,
            busy_timeout=busy_timeout,
        )
    _opened.add(database)
    return database


def close_all() -> None:
    """Close every database this process still has open: for a process about to end without
    the interpreter's teardown (which would close them), since the last connection to close
    is what makes SQLite checkpoint its write-ahead log and remove it. Closing is idempotent."""
    for database in list(_opened):
        database.close()


class SQLiteDatabase:
    """Connections, transactions and change notification for one SQLite database.

    Stores and claims use only this interface, so a different backend means a different class
    with the same methods: ``fetchone``, ``fetchall``, ``snapshot``, ``write``, ``subscribe``,
    ``notify``, ``add_change_source`` and ``close``.
    """

    dialect = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        read_only: bool = False,
        durability: str = "normal",
        busy_timeout: float = 5.0,
    ) -> None:
        path = os.fspath(path) if isinstance(path, os.PathLike) else path
        if not isinstance(path, str) or not path or "\x00" in path:
            raise InvalidInputError(
                f"path must be a file path or ':memory:' (a non-empty string without NUL "
                f"characters), got {path!r}"
            )
        if not isinstance(durability, str) or durability not in SYNCHRONOUS:
            raise InvalidInputError(f"durability must be 'normal' or 'full', got {durability!r}")
        if not isinstance(read_only, bool):
            raise InvalidInputError(f"read_only must be True or False, got {read_only!r}")
        self.busy_timeout = check_seconds("busy_timeout", busy_timeout, maximum=3600)
        self.clock = DatabaseClock()
        self.path = path
        self.read_only = read_only
        self.durability = durability
        self.memory = path == ":memory:"
        self._closed = False
        self._identity: tuple[int, int] | None = None  # the file's (device, inode), once open
        self._real = ""
        self._local = threading.local()
        # Every connection opened, by the thread that owns it, with the lock held while it is in
        # use: close() takes it before closing the connection, since closing one that another
        # thread is executing on crashes the process. A thread's connection is closed once the
        # thread has ended (checked whenever a new connection opens) or at close().
        self._connections: dict[threading.Thread, tuple[sqlite3.Connection, threading.RLock]] = {}
        self._connections_lock = threading.Lock()
        self._mem_lock: threading.RLock | None = None
        if self.memory:
            if read_only:
                raise InvalidInputError("a ':memory:' database cannot be opened read-only")
            self._uri = f"file:agenthold-{_random_hex()}?mode=memory&cache=private"
            self._file = _FileState(None)
            self._mem_lock = threading.RLock()
            self._shared: sqlite3.Connection | None = self._connect()[0]
        else:
            self._shared = None
            self._check_file()
            real = os.path.realpath(path)
            mode = "ro" if read_only else "rwc"
            if read_only and self._needs_immutable(real):
                mode = "ro&immutable=1"
            self._uri = f"file:{_quote_path(real)}?mode={mode}"
            self._file = _file_state(real, f"file:{_quote_path(real)}?mode={mode}")
            self._real = real
            if self._file.stores == 0:  # the first store of this process on the file
                self._check_wal(real)
            elif self._holds_another_database():  # copied over in place under our stores
                error = IncompatibleDatabaseError(
                    f"the database file {path!r} was replaced while this process had it open: "
                    "another database was copied over it; agenthold did not open it"
                )
                error.hint = (
                    "Close the stores of this process that had the file open (stop the "
                    "server), then open it again."
                )
                raise error
        with _files_lock:
            self._file.stores += 1  # from here on, close() counts it out again
        self._prepare_schema()
        if not self.memory:
            # From now on a thread's new connection must find this very file: never create an
            # empty one in its place (the file was deleted), and no write may go to it unseen.
            self._uri = self._uri.replace("?mode=rwc", "?mode=rw")
            self._identity = _identity(real)
            if self._file.identity is None:  # this store made the file
                self._file.identity = self._identity
        _open_databases.add(self)

    # -- opening -----------------------------------------------------------------------------

    def _check_file(self) -> None:
        path = self.path
        for name in (path, path + "-wal"):  # SQLite also opens the write-ahead log by name
            try:
                os.stat(name)
            except OSError as exc:
                if exc.errno == errno.ENAMETOOLONG:  # SQLite would say only "unable to open"
                    shown = path if len(path) <= 120 else path[:60] + "..." + path[-40:]
                    raise IncompatibleDatabaseError(
                        f"cannot open database {shown!r}: the path, or one of its names with the"
                        " '-wal' suffix SQLite adds, is longer than this system allows; use a"
                        " shorter path"
                    ) from None
        full = len(os.fsencode(os.path.abspath(os.path.realpath(path))))
        if full > SQLITE_MAX_PATH:  # SQLite would say only "unable to open database file"
            shown = path if len(path) <= 120 else path[:60] + "..." + path[-40:]
            error = IncompatibleDatabaseError(
                f"cannot open database {shown!r}: its full path is {full} bytes long, and SQLite "
                f"opens no database whose full path is over {SQLITE_MAX_PATH} bytes (its limit "
                "of 512, less the '-journal' it adds for the journal's name)"
            )
            error.hint = (
                "Move the database to a shorter path (SQLite follows symbolic links to the "
                "real path, so a short link to it does not help)."
            )
            raise error
        # The directory named in the path, and the one a symbolic link at the path points into.
        for parent in dict.fromkeys(
            os.path.dirname(p) for p in (os.path.abspath(path), os.path.realpath(path))
        ):
            if not os.path.isdir(parent):
                raise IncompatibleDatabaseError(
                    f"cannot open database {path!r}: the directory {parent!r} does not exist"
                )
        if os.path.isdir(path):
            raise IncompatibleDatabaseError(f"cannot open database {path!r}: it is a directory")
        if not os.path.exists(path):
            if self.read_only:
                raise IncompatibleDatabaseError(
                    f"no database at {path!r} (read-only opening never creates one)"
                )
            self._check_orphaned_wal()
            return
        if _open_here(os.path.realpath(path)):
            # SQLite has this very file open in this process, so it is a SQLite database; and
            # opening it here would be harmful: closing any descriptor of a file drops every
            # POSIX lock the process holds on it, the locks of those connections included.
            return
        try:
            with open(path, "rb") as f:
                header = f.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise IncompatibleDatabaseError(
                f"cannot read database {path!r}: {exc.strerror}"
            ) from None
        if header and header != SQLITE_MAGIC:
            raise IncompatibleDatabaseError(
                f"{path!r} is not a SQLite database, so not an agenthold database; "
                "give another --db path"
            )

    def _needs_immutable(self, real: str) -> bool:
        """Whether a read-only opening must read the file alone (SQLite's ``immutable``): a WAL
        database whose -shm file is missing and cannot be made (a read-only directory), where
        SQLite would only say "unable to open database file". That is exact while the log
        holds no commit: no writer can open the file either (it needs that -shm file), so
        nothing changes it. A log with commits cannot be read that way: refused, saying why."""
        folder = os.path.dirname(real)
        if os.path.exists(real + "-shm") or os.access(folder, os.W_OK | os.X_OK):
            return False
        try:
            with open(real, "rb") as f:
                header = f.read(20)
        except OSError:  # pragma: no cover - _check_file has just read it
            return False
        if len(header) < 20 or header[18] != 2:  # not in WAL mode: SQLite needs no -shm file
            return False
        if os.path.lexists(real + "-wal"):  # read_wal says None of a log it cannot read too
            try:
                os.close(os.open(real + "-wal", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
            except OSError as exc:  # it may hold commits: the file alone could be stale
                error = IncompatibleDatabaseError(
                    f"cannot read {self.path!r}: its write-ahead log {self.path + '-wal'!r} "
                    f"cannot be read ({exc.strerror}), and it may hold commits that are not in "
                    "the file yet; agenthold does not read the file without it"
                )
                error.hint = "Let this user read the -wal file (or the owner open it once)."
                raise error from None
        wal = read_wal(real + "-wal")
        if wal is None or wal.committed == 0:
            return True
        error = IncompatibleDatabaseError(
            f"cannot read {self.path!r}: its write-ahead log {self.path + '-wal'!r} holds "
            "commits that are not in the file yet, and SQLite reads those only through a "
            f"shared-memory file {self.path + '-shm'!r}, which cannot be created in the "
            f"read-only directory {folder!r}"
        )
        error.hint = (
            "Make the directory writable (a read-only opening adds the -shm file and changes "
            "nothing else), or copy the database file and its -wal file together into a "
            "writable directory and read the copy."
        )
        raise error

    def _check_orphaned_wal(self) -> None:
        """Refuse to make a new file beside the -wal and -shm of a deleted one. SQLite would
        take them for the new file's: it would share a running server's log (failing with a
        misleading I/O error and resetting that server's log), or apply a killed one's to an
        empty file. An empty log nobody holds (what a server leaves when its file was deleted
        under it) is harmless."""
        path, real = self.path, os.path.realpath(self.path)
        if not os.path.exists(path + "-shm") and not os.path.exists(path + "-wal"):
            return
        guard = _wal_alone(real) if os.path.exists(path + "-shm") else None
        in_use = guard is None and os.path.exists(path + "-shm") and _posix_locks()
        held_here = _files.get(real)  # this process's own locks never conflict: ask its stores
        in_use = in_use or (held_here is not None and held_here.stores > 0)
        if guard is not None:
            os.close(guard)
        try:
            logged = os.path.getsize(path + "-wal")
        except OSError:
            logged = 0
        if not in_use and logged == 0:
            return
        if in_use:
            error = IncompatibleDatabaseError(
                f"the database file {path!r} is missing, but another process still has its "
                f"write-ahead log {path + '-wal'!r} open: the file was deleted while a server "
                "was using it; agenthold created nothing and changed nothing"
            )
            error.hint = (
                "Stop the agenthold processes still using the deleted file (on Linux its data "
                "can be copied from /proc/PID/fd/ while they run), then start again to make a "
                "new, empty database."
            )
        else:
            error = IncompatibleDatabaseError(
                f"the database file {path!r} is missing, but its write-ahead log "
                f"{path + '-wal'!r} is there (left by a server stopped after the file was "
                "deleted); it cannot be applied to a new file; agenthold created nothing"
            )
            error.hint = (
                "Put the database file back, or move its -wal and -shm files away to start a "
                "new, empty database."
            )
        raise error

    def _connect(self) -> tuple[sqlite3.Connection, threading.RLock]:
        """A new connection, registered with the lock of its use (in memory, the shared one)."""
        try:
            conn = sqlite3.connect(
                self._uri,
                uri=True,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            self._check_file_is_ours()
            raise self._error(exc) from None
        try:
            conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[self.durability]}")
            for name, value in PRAGMAS.items():
                if name != "journal_mode":
                    conn.execute(f"PRAGMA {name} = {value}")
            if self.read_only:
                conn.execute("PRAGMA query_only = 1")
        except sqlite3.Error as exc:
            conn.close()
            raise self._opening_error(exc) from None
        use = self._mem_lock or threading.RLock()  # memory: one for all
        with self._connections_lock:
            if self._closed:  # closed while it opened: it must not outlive close()
                conn.close()
                raise AgentholdError("the store is closed")
            for thread in [t for t in self._connections if not t.is_alive()]:
                self._connections.pop(thread)[0].close()
            self._connections[threading.current_thread()] = (conn, use)
        return conn, use

    def _error(self, exc: sqlite3.Error) -> AgentholdError:
        """The error a caller can act on for a SQLite error on this database (on a closed
        store, that it is closed: a read that waited for close() meets a closed connection)."""
        if self._closed:
            return AgentholdError("the store is closed")
        return _translate(exc, self.busy_timeout, self.path)

    def _opening_error(self, exc: sqlite3.Error) -> AgentholdError:
        """Translate an error met while opening: a file SQLite cannot read as a database
        (SQLITE_NOTADB, SQLITE_CORRUPT) is incompatible; busy and I/O errors stay what they are."""
        if type(exc) is sqlite3.DatabaseError:
            return IncompatibleDatabaseError(f"cannot open database {self.path!r}: {exc}")
        return _translate(exc, self.busy_timeout, self.path)  # the store is closed by now

    def _prepare_schema(self) -> None:
        """Check that the file is ours (or empty) and set it up (page size, WAL); the tables
        come with ``ensure``. On any error every connection is closed before it is raised."""
        with self._closed_on_failure():
            conn = self._shared or self._thread_conn()
            app_id, layout, _, tables = _describe(conn)
            self._check_identity(app_id, layout, tables)
            if self.read_only:
                return
            if not self.memory:
                if layout == 0 and not tables:  # a new file: its page size can still change
                    conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                    # and so can this: pages compaction frees can go back (retention.py)
                    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                self._enable_wal(conn)
                if app_id == APPLICATION_ID:  # a new file gets its id with its first tables
                    self._ensure_database_id(conn)

    def _check_wal(self, real: str) -> None:
        """Refuse a write-ahead log that cannot belong to the file, before any connection that
        could apply it opens (see META_SQL). Nothing here reads through the log with SQLite,
        whose view of a foreign log mixed into the file can be unreadable: the file's id is read
        from the file alone (immutable: the log is not read), and the log is read as SQLite's
        recovery would read it (read_wal). The log is foreign when its committed
        frames write the id's page with another id, or when it holds commits while the file is
        still as `agenthold backup` wrote it (a writer's first commit on such a file drops FRESH
        from its id: that commit, and only that, is a fresh file's own).

        A log beside a fresh file that another process holds open is refused too, commits or
        none: that process opened the file this one replaced, and its next commit would land in
        the log of this one. It may be a server on its way out (a warm server that found its
        file replaced); so this waits up to busy_timeout for it to let go first."""
        if not os.path.exists(real + "-wal") and not os.path.exists(real + "-shm"):
            return
        deadline = time.monotonic() + self.busy_timeout
        while True:
            alone = _file_alone(real)
            if alone is None:
                return  # not an agenthold file with an id yet: nothing to compare
            database_id, id_page, _ = alone
            fresh = database_id.endswith(FRESH)
            if fresh:  # its log may hold one commit of its own: the first, which writes the id
                wal = read_wal(real + "-wal", {id_page}, first_commit=True)
            else:  # only a commit that rewrites the id's page can show another file's log
                wal = read_wal(
                    real + "-wal", {id_page}, written=id_page, telling=_names_another_id(alone)
                )
            foreign = wal is not None and wal.committed > 0 and _log_is_foreign(wal, alone)
            if not fresh and not foreign:
                return  # this file's own log, as far as anything can tell (the usual case)
            if wal is not None and wal.committed > 0 and not foreign:
                return  # the first writer's own commit (it dropped FRESH, in the log so far)
            in_use = self._wal_in_use_elsewhere(real)
            if not in_use and not foreign:
                return
            if not foreign and not self._held_here(real) and _opened_by_another_process(real):
                return  # a reader of this copy holds the log (it passed this check itself)
            if not in_use or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if foreign:
            error = IncompatibleDatabaseError(
                f"the write-ahead log {self.path + '-wal'!r} does not belong to the database "
                f"file {self.path!r} (it was left by the file this one replaced: a backup "
                "restored while a server ran, or over a server that was killed); agenthold did "
                "not apply it and changed nothing"
                + ("; a process still has it open" if in_use else "")
            )
        else:
            error = IncompatibleDatabaseError(
                f"the database file {self.path!r} is a restored backup that no server has opened "
                f"yet, but another process still has the write-ahead log {self.path + '-wal'!r} "
                "beside it open: a server of the file it replaced is still running; agenthold "
                "did not open it and changed nothing"
            )
        error.hint = (
            "Stop every agenthold process that used the file before the restore (warm servers "
            "too: SIGTERM stops one), then, if the -wal and -shm files are still there, move "
            "them away and start again; or restore the backup again with every server stopped."
        )
        raise error

    def _held_here(self, real: str) -> bool:
        """Whether a store of this process is open on a file that stood at ``real`` before."""
        return any(
            db is not self and db._real == real and not db._closed for db in list(_open_databases)
        )

    def _wal_in_use_elsewhere(self, real: str) -> bool:
        """Whether another connection holds the log at ``real``: another process (by the lock
        every SQLite connection holds on the -shm file), or a store of this process on a file
        that stood at this name before (asked directly: probing the -shm file here would drop
        that store's own locks when the probe's descriptor closes)."""
        if self._held_here(real):
            return True
        if not os.path.exists(real + "-shm") or not _posix_locks():
            return False
        try:  # only a descriptor that may write can test for another's shared lock
            os.close(os.open(real + "-shm", os.O_RDWR | getattr(os, "O_CLOEXEC", 0)))
        except OSError:
            return False  # a -shm this process may not write: it cannot tell, as before
        guard = _wal_alone(real)
        if guard is None:
            return True
        os.close(guard)
        return False

    def _ensure_database_id(self, conn: sqlite3.Connection) -> None:
        """Give the file a database id if it has none (a file made by an older agenthold), or
        drop FRESH from it (the first writer to open a backup). The id's page is then
        checkpointed into the file at once, where the checks of ``_check_contents`` read it."""
        try:
            row = conn.execute(_DATABASE_ID).fetchone()
        except sqlite3.OperationalError:  # no agenthold_meta table yet
            row = None
        if row is not None and not str(row[0]).endswith(FRESH):
            self._remember_id(conn)
            return
        with self._file.write_lock:
            try:
                conn.execute("BEGIN IMMEDIATE")
                _write_database_id(conn)
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                # Another writer held the file all along: open without the id for now (the
                # checks that need it wait for an opening that can write it).
                log.warning("%s: could not write its database id yet: %s", self.path, exc)
                return
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        self._remember_id(conn)

    def _remember_id(self, conn: sqlite3.Connection) -> None:
        """Note where the database id's page is and what it says (once per file and process)."""
        state = self._file
        if state.id_page is not None:
            return
        row = conn.execute(
            "SELECT rootpage, (" + _DATABASE_ID + ") FROM sqlite_master "
            "WHERE type = 'table' AND name = 'agenthold_meta'"
        ).fetchone()
        if row is None or not isinstance(row[1], str):
            return
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        state.database_id = row[1].removesuffix(FRESH)
        state.id_page = (int(row[0]), int(size))

    def _check_contents(self, conn: sqlite3.Connection, seen: tuple[int, ...] | None) -> None:
        """Inside a write: raise UnavailableError if the file now holds another database's
        contents (copied over it in place, so its inode is the same): the page of its id, read
        from the file itself, names another id. SQLite cannot see this: its cache and its WAL
        still show the file it opened, and it would go on acknowledging writes into a WAL that
        mixes the two.

        ``seen`` is the file's stat from this write's _check_file_is_ours: a copy put over the
        file changes its change time (and its size or modification time), so while they are
        those of the last check that found our id, and that change time was over SETTLED_NS
        old then, the page is not read again. In WAL mode the file itself changes only at
        checkpoints: writes spaced out skip the read, a burst reads it after a checkpoint."""
        state = self._file
        if seen is not None and seen == state.verified:
            return
        if not hasattr(os, "pread"):  # pragma: no cover - Windows has no pread
            return
        if state.id_page is None:
            self._remember_id(conn)
            if state.id_page is None or state.database_id is None:
                return  # a file without an id: made before ids, opened read-only so far
        if not self._holds_another_database(seen):
            return
        error = UnavailableError(
            f"the database file {self.path!r} was replaced while agenthold was running: it now "
            "holds another database (a backup copied over it?); nothing was written"
        )
        error.hint = (
            "Stop every agenthold process using this file, then start again: the file that is "
            "there now is opened, and the log of the one it replaced is not applied to it."
        )
        raise error

    def _holds_another_database(self, seen: tuple[int, ...] | None = None) -> bool:
        """Whether the file now holds another database's contents (copied over it in place):
        the page of its id, read from the file itself, names another id. Needs the id's page
        (``_remember_id``); without it, False. Sets ``replaced`` when it finds so."""
        state = self._file
        if not hasattr(os, "pread"):  # pragma: no cover - Windows has no pread
            return False
        if state.id_page is None or state.database_id is None:
            return False
        page, size = state.id_page
        if state.raw_fd is None:
            state.raw_fd = os.open(self._real, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        content = os.pread(state.raw_fd, size, (page - 1) * size)
        if state.database_id.encode() in content:
            state.id_on_disk = True
            # only a stat whose change time is past: a copy put over the file in the same
            # timestamp tick (up to a second on some file systems) could leave it unchanged
            if seen is not None and time.time_ns() - seen[4] > SETTLED_NS:
                state.verified = seen
            return False
        if ID_PREFIX.encode() not in content:
            # No id on that page: either it is not in the file yet (its checkpoint is still
            # to come), or another database's file is there, whose id (if it has one) lives
            # on another page. The file's own schema, read without the WAL, tells which.
            there = _read_database_id(f"file:{_quote_path(self._real)}?immutable=1")
            if there is None and not state.id_on_disk:
                return False  # not checkpointed yet
            if there is not None and there.removesuffix(FRESH) == state.database_id:
                return False
        state.replaced = True
        return True

    def replaced(self) -> bool:
        """Whether the file at this store's path is no longer the one it opened: deleted,
        another file moved to its name, or another database copied over it in place. A warm
        server asks this to know it must not serve on (warm.py)."""
        return not self._closed and self._replaced_now()

    def _replaced_now(self) -> bool:
        if self.memory:
            return False
        if self._file.replaced:
            return True
        if self._identity is not None and _identity(self._real) != self._identity:
            return True
        return self._holds_another_database()

    @contextmanager
    def _closed_on_failure(self) -> Iterator[None]:
        """While opening: a failure closes this store again, and a SQLite error becomes the
        error that says what is wrong with the file."""
        try:
            yield
        except sqlite3.Error as exc:
            self.close()
            raise self._opening_error(exc) from None
        except AgentholdError:
            self.close()
            raise

    def ensure(self, component: Component, *, required: bool = True) -> int:
        """Create ``component``'s tables or migrate them to its version (one transaction, which
        also imports an agenthold 0.10 file the first time the store's tables are made).
        Returns the version the tables are at: read-only and not ``required``, 0 when they
        were never made."""
        with self._closed_on_failure(), self._in_use() as conn:
            have = self._component_version(conn, component)
            if have == component.version or (self.read_only and have == 0 and not required):
                return have
            if self.read_only:
                raise IncompatibleDatabaseError(
                    f"{self.path!r} has the {component.name} tables at version {have}, older "
                    f"than this agenthold's {component.version}; open it once without "
                    "read-only to migrate it"
                )
            with self._mem_lock or self._file.write_lock:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    have = self._component_version(conn, component)  # another process may win
                    if have < component.version:
                        self._migrate(conn, component, have)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                if not self.memory:  # the database id's page goes into the file now
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                return component.version

    def _component_version(self, conn: sqlite3.Connection, component: Component) -> int:
        app_id, layout, versions, tables = _describe(conn)
        self._check_identity(app_id, layout, tables)
        have = versions.get(component.name, 0)
        if have > component.version:
            raise IncompatibleDatabaseError(
                f"{self.path!r} has the {component.name} tables at version {have}, newer than "
                f"this agenthold supports ({component.version}); upgrade agenthold to open it"
            )
        return have

    def _migrate(self, conn: sqlite3.Connection, component: Component, have: int) -> None:
        app_id, _, versions, tables = _describe(conn)
        legacy = component is STORE_SCHEMA and app_id == 0 and "state_records" in tables
        if legacy:
            conn.execute("ALTER TABLE state_history RENAME TO legacy_history")
        for step in range(have, component.version):
            for statement in _split_sql(component.migrations["sqlite"][step]):
                conn.execute(statement)
        if legacy:
            _import_legacy(conn)
        conn.execute(COMPONENTS_SQL)
        conn.executemany(  # what layouts 1 and 2 implied, now written down
            "INSERT INTO agenthold_components (component, version) VALUES (?, ?) "
            "ON CONFLICT (component) DO NOTHING",
            versions.items(),
        )
        conn.execute(
            "INSERT INTO agenthold_components (component, version) VALUES (?, ?) "
            "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
            (component.name, component.version),
        )
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if not self.memory:
            _write_database_id(conn)

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL (a lasting setting). Processes opening a new file together
        can make SQLite refuse the switch at once, without waiting: retry for busy_timeout."""
        deadline = time.monotonic() + self.busy_timeout
        while conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                conn.execute("PRAGMA journal_mode = wal")
                continue
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc).lower():
                    raise
            if time.monotonic() > deadline:
                raise sqlite3.OperationalError("database is locked")
            time.sleep(0.005)

    def _check_identity(self, app_id: int, version: int, tables: list[str]) -> None:
        """Raise IncompatibleDatabaseError unless the database is ours (at a schema version this
        code knows) or, when we may create the schema, a new and empty one."""
        if app_id == APPLICATION_ID:
            if version > SCHEMA_VERSION:
                raise IncompatibleDatabaseError(
                    f"{self.path!r} has schema version {version}, newer than this agenthold "
                    f"supports ({SCHEMA_VERSION}); upgrade agenthold to open it"
                )
            return
        if app_id == 0 and not tables and not self.read_only:
            return  # a new, empty database
        if app_id == 0 and version == 0 and set(tables) == LEGACY_TABLES:
            if self.read_only:
                raise IncompatibleDatabaseError(
                    f"{self.path!r} was written by agenthold 0.10 or older; open it once without "
                    "read-only (for example, start the server on it) to upgrade it"
                )
            return  # an agenthold 0.10 database: its records are imported
        held = f"it holds tables {', '.join(sorted(tables)[:5])}" if tables else "it is empty"
        raise IncompatibleDatabaseError(
            f"{self.path!r} is a SQLite database but not an agenthold database ({held}); "
            "give another --db path"
        )

    # -- connections ---------------------------------------------------------------------------

    def _thread_conn(self) -> sqlite3.Connection:
        return self._thread_pair()[0]

    def _thread_pair(self) -> tuple[sqlite3.Connection, threading.RLock]:
        """This thread's connection and the lock of its use (opened on first use), read from
        one thread-local object: close() may put a new one in its place at any moment."""
        local = self._local
        try:
            return local.conn, local.use
        except AttributeError:
            cursor, use = self._thread_cursor()
            return cursor.connection, use

    def _thread_cursor(self) -> tuple[sqlite3.Cursor, threading.RLock]:
        """Open this thread's connection and the cursor its reads reuse (on first use), with
        the lock of its use."""
        if self._closed:
            raise AgentholdError("the store is closed")
        local = self._local
        conn, use = self._connect()
        cursor: sqlite3.Cursor = conn.cursor()
        local.conn, local.use = conn, use
        local.reader = (cursor, use)  # one lookup for a read (fetchone)
        return cursor, use

    def _reset_after_fork(self) -> None:
        _inherited.extend(conn for conn, _ in self._connections.values())
        if self._shared is not None:
            _inherited.append(self._shared)
            self._shared = None
            self._closed = True  # a private in-memory database does not survive fork()
        self._local = threading.local()
        self._connections = {}
        self._connections_lock = threading.Lock()
        if self._mem_lock is not None:
            self._mem_lock = threading.RLock()

    # -- the interface -------------------------------------------------------------------------

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one read statement and return its first row (or None)."""
        try:
            if self._mem_lock is None:
                try:
                    cursor, use = self._local.reader
                except AttributeError:
                    cursor, use = self._thread_cursor()
                # held while the statement runs, so close() never closes the connection under
                # it; a connection close() has closed raises, which _error calls "closed". A
                # with-statement, not acquire() and a try: the interpreter runs signal handlers
                # (Ctrl-C) as a call returns, so a KeyboardInterrupt could land between
                # acquire() and the try and leave the lock held, while one raised right after a
                # with's __enter__ is already inside its block (and a with costs no more)
                with use:
                    try:
                        return cursor.execute(sql, params).fetchone()
                    except sqlite3.OperationalError as exc:
                        if not str(exc).startswith(_NOT_UTF8):
                            raise
                        return _fetch_one(cursor, sql, params)  # text that is not UTF-8
            with self._mem_lock:  # the shared connection's lock (not _in_use: a hot path)
                return _fetch_one(self._live_shared().cursor(), sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one read statement and return all its rows."""
        try:
            if self._mem_lock is None:
                try:
                    cursor, use = self._local.reader
                except AttributeError:
                    cursor, use = self._thread_cursor()
                with use:  # as in fetchone
                    try:
                        rows: list[Any] = cursor.execute(sql, params).fetchall()
                        return rows
                    except sqlite3.OperationalError as exc:
                        if not str(exc).startswith(_NOT_UTF8):
                            raise
                        return _fetch_all(cursor.connection, sql, params)  # not UTF-8
            with self._mem_lock:  # as in fetchone
                return _fetch_all(self._live_shared(), sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every statement inside sees the same committed state."""
        with self._in_use() as conn:
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    if conn.in_transaction:
                        conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    @contextmanager
    def write(self) -> Iterator[tuple[sqlite3.Connection, list[Topic]]]:
        """A write transaction (``BEGIN IMMEDIATE``), committed when the block ends normally and
        rolled back if it raises. Append the topics the block changed to the yielded list; they
        are notified after the commit."""
        if self.read_only:
            raise UnavailableError("the store was opened read-only; it cannot write")
        lock = self._mem_lock or self._file.write_lock
        waited = 0.0
        if not lock.acquire(blocking=False):
            started = time.monotonic()
            if not lock.acquire(timeout=self.busy_timeout):
                raise BusyError(
                    f"another writer in this process held the database for more than "
                    f"{self.busy_timeout:g} s (busy_timeout); retry in a moment"
                )
            waited = time.monotonic() - started
        changed: list[Topic] = []
        try:
            seen = self._check_file_is_ours()
            # the connection's lock, taken by hand (no nested context manager: this runs for
            # every write): close() waits for it; in memory the lock taken above is the same
            use = None
            if self._mem_lock is None:
                conn, use = self._thread_pair()
                use.acquire()
            else:
                conn = self._live_shared()
            try:
                try:
                    if waited > 0.001:  # the wait for the lock counts against busy_timeout
                        left = max(0, int((self.busy_timeout - waited) * 1000))
                        conn.execute(f"PRAGMA busy_timeout = {left}")
                        try:
                            conn.execute("BEGIN IMMEDIATE")
                        finally:
                            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                    else:
                        conn.execute("BEGIN IMMEDIATE")
                except sqlite3.Error as exc:
                    raise self._error(exc) from None
                try:
                    if not self.memory:
                        self._check_contents(conn, seen)
                    yield conn, changed
                    conn.execute("COMMIT")
                except BaseException as exc:
                    if conn.in_transaction:
                        with suppress(sqlite3.Error):  # SQLite may have rolled back already
                            conn.execute("ROLLBACK")
                    if isinstance(exc, sqlite3.Error):
                        raise self._error(exc) from None
                    raise
            finally:
                if use is not None:
                    use.release()
        finally:
            lock.release()
        if changed:
            self._file.feed.notify(changed)

    def subscribe(
        self, topics: Iterable[Topic] | None, callback: Callable[[], None]
    ) -> _Subscription:
        """Call ``callback`` (from any thread, so it must be quick) whenever one of ``topics``
        changes, in this process or another; None listens to every change."""
        return self._file.feed.subscribe(topics, callback)

    def notify(self, topics: Iterable[Topic]) -> None:
        self._file.feed.notify(topics)

    def add_change_source(self, source: ChangeSource) -> None:
        self._file.feed.add_source(source)

    def serialize(self, conn: Any, exclusive: Sequence[str], shared: Sequence[str] = ()) -> float:
        """Inside ``write``: make writers of the same names take turns until commit, and return
        the database's clock. SQLite has one writer at a time already: nothing to lock."""
        return self.clock.read(time.time())

    def now(self) -> float:
        """The database's clock, unix seconds: leases are judged by it (here, the host's)."""
        return self.clock.read(time.time())

    def feed_window(self, conn: Any, table: str, after: Any) -> tuple[str, tuple[Any, ...], Any]:
        """Inside ``snapshot``: a condition on the rows of the event table ``table`` that
        committed after position ``after`` (None: since the start) and up to now, its
        parameters, and the position to give next time. Here ids commit in order."""
        newest = conn.execute(f"SELECT max(id) FROM {table}").fetchone()[0] or 0
        if after is None:
            return "id <= ?", (newest,), newest
        return "id > ? AND id <= ?", (after, newest), newest

    def close(self) -> None:
        last = False
        if not self._closed:
            with _files_lock:
                self._file.stores -= 1
                last = self._file.stores == 0
            if last:
                self._file.feed.stop()
        self._closed = True
        guard = self._forget_stale_wal() if last and not self.memory else None
        with self._connections_lock:
            conns, self._connections = list(self._connections.values()), {}
        for conn, use in conns:
            # a connection another thread is executing on is closed once that thread lets go of
            # it; one held longer than a busy timeout is left to that thread (garbage collection
            # closes it when the thread drops it) rather than closed under it
            if use.acquire(timeout=self.busy_timeout):
                try:
                    with suppress(sqlite3.Error):
                        conn.close()
                finally:
                    use.release()
        self._shared = None
        self._local = threading.local()
        _open_databases.discard(self)
        if last and self._file.raw_fd is not None:  # no connection of ours is left on the file
            with suppress(OSError):
                os.close(self._file.raw_fd)
            self._file.raw_fd = None
        if guard is not None:
            os.close(guard)

    def _forget_stale_wal(self) -> int | None:
        """When the last store of this process closes a file that was replaced under it: empty
        the WAL it leaves, unless another process uses it. That log holds the replaced file's
        last commits; SQLite keeps it when the file was moved away (and would copy it into a
        file copied over in place), so the next opener would apply it to the new file. Returns
        a descriptor that holds the log alone until the connections are closed (or None)."""
        if self.read_only or not self._real:
            return None
        # a copy put over the file in place, with no write since to find it: SQLite's last
        # connection would checkpoint the old file's log into the copy as it closes
        if not self._replaced_now():
            return None
        guard = _wal_alone(self._real)
        if guard is None:
            log.warning("the WAL of the replaced database %s is in use elsewhere: kept", self.path)
            return None
        with suppress(OSError):
            os.truncate(self._real + "-wal", 0)
        log.warning(
            "the database file %s was replaced while agenthold ran: the write-ahead log of the "
            "file it replaced was emptied, so it is never applied to the new one",
            self.path,
        )
        return guard

    def backup(self, dest: str | os.PathLike[str]) -> str:
        """Copy the database into a new file ``dest`` with SQLite's online backup API: one
        consistent snapshot, taken while other connections and processes go on writing. The
        copy gets a database id of its own, marked FRESH (see META_SQL), so that a WAL of the
        file it is later restored over is never applied to it. It is written beside ``dest``
        and renamed into place, so ``dest`` is either the whole copy or absent. Returns the
        path written. Refuses a ``dest`` that exists."""
        if self.memory:
            raise InvalidInputError("a ':memory:' database has no file to back up")
        target = os.path.abspath(os.path.expanduser(os.fspath(dest)))
        if os.path.lexists(target):
            raise InvalidInputError(
                f"{os.fspath(dest)!r} already exists; give a new file name for the backup"
            )
        folder = os.path.dirname(target)
        if not os.path.isdir(folder):
            raise InvalidInputError(f"the directory {folder!r} for the backup does not exist")
        partial = f"{target}.{_random_hex()[:8]}.partial"
        try:
            try:
                copy = sqlite3.connect(partial, isolation_level=None)
                copy.execute("PRAGMA user_version").fetchone()  # opened for real, or fails here
            except sqlite3.Error as exc:
                raise UnavailableError(f"cannot write the backup {target!r}: {exc}") from None
            try:
                with self._in_use() as conn:
                    conn.backup(copy)
                copy.execute("BEGIN IMMEDIATE")
                copy.execute(META_SQL)
                copy.execute(
                    "INSERT INTO agenthold_meta (name, value) VALUES ('database_id', ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (ID_PREFIX + _random_hex() + FRESH,),
                )
                copy.execute("COMMIT")
                copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                copy.close()  # the last connection: SQLite checkpoints and removes its WAL
            with open(partial, "rb") as f:
                os.fsync(f.fileno())
            _put_in_place(partial, target, os.fspath(dest))
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        except OSError as exc:
            raise UnavailableError(f"cannot write the backup {target!r}: {exc.strerror}") from None
        finally:
            for leftover in (partial, partial + "-wal", partial + "-shm"):
                with suppress(OSError):
                    os.unlink(leftover)
        return target

    # -- helpers -------------------------------------------------------------------------------

    def _check_file_is_ours(self) -> tuple[int, ...] | None:
        """Raise UnavailableError if the file opened was deleted or replaced since (writes
        would go to a file no one can open again, and be lost when the process ends). Returns
        what the file's stat says of it now (None in memory), for _check_contents."""
        if self._identity is None:
            return None
        try:
            st = os.stat(self._real)
            seen: tuple[int, ...] | None = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                            st.st_ctime_ns)  # fmt: skip
        except OSError:
            seen = None
        if seen is None or seen[:2] != self._identity:
            error = UnavailableError(
                f"the database file {self.path!r} was deleted or replaced while agenthold was "
                "running; nothing was written"
            )
            error.hint = "Restart agenthold to open the file that is there now."
            raise error
        return seen

    def _live_shared(self) -> sqlite3.Connection:
        if self._shared is None:
            raise AgentholdError("the store is closed")
        return self._shared

    @contextmanager
    def _in_use(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection (in memory, the one shared connection), held for the
        block: close() waits for it. A store closed meanwhile raises its clean error."""
        if self._mem_lock is not None:
            with self._mem_lock:
                yield self._live_shared()
            return
        conn, use = self._thread_pair()
        with use:
            if self._closed:  # closed while this thread waited for the lock
                raise AgentholdError("the store is closed")
            yield conn


#: How old a file's change time must be before a stat of it vouches for its contents: more
#: than one timestamp tick of any file system (a second on the coarsest).
SETTLED_NS = 2_000_000_000


def _identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``, or None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


_DATABASE_ID = "SELECT value FROM agenthold_meta WHERE name = 'database_id'"


def _write_database_id(conn: Any) -> None:
    """Inside a write transaction: give the file a new database id if it has none, and drop
    FRESH from the one it has (see META_SQL)."""
    conn.execute(META_SQL)
    row = conn.execute(_DATABASE_ID).fetchone()
    if row is None:
        conn.execute(
            "INSERT INTO agenthold_meta (name, value) VALUES ('database_id', ?)",
            (ID_PREFIX + _random_hex(),),
        )
    elif str(row[0]).endswith(FRESH):
        conn.execute(
            "UPDATE agenthold_meta SET value = ? WHERE name = 'database_id'",
            (str(row[0]).removesuffix(FRESH),),
        )


def _put_in_place(partial: str, target: str, shown: str) -> None:
    """Give the finished copy ``partial`` its name ``target``, never over a file that appeared
    there meanwhile (a hard link fails if the name exists; a rename would replace it), and make
    the name durable."""
    try:
        os.link(partial, target)
    except FileExistsError:
        raise InvalidInputError(
            f"{shown!r} already exists; give a new file name for the backup"
        ) from None
    except OSError:  # a file system without hard links: a rename, checked just before
        if os.path.lexists(target):
            raise InvalidInputError(
                f"{shown!r} already exists; give a new file name for the backup"
            ) from None
        os.replace(partial, target)
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(os.path.dirname(target), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# -- reading a write-ahead log without SQLite ---------------------------------------------
#
# SQLite applies a -wal file to whatever database file stands at its name: the log names no
# file, only a page size, two salts and checksums that chain from its header through its
# frames. A log left by a file that a restored backup replaced would be replayed into the
# backup. Asking SQLite what the log would show is no answer: its view of such a mix can be
# unreadable, or read through a live server's shared memory. So _check_wal reads the log as
# SQLite's recovery does (the header checksum, then each frame whose salts are the header's
# and whose checksum chains, up to the last commit frame), in the format of
# https://sqlite.org/fileformat2.html#walformat: a 32-byte header (magic, version, page size,
# checkpoint sequence, two salts, two checksums), then frames of a 24-byte header (page
# number, the database's size in pages after a commit or 0, the two salts, two checksums)
# and one page.
WAL_HEADER = 32
FRAME_HEADER = 24
WAL_VERSION = 3007000
MAGIC_LITTLE, MAGIC_BIG = 0x377F0682, 0x377F0683  # the byte order of the checksums
_MASK = 0xFFFFFFFF


@dataclass
class WalLog:
    """What SQLite's recovery would take from a log: its page size, how many committed frames
    it has, and the last committed image of each page asked for."""

    page_size: int
    committed: int = 0
    images: dict[int, bytes] = field(default_factory=dict)


def _checksum(data: bytes, s1: int, s2: int, big: bool) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big else '<'}{len(data) // 4}I", data)
    it = iter(words)
    for x0, x1 in zip(it, it, strict=True):
        s1 = (s1 + x0 + s2) & _MASK
        s2 = (s2 + x1 + s1) & _MASK
    return s1, s2


def read_wal(
    path: str,
    pages: Container[int] = (),
    *,
    first_commit: bool = False,
    written: int = 0,
    telling: Callable[[bytes], bool] | None = None,
) -> WalLog | None:
    """The committed contents of the log at ``path``, with the last committed image of each of
    ``pages``; None if there is no log SQLite would read (missing, shorter than its header, or
    a header that fails its checksum: SQLite then starts the log afresh). Checksums cost some
    40 ms per 1,000 frames of 2 KiB, so: ``first_commit`` stops at the first commit frame
    (its transaction is all a fresh file's check needs), and ``written``, a page number,
    returns an empty log at once unless a frame of the log's current salts writes that page
    (a look at the frame headers alone), and with ``telling`` too, unless that frame's image is
    one ``telling`` accepts (unverified images: a filter before the checksums, never a verdict;
    a server's log that outgrew its checkpoints can be tens of thousands of frames, a second of
    checksums on every open)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        header = os.pread(fd, WAL_HEADER, 0)
        if len(header) < WAL_HEADER:
            return None
        magic, version, page_size, _, salt1, salt2, c1, c2 = struct.unpack(">8I", header)
        big = magic == MAGIC_BIG
        valid_size = page_size >= 512 and page_size <= 65536 and page_size & (page_size - 1) == 0
        if magic not in (MAGIC_LITTLE, MAGIC_BIG) or version != WAL_VERSION or not valid_size:
            return None
        s1, s2 = _checksum(header[:24], 0, 0, big)
        if (s1, s2) != (c1, c2):
            return None
        found = WalLog(page_size)
        if written and not _frame_writes(fd, page_size, salt1, salt2, written, telling):
            return found
        pending: dict[int, bytes] = {}  # images of the transaction not yet committed
        offset, frame = WAL_HEADER, 0
        while True:
            data = os.pread(fd, FRAME_HEADER + page_size, offset)
            if len(data) < FRAME_HEADER + page_size:
                break
            page, db_size, f1, f2, fc1, fc2 = struct.unpack(">6I", data[:FRAME_HEADER])
            if (f1, f2) != (salt1, salt2) or page == 0:
                break
            s1, s2 = _checksum(data[:8], s1, s2, big)
            s1, s2 = _checksum(data[FRAME_HEADER:], s1, s2, big)
            if (s1, s2) != (fc1, fc2):
                break
            frame += 1
            offset += FRAME_HEADER + page_size
            if page in pages:
                pending[page] = data[FRAME_HEADER:]
            if db_size:  # a commit frame: its transaction, and those before it, count
                found.committed = frame
                found.images.update(pending)
                pending.clear()
                if first_commit:
                    break
        return found
    finally:
        os.close(fd)


def _frame_writes(
    fd: int,
    page_size: int,
    salt1: int,
    salt2: int,
    page: int,
    telling: Callable[[bytes], bool] | None = None,
) -> bool:
    """Whether a frame of the log open at ``fd`` with the header's salts writes ``page`` (with
    ``telling``: an image of it that ``telling`` accepts)."""
    offset = WAL_HEADER
    while True:
        head = os.pread(fd, FRAME_HEADER, offset)
        if len(head) < FRAME_HEADER:
            return False
        number, _, f1, f2 = struct.unpack(">4I", head[:16])
        if (f1, f2) != (salt1, salt2):
            return False
        if number == page and (
            telling is None or telling(os.pread(fd, page_size, offset + FRAME_HEADER))
        ):
            return True
        offset += FRAME_HEADER + page_size


def _file_alone(real: str) -> tuple[str, int, int] | None:
    """The database id in the file at ``real`` itself (its write-ahead log not read), the page
    that holds it and the file's page size; None for a file without an id, or unreadable."""
    try:
        conn = sqlite3.connect(f"file:{_quote_path(real)}?immutable=1", uri=True)
        try:
            row = conn.execute(
                "SELECT rootpage, (" + _DATABASE_ID + ") FROM sqlite_master "
                "WHERE type = 'table' AND name = 'agenthold_meta'"
            ).fetchone()
            size = conn.execute("PRAGMA page_size").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    if row is None or not isinstance(row[1], str):
        return None
    return row[1], int(row[0]), int(size)


_ID_BYTES = re.compile(re.escape(ID_PREFIX).encode() + rb"[0-9a-f]{32}")


def _names_another_id(alone: tuple[str, int, int]) -> Callable[[bytes], bool]:
    """Whether a page image names an id other than the file's: only a log one of whose images
    does can be foreign to a file that has seen a writer (see _log_is_foreign)."""
    own = alone[0].removesuffix(FRESH).encode()
    return lambda image: any(m.group() != own for m in _ID_BYTES.finditer(image))


def _log_is_foreign(wal: WalLog, alone: tuple[str, int, int]) -> bool:
    """Whether the committed frames of ``wal`` cannot be those of the file whose id, id page
    and page size are ``alone`` (see _check_wal)."""
    database_id, id_page, page_size = alone
    if wal.page_size != page_size:
        return True  # one file's pages are all of one size, in the file and in its log
    image = wal.images.get(id_page)
    found = _ID_BYTES.search(image) if image is not None else None
    if found is not None:  # the log rewrites the id's page: it must say the same id
        return found.group().decode() != database_id.removesuffix(FRESH)
    # (a page without an id proves nothing: another tool may have dropped the table.) A fresh
    # file has seen no writer: the only commit of its own would have written its id
    return database_id.endswith(FRESH)


def _read_database_id(uri: str) -> str | None:
    """The database id of the file at ``uri`` (None: it has none, or it cannot be read)."""
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            row = conn.execute(_DATABASE_ID).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return row[0] if row is not None and isinstance(row[0], str) else None


SHM_DMS_BYTE = 128  # the byte of the -shm file every SQLite connection of a WAL holds shared


def _wal_alone(real: str) -> int | None:
    """A descriptor of ``real``'s -shm file holding its dead-man's-switch byte exclusively, if
    no other process has the WAL open (each SQLite connection holds that byte shared, and
    this process's own locks never conflict with it); None if another does, or where POSIX
    locks are not available."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None
    try:
        fd = os.open(real + "-shm", os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, SHM_DMS_BYTE)
    except OSError:
        os.close(fd)
        return None
    return fd


# SQLite's unix locks on a database file: every connection of a WAL database holds a read
# lock on the SHARED range for as long as it is open (its last one to close takes the whole
# file exclusively to know it is the last).
SQLITE_SHARED_FIRST = 0x40000000 + 2
SQLITE_SHARED_SIZE = 510


def _opened_by_another_process(real: str) -> bool:
    """Whether the log beside a restored copy at ``real`` that holds no commit is held by a
    process that has this very file open, not only one on the file it replaced. Another
    process's SQLite connection on this inode holds its SHARED range; one on a file moved away
    holds that other inode's. Such a process opened the copy through _check_wal, which refused
    it while a server of the old file held the log; so the log is the copy's. Not while a
    process holds the -shm file's dead-man's-switch byte exclusively (a server emptying the
    old log as it exits: the log is not settled), nor where this cannot be told (no POSIX
    locks, a file this process may not write): False, and the caller refuses as before. A
    server of the old file shares this inode when the copy was written over it in place (cp);
    its log is then older than the copy (its writes since are refused by its own checks),
    where a reader of the copy made the log after the copy (a tie of timestamps refuses)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return False
    flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
    try:  # no store of this process has this file open (stores == 0): no lock of ours drops
        fd = os.open(real, flags)
    except OSError:
        return False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, SQLITE_SHARED_SIZE, SQLITE_SHARED_FIRST)
        except OSError:
            pass  # someone holds it: the answer, unless the log is being emptied
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN, SQLITE_SHARED_SIZE, SQLITE_SHARED_FIRST)
            return False
    finally:
        os.close(fd)
    try:  # a log older than the copy is the old file's: its server shares a copy made in place
        if os.stat(real + "-wal").st_ctime_ns <= os.stat(real).st_ctime_ns:
            return False
        shm = os.open(real + "-shm", flags)
    except OSError:
        return False
    try:
        fcntl.lockf(shm, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, SHM_DMS_BYTE)
    except OSError:
        return False  # held exclusively: a process is emptying the log or closing it
    finally:
        os.close(shm)
    return True


def _posix_locks() -> bool:
    """Whether this platform has the POSIX locks that _wal_alone tests."""
    try:
        import fcntl  # noqa: F401
    except ImportError:  # pragma: no cover - Windows
        return False
    return True


def _quote_path(path: str) -> str:
    return path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def _split_sql(script: str) -> list[str]:
    statements, current = [], []
    for line in script.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        current.append(line)
        if stripped.endswith(";"):
            statements.append("\n".join(current))
            current = []
    return statements


LEGACY_TABLES = {"state_records", "state_history"}  # agenthold 0.10 and older
LEGACY_INTERNAL = ("claims", "_agents")  # namespaces where 0.10 kept claims and agents


def _import_legacy(conn: sqlite3.Connection) -> None:
    """Import the records of an agenthold 0.10 database (tables state_records and, renamed
    before this runs, legacy_history) into the current schema, then drop the old tables.

    0.10 restarted a key's versions at 1 after a delete and gave a delete the deleted version.
    Each key's events are renumbered 1, 2, 3... in commit order, so every version is unique
    and a writer holding a version from before the upgrade gets a conflict, never a silent
    overwrite. Claims and agents (0.10 kept them as records) are not imported: agents
    register again. NaN and Infinity, which 0.10 let through, become null.
    """
    columns = {row[1] for row in conn.execute("PRAGMA table_info(legacy_history)")}
    event = "event_type" if "event_type" in columns else "'write'"
    skip = ", ".join("?" for _ in LEGACY_INTERNAL)
    last: dict[tuple[str, str], tuple[int, str | None, str, str, bool]] = {}

    def history_rows() -> Iterator[tuple[Any, ...]]:
        rows = conn.execute(
            f"SELECT namespace, key, value, updated_by, updated_at, {event} FROM legacy_history "
            f"WHERE namespace NOT IN ({skip}) ORDER BY namespace, key, id",
            LEGACY_INTERNAL,
        )
        for ns, key, value, by, at, kind in rows:
            deleted = kind == "delete"
            version = last[(ns, key)][0] + 1 if (ns, key) in last else 1
            text = None if deleted else _strict_json(value)
            last[(ns, key)] = (version, text, by, at, deleted)
            yield ns, key, version, text, by, at, "delete" if deleted else "write"

    conn.executemany(_INSERT_HISTORY, history_rows())
    live = conn.execute(
        f"SELECT namespace, key, value, updated_by, updated_at FROM state_records "
        f"WHERE namespace NOT IN ({skip})",
        LEGACY_INTERNAL,
    ).fetchall()
    for ns, key, value, by, at in live:
        text = _strict_json(value)
        known = last.get((ns, key))
        if known is None or known[4] or known[1] != text:  # the history misses this write
            version = known[0] + 1 if known else 1
            conn.execute(_INSERT_HISTORY, (ns, key, version, text, by, at, "write"))
            last[(ns, key)] = (version, text, by, at, False)
    conn.executemany(
        "INSERT INTO state (namespace, key, value, version, updated_by, updated_at, deleted) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(ns, key, text, v, by, at, int(d)) for (ns, key), (v, text, by, at, d) in last.items()],
    )
    conn.execute("DROP TABLE legacy_history")
    conn.execute("DROP TABLE state_records")
    _report_refused_names([name for name, (*_, deleted) in last.items() if not deleted])


def _report_refused_names(names: list[tuple[str, str]]) -> None:
    """Warn of imported live names that this version refuses: 0.10 checked only for emptiness, NUL
    and length, so it may have stored a blank name or one with a newline. They are imported as
    they are (dropping them would lose data), listed and exported with the rest of their
    namespace; but no call can name them, so say once, now, how to remove them."""
    spaces = sorted({ns for ns, _ in names if _refused_name("n", ns, MAX_NAMESPACE_LENGTH)})
    keys = [
        f"{key!r} in {ns!r}"
        for ns, key in sorted(names)
        if ns not in spaces and _refused_name("k", key, MAX_KEY_LENGTH)
    ]
    if not spaces and not keys:
        return

    def some(items: list[str]) -> str:
        shown = ", ".join(items[:5])
        return shown + (f" and {len(items) - 5} more" if len(items) > 5 else "")

    found = ([f"namespaces {some([repr(n) for n in spaces])}"] if spaces else []) + (
        [f"keys {some(keys)}"] if keys else []
    )
    log.warning(
        "the agenthold 0.10 database holds names this version refuses (blank, or with a "
        "control or invisible character): %s. They were imported and are listed, but no call "
        "can name them but clear_namespace, which removes them with the rest of their namespace "
        "(docs/upgrading.md)",
        "; ".join(found),
    )


def _strict_json(text: str | None) -> str:
    """``text`` if it is strict JSON; else the same value with NaN and Infinity as null."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        json.loads(text or "null", parse_constant=refuse)
        return text or "null"
    except ValueError:
        pass
    try:
        value = json.loads(text or "null")
    except ValueError:
        return json.dumps(text)  # not JSON at all: keep the text as a string
    return json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _describe(conn: sqlite3.Connection) -> tuple[int, int, dict[str, int], list[str]]:
    """The file's application id, layout (user_version), component versions and tables, read
    in one snapshot (another process may be creating the schema at this very moment)."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        layout = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        versions: dict[str, int] = {}
        if app_id == APPLICATION_ID:
            versions = dict(LAYOUTS.get(layout, {}))
        if "agenthold_components" in tables:
            versions.update(conn.execute("SELECT component, version FROM agenthold_components"))
    finally:
        if own:
            conn.execute("COMMIT")
    return app_id, layout, versions, tables


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------

_GET = (
    "SELECT value, version, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND key = ? AND deleted = 0"
)
_CURRENT = (
    "SELECT version, deleted, value, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND key = ?"
)
_INSERT_HISTORY = (
    "INSERT INTO state_history (namespace, key, version, value, updated_by, updated_at, "
    "event_type) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_HISTORY_BY = (
    "INSERT INTO state_history (namespace, key, version, value, updated_by, updated_at, "
    "event_type, principal) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_UPSERT = (
    "INSERT INTO state (namespace, key, value, version, updated_by, updated_at, deleted) "
    "VALUES (?, ?, ?, ?, ?, ?, 0) ON CONFLICT (namespace, key) DO UPDATE SET "
    "value = excluded.value, version = excluded.version, updated_by = excluded.updated_by, "
    "updated_at = excluded.updated_at, deleted = 0"
)
_TOMBSTONE = (
    "UPDATE state SET value = NULL, version = ?, updated_by = ?, updated_at = ?, deleted = 1 "
    "WHERE namespace = ? AND key = ?"
)
_LIST = (
    "SELECT key, value, version, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND deleted = 0 ORDER BY key"
)
_HISTORY = (
    "SELECT version, value, updated_by, updated_at, event_type, principal FROM state_history "
    "WHERE namespace = ? AND key = ? ORDER BY version DESC LIMIT ?"
)
# A page's reads: first the sizes of its candidate rows (never their values: see page_end), in
# bytes of UTF-8 (a text's length counts characters; postgres.py writes octet_length), then the
# values of the rows that fit, by the range page_end found.
_LIST_SIZES = (  # keys are never empty, so after = '' starts at the first
    "SELECT key, length(CAST(value AS BLOB)) FROM state "
    "WHERE namespace = ? AND deleted = 0 AND key > ? ORDER BY key LIMIT ?"
)
_LIST_RANGE = (
    "SELECT key, value, version, updated_by, updated_at FROM state "
    "WHERE namespace = ? AND deleted = 0 AND key > ? AND key <= ? ORDER BY key"
)
_EXPORT_SIZES = (  # a key's live value and its whole history, as one export page holds them
    "SELECT s.key, length(CAST(s.value AS BLOB)) + "
    "(SELECT coalesce(sum(length(CAST(h.value AS BLOB))), 0) "
    "FROM state_history AS h WHERE h.namespace = s.namespace AND h.key = s.key) FROM state AS s "
    "WHERE s.namespace = ? AND s.deleted = 0 AND s.key > ? ORDER BY s.key LIMIT ?"
)
# The oldest version a key's history holds, or (none left) the one after the key's last.
_KEPT_FROM = (
    "SELECT coalesce((SELECT min(version) FROM state_history WHERE namespace = ? AND key = ?), "
    "(SELECT version + 1 FROM state WHERE namespace = ? AND key = ?))"
)
_HISTORY_SIZES = (
    "SELECT version, length(CAST(value AS BLOB)) FROM state_history "
    "WHERE namespace = ? AND key = ? AND version < ? ORDER BY version DESC LIMIT ?"
)
_HISTORY_RANGE = (
    "SELECT version, value, updated_by, updated_at, event_type, principal FROM state_history "
    "WHERE namespace = ? AND key = ? AND version < ? AND version >= ? ORDER BY version DESC"
)
SIZE_BATCH = 1000  # rows whose sizes one statement of page_end reads


def page_end(
    conn: Any,  # a snapshot's connection, or a database (its fetchall reads outside one)
    sizes_sql: str,
    params: Sequence[Any],
    start: Any,
    limit: int,
    max_bytes: int | None,
    too_large: Callable[[Any, int], Exception] | None = None,
) -> tuple[Any, int, bool]:
    """Where a page that starts after ``start`` ends, read from its rows' sizes alone, so that
    no value past the page's byte budget is ever fetched: ``sizes_sql`` gives ``(position,
    stored size)`` rows in page order after a position (its last two parameters: the position
    and a row limit), SIZE_BATCH at a time. A page takes rows while it has fewer than
    ``limit`` and, past its first, their sizes add up to at most ``max_bytes`` (None: no
    bound). Returns the last position taken (``start`` if none), how many rows were taken,
    and whether rows remain after it. With ``too_large``, a first row over ``max_bytes`` is
    not taken: ``too_large(position, size)`` is raised, before any value is read."""
    taken, total, last = 0, 0, start
    while True:
        want = min(limit - taken, SIZE_BATCH) + 1
        args = (*params, last, want)
        rows = (
            conn.fetchall(sizes_sql, args)
            if hasattr(conn, "fetchall")
            else (conn.execute(sizes_sql, args).fetchall())
        )
        for position, size in rows:
            size = int(size or 0)
            if not taken and too_large is not None and max_bytes is not None and size > max_bytes:
                raise too_large(position, size)
            if taken == limit or (taken and max_bytes is not None and total + size > max_bytes):
                return last, taken, True
            last, taken, total = position, taken + 1, total + size
        if len(rows) < want:
            return last, taken, False


STATE_CHANGES = ChangeSource(
    name="state",
    max_sql="SELECT max(id) FROM state_history",
    since_sql="SELECT id, namespace, key FROM state_history WHERE id > ? ORDER BY id",
    topics=lambda row: (("k", row[1], row[2]),),
)


def key_topic(namespace: str, key: str) -> Topic:
    """The change-feed topic of one key."""
    return ("k", namespace, key)


def _check_page(namespace: str, after: str, limit: int | None, max_bytes: int | None) -> None:
    """The arguments of a paged read (list_page, export); None: not bounded that way."""
    check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
    if after:
        check_text("after", after, MAX_KEY_LENGTH)
    if limit is not None:
        check_int("limit", limit, minimum=1)
    if max_bytes is not None:
        check_int("max_bytes", max_bytes, minimum=1)


class StateStore:
    """A versioned key-value store of JSON values, safe across threads and processes.

    ``path`` is a file path, ``":memory:"`` (one process only; gone when closed), a
    ``postgresql://`` URL (needs the ``agenthold[postgres]`` extra) or an open ``Database``.
    ``read_only`` opens an existing database without ever writing or creating it.
    ``durability`` is "normal" (survives a process crash; a power loss may drop the last
    commits) or "full" (fsync on every commit). ``busy_timeout`` is how long a write waits for
    another writer before raising BusyError. ``max_value_bytes`` caps one value's JSON size.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Database,
        *,
        read_only: bool = False,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout: float = 5.0,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self.max_value_bytes = check_int("max_value_bytes", max_value_bytes, minimum=1)
        if not isinstance(path, (str, os.PathLike)) and hasattr(path, "ensure"):
            self.db: Database = path  # a Database opened by the caller
        else:
            target: Any = path  # SQLiteDatabase checks its type
            self.db = open_database(
                target, read_only=read_only, durability=durability, busy_timeout=busy_timeout
            )
        self.db.ensure(STORE_SCHEMA)
        self.db.add_change_source(STATE_CHANGES)

    @property
    def path(self) -> str:
        return self.db.path

    @property
    def read_only(self) -> bool:
        return self.db.read_only

    def close(self) -> None:
        """Close every connection. The store cannot be used afterwards."""
        self.db.close()

    def backup(self, dest: str | os.PathLike[str]) -> str:
        """Copy a SQLite database into the new file ``dest`` while it is in use (see
        ``SQLiteDatabase.backup``); returns the path written. PostgreSQL has pg_dump."""
        backup = getattr(self.db, "backup", None)
        if backup is None:
            raise InvalidInputError(
                f"{self.path} is not a SQLite file; back up a PostgreSQL database with pg_dump"
            )
        written: str = backup(dest)
        return written

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StateStore({self.path!r}, read_only={self.read_only})"

    # -- reading -------------------------------------------------------------------------------

    def get(self, namespace: str, key: str) -> Record:
        """Return the live record of ``key``. Raises NotFoundError if it has none, and
        DamagedRecordError if its stored value is not strict JSON."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        row = self.db.fetchone(_GET, (namespace, key))
        if row is None:
            raise NotFoundError(namespace, key)
        try:
            value = _decode(row[0])
        except _NotJson as exc:
            raise DamagedRecordError(namespace, key, row[1], str(exc), row[2], row[3]) from None
        return _record(namespace, key, value, row[1], row[2], row[3])

    def list_keys(
        self, namespace: str, *, damaged: list[DamagedRecordError] | None = None
    ) -> list[Record]:
        """Return the live records of ``namespace``, sorted by key (empty if there are none).

        A key whose stored value is not strict JSON raises DamagedRecordError, unless a list
        is given as ``damaged``: then the key is left out and its error appended there."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        records: list[Record] = []
        for k, v, ver, by, at in self.db.fetchall(_LIST, (namespace,)):
            try:
                records.append(_record(namespace, k, _decode(v), ver, by, at))
            except _NotJson as exc:
                _damaged(damaged, DamagedRecordError(namespace, k, ver, str(exc), by, at))
        return records

    def list_page(
        self,
        namespace: str,
        *,
        after: str = "",
        limit: int = DEFAULT_PAGE_LIMIT,
        max_bytes: int = MAX_PAGE_BYTES,
        damaged: list[DamagedRecordError] | None = None,
    ) -> tuple[list[Record], str | None]:
        """One page of ``list_keys``: the live records with keys after ``after``, at most
        ``limit`` of them and, past the first, no more than about ``max_bytes`` of stored values;
        and the key to pass as ``after`` for the next page (None: there is none). A namespace
        of any size is listed in bounded pieces this way. Damaged keys count towards ``limit``
        and are raised or collected in ``damaged`` as in ``list_keys``."""
        _check_page(namespace, after, limit, max_bytes)
        with self.db.snapshot() as conn:
            last, taken, more = page_end(
                conn, _LIST_SIZES, (namespace,), after, min(limit, 2**62), max_bytes
            )
            rows = _fetch_all(conn, _LIST_RANGE, (namespace, after, last)) if taken else []
        records: list[Record] = []
        for k, v, ver, by, at in rows:
            try:
                records.append(_record(namespace, k, _decode(v), ver, by, at))
            except _NotJson as exc:
                _damaged(damaged, DamagedRecordError(namespace, k, ver, str(exc), by, at))
        return records, (last if more else None)

    def list_namespaces(self) -> list[NamespaceInfo]:
        """Return every namespace with live records and how many it holds, sorted by name."""
        rows = self.db.fetchall(
            "SELECT namespace, count(*) FROM state WHERE deleted = 0 "
            "GROUP BY namespace ORDER BY namespace"
        )
        return [NamespaceInfo(ns, n) for ns, n in rows]

    def namespace_summaries(self) -> list[dict[str, Any]]:
        """Every namespace ever written, sorted: its live and deleted key counts, and the time
        and writer of its latest change (for the inspector)."""
        rows = self.db.fetchall(
            "SELECT g.namespace, g.live, g.deleted, g.at, (SELECT s.updated_by FROM state AS s "
            "WHERE s.namespace = g.namespace ORDER BY s.updated_at DESC LIMIT 1) FROM ("
            "SELECT namespace, sum(CASE WHEN deleted = 0 THEN 1 ELSE 0 END) AS live, "
            "sum(deleted) AS deleted, max(updated_at) AS at FROM state GROUP BY namespace"
            ") AS g ORDER BY g.namespace"
        )
        return [
            {
                "namespace": ns,
                "record_count": int(live),
                "deleted_count": int(deleted),
                "updated_at": at,
                "updated_by": by,
            }
            for ns, live, deleted, at, by in rows
        ]

    def was_written(self, namespace: str, key: str | None = None) -> bool:
        """Whether ``namespace`` (or ``key`` in it) was ever written; deleted keys count."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        if key is None:
            sql, params = "SELECT 1 FROM state WHERE namespace = ? LIMIT 1", [namespace]
        else:
            check_text("key", key, MAX_KEY_LENGTH)
            sql, params = "SELECT 1 FROM state WHERE namespace = ? AND key = ?", [namespace, key]
        return self.db.fetchone(sql, params) is not None

    def read_log(
        self,
        conn: Any,
        namespace: str | None,
        *,
        after: Any = None,
        limit: int | None = None,
        before: int | None = None,
        writer: str | None = None,
    ) -> tuple[list[Any], Any]:
        """History rows ``(id, namespace, key, version, value, updated_by, updated_at,
        event_type)`` in the snapshot ``conn``, oldest first: the last ``limit`` (``after``
        None; below id ``before``, if given), or those committed after ``after``; and the
        position to follow from. ``writer``, if given, keeps only its writes."""
        where = [("namespace = ?", namespace), ("updated_by = ?", writer)]
        where = [(w, p) for w, p in where if p is not None]
        return read_events(
            self.db,
            conn,
            "state_history",
            "id, namespace, key, version, value, updated_by, updated_at, event_type, principal",
            after=after,
            limit=limit,
            before=before,
            where=" AND ".join(w for w, _ in where),
            params=tuple(p for _, p in where),
        )

    def history(
        self,
        namespace: str,
        key: str,
        limit: int = 10,
        *,
        damaged: list[DamagedRecordError] | None = None,
    ) -> list[HistoryEntry]:
        """Return up to ``limit`` writes and deletes of ``key``, newest first. A key that was
        never written has an empty history. An entry whose text is not strict JSON raises
        DamagedRecordError (naming its version), unless a list is given as ``damaged``: then
        the entry is left out and its error appended there."""
        return self.history_page(namespace, key, limit=limit, max_bytes=None, damaged=damaged)[0]

    def history_page(
        self,
        namespace: str,
        key: str,
        *,
        before: int | None = None,
        limit: int = 10,
        max_bytes: int | None = MAX_PAGE_BYTES,
        damaged: list[DamagedRecordError] | None = None,
    ) -> tuple[list[HistoryEntry], int | None]:
        """One page of ``history``: the entries below version ``before`` (None: from the
        newest), newest first, at most ``limit`` of them and, past the first, no more than
        about ``max_bytes`` of stored values (None: no bound); and the version to pass as
        ``before`` for the next page (None: there is none). Damaged entries count towards
        ``limit`` and are raised or collected in ``damaged`` as in ``history``."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_int("limit", limit, minimum=1)
        if before is not None:
            check_int("before", before, minimum=1, maximum=MAX_SQL_INT)
        if max_bytes is not None:
            check_int("max_bytes", max_bytes, minimum=1)
        top = 2**63 - 1 if before is None else before  # versions are below SQLite's largest
        if max_bytes is None and before is None:  # history(): no byte bound, one statement
            rows = self.db.fetchall(_HISTORY, (namespace, key, min(limit, 2**62) + 1))
            more = len(rows) > limit
            rows = rows[:limit]
            last = rows[-1][0] if rows else top
        else:
            with self.db.snapshot() as conn:
                last, taken, more = page_end(
                    conn, _HISTORY_SIZES, (namespace, key), top, min(limit, 2**62), max_bytes
                )
                rows = (
                    _fetch_all(conn, _HISTORY_RANGE, (namespace, key, top, last)) if taken else []
                )
        if not rows:  # nothing below ``before``: never written, or compacted away?
            kept = self.compacted_before(namespace, key)
            if kept > 1:
                raise HistoryCompactedError(namespace, key, kept)
        entries: list[HistoryEntry] = []
        for v, val, by, at, *rest in rows:
            try:
                entries.append(_history_entry(v, _decode(val), by, at, *rest))
            except _NotJson as exc:
                _damaged(damaged, DamagedRecordError(namespace, key, v, str(exc), by, at))
        return entries, (last if more else None)

    def compacted_before(self, namespace: str, key: str) -> int:
        """The oldest version of ``key`` its history still holds: 1 when compaction removed
        none (or the key was never written), the version after its last one when all of it
        went. Compaction (retention.py) removes only the oldest versions first."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        row = self.db.fetchone(_KEPT_FROM, (namespace, key, namespace, key))
        if row is None or row[0] is None:
            return 1
        return int(row[0])

    def export(
        self,
        namespace: str,
        *,
        after: str = "",
        limit: int | None = None,
        max_bytes: int | None = None,
        damaged: list[DamagedRecordError] | None = None,
    ) -> Export:
        """Return the live records of ``namespace`` with their full histories, read in one
        snapshot so no write can slip between the records and their histories.

        Paged like ``list_page`` when ``limit`` or ``max_bytes`` is given: the keys after
        ``after``, at most ``limit`` of them and at most ``max_bytes`` of stored values and
        history; ``next_after`` says where the next page starts. Each page is one snapshot;
        pages taken one after another are not one. A page holds each key whole, with its whole
        history, so a page that would start with a key over ``max_bytes`` by itself raises
        KeyTooLargeError before reading any of it (a list or history page may go over by its
        first row, which a value's size limit bounds; a key's history has no bound).

        A key whose live value, or an entry of its history, holds text that is not strict JSON
        raises DamagedRecordError, unless a list is given as ``damaged``: then the error is
        appended there, and the key (its live value damaged: it still counts towards
        ``limit``) or that history entry is left out."""
        _check_page(namespace, after, limit, max_bytes)
        paged = limit is not None or max_bytes is not None
        with self.db.snapshot() as conn:
            exported_at = utc_iso()
            last, taken, more = page_end(
                conn,
                _EXPORT_SIZES,
                (namespace,),
                after,
                min(limit, 2**62) if limit is not None else 2**62,
                max_bytes,
                lambda key, size: KeyTooLargeError(namespace, key, size, max_bytes or 0),
            )
            live = _fetch_all(conn, _LIST_RANGE, (namespace, after, last)) if taken else []
            rows = (
                _fetch_all(
                    conn,
                    "SELECT h.key, h.version, h.value, h.updated_by, h.updated_at, h.event_type, "
                    "h.principal FROM state_history AS h JOIN state AS s "
                    "ON s.namespace = h.namespace AND s.key = h.key "
                    "WHERE s.namespace = ? AND s.deleted = 0 AND h.key > ? AND h.key <= ? "
                    "ORDER BY h.key, h.version DESC",
                    (namespace, after, last),
                )
                if taken
                else []
            )
        histories: dict[str, list[HistoryEntry]] = {}
        broken: dict[str, list[DamagedRecordError]] = {}
        oldest: dict[str, int] = {}  # newest first: the last row of a key is its oldest kept
        for k, v, val, by, at, *rest in rows:
            oldest[k] = v
            try:
                entry = _history_entry(v, _decode(val), by, at, *rest)
            except _NotJson as exc:
                error = DamagedRecordError(namespace, k, v, str(exc), by, at)
                broken.setdefault(k, []).append(error)
                continue
            histories.setdefault(k, []).append(entry)
        records: list[ExportedRecord] = []
        for k, v, ver, by, at in live:
            try:
                record = _record(namespace, k, _decode(v), ver, by, at)
            except _NotJson as exc:
                _damaged(damaged, DamagedRecordError(namespace, k, ver, str(exc), by, at))
                continue
            for error in broken.get(k, ()):  # the record goes out without that entry
                _damaged(damaged, error)
            kept = tuple(histories.get(k, ()))
            records.append(ExportedRecord(record, kept, oldest.get(k, ver + 1)))
        next_after = last if paged and more and taken else None
        return Export(namespace, exported_at, tuple(records), next_after)

    def changed_since(self, namespace: str, key: str, since_version: int) -> Record | None:
        """Return the key's state if its version is above ``since_version``: the live record,
        or, if the newest event was a delete, a Record with ``deleted=True`` and value None.
        ``since_version`` 0 means "no value yet": only a live record answers it, so a key that
        was deleted (say by clear_namespace) is waited for until it is written again."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_int("since_version", since_version)
        return self._changed_since(namespace, key, since_version)

    def _changed_since(self, namespace: str, key: str, since_version: int) -> Record | None:
        row = self.db.fetchone(_CURRENT, (namespace, key))
        if row is None or row[0] <= since_version or (since_version == 0 and row[1]):
            return None  # since_version 0 knows of no value: it waits for one, not a tombstone
        version, deleted, value, by, at = row
        if 0 < since_version < version - 1:  # versions were skipped: are they still kept?
            kept = self.compacted_before(namespace, key)
            if kept > since_version + 1:
                raise HistoryCompactedError(namespace, key, kept)
        try:
            return Record(namespace, key, _decode(value), version, by, at, bool(deleted))
        except _NotJson as exc:
            raise DamagedRecordError(namespace, key, version, str(exc), by, at) from None

    def watch(
        self, namespace: str, key: str, *, since_version: int, timeout: float
    ) -> Record | None:
        """Wait until ``key``'s version goes above ``since_version`` and return its new state
        (see ``changed_since``), or None after ``timeout`` seconds. Returns at once if the key
        is already past ``since_version``. Woken by commits, not by polling the key."""
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_int("since_version", since_version)
        seconds = check_seconds("timeout", timeout, maximum=MAX_WAIT_SECONDS)
        topics = [key_topic(namespace, key)]

        def look() -> tuple[Record | None, list[Topic], None]:
            return self._changed_since(namespace, key, since_version), topics, None

        found: Record | None = wait_until(self.db, look, seconds, topics)
        return found

    # -- writing -------------------------------------------------------------------------------

    def set(
        self,
        namespace: str,
        key: str,
        value: Any,
        *,
        updated_by: str,
        expected_version: int | None = None,
        principal: str | None = None,
    ) -> SetResult:
        """Write ``value`` and return the new version.

        ``expected_version``: None writes unconditionally; 0 writes only if the key has no live
        record; N writes only if the live version is N. Otherwise raises ConflictError, whose
        ``detail`` carries the current version, value, writer and time. ``principal`` (who
        called, as authenticated) goes into the history entry beside ``updated_by``.
        """
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_text("updated_by", updated_by, MAX_WRITER_LENGTH)
        if expected_version is not None:
            check_int("expected_version", expected_version)
        text = encode_value(value, self.max_value_bytes)
        with self.db.write() as (conn, changed):
            locks = (_key_lock(namespace, key),), (_namespace_lock(namespace),)
            now = utc_iso(self.db.serialize(conn, *locks))  # the database's clock, as leases
            row = conn.execute(_CURRENT, (namespace, key)).fetchone()
            if row is None:
                last, live = 0, 0
            else:
                last = row[0]
                live = 0 if row[1] else last
            if expected_version is not None and expected_version != live:
                raise ConflictError(
                    expected_version, _live_record(namespace, key, row), namespace, key
                )
            version = last + 1
            conn.execute(
                _INSERT_HISTORY_BY,
                (namespace, key, version, text, updated_by, now, "write", principal),
            )
            conn.execute(_UPSERT, (namespace, key, text, version, updated_by, now))
            changed.append(("k", namespace, key))
        return SetResult(namespace, key, version, live)

    def delete(
        self,
        namespace: str,
        key: str,
        *,
        deleted_by: str,
        expected_version: int | None = None,
        principal: str | None = None,
    ) -> DeleteResult:
        """Delete ``key``'s live record, leaving a tombstone in its history.

        Raises NotFoundError if the key has no live record, and ConflictError if
        ``expected_version`` is given and is not the live version.
        """
        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        check_text("key", key, MAX_KEY_LENGTH)
        check_text("deleted_by", deleted_by, MAX_WRITER_LENGTH)
        if expected_version is not None:
            check_int("expected_version", expected_version)
        with self.db.write() as (conn, changed):
            locks = (_key_lock(namespace, key),), (_namespace_lock(namespace),)
            now = utc_iso(self.db.serialize(conn, *locks))  # the database's clock, as leases
            row = conn.execute(_CURRENT, (namespace, key)).fetchone()
            if row is None or row[1]:
                raise NotFoundError(namespace, key)
            live = row[0]
            if expected_version is not None and expected_version != live:
                raise ConflictError(
                    expected_version, _live_record(namespace, key, row), namespace, key
                )
            version = live + 1
            conn.execute(
                _INSERT_HISTORY_BY,
                (namespace, key, version, None, deleted_by, now, "delete", principal),
            )
            conn.execute(_TOMBSTONE, (version, deleted_by, now, namespace, key))
            changed.append(("k", namespace, key))
        return DeleteResult(namespace, key, live, version, deleted_by, now)

    def clear_namespace(
        self, namespace: str, *, deleted_by: str, principal: str | None = None
    ) -> list[str]:
        """Delete every live record of ``namespace`` in one transaction, a tombstone per key.
        Returns the deleted keys, sorted. There is no version check.

        A namespace name this version refuses (blank, or with a control or invisible character)
        is taken here if it holds live keys: only an agenthold 0.10 database can have brought
        one in, and this is how it is removed (docs/upgrading.md)."""
        refused = _refused_name("namespace", namespace, MAX_NAMESPACE_LENGTH)
        if refused is not None and not _0_10_name(namespace):
            raise refused
        check_text("deleted_by", deleted_by, MAX_WRITER_LENGTH)
        with self.db.write() as (conn, changed):
            # no write of the namespace runs now; the time is the database's clock, as leases'
            now = utc_iso(self.db.serialize(conn, (_namespace_lock(namespace),)))
            rows = conn.execute(
                "SELECT key, version FROM state WHERE namespace = ? AND deleted = 0 ORDER BY key",
                (namespace,),
            ).fetchall()
            if refused is not None and not rows:
                raise refused  # nothing stored under it: the name is refused as everywhere
            conn.executemany(
                _INSERT_HISTORY_BY,
                [
                    (namespace, k, v + 1, None, deleted_by, now, "delete", principal)
                    for k, v in rows
                ],
            )
            conn.executemany(_TOMBSTONE, [(v + 1, deleted_by, now, namespace, k) for k, v in rows])
            changed.extend(("k", namespace, k) for k, _ in rows)
        return [k for k, _ in rows]


def _refused_name(what: str, value: object, max_length: int) -> InvalidInputError | None:
    """The error check_text raises for ``value``, or None if it is a usable name."""
    try:
        check_text(what, value, max_length)
    except InvalidInputError as exc:
        return exc
    return None


def _0_10_name(value: object) -> bool:
    """Whether agenthold 0.10 could have stored ``value`` as a name: 1 to 512 characters, no
    NUL (all it checked), and text SQLite can hold."""
    if not isinstance(value, str) or not 0 < len(value) <= 512 or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _namespace_lock(namespace: str) -> str:
    """The name a write of ``namespace`` holds shared, and clear_namespace exclusively."""
    return "state\x1f" + namespace


def _key_lock(namespace: str, key: str) -> str:
    return "state\x1f" + namespace + "\x1f" + key


def read_events(
    db: Database,
    conn: Any,
    table: str,
    columns: str,
    *,
    after: Any = None,
    limit: int | None = None,
    where: str = "",
    params: tuple[Any, ...] = (),
    before: int | None = None,
) -> tuple[list[Any], Any]:
    """Rows of the append-only event table ``table`` (its first column must be ``id``) that
    committed after position ``after`` (None: the last ``limit`` ever), oldest first, read in
    the snapshot ``conn``; and the position to read from next time. A row that commits late
    is never skipped: the database's ``feed_window`` says which rows are settled. ``before``
    (an id) keeps the rows below it: a page further back."""
    cond, cond_params, position = db.feed_window(conn, table, after)
    if before is not None:
        where, params = " AND ".join(filter(None, ("id < ?", where))), (before, *params)
    sql = f"SELECT {columns} FROM {table} WHERE {cond} " + (f"AND {where} " if where else "")
    if limit is None:
        rows = _fetch_all(conn, sql + "ORDER BY id", (*cond_params, *params))
    else:
        rows = _fetch_all(conn, sql + "ORDER BY id DESC LIMIT ?", (*cond_params, *params, limit))
        rows.reverse()
    return rows, position


def _live_record(namespace: str, key: str, row: Any) -> Record | None:
    if row is None or row[1]:
        return None
    version, _, value, by, at = row
    try:
        return Record(namespace, key, _decode(value), version, by, at)
    except _NotJson as exc:
        raise DamagedRecordError(namespace, key, version, str(exc), by, at) from None


def _damaged(into: list[DamagedRecordError] | None, error: DamagedRecordError) -> None:
    """Collect a damaged key's error in ``into``, or raise it if there is no list."""
    if into is None:
        raise error
    into.append(error)
