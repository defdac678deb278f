"""Tests for issue 25: ``agenthold hook HOST`` refuses an edit to a file another agent holds.

Every verdict comes from the real command (``python -m agenthold hook HOST``, a subprocess fed
the host's JSON on stdin), against claims made through real stdio servers driven by an MCP
client, on SQLite and PostgreSQL. This test process plays the coding host: it starts the
"own" stdio server and the hooks as its children, as Claude Code or Codex would. The "other"
agent's server is started through another host process (a Python that runs the server as its
child), so its agent belongs to another host.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from support import child_env, reply_of

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.hooks import command as hook_command
from agenthold.hooks import glance
from agenthold.hooks.ancestry import host_of, my_host, parent_of
from agenthold.hooks.hosts import HOSTS
from agenthold.store import StateStore

pytestmark = pytest.mark.anyio

SESSION = "0b6a9c3e-5d1f-4c2a-9e7b-3f8d2a1c4b5e"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "src" / "api").mkdir(parents=True)
    (path / "docs").mkdir()
    for name in ("src/a.py", "src/b.py", "src/api/handlers.py", "README.md", "docs/x.md"):
        (path / name).write_text("text\n")
    return path


@pytest.fixture
def db(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> str:
    if backend == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    path = tmp_path / "hooks.db"
    StateStore(str(path)).close()  # a server would have made it; the hook never creates one
    return str(path)


def server_params(db: str, root: Path, *, other_host: bool) -> StdioServerParameters:
    serve = ["-m", "agenthold", "--db", db, "--workspace", f"default={root}"]
    if not other_host:
        return StdioServerParameters(
            command=sys.executable, args=serve, cwd=str(root), env=child_env()
        )
    # another host: a Python process (not a launcher) whose child the server is
    wrapper = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, *sys.argv[1:]]))"
    return StdioServerParameters(
        command=sys.executable, args=["-c", wrapper, *serve], cwd=str(root), env=child_env()
    )


@asynccontextmanager
async def agent(
    db: str, root: Path, name: str, *, other_host: bool = False
) -> AsyncIterator[tuple[Client, str]]:
    """A real stdio server with an agent registered through it: (client, agent_id)."""
    params = server_params(db, root, other_host=other_host)
    async with Client(params, read_timeout_seconds=60) as client:  # type: ignore[arg-type]
        registered = await call(client, "agenthold_register", name=name)
        yield client, registered["agent_id"]


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    return reply_of(await client.call_tool(tool, arguments))


async def claim(client: Client, agent_id: str, *resources: str, mode: str = "exclusive") -> None:
    for resource in resources:
        got = await call(client, "agenthold_claim", resource=resource, agent_id=agent_id,
                         mode=mode)  # fmt: skip
        assert got["status"] in ("claimed", "already_claimed"), got


def hook(
    host: str,
    payload: dict[str, Any] | str,
    db: str,
    *flags: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return subprocess.run(
        [sys.executable, "-m", "agenthold", "hook", host, "--db", db, *flags],
        input=text,
        capture_output=True,
        text=True,
        env={**child_env(), **(env or {})},
        timeout=120,
    )


# -- each host's input, as its documentation describes it ------------------------------------


def claude(cwd: Path, tool: str, **tool_input: Any) -> dict[str, Any]:
    return {
        "session_id": SESSION, "transcript_path": str(cwd / "t.jsonl"), "cwd": str(cwd),
        "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": tool,
        "tool_input": tool_input, "tool_use_id": "toolu_01ABC",
    }  # fmt: skip


def codex(cwd: Path, tool: str, **tool_input: Any) -> dict[str, Any]:
    return {
        "session_id": SESSION, "transcript_path": None, "cwd": str(cwd),
        "hook_event_name": "PreToolUse", "model": "gpt-5-codex", "tool_name": tool,
        "tool_use_id": "call_1", "tool_input": tool_input,
    }  # fmt: skip


def gemini(cwd: Path, tool: str, **tool_input: Any) -> dict[str, Any]:
    return {
        "session_id": SESSION, "transcript_path": str(cwd / "t.json"), "cwd": str(cwd),
        "hook_event_name": "BeforeTool", "timestamp": "2026-12-07T10:00:00Z",
        "tool_name": tool, "tool_input": tool_input,
    }  # fmt: skip


def cursor(cwd: Path, tool: str, **tool_input: Any) -> dict[str, Any]:
    return {
        "conversation_id": SESSION, "generation_id": "gen-1", "model": "claude-4-sonnet",
        "hook_event_name": "preToolUse", "cursor_version": "2.0.0",
        "workspace_roots": [str(cwd)], "user_email": None, "tool_name": tool,
        "tool_input": tool_input,
    }  # fmt: skip


def cursor_shell(cwd: Path, command: str) -> dict[str, Any]:
    return {
        "conversation_id": SESSION, "generation_id": "gen-1", "hook_event_name":
        "beforeShellExecution", "workspace_roots": [str(cwd)], "command": command,
        "cwd": str(cwd),
    }  # fmt: skip


def patch(*headers: str) -> str:
    body = "\n".join(f"{h}\n@@\n-old\n+new" for h in headers)
    return f"*** Begin Patch\n{body}\n*** End Patch\n"


def edits_of(root: Path, target: str) -> dict[str, list[dict[str, Any]]]:
    """For each host, an input of every tool it names that writes ``target`` (relative to
    ``root``), built from that host's documented schema."""
    full = str(root / target)
    return {
        "claude-code": [
            claude(root, "Edit", file_path=full, old_string="a", new_string="b"),
            claude(root, "Write", file_path=full, content="new\n"),
            claude(
                root, "MultiEdit", file_path=full, edits=[{"old_string": "a", "new_string": "b"}]
            ),
            claude(root, "NotebookEdit", notebook_path=full, new_source="x = 1"),
            claude(root, "Bash", command=f"echo hi > {target}", description="write"),
        ],
        "codex": [
            codex(root, "apply_patch", command=patch(f"*** Update File: {target}")),
            codex(root, "apply_patch", command=patch(f"*** Delete File: {target}")),
            codex(root, "Bash", command=f"sed -i s/a/b/ {target}"),
            codex(root, "shell", command=["apply_patch", patch(f"*** Update File: {target}")]),
            codex(root, "shell", command=["bash", "-lc", f"rm -f {target}"]),
        ],
        "gemini": [
            gemini(root, "write_file", file_path=full, content="new\n"),
            gemini(
                root, "replace", file_path=full, old_string="a", new_string="b", instruction="fix"
            ),
            gemini(root, "run_shell_command", command=f"cat x | tee {target}", description="write"),
        ],
        "cursor": [
            cursor(root, "Write", file_path=full, contents="new\n"),
            cursor(root, "Edit", file_path=full, old_string="a", new_string="b"),
            cursor(root, "StrReplace", file_path=full, old_string="a", new_string="b"),
            cursor(root, "Delete", file_path=full),
            cursor(root, "Shell", command=f"mv other {target}"),
            cursor_shell(root, f"git checkout -- {target}"),
        ],
    }


