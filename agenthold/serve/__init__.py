"""Serving MCP: the application (app.py) with its tool framework and tool sets, and the transports
that carry it: stdio, Streamable HTTP with its guards, and the warm server with the front that
hands it calls. This face loads names on first use: the front (standard library only) is
imported by every ``agenthold`` call and must not pay for mcp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenthold.serve.app import (
        Agenthold,
        build_server,
    )

__all__ = [
    "Agenthold",
    "build_server",
]

_LAZY = {
    "Agenthold": "agenthold.serve.app",
    "build_server": "agenthold.serve.app",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
