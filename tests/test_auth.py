"""Bearer tokens on the HTTP transport: who gets in, what the others get, and what never leaks.

The middleware is exercised three ways: directly as an ASGI app in front of a small recording
app (every header form, quickly), in front of agenthold's real HTTP application on uvicorn (raw
requests and SDK clients with headers), and through the ``agenthold`` command, for the
AGENTHOLD_AUTH_TOKEN variable, the refusal of blank tokens and the logs.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from support import STARTUP, free_port, run_agenthold, sdk_client, uvicorn_serving

from agenthold.claims import Coordinator
from agenthold.cli.main import ServeOptions, UsageError, build_parser, serve_options
from agenthold.serve.app import Agenthold
from agenthold.serve.auth import (
    UNAUTHORIZED,
    BearerAuth,
    LoopbackOrigins,
    is_loopback,
    usable_tokens,
)
from agenthold.serve.http import http_app
from agenthold.store import StateStore

TOKENS = ["first-token-1234", "second-token-5678"]
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "0"},
}

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------------------------------------
# The middleware on its own
# --------------------------------------------------------------------------------------------


class Recorder:
    """An ASGI app that answers 200 and remembers the scopes that reached it."""

    def __init__(self) -> None:
        self.reached: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached.append(scope["type"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})


async def ask(
    auth: BearerAuth, authorization: bytes | None
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One HTTP request through ``auth``: (status, headers, body)."""
    headers = [] if authorization is None else [(b"authorization", authorization)]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await auth(scope, receive, send)
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


@pytest.mark.parametrize(
    "header",
    [
        b"Bearer first-token-1234",
        b"Bearer second-token-5678",
        b"bearer first-token-1234",
        b"BEARER first-token-1234",
        b"bEaReR first-token-1234",
        b"Bearer    first-token-1234",  # RFC 7235 allows one or more spaces after the scheme
        b"  Bearer first-token-1234  ",
    ],
)
async def test_a_configured_token_gets_through_with_any_case_of_the_scheme(header: bytes) -> None:
    inner = Recorder()
    status, _, body = await ask(BearerAuth(inner, TOKENS), header)
    assert (status, body, inner.reached) == (200, b"ok", ["http"])


@pytest.mark.parametrize(
    "header",
    [
        None,
        b"",
        b"Bearer",
        b"Bearer ",
        b"Bearer wrong-token",
        b"Bearer first-token-123",  # a prefix
        b"Bearer first-token-12345",  # a longer token
        b"Bearer first-token-1234 extra",  # a space inside what would be the token
        b"Bearer first token-1234",
        b"Bearer\tfirst-token-1234",  # the scheme is separated by spaces only
        b"Bearerfirst-token-1234",
        b"Basic first-token-1234",
        b"Token first-token-1234",
        b"first-token-1234",
        b"Bearer first-token-1234,second-token-5678",
        b"Bearer \xff\xfe",
    ],
)
async def test_anything_but_a_configured_bearer_token_gets_401_before_the_app(
    header: bytes | None,
) -> None:
    inner = Recorder()
    status, headers, body = await ask(BearerAuth(inner, TOKENS), header)
    assert status == 401
    assert inner.reached == []
    assert headers[b"www-authenticate"] == b"Bearer"
    assert headers[b"content-type"] == b"application/json"
    assert json.loads(body)["error"] == "unauthorized"
    assert int(headers[b"content-length"]) == len(body)


async def test_the_401_body_is_short_and_names_no_token() -> None:
    _, _, body = await ask(BearerAuth(Recorder(), TOKENS), b"Bearer first-token-123")
    assert body == UNAUTHORIZED and len(body) < 200
    assert not any(token.encode() in body for token in TOKENS)
    assert b"first-token-123" not in body  # nor the one presented


async def test_configured_tokens_are_trimmed_and_blanks_dropped() -> None:
    inner = Recorder()
    auth = BearerAuth(inner, ["  spaced-token  ", "", "   ", "\tother\n"])
    assert (await ask(auth, b"Bearer spaced-token"))[0] == 200
    assert (await ask(auth, b"Bearer other"))[0] == 200
    assert (await ask(auth, b"Bearer   "))[0] == 401
    assert usable_tokens(["  a ", "", " ", "b"]) == ["a", "b"]