def refused(host: str, done: subprocess.CompletedProcess[str]) -> str:
    """The reason of a refusal in ``host``'s deny shape (and the process's exit 0)."""
    assert done.returncode == 0, done.stderr
    shape = json.loads(done.stdout)
    if host == "gemini":
        assert shape["decision"] == "deny"
        return str(shape["reason"])
    if host == "cursor":
        assert shape["permission"] == "deny" and shape["user_message"]
        return str(shape["agent_message"])
    output = shape["hookSpecificOutput"]
    assert output["hookEventName"] == "PreToolUse" and output["permissionDecision"] == "deny"
    return str(output["permissionDecisionReason"])


def allowed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", done.stdout
    assert "Traceback" not in done.stderr


# -- the contract of every host ----------------------------------------------------------------


@pytest.mark.backends  # (cold and warm servers record a host alike: the next test runs both)
async def test_every_host_refuses_every_edit_tool_on_a_file_another_agent_holds(
    db: str, root: Path
) -> None:
    async with agent(db, root, "alice", other_host=True) as (alice, alice_id):
        await claim(alice, alice_id, "src/a.py")
        for host, inputs in edits_of(root, "src/a.py").items():
            for payload in inputs:
                why = refused(host, hook(host, payload, db))
                assert "'alice'" in why and alice_id in why, why
                assert "agenthold_wait" in why and "lease" in why and " for " in why, why
                assert "src/a.py" in why
        # the same tools on a free file: allowed, silently
        for host, inputs in edits_of(root, "src/b.py").items():
            for payload in inputs:
                allowed(hook(host, payload, db))


