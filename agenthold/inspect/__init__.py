"""The read-only inspector: ``agenthold agents|claims|namespaces|keys|history|log|threads|messages``
and ``agenthold status``, with the terminal text they share (tables.py). ``run`` (the
commands' entry point) loads on first use.
"""

from __future__ import annotations

from agenthold.lazy import loader

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

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


__getattr__ = loader(__name__, _LAZY)
