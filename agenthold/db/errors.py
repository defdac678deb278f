"""The errors agenthold raises on purpose: one base, ``AgentholdError``, and its kinds.

Decisions: an error's message names the bad value, says what was expected and what to do next;
``hint``, where set, is the next step in a sentence. ``InvalidInputError`` is also a
``ValueError`` (a caller's mistake), ``UnavailableError`` says whether it is ``transient``.
Every backend translates its driver's errors into these: no driver error leaves the seam.
Standard library only (the copyable store carries this module).
"""

from __future__ import annotations

from typing import Any, Protocol, TypedDict


class _Live(Protocol):
    """What a conflict says of the live record (a ``Record``; records.py imports this module)."""

    @property
    def version(self) -> int: ...
    @property
    def value(self) -> Any: ...
    @property
    def updated_by(self) -> str: ...
    @property
    def updated_at(self) -> str: ...


__all__ = [
    "AgentholdError",
    "BusyError",
    "ConflictDetail",
    "ConflictError",
    "DamagedRecordError",
    "HistoryCompactedError",
    "IncompatibleDatabaseError",
    "InvalidInputError",
    "KeyTooLargeError",
    "NotFoundError",
    "UnavailableError",
]


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

    def __init__(self, expected_version: int, current: _Live | None, namespace: str, key: str):
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
