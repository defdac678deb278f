"""agenthold over Streamable HTTP: both protocol eras, session ends, shutdown, flags and load.

Servers are real: uvicorn on a free 127.0.0.1 port, either in the test's event loop (the
application ``http_app`` builds, served the way ``_serve_http`` serves it) or as a
``python -m agenthold --transport http`` process for signals, exit statuses and warnings. Clients
are ``mcp.Client`` over ``streamable_http_client`` and raw httpx2 requests. Bearer tokens have
their own file, tests/test_auth.py.

Timing: grace periods and TTLs are tenths of a second, and timing is only ever bounded from the
side the machine's load cannot break (a lease cannot end *before* its grace period); speed is
measured in bench/perf/http_bench.py, not asserted here.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from support import (
    ACCEPT,
    LEGACY,
    REPO,
    HttpServerProcess,
    another_process_holds_the_write_lock,
    coordinator_at,
    initialize_request,
    open_session,
    post_head,
    raw_connection,
    run_agenthold,
    sdk_client,
    sse_messages,
    uvicorn_serving,
)

from agenthold.claims import Coordinator
from agenthold.cli.main import ServeOptions, UsageError, build_parser, serve_options
from agenthold.serve.app import Agenthold
from agenthold.serve.claim_tools import reply as tool_reply
from agenthold.serve.http import CancelOnDisconnect, _http_stack
from agenthold.store import StateStore

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------------------------------------
# A server in the test's loop, and clients
# --------------------------------------------------------------------------------------------


@dataclass
class Served:
    url: str  # the MCP endpoint
    port: int
    app: Agenthold
    coordinator: Coordinator
    requests: CancelOnDisconnect  # the layer that ends every open request at shutdown


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path,
    *,
    tools: str = "standard",
    grace: float | None = 0.3,
    claim_ttl: float | None = None,
    **options: Any,
) -> AsyncIterator[Served]:
    """agenthold's HTTP application on uvicorn, on a free loopback port, for one test."""
    with StateStore(tmp_path / "state.db") as store:
        coordinator = coordinator_at(store, tmp_path, claim_ttl=claim_ttl)
        app = Agenthold(coordinator, tools=tools, disconnect_grace=grace)
        opts = ServeOptions(transport="http", tools=tools, **options)
        asgi, requests = _http_stack(app, opts)
        async with uvicorn_serving(app, asgi, path=opts.path) as web:
            yield Served(web.url, web.port, app, coordinator, requests)


