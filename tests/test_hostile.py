"""Hostile input: arguments and messages no honest client sends, on every transport.

Whatever arrives, three things must hold: the caller gets an answer within a bounded time (a
tool result, an isError one when the call was bad, or a JSON-RPC or HTTP error for a message
that cannot be parsed), the server goes on serving, and what was stored before (a canary record
and a canary claim, written directly to the database) is unchanged afterwards.

The ways in:
- hypothesis draws arguments for each tool (wrong types, missing and extra fields, empty, huge
  and control-character strings, lone surrogates, deep nesting, huge integers, traversal paths)
  and sends them through a real in-process ``mcp.Client`` in both protocol eras. That client
  serialises what it sends the way JSON does (NaN and Infinity become null, and it refuses
  nesting past about 250 levels on its own side), so the same draws, widened with NaN, Infinity
  and nesting to 980 levels (all of which the SDK's parsers hand over), also go straight to
  ``Agenthold.call``, where every transport ends.
- Raw JSON-RPC lines on the pipes of a stdio server process: 5,000-digit integers, NaN, nesting
  deeper than the SDK parses, 10 MB strings, malformed and non-JSON-RPC lines.
- Raw HTTP requests in both protocol eras, answered as event streams and as plain JSON:
  malformed, oversized and mistyped bodies, a client that stalls in its body, and one that stalls
  inside its headers (which nothing times out: see that test).

Example counts are modest (40 a tool and era), so the file runs in well under a minute; set
AGENTHOLD_FUZZ_EXAMPLES for a longer hunt. A failure prints the call that broke the rule.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult
from support import (
    ACCEPT,
    ANSWER_LIMIT,
    LEGACY,
    MODERN,
    STARTUP,
    StdioPipes,
    agenthold_args,
    child_env,
    coordinator_at,
    in_process_client,
    open_session,
    post_head,
    raw_connection,
    refuse_constant,
    reply_of,
    sse_messages,
    uvicorn_serving,
    warm_pids,
)

from agenthold.claims import OUTCOMES, Coordinator
from agenthold.cli.main import ServeOptions
from agenthold.serve import http as http_module
from agenthold.serve.app import Agenthold
from agenthold.serve.http import http_app
from agenthold.serve.toolkit import ToolSpec
from agenthold.store import StateStore

# slow: every test serves HTTP or MCP in process, about a second each; the fast lane leaves them out
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

EXAMPLES = int(os.environ.get("AGENTHOLD_FUZZ_EXAMPLES", "40"))  # examples a tool and era
BIG = "1" + "0" * 5000  # a 5,001-digit integer, as JSON text
HUGE = 10**5000  # the same size, as a Python int

STANDARD_TOOLS = [
    "agenthold_register",
    "agenthold_claim",
    "agenthold_release",
    "agenthold_status",
    "agenthold_wait",
]
ADVANCED_TOOLS = [
    "agenthold_get",
    "agenthold_set",
    "agenthold_list",
    "agenthold_history",
    "agenthold_delete",
    "agenthold_watch",
    "agenthold_clear_namespace",
    "agenthold_export",
]
# The statuses each tool may answer with; "error" (an isError result) is allowed for all.
STATUSES = {
    "agenthold_register": {"registered"},
    "agenthold_claim": {"claimed", "already_claimed", "busy"},
    "agenthold_release": {"released", "already_free", "not_found"},
    "agenthold_status": {"available", "claimed"},
    "agenthold_wait": {"available", "timeout"},
    "agenthold_get": {"ok", "not_found"},
    "agenthold_set": {"ok", "conflict"},
    "agenthold_list": {"ok"},
    "agenthold_history": {"ok"},
    "agenthold_delete": {"ok", "not_found", "conflict"},
    "agenthold_watch": {"ok", "deleted", "timeout"},
    "agenthold_clear_namespace": {"ok"},
    "agenthold_export": {"ok"},
}
ERROR_KINDS = {"invalid_arguments", "invalid_input", "unknown_agent", "not_holder", "unknown_tool"}


# --------------------------------------------------------------------------------------------
# The canary: a record and a claim no hostile call may change
# --------------------------------------------------------------------------------------------

CANARY_NS, CANARY_KEY = "canary-ns-4f1d", "canary"
CANARY_RESOURCE = "custom://canary-claim"  # also offered to the fuzzer, which must not get it


@dataclass(frozen=True)
class Canary:
    value: Any
    version: int
    history: int
    claim_state: str
    holder: str | None
    claim_version: int


def plant_canary(coordinator: Coordinator) -> Canary:
    store = coordinator.store
    store.set(CANARY_NS, CANARY_KEY, {"kept": [1, 2, 3]}, updated_by="canary", expected_version=0)
    store.set(
        CANARY_NS,
        CANARY_KEY,
        {"kept": [1, 2, 3], "text": "intact \u00e9\U0001f642"},
        updated_by="canary",
        expected_version=1,
    )
    agent = coordinator.register("canary").agent_id
    coordinator.claim(CANARY_RESOURCE, agent)
    canary = read_canary(coordinator)
    assert (canary.version, canary.claim_state, canary.holder) == (2, "claimed", agent)
    return canary


def read_canary(coordinator: Coordinator) -> Canary:
    store = coordinator.store
    record = store.get(CANARY_NS, CANARY_KEY)
    info = coordinator.info(coordinator.resolver.resolve(CANARY_RESOURCE))
    assert info is not None
    return Canary(
        record.value,
        record.version,
        len(store.history(CANARY_NS, CANARY_KEY, 100)),
        info.state,
        info.holder,
        info.version,
    )


def assert_canary_intact(coordinator: Coordinator, planted: Canary) -> None:
    assert read_canary(coordinator) == planted
    assert coordinator.store.db.fetchone("PRAGMA integrity_check")[0] == "ok"


def open_coordinator(root: Path) -> Coordinator:
    return coordinator_at(StateStore(root / "hostile.db"), root)


# --------------------------------------------------------------------------------------------
# Replies
# --------------------------------------------------------------------------------------------


def check_reply(tool: str, result: CallToolResult) -> dict[str, Any]:
    """A tool's reply, checked for what every reply must be, whatever the arguments were: one
    strict-JSON text equal to the structured content, isError exactly for status "error", an
    error with a kind, a message and a hint (never an internal error), else a status the tool
    can answer with."""
    reply = reply_of(result)
    if reply["status"] == "error":
        assert reply["error"] in ERROR_KINDS, reply
    else:
        assert reply["status"] in STATUSES.get(tool, set()), (tool, reply)
    return reply


# --------------------------------------------------------------------------------------------
# What hypothesis sends
# --------------------------------------------------------------------------------------------


def nest(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


TRAVERSALS = [
    "../../etc/passwd",
    "/etc/passwd",
    "file:///etc/passwd",
    "file://default/../../etc/passwd",
    "file://default/%2e%2e/%2e%2e/etc/passwd",
    "file://nowhere/x",
    "file://",
    "file://default",
    "custom://",
    "custom://../x",
    "custom://a\x00b",
    "..",
    ".",
    "",
    " ",
    "/",
    "//",
    "~/x",
    "..\\..\\windows\\system32",
    "C:\\Windows\\win.ini",
    "src/../../../x",
    "src/./app.py",
    "src//app.py",
    "src/app.py/",
    "http://example.com/x",
    "\\\\server\\share\\x",
    "src/\u202eyp.exe",
    "src/caf\u00e9.py",
    "src/cafe\u0301.py",
    "a" * 1025,
]
LONG_TEXTS = [
    "x" * 10_000_000,  # 10 MB
    "\u00e9" * 1_048_577,  # over 1 MiB of UTF-8 as a value, over every name limit
    "a" * 1025,
    "b" * 257,
    "\U0001f642" * 300,
]
BIG_INTS = [2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**4299, HUGE, -HUGE]


def pick(values: list[Any]) -> st.SearchStrategy[Any]:
    """sampled_from, for values whose repr hypothesis cannot print (over 4,300 digits) or
    should not (10 MB of text)."""
    return st.integers(0, len(values) - 1).map(lambda i: values[i])


control_text = st.text(
    st.characters(max_codepoint=0x1F) | st.sampled_from("\x7f\x85\u2028\u2029\u200b\ufeff"),
    min_size=1,
    max_size=6,
)
plain_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=24)
# and with lone surrogates, which JSON text can carry as escapes ("\udc80")
any_text = st.text(st.characters() | st.characters(categories=["Cs"]), max_size=24)
texts = st.one_of(
    st.sampled_from(["", " ", "\t", "\n", "null", "NaN", "0", "true", "[]", "{}"]),
    control_text,
    any_text,
    st.sampled_from(TRAVERSALS),
    pick(LONG_TEXTS),
)
integers = st.one_of(st.integers(), pick(BIG_INTS))
json_leaves = st.one_of(
    st.none(), st.booleans(), integers, st.floats(allow_nan=True, allow_infinity=True), texts
)


def json_values(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        json_leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=12,
    )


# The in-process client refuses, before sending anything, nesting past about 250 levels and
# object keys that are lone surrogates (its serialiser encodes keys to UTF-8).
client_values = json_values(plain_text) | st.integers(1, 200).map(nest)
# What the SDK's parsers can hand to a tool: nesting to ~990 levels (2026-07-28 HTTP).
parsed_values = json_values(any_text) | st.sampled_from([150, 255, 256, 257, 300, 980]).map(nest)


def valid_strategies(fuzz_agent: str) -> dict[str, st.SearchStrategy[Any]]:
    """Values that pass the type check, so calls get past it into the tools."""
    names = st.sampled_from(["editor", "reviewer", "n", "order-1", "a.b/c"]) | any_text
    resources = st.sampled_from(["src/app.py", "custom://x", "notes.md", CANARY_RESOURCE])
    return {
        "resource": resources | st.sampled_from(TRAVERSALS),
        "moved_to": resources | st.sampled_from(TRAVERSALS),
        "agent_id": st.sampled_from([fuzz_agent] * 4 + ["agent-0123456789abcdef", "agent-"]),
        "name": names,
        "model": names,
        "purpose": names,
        "outcome": st.sampled_from([*OUTCOMES, "expired", "abandoned", "MODIFIED"]),
        "timeout_seconds": st.floats(0, 0.02),
        "namespace": st.sampled_from(["n", "orders", "fuzz"]) | any_text,
        "key": st.sampled_from(["k", "status", "a/b"]) | any_text,
        "updated_by": names,
        "deleted_by": names,
        "expected_version": st.integers(0, 4),
        "since_version": st.integers(0, 4),
        "limit": st.integers(1, 20),
        "force": st.booleans(),
    }


def _wait_ready(name: str, value: Any) -> bool:
    """Whether ``value`` would make a wait or watch really wait (longer than a test can). Null
    counts, as it means the default 30 s, and so do NaN and infinities, which an SDK client
    sends as null."""
    if name != "timeout_seconds" or isinstance(value, bool):
        return False
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return True
    return isinstance(value, (int, float)) and 0.05 < value <= 300


def shown(value: Any, depth: int = 0) -> str:
    """A short repr that huge integers, 10 MB strings and deep nesting cannot break."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, str):
        return repr(value[:40]) + (f"[...{len(value):,} characters]" if len(value) > 40 else "")
    if isinstance(value, (list, dict)) and depth > 6:
        return "[...]" if isinstance(value, list) else "{...}"
    if isinstance(value, list):
        return "[" + ", ".join(shown(v, depth + 1) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{shown(k)}: {shown(v, depth + 1)}" for k, v in value.items()) + "}"
    return repr(value)


