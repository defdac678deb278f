"""sse-starlette (3.7) where agenthold goes past its public API: the one name below; its
docstring says what it reaches into, why, and which public API would replace it, and
tests/test_compat.py checks it against the installed sse-starlette.
"""

from __future__ import annotations

from sse_starlette.sse import AppStatus


def clear_exit_flag() -> None:
    """Put sse-starlette's "close every stream" flag back to its import-time value.

    Reaches into: ``sse_starlette.sse.AppStatus.should_exit``, a class attribute for the whole
    process (not exported by the ``sse_starlette`` face), set when any uvicorn server handles
    an exit (sse-starlette patches ``uvicorn.Server.handle_exit`` at import) and never reset;
    while it is set, every event stream of every server ends at once.
    Why: the SDK's event streams (the GET that 2025-era clients keep open) are sse-starlette
    responses; a second HTTP server in one process (as in the tests) would otherwise close its
    streams as soon as they open.
    Public replacement: the SDK passing each app's own ``shutdown_event`` to
    ``EventSourceResponse`` (which takes one), with ``AppStatus`` left out.
    """
    AppStatus.should_exit = False
