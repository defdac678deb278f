"""Serving MCP: the application (app.py) with its tool framework and tool sets, and the transports
that carry it: stdio, Streamable HTTP with its guards, and the warm server with the front that
hands it calls. This face loads names on first use: the front (standard library only) is
imported by every ``agenthold`` call and must not pay for mcp.

Beside the application, the face names what a program needs to serve it with a tool of its own
(bench/perf/ serves a no-op beside the real tools, its baseline): how a tool is declared
(``ToolSpec``, ``ToolCall``), the standard tools, the two transports' serve functions, and the
bearer-token guard of HTTP.
"""

from __future__ import annotations

from agenthold.lazy import loader

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:
    from agenthold.serve.app import (
        Agenthold,
        build_server,
    )
    from agenthold.serve.auth import BearerAuth
    from agenthold.serve.claim_tools import standard_tools
    from agenthold.serve.http import serve_http
    from agenthold.serve.stdio import serve_stdio
    from agenthold.serve.toolkit import ToolCall, ToolSpec

__all__ = [
    "Agenthold",
    "BearerAuth",
    "ToolCall",
    "ToolSpec",
    "build_server",
    "serve_http",
    "serve_stdio",
    "standard_tools",
]

_LAZY = {
    "Agenthold": "agenthold.serve.app",
    "build_server": "agenthold.serve.app",
    "BearerAuth": "agenthold.serve.auth",
    "standard_tools": "agenthold.serve.claim_tools",
    "serve_http": "agenthold.serve.http",
    "serve_stdio": "agenthold.serve.stdio",
    "ToolCall": "agenthold.serve.toolkit",
    "ToolSpec": "agenthold.serve.toolkit",
}


__getattr__ = loader(__name__, _LAZY)