class Drawn:
    """Drawn arguments, with a repr hypothesis can print when it reports a failure."""

    def __init__(self, arguments: dict[str, Any] | None) -> None:
        self.arguments = arguments

    def __repr__(self) -> str:
        return shown(self.arguments)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def of_kind(kind: str, hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Hostile values, half of them of the parameter's own type, so they pass the type check
    and meet the tool's own checks."""
    same = {
        "string": texts,
        "integer": integers | st.floats(allow_nan=True, allow_infinity=True),
        "number": integers | st.floats(allow_nan=True, allow_infinity=True),
    }.get(kind)
    return hostile if same is None else same | hostile


@st.composite
def tool_arguments(
    draw: st.DrawFn,
    spec: ToolSpec,
    valid: dict[str, st.SearchStrategy[Any]],
    hostile: st.SearchStrategy[Any],
    keys: st.SearchStrategy[str],
) -> Drawn:
    """Arguments for one call of ``spec``. Most calls are valid but for one parameter (left
    out or hostile), so they get past the argument check into the tools; the rest are valid
    throughout or wild (every parameter left out, valid or hostile, plus extra fields). Waits
    and watches always get a timeout, and never one a test would have to sit out."""
    if draw(st.integers(0, 24)) == 0:
        return Drawn(None)
    plan = draw(st.sampled_from(["valid", "valid", "one_bad", "one_bad", "one_bad", "wild"]))
    bad = draw(st.sampled_from([p.name for p in spec.params])) if spec.params else None
    arguments: dict[str, Any] = {}
    for p in spec.params:
        if plan == "wild" or (plan == "one_bad" and p.name == bad):
            how = draw(
                st.sampled_from(
                    ["omit", "valid", "hostile"]
                    if plan == "wild"
                    else ["omit", "hostile", "hostile"]
                )
            )
        else:
            how = "valid" if p.required or draw(st.integers(0, 3)) else "omit"
        if p.name == "timeout_seconds" and how == "omit":
            how = "valid"  # the default is 30 s
        if how == "omit":
            continue
        value = draw(valid.get(p.name, hostile) if how == "valid" else of_kind(p.kind, hostile))
        if _wait_ready(p.name, value):
            value = 0
        arguments[p.name] = value
    extra_names = (
        st.sampled_from(
            ["agent", "resource_id", "expectedVersion", "__proto__", "namespace ", "KEY", ""]
        )
        | keys
    )
    if plan == "wild" and draw(st.booleans()):
        for name, value in draw(st.dictionaries(extra_names, hostile, max_size=2)).items():
            arguments.setdefault(name, value)
    return Drawn(arguments)


PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,  # each run draws afresh; a failure prints its example
)