@pytest.mark.backends
@pytest.mark.usefixtures("stdio_path")
async def test_an_edit_by_the_agent_that_holds_the_file_is_allowed(db: str, root: Path) -> None:
    async with (
        agent(db, root, "mine") as (mine, mine_id),
        agent(db, root, "theirs", other_host=True) as (theirs, theirs_id),
    ):
        await claim(mine, mine_id, "src/a.py")
        await claim(theirs, theirs_id, "src/b.py")
        # one edit tool and one shell command of each host (every tool's reading of the path is
        # the test above): whose edit it is depends on the host process, not on the tool
        for host, inputs in edits_of(root, "src/a.py").items():
            for payload in (inputs[0], inputs[-1]):
                allowed(hook(host, payload, db))
        for host, inputs in edits_of(root, "src/b.py").items():
            for payload in (inputs[0], inputs[-1]):
                assert "'theirs'" in refused(host, hook(host, payload, db))


@pytest.mark.backends
async def test_any_name_of_the_file_and_any_claim_covering_it_refuse_the_edit(
    db: str, root: Path
) -> None:
    (root / "hard.py").hardlink_to(root / "src" / "a.py")
    (root / "link.py").symlink_to(root / "src" / "b.py")
    (root / "srcdir").symlink_to(root / "src")
    async with agent(db, root, "bob", other_host=True) as (bob, bob_id):
        await claim(bob, bob_id, "src/a.py", "src/b.py", "docs/", "**/*.md")
        cases = {
            "hard.py": "hard link",  # claimed as src/a.py
            "link.py": "has held it",  # through a symlink to src/b.py
            "srcdir/a.py": "has held it",  # through a linked directory
            "docs/x.md": "covers it",
            "docs/new/deeper.txt": "covers it",  # a file that does not exist yet
            "README.md": "covers it",  # the glob
            "src/api/../a.py": "has held it",  # a ".." segment, collapsed
        }
        for name, says in cases.items():
            payload = claude(root, "Write", file_path=str(root / name), content="x")
            why = refused("claude-code", hook("claude-code", payload, db))
            assert says in why and "'bob'" in why, (name, why)
        allowed(hook("claude-code", claude(root, "Write", file_path=str(root / "free.py")), db))
        # names no claim could have (a NUL byte; the workspace root itself): nothing holds them
        for odd in ("bad\0name.py", "."):
            allowed(hook("claude-code", claude(root, "Write", file_path=str(root / odd)), db))


@pytest.mark.backends
async def test_removing_or_moving_a_directory_is_refused_when_a_file_in_it_is_held(
    db: str, root: Path
) -> None:
    # rm -r, mv and git checkout of a directory write every file in it; a copy into it, or a
    # touch of it, writes none of the held ones
    (root / "srcdir").symlink_to(root / "src")
    async with agent(db, root, "bob", other_host=True) as (bob, bob_id):
        await claim(bob, bob_id, "src/api/handlers.py")
        for command in ("rm -rf src", "mv src elsewhere", "rm -r srcdir/", "git checkout -- src",
                        f"rm -rf {root}"):  # fmt: skip
            why = refused(
                "claude-code", hook("claude-code", claude(root, "Bash", command=command), db)
            )
            assert "'bob'" in why and "lies inside it" in why, (command, why)
        for command in ("cp README.md src", "mv docs/x.md src/api", "touch src/api", "rm -r docs"):
            allowed(hook("claude-code", claude(root, "Bash", command=command), db))


