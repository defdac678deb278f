"""``agenthold hook HOST``: read one hook input on stdin, judge it against the claims, print
the host's refusal or nothing.

Decisions behind it:
- Nothing but what a look needs is imported (no argparse, no cli.py, never mcp): the options
  are read by hand, and the per-user default database is found here the way cli.py finds it
  (``database_path``; tests/test_hooks.py keeps the two equal).
- A hook that cannot judge (no database, a damaged one, a server that will not answer, input
  that is not the host's JSON) must not stop a user's work: it allows the edit and says why in
  one line on stderr, unless ``--on-error deny``, which refuses it with that line as the
  reason. Never a traceback: every failure becomes that one line.
- Exit statuses: 0 with nothing printed (allowed), 0 with the host's deny JSON (refused), 2
  for a command line that is wrong (usage, on stderr).
"""

from __future__ import annotations

import json
import os
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from agenthold.hooks.hosts import Host
    from agenthold.hooks.lookup import Blocker

DB_FILE = "agenthold.db"
DB_ENV = "AGENTHOLD_DB"
DEFAULT_LEASE = 3600.0  # seconds a claim on edit lives without another edit
USAGE = (
    "usage: agenthold hook {claude-code,codex,gemini,cursor} [--db PATH] [--workspace NAME=PATH]"
    " [--claim-on-edit] [--lease SECONDS] [--principal NAME] [--on-error {allow,deny}]"
)


HELP = (
    "Reads a coding host's pre-tool hook input on stdin and refuses an edit of a file another "
    "agent holds\n(printing the host's deny JSON); prints nothing for an edit it allows. "
    "Wire it in with\n'agenthold hook install HOST' (or 'agenthold hook install git'); "
    "docs/hooks.md says what it enforces."
)


class Usage(Exception):
    """A command line that is wrong: one line, exit status 2."""


class Options:
    def __init__(self) -> None:
        self.host = ""
        self.db: str | None = None
        self.workspaces: list[str] = []
        self.claim_on_edit = False
        self.lease = DEFAULT_LEASE
        self.principal: str | None = None
        self.on_error = "allow"


def parse_options(args: Sequence[str], hosts: Sequence[str]) -> Options:
    opts = Options()
    rest = list(args)
    valued = {"--db", "--workspace", "--lease", "--principal", "--on-error"}
    while rest:
        word = rest.pop(0)
        flag, eq, value = word.partition("=")
        if flag in valued:
            if not eq:
                if not rest:
                    raise Usage(f"{flag} needs a value")
                value = rest.pop(0)
            if flag == "--db":
                opts.db = value
            elif flag == "--workspace":
                opts.workspaces.append(value)
            elif flag == "--principal":
                opts.principal = value
            elif flag == "--on-error":
                if value not in ("allow", "deny"):
                    raise Usage(f"--on-error: {value!r} is neither 'allow' nor 'deny'")
                opts.on_error = value
            else:
                try:
                    opts.lease = float(value)
                except ValueError:
                    opts.lease = -1.0
                if not 0 < opts.lease <= 10 * 365 * 86400:
                    raise Usage(f"--lease: {value!r} is not a positive number of seconds")
        elif word == "--claim-on-edit":
            opts.claim_on_edit = True
        elif word.startswith("-"):
            raise Usage(f"unknown option {word!r}")
        elif not opts.host:
            if word not in hosts:
                raise Usage(f"unknown host {word!r}; choose one of {', '.join(hosts)}")
            opts.host = word
        else:
            raise Usage(f"unexpected argument {word!r}")
    if not opts.host:
        raise Usage(f"name the host: one of {', '.join(hosts)}")
    return opts


def state_directory(environ: dict[str, str], platform: str = sys.platform) -> str:
    """cli.state_directory, restated (importing cli.py would cost the hook its budget)."""
    home = os.path.expanduser("~")
    if platform == "win32":
        base = environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
    elif platform == "darwin":
        base = os.path.join(home, "Library", "Application Support")
    else:
        base = environ.get("XDG_STATE_HOME", "")
        if not os.path.isabs(base):
            base = os.path.join(home, ".local", "state")
    return os.path.join(base, "agenthold")


def database_path(given: str | None, environ: dict[str, str]) -> str:
    """The database the server would open: ``--db``, else $AGENTHOLD_DB, else the per-user
    one (cli.database_path)."""
    given = given if given is not None else (environ.get(DB_ENV) or None)
    if given is None:
        return os.path.join(state_directory(environ), DB_FILE)
    if not given.strip():
        raise Usage("--db: an empty path; give a database file, or leave it out")
    return os.path.expanduser(given)


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _held_for(claimed_at: str | None, now: float) -> str:
    if not claimed_at:
        return ""
    from datetime import datetime

    try:
        since = datetime.fromisoformat(claimed_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return ""
    return f" for {_ago(now - since)}"


def _until(lease_ends_at: float | None, now: float) -> str:
    if lease_ends_at is None:
        return "its lease has no end (it lasts until released)"
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(lease_ends_at))
    return f"its lease runs until {at} (in {_ago(lease_ends_at - now)})"


