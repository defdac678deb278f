"""The held directory and glob claims, indexed for finding those that may cover a file, and kept
from one claim to the next.

A claim of a file must find every held pattern that covers it. Reading the patterns at the file's
ancestor directories and matching each, on every claim, costs more than the claim itself once a
thousand are held in the file's own directory. Decisions behind it:
- The index holds the key and scope of every held pattern, read in one statement, and is kept
  while the database's pattern token (``claim_patterns``, claim_schema v6) is unchanged. Triggers
  give the token a new random value in the very transaction of any write that could change which
  pattern rows are held, whoever writes (this process, another, an older agenthold), so the
  token read under the claims lock says whether a kept index still holds. Random, not a count:
  a database restored from an older copy never comes back to a token it had with other rows.
- It only narrows: a row whose holder's lease has ended is still in it, and every key it gives is
  checked with ``covers_file`` and then read whole (holder, lease) by the caller, as before.
- At each scope, patterns are grouped by the literal tail of their last segment, which a file's
  name must end with (``*.py``: ".py"; ``**/x1.md``: "x1.md"); a file is matched against the
  groups its name ends with, and against the patterns whose last segment is ``**`` or ends in a
  wildcard. So a file among a thousand unrelated globs costs a few dictionary lookups.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agenthold.claims.patterns import ancestors, covers_file, tail_of

__all__ = ["HeldPatterns", "held_patterns"]

_HELD = "SELECT resource, scope FROM claims WHERE holder IS NOT NULL AND scope IS NOT NULL"


@dataclass
class _Scope:
    """The held patterns under one directory: those any name may match, and the others by the
    tail their file's name must end with."""

    anywhere: list[str] = field(default_factory=list)
    tails: dict[str, list[str]] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)  # the tails' lengths, each once


@dataclass(frozen=True)
class HeldPatterns:
    """The held patterns as they were when the database's pattern token was ``token``."""

    token: str
    scopes: dict[str, _Scope]

    @classmethod
    def build(cls, token: str, rows: Sequence[Any]) -> HeldPatterns:
        scopes: dict[str, _Scope] = {}
        for key, scope in rows:
            at = scopes.setdefault(scope, _Scope())
            tail = _tail_of(key, scope)
            if not tail:
                at.anywhere.append(key)
                continue
            at.tails.setdefault(tail, []).append(key)
            if len(tail) not in at.lengths:
                at.lengths.append(len(tail))
        return cls(token, scopes)

    def covering(self, files: Sequence[str]) -> list[str]:
        """The keys of the held patterns that cover any of the file keys ``files``."""
        if not self.scopes:
            return []
        found: dict[str, None] = {}
        for file in files:
            name = file[file.rfind("/") + 1 :]
            for scope in ancestors(file):
                at = self.scopes.get(scope)
                if at is None:
                    continue
                keys = list(at.anywhere)
                for n in at.lengths:
                    if n <= len(name):
                        keys += at.tails.get(name[len(name) - n :], ())
                found.update((k, None) for k in keys if covers_file(k, scope, file))
        return list(found)


def held_patterns(conn: Any, token: str | None, kept: HeldPatterns | None) -> HeldPatterns | None:
    """The index for the pattern token ``token`` read in this transaction: ``kept`` if it was
    built for the same token, else built now. None without a token (nothing to key it on)."""
    if token is None:
        return None
    if kept is not None and kept.token == token:
        return kept
    return HeldPatterns.build(token, conn.execute(_HELD).fetchall())


@functools.lru_cache(maxsize=8192)
def _tail_of(key: str, scope: str) -> str:
    """The literal characters a file's name must end with to match the pattern ``key`` at
    ``scope`` ("" if any name may: its last segment is ``**`` or ends with a wildcard)."""
    return tail_of(key, scope)