@pytest.mark.backends
async def test_shared_holds_refuse_an_edit_since_it_needs_the_file_alone(
    db: str, root: Path
) -> None:
    async with (
        agent(db, root, "mine") as (mine, mine_id),
        agent(db, root, "reader", other_host=True) as (reader, reader_id),
    ):
        await claim(reader, reader_id, "src/a.py", mode="shared")
        await claim(mine, mine_id, "src/a.py", mode="shared")
        await claim(mine, mine_id, "src/b.py", mode="shared")
        why = refused("gemini", hook("gemini", gemini(root, "write_file", file_path=str(
            root / "src/a.py"), content="x"), db))  # fmt: skip
        assert "shared" in why and "'reader'" in why, why
        # held shared by the edit's own agent alone: nobody else reads it
        allowed(hook("gemini", gemini(root, "write_file", file_path=str(root / "src/b.py")), db))


@pytest.mark.backends
async def test_the_hooks_verdicts_agree_with_the_coordinators_status(db: str, root: Path) -> None:
    """The lean read path against Coordinator.status on the same claims: held is refused,
    available (or held by nobody live) is allowed."""
    store = StateStore(db)
    coord = Coordinator(store, Resolver([Workspace("default", str(root))]), claim_ttl=30)
    try:
        other = coord.register("other").agent_id
        gone = coord.register("gone").agent_id
        coord.claim("src/api/", other)
        coord.claim("src/a.py", gone)
        coord.end_lease(gone, 0.0)  # its lease has ended: its claim holds nothing
        coord.claim("docs/*.md", other)
        names = ["src/a.py", "src/b.py", "src/api/handlers.py", "src/api/new.py", "docs/x.md",
                 "README.md"]  # fmt: skip
        for name in names:
            status = coord.status(name).status
            done = hook("claude-code", claude(root, "Edit", file_path=str(root / name)), db)
            assert (done.stdout != "") == (status == "claimed"), (name, status, done.stdout)
    finally:
        store.close()


# -- whose edit it is --------------------------------------------------------------------------


def test_the_host_is_the_first_ancestor_that_is_not_a_launcher(tmp_path: Path) -> None:
    proc = tmp_path / "proc"

    def process(pid: int, name: str, parent: int, start: int) -> None:
        (proc / str(pid)).mkdir(parents=True)
        fields = ["S", str(parent)] + ["0"] * 17 + [str(start)] + ["0"] * 10
        (proc / str(pid) / "stat").write_text(f"{pid} ({name}) {' '.join(fields)}\n")

    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("boot-1\n")
    process(10, "node (claude)", 1, 500)  # a name with a space and parentheses
    process(11, "sh", 10, 600)
    process(12, "uvx", 11, 700)
    process(13, "python3", 12, 800)
    assert host_of(13, str(proc)) == "boot-1:13:800"
    assert host_of(12, str(proc)) == "boot-1:10:500"
    assert parent_of(13, str(proc)) == 12
    assert host_of(99, str(proc)) is None and parent_of(99, str(proc)) is None
    (proc / "14").mkdir()
    (proc / "14" / "stat").write_text("garbage")
    assert host_of(14, str(proc)) is None


def test_this_process_host_is_its_parent_and_a_child_names_this_process() -> None:
    mine = host_of(os.getpid())
    assert mine is not None and f":{os.getpid()}:" in mine
    child = subprocess.run(
        [sys.executable, "-c", "from agenthold.hooks.ancestry import my_host; print(my_host())"],
        capture_output=True, text=True, env=child_env(), check=True,
    )  # fmt: skip
    assert child.stdout.strip() == mine
    assert my_host() != mine


async def test_an_agent_registered_over_http_is_someone_else_unless_its_principal_is_given(
    tmp_path: Path, root: Path
) -> None:
    """Over HTTP the hook cannot see the server's client; an agent of a token's principal is
    the edit's own when the hook is given that principal (--principal)."""
    db = str(tmp_path / "team.db")
    store = StateStore(db)
    coord = Coordinator(store, Resolver([Workspace("default", str(root))]))
    try:
        ana = coord.register("ana", principal="ana").agent_id  # as an HTTP server records it
        coord.claim("src/a.py", ana)
    finally:
        store.close()
    payload = claude(root, "Edit", file_path=str(root / "src/a.py"))
    assert "'ana'" in refused("claude-code", hook("claude-code", payload, db))
    allowed(hook("claude-code", payload, db, "--principal", "ana"))
    assert refused("claude-code", hook("claude-code", payload, db, "--principal", "bo"))


# -- claims on edit ----------------------------------------------------------------------------


