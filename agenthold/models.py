"""agenthold 0.10's ``agenthold.models`` names, kept importable.

0.10's records were pydantic models; 0.11's are the frozen dataclasses of :mod:`agenthold.store`
(timestamps are ISO-8601 strings, a conflict's detail is a dict). These names are the 0.11
classes under their old names, so an import keeps working and each difference shows where it
matters; docs/upgrading.md lists them.
"""

from __future__ import annotations

from agenthold.store import ConflictDetail, HistoryEntry, Record, SetResult

__all__ = ["ConflictDetail", "SetResult", "StateRecord", "StateRecordHistory"]

StateRecord = Record
StateRecordHistory = HistoryEntry
