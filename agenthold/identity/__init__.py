"""Who is calling and who they are: principals with their tokens and scopes (principals.py,
standard library only, so ``agenthold token ...`` never imports mcp).

The face names the token file as a program reads it (``TokenTable``) and the digest a token is
kept as (``digest``). Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenthold.identity.principals import TokenTable, digest

__all__ = ["TokenTable", "digest"]

_LAZY = {
    "TokenTable": "agenthold.identity.principals",
    "digest": "agenthold.identity.principals",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