@pytest.mark.backends
async def test_claim_on_edit_claims_a_free_file_for_the_session_and_frees_it_at_its_end(
    db: str, root: Path
) -> None:
    edit = claude(root, "Write", file_path=str(root / "src/a.py"), content="x")
    allowed(hook("claude-code", edit, db, "--claim-on-edit", "--lease", "600"))
    store = StateStore(db)
    coord = Coordinator(store, Resolver([Workspace("default", str(root))]))
    try:
        status = coord.status("src/a.py")
        assert status.status == "claimed" and status.holder is not None
        assert status.holder.name == f"claude-code session {SESSION}"
        assert status.holder.lease_ends_at is not None
        # a second edit of the same session: still allowed, the same claim
        allowed(hook("claude-code", edit, db, "--claim-on-edit"))
        assert coord.status("src/a.py").version == status.version
        # another session (another host process) cannot edit it now, even with no MCP call
        other = dict(edit, session_id="other-session")
        wrapper = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.run("
                   "sys.argv[1:], check=False).returncode)"]  # fmt: skip
        done = subprocess.run(
            [*wrapper, sys.executable, "-m", "agenthold", "hook", "claude-code", "--db", db,
             "--claim-on-edit"],
            input=json.dumps(other), capture_output=True, text=True, env=child_env(), timeout=120,
        )  # fmt: skip
        why = refused("claude-code", done)
        assert f"claude-code session {SESSION}" in why
        # the session ends: its claims end with it
        end = {"session_id": SESSION, "cwd": str(root), "hook_event_name": "SessionEnd",
               "reason": "exit", "transcript_path": None}  # fmt: skip
        allowed(hook("claude-code", end, db, "--claim-on-edit"))
        after = coord.status("src/a.py")
        assert after.status == "available"
        assert after.previous is not None and after.previous.outcome == "modified"
    finally:
        store.close()


@pytest.mark.backends
async def test_claim_on_edit_claims_for_the_hosts_own_agent_when_it_has_one(
    db: str, root: Path
) -> None:
    async with (
        agent(db, root, "mine") as (mine, mine_id),
        agent(db, root, "theirs", other_host=True) as (theirs, theirs_id),
    ):
        await claim(theirs, theirs_id, "src/b.py")
        patch_text = patch("*** Update File: src/a.py", "*** Add File: src/new.py")
        allowed(hook("codex", codex(root, "apply_patch", command=patch_text), db,
                     "--claim-on-edit"))  # fmt: skip
        got = await call(mine, "agenthold_status", resource="src/new.py")
        assert got["status"] == "claimed" and got["held_by"] == mine_id, got
        # a set with one file someone else holds: refused whole, nothing claimed
        both = patch("*** Update File: src/api/handlers.py", "*** Move to: src/b.py")
        why = refused("codex", hook("codex", codex(root, "apply_patch", command=both), db,
                                    "--claim-on-edit"))  # fmt: skip
        assert "'theirs'" in why
        got = await call(mine, "agenthold_status", resource="src/api/handlers.py")
        assert got["status"] == "available", got


@pytest.mark.backends
async def test_claim_on_edit_refuses_when_another_claims_first(db: str, root: Path) -> None:
    """The look found the file free, but the claim on edit lost it: the claim's own answer
    names the holder (the claims lock decides, not the look)."""
    async with agent(db, root, "quick", other_host=True) as (quick, quick_id):
        await claim(quick, quick_id, "src/**/*.py")
        edit = gemini(root, "replace", file_path=str(root / "src/api/handlers.py"))
        why = refused("gemini", hook("gemini", edit, db, "--claim-on-edit"))
        assert "'quick'" in why