@contextlib.asynccontextmanager
async def connect(
    url: str,
    *,
    mode: str = "auto",
    headers: dict[str, str] | None = None,
    terminate_on_close: bool = True,
) -> AsyncIterator[Client]:
    """An SDK client (``mode`` "auto" speaks 2026-07-28, "legacy" the initialize handshake)."""
    async with sdk_client(
        url, mode=mode, headers=headers, terminate_on_close=terminate_on_close
    ) as client:
        await client.list_tools()  # cache the output schemas before any call
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool; its structured reply (the call must not be an MCP-level error)."""
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    return result.structured_content


async def poll(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``condition()`` is true (fail after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        await anyio.sleep(0.02)


def post_headers(**extra: str) -> dict[str, str]:
    return {"Accept": ACCEPT, "Content-Type": "application/json", **extra}


async def initialize_status(http: httpx2.AsyncClient, url: str, **headers: str) -> int:
    """The HTTP status of an initialize request sent with ``headers``."""
    reply = await http.post(url, json=initialize_request(), headers=post_headers(**headers))
    return reply.status_code


# --------------------------------------------------------------------------------------------
# Both protocol eras
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_both_protocol_eras_register_claim_and_release(
    tmp_path: Path, mode: str, json_response: bool
) -> None:
    async with serving(tmp_path, json_response=json_response) as s, connect(s.url, mode=mode) as c:
        agent = (await call(c, "agenthold_register", name="editor"))["agent_id"]
        claimed = await call(c, "agenthold_claim", resource="custom://doc", agent_id=agent)
        status = await call(c, "agenthold_status", resource="custom://doc")
        released = await call(
            c, "agenthold_release", resource="custom://doc", agent_id=agent, outcome="modified"
        )
        after = await call(c, "agenthold_status", resource="custom://doc")
    assert claimed["status"] == "claimed"
    assert (status["status"], status["held_by"]) == ("claimed", agent)
    assert released["status"] == "released"
    assert (after["status"], after["previous_outcome"]) == ("available", "modified")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_advanced_tools_over_http_refuse_a_stale_write(tmp_path: Path, mode: str) -> None:
    async with serving(tmp_path, tools="advanced") as s, connect(s.url, mode=mode) as c:
        first = await call(
            c, "agenthold_set", namespace="n", key="k", value=1, updated_by="a", expected_version=0
        )
        stale = await call(
            c, "agenthold_set", namespace="n", key="k", value=2, updated_by="b", expected_version=0
        )
        got = await call(c, "agenthold_get", namespace="n", key="k")
    assert first["status"] == "ok"
    assert stale["status"] == "conflict"
    assert (got["value"], got["version"]) == (1, first["version"])


async def test_an_older_client_connects_with_the_initialize_handshake(tmp_path: Path) -> None:
    """Raw 2025-11-25 requests: initialize opens a session, whose id every later request
    carries; the DELETE that ends it is accepted."""
    async with (
        serving(tmp_path, tools="advanced", json_response=True) as s,
        httpx2.AsyncClient(timeout=10) as http,
    ):
        init = await http.post(s.url, json=initialize_request(), headers=post_headers())
        session = init.headers["mcp-session-id"]
        session_headers = post_headers(
            **{"Mcp-Session-Id": session, "Mcp-Protocol-Version": LEGACY}
        )
        initialized = await http.post(
            s.url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers=session_headers,
        )
        listed = await http.post(
            s.url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=session_headers
        )
        ended = await http.delete(s.url, headers=session_headers)
        after = await http.post(
            s.url, json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, headers=session_headers
        )
    assert init.status_code == 200
    result = init.json()["result"]
    assert result["protocolVersion"] == LEGACY
    assert result["serverInfo"]["name"] == "agenthold"
    assert initialized.status_code == 202
    names = {tool["name"] for tool in listed.json()["result"]["tools"]}
    assert {"agenthold_get", "agenthold_set", "agenthold_watch"} <= names
    assert ended.status_code == 200
    assert after.status_code == 404  # the session is gone


async def test_unknown_path_is_404_and_the_configured_path_serves(tmp_path: Path) -> None:
    async with (
        serving(tmp_path, path="/agents/mcp") as s,
        httpx2.AsyncClient(timeout=10) as http,
    ):
        base = f"http://127.0.0.1:{s.port}"
        wrong = await http.post(f"{base}/mcp", json=initialize_request(), headers=post_headers())
        right = await http.post(s.url, json=initialize_request(), headers=post_headers())
    assert s.url.endswith("/agents/mcp")
    assert wrong.status_code == 404
    assert right.status_code == 200
    assert sse_messages(right.text)[0]["result"]["protocolVersion"] == LEGACY


# --------------------------------------------------------------------------------------------
# DNS-rebinding protection
# --------------------------------------------------------------------------------------------


async def test_without_allowed_host_any_host_header_is_served_but_foreign_origins_are_not(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as s, httpx2.AsyncClient(timeout=10) as http:

        async def status(**headers: str) -> int:
            return await initialize_status(http, s.url, **headers)

        # No Host check (a proxy or a container may present any name)...
        proxied = await status(Host="agents.internal.example")
        local = await status(Host=f"localhost:{s.port}")
        # ...but a browser page of another site is refused, as DNS rebinding would be.
        rebound = await status(Host=f"attacker.example:{s.port}", Origin="http://attacker.example")
        from_local_page = await status(Origin=f"http://localhost:{s.port}")
        from_v6_page = await status(Origin="http://[::1]:6274")
        garbled = await status(Origin="http://[not-an-address")
    assert (proxied, local, from_local_page, from_v6_page) == (200, 200, 200, 200)
    assert (rebound, garbled) == (403, 403)


async def test_allowed_host_accepts_only_the_given_host_and_origin(tmp_path: Path) -> None:
    async with (
        serving(tmp_path, allowed_hosts=["agents.example:*", "10.0.0.5:8417"]) as s,
        httpx2.AsyncClient(timeout=10) as http,
    ):

        async def status(**headers: str) -> int:
            return await initialize_status(http, s.url, **headers)

        allowed = await status(Host="agents.example:8417")
        exact = await status(Host="10.0.0.5:8417")
        loopback = await status(Host=f"127.0.0.1:{s.port}")  # not in the list any more
        other_port = await status(Host="10.0.0.5:9999")
        evil = await status(Host="attacker.example:8417")
        good_origin = await status(Host="agents.example:8417", Origin="http://agents.example:8417")
        bad_origin = await status(Host="agents.example:8417", Origin="http://attacker.example")
    assert (allowed, exact, good_origin) == (200, 200, 200)
    assert (loopback, other_port, evil) == (421, 421, 421)
    assert bad_origin == 403


async def test_allowed_host_compares_host_names_case_insensitively(tmp_path: Path) -> None:
    async with (
        serving(tmp_path, allowed_hosts=["Agents.Example"]) as s,
        httpx2.AsyncClient(timeout=10) as http,
    ):

        async def status(**headers: str) -> int:
            return await initialize_status(http, s.url, **headers)

        codes = (
            await status(Host="agents.example:8417"),
            await status(Host="AGENTS.EXAMPLE"),
            await status(Host="aGeNtS.example:8417", Origin="HTTP://Agents.EXAMPLE:8417"),
            await status(Host="AGENTS.EXAMPLE.EVIL"),
        )
    assert codes == (200, 200, 200, 421)


async def test_allowed_host_without_a_port_accepts_any_port_of_that_host(tmp_path: Path) -> None:
    async with (
        serving(tmp_path, allowed_hosts=["agents.example", "[::1]"]) as s,
        httpx2.AsyncClient(timeout=10) as http,
    ):

        async def status(**headers: str) -> int:
            return await initialize_status(http, s.url, **headers)

        codes = {
            "agents.example": await status(Host="agents.example"),
            "agents.example:8417": await status(Host="agents.example:8417"),
            "[::1]:8417": await status(Host="[::1]:8417"),
            "origin with port": await status(
                Host="agents.example:8417", Origin="https://agents.example:8417"
            ),
            "agents.example.evil": await status(Host="agents.example.evil:8417"),
            "evil origin": await status(Host="agents.example", Origin="http://agents.example.evil"),
        }
    assert codes == {
        "agents.example": 200,
        "agents.example:8417": 200,
        "[::1]:8417": 200,
        "origin with port": 200,
        "agents.example.evil": 421,
        "evil origin": 403,
    }


# --------------------------------------------------------------------------------------------
# When a session ends
# --------------------------------------------------------------------------------------------


async def test_closing_a_legacy_session_frees_its_agents_claims_after_the_grace(
    tmp_path: Path,
) -> None:
    grace = 0.3
    async with serving(tmp_path, grace=grace) as s, connect(s.url) as watcher:
        async with connect(s.url, mode="legacy") as holder:
            agent = (await call(holder, "agenthold_register", name="holder"))["agent_id"]
            await call(holder, "agenthold_claim", resource="custom://a", agent_id=agent)
            await call(holder, "agenthold_claim", resource="custom://b", agent_id=agent)
            closing = time.monotonic()  # the session ends after this (the client sends DELETE)
        waited = await call(watcher, "agenthold_wait", resource="custom://a", timeout_seconds=30)
        freed_after = time.monotonic() - closing
        other = await call(watcher, "agenthold_status", resource="custom://b")
    assert (waited["status"], waited["previous_outcome"]) == ("available", "abandoned")
    assert waited["previous_holder"] == agent
    assert freed_after >= grace * 0.95  # never before the grace period (clock granularity aside)
    assert (other["status"], other["previous_outcome"]) == ("available", "abandoned")


async def test_an_agent_still_named_by_another_live_session_keeps_its_claims(
    tmp_path: Path,
) -> None:
    async with (
        serving(tmp_path, grace=0.2) as s,
        connect(s.url, mode="legacy") as second,
        connect(s.url) as watcher,
    ):
        async with connect(s.url, mode="legacy") as first:
            agent = (await call(first, "agenthold_register", name="shared"))["agent_id"]
            await call(first, "agenthold_claim", resource="custom://a", agent_id=agent)
            await call(second, "agenthold_claim", resource="custom://b", agent_id=agent)
        timed_out = await call(
            watcher, "agenthold_wait", resource="custom://a", timeout_seconds=0.6
        )
        still = await call(watcher, "agenthold_status", resource="custom://b")
    assert (timed_out["status"], timed_out["held_by"]) == ("timeout", agent)
    assert (still["status"], still["held_by"]) == ("claimed", agent)


async def test_modern_era_clients_have_no_session_so_the_claim_ttl_reclaims(
    tmp_path: Path,
) -> None:
    """2026-07-28 requests each stand alone: closing such a client ends nothing; a claim TTL
    is what frees an agent's claims when it goes quiet."""
    async with serving(tmp_path, grace=0.05, claim_ttl=0.5) as s, connect(s.url) as watcher:
        async with connect(s.url) as holder:  # mode auto: 2026-07-28
            agent = (await call(holder, "agenthold_register", name="holder"))["agent_id"]
            await call(holder, "agenthold_claim", resource="custom://a", agent_id=agent)
        waited = await call(watcher, "agenthold_wait", resource="custom://a", timeout_seconds=30)
    assert (waited["status"], waited["previous_outcome"]) == ("available", "expired")
    assert waited["previous_holder"] == agent


