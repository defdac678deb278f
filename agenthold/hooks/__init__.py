"""Edit hooks: claims that bind. ``agenthold hook HOST`` runs in a coding host's pre-tool hook
and refuses an edit to a file another agent holds; ``agenthold hook install`` wires it into a
host's configuration (or git's pre-commit and pre-push); ``agenthold hook git`` is git's check.

The rooms, one job each (docs/architecture.md):
- ``ancestry``: whose edit it is (the host process a server and a hook descend from);
- ``parse``: the files a patch or a shell command writes;
- ``hosts``: each host's input and deny shape;
- ``lookup``: the decision against the database, claims on edit, the session's end;
- ``command``: the hook command (options, errors, output);
- ``install``: merging the hook into host configurations;
- ``gitcheck``: the git hooks' check of staged and pushed files.

This face imports nothing: the hook is a fresh process on every edit, and each path imports
only the rooms it uses (never mcp). For the same reason the command ends without the
interpreter's teardown (``end``), which costs a hook more than its look at the database.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn

__all__ = ["end", "main"]


def main(args: Sequence[str]) -> int:
    """``agenthold hook ...`` (``args`` after ``hook``); returns the exit status."""
    if args and args[0] == "install":
        from agenthold.hooks.install import run_install

        return run_install(list(args[1:]))
    if args and args[0] == "git":
        from agenthold.hooks.gitcheck import run_git

        return run_git(list(args[1:]))
    from agenthold.hooks.command import run

    return run(args)


def end(status: int) -> NoReturn:
    """End the hook's process with ``status`` without the interpreter's teardown (freeing every
    module and object one by one: 5-15 ms, a third of the hook's budget, for nothing a fresh
    process leaves behind). What must outlast it is done first: every database still open is
    closed (a write's last connection then checkpoints SQLite's log) and the standard streams
    are flushed, so the host reads the whole verdict."""
    backends = sys.modules.get("agenthold.db.backends")  # not imported: no database opened
    if backends is not None:
        backends.close_all()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # a host that stopped reading: nothing to flush to
            pass
        except (OSError, ValueError):  # output that could not be written (a full disk...)
            status = status or 120  # as the interpreter's own exit says it
    os._exit(status)
