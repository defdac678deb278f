"""agenthold: versioned shared state, resource claims and a message bus for AI agents, over MCP.

The package root stays light on purpose: ``agenthold --help`` and the inspector must start fast,
so names are imported on first use (``from agenthold import StateStore`` still works).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenthold.claims import Coordinator
    from agenthold.messages import MessageBus
    from agenthold.store import (
        AgentholdError,
        BusyError,
        ConflictError,
        InvalidInputError,
        NotFoundError,
        StateStore,
    )

__all__ = [
    "AgentholdError",
    "BusyError",
    "ConflictError",
    "Coordinator",
    "InvalidInputError",
    "MessageBus",
    "NotFoundError",
    "StateStore",
    "__version__",
]

_LAZY = {
    "AgentholdError": "agenthold.store",
    "BusyError": "agenthold.store",
    "ConflictError": "agenthold.store",
    "InvalidInputError": "agenthold.store",
    "NotFoundError": "agenthold.store",
    "StateStore": "agenthold.store",
    "Coordinator": "agenthold.claims",
    "MessageBus": "agenthold.messages",
}


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agenthold")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _installed_version()
    elif name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'agenthold' has no attribute {name!r}")
    globals()[name] = value
    return value
