"""The tool framework: how a tool is declared, how its arguments are checked, how a reply
becomes an MCP result, and what a tool's handler may ask of the application.

Decisions behind it:
- agenthold owns its JSON schemas and checks every argument itself (no pydantic model per
  call): any bad input becomes a ToolError, which the core turns into an ``isError`` result
  whose JSON says ``status: "error"`` with a message and a hint.
- A handler sees the application only through ``App`` (database work on the right thread
  limiter, waits on the change feed, the agents a connection named), never a transport, so the
  tool sets (``claim_tools``, ``store_tools``) run unchanged over stdio, HTTP or in process.
- Every reply is one strict-JSON text block equal to the structured content.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import mcp.types as types

from agenthold.identity.principals import Principal

if TYPE_CHECKING:
    from agenthold.bus.messagebus import MessageBus
    from agenthold.claims.coordinator import Coordinator
    from agenthold.store import StateStore

MAX_WAIT_SECONDS = 300  # longest agenthold_wait / agenthold_watch a tool call may ask for
DEFAULT_WAIT_SECONDS = 30.0
Reply = dict[str, Any]


class ToolError(Exception):
    """A call the agent must fix: becomes an isError result with a message and a hint."""

    def __init__(self, message: str, hint: str, kind: str = "invalid_arguments") -> None:
        super().__init__(message)
        self.hint = hint
        self.kind = kind


@dataclass(frozen=True)
class Param:
    name: str
    kind: Literal["string", "integer", "number", "boolean", "array", "json"]
    description: str
    required: bool = True
    default: Any = None
    enum: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None  # of a string; the layer below checks it, with its message
    # Listed as required in the schema although a call may leave it out: expected_version,
    # which `force` makes unnecessary (the tool then explains what is missing, if anything).
    advertised: bool = False

    def schema(self) -> dict[str, Any]:
        # a name that says it all (thread_id) needs no description: the schema stays small
        schema: dict[str, Any] = {"description": self.description} if self.description else {}
        if self.kind != "json":
            schema["type"] = self.kind
        if self.enum:
            schema["enum"] = list(self.enum)
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.max_length is not None:
            schema["maxLength"] = self.max_length
        if not self.required and self.default is not None:
            schema["default"] = self.default
        return schema

    def check(self, tool: str, value: Any) -> Any:
        """Return ``value`` converted to this parameter's Python type, or raise ToolError."""
        kind = self.kind
        if kind == "json":
            return value
        ok: bool
        if kind == "string":
            ok = isinstance(value, str)
        elif kind == "array":
            ok = isinstance(value, list)
        elif kind == "boolean":
            ok = isinstance(value, bool)
        elif kind == "integer":
            if isinstance(value, float) and value.is_integer():
                value = int(value)  # JSON Schema counts 3.0 as an integer
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            # an int is always finite (math.isfinite would overflow on a 5,000-digit one)
            if ok and isinstance(value, float) and not math.isfinite(value):
                raise ToolError(
                    f"{self.name} must be a finite number, got {value!r}",
                    f"Pass a number between {_bound(self.minimum)} and {_bound(self.maximum)}."
                    if self.minimum is not None and self.maximum is not None
                    else "Pass a finite number.",
                )
        if not ok:
            raise ToolError(
                f"{self.name} must be {_a(kind)}, got {_json_type(value)}",
                f"Call {tool} again with {self.name} as {_a(kind)}.",
            )
        if self.enum and value not in self.enum:
            raise ToolError(
                f"{self.name} must be one of {', '.join(self.enum)}; got {short(value)}",
                f"Use one of: {', '.join(self.enum)}.",
            )
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            low = "" if self.minimum is None else _bound(self.minimum)
            high = "" if self.maximum is None else _bound(self.maximum)
            bounds = f"from {low} to {high}" if low and high else f"at least {low or high}"
            raise ToolError(
                f"{self.name} must be {bounds}, got {short(value)}",
                f"Call {tool} again with {self.name} {bounds}.",
            )
        return value


def _bound(limit: float) -> str:
    """A schema bound as people write it: 300, not 300.0; 9223372036854775807, not 9.2e+18."""
    return str(int(limit)) if float(limit).is_integer() else f"{limit:g}"


