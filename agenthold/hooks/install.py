"""``agenthold hook install HOST``: the hook merged into a host's configuration file (or git's
hooks), ``--uninstall`` to take it out, ``--print`` to show the result instead of writing it.

Decisions behind it:
- Merged, never replaced: the file is read as JSON, agenthold's own entries (a command that runs
  ``agenthold ... hook HOST``) are taken out and put back as configured now, and everything
  else is left as it was, other tools' hooks in the same events included. So running it twice
  changes nothing, and running it with other flags updates agenthold's entry in place.
- A file that is not a JSON object is never overwritten: the installer stops with one line.
  The new text is written to a temporary file beside it and renamed over it (one step), with
  the old file's permissions.
- The command written is this interpreter running ``-m agenthold``, so the hook runs the same
  installation whatever PATH the host's shell has.
- Git: pre-commit and pre-push scripts in the repository's hooks directory (``git rev-parse
  --git-path hooks``, so core.hooksPath counts). An existing hook of another tool is kept
  beside ours as ``NAME.agenthold-chained`` and run first, with the same arguments and input;
  uninstalling puts it back.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from typing import Any

from agenthold.hooks.hosts import HOSTS

OURS = re.compile(r"agenthold\b.*\bhook\s+(claude-code|codex|gemini|cursor|git)\b")
CHAINED = ".agenthold-chained"
GIT_HOOKS = ("pre-commit", "pre-push")


class InstallError(Exception):
    """One line for stderr, exit status 1."""


# What each host's configuration holds: its file (project, user), the events the hook answers
# and, per event, the tools it matches (None: the event has no matcher).
Events = dict[str, str | None]
CONFIG: dict[str, tuple[tuple[str, str], Events, Events]] = {
    "claude-code": (
        (".claude", "settings.json"),
        {"PreToolUse": "Edit|Write|MultiEdit|NotebookEdit|Bash"},
        {"SessionEnd": None},
    ),
    "codex": (
        (".codex", "hooks.json"),
        {"PreToolUse": "apply_patch|Bash|shell|local_shell|exec_command"},
        {"Stop": None},
    ),
    "gemini": (
        (".gemini", "settings.json"),
        {"BeforeTool": "write_file|replace|run_shell_command"},
        {"SessionEnd": None},
    ),
    "cursor": (
        (".cursor", "hooks.json"),
        {
            "preToolUse": "Write|Edit|StrReplace|MultiEdit|Delete|EditNotebook|Shell",
            "beforeShellExecution": None,
        },
        {"stop": None},
    ),
}


def config_path(host: str, project: str | None, user: bool) -> str:
    directory, name = CONFIG[host][0]
    base = os.path.expanduser("~") if user else os.path.abspath(project or os.getcwd())
    return os.path.join(base, directory, name)


def hook_command(host: str, flags: list[str]) -> str:
    words = [sys.executable, "-m", "agenthold", "hook", host, *flags]
    return " ".join(shlex.quote(w) for w in words)


def _is_ours(entry: object) -> bool:
    return isinstance(entry, dict) and bool(OURS.search(str(entry.get("command", ""))))


def _without_ours(config: dict[str, Any], host: str) -> dict[str, Any]:
    """``config`` with agenthold's hook entries taken out (and groups or events they leave
    empty); everything else as it was."""
    hooks = config.get("hooks")
    if not isinstance(hooks, dict):
        return dict(config)  # a copy: the caller compares the result with what was read
    kept: dict[str, Any] = {}
    for event, entries in hooks.items():
        if not isinstance(entries, list):
            kept[event] = entries
            continue
        left = []
        for entry in entries:
            if (
                host != "cursor"
                and isinstance(entry, dict)
                and isinstance(entry.get("hooks"), list)
            ):
                inner = [h for h in entry["hooks"] if not _is_ours(h)]
                if inner:
                    left.append({**entry, "hooks": inner})
                elif not entry["hooks"]:
                    left.append(entry)  # an empty group of someone else's: not ours to drop
            elif not _is_ours(entry):
                left.append(entry)
        if left or not entries:
            kept[event] = left
    return {**config, "hooks": kept}


def merged(config: dict[str, Any], host: str, command: str, claim_on_edit: bool) -> dict[str, Any]:
    """``config`` with agenthold's hook in it, as configured now."""
    _, tools, ends = CONFIG[host]
    out = _without_ours(config, host)
    hooks = dict(out.get("hooks") or {})
    events = {**tools, **(ends if claim_on_edit else {})}
    for event, matcher in events.items():
        if not isinstance(hooks.get(event) or [], list):  # another tool's, not ours to reshape
            raise InstallError(f"its hooks' {event!r} is not a list; fix it first, nothing written")
        entries = list(hooks.get(event) or [])
        if host == "cursor":
            entry: dict[str, Any] = {"command": command}
            if matcher:
                entry["matcher"] = matcher
        else:
            handler: dict[str, Any] = {"type": "command", "command": command}
            if host == "gemini":
                handler["name"] = "agenthold"
            entry = {"hooks": [handler]}
            if matcher:
                entry = {"matcher": matcher, **entry}
        entries.append(entry)
        hooks[event] = entries
    out["hooks"] = hooks
    if host == "cursor":
        out.setdefault("version", 1)
    return out


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise InstallError(f"cannot read {path}: {exc.strerror}") from None
    if not text.strip():
        return {}
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise InstallError(
            f"{path} is not valid JSON ({exc}); fix it first, nothing written"
        ) from None
    if not isinstance(config, dict):
        raise InstallError(f"{path} is not a JSON object; fix it first, nothing written")
    if not isinstance(config.get("hooks", {}), dict):
        raise InstallError(f"{path}: its 'hooks' is not an object; fix it first, nothing written")
    return config