def reason(blockers: Sequence[Blocker], now: float) -> str:
    """What the agent reads when its edit is refused: who holds what, since when, until when,
    and the call that helps."""
    first = blockers[0]
    held_for = _held_for(first.claimed_at, now)
    how = {
        "exclusive": f"has held it{held_for}",
        "covering": f"has held {first.uri}, which covers it,{held_for}",
        "link": f"has held {first.uri} (another name of the same file: a hard link){held_for}",
        "shared": f"has held it shared{held_for}, and an edit needs it alone",
        "inside": f"has held {first.uri}, which lies inside it,{held_for}",
    }[first.how]
    text = (
        f"agenthold: {first.path} is claimed by another agent: {first.name!r} "
        f"({first.agent_id}) {how}; "
        f"{_until(first.lease_ends_at, now)}. Your edit was refused so that its work is not "
        f"overwritten. Call agenthold_wait with resource {first.wait_on!r} (and your agent_id) "
        "to wait until it is free, then claim it; or work on something else."
    )
    others = {(b.path, b.agent_id) for b in blockers[1:]} - {(first.path, first.agent_id)}
    if others:
        text += f" ({len(others)} more claim(s) of others are in this edit's way.)"
    return text


def _read_input() -> dict[str, Any]:
    raw = sys.stdin.buffer.read()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"the hook input is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("the hook input is not a JSON object")
    return data


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run(args: Sequence[str]) -> int:
    """The hook command; returns its exit status."""
    from agenthold.hooks.hosts import HOSTS

    if list(args[:1]) in (["-h"], ["--help"]):
        sys.stdout.write(f"{USAGE}\n\n{HELP}\n")
        return 0
    try:
        opts = parse_options(args, list(HOSTS))
        db = database_path(opts.db, dict(os.environ))
    except Usage as exc:
        sys.stderr.write(f"agenthold hook: {exc}\n{USAGE}\n")
        return 2
    host = HOSTS[opts.host]
    try:
        return _judge(host, opts, db)
    except Exception as exc:  # the one place every failure becomes one line
        why = f"agenthold hook: could not check the claims ({type(exc).__name__}: {exc})"
        why = " ".join(why.split())[:500]
        if opts.on_error == "deny":
            sys.stderr.write(why + "; refusing the edit (--on-error deny)\n")
            _write(host.deny(why + "; the edit is refused because this hook runs strict."))
        else:
            sys.stderr.write(why + "; the edit is allowed\n")
        return 0


def _judge(host: Host, opts: Options, db: str) -> int:
    from agenthold.hooks.ancestry import my_host

    call = host.read(_read_input())
    if call.kind == "none" or (call.kind == "end" and not opts.claim_on_edit):
        return 0
    if db != ":memory:" and "://" not in db and not os.path.exists(db):
        raise FileNotFoundError(f"no database at {db!r}; start an agenthold server first")
    if call.kind == "edit" and not opts.claim_on_edit and opts.on_error == "allow":
        from agenthold.hooks.glance import nothing_held

        if nothing_held(db):  # nobody holds anything: no need to open the store (glance.py)
            return 0
    from agenthold.claims.names import Workspace
    from agenthold.claims.schema import CLAIMS_SCHEMA
    from agenthold.hooks.lookup import (
        Own,
        claim_on_edit,
        end_session,
        in_the_way,
        own_agents,
        resolver_for,
    )
    from agenthold.store import StateStore

    workspaces = [Workspace.parse(os.path.expanduser(w)) for w in opts.workspaces]
    resolver = resolver_for(workspaces, call.cwd)
    session = call.session or f"pid {os.getppid()}"
    own = Own(my_host(), f"{host.name} session {session}"[:128], opts.principal)
    store = StateStore(db, read_only=call.kind == "edit" and not opts.claim_on_edit)
    try:
        # the claims tables at this code's version (made or migrated if this hook may write);
        # a database that never had them holds nothing
        if store.db.ensure(CLAIMS_SCHEMA, required=False) == 0:
            return 0
        if call.kind == "end":
            end_session(store, resolver, own)
            return 0
        held = in_the_way(store, resolver, call.paths, trees=call.trees)
        mine = own_agents(store, own, [b.agent_id for b in held]) if held else set()
        blockers = [b for b in held if b.agent_id not in mine]
        if not blockers and opts.claim_on_edit:
            # a file the edit's own agents hold already needs no claim: only a first edit writes
            covered = {b.path for b in held if b.agent_id in mine}
            wanted = [p for p in call.paths if p not in covered]
            if wanted:
                blockers = claim_on_edit(
                    store, resolver, wanted, own, host_name=host.name, lease=opts.lease
                )
        if blockers:
            _write(host.deny(reason(blockers, store.db.now())))
        return 0
    finally:
        store.close()