# --------------------------------------------------------------------------------------------
# An in-process server behind a portal, for hypothesis (which runs its examples synchronously)
# --------------------------------------------------------------------------------------------


@dataclass
class InProcess:
    app: Agenthold
    client: Client
    coordinator: Coordinator

    async def through_client(self, tool: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
        with anyio.fail_after(ANSWER_LIMIT):
            result = await self.client.call_tool(tool, arguments)
        return check_reply(tool, result)

    async def straight(self, tool: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
        with anyio.fail_after(ANSWER_LIMIT):
            result = await self.app.call(tool, arguments, None)
        return check_reply(tool, result)

    def idle(self) -> bool:
        app = self.app
        return (
            app.in_flight == 0
            and not app._wakers
            and app.read_limiter.borrowed_tokens == 0
            and app.write_limiter.borrowed_tokens == 0
        )


@contextlib.asynccontextmanager
async def in_process(coordinator: Coordinator, tools: str, mode: str) -> AsyncIterator[InProcess]:
    async with in_process_client(coordinator, tools=tools, mode=mode) as (app, client):
        yield InProcess(app, client, coordinator)


@contextlib.contextmanager
def behind_portal(
    root: Path, tools: str, mode: str
) -> Iterator[tuple[BlockingPortal, InProcess, Canary]]:
    """An in-process server and client, run by a portal's event loop so that synchronous code
    (hypothesis) can call it. Afterwards the same client still gets ordinary answers, nothing
    is left running, and the canary is intact."""
    coordinator = open_coordinator(root)
    try:
        canary = plant_canary(coordinator)
        with (
            start_blocking_portal("asyncio") as portal,
            portal.wrap_async_context_manager(in_process(coordinator, tools, mode)) as served,
        ):
            try:
                yield portal, served, canary
            except BaseException as exc:  # a failed check: leave the server whole, then report
                failure: BaseException | None = exc
            else:
                failure = None
                if tools == "standard":
                    after = portal.call(
                        served.through_client, "agenthold_status", {"resource": CANARY_RESOURCE}
                    )
                    assert (after["status"], after["held_by"]) == ("claimed", canary.holder)
                else:
                    after = portal.call(
                        served.through_client, "agenthold_get", json.loads(canary_arguments())
                    )
                    assert (after["value"], after["version"]) == (canary.value, canary.version)
                assert served.idle()  # no call, wait or worker thread left behind
        if failure is not None:
            raise failure
        assert_canary_intact(coordinator, canary)
    finally:
        coordinator.store.close()


def tool_param(tools: list[str]) -> Any:
    return pytest.mark.parametrize("tool", tools)


# --------------------------------------------------------------------------------------------
# hypothesis through a real mcp.Client, both eras, and straight into Agenthold.call
# --------------------------------------------------------------------------------------------


def fuzz(root: Path, tools: str, mode: str, tool: str, *, straight: bool) -> None:
    """Send ``tool`` the calls hypothesis draws: through the in-process client, or (with
    ``straight``) right into ``Agenthold.call``, with what only the SDK's parsers deliver."""
    with behind_portal(root, tools, mode) as (portal, served, _):
        fuzz_agent = served.coordinator.register("fuzzer").agent_id
        spec = served.app.specs[tool]
        valid = valid_strategies(fuzz_agent)
        if straight:
            calls = tool_arguments(spec, valid, parsed_values, any_text)
            send = served.straight
        else:
            calls = tool_arguments(spec, valid, client_values, plain_text)
            send = served.through_client

        @PROPERTY
        @given(drawn=calls)
        def one_call(drawn: Drawn) -> None:
            portal.call(send, tool, drawn.arguments)

        one_call()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@tool_param(STANDARD_TOOLS)
def test_random_arguments_to_a_claim_tool_through_the_client_always_get_an_answer(
    tmp_path: Path, mode: str, tool: str
) -> None:
    fuzz(tmp_path, "standard", mode, tool, straight=False)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@tool_param(ADVANCED_TOOLS)
def test_random_arguments_to_a_store_tool_through_the_client_always_get_an_answer(
    tmp_path: Path, mode: str, tool: str
) -> None:
    fuzz(tmp_path, "advanced", mode, tool, straight=False)


@tool_param(STANDARD_TOOLS + ADVANCED_TOOLS)
def test_what_the_sdk_parsers_hand_over_nan_infinity_and_deep_nesting_gets_an_answer(
    tmp_path: Path, tool: str
) -> None:
    tools = "standard" if tool in STANDARD_TOOLS else "advanced"
    fuzz(tmp_path, tools, "auto", tool, straight=True)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_unknown_and_other_mode_tool_names_get_an_error_naming_the_tools(
    tmp_path: Path, mode: str
) -> None:
    with behind_portal(tmp_path, "standard", mode) as (portal, served, _):

        @PROPERTY
        @given(
            name=(
                plain_text | st.sampled_from([*ADVANCED_TOOLS, "agenthold_", "Agenthold_claim"])
            ).filter(lambda name: name not in STANDARD_TOOLS),
            drawn=(st.none() | st.dictionaries(plain_text, client_values, max_size=3)).map(Drawn),
        )
        def one_call(name: str, drawn: Drawn) -> None:
            reply = portal.call(served.through_client, name, drawn.arguments)
            assert (reply["status"], reply["error"]) == ("error", "unknown_tool")
            assert "agenthold_claim" in reply["hint"]

        one_call()


# --------------------------------------------------------------------------------------------
# Huge integers, NaN and nesting, position by position (in process)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("tools", ["standard", "advanced"])
async def test_a_5000_digit_integer_reaches_every_parameter_in_process_and_is_refused_by_name(
    tmp_path: Path, tools: str, mode: str
) -> None:
    """In process nothing parses JSON text, so a 5,000-digit integer arrives as an int; each
    parameter refuses it with an error naming it (0.10.0 hung or crashed on some)."""
    coordinator = open_coordinator(tmp_path)
    try:
        canary = plant_canary(coordinator)
        async with in_process(coordinator, tools, mode) as served:
            agent = coordinator.register("fuzzer").agent_id
            good = {
                "resource": "a.md",
                "agent_id": agent,
                "name": "n",
                "namespace": "n",
                "key": "k",
                "value": 1,
                "updated_by": "u",
                "deleted_by": "u",
                "since_version": 0,
                "timeout_seconds": 0,
                "force": True,
            }
            for tool, spec in served.app.specs.items():
                for p in spec.params:
                    arguments = {q.name: good[q.name] for q in spec.params if q.name in good}
                    arguments[p.name] = HUGE
                    reply = await served.through_client(tool, arguments)
                    assert reply["status"] == "error", (tool, p.name, reply)
                    assert p.name in reply["message"], (tool, p.name, reply)
                    assert "very large integer" in reply["message"] or p.name == "value"
        assert_canary_intact(coordinator, canary)
    finally:
        coordinator.store.close()


# --------------------------------------------------------------------------------------------
# Raw JSON-RPC on a stdio server's pipes
# --------------------------------------------------------------------------------------------

MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "hostile", "version": "0"},
}


