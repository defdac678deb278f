"""The bounds of a long-lived HTTP server: open connections, the process's file-descriptor
limit they are counted against, and the handshake-era sessions each principal may keep. Their
flags and checks live here (standard library only), so that the command line can refuse a bad
value before anything imports mcp; http.py and sessions.py enforce them.

Decisions behind it:
- A server started with the common soft limit of 1,024 descriptors ran out of them under a few
  thousand slow clients, though the hard limit was far higher. At start the soft limit is
  raised to the hard one (cli.py's ``raise_descriptor_limit``: the limit is the process's,
  and cli.py owns what is process-wide), and connections are capped below it
  (``connection_limit``), keeping a reserve for the database, its write-ahead log and the
  event loop, so that a full house refuses connections instead of failing to open files.
- The default cap is DEFAULT_CONNECTIONS at most: far more than the agents of one deployment
  keep open, and bounded memory even where the descriptor limit is a million.
- An explicit ``--connection-limit`` is used as given, with a warning if the descriptor limit
  cannot back it: the operator asked for it.
- A reply the client does not read stays in the server's memory (uvicorn holds it until the
  socket drains), so unread replies are bounded twice: a connection whose reply has not
  drained for ``--send-timeout`` seconds is closed, and the bytes waiting in all send buffers
  together are kept under MOST_UNSENT by closing the longest-stalled connections first.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

DEFAULT_CONNECTIONS = 4096  # the most open HTTP connections by default
DESCRIPTOR_RESERVE = 256  # descriptors kept back from connections (half, on tiny limits)
DEFAULT_SESSIONS = 256  # handshake-era sessions one principal may keep open
DEFAULT_SESSION_IDLE = 600.0  # seconds a session may go without a request before it ends
DEFAULT_SEND_TIMEOUT = 30.0  # seconds a reply may wait on a client that reads none of it
MOST_UNSENT = 64 * 1024 * 1024  # bytes of replies waiting in send buffers, all connections
MOST_CONNECTIONS = 1_000_000
MOST_SESSIONS = 10_000  # the SDK's own limit, over all principals together
MOST_SESSION_IDLE = 86_400.0
MOST_SEND_TIMEOUT = 3_600.0


@dataclass
class Bounds:
    """What the HTTP server bounds, as the command line checked it."""

    connections: int | None = None  # None: derived from the descriptor limit at start
    sessions: int = DEFAULT_SESSIONS
    session_idle: float = DEFAULT_SESSION_IDLE
    send_timeout: float = DEFAULT_SEND_TIMEOUT


def add_arguments(group: argparse._ArgumentGroup) -> None:
    """The flags of the bounds, in the command line's HTTP group."""
    group.add_argument(
        "--connection-limit",
        metavar="N",
        help="the most HTTP connections open at once; beyond it a new connection replaces "
        "the oldest one that has not sent a complete request yet, or is refused with 503 "
        f"(default: {DEFAULT_CONNECTIONS}, or fewer if the file-descriptor limit is lower)",
    )
    group.add_argument(
        "--session-limit",
        metavar="N",
        help="the most 2025-era sessions (Mcp-Session-Id) one token's principal may keep; "
        "beyond it its oldest idle session ends, or the new one is refused with 429 if all are "
        f"in use (default: {DEFAULT_SESSIONS})",
    )
    group.add_argument(
        "--session-idle",
        metavar="SECONDS",
        help="a 2025-era session without a request in flight (an open event stream is one) "
        f"ends after this long (default: {DEFAULT_SESSION_IDLE:g})",
    )
    group.add_argument(
        "--send-timeout",
        metavar="SECONDS",
        help="a connection whose reply the client has not read for this long is closed, so "
        f"unread replies cannot pin the server's memory (default: {DEFAULT_SEND_TIMEOUT:g})",
    )


def bounds_from(args: argparse.Namespace) -> Bounds:
    """The checked bounds; ValueError with a one-line message naming the flag."""
    bounds = Bounds()
    if args.connection_limit is not None:
        bounds.connections = _count(args.connection_limit, "--connection-limit", MOST_CONNECTIONS)
    if args.session_limit is not None:
        bounds.sessions = _count(args.session_limit, "--session-limit", MOST_SESSIONS)
    if args.session_idle is not None:
        bounds.session_idle = _seconds(args.session_idle, "--session-idle", MOST_SESSION_IDLE)
    if args.send_timeout is not None:
        bounds.send_timeout = _seconds(args.send_timeout, "--send-timeout", MOST_SEND_TIMEOUT)
    return bounds


def _seconds(text: str, flag: str, most: float) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= most):
        raise ValueError(
            f"{flag}: {text!r} must be a number of seconds, more than 0 and at most {most:.0f}"
        )
    return value


def _count(text: str, flag: str, most: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise ValueError(f"{flag}: {text!r} must be a whole number from 1 to {most:,}")
    return value


def descriptor_limit() -> int | None:
    """The soft limit of open files in force, or None if there is none to count against."""
    if sys.platform == "win32":
        return None
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def connection_limit(asked: int | None, descriptors: int | None) -> tuple[int, str | None]:
    """The cap on open connections, and a warning if one is due: ``asked`` (--connection-limit)
    as given, else DEFAULT_CONNECTIONS lowered to fit ``descriptors`` less a reserve."""
    fits = None
    if descriptors is not None:
        fits = max(1, descriptors - min(DESCRIPTOR_RESERVE, descriptors // 2))
    if asked is None:
        return (DEFAULT_CONNECTIONS if fits is None else min(DEFAULT_CONNECTIONS, fits)), None
    if fits is not None and asked > fits:
        return asked, (
            f"--connection-limit {asked} is more than the file-descriptor limit ({descriptors}) "
            f"leaves room for (about {fits}); connections beyond that wait until descriptors "
            "free up (raise the hard limit, e.g. 'ulimit -Hn', or lower --connection-limit)"
        )
    return asked, None


def accept_backlog(connections: int, descriptors: int | None) -> int:
    """The listening socket's backlog: asyncio accepts up to that many connections at a time
    before the cap can close any, so the descriptors left over the cap must cover one batch.
    The kernel queues (or, when its queue is full, makes retry) the connections beyond it."""
    if descriptors is None:
        return 2048
    return max(16, min(2048, (descriptors - connections) // 4))
