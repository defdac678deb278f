"""The ``agenthold`` command line: the parser and dispatch (main.py) and the subcommands that are
not the inspector's (tokens, retention, backup, completion). Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenthold.cli.main import (
        main,
    )

__all__ = [
    "main",
]

_LAZY = {
    "main": "agenthold.cli.main",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
