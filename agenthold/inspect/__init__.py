"""The read-only inspector: ``agenthold agents|claims|namespaces|keys|history|log|threads|messages``
and ``agenthold status``, with the terminal text they share (tables.py). ``run`` (the
commands' entry point) loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenthold.inspect.commands import (
        run,
    )

__all__ = [
    "run",
]

_LAZY = {
    "run": "agenthold.inspect.commands",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