# -- inputs that write nothing, and failures --------------------------------------------------


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_a_call_that_writes_nothing_is_allowed_without_a_database(host: str, root: Path) -> None:
    reads = {
        "claude-code": claude(root, "Read", file_path=str(root / "src/a.py")),
        "codex": codex(root, "Bash", command="ls -la src"),
        "gemini": gemini(root, "read_file", file_path=str(root / "src/a.py")),
        "cursor": cursor(root, "Read", file_path=str(root / "src/a.py")),
    }
    allowed(hook(host, reads[host], str(root / "missing.db")))
    # never opened, so even a strict hook has nothing to say: Cursor's shell event included
    shells = [cursor_shell(root, "ls -la src")] if host == "cursor" else []
    for read in [reads[host], *shells]:
        done = hook(host, read, str(root / "missing.db"), "--on-error", "deny")
        allowed(done)
        assert done.stderr == "", done.stderr
    # the session's end without --claim-on-edit: nothing to do
    end = {"session_id": "s", "conversation_id": "s", "cwd": str(root),
           "hook_event_name": "SessionEnd" if host != "cursor" else "stop"}  # fmt: skip
    if host == "codex":
        end["hook_event_name"] = "Stop"
    allowed(hook(host, end, str(root / "missing.db")))


@pytest.mark.parametrize(
    "payload, said",
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"hook_event_name": "PreToolUse"}), "tool_name"),
        (json.dumps({"tool_name": "Write", "tool_input": "x"}), "not an object"),
    ],
)
def test_input_the_hook_cannot_read_is_allowed_with_one_line_or_refused_when_strict(
    payload: str, said: str, tmp_path: Path
) -> None:
    db = str(tmp_path / "x.db")
    done = hook("claude-code", payload, db)
    assert done.returncode == 0 and done.stdout == ""
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "allowed" in done.stderr and "Traceback" not in done.stderr
    strict = hook("claude-code", payload, db, "--on-error", "deny")
    assert said in refused("claude-code", strict)


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_a_database_that_cannot_answer_allows_by_default_and_refuses_when_strict(
    host: str, root: Path, tmp_path: Path
) -> None:
    payload = edits_of(root, "src/a.py")[host][0]
    for db in (str(tmp_path / "missing.db"), str(tmp_path)):  # none there; a directory
        done = hook(host, payload, db)
        allowed(done)
        assert done.stderr.count("\n") == 1 and "could not check the claims" in done.stderr
        strict = hook(host, payload, db, "--on-error", "deny")
        assert "could not check the claims" in refused(host, strict)
        assert "Traceback" not in strict.stderr
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"this is not a database" * 100)
    done = hook(host, payload, str(damaged))
    allowed(done)
    assert "could not check the claims" in done.stderr


def test_a_postgresql_server_that_cannot_be_reached_allows_the_edit(root: Path) -> None:
    url = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"
    payload = claude(root, "Write", file_path=str(root / "src/a.py"))
    done = hook("claude-code", payload, url)
    allowed(done)
    assert "could not check the claims" in done.stderr