def call_text(request_id: int | str, tool: str, arguments: str, *, modern: bool) -> str:
    """A tools/call request as JSON text; ``request_id`` and ``arguments`` are JSON texts, so
    they can hold what ``json.dumps`` cannot write (5,000-digit integers, NaN)."""
    meta = f',"_meta":{json.dumps(MODERN_META)}' if modern else ""
    return (
        f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call","params":{{"name":'
        f'{json.dumps(tool)},"arguments":{arguments}{meta}}}}}'
    )


class StdioServer(StdioPipes):
    """``python -m agenthold`` serving the advanced tools on ``db``, on pipes."""

    def __init__(self, root: Path, db: Path) -> None:
        super().__init__([sys.executable, *agenthold_args(db, root, "--tools", "advanced")], root)

    def tool(
        self,
        request_id: int | str,
        tool: str,
        arguments: str,
        *,
        modern: bool,
        timeout: float = ANSWER_LIMIT,
    ) -> Any:
        self.send(
            call_text(
                request_id if isinstance(request_id, int) else json.dumps(request_id),
                tool,
                arguments,
                modern=modern,
            )
        )
        return self.reply(request_id, timeout)


@contextlib.contextmanager
def stdio_server(
    root: Path, era: str, stdio_path: str
) -> Iterator[tuple[StdioServer, Canary, bool]]:
    """A stdio server with the advanced tools, and a canary. A connection speaks one protocol
    era: a 2025-11-25 one opens with the initialize handshake, a 2026-07-28 one carries the
    version in every request's _meta (yielded: whether requests must). On the warm path
    (``stdio_path``), the hostile lines cross the front's byte pump to a warm server."""
    coordinator = open_coordinator(root)
    try:
        canary = plant_canary(coordinator)
        server = StdioServer(root, root / "hostile.db")
        try:
            if era == LEGACY:
                server.handshake("hostile")
            else:  # no handshake: a first request waits out the start (seconds, when loaded)
                server.request("tools/list", {"_meta": MODERN_META}, STARTUP, request_id="up")
            yield server, canary, era == MODERN
            assert_went_warm(stdio_path)
        finally:
            status, err = server.close()
        assert status == 0 and "Traceback" not in err, err
        assert_canary_intact(coordinator, canary)
    finally:
        coordinator.store.close()


def assert_went_warm(stdio_path: str) -> None:
    """On the warm path, a warm server of this test's runtime directory served the calls."""
    if stdio_path == "warm":
        assert warm_pids(Path(os.environ["AGENTHOLD_RUNTIME_DIR"])), "no warm server served"


def tool_result(message: dict[str, Any], tool: str) -> dict[str, Any]:
    """The checked reply inside a raw tools/call answer."""
    assert "result" in message, message
    return check_reply(tool, CallToolResult.model_validate(message["result"]))


def canary_arguments() -> str:
    return json.dumps({"namespace": CANARY_NS, "key": CANARY_KEY})


ERAS = pytest.mark.parametrize("era", [LEGACY, MODERN])


