"""The mechanics the four example scripts share: the turn order that makes their race end the same
way on every run, and the audit trail the "with agenthold" scripts print.

Decisions behind it:
- Only mechanics live here. Each example's story (its store, its agents, what they print as they
  go) stays in its own script, so a "without" script and its "with" twin still read on their own
  and can be compared side by side.
- The scripts run as ``python examples/<example>/<script>.py`` and put this directory on sys.path
  to import this module. Importing it makes the checkout's agenthold importable when none is
  installed; it only looks for the package and never imports it, so the "without" scripts still
  run on nothing but the standard library.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if importlib.util.find_spec("agenthold") is None:  # a source checkout without agenthold installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Turns:
    """Runs the agents' numbered steps in order (0, 1, 2, ...) so the race ends the same way on
    every run; what an agent does between its steps (the thinking) runs concurrently."""

    def __init__(self) -> None:
        self._next = 0
        self._changed = threading.Condition()

    @contextmanager
    def turn(self, step: int) -> Iterator[None]:
        with self._changed:
            if not self._changed.wait_for(lambda: self._next == step, timeout=10):
                raise RuntimeError(f"step {step} never came")
        try:
            yield
        finally:
            with self._changed:
                self._next += 1
                self._changed.notify_all()


def print_audit_trail(
    namespace: str, key: str, trail: Sequence[Any], describe: Callable[[Any], str]
) -> None:
    """Print ``trail`` (history records, newest first as StateStore.history returns them)
    oldest first: each version, the time of day it was written, its writer and what
    ``describe`` says of its value."""
    print(f"\nAudit trail of {namespace}/{key}, oldest first (times UTC):")
    width = max((len(h.updated_by) for h in trail), default=0)
    for h in reversed(trail):
        when, by = h.updated_at[11:23], h.updated_by
        print(f"  v{h.version}  {when}  {by:<{width}}  {describe(h.value)}")