# --------------------------------------------------------------------------------------------
# Calls whose client goes away, and request bodies
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("json_response", [True, False], ids=["json", "sse"])
async def test_a_modern_call_is_cancelled_when_its_client_gives_up(
    tmp_path: Path, json_response: bool
) -> None:
    async with (
        serving(tmp_path, tools="advanced", json_response=json_response) as s,
        connect(s.url) as c,
    ):
        arguments = {"namespace": "n", "key": "k", "since_version": 0, "timeout_seconds": 60}
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.call_tool, "agenthold_watch", arguments)
            await poll(lambda: s.app.in_flight == 1)  # the watch runs on the server
            tg.cancel_scope.cancel()  # the client gives up
        await poll(lambda: s.app.in_flight == 0, timeout=5)


async def test_a_body_over_4_mib_gets_413(tmp_path: Path) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"s": "a" * 4_300_000}})
    async with serving(tmp_path) as s, httpx2.AsyncClient(timeout=10) as http:
        reply = await http.post(s.url, content=body.encode(), headers=post_headers())
    assert reply.status_code == 413


async def test_a_body_not_sent_in_time_gets_408(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agenthold.serve.http.BODY_TIMEOUT", 0.3)
    async with serving(tmp_path) as s:
        stream = await raw_connection(s.port)
        async with stream:
            head = post_head(s.port, "Content-Length: 100")
            await stream.send(head + b'{"jsonrpc":')  # and then nothing
            with anyio.fail_after(5):
                answer = await stream.receive()
    assert answer.startswith(b"HTTP/1.1 408")


async def test_a_client_leaving_in_the_middle_of_its_body_leaves_no_error_behind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(tmp_path) as s, httpx2.AsyncClient(timeout=10) as http:
        stream = await raw_connection(s.port)
        async with stream:
            await stream.send(post_head(s.port, "Content-Length: 100") + b'{"jsonrpc":')
        await anyio.sleep(0.2)  # the server reads the rest of the body, and finds the client gone
        after = await http.post(s.url, json=initialize_request(), headers=post_headers())
    assert after.status_code == 200
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_ending_all_requests_completes_each_response_and_refuses_new_ones(
    tmp_path: Path,
) -> None:
    """What shutdown does once calls had their grace period: an old-style client's event
    stream ends as a complete HTTP response, a call still running gets 503, and so does a
    request that comes later."""
    async with (
        serving(tmp_path, tools="advanced") as s,
        httpx2.AsyncClient(timeout=10) as http,
        connect(s.url) as c,
    ):
        session_id = await open_session(http, s.url)
        session = {"Mcp-Session-Id": session_id, "Mcp-Protocol-Version": LEGACY}
        outcome: dict[str, Any] = {}

        async def watch() -> None:
            try:
                await c.call_tool(
                    "agenthold_watch",
                    {"namespace": "n", "key": "k", "since_version": 0, "timeout_seconds": 60},
                )
            except Exception as exc:
                outcome["watch"] = exc

        async def event_stream() -> None:
            headers = {"Accept": "text/event-stream", **session}
            async with http.stream("GET", s.url, headers=headers) as stream:
                outcome["stream_status"] = stream.status_code
                outcome["stream_body"] = b"".join([chunk async for chunk in stream.aiter_bytes()])

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            tg.start_soon(event_stream)
            await poll(lambda: s.app.in_flight == 1 and "stream_status" in outcome)
            s.requests.end_all()
        later = await http.post(s.url, json=initialize_request(), headers=post_headers())
        assert s.app.in_flight == 0
    assert outcome["stream_status"] == 200  # and it ended without a protocol error
    assert isinstance(outcome["watch"], Exception)
    assert (later.status_code, later.text) == (503, "agenthold is shutting down")


# --------------------------------------------------------------------------------------------
# Under load
# --------------------------------------------------------------------------------------------


async def increment(c: Client, key: str, writer: str) -> int:
    """Add 1 to counters/``key`` with the read, write-with-version, retry-on-conflict loop;
    returns the number of conflicts it met."""
    conflicts = 0
    while True:
        got = await call(c, "agenthold_get", namespace="counters", key=key)
        value, version = (got["value"], got["version"]) if got["status"] == "ok" else (0, 0)
        done = await call(
            c,
            "agenthold_set",
            namespace="counters",
            key=key,
            value=value + 1,
            updated_by=writer,
            expected_version=version,
        )
        if done["status"] == "ok":
            return conflicts
        assert done["status"] == "conflict", done
        conflicts += 1


@pytest.mark.slow  # many clients, many rounds: seconds in one process
async def test_concurrent_clients_of_both_eras_lose_no_increment(tmp_path: Path) -> None:
    clients, rounds, keys = 8, 15, ["a", "b"]
    async with serving(tmp_path, tools="advanced") as s:

        async def worker(n: int) -> None:
            async with connect(s.url, mode="legacy" if n % 2 else "auto") as c:
                for i in range(rounds):
                    await increment(c, keys[(n + i) % 2], f"w{n}")

        async with anyio.create_task_group() as tg:
            for n in range(clients):
                tg.start_soon(worker, n)
        totals = [s.coordinator.store.get("counters", k).value for k in keys]
    assert sum(totals) == clients * rounds
    assert totals == [clients * rounds // 2] * 2


@pytest.mark.slow  # many clients, many rounds: seconds in one process
async def test_concurrent_claimers_never_hold_a_resource_together(tmp_path: Path) -> None:
    clients, rounds = 8, 6
    intervals: dict[str, list[tuple[float, float]]] = {"custom://x": [], "custom://y": []}
    async with serving(tmp_path) as s:

        async def worker(n: int) -> None:
            async with connect(s.url, mode="legacy" if n % 2 else "auto") as c:
                agent = (await call(c, "agenthold_register", name=f"w{n}"))["agent_id"]
                for i in range(rounds):
                    resource = sorted(intervals)[(n + i) % 2]
                    while (await call(c, "agenthold_claim", resource=resource, agent_id=agent))[
                        "status"
                    ] != "claimed":
                        await call(c, "agenthold_wait", resource=resource, timeout_seconds=30)
                    start = time.time()
                    await anyio.sleep(0.002)
                    end = time.time()
                    released = await call(c, "agenthold_release", resource=resource, agent_id=agent)
                    assert released["status"] == "released"
                    intervals[resource].append((start, end))

        async with anyio.create_task_group() as tg:
            for n in range(clients):
                tg.start_soon(worker, n)
    for spans in intervals.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    assert sum(len(spans) for spans in intervals.values()) == clients * rounds


async def test_reads_answer_while_another_process_holds_the_write_lock_under_50_waits(
    tmp_path: Path,
) -> None:
    """0.10.0 stalled every session here (its waits polled the store on the event loop behind
    a writer stuck on the lock). The lock is held until the reads have answered, so they
    cannot have waited for it."""
    async with serving(tmp_path, tools="advanced", json_response=False) as s:
        waiters_done = 0

        async def waiter(c: Client, i: int) -> None:
            nonlocal waiters_done
            reply = await call(
                c,
                "agenthold_watch",
                namespace="w",
                key=f"k{i % 5}",
                since_version=0,
                timeout_seconds=60,
            )
            assert reply["status"] == "ok", reply
            waiters_done += 1

        async with (
            connect(s.url) as waits_a,
            connect(s.url, mode="legacy") as waits_b,
            connect(s.url, mode="legacy") as writer,
            connect(s.url, mode="legacy") as reader,
            connect(s.url) as modern_reader,
            anyio.create_task_group() as tg,
        ):
            await call(
                writer, "agenthold_set", namespace="r", key="k", value=7, updated_by="t", force=True
            )
            for i in range(50):
                tg.start_soon(waiter, waits_a if i % 2 else waits_b, i)
            await poll(lambda: s.app.in_flight >= 50)

            blocked: dict[str, Any] = {}

            async def blocked_write() -> None:
                blocked["reply"] = await call(
                    writer, "agenthold_set", namespace="w", key="k0", value=1, updated_by="t",
                    force=True,
                )  # fmt: skip

            with another_process_holds_the_write_lock(tmp_path / "state.db"):
                tg.start_soon(blocked_write)
                await poll(lambda: s.app.in_flight >= 51)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # send_ping is deprecated in the SDK
                    with anyio.fail_after(10):
                        await reader.send_ping()
                got = await call(reader, "agenthold_get", namespace="r", key="k")
                modern_got = await call(modern_reader, "agenthold_get", namespace="r", key="k")
                assert "reply" not in blocked  # the lock really was held all along
            await poll(lambda: "reply" in blocked)
            for i in range(1, 5):
                await call(
                    writer, "agenthold_set", namespace="w", key=f"k{i}", value=1, updated_by="t",
                    force=True,
                )  # fmt: skip
        assert (got["value"], modern_got["value"]) == (7, 7)
        assert blocked["reply"]["status"] == "ok"
        assert waiters_done == 50


# --------------------------------------------------------------------------------------------
# The agenthold command with --transport http (a separate process)
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def server_process(tmp_path: Path, *args: str, **kw: Any) -> Iterator[HttpServerProcess]:
    proc = HttpServerProcess(tmp_path / "state.db", tmp_path, *args, **kw)
    try:
        yield proc
    finally:
        proc.kill()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_ends_calls_in_flight_frees_claims_and_exits_0(
    tmp_path: Path, signum: int
) -> None:
    with server_process(tmp_path, "--claim-ttl", "600", "--disconnect-grace", "600") as server:
        server.wait_serving()
        async with connect(server.url, mode="legacy") as old, connect(server.url) as new:
            holder = (await call(old, "agenthold_register", name="holder"))["agent_id"]
            other = (await call(new, "agenthold_register", name="other"))["agent_id"]
            await call(old, "agenthold_claim", resource="custom://a", agent_id=holder)
            await call(new, "agenthold_claim", resource="custom://b", agent_id=other)
            replies: list[dict[str, Any]] = []

            async def wait_on(c: Client, resource: str) -> None:
                replies.append(
                    await call(c, "agenthold_wait", resource=resource, timeout_seconds=120)
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_on, old, "custom://b")
                tg.start_soon(wait_on, new, "custom://a")
                await anyio.sleep(0.3)  # let both waits reach the server
                signalled = time.monotonic()
                server.proc.send_signal(signum)
            answered = time.monotonic() - signalled
            rc = await anyio.to_thread.run_sync(server.wait)
        stopped = time.monotonic() - signalled
    assert rc == 0, server.stderr
    assert [r["status"] for r in replies] == ["unavailable", "unavailable"]
    assert all("shutting down" in r["message"] for r in replies)
    assert answered < 5 and stopped < 10  # loose: "within a few seconds", on a busy machine
    assert "Traceback" not in server.stderr
    assert "ERROR" not in server.stderr  # the old-style client's event stream ended cleanly
    with StateStore(server.db) as store:
        coordinator = Coordinator(store)
        for resource, agent in (("custom://a", holder), ("custom://b", other)):
            status = tool_reply(coordinator.status(resource))
            assert status["status"] == "available", status
            assert (status["previous_outcome"], status["previous_holder"]) == ("abandoned", agent)


async def test_a_second_signal_ends_the_calls_still_in_flight(tmp_path: Path) -> None:
    """A write stuck behind another process's lock would outlast the first signal's grace
    period if its busy timeout were long; the second signal ends its request at once."""
    with server_process(
        tmp_path, "--tools", "advanced", "--json-response", "--busy-timeout", "2",
        "--claim-ttl", "60",
    ) as server:  # fmt: skip
        server.wait_serving()
        async with connect(server.url, mode="legacy") as c:
            outcome: dict[str, Any] = {}

            async def stuck_write() -> None:
                try:
                    outcome["reply"] = await call(
                        c, "agenthold_set", namespace="n", key="k", value=1, updated_by="t",
                        force=True,
                    )  # fmt: skip
                except Exception as exc:
                    outcome["error"] = exc

            with another_process_holds_the_write_lock(server.db):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stuck_write)
                    await anyio.sleep(0.3)
                    server.proc.send_signal(signal.SIGTERM)
                    await poll(lambda: "stopping" in server.stderr)
                    server.proc.send_signal(signal.SIGTERM)
            rc = await anyio.to_thread.run_sync(server.wait)
    assert rc == 0, server.stderr
    assert "error" in outcome, outcome  # ended, not answered after the busy timeout
    assert "again: ending the calls in flight now" in server.stderr
    assert "Traceback" not in server.stderr
    with StateStore(server.db) as store:  # the ended write is whole or absent, never half-done
        versions = [entry.version for entry in store.history("n", "k")]
        assert versions in ([], [1])
        if versions:
            assert (store.get("n", "k").value, store.get("n", "k").version) == (1, 1)


@pytest.mark.parametrize("released_after", [0.05, 1.2])  # within --busy-timeout, or after it
async def test_a_write_its_client_gave_up_on_while_it_waited_for_the_lock_is_whole_or_absent(
    tmp_path: Path, released_after: float
) -> None:
    with server_process(
        tmp_path, "--tools", "advanced", "--busy-timeout", "1", "--claim-ttl", "60"
    ) as server:
        server.wait_serving()
        async with connect(server.url) as c:
            await call(c, "agenthold_set", namespace="n", key="k", value="before",
                       updated_by="a", expected_version=0)  # fmt: skip
            with another_process_holds_the_write_lock(server.db):
                with anyio.move_on_after(0.3) as gave_up:
                    await call(c, "agenthold_set", namespace="n", key="k", value="after",
                               updated_by="b", expected_version=1)  # fmt: skip
                assert gave_up.cancelled_caught
                await anyio.sleep(released_after)
            await anyio.sleep(0.2)  # a write still queued may now take the lock and commit
            read = await call(c, "agenthold_get", namespace="n", key="k")
            history = await call(c, "agenthold_history", namespace="n", key="k")
            # Either the write happened entirely (value, version, history row) or not at all.
            assert (read["value"], read["version"], [e["version"] for e in history["history"]]) in (
                ("before", 1, [1]),
                ("after", 2, [2, 1]),
            )
            follow = await call(c, "agenthold_set", namespace="n", key="k", value="next",
                                updated_by="c", expected_version=read["version"])  # fmt: skip
            assert follow["version"] == read["version"] + 1  # and the server goes on writing
        server.proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(server.wait) == 0
    assert "Traceback" not in server.stderr


async def test_port_0_serves_on_a_free_port_named_in_the_start_line_and_logs_at_info(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthold", "--db", str(tmp_path / "state.db"),
         "--transport", "http", "--port", "0", "--claim-ttl", "1800"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        first = await anyio.to_thread.run_sync(proc.stderr.readline)
        started = re.fullmatch(
            r"agenthold: INFO: serving standard tools at http://127\.0\.0\.1:(\d+)/mcp\n", first
        )
        assert started is not None, first
        port = int(started.group(1))
        assert port != 0
        async with connect(f"http://127.0.0.1:{port}/mcp") as client:
            registered = await call(client, "agenthold_register", name="on-port-0")
            assert registered["status"] == "registered"
        proc.send_signal(signal.SIGTERM)
        out, rest = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=20))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, rest
    assert out == "" and rest.startswith("agenthold: INFO: SIGTERM: stopping"), rest
    assert "WARNING" not in first + rest  # a normal start and stop warn of nothing