@ERAS
def test_over_stdio_5000_digit_integers_anywhere_get_a_parse_error_with_the_request_id(
    tmp_path: Path, era: str, stdio_path: str
) -> None:
    """The SDK's stdio parser refuses integers over 4,300 digits, and until agenthold answered
    such lines itself they were dropped: the client waited forever. Each now gets -32700 with
    the request's id, found by agenthold's own parse, which has no digit limit."""
    placements = {
        "value": (
            "agenthold_set",
            f'{{"namespace":"n","key":"k","value":{BIG},"updated_by":"u","force":true}}',
        ),
        "limit": ("agenthold_history", f'{{"namespace":"n","key":"k","limit":{BIG}}}'),
        "name": ("agenthold_get", f'{{"namespace":{BIG},"key":"k"}}'),
        "extra": ("agenthold_get", f'{{"namespace":"n","key":"k","x":[{{"y":{BIG}}}]}}'),
    }
    with stdio_server(tmp_path, era, stdio_path) as (server, canary, modern):
        for request_id, (tool, arguments) in placements.items():
            answer = server.tool(request_id, tool, arguments, modern=modern)
            assert answer["error"]["code"] == -32700, answer
            assert "4,300 digits" in answer["error"]["message"]
        # the id itself is the huge number: the answer cannot name it (id null), so a client
        # could not match it; no SDK client sends such an id
        server.send(call_text(BIG, "agenthold_list", '{"namespace":"n"}', modern=modern))
        assert server.reply(None)["error"]["code"] == -32700
        after = server.tool("after", "agenthold_get", canary_arguments(), modern=modern)
        assert tool_result(after, "agenthold_get")["version"] == canary.version


@ERAS
def test_over_stdio_an_id_of_one_surrogate_escape_is_answered_with_that_id(
    tmp_path: Path, era: str, stdio_path: str
) -> None:
    """``"\\ud800"`` is valid JSON text for a string no UTF-8 can hold, so no answer can carry
    it: a line with such an id gets its error with id null (it used to end the server), and
    serving goes on."""
    with stdio_server(tmp_path, era, stdio_path) as (server, canary, modern):
        server.send('{"jsonrpc":"2.0","id":"\\ud800","method":')
        assert server.reply(None)["error"]["code"] == -32700
        meta = f',"params":{{"_meta":{json.dumps(MODERN_META)}}}' if modern else ""
        server.send(f'{{"jsonrpc":"2.0","id":"\\ud801","method":"tools/list"{meta}}}')
        assert server.reply(None)["error"]["code"] == -32700  # the SDK's parser refuses it
        after = server.tool("after", "agenthold_get", canary_arguments(), modern=modern)
        assert tool_result(after, "agenthold_get")["version"] == canary.version


@ERAS
def test_over_stdio_nan_and_infinity_in_every_number_are_errors_naming_the_argument(
    tmp_path: Path, era: str, stdio_path: str
) -> None:
    numbers = [
        ("agenthold_set", "value", '"namespace":"n","key":"k","updated_by":"u","force":true'),
        (
            "agenthold_set",
            "expected_version",
            '"namespace":"n","key":"k","value":1,"updated_by":"u"',
        ),
        ("agenthold_delete", "expected_version", '"namespace":"n","key":"k","deleted_by":"u"'),
        ("agenthold_history", "limit", '"namespace":"n","key":"k"'),
        ("agenthold_watch", "since_version", '"namespace":"n","key":"k","timeout_seconds":0'),
        ("agenthold_watch", "timeout_seconds", '"namespace":"n","key":"k","since_version":0'),
        ("agenthold_get", "namespace", '"key":"k"'),
    ]
    with stdio_server(tmp_path, era, stdio_path) as (server, _, modern):
        request_id = 0
        for tool, name, rest in numbers:
            for constant in ("NaN", "Infinity", "-Infinity"):
                request_id += 1
                answer = server.tool(
                    request_id, tool, f'{{"{name}":{constant},{rest}}}', modern=modern
                )
                reply = tool_result(answer, tool)
                assert reply["status"] == "error" and name in reply["message"], reply
                json.loads(answer["result"]["content"][0]["text"], parse_constant=refuse_constant)


@ERAS
def test_over_stdio_deep_nesting_long_strings_and_junk_lines_are_answered_and_serving_goes_on(
    tmp_path: Path, era: str, stdio_path: str
) -> None:
    with stdio_server(tmp_path, era, stdio_path) as (server, canary, modern):
        value = '"namespace":"n","key":"deep","updated_by":"u","force":true'
        ok = server.tool(
            1, "agenthold_set", f'{{"value":{"[" * 150}{"]" * 150},{value}}}', modern=modern
        )
        assert tool_result(ok, "agenthold_set")["status"] == "ok"  # 150 levels: a value
        deep = "[" * 300 + "]" * 300  # past the SDK parser's ~200 levels: -32700 with the id
        answer = server.tool(2, "agenthold_set", f'{{"value":{deep},{value}}}', modern=modern)
        assert answer["error"]["code"] == -32700
        assert "nested too deeply" in answer["error"]["message"]
        # past what any parser manages (Python's recursion limit at ~1,000 levels): the id is
        # still found, by a scan of the top level, so the client can match the answer
        for request_id, levels in ((3, 1_000), ("three", 100_000)):
            deep = "[" * levels + "]" * levels
            line = call_text(
                json.dumps(request_id),
                "agenthold_set",
                f'{{"value":{deep},{value}}}',
                modern=modern,
            )
            server.send(line)  # the large lines take seconds to scan on a loaded machine
            answer = server.reply(request_id, STARTUP)
            assert "nested too deeply" in answer["error"]["message"]
        ten_mb = server.tool(
            4, "agenthold_get", f'{{"namespace":"{"x" * 10_000_000}","key":"k"}}',
            modern=modern, timeout=STARTUP,
        )  # fmt: skip
        reply = tool_result(ten_mb, "agenthold_get")
        assert reply["error"] == "invalid_input" and "10000000 characters" in reply["message"]
        control = server.tool(
            5, "agenthold_get", '{"namespace":"a\\u0000\\u001b[2J","key":"k"}', modern=modern
        )
        assert "control character" in tool_result(control, "agenthold_get")["message"]
        for request_id, arguments in ((6, "[1,2]"), (7, '"text"'), (8, "5")):
            answer = server.tool(request_id, "agenthold_get", arguments, modern=modern)
            assert answer["error"]["code"] == -32602, answer  # the SDK checks the params' shape
        server.send("this is not JSON")
        assert server.reply(None)["error"]["code"] == -32700
        server.send('{"jsonrpc":"2.0","id":10,"hello":"not JSON-RPC"}')
        assert server.reply(10)["error"]["code"] == -32600
        # bytes that are not UTF-8 are a parse error with the id, as over HTTP (never U+FFFD
        # stored as if it had been sent) ...
        line = call_text(11, "agenthold_??", "{}", modern=modern).encode()
        server.send(line.replace(b"??", b"\xff\xfe"))
        answer = server.reply(11)
        assert answer["error"]["code"] == -32700 and "not valid UTF-8" in answer["error"]["message"]
        line = call_text(
            14,
            "agenthold_set",
            '{"namespace":"n","key":"utf","value":"??","updated_by":"u","force":true}',
            modern=modern,
        ).encode()
        server.send(line.replace(b"??", b"caf\xe9"))  # Latin-1, not UTF-8: nothing is stored
        assert server.reply(14)["error"]["code"] == -32700
        missing = server.tool(15, "agenthold_get", '{"namespace":"n","key":"utf"}', modern=modern)
        assert tool_result(missing, "agenthold_get")["status"] == "not_found"
        # ... while an escaped lone surrogate is a parse error to the SDK's parser
        answer = server.tool(12, "agenthold_\udcff", "{}", modern=modern)  # sent as \\udcff
        assert answer["error"]["code"] == -32700 and "surrogate" in answer["error"]["message"]
        after = server.tool(13, "agenthold_get", canary_arguments(), modern=modern)
        assert tool_result(after, "agenthold_get")["value"] == canary.value


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_sdk_client_sending_a_5000_digit_integer_over_stdio_gets_an_error_not_a_hang(
    tmp_path: Path, mode: str, stdio_path: str
) -> None:
    """The case the issue names, as users meet it: with 0.10.0 this call waited for the
    client's own timeout (forever by default). Now it fails at once with -32700, and the same
    connection goes on."""
    coordinator = open_coordinator(tmp_path)
    try:
        canary = plant_canary(coordinator)
        params = StdioServerParameters(
            command=sys.executable,
            args=agenthold_args(tmp_path / "hostile.db", tmp_path, "--tools", "advanced"),
            env=child_env(),
        )
        async with Client(params, mode=mode, read_timeout_seconds=STARTUP) as client:  # type: ignore[arg-type]
            await client.list_tools()
            with anyio.fail_after(ANSWER_LIMIT), pytest.raises(MCPError) as refused:
                await client.call_tool(
                    "agenthold_history", {"namespace": "n", "key": "k", "limit": HUGE}
                )
            assert refused.value.error.code == -32700
            assert "4,300 digits" in refused.value.error.message
            got = await client.call_tool("agenthold_get", json.loads(canary_arguments()))
            assert check_reply("agenthold_get", got)["version"] == canary.version
            assert_went_warm(stdio_path)
        assert_canary_intact(coordinator, canary)
    finally:
        coordinator.store.close()