def _write_atomically(path: str, text: str, mode: int | None = None) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    fd, temp = tempfile.mkstemp(dir=directory, prefix=".agenthold-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


def install_host(args: argparse.Namespace, flags: list[str]) -> int:
    path = config_path(args.host, args.project, args.user)
    current = _read(path)
    if args.uninstall:
        new = _without_ours(current, args.host)
    else:
        command = hook_command(args.host, flags)
        try:
            new = merged(current, args.host, command, args.claim_on_edit)
        except InstallError as exc:
            raise InstallError(f"{path}: {exc}") from None
    text = json.dumps(new, indent=2) + "\n"
    if args.print:
        sys.stdout.write(text)
        return 0
    if new == current and os.path.exists(path):
        print(f"{path}: already as wanted, nothing changed")
        return 0
    if args.uninstall and not os.path.exists(path):
        print(f"{path}: no such file, nothing to take out")
        return 0
    _write_atomically(path, text)
    print(f"{path}: agenthold's hook {'taken out' if args.uninstall else 'installed'}")
    return 0


# -- git ------------------------------------------------------------------------------------


def _git_hooks_dir(project: str | None) -> str:
    where = os.path.abspath(project or os.getcwd())
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--git-path", "hooks"],
            cwd=where,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        raise InstallError(f"cannot run git: {exc.strerror}") from None
    if found.returncode != 0:
        raise InstallError(f"{where} is not in a git repository ({found.stderr.strip()})")
    return os.path.join(where, found.stdout.strip())


def git_script(name: str, flags: list[str]) -> str:
    command = " ".join(
        shlex.quote(w) for w in [sys.executable, "-m", "agenthold", "hook", "git", name, *flags]
    )
    verb = "commit" if name == "pre-commit" else "push"
    return f"""#!/bin/sh
# agenthold: refuse to {verb} changes to files other agents hold
# (written by agenthold hook install git; a hook that was here runs first, as {name}{CHAINED})
input=$(cat)
if [ -x "$0{CHAINED}" ]; then
    printf '%s\\n' "$input" | "$0{CHAINED}" "$@" || exit $?
fi
printf '%s\\n' "$input" | {command} "$@"
"""


def _is_our_script(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "written by agenthold hook install git" in f.read(4096)
    except OSError:
        return False


def install_git(args: argparse.Namespace, flags: list[str]) -> int:
    directory = _git_hooks_dir(args.project)
    for name in GIT_HOOKS:
        path = os.path.join(directory, name)
        chained = path + CHAINED
        if args.print:
            sys.stdout.write(f"# {path}\n{git_script(name, flags)}")
            continue
        if args.uninstall:
            if _is_our_script(path):
                os.unlink(path)
                if os.path.exists(chained):
                    os.replace(chained, path)
                print(f"{path}: agenthold's check taken out")
            continue
        if os.path.exists(path) and not _is_our_script(path):
            if os.path.exists(chained):
                raise InstallError(f"both {path} and {chained} exist; move one away first")
            os.replace(path, chained)
        _write_atomically(path, git_script(name, flags), 0o755)
        print(f"{path}: agenthold's check installed")
    return 0


def run_install(args: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="agenthold hook install",
        description="Wire agenthold's edit hook into a host's configuration, or git's hooks.",
    )
    parser.add_argument("host", choices=[*HOSTS, "git"])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--project", metavar="DIR", help="the project's file (default: here)")
    where.add_argument("--user", action="store_true", help="the user's file, for every project")
    parser.add_argument("--uninstall", action="store_true", help="take agenthold's hook out")
    parser.add_argument("--print", action="store_true", help="show the result, write nothing")
    parser.add_argument("--claim-on-edit", action="store_true")
    parser.add_argument("--db", metavar="PATH")
    parser.add_argument("--workspace", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--on-error", choices=["allow", "deny"])
    parser.add_argument("--principal", metavar="NAME")
    parser.add_argument("--lease", metavar="SECONDS")
    try:
        opts = parser.parse_args(args)
    except SystemExit as exc:  # argparse printed its usage and one line
        return int(exc.code or 0)
    flags: list[str] = []
    if opts.db:
        flags += ["--db", os.path.abspath(os.path.expanduser(opts.db)) if "://" not in opts.db
                  else opts.db]  # fmt: skip
    for w in opts.workspace:
        flags += ["--workspace", w]
    for name in ("on_error", "principal", "lease"):
        if getattr(opts, name):
            flags += [f"--{name.replace('_', '-')}", getattr(opts, name)]
    if opts.host == "git" and opts.user:
        print(
            "agenthold hook install: git hooks belong to a repository; use --project",
            file=sys.stderr,
        )
        return 2
    try:
        if opts.host == "git":
            return install_git(opts, flags)
        if opts.claim_on_edit:
            flags.insert(0, "--claim-on-edit")
        return install_host(opts, flags)
    except InstallError as exc:
        print(f"agenthold hook install: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"agenthold hook install: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1
