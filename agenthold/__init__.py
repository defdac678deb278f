"""agenthold: versioned shared state, resource claims and a message bus for AI agents, over MCP.

The package root stays light on purpose: ``agenthold --help`` and the inspector must start fast,
so names are imported on first use (``from agenthold import StateStore`` still works, and so
does every name 0.10 exported here).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:
    from typing import Any

    from agenthold.bus.messagebus import MessageBus
    from agenthold.claims.coordinator import Coordinator
    from agenthold.models import StateRecord, StateRecordHistory
    from agenthold.resources import (
        DEFAULT_WORKSPACE_NAME,
        ResourceId,
        Workspace,
        WorkspaceRegistry,
    )
    from agenthold.store import (
        AgentholdError,
        BusyError,
        ConflictError,
        InvalidInputError,
        NotFoundError,
        SetResult,
        StateStore,
    )

__all__ = [
    "DEFAULT_WORKSPACE_NAME",
    "AgentholdError",
    "BusyError",
    "ConflictError",
    "Coordinator",
    "InvalidInputError",
    "MessageBus",
    "NotFoundError",
    "ResourceId",
    "SetResult",
    "StateRecord",
    "StateRecordHistory",
    "StateStore",
    "Workspace",
    "WorkspaceRegistry",
    "__version__",
]

_LAZY = {
    "AgentholdError": "agenthold.store",
    "BusyError": "agenthold.store",
    "ConflictError": "agenthold.store",
    "InvalidInputError": "agenthold.store",
    "NotFoundError": "agenthold.store",
    "SetResult": "agenthold.store",
    "StateStore": "agenthold.store",
    "StateRecord": "agenthold.models",
    "StateRecordHistory": "agenthold.models",
    "DEFAULT_WORKSPACE_NAME": "agenthold.resources",
    "ResourceId": "agenthold.resources",
    "Workspace": "agenthold.resources",
    "WorkspaceRegistry": "agenthold.resources",
    "Coordinator": "agenthold.claims.coordinator",
    "MessageBus": "agenthold.bus.messagebus",
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