@pytest.mark.parametrize(
    "args, said",
    [
        ([], "name the host"),
        (["vim"], "unknown host 'vim'"),
        (["codex", "--on-error", "maybe"], "--on-error"),
        (["codex", "--lease", "-5"], "--lease"),
        (["codex", "--lease", "soon"], "--lease"),
        (["codex", "--db"], "--db needs a value"),
        (["codex", "--frobnicate"], "unknown option"),
        (["codex", "gemini"], "unexpected argument"),
        (["codex", "--db", " "], "--db: an empty path"),
    ],
)
def test_a_wrong_command_line_is_one_line_and_status_2(args: list[str], said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agenthold", "hook", *args],
        input="{}", capture_output=True, text=True, env=child_env(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and said in done.stderr and done.stdout == ""
    assert "Traceback" not in done.stderr


def test_help_says_how_to_use_it_and_agenthold_help_lists_the_hook() -> None:
    done = subprocess.run([sys.executable, "-m", "agenthold", "hook", "--help"],
                          capture_output=True, text=True, env=child_env(), timeout=60)  # fmt: skip
    assert done.returncode == 0 and "agenthold hook install" in done.stdout
    top = subprocess.run([sys.executable, "-m", "agenthold", "--help"],
                         capture_output=True, text=True, env=child_env(), timeout=60)  # fmt: skip
    assert "hook" in top.stdout and "edit hook" in top.stdout
    from agenthold.cli.main import main as cli_main

    assert cli_main(["hook", "--help"]) == 0


def test_the_hook_finds_the_servers_default_database(tmp_path: Path) -> None:
    from agenthold.cli.main import database_path

    for environ in (
        {},
        {"XDG_STATE_HOME": str(tmp_path / "state")},
        {"XDG_STATE_HOME": "relative/ignored"},
        {"AGENTHOLD_DB": str(tmp_path / "env.db")},
        {"AGENTHOLD_DB": "~/x.db"},
    ):
        assert hook_command.database_path(None, environ) == database_path(None, environ)[0]
    assert hook_command.database_path("~/y.db", {}) == database_path("~/y.db", {})[0]
    for platform in ("darwin", "win32", "linux"):
        assert hook_command.state_directory({}, platform) == __import__(
            "agenthold.cli.main", fromlist=["state_directory"]
        ).state_directory({}, platform)


def import_trace(host: str, payload: dict[str, Any], db: str, *flags: str) -> list[str]:
    """The ``-X importtime`` lines of ``agenthold hook`` given ``payload``: each a module's
    name, indented two spaces a level below the module that imported it (which comes after)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "agenthold", "hook", host, "--db", db, *flags],
        input=json.dumps(payload), capture_output=True, text=True, env=child_env(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line.rsplit("|", 1)[-1][1:] for line in done.stderr.splitlines() if "|" in line]
    return lines[1:]  # less the header


def imports_of(host: str, payload: dict[str, Any], db: str, *flags: str) -> set[str]:
    """The modules ``agenthold hook`` imports for ``payload``."""
    return {line.strip() for line in import_trace(host, payload, db, *flags)}


def importers(trace: list[str], module: str) -> list[str]:
    """The chain of modules through which ``module`` was first imported, innermost first."""
    at = next(i for i, line in enumerate(trace) if line.strip() == module)
    depth = len(trace[at]) - len(trace[at].lstrip())
    chain = []
    for line in trace[at + 1 :]:
        indent = len(line) - len(line.lstrip())
        if indent < depth:
            chain.append(line.strip())
            depth = indent
    return chain


@pytest.mark.usefixtures("no_child_coverage")  # coverage itself loads what is counted
def test_the_hook_command_never_imports_mcp_nor_the_claims_coordinator(
    tmp_path: Path, root: Path
) -> None:
    db = str(tmp_path / "i.db")
    store = StateStore(db)
    resolver = Resolver([Workspace.parse(f"default={root}")])
    holder = Coordinator(store, resolver).register("other", host="another host").agent_id
    Coordinator(store, resolver).claim("src/b.py", holder)
    store.close()
    never = {"mcp", "agenthold.claims.coordinator", "agenthold.cli.main", "argparse"}
    for name in ("src/a.py", "src/b.py"):  # free, held: both looked at
        payload = claude(root, "Write", file_path=str(root / name))
        imported = imports_of("claude-code", payload, db)
        assert "agenthold.hooks.lookup" in imported  # the trace is read, not empty
        assert not never & imported, never & imported
    # the hook's own rooms (hooks, the claims' names, patterns and schema) make no dataclass,
    # and import neither dataclasses nor logging: what it still pays for them is the store's
    trace = import_trace("claude-code", claude(root, "Write", file_path=str(root / "src/b.py")), db)
    for heavy in ("dataclasses", "logging", "inspect"):
        if heavy in {line.strip() for line in trace}:
            assert "agenthold.store" in importers(trace, heavy), (heavy, importers(trace, heavy))
    # a shell command that writes nothing opens no database and parses only the command
    imported = imports_of("claude-code", claude(root, "Bash", command="ls src"), db)
    assert "agenthold.hooks.parse" in imported
    assert not {"agenthold.store", "sqlite3", "dataclasses"} & imported


@pytest.mark.usefixtures("no_child_coverage")  # coverage itself loads what is counted
def test_where_nothing_is_held_the_hook_answers_without_the_store(
    tmp_path: Path, root: Path
) -> None:
    db = str(tmp_path / "g.db")
    store = StateStore(db)
    resolver = Resolver([Workspace.parse(f"default={root}")])
    coordinator = Coordinator(store, resolver)
    holder = coordinator.register("other", host="another host").agent_id
    coordinator.claim("src/b.py", holder)
    coordinator.release("src/b.py", holder)  # claims once held, none now
    store.close()
    payload = claude(root, "Write", file_path=str(root / "src/b.py"))
    imported = imports_of("claude-code", payload, db)
    assert "agenthold.hooks.glance" in imported  # the trace is read, not empty
    lean = {"agenthold.store", "agenthold.claims.names", "agenthold.hooks.lookup", "mcp"}
    assert not lean & imported, lean & imported
    assert not {"dataclasses", "logging", "inspect"} & imported
    # strict mode and a claim on edit always open the store (glance.py says why)
    assert "agenthold.hooks.lookup" in imports_of("claude-code", payload, db, "--on-error", "deny")
    done = hook("claude-code", payload, db, "--claim-on-edit")
    allowed(done)
    assert glance.nothing_held(db) is False  # the edit claimed the file


def test_the_glance_says_nothing_is_held_only_when_it_is_sure(tmp_path: Path, root: Path) -> None:
    from agenthold.claims.schema import CLAIMS_SCHEMA
    from agenthold.store import APPLICATION_ID, SCHEMA_VERSION, STORE_SCHEMA

    assert (glance.APPLICATION_ID, glance.LAYOUT) == (APPLICATION_ID, SCHEMA_VERSION)
    versions = (STORE_SCHEMA.version, CLAIMS_SCHEMA.version)
    assert versions == (glance.STORE_VERSION, glance.CLAIMS_VERSION)
    db = str(tmp_path / "s.db")
    StateStore(db).close()
    assert glance.nothing_held(db)  # no claims tables: nothing held (the store reads 0)
    store = StateStore(db)
    resolver = Resolver([Workspace.parse(f"default={root}")])
    coordinator = Coordinator(store, resolver, claim_ttl=3600)
    holder = coordinator.register("other", host="another host").agent_id
    assert glance.nothing_held(db)  # the tables, an agent, no claim
    coordinator.claim("src/a.py", holder)
    assert not glance.nothing_held(db)
    with store.db.write() as (conn, _):  # its holder's lease ended, unswept: no live claim
        conn.execute("UPDATE agents SET lease_ends_at = 1.0 WHERE agent_id = ?", (holder,))
    assert glance.nothing_held(db)
    verdict = hook("claude-code", claude(root, "Write", file_path=str(root / "src/a.py")), db)
    allowed(verdict)
    assert verdict.stderr == ""
    with store.db.write() as (conn, _):
        conn.execute("UPDATE agents SET lease_ends_at = NULL WHERE agent_id = ?", (holder,))
    coordinator.release("src/a.py", holder)
    coordinator.claim("docs/x.md", holder, mode="shared")
    assert not glance.nothing_held(db)  # any shared hold: look
    coordinator.release("docs/x.md", holder)
    assert glance.nothing_held(db)
    with store.db.write() as (conn, _):  # a version this code does not read: look (and refuse)
        conn.execute(
            "UPDATE agenthold_components SET version = version + 1 WHERE component = 'claims'"
        )
    assert not glance.nothing_held(db)
    store.close()
    done = hook("claude-code", claude(root, "Write", file_path=str(root / "src/a.py")), db)
    allowed(done)
    assert "newer than this agenthold" in done.stderr
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE claims (x)").connection.close()
    assert not glance.nothing_held(str(other))  # not agenthold's: look (and say so)
    assert not glance.nothing_held(":memory:") and not glance.nothing_held("postgresql://x/y")


def test_the_reason_says_who_since_when_until_when_and_what_helps() -> None:
    from agenthold.hooks.lookup import Blocker

    now = 1_800_000_000.0
    at = "2027-01-15T08:00:00Z"  # 1_800_000_000 - 3000 s, give or take: a parseable instant
    b = Blocker("/w/a.py", "file://default/a.py", "agent-00", "alice", at, now + 125, "exclusive",
                "file://default/a.py")  # fmt: skip
    text = hook_command.reason([b, b], now)
    assert "'alice' (agent-00) has held it for 0s;" in text and "in 2m 05s" in text
    assert "agenthold_wait with resource 'file://default/a.py'" in text
    forever = Blocker("/w/a.py", "u", "agent-01", "bo", None, None, "link", "/w/a.py")
    text = hook_command.reason([forever], now)
    assert "no end" in text and "hard link" in text
    assert hook_command._held_for("not a time", now) == ""
    assert hook_command._ago(7300) == "2h 01m"
