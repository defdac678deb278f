"""The ``agenthold`` command line: the parser and dispatch (main.py) and the subcommands that are
not the inspector's (tokens, retention, backup, completion). ``agenthold.cli.main.main`` is the
entry point that ``agenthold/__main__.py`` calls when no warm server takes the call.

The face names the steps ``agenthold`` takes to serve, for a program that serves the same way
with something added (bench/perf/'s no-op servers): the parser and its checked options, the
coordinator they open, the listening socket, the stop signals, and the freeze of what start-up
made. They load on first use. It names no ``main``: that name is the submodule cli.main, which a
function of that name would shadow.
"""

from __future__ import annotations

from agenthold.lazy import loader

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:
    from agenthold.cli.main import (
        build_parser,
        freeze_startup_objects,
        listen,
        open_coordinator,
        serve_options,
        stop_signals,
    )
    from agenthold.db.locations import UsageError

__all__ = [
    "UsageError",
    "build_parser",
    "freeze_startup_objects",
    "listen",
    "open_coordinator",
    "serve_options",
    "stop_signals",
]

_LAZY = {
    "UsageError": "agenthold.db.locations",
    "build_parser": "agenthold.cli.main",
    "freeze_startup_objects": "agenthold.cli.main",
    "listen": "agenthold.cli.main",
    "open_coordinator": "agenthold.cli.main",
    "serve_options": "agenthold.cli.main",
    "stop_signals": "agenthold.cli.main",
}


__getattr__ = loader(__name__, _LAZY)
