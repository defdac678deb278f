"""Where agenthold reaches past the public API of a library it serves on: one module per
library, and nowhere else.

- ``mcp_sdk.py``: the mcp SDK (a session's connection, the stdio transport on agenthold's own
  pipes, the error it passes for a line it cannot parse, the handshake-era protocol versions);
- ``uvicorn_h11.py``: uvicorn, and the h11 connection its HTTP/1.1 protocol keeps (signals
  left to the caller, per-connection hooks);
- ``sse.py``: sse-starlette's process-wide "close every stream" flag;
- ``asyncio_loop.py``: the report asyncio's event loop makes when accept() runs out of
  descriptors.

Each use is one function or class there, whose docstring says what it reaches into, why, and
which public API would replace it. tests/test_compat.py checks every one against the installed
library, each in a test of its own name, so that an upgrade that moves one fails there, by name,
rather than as a lease that never ends or a signal that kills the server before it frees its
claims; it also reads every other module of the package and fails if one names a private part.

This face imports none of them: each module imports its own library, and the live page, which
uses uvicorn's module, must not pay for the SDK.
"""
