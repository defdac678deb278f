"""asyncio's event loop where agenthold reads what it does not promise: the two names below;
each docstring says what it reaches into, why, and which public API would replace it, and
tests/test_compat.py checks them against the installed Python.
"""

from __future__ import annotations

from typing import Any


def accept_exhausted(context: dict[str, Any]) -> OSError | None:
    """The error of a report (an exception handler's ``context``) that the loop could not
    accept a connection for want of descriptors, or None for any other report.

    Reaches into: the wording of that report, "socket.accept() out of system resource", made
    by the selector loop's accept loop (``asyncio.selector_events``), which then retries in a
    second: one report per pending connection, thousands a second, each with a traceback.
    Why: http.py counts them in its periodic log line instead (``quiet_accept_errors``).
    Public replacement: a callback or a counter for accept failures on ``asyncio.Server``
    (``loop.create_server`` has neither).
    """
    error = context.get("exception")
    if isinstance(error, OSError) and "accept() out of system resource" in context["message"]:
        return error
    return None


def accept_retry_after_close(context: dict[str, Any]) -> bool:
    """Whether a report is the loop's retry of such an accept, run after the listening socket
    was closed (at shutdown), which fails with a ValueError.

    Reaches into: the repr of the retry's handle, which names the loop's private method
    ``_start_serving``.
    Why: nothing is wrong then (the server is stopping); the report would be a traceback.
    Public replacement: the loop cancelling that retry when the server closes.
    """
    error = context.get("exception")
    return isinstance(error, ValueError) and "_start_serving" in str(context.get("handle"))
