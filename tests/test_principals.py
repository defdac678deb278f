"""Principals and the token file: scopes, ``agenthold token …``, the constant-time table, and
the HTTP server reading the file again when it changes (real uvicorn on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from support import REPO, free_port, sdk_client, uvicorn_serving
from test_auth import MODERN_META

from agenthold.claims import Coordinator, ForeignAgentError
from agenthold.cli.main import ServeOptions, UsageError, build_parser, serve_options
from agenthold.identity.principals import (
    SHARED,
    AuthFileError,
    ForbiddenError,
    Principal,
    Scopes,
    Table,
    TokenTable,
    add_token,
    digest,
    load_file,
    require_claim,
    require_namespace,
    require_thread,
    require_tool_set,
    revoke,
)
from agenthold.serve.app import Agenthold
from agenthold.serve.http import http_app
from agenthold.store import StateStore

pytestmark = pytest.mark.anyio


def agenthold(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthold", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )


# --------------------------------------------------------------------------------------------
# Scopes
# --------------------------------------------------------------------------------------------


def test_a_principal_without_scopes_may_do_everything() -> None:
    s = Scopes.parse([])
    assert s.everything
    assert all(s.may_use(t) for t in ("standard", "advanced", "messages"))
    assert s.may_read("x") and s.may_write("x") and s.may_claim("file:///a", "default")
    assert s.may_read_thread("t") and s.may_write_thread("t")


def test_each_kind_of_scope_limits_only_its_own_kind() -> None:
    s = Scopes.parse(["write:team-a/*", "read:shared", "claim:repo", "claim:lock:deploy-*"])
    assert s.may_write("team-a/x") and s.may_read("team-a/x/y")
    assert s.may_read("shared") and not s.may_write("shared")
    assert not s.may_read("team-b/x") and not s.may_write("team-b/x")
    assert s.may_claim("file:///r/a.py", "repo") and not s.may_claim("file:///o/a.py", "other")
    assert s.may_claim("lock:deploy-prod", None) and not s.may_claim("lock:other", None)
    assert s.may_use("messages") and s.may_write_thread("any")  # kinds not named: not limited


def test_tool_sets_and_threads_are_limited_by_their_scopes() -> None:
    s = Scopes.parse(["tools:standard,messages", "thread-read:news", "thread-write:team-*"])
    assert s.may_use("standard") and s.may_use("messages") and not s.may_use("advanced")
    assert s.may_read_thread("news") and not s.may_write_thread("news")
    assert s.may_read_thread("team-a") and s.may_write_thread("team-a")
    assert not s.may_read_thread("other")
    only_read = Scopes.parse(["read:a"])
    assert only_read.may_read("a") and not only_read.may_write("a")


@pytest.mark.parametrize(
    "scope", ["", "tools", "tools:", "tools:all", "read:", "delete:x", "write", 7, "x" * 600]
)
def test_a_bad_scope_is_refused_naming_it(scope: Any) -> None:
    with pytest.raises(AuthFileError, match=r"scope|tool set"):
        Scopes.parse([scope])


# --------------------------------------------------------------------------------------------
# The token file and its commands
# --------------------------------------------------------------------------------------------


def test_token_add_prints_the_token_alone_on_the_last_line_and_stores_only_its_digest(
    tmp_path: Path,
) -> None:
    done = agenthold("token", "add", "alice", "--auth-file", "tokens.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    token = done.stdout.splitlines()[-1]
    assert token.startswith("aht_") and len(token) > 40
    assert "alice" in done.stderr and token not in done.stderr
    path = tmp_path / "tokens.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert token not in text
    assert hashlib.sha256(token.encode()).hexdigest() in text
    [entry] = load_file(path)
    assert (entry.name, len(entry.tokens), entry.scopes) == ("alice", 1, [])


def test_token_list_and_revoke(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    add_token(path, "alice")
    add_token(path, "ci", ["tools:standard", "claim:repo"])
    add_token(path, "ci")  # a second token, for rotation: the scopes stay
    listed = agenthold("token", "list", "--auth-file", str(path), cwd=tmp_path)
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[1:] == [
        "alice       1  (everything)",
        "ci          2  tools:standard claim:repo",
    ]
    as_json = agenthold("token", "list", "--json", "--auth-file", str(path), cwd=tmp_path)
    rows = json.loads(as_json.stdout)
    assert [(r["name"], r["tokens"], r["scopes"]) for r in rows] == [
        ("alice", 1, []),
        ("ci", 2, ["tools:standard", "claim:repo"]),
    ]
    assert "sha256" not in as_json.stdout
    gone = agenthold("token", "revoke", "ci", "--auth-file", str(path), cwd=tmp_path)
    assert gone.returncode == 0 and "2 token" in gone.stderr
    assert [e.name for e in load_file(path)] == ["alice"]
    again = agenthold("token", "revoke", "ci", "--auth-file", str(path), cwd=tmp_path)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "no principal named 'ci'" in again.stderr
    assert revoke(path, "alice") == 1
    empty = agenthold("token", "list", "--auth-file", str(path), cwd=tmp_path)
    assert empty.stdout == "no principals\n"


def test_the_readmes_team_setup_writes_each_token_file_for_its_owner_alone(
    tmp_path: Path,
) -> None:
    """docs/http.md's `token add` lines, run by bash as printed (the token file moved into
    tmp_path) from a shell whose umask is the usual 022: the .token files, which hold the
    tokens in plain text, are created 0600 like the token file, and hold the tokens whose
    digests the file lists."""
    page = (REPO / "docs" / "http.md").read_text(encoding="utf-8")
    section = page.split("\n## A shared server for a team", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if "token add" in line]
    assert len(lines) == 2
    script = "\n".join(
        ["umask 022", f'agenthold() {{ "{sys.executable}" -m agenthold "$@"; }}']
        + [line.replace("/srv/tokens.json", str(tmp_path / "tokens.json")) for line in lines]
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    digests = {t["sha256"] for e in load_file(tmp_path / "tokens.json") for t in e.tokens}
    for name in ("alice.token", "ci.token", "tokens.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    for name in ("alice.token", "ci.token"):
        token = (tmp_path / name).read_text().strip().encode()
        assert digest(token).hex() in digests, name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["token", "add", "bad name"], "not a principal name"),
        (["token", "add", "a", "--scope", "all"], "is not a scope"),
        (["token", "list"], "--auth-file PATH is required"),
        (["token", "revoke", "x"], "no such file"),
    ],
)
def test_token_commands_fail_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    extra = [] if args == ["token", "list"] else ["--auth-file", str(tmp_path / "t.json")]
    done = agenthold(*args, *extra, cwd=tmp_path)
    assert done.returncode in (1, 2)
    assert (
        done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr
    )
    assert not (tmp_path / "t.json").exists()


def test_token_commands_never_import_mcp(tmp_path: Path) -> None:
    """add, list and revoke, each run to its end in one process that never loads mcp."""
    path = str(tmp_path / "t.json")
    code = (
        "import sys; from agenthold.cli.main import main; "
        f"main(['token', 'add', 'a', '--auth-file', {path!r}]); "
        f"main(['token', 'add', 'b', '--auth-file', {path!r}]); "
        f"main(['token', 'revoke', 'a', '--auth-file', {path!r}]); "
        f"main(['token', 'list', '--auth-file', {path!r}]); "
        "assert not [m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')], 'mcp'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "revoked principal 'a'" in done.stderr
    assert [e.name for e in load_file(Path(path))] == ["b"]  # the revoke did run


MALFORMED = [
    ("{", "not JSON"),
    ("[]", "not a token file"),
    ('{"version": 2, "principals": {}}', "version 2"),
    ('{"version": 1, "principals": {}, "extra": 1}', "unknown key 'extra'"),
    ('{"version": 1, "principals": []}', '"principals" must be an object'),
    ('{"version": 1, "principals": {"a b": {"tokens": []}}}', "not a principal name"),
    ('{"version": 1, "principals": {"a": {"tokens": []}}}', "at least one token"),
    ('{"version": 1, "principals": {"a": {"tokens": [{"sha256": "ab"}]}}}', "64 lowercase hex"),
    (
        '{"version": 1, "principals": {"a": {"tokens": [{"sha256": "' + "a" * 64 + '"}],'
        ' "scope": []}}}',
        "unknown key 'scope'",
    ),
    (
        '{"version": 1, "principals": {"a": {"tokens": [{"sha256": "' + "a" * 64 + '"}],'
        ' "scopes": ["everything"]}}}',
        "'everything' is not a scope",
    ),
    (
        '{"version": 1, "principals": {"a": {"tokens": [{"sha256": "' + "a" * 64 + '"}]},'
        ' "b": {"tokens": [{"sha256": "' + "a" * 64 + '"}]}}}',
        "also listed for 'a'",
    ),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED)
def test_a_malformed_token_file_is_refused_at_start_with_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(UsageError, match="--auth-file") as refused:
        serve_options(build_parser().parse_args(http_args("t.json", tmp_path)), {})
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_command_refuses_a_malformed_token_file_before_opening_anything(
    tmp_path: Path,
) -> None:
    (tmp_path / "t.json").write_text('{"version": 1, "principals": {"a": 1}}')
    done = agenthold("--db", "s.db", *http_args("t.json", tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "principal 'a'" in done.stderr
    assert not (tmp_path / "s.db").exists()
    missing = agenthold("--db", "s.db", *http_args("none.json", tmp_path), cwd=tmp_path)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def http_args(auth_file: str, tmp_path: Path) -> list[str]:
    return ["--transport", "http", "--claim-ttl", "60", "--auth-file", str(tmp_path / auth_file)]


def test_a_token_file_others_can_read_or_change_is_a_startup_warning(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    add_token(path, "a")

    def warnings() -> list[str]:
        parsed = build_parser().parse_args(http_args("t.json", tmp_path))
        return [w for w in serve_options(parsed, {})[1] if "token file" in w]

    assert warnings() == []
    path.chmod(0o644)
    assert ["readable by every user" in w for w in warnings()] == [True]
    path.chmod(0o666)
    assert ["can be changed by other users" in w for w in warnings()] == [True]
    path.chmod(0o600)
    add_token(path, "b")  # a rewrite keeps the file's mode
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_empty_token_file_is_a_startup_warning(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"version": 1, "principals": {}}')
    parsed = build_parser().parse_args(http_args("t.json", tmp_path))
    opts, warnings = serve_options(parsed, {})
    assert opts.auth_file is not None
    assert any("lists no principal" in w for w in warnings)


def test_the_auth_file_applies_to_http_only(tmp_path: Path) -> None:
    parsed = build_parser().parse_args(["--auth-file", "nowhere.json"])
    opts, warnings = serve_options(parsed, {})
    assert opts.auth_file is None
    assert any("--auth-file only applies with --transport http" in w for w in warnings)


# --------------------------------------------------------------------------------------------
# The table: every entry compared, whichever matches
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("presented", ["t0", "t500", "t999", "none-of-them"])
def test_every_entry_is_compared_in_one_pass_whichever_matches(
    presented: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    people = [Principal(f"p{i}") for i in range(1000)]
    table = Table((digest(f"t{i}".encode()), people[i]) for i in range(1000))
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    found = table.match(digest(presented.encode()))
    expected = None if presented == "none-of-them" else people[int(presented[1:])]
    assert found is expected
    # One comparison of every entry's digest (and a spare one), the same whatever matched.
    [(probe, everything)] = compared
    assert len(probe) == len(everything) == 1001 * 32
    for i in range(1000):
        assert everything[32 * i : 32 * i + 32] == digest(f"t{i}".encode())


# --------------------------------------------------------------------------------------------
# Over HTTP: principals, reloading, a broken file
# --------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, auth_file: Path, tokens: list[str] | None = None
) -> AsyncIterator[str]:
    with StateStore(tmp_path / "state.db") as store:
        app = Agenthold(Coordinator(store), tools="advanced", disconnect_grace=0.3)
        opts = ServeOptions(
            transport="http",
            tools="advanced",
            auth_tokens=tokens or [],
            auth_file=TokenTable(auth_file),
        )
        async with uvicorn_serving(app, http_app(app, opts), path=opts.path) as web:
            yield web.url


def list_request() -> tuple[dict[str, Any], dict[str, str]]:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": MODERN_META}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/list",
    }
    return body, headers


async def status_with(http: httpx2.AsyncClient, url: str, token: str) -> int:
    body, headers = list_request()
    reply = await http.post(url, json=body, headers={**headers, "Authorization": f"Bearer {token}"})
    return reply.status_code


async def test_added_and_revoked_tokens_count_from_the_next_request(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    alice, _ = add_token(path, "alice")
    async with (
        serving(tmp_path, path, ["shared-token-1"]) as url,
        httpx2.AsyncClient(timeout=10) as http,
    ):
        assert await status_with(http, url, alice) == 200
        assert await status_with(http, url, "shared-token-1") == 200
        bob, _ = add_token(path, "bob")
        assert await status_with(http, url, bob) == 200
        revoke(path, "alice")
        assert await status_with(http, url, alice) == 401
        assert await status_with(http, url, bob) == 200
        path.write_text("{ not json")  # broken: its principals are refused, loudly
        broken = await http.post(
            url,
            json=list_request()[0],
            headers={**list_request()[1], "Authorization": f"Bearer {bob}"},
        )
        assert broken.status_code == 503 and broken.json()["error"] == "auth_file_unusable"
        assert await status_with(http, url, "shared-token-1") == 200  # not in the file
        assert await status_with(http, url, "nobody") == 503
        path.write_text("")
        path.unlink()
        assert await status_with(http, url, bob) == 503
        carol, _ = add_token(path, "carol")  # fixed: back to normal
        assert await status_with(http, url, carol) == 200
        assert await status_with(http, url, bob) == 401


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_sdk_clients_of_both_eras_connect_with_a_principal_token(
    tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "t.json"
    token, _ = add_token(path, "alice")
    async with serving(tmp_path, path) as url:
        headers = {"Authorization": f"Bearer {token}"}
        async with sdk_client(url, mode=mode, headers=headers) as client:
            tools = await client.list_tools()
            assert tools.tools


def test_the_shared_principal_cannot_be_named_in_a_token_file() -> None:
    with pytest.raises(AuthFileError):
        add_token("/nonexistent/never.json", SHARED.name)


async def test_the_token_file_never_reaches_the_log(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    token, _ = add_token(path, "alice")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthold", "--db", str(tmp_path / "state.db"), "--tools",
         "advanced", "--port", str(port), *http_args("t.json", tmp_path), "--log-level", "debug"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with httpx2.AsyncClient(timeout=10) as http:
            deadline = time.monotonic() + 20
            while True:
                try:
                    await http.post(url, json={})
                    break
                except httpx2.ConnectError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    await anyio.sleep(0.05)
            assert await status_with(http, url, token) == 200
            second, _ = add_token(path, "bob")
            assert await status_with(http, url, second) == 200
            path.write_text("{broken")
            assert await status_with(http, url, second) == 503
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert "DEBUG" in err and "read again" in err and "cannot be used" in err
    for secret in (token, second, digest(token.encode()).hex(), digest(second.encode()).hex()):
        assert secret not in err and secret not in out
    assert "{broken" not in err
    assert os.path.exists(path)


def test_refusals_name_the_missing_scope_and_trusted_callers_pass() -> None:
    p = Principal("p", Scopes.parse(["tools:messages", "thread-read:news", "claim:repo"]))
    checks = [
        (lambda: require_tool_set(p, "advanced", "agenthold_get"), "tools:advanced"),
        (lambda: require_namespace(p, "n", write=True), None),  # namespaces not limited
        (lambda: require_thread(p, "news", write=True), "thread-write:news"),
        (lambda: require_thread(p, "other", write=False), "thread-read:other"),
        (lambda: require_claim(p, "lock:x", None), "claim:lock:x"),
        (lambda: require_claim(p, "file://other/a", "other"), "claim:other"),
    ]
    for check, scope in checks:
        if scope is None:
            check()
            continue
        with pytest.raises(ForbiddenError) as refused:
            check()
        assert refused.value.scope == scope and scope in str(refused.value)
    require_thread(p, "news", write=False)
    require_claim(p, "file://repo/a", "repo")
    for trusted in (None, SHARED):
        require_tool_set(trusted, "advanced", "agenthold_get")
        require_namespace(trusted, "n", write=True)
        require_thread(trusted, "t", write=True)
        require_claim(trusted, "lock:x", None)


# --------------------------------------------------------------------------------------------
# The binding in the library, on both backends
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_the_library_refuses_a_foreign_principal_and_records_who_did_what(
    store: StateStore,
) -> None:
    """What the tools rely on, checked below them on SQLite and PostgreSQL: an agent belongs
    to the principal that registered it; claim, release and a wait with claim from another
    principal raise ForeignAgentError naming no owner and change nothing (no claim, event or
    lease renewal); history and claim events record the principal beside the free-text name."""
    coord = Coordinator(store)
    agent = coord.register("alice-agent", principal="alice").agent_id
    coord.claim("custom://deploy", agent, principal="alice")

    def snapshot() -> Any:
        with store.db.snapshot() as conn:
            events, _ = coord.read_log(conn)
        return events, [c.to_dict() for c in coord.list_claims()], coord.list_agents()

    before = snapshot()
    refused: list[Any] = [
        lambda: coord.claim("custom://other", agent, principal="bob"),
        lambda: coord.claim("custom://deploy", agent, mode="shared", principal="bob"),
        lambda: coord.claim_many(["custom://a", "custom://b"], agent, principal="bob"),
        lambda: coord.release("custom://deploy", agent, principal="bob"),
        lambda: coord.release("custom://deploy", agent, "deleted", principal="bob"),
        lambda: coord.release_many([("custom://deploy", "released", None)], agent,
                                   principal="bob"),
        lambda: coord.wait("custom://free", 0.0, agent_id=agent, claim=True, principal="bob"),
        lambda: coord.wait("custom://deploy", 0.1, agent_id=agent, claim=True, principal="bob"),
    ]  # fmt: skip
    for attempt in refused:
        with pytest.raises(ForeignAgentError) as caught:
            attempt()
        assert "belongs to another caller" in str(caught.value)
        assert "alice" not in str(caught.value)
    assert snapshot() == before
    assert coord.status("custom://deploy").holder.agent_id == agent  # type: ignore[union-attr]
    coord.release("custom://deploy", agent, principal="alice")  # its own principal may

    store.set("n", "k", 1, updated_by="says-bob", principal="alice")
    store.set("n", "k", 2, updated_by="local", expected_version=1)  # trusted: no principal
    store.delete("n", "k", deleted_by="cleanup", principal="bob")
    history = store.history("n", "k")
    assert [(h.updated_by, h.principal) for h in history] == [
        ("cleanup", "bob"),
        ("local", None),
        ("says-bob", "alice"),
    ]
    with store.db.snapshot() as conn:
        state, _ = store.read_log(conn, None)
        claims, _ = coord.read_log(conn)
    assert [(r[5], r[-1]) for r in state] == [
        ("says-bob", "alice"),
        ("local", None),
        ("cleanup", "bob"),
    ]
    assert [(r[2], r[3], r[-1]) for r in claims] == [
        (agent, "registered", "alice"),
        (agent, "claimed", "alice"),
        (agent, "released", "alice"),
    ]


def test_a_token_file_changed_within_a_timestamp_tick_is_read_again(tmp_path: Path) -> None:
    """An edit that leaves size, inode and timestamps as they were (a second edit within the
    file system's tick) is still seen: a file changed under RACY_NS ago is read at every call."""
    path = tmp_path / "tokens.json"
    add_token(path, "a")
    table = TokenTable(path)
    second, _ = add_token(path, "a")
    table._signature = table._stat()  # as if the stat saw nothing change
    current = table.current()
    assert current is not None and len(current) == 2  # the second token was read
    assert current.match(digest(second.encode())) is not None
    old = time.time() - 10
    os.utime(path, (old, old))
    table.current()
    assert not table._is_racy(table._signature)  # an old file costs one stat again


# What each racing process runs: its own principals added and every other one of them revoked,
# and a token added to one principal that every process shares, through the real command
# (``agenthold token …``'s code, in-process, to spare an interpreter start per command). It
# waits for "go" on stdin so that all start together, and prints what each command reported.
RACER = r"""
import contextlib, io, sys
from agenthold.cli.main import main

path, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.stdin.readline()
for r in range(rounds):
    for name in (f"{me}-{r}", "shared"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = main(["token", "add", name, "--auth-file", path])
        assert status == 0, status
        print("add", name, out.getvalue().split()[-1], flush=True)
    if r % 2:
        with contextlib.redirect_stderr(io.StringIO()):
            status = main(["token", "revoke", f"{me}-{r - 1}", "--auth-file", path])
        assert status == 0, status
        print("revoke", f"{me}-{r - 1}", flush=True)
"""


def race_token_commands(path: Path, processes: int, rounds: int) -> list[list[str]]:
    """Run ``processes`` racers of ``rounds`` rounds at once; the lines each one reported."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(path), f"p{n}", str(rounds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(processes)
    ]
    for racer in racers:  # each is importing agenthold meanwhile; the first "go" starts it
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    reported = []
    for racer in racers:
        out, err = racer.communicate(timeout=300)
        assert racer.returncode == 0, err
        reported.append([line for line in out.splitlines() if line])
    return reported


async def test_token_adds_and_revokes_racing_in_several_processes_all_hold(
    tmp_path: Path,
) -> None:
    """Concurrent ``token add`` and ``token revoke`` commands serialise on the file's lock:
    every reported add is there at the end, every reported revoke is gone, and a running
    server refuses each revoked token and accepts each remaining one."""
    path = tmp_path / "tokens.json"
    seed, _ = add_token(path, "seed")
    processes, rounds = 4, 30
    async with serving(tmp_path, path) as url, httpx2.AsyncClient(timeout=30) as http:
        assert await status_with(http, url, seed) == 200
        reported = await anyio.to_thread.run_sync(race_token_commands, path, processes, rounds)
        added: dict[str, list[str]] = {}
        revoked: dict[str, list[str]] = {}
        for lines in reported:
            assert len(lines) == rounds * 2 + rounds // 2  # every command reported
            for line in lines:
                verb, name, *token = line.split()
                if verb == "add":
                    added.setdefault(name, []).append(token[0])
                else:
                    revoked[name] = added[name]
        entries = {e.name: e for e in load_file(path)}
        assert set(entries) == {"seed", *added} - set(revoked)
        for name, tokens in added.items():
            if name not in revoked:
                stored = {t["sha256"] for t in entries[name].tokens}
                assert stored == {digest(t.encode()).hex() for t in tokens}, name
        assert len(entries["shared"].tokens) == processes * rounds
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(Path(f"{path}.lock").stat().st_mode) == 0o600
        for name, tokens in revoked.items():
            assert await status_with(http, url, tokens[0]) == 401, name
        for name in ("seed", "shared", "p0-29", "p3-29"):
            token = seed if name == "seed" else added[name][-1]
            assert await status_with(http, url, token) == 200, name
        assert sorted(os.listdir(tmp_path)) == sorted(
            ["tokens.json", "tokens.json.lock", *(p.name for p in tmp_path.glob("state.db*"))]
        )  # no temporary file left behind