# --------------------------------------------------------------------------------------------
# Raw HTTP
# --------------------------------------------------------------------------------------------


@dataclass
class HttpServed:
    url: str
    port: int
    coordinator: Coordinator
    canary: Canary
    app: Agenthold


@contextlib.asynccontextmanager
async def http_serving(
    root: Path, *, json_response: bool = False, keep_alive: float = 5.0
) -> AsyncIterator[HttpServed]:
    """agenthold's HTTP application (advanced tools) on uvicorn in this event loop, configured
    as ``agenthold --transport http`` configures it, on a free loopback port."""
    coordinator = open_coordinator(root)
    try:
        canary = plant_canary(coordinator)
        app = Agenthold(coordinator, tools="advanced")
        opts = ServeOptions(transport="http", tools="advanced", json_response=json_response)
        asgi = http_app(app, opts)
        async with uvicorn_serving(app, asgi, path=opts.path, keep_alive=keep_alive) as web:
            yield HttpServed(web.url, web.port, coordinator, canary, app)
        assert_canary_intact(coordinator, canary)
    finally:
        coordinator.store.close()


def post_headers(
    modern: bool, session: str | None = None, tool: str = "agenthold_get", **extra: str
) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": ACCEPT}
    if modern:
        headers.update(
            {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": tool}
        )
    else:
        headers["MCP-Protocol-Version"] = LEGACY
        if session is not None:
            headers["Mcp-Session-Id"] = session
    headers.update(extra)
    return headers


def rpc_messages(response: httpx2.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an answer, whether plain JSON or an event stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return sse_messages(response.text)
    return [response.json()]


async def still_serving(http: httpx2.AsyncClient, s: HttpServed, session: str) -> None:
    """Both eras still get the canary record, each within the answer limit."""
    for modern in (False, True):
        text = call_text(1, "agenthold_get", canary_arguments(), modern=modern)
        with anyio.fail_after(ANSWER_LIMIT):
            answer = await http.post(s.url, content=text, headers=post_headers(modern, session))
        assert answer.status_code == 200, answer.text
        (message,) = rpc_messages(answer)
        reply = tool_result(message, "agenthold_get")
        assert (reply["value"], reply["version"]) == (s.canary.value, s.canary.version)


BAD_BODIES: list[tuple[str, bytes, int, int | None, int | str | None]] = [
    # (what, body, HTTP status, JSON-RPC code or None, the id the error carries)
    ("truncated JSON", b'{"jsonrpc":"2.0","id":1,"method":', 400, -32700, 1),
    ("empty body", b"", 400, -32700, None),
    ("not JSON", b"hello", 400, -32700, None),
    ("a NUL byte", b'{"jsonrpc":"2.0","id":1,\x00"method":"tools/list"}', 400, -32700, 1),
    ("not UTF-8", b'{"jsonrpc":"2.0","id":"u8","method":"\xff\xfe"}', 400, None, "u8"),
    (
        "5,001-digit id",
        call_text(BIG, "agenthold_list", '{"namespace":"n"}', modern=False).encode(),
        400,
        -32700,
        None,  # an id of 5,001 digits is no id anyone sent on purpose
    ),
    (
        "5,001-digit argument",
        call_text(
            2,
            "agenthold_set",
            f'{{"namespace":"n","key":"k","value":{BIG},"updated_by":"u","force":true}}',
            modern=False,
        ).encode(),
        400,
        -32700,
        2,
    ),
    (
        "nesting 100,000 deep",
        call_text(
            3,
            "agenthold_get",
            f'{{"namespace":{"[" * 100_000}{"]" * 100_000},"key":"k"}}',
            modern=False,
        ).encode(),
        400,
        -32700,
        3,
    ),
    ("a JSON array", b'[{"jsonrpc":"2.0","id":4,"method":"tools/list"}]', 400, None, None),
    ("a JSON number", b"42", 400, None, None),
    ("no method", b'{"jsonrpc":"2.0","id":5}', 400, None, 5),
    # an id that is a lone surrogate escape: valid JSON text, but no UTF-8 string can hold it
    ("an id of one surrogate", b'{"jsonrpc":"2.0","id":"\\ud800","method":', 400, -32700, "\ud800"),
    (
        "a request with such an id",
        b'{"jsonrpc":"2.0","id":"\\ud801","method":"ping"}',
        400,
        None,  # -32700 (pydantic refuses the escape) or -32602 (no _meta: json accepts it)
        "\ud801",
    ),
    (
        "params not an object",
        b'{"jsonrpc":"2.0","id":"call-7","method":"tools/call","params":"oops"}',
        400,
        None,
        "call-7",
    ),
    (
        "over 4 MiB",
        b'{"jsonrpc":"2.0","id":6,"method":"x","params":{"s":"'
        + b"a" * (4 * 1024 * 1024 + 1)
        + b'"}}',
        413,
        None,
        None,  # refused before it is read: plain text, no JSON-RPC
    ),
]


@pytest.mark.anyio
async def test_the_id_scan_of_a_4_mib_body_does_not_stall_other_requests(tmp_path: Path) -> None:
    """A 4 MiB body of brackets with no id costs the top-level scan about a second of Python;
    it runs beside the event loop, so pings sent meanwhile are answered in their usual time,
    not after the scan (they waited for all of it when it ran on the loop)."""
    async with (
        http_serving(tmp_path, json_response=True) as s,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        session = await open_session(http, s.url)
        hostile = b'{"jsonrpc":"2.0","method":"x","params":' + b"[" * (
            http_module.MAX_BODY_BYTES - 100
        )
        ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
        waits: list[float] = []
        took = 0.0

        async def send_hostile() -> None:
            nonlocal took
            started = time.perf_counter()
            answer = await http.post(s.url, content=hostile, headers=post_headers(False, session))
            took = time.perf_counter() - started
            assert answer.status_code == 400 and answer.json()["id"] is None

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_hostile)
            while not took:
                started = time.perf_counter()
                answer = await http.post(s.url, content=ping, headers=post_headers(False, session))
                waits.append(time.perf_counter() - started)
                assert answer.status_code == 200
                await anyio.sleep(0.01)
        assert len(waits) >= 3 and max(waits) < took / 2, (max(waits), took)


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
async def test_malformed_and_oversized_http_bodies_get_4xx_in_both_eras_and_others_are_served(
    tmp_path: Path, json_response: bool
) -> None:
    """The SDK's parsers (pydantic for 2025-11-25 sessions, the json module for 2026-07-28)
    refuse each of these with 400 or 413 before any tool runs; a JSON error body carries
    -32700 when the text could not be parsed, and the request's id whenever its text shows
    one (agenthold puts it into the SDK's ``id: null``, with stdio's own scan)."""
    async with (
        http_serving(tmp_path, json_response=json_response) as s,
        httpx2.AsyncClient(timeout=ANSWER_LIMIT) as http,
    ):
        session = await open_session(http, s.url)
        for modern in (False, True):
            for what, body, status, code, request_id in BAD_BODIES:
                with anyio.fail_after(ANSWER_LIMIT):
                    answer = await http.post(
                        s.url, content=body, headers=post_headers(modern, session)
                    )
                assert answer.status_code == status, (modern, what, answer.text[:300])
                if code is not None:
                    assert answer.json()["error"]["code"] == code, (modern, what, answer.text)
                if status == 400:  # the id it was sent with, wherever the text shows it
                    error = answer.json()
                    assert "error" in error and error["id"] == request_id, (modern, what, error)
            await still_serving(http, s, session)


def test_the_top_level_id_scan_finds_only_a_top_level_id_and_gives_up_on_broken_text() -> None:
    """rpc_id.top_level_id, shared by stdio and HTTP: strings are skipped with their escapes,
    nested ids do not count, and text it cannot follow has no id."""
    from agenthold.serve.rpc_id import top_level_id

    assert top_level_id('{"params": {"id": 1}, "a": "x\\"\\\\", "id" : "r-1"}') == "r-1"
    assert top_level_id('{"method": "unterminated') is None
    assert top_level_id('{"id": 1.5}') is None  # not an id JSON-RPC allows
    assert top_level_id('{"id": true}') is None
    assert top_level_id('{"id"') is None
    assert top_level_id('[{"id": 4}]') is None


def test_an_answer_that_needs_no_id_goes_out_as_it_came() -> None:
    """with_request_id touches only a JSON error whose id is null: an error that has its id,
    a plain-text refusal and an error the request shows no id for are sent unchanged."""
    start = {"type": "http.response.start", "status": 400,
             "headers": [(b"content-type", b"application/json")]}  # fmt: skip
    request = b'{"jsonrpc":"2.0","id":3,"method":"x"'
    for body in (b'{"jsonrpc":"2.0","id":2,"error":{"code":-32601,"message":"no"}}',
                 b'{"jsonrpc":"2.0","result":{}}'):  # fmt: skip
        answer = {"type": "http.response.body", "body": body}
        assert http_module.with_request_id(start, answer, request) == (start, answer)
    plain = {**start, "headers": [(b"content-type", b"text/plain; charset=utf-8")]}
    answer = {"type": "http.response.body", "body": b"Request body too large"}
    assert http_module.with_request_id(plain, answer, request) == (plain, answer)
    null = {"type": "http.response.body", "body": b'{"jsonrpc":"2.0","id":null,"error":{}}'}
    assert http_module.with_request_id(start, null, b"[1]") == (start, null)
    fixed_start, fixed = http_module.with_request_id(start, null, request)
    assert json.loads(fixed["body"])["id"] == 3
    assert (b"content-length", str(len(fixed["body"])).encode()) in fixed_start["headers"]


async def test_http_nan_infinity_and_deep_nesting_reach_the_tools_and_get_errors(
    tmp_path: Path,
) -> None:
    """What both HTTP parsers accept but JSON forbids (NaN, Infinity) and nesting the
    2026-07-28 parser lets through (~990 levels) reach the tools, which answer isError."""
    async with (
        http_serving(tmp_path) as s,
        httpx2.AsyncClient(timeout=ANSWER_LIMIT) as http,
    ):
        session = await open_session(http, s.url)
        cases = [
            (
                "agenthold_set",
                '{"namespace":"n","key":"k","value":[1,NaN],"updated_by":"u","force":true}',
                "NaN",
            ),
            (
                "agenthold_watch",
                '{"namespace":"n","key":"k","since_version":0,"timeout_seconds":Infinity}',
                "finite",
            ),
            ("agenthold_history", '{"namespace":"n","key":"k","limit":-Infinity}', "limit"),
            (
                "agenthold_set",
                '{"namespace":"n","key":"k","value":'
                + "[" * 900
                + "]" * 900
                + ',"updated_by":"u","force":true}',
                "nested deeper than 256",
            ),
        ]
        for modern in (False, True):
            for tool, arguments, says in cases:
                if not modern and "nested" in says:
                    continue  # a 2025-11-25 session's parser stops at ~200 levels (400)
                body = call_text(7, tool, arguments, modern=modern)
                answer = await http.post(
                    s.url, content=body, headers=post_headers(modern, session, tool)
                )
                assert answer.status_code == 200, answer.text
                (message,) = rpc_messages(answer)
                reply = tool_result(message, tool)
                assert reply["status"] == "error" and says in reply["message"], reply
        await still_serving(http, s, session)


async def test_wrong_content_types_and_accept_headers_get_4xx_and_others_are_served(
    tmp_path: Path,
) -> None:
    body = call_text(1, "agenthold_list", '{"namespace":"n"}', modern=True).encode()
    async with (
        http_serving(tmp_path) as s,
        httpx2.AsyncClient(timeout=ANSWER_LIMIT) as http,
    ):
        session = await open_session(http, s.url)
        for modern in (False, True):
            base = post_headers(modern, session, "agenthold_list")
            for content_type in (
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
                "application/xml",
                "",
            ):
                answer = await http.post(
                    s.url, content=body, headers={**base, "Content-Type": content_type}
                )
                assert answer.status_code == 400, (content_type, answer.text)
            for accept in ("text/html", "image/png"):
                answer = await http.post(s.url, content=body, headers={**base, "Accept": accept})
                assert answer.status_code == 406, (accept, answer.text)
            answer = await http.put(s.url, content=body, headers=base)
            assert answer.status_code == 405
        await still_serving(http, s, session)


async def test_a_client_that_stalls_in_its_body_gets_408_while_others_are_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agenthold.serve.http.BODY_TIMEOUT", 1.0)
    async with (
        http_serving(tmp_path, json_response=True) as s,
        httpx2.AsyncClient(timeout=ANSWER_LIMIT) as http,
    ):
        session = await open_session(http, s.url)
        stalled = []
        for chunked in (False, True):
            stream = await raw_connection(s.port)
            length = "Transfer-Encoding: chunked" if chunked else "Content-Length: 500"
            head = post_head(
                s.port,
                f"MCP-Protocol-Version: {MODERN}",
                "Mcp-Method: tools/call",
                "Mcp-Name: agenthold_get",
                length,
            )
            partial = b"b\r\n" + b'{"jsonrpc":' if chunked else b'{"jsonrpc":'
            await stream.send(head + partial)  # and then nothing more
            stalled.append(stream)
        await still_serving(http, s, session)  # in milliseconds, while both clients stall:
        for stream in stalled:
            with anyio.move_on_after(0.01):
                raise AssertionError(
                    f"answered before the body deadline: {await stream.receive()!r}"
                )
        for stream in stalled:
            async with stream:
                with anyio.fail_after(ANSWER_LIMIT):
                    answer = await stream.receive()
            assert answer.startswith(b"HTTP/1.1 408"), answer
        await still_serving(http, s, session)


async def test_a_client_stalled_inside_its_headers_gets_408_and_others_are_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn (h11) has no deadline for a request's head; agenthold adds one (HEAD_TIMEOUT),
    so a client that sends half its headers and stops gets 408 and loses its connection
    instead of holding it (and a file descriptor) forever. Nobody else is held up meanwhile."""
    monkeypatch.setattr(http_module, "HEAD_TIMEOUT", 0.5)
    async with (
        http_serving(tmp_path, keep_alive=0.2) as s,
        httpx2.AsyncClient(timeout=ANSWER_LIMIT) as http,
    ):
        session = await open_session(http, s.url)
        partial = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nContent-Ty".encode()
        stalled = []
        for _ in range(30):
            stream = await raw_connection(s.port)
            await stream.send(partial)
            stalled.append(stream)
        await still_serving(http, s, session)  # while they stall
        for stream in stalled:
            with anyio.fail_after(ANSWER_LIMIT):
                answer = await stream.receive()
                assert answer.startswith(b"HTTP/1.1 408"), answer
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    while True:
                        await stream.receive()
            await stream.aclose()
        await still_serving(http, s, session)

        # slow but complete headers, within the deadline, are served
        slow = await raw_connection(s.port)
        async with slow:
            await slow.send(b"GET /nowhere HTTP/1.1\r\n")
            await anyio.sleep(0.2)
            await slow.send(f"Host: 127.0.0.1:{s.port}\r\n\r\n".encode())
            with anyio.fail_after(ANSWER_LIMIT):
                assert (await slow.receive()).startswith(b"HTTP/1.1 404")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_sdk_http_client_asked_to_send_a_5000_digit_integer_fails_on_its_own_side(
    tmp_path: Path, mode: str
) -> None:
    """Not fixable on the server's side, kept visible: the SDK's HTTP client logs each message
    it sends with its repr, which raises for an integer over 4,300 digits, and that ends the
    client's own transport ("Connection closed") before anything is sent. The call fails at
    once rather than hanging, and the server serves everyone else as before."""
    async with http_serving(tmp_path) as s, httpx2.AsyncClient(timeout=ANSWER_LIMIT) as http:
        async with Client(streamable_http_client(s.url, http_client=http), mode=mode) as client:  # type: ignore[arg-type]
            await client.list_tools()
            with anyio.fail_after(ANSWER_LIMIT), pytest.raises(MCPError, match="closed"):
                await client.call_tool(
                    "agenthold_history", {"namespace": "n", "key": "k", "limit": HUGE}
                )
        session = await open_session(http, s.url)
        await still_serving(http, s, session)
