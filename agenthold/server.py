"""``agenthold.server``, kept importable: the application lives in :mod:`agenthold.serve.app`."""

from __future__ import annotations

from agenthold.serve.app import (
    EXIT_PATIENCE,
    Agenthold,
    build_server,
    exit_patience,
    hint_for,
    version,
)

__all__ = [
    "EXIT_PATIENCE",
    "Agenthold",
    "build_server",
    "exit_patience",
    "hint_for",
    "version",
]
