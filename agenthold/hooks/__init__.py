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
only the rooms it uses (never mcp).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


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
