"""Each coding host's hook contract: which of its tool calls write which files (read from the
JSON it sends on stdin), which events end a session, and how a refusal is said back to it.

Decisions behind it:
- One ``Host`` per tool, all data: the tools that name a file and the keys their paths come
  in, the shell tools, the patch tools, the session-end events, and the deny shape. A tool a
  host adds later writes nothing here until it is listed: an unknown tool is allowed.
- Relative paths are taken against the ``cwd`` the host sends (Cursor: its first workspace
  root), as the host itself would.
- Claude Code and Codex read ``hookSpecificOutput.permissionDecision`` (exit 0), Gemini CLI
  ``decision`` and ``reason``, Cursor ``permission`` with a message for the user and one for
  the agent. Each also takes exit status 2 as a refusal, which is what a hook that cannot
  print JSON falls back to (see command.py).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

# Plain classes with __slots__, not dataclasses: the hook is a fresh process on every edit, and
# making a dataclass costs more than a hundred of these (and imports dataclasses and inspect).


class Call:
    """What one hook input asks: ``kind`` "edit" (``paths`` it would write), "end" (the
    session or turn ended) or "none" (nothing agenthold judges). ``trees``: a path that is a
    directory writes everything in it (rm -r, mv, Delete)."""

    __slots__ = ("cwd", "kind", "paths", "session", "tool", "trees")

    def __init__(
        self,
        kind: str,
        paths: tuple[str, ...] = (),
        session: str | None = None,
        cwd: str = "",
        tool: str = "",
        trees: bool = False,
    ) -> None:
        self.kind = kind
        self.paths = paths
        self.session = session
        self.cwd = cwd
        self.tool = tool
        self.trees = trees

    def __repr__(self) -> str:
        return (
            f"Call({self.kind!r}, {self.paths!r}, session={self.session!r}, cwd={self.cwd!r}, "
            f"tool={self.tool!r}, trees={self.trees!r})"
        )


class Host:
    """One coding host's contract (see the module's docstring)."""

    __slots__ = (
        "end_events", "file_tools", "name", "patch_tools", "session_key", "shell_events",
        "shell_tools", "tree_tools",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        file_tools: dict[str, tuple[str, ...]],  # tool name -> the tool_input keys of its paths
        shell_tools: frozenset[str],
        patch_tools: frozenset[str],
        end_events: frozenset[str],
        shell_events: frozenset[str] = frozenset(),  # events whose input is a command (Cursor)
        session_key: str = "session_id",
        tree_tools: frozenset[str] = frozenset(),  # file tools that may remove a directory
    ) -> None:
        self.name = name
        self.file_tools = file_tools
        self.shell_tools = shell_tools
        self.patch_tools = patch_tools
        self.end_events = end_events
        self.shell_events = shell_events
        self.session_key = session_key
        self.tree_tools = tree_tools

    def __repr__(self) -> str:
        return f"Host({self.name!r})"

    def read(self, data: dict[str, Any]) -> Call:
        """The call a hook input describes; ValueError if it is not what this host sends."""
        event = data.get("hook_event_name")
        session = data.get(self.session_key)
        session = session if isinstance(session, str) and session else None
        cwd = data.get("cwd")
        if not isinstance(cwd, str) or not cwd:
            roots = data.get("workspace_roots")
            cwd = (
                roots[0] if isinstance(roots, list) and roots and isinstance(roots[0], str) else ""
            )
        cwd = cwd or os.getcwd()
        if event in self.end_events:
            return Call("end", session=session, cwd=cwd)
        if event in self.shell_events:
            command = data.get("command")
            if not isinstance(command, str):
                raise ValueError(f"a {event} input without a command string")
            from agenthold.hooks.parse import shell_paths  # only for commands (shlex, glob)

            written = _absolute(shell_paths(command, cwd), cwd)
            kind = "edit" if written else "none"  # a command writing nothing opens no database
            return Call(kind, written, session, cwd, "shell", trees=True)
        tool = data.get("tool_name")
        if not isinstance(tool, str):
            raise ValueError("the input names no tool_name")
        args = data.get("tool_input")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ValueError(f"tool_input of {tool} is not an object")
        if tool in self.file_tools:
            paths = [args[k] for k in self.file_tools[tool] if isinstance(args.get(k), str)]
            found = tuple(p for p in paths if p)
        elif tool in self.patch_tools or tool in self.shell_tools:
            found = _command_paths(args.get("command"), cwd, patch=tool in self.patch_tools)
        else:
            return Call("none", session=session, cwd=cwd, tool=tool)
        trees = tool in self.shell_tools or tool in self.patch_tools or tool in self.tree_tools
        kind = "edit" if found else "none"
        return Call(kind, _absolute(found, cwd), session, cwd, tool, trees=trees)

    def deny(self, reason: str) -> str:
        """The JSON that refuses the call, with ``reason`` for the agent."""
        if self.name == "gemini":
            shape: dict[str, Any] = {"decision": "deny", "reason": reason}
        elif self.name == "cursor":
            shape = {"permission": "deny", "user_message": reason, "agent_message": reason}
        else:
            shape = {
                "hookSpecificOutput": {
                    "hookEventName": "PreToolUse",
                    "permissionDecision": "deny",
                    "permissionDecisionReason": reason,
                }
            }
        import json  # already imported to read the input; only a refusal writes JSON

        return json.dumps(shape)


def _command_paths(command: object, cwd: str, *, patch: bool) -> tuple[str, ...]:
    """The files a command writes: a patch (apply_patch's text, or an argv that runs it), or a
    shell command line (a string, or an argv such as ["bash", "-lc", "..."])."""
    from agenthold.hooks.parse import patch_paths, shell_paths  # only for commands

    if isinstance(command, list) and all(isinstance(c, str) for c in command):
        if command and os.path.basename(command[0]) == "apply_patch":
            return tuple(patch_paths("\n".join(command[1:])))
        if len(command) >= 3 and command[-2] in ("-c", "-lc") and "sh" in command[0]:
            command = command[-1]
        else:
            command = " ".join(_quote(c) for c in command)
    if not isinstance(command, str):
        return ()
    if patch or command.lstrip().startswith("*** Begin Patch"):
        return tuple(patch_paths(command))
    if "apply_patch" in command and "*** Begin Patch" in command:  # a heredoc to apply_patch
        return tuple(patch_paths(command))
    return tuple(shell_paths(command, cwd))


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


def _absolute(paths: tuple[str, ...] | list[str], cwd: str) -> tuple[str, ...]:
    # ".." is collapsed here (the resolver refuses it, and a refused name would be let through);
    # symlinks are followed later, by the resolver, from the collapsed path
    return tuple(
        dict.fromkeys(os.path.normpath(os.path.join(cwd, os.path.expanduser(p))) for p in paths)
    )


CLAUDE_CODE = Host(
    "claude-code",
    file_tools={
        "Edit": ("file_path",),
        "Write": ("file_path",),
        "MultiEdit": ("file_path",),
        "NotebookEdit": ("notebook_path", "file_path"),
    },
    shell_tools=frozenset({"Bash"}),
    patch_tools=frozenset(),
    end_events=frozenset({"SessionEnd"}),
)
CODEX = Host(
    "codex",
    file_tools={},
    shell_tools=frozenset({"Bash", "shell", "local_shell", "exec_command"}),
    patch_tools=frozenset({"apply_patch"}),
    end_events=frozenset({"Stop", "SessionEnd"}),
)
GEMINI = Host(
    "gemini",
    file_tools={"write_file": ("file_path",), "replace": ("file_path",)},
    shell_tools=frozenset({"run_shell_command"}),
    patch_tools=frozenset(),
    end_events=frozenset({"SessionEnd"}),
)
CURSOR = Host(
    "cursor",
    file_tools={
        "Write": ("file_path", "path", "target_file"),
        "Edit": ("file_path", "path", "target_file"),
        "StrReplace": ("file_path", "path", "target_file"),
        "MultiEdit": ("file_path", "path", "target_file"),
        "Delete": ("file_path", "path", "target_file"),
        "EditNotebook": ("target_notebook", "file_path", "path"),
    },
    shell_tools=frozenset({"Shell"}),
    patch_tools=frozenset(),
    end_events=frozenset({"stop", "sessionEnd"}),
    shell_events=frozenset({"beforeShellExecution"}),
    session_key="conversation_id",
    tree_tools=frozenset({"Delete"}),
)
HOSTS = {h.name: h for h in (CLAUDE_CODE, CODEX, GEMINI, CURSOR)}