def _a(kind: str) -> str:
    return {"integer": "an integer", "array": "an array", "json": "a JSON value"}.get(
        kind, f"a {kind}"
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        shown = short(value)
        return shown if shown.startswith("a very") else f"the number {shown}"
    if isinstance(value, str):
        return f"the string {short(value)}"
    return "an array" if isinstance(value, list) else "an object"


def short(value: Any, limit: int = 60) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return "a very large integer"
    try:
        text = repr(value)
    except ValueError:  # a container holding an integer Python will not print (4,300 digits)
        return "a value holding a very large integer"
    return text if len(text) <= limit else text[:limit] + "…"


Handler = Callable[["ToolCall"], Awaitable[Reply]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    params: tuple[Param, ...]
    read_only: bool
    destructive: bool
    idempotent: bool
    handler: Handler
    # True: a small declaration for a set that must fit a byte budget: no outputSchema and no
    # repeat of the title in the annotations (replies are structured content all the same)
    compact: bool = False

    def declaration(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema={
                "type": "object",
                "properties": {p.name: p.schema() for p in self.params},
                "required": [p.name for p in self.params if p.required or p.advertised],
                "additionalProperties": False,
            },
            output_schema=None if self.compact else OUTPUT_SCHEMA,
            annotations=types.ToolAnnotations(
                title=None if self.compact else self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.destructive,
                idempotent_hint=self.idempotent,
                open_world_hint=False,
            ),
        )

    def bind(self, arguments: dict[str, Any] | None) -> dict[str, Any]:
        """Check the call's arguments against the parameters. A null counts as absent."""
        arguments = arguments or {}
        known = {p.name for p in self.params}
        extra = sorted(k for k in arguments if k not in known)
        if extra:
            accepted = ", ".join(p.name for p in self.params) or "no arguments"
            raise ToolError(
                f"{self.name} does not take {', '.join(map(repr, extra))}",
                f"Call it with only these arguments: {accepted}.",
            )
        bound: dict[str, Any] = {}
        for p in self.params:
            value = arguments.get(p.name)
            if value is None and (p.kind != "json" or p.name not in arguments):
                if p.required:
                    raise ToolError(
                        f"{self.name} needs the argument {p.name!r} ({p.description})",
                        f"Call {self.name} again with {p.name}.",
                    )
                bound[p.name] = p.default
            else:
                bound[p.name] = p.check(self.name, value)
        return bound


OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "description": "what happened; 'error' on failure"},
    },
    "required": ["status"],
}


# How a call reports progress to its client (MCP's progress, total and message), when the
# client asked for progress with a progressToken; and a wait's own progress: seconds waited.
Report = Callable[[float, "float | None", "str | None"], Awaitable[None]]
Progress = Callable[[float], Awaitable[None]]


@dataclass
class ToolCall:
    """One call: its checked arguments, the connection it arrived on, and how to report its
    progress (None: the client did not ask for progress)."""

    args: dict[str, Any]
    connection: object | None
    report: Report | None = None
    principal: Principal | None = None  # who called, as a token says; None: trusted or no auth

    @property
    def by(self) -> str | None:
        """The principal's name, which agents are bound to and history records."""
        return None if self.principal is None else self.principal.name

    def progress(self, total: float, waiting_for: str) -> Progress | None:
        """A wait's progress reporter: each report says how long it has waited, out of
        ``total`` seconds, for ``waiting_for`` (None when the client asked for no progress)."""
        report = self.report
        if report is None:
            return None

        async def send(elapsed: float) -> None:
            message = f"waited {elapsed:.0f} s of {total:g} s for {waiting_for}"
            await report(elapsed, total, message)  # elapsed grows: progress must increase

        return send


# A waiter's look: the reply if the wait is over, else the topics to listen to and a unix time
# to look again at (a holder's lease end), if any.
Look = Callable[[], Awaitable[tuple[Reply | None, Iterable[tuple[str, ...]], float | None]]]


class App(Protocol):
    """What a tool handler may use of the application (``server.Agenthold`` is one)."""

    @property
    def coordinator(self) -> Coordinator: ...

    @property
    def store(self) -> StateStore: ...

    @property
    def bus(self) -> MessageBus:
        """The message bus on the store's database (its tables are made on first use)."""

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a short database read in a worker thread."""

    async def write(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a short database write in a worker thread."""

    def write_later(self, fn: Callable[[], Any], seconds: float) -> None:
        """Run the write ``fn``, which just failed, after the next write that succeeds, if
        that comes within ``seconds`` (after that it is moot)."""

    async def wait_for(
        self,
        look: Look,
        give_up: Callable[[], Awaitable[Reply]],
        timeout: float,
        progress: Progress | None = None,
    ) -> Reply:
        """Look until ``look`` returns a reply or ``timeout`` passes (then ``give_up``)."""

    def note_agent(
        self, connection: object | None, agent_id: str, *, registered: bool = False
    ) -> None:
        """Remember that ``connection`` named ``agent_id`` (its lease ends with it)."""

    @property
    def host(self) -> str | None:
        """The process a stdio client runs in (agenthold.hooks.ancestry), else None."""


