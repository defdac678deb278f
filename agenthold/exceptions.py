"""The errors agenthold raises, importable from one documented place.

They are defined next to the code that raises them (``store.py`` must stay a single copyable
file); this module only gathers them. Every error derives from ``AgentholdError``; every error
about a bad argument also derives from ``ValueError`` through ``InvalidInputError``, and so does
``DamagedRecordError`` (a stored value that is not JSON).
"""

from agenthold.claims.coordinator import NotHolderError, UnknownAgentError
from agenthold.store import (
    AgentholdError,
    BusyError,
    ConflictDetail,  # 0.10's exceptions.py imported it, so it was reachable here
    ConflictError,
    DamagedRecordError,
    HistoryCompactedError,
    IncompatibleDatabaseError,
    InvalidInputError,
    KeyTooLargeError,
    NotFoundError,
    UnavailableError,
)

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
    "NotHolderError",
    "UnavailableError",
    "UnknownAgentError",
]
