"""Whose edit it is: the host process (the coding tool) that an MCP server and an edit hook
both descend from, named so that the two can recognise each other through the database.

Decisions behind it:
- A host starts its stdio MCP servers and its hooks as its own children (through a shell, or a
  launcher such as ``uvx``, at most). So the hook and the server each walk up from their parent
  past the launchers (``LAUNCHERS``) to the first process that is not one: that is the host.
  The agent registered through the server records it (``agents.host``); the hook then treats
  the agents of its own host as the edit's own, and every other agent as someone else.
- A process is named by the boot, its pid and its start time (``/proc/PID/stat``, field 22),
  never by the pid alone: pids are reused, and a database shared over PostgreSQL by several
  machines sees the same pids on each. Where /proc is missing (macOS, Windows) the name is
  None and nothing is recorded: the hook then knows its own agents only by session
  (``--claim-on-edit``) or by principal.
- Standard library only, and no subprocess: the hook runs on every edit.
"""

from __future__ import annotations

import os

# What stands between a host and the program it meant to run: shells, env, package runners.
# The agenthold console script is one too (a warm call's front is named "agenthold"), and git,
# which runs its hooks for whoever ran it.
LAUNCHERS = frozenset(
    {
        "sh", "bash", "dash", "zsh", "fish", "ksh", "tcsh", "csh", "env", "timeout", "nice",
        "nohup", "sudo", "uv", "uvx", "pipx", "npx", "npm", "pnpm", "bunx", "agenthold", "git",
    }
)  # fmt: skip
PROC = "/proc"


def _stat(pid: int, proc: str = PROC) -> tuple[str, int, str] | None:
    """A process's command name, parent pid and start time (clock ticks after boot)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    head, _, tail = text.rpartition(")")  # the name is in parentheses and may hold any byte
    fields = tail.split()
    if not head or len(fields) < 20:
        return None
    return head.partition("(")[2], int(fields[1]), fields[19]


def _boot(proc: str = PROC) -> str:
    try:
        with open(f"{proc}/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "boot"


def parent_of(pid: int, proc: str = PROC) -> int | None:
    """The parent pid of ``pid``, or None if /proc cannot say."""
    found = _stat(pid, proc)
    return None if found is None else found[1]


def host_of(pid: int, proc: str = PROC) -> str | None:
    """The name of the first process from ``pid`` upwards that is not a launcher (``pid``
    itself if it is none): "boot id:pid:start time"; None where /proc cannot say."""
    for _ in range(64):  # a chain of launchers this long is a loop or a joke
        found = _stat(pid, proc)
        if found is None:
            return None
        name, parent, start = found
        if name not in LAUNCHERS or parent <= 1:
            return f"{_boot(proc)}:{pid}:{start}"
        pid = parent
    return None


def my_host() -> str | None:
    """The host of this process: the first non-launcher above it (its parent, usually)."""
    return host_of(os.getppid())