MAX_REPLY_BYTES = 16 * 1024 * 1024  # of JSON text in UTF-8: larger replies are refused, not sent
# The reply of a listing tool's page, unless the call asks for more (max_bytes): hosts refuse
# long tool replies (Claude Code: 25,000 tokens by default), and 32 KiB of JSON stays under
# that even at 1.3 bytes a token, far below what JSON tokenizes to (about 3 to 4 bytes a token
# for text, 2 for dense numbers and timestamps). A page holds at least one item, so one item
# larger than this (a value near the 1 MiB limit) comes alone, over it.
PAGE_BYTES = 32 * 1024
PAGE_MAX_BYTES = Param(
    "max_bytes",
    "integer",
    f"the most bytes of JSON this page's reply may hold (default {PAGE_BYTES:,}, which any "
    f"MCP host accepts; up to {MAX_REPLY_BYTES:,}); a page holds at least one item",
    False,
    PAGE_BYTES,
    minimum=1,
    maximum=MAX_REPLY_BYTES,
)


def _utf8_bytes(text: str) -> int:
    """How many bytes ``text`` takes in UTF-8, as a reply travels. ASCII text (most replies)
    is its length, found without a copy (``isascii`` is a flag of the string); other text is
    encoded to be counted (a lone surrogate, which no value holds, counts 3 rather than
    failing here)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def result(reply: Reply) -> types.CallToolResult:
    text = _dumps(reply)
    # pages keep replies well below; this bounds the rest. A text of at most a quarter of the
    # limit in characters is under it in bytes (4 at most a character): not encoded to count.
    size = len(text) if len(text) <= MAX_REPLY_BYTES // 4 else _utf8_bytes(text)
    if size > MAX_REPLY_BYTES:
        return error_result(
            "reply_too_large",
            f"the reply would be {size / 2**20:.1f} MiB of JSON, over the "
            f"{MAX_REPLY_BYTES // 2**20} MiB a reply may be; nothing was sent",
            "Ask for less: a smaller limit, or one page at a time with cursor where the tool "
            "takes one.",
        )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=reply,
    )


def error_result(kind: str, message: str, hint: str, **facts: Any) -> types.CallToolResult:
    """An error reply; ``facts`` are fields a client acts on beyond the message (a not_holder
    error's ``held_by``), so that it never has to parse the message for them."""
    reply = {"status": "error", "error": kind, "message": message, "hint": hint, **facts}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_dumps(reply))],
        structured_content=reply,
        is_error=True,
    )


def _dumps(reply: Reply) -> str:
    return json.dumps(reply, ensure_ascii=False, allow_nan=False)


def json_size(value: Any) -> int:
    """The bytes ``value`` takes in a reply's JSON text (UTF-8), as ``result`` writes it."""
    return _utf8_bytes(_dumps(value))


def fit_page(reply: Reply, field: str, budget: int, finish: Callable[[Reply, int], Reply]) -> Reply:
    """``reply`` cut to at most ``budget`` bytes of JSON by keeping the first items of its list
    ``field`` (always at least one): ``finish(reply, kept)`` is called with the list already
    cut to ``kept`` items, and sets the cursor (and hint) to read on after the last of them,
    when ``kept`` is less than there were. A reply within the budget is finished as it is."""
    items: list[Any] = reply[field]
    whole = finish(dict(reply), len(items))
    if len(items) <= 1 or json_size(whole) <= budget:
        return whole
    used = json_size(finish({**reply, field: items[:1]}, 1))  # the rest of the reply, and one
    kept = 1
    for item in items[1:]:
        used += json_size(item) + 2  # ", " between items
        if used > budget:
            break
        kept += 1
    while True:  # the cursor's own length can differ from item to item: check the whole
        cut = finish({**reply, field: items[:kept]}, kept)
        if kept == 1 or json_size(cut) <= budget:
            return cut
        kept -= 1


WAIT_TIMEOUT = Param(
    "timeout_seconds",
    "number",
    f"how long to wait, in seconds (0 to {MAX_WAIT_SECONDS:g})",
    required=False,
    default=DEFAULT_WAIT_SECONDS,
    minimum=0,
    maximum=MAX_WAIT_SECONDS,
)