def test_a_port_in_use_fails_with_one_line_before_serving(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_agenthold(tmp_path, "--transport", "http", "--port", str(port))
    lines = done.stderr.splitlines()
    assert done.returncode == 2
    # One line: not even the warning about --claim-ttl, and no database was made.
    assert lines == [f"agenthold: cannot listen on 127.0.0.1:{port}: the port is already in use"]
    assert not (tmp_path / "state.db").exists()


def test_a_host_beyond_loopback_that_cannot_be_bound_fails_with_one_line_alone(
    tmp_path: Path,
) -> None:
    done = run_agenthold(tmp_path, "--transport", "http", "--host", "192.0.2.1", "--port", "8417")
    lines = done.stderr.splitlines()
    assert done.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("agenthold: cannot listen on 192.0.2.1"), lines
    assert not (tmp_path / "state.db").exists()


def test_a_host_that_does_not_resolve_fails_with_one_line(tmp_path: Path) -> None:
    done = run_agenthold(
        tmp_path, "--transport", "http", "--host", "no-such-host.invalid", "--claim-ttl", "60",
        "--auth-token", "t",
    )  # fmt: skip
    lines = done.stderr.splitlines()
    assert done.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("agenthold: --host: cannot use"), lines
    assert "no-such-host.invalid" in lines[0]


@pytest.mark.parametrize("path", ["", "/a b", "x?y", "//mcp"])
def test_a_bad_path_fails_with_one_line(tmp_path: Path, path: str) -> None:
    done = run_agenthold(tmp_path, "--transport", "http", "--path", path)
    lines = done.stderr.splitlines()
    assert done.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("agenthold: --path:"), lines


def options(*argv: str, env: dict[str, str] | None = None) -> tuple[ServeOptions, list[str]]:
    return serve_options(build_parser().parse_args(list(argv)), env or {})


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--port", "http", "is not a port number"),
        ("--port", "-1", "between 0 and 65535"),
        ("--port", "65536", "between 0 and 65535"),
        ("--host", " ", "an empty address"),
    ],
)
def test_a_bad_port_or_empty_host_is_refused_before_serving(
    flag: str, value: str, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        options("--transport", "http", flag, value)


def test_the_path_loses_a_trailing_slash_and_the_defaults_hold() -> None:
    assert options("--transport", "http", "--path", "/agents/mcp/")[0].path == "/agents/mcp"
    # without its leading slash, as 0.10 took it (and the help says)
    assert options("--transport", "http", "--path", "mcp")[0].path == "/mcp"
    assert options("--transport", "http", "--path", "agents/mcp/")[0].path == "/agents/mcp"
    assert "'mcp' is taken as '/mcp'" in " ".join(build_parser().format_help().split())
    assert options("--transport", "http", "--path", "/")[0].path == "/"
    defaults, _ = options("--transport", "http")
    assert (defaults.host, defaults.port, defaults.path) == ("127.0.0.1", 8417, "/mcp")
    assert not defaults.json_response and defaults.allowed_hosts == defaults.auth_tokens == []


def test_the_serving_defaults_are_the_documented_ones() -> None:
    defaults, _ = options()
    assert (defaults.transport, defaults.tools, defaults.claim_ttl) == ("stdio", "standard", None)
    assert (defaults.disconnect_grace, defaults.reap_idle) == (300, 86400)
    assert (defaults.durability, defaults.busy_timeout, defaults.log_level) == (
        "normal",
        5.0,
        "warning",
    )
    # one per user, in the state directory (tests/test_defaults.py has the other platforms)
    if sys.platform not in ("darwin", "win32"):
        in_state, _ = options(env={"XDG_STATE_HOME": "/s"})
        assert in_state.db == os.path.join("/s", "agenthold", "agenthold.db")
    assert defaults.create_db_dir
    assert defaults.workspaces == []  # the Resolver then serves the current directory


def test_binding_beyond_loopback_without_a_token_warns() -> None:
    _, open_warnings = options("--transport", "http", "--host", "0.0.0.0", "--claim-ttl", "60")
    _, with_token = options(
        "--transport", "http", "--host", "0.0.0.0", "--claim-ttl", "60", "--auth-token", "t"
    )
    _, loopback = options("--transport", "http", "--claim-ttl", "60")
    assert len(open_warnings) == 1 and "0.0.0.0" in open_warnings[0]
    assert "AGENTHOLD_AUTH_TOKEN" in open_warnings[0]
    assert with_token == [] and loopback == []


def test_http_without_a_claim_ttl_warns() -> None:
    _, without = options("--transport", "http")
    _, with_ttl = options("--transport", "http", "--claim-ttl", "1800")
    assert len(without) == 1 and "--claim-ttl" in without[0]
    assert with_ttl == []


def test_http_flags_and_tokens_given_with_stdio_warn_without_showing_the_token() -> None:
    opts, found = options(
        "--port", "9000", "--json-response", "--allowed-host", "h", "--auth-token", "s3cret-tok"
    )
    assert opts.transport == "stdio" and opts.auth_tokens == []
    assert len(found) == 2
    assert all(flag in found[0] for flag in ("--port", "--json-response", "--allowed-host"))
    assert "only apply with --transport http" in found[0]  # several flags: plural
    assert "token" in found[1] and "ignored" in found[1]
    assert not any("s3cret-tok" in line for line in found)
    _, from_env = options(env={"AGENTHOLD_AUTH_TOKEN": "envtok"})
    assert len(from_env) == 1 and "envtok" not in from_env[0]


def test_the_warnings_go_to_standard_error_and_stdio_still_serves(tmp_path: Path) -> None:
    done = run_agenthold(tmp_path, "--port", "9000", env={"AGENTHOLD_AUTH_TOKEN": "envtok"})
    lines = done.stderr.splitlines()
    assert done.returncode == 0  # stdin was empty: the stdio client went away at once
    assert done.stdout == ""
    assert any(line.startswith("agenthold: warning: --port") for line in lines), lines
    assert any("auth tokens apply to --transport http only" in line for line in lines), lines
    assert "envtok" not in done.stderr


def test_an_http_server_prints_its_address_and_the_ttl_warning(tmp_path: Path) -> None:
    with server_process(tmp_path) as server:
        server.wait_serving()
        rc = server.stop(signal.SIGINT)
    assert rc == 0
    assert f"http://127.0.0.1:{server.port}/mcp" in server.stderr
    assert "without --claim-ttl" in server.stderr
    assert "Traceback" not in server.stderr


@pytest.mark.stress
@pytest.mark.usefixtures("no_child_coverage")
def test_the_http_benchmark_quick_run_finds_no_error_lost_update_or_shared_claim() -> None:
    """bench/perf/http_bench.py --quick: 32 clients of both eras in another process than the server,
    the 50-wait lock test, and the per-call comparison; only its correctness checks count."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "perf" / "http_bench.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "correctness: all checks passed" in done.stdout
    assert "0 failed calls, 0 counters off, 0 hold problems" in done.stdout


@pytest.mark.parametrize(
    ("host", "warned"),
    [
        ("127.0.0.2", False),
        ("::1", False),
        ("0:0:0:0:0:0:0:1", False),
        ("localhost", False),
        ("::", True),
        ("agents.example", True),
        ("192.168.1.4", True),
    ],
)
def test_the_beyond_loopback_warning_knows_every_spelling_of_loopback(
    host: str, warned: bool
) -> None:
    _, warnings = options("--transport", "http", "--host", host, "--claim-ttl", "60")
    assert bool(warnings) is warned


# --------------------------------------------------------------------------------------------
# Progress of long waits
# --------------------------------------------------------------------------------------------


@pytest.mark.slow  # waits seconds for its progress reports, four times
@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_wait_with_a_progress_token_reports_progress_over_event_streams_and_sessions(
    tmp_path: Path, mode: str, json_response: bool
) -> None:
    async with (
        serving(tmp_path, tools="standard,advanced", json_response=json_response) as s,
        connect(s.url, mode=mode) as c,
    ):
        s.app.progress_every = 0.15
        seen: list[tuple[float, float | None, str | None]] = []

        async def note(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        holder = (await call(c, "agenthold_register", name="holder"))["agent_id"]
        await call(c, "agenthold_claim", resource="big.md", agent_id=holder)
        # waits long against the progress interval (0.15 s): a loaded machine delays the
        # reports, and three must come before the wait ends
        arguments = {"resource": "big.md", "timeout_seconds": 2.0}
        waited = await c.call_tool("agenthold_wait", arguments, progress_callback=note)
        assert waited.structured_content is not None
        assert waited.structured_content["status"] == "timeout"
        assert "agenthold_wait again" in waited.structured_content["hint"]
        if json_response and mode == "auto":
            # A 2026-07-28 call answered with plain JSON has no stream for notifications, and no
            # session stream either: the wait answers as always, without progress (docs/claims.md).
            assert seen == []
            return
        assert len(seen) >= 3, seen
        assert [p for p, _, _ in seen] == sorted({p for p, _, _ in seen})  # always increasing
        assert all(total == 2.0 and "big.md to be released" in str(m) for _, total, m in seen)

        seen.clear()
        watched = await c.call_tool(
            "agenthold_watch",
            {"namespace": "n", "key": "k", "since_version": 0, "timeout_seconds": 1.5},
            progress_callback=note,
        )
        assert watched.structured_content is not None
        assert watched.structured_content["status"] == "timeout"
        assert len(seen) >= 2 and all("'k' in 'n'" in str(m) for _, _, m in seen), seen
