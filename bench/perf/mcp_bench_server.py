"""The servers bench/perf/mcp_bench.py talks to over stdio.

    python bench/perf/mcp_bench_server.py [agenthold's serving flags]  # --db X --tools advanced
    python bench/perf/mcp_bench_server.py --bare                       # the SDK floor

Decisions behind it:
- The first form is the real agenthold stdio server (the same flags, checks, logging and
  ``serve_stdio`` as ``agenthold`` itself, through the faces agenthold.cli and agenthold.serve)
  with one extra tool, ``bench_noop``. The no-op
  takes the same path as every agenthold tool (argument binding, dispatch, reply shaping, the
  same output schema) but does no database work, so a tool's time minus the no-op's, measured
  on the same server in the same run, is what the tool itself costs.
- ``--bare`` is a low-level ``mcp`` Server with one no-op tool on the SDK's own stdio streams and
  nothing else: how long the SDK alone takes from spawn to the first answered call.
- Nothing is imported before the mode is known, so each form pays only for its own imports (not
  even bench/harness.py: the bare form's start-up is a measured floor).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

NOOP = "bench_noop"


def serve_agenthold(argv: list[str]) -> int:
    try:
        import agenthold  # noqa: F401
    except ImportError:  # a source checkout without agenthold installed
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import anyio

    from agenthold import cli, serve

    args = cli.build_parser().parse_args(argv)
    try:
        opts, warnings = cli.serve_options(args, dict(os.environ))
    except cli.UsageError as exc:
        print(f"mcp_bench_server: {exc}", file=sys.stderr)
        return 2
    if opts.transport != "stdio":
        print("mcp_bench_server: only --transport stdio is supported", file=sys.stderr)
        return 2
    for line in warnings:
        print(f"agenthold: {line}", file=sys.stderr)
    coordinator = cli.open_coordinator(opts)
    logging.basicConfig(
        stream=sys.stderr,
        level=opts.log_level.upper(),
        format="agenthold: %(levelname)s: %(message)s",
    )
    app = serve.Agenthold(coordinator, tools=opts.tools, disconnect_grace=opts.disconnect_grace)
    app.transport = opts.transport
    app.reap_idle = opts.reap_idle

    async def noop(call: serve.ToolCall) -> dict[str, Any]:
        return {"status": "ok"}

    spec = serve.ToolSpec(
        NOOP,
        "Do nothing",
        "Does nothing and answers status ok (for benchmarks).",
        (),
        read_only=True,
        destructive=False,
        idempotent=True,
        handler=noop,
    )
    app.specs[spec.name] = spec
    app.declarations.append(spec.declaration())
    try:
        anyio.run(serve.serve_stdio, app, cli.stop_signals)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        coordinator.store.close()


def serve_bare() -> int:
    import anyio
    import mcp.types as types
    from mcp.server import Server, ServerRequestContext
    from mcp.server.stdio import stdio_server

    tool = types.Tool(name=NOOP, input_schema={"type": "object"})

    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(
        ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return types.CallToolResult(
            content=[types.TextContent(type="text", text='{"status": "ok"}')]
        )

    bare = Server("bench-bare", version="0", on_list_tools=list_tools, on_call_tool=call_tool)

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await bare.run(read_stream, write_stream, bare.create_initialization_options())

    anyio.run(run)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--bare"]:
        return serve_bare()
    return serve_agenthold(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
