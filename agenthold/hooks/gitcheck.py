"""``agenthold hook git pre-commit|pre-push``: git's backstop for edits no host hook saw. It
refuses a commit of staged changes (or a push of commits) to files that other agents hold.

Decisions behind it:
- The files are git's own answer: ``git diff --cached --name-only --no-renames`` for a commit
  (a rename is its old and its new name), and for a push the files of the commits between
  each remote ref and the local one that replaces it (every commit not yet on the remote for a
  new branch), read from the refs git gives the hook on stdin.
- Whose commit it is: git runs the hook for the process that ran git, so the same host
  ancestry as the edit hooks applies (git and shells are launchers): an agent committing
  through its host's shell may commit what it holds itself; a person at a terminal commits
  nothing an agent holds. ``git commit --no-verify`` skips the check, as for any git hook.
- When the claims cannot be read, the commit goes on with one line on stderr, unless
  ``--on-error deny``.
"""

from __future__ import annotations

import os
import subprocess
import sys

from agenthold.hooks.command import Options, Usage, database_path, parse_options, reason

ZERO = "0" * 40
USAGE = "usage: agenthold hook git {pre-commit,pre-push} [--db PATH] [--workspace NAME=PATH] ..."


def _git(args: list[str], cwd: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode("utf-8", "surrogateescape")


def staged(top: str) -> list[str]:
    out = _git(["diff", "--cached", "--name-only", "--no-renames", "-z"], top)
    return [p for p in out.split("\0") if p]


def pushed(top: str, refs: str) -> list[str]:
    found: list[str] = []
    for line in refs.splitlines():
        parts = line.split()
        if len(parts) != 4 or set(parts[1]) == {"0"}:
            continue  # a deletion of a remote branch writes no file
        local, remote = parts[1], parts[3]
        if set(remote) == {"0"}:
            listing = ["log", "--format=", "--name-only", "--no-renames", "-z", local, "--not",
                       "--remotes"]  # fmt: skip
        else:
            listing = ["diff", "--name-only", "--no-renames", "-z", remote, local]
        found += [p for p in _git(listing, top).split("\0") if p.strip()]
    return list(dict.fromkeys(p.strip("\n") for p in found))


def run_git(args: list[str]) -> int:
    if not args or args[0] not in ("pre-commit", "pre-push"):
        sys.stderr.write(f"agenthold hook git: name the git hook\n{USAGE}\n")
        return 2
    which, rest = args[0], args[1:]
    # the options are the edit hook's; git passes its own arguments after them (a remote's
    # name and URL for pre-push), which are not ours to read
    ours: list[str] = []
    i = 0
    while i < len(rest) and rest[i].startswith("--"):
        ours.append(rest[i])
        if "=" not in rest[i] and rest[i] != "--claim-on-edit" and i + 1 < len(rest):
            ours.append(rest[i + 1])
            i += 1
        i += 1
    try:
        opts: Options = parse_options(["claude-code", *ours], ["claude-code"])
        db = database_path(opts.db, dict(os.environ))
    except Usage as exc:
        sys.stderr.write(f"agenthold hook git: {exc}\n{USAGE}\n")
        return 2
    try:
        return _check(which, opts, db)
    except Exception as exc:  # every failure is one line, never a traceback
        why = " ".join(
            f"agenthold: could not check the claims ({type(exc).__name__}: {exc})".split()
        )
        if opts.on_error == "deny":
            sys.stderr.write(why + f"; refusing the {which} (--on-error deny)\n")
            return 1
        sys.stderr.write(why + f"; the {which} goes on\n")
        return 0


def _check(which: str, opts: Options, db: str) -> int:
    from agenthold.claims.names import Workspace
    from agenthold.claims.schema import CLAIMS_SCHEMA
    from agenthold.hooks.ancestry import my_host
    from agenthold.hooks.lookup import Own, refused, resolver_for
    from agenthold.store import StateStore

    top = _git(["rev-parse", "--show-toplevel"], os.getcwd()).strip()
    refs = sys.stdin.read() if which == "pre-push" else ""
    files = staged(top) if which == "pre-commit" else pushed(top, refs)
    if not files:
        return 0
    if "://" not in db and not os.path.exists(db):
        raise FileNotFoundError(f"no database at {db!r}")
    workspaces = [Workspace.parse(os.path.expanduser(w)) for w in opts.workspaces]
    resolver = resolver_for(workspaces, top)
    own = Own(my_host(), None, opts.principal)
    store = StateStore(db, read_only=True)
    try:
        if store.db.ensure(CLAIMS_SCHEMA, required=False) == 0:
            return 0  # no claims were ever made here
        blockers = refused(store, resolver, [os.path.join(top, f) for f in files], own)
        if not blockers:
            return 0
        now = store.db.now()
    finally:
        store.close()
    sys.stderr.write(f"agenthold: {which} refused: other agents hold files it changes.\n")
    for path in dict.fromkeys(b.path for b in blockers):
        sys.stderr.write("  " + reason([b for b in blockers if b.path == path], now) + "\n")
    sys.stderr.write("(git commit --no-verify skips this check; the holder's work may be lost.)\n")
    return 1