@pytest.mark.parametrize(
    "presented",
    [b"Bearer first", b"Bearer middle", b"Bearer last", b"Bearer none-of-them", b"Basic x", b""],
)
def test_every_configured_token_is_compared_whichever_matches(
    presented: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = BearerAuth(Recorder(), ["first", "middle", "last"])
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    accepted = auth.accepts(presented)
    assert accepted is (presented in (b"Bearer first", b"Bearer middle", b"Bearer last"))
    # Three comparisons of equal-length digests every time: the work done does not tell which
    # token matched, or whether one did.
    assert len(compared) == 3
    assert {len(a) for a, b in compared} == {len(b) for a, b in compared} == {32}


@pytest.mark.parametrize("tokens", [[], [""], ["  ", "\t"]])
def test_middleware_without_a_usable_token_refuses_to_be_built(tokens: list[str]) -> None:
    with pytest.raises(ValueError, match="non-blank token"):
        BearerAuth(Recorder(), tokens)


async def test_a_websocket_without_a_token_is_closed_before_the_handshake() -> None:
    """With a WebSocket library installed, uvicorn hands upgrades over as websocket scopes,
    which cannot take an HTTP response: the refusal is a close (uvicorn answers 403)."""
    inner = Recorder()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/mcp", "headers": [(b"authorization", b"Bearer no")]}
    await BearerAuth(inner, TOKENS)(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert inner.reached == []


async def test_lifespan_events_pass_without_a_token() -> None:
    inner = Recorder()
    auth = BearerAuth(inner, TOKENS)

    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.startup"}

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("the recorder sends nothing for lifespan")

    await auth({"type": "lifespan"}, receive, send)
    assert inner.reached == ["lifespan"]


# --------------------------------------------------------------------------------------------
# In front of the real server
# --------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, tokens: list[str], **options: Any) -> AsyncIterator[str]:
    """agenthold's advanced tools with ``tokens`` on uvicorn; yields the endpoint URL."""
    with StateStore(tmp_path / "state.db") as store:
        app = Agenthold(Coordinator(store), tools="advanced", disconnect_grace=0.3)
        opts = ServeOptions(transport="http", tools="advanced", auth_tokens=tokens, **options)
        async with uvicorn_serving(app, http_app(app, opts), path=opts.path) as web:
            yield web.url


def connect(
    url: str, token: str | None, mode: str = "auto", statuses: list[int] | None = None
) -> contextlib.AbstractAsyncContextManager[Client]:
    """An SDK client sending ``token``; the HTTP status of each answer goes to ``statuses``."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return sdk_client(url, mode=mode, headers=headers, statuses=statuses)


def set_request(key: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A raw 2026-07-28 tools/call of agenthold_set (body and headers): a write, if let in."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "agenthold_set",
            "arguments": {
                "namespace": "n",
                "key": key,
                "value": 1,
                "updated_by": "raw",
                "force": True,
            },
            "_meta": MODERN_META,
        },
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "agenthold_set",
    }
    return body, headers


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", "Basic first-token-1234", "Bearer first-token-1234 x", "Bearer"],
    ids=["no header", "wrong token", "wrong scheme", "space inside the token", "no token"],
)
async def test_a_refused_request_does_no_database_work(
    tmp_path: Path, authorization: str | None
) -> None:
    async with serving(tmp_path, TOKENS) as url, httpx2.AsyncClient(timeout=10) as http:
        body, headers = set_request("refused")
        extra = {} if authorization is None else {"Authorization": authorization}
        refused = await http.post(url, json=body, headers={**headers, **extra})
        body, headers = set_request("accepted")
        accepted = await http.post(
            url, json=body, headers={**headers, "Authorization": "Bearer first-token-1234"}
        )
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"] == "unauthorized"
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["result"]["structuredContent"]["status"] == "ok"
    with StateStore(tmp_path / "state.db") as store:
        assert [r.key for r in store.list_keys("n")] == ["accepted"]


async def test_extra_spaces_before_the_token_and_any_case_of_bearer_pass_over_http(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, TOKENS) as url, httpx2.AsyncClient(timeout=10) as http:
        body, headers = set_request("spaced")
        reply = await http.post(
            url, json=body, headers={**headers, "Authorization": "bEARER   second-token-5678"}
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["structuredContent"]["status"] == "ok"


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT", "OPTIONS"])
async def test_every_method_and_path_needs_the_token(tmp_path: Path, method: str) -> None:
    async with serving(tmp_path, TOKENS) as url, httpx2.AsyncClient(timeout=10) as http:
        on_endpoint = await http.request(method, url)
        elsewhere = await http.request(method, url.replace("/mcp", "/other"))
    assert (on_endpoint.status_code, elsewhere.status_code) == (401, 401)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_sdk_clients_of_both_eras_work_with_any_configured_token(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path, [" first-token-1234 ", "second-token-5678"]) as url:
        for n, token in enumerate(TOKENS):
            async with connect(url, token, mode) as client:
                await client.list_tools()
                done = await client.call_tool(
                    "agenthold_set",
                    {
                        "namespace": "n",
                        "key": f"k{n}",
                        "value": n,
                        "updated_by": "t",
                        "force": True,
                    },
                )
                assert done.structured_content is not None
                assert done.structured_content["status"] == "ok"


async def test_an_sdk_client_without_the_token_cannot_connect(tmp_path: Path) -> None:
    statuses: list[int] = []
    async with serving(tmp_path, TOKENS) as url:
        with pytest.raises(Exception) as refused:  # the SDK wraps it in groups
            async with connect(url, "not-the-token", "legacy", statuses) as client:
                await client.list_tools()
    assert statuses and set(statuses) == {401}
    assert "not-the-token" not in repr(refused.value)


# --------------------------------------------------------------------------------------------
# Configuration: flags, the variable, blank tokens
# --------------------------------------------------------------------------------------------


def options(*argv: str, env: dict[str, str] | None = None) -> ServeOptions:
    return serve_options(build_parser().parse_args(list(argv)), env or {})[0]


def test_tokens_come_from_flags_and_the_comma_separated_variable() -> None:
    opts = options(
        "--transport", "http", "--auth-token", " flag-token ",
        env={"AGENTHOLD_AUTH_TOKEN": "env-one, env-two ,,"},
    )  # fmt: skip
    assert opts.auth_tokens == ["flag-token", "env-one", "env-two"]


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--auth-token", " "], {}),
        (["--auth-token", ""], {"AGENTHOLD_AUTH_TOKEN": " , "}),
        ([], {"AGENTHOLD_AUTH_TOKEN": ""}),
        ([], {"AGENTHOLD_AUTH_TOKEN": ",,"}),
    ],
)
def test_tokens_requested_but_all_blank_refuse_to_serve(
    argv: list[str], env: dict[str, str]
) -> None:
    with pytest.raises(UsageError, match="every token is blank"):
        options("--transport", "http", *argv, env=env)


def test_the_command_refuses_blank_tokens_with_one_line(tmp_path: Path) -> None:
    done = run_agenthold(
        tmp_path, "--transport", "http", "--port", "1", env={"AGENTHOLD_AUTH_TOKEN": " , "}
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 2
    assert len(lines) == 1 and "every token is blank" in lines[0], lines
    assert not (tmp_path / "state.db").exists()  # refused before anything was opened


async def test_the_variable_protects_a_served_command_and_no_token_reaches_the_log(
    tmp_path: Path,
) -> None:
    secret = "env-secret-9f8e7d"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthold", "--db", str(tmp_path / "state.db"), "--tools",
         "advanced", "--transport", "http", "--port", str(port), "--claim-ttl", "60",
         "--log-level", "debug"],
        cwd=tmp_path,
        env={**os.environ, "AGENTHOLD_AUTH_TOKEN": f"other-token,{secret}"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        # The socket listens before the application is built, which takes seconds on a loaded
        # machine: the first request waits for that, so it gets the start-up allowance.
        async with httpx2.AsyncClient(timeout=STARTUP) as http:
            deadline = time.monotonic() + STARTUP
            while True:  # until it listens
                try:
                    first = await http.post(url, json={})
                    break
                except httpx2.ConnectError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    await anyio.sleep(0.05)
            wrong = await http.post(url, json={}, headers={"Authorization": f"Bearer {secret}x"})
        async with connect(url, secret, "legacy") as client:
            await client.list_tools()
            done = await client.call_tool(
                "agenthold_set",
                {"namespace": "n", "key": "k", "value": 1, "updated_by": "t", "force": True},
            )
            assert done.structured_content is not None
            reply = json.dumps(done.structured_content)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=STARTUP)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (first.status_code, wrong.status_code) == (401, 401)
    assert proc.returncode == 0
    assert secret not in err and secret not in out and "other-token" not in err
    assert "DEBUG" in err  # the log was as talkative as it gets
    assert secret not in reply


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LocalHost", True),
        ("app.localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("::", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_is_loopback_knows_this_machine_by_name_and_address(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("origin", "accepted"),
    [
        (None, True),
        (b"http://localhost:6274", True),
        (b"https://127.0.0.1", True),
        (b"http://[::1]:8417", True),
        (b"http://evil.example", False),
        (b"http://localhost.evil.example", False),
        (b"null", False),
        (b"http://[broken", False),
        (b"", False),
    ],
)
def test_loopback_origins_let_through_non_browsers_and_local_pages_only(
    origin: bytes | None, accepted: bool
) -> None:
    assert LoopbackOrigins.accepts(origin) is accepted
