"""What older-protocol sessions that are never closed cost an HTTP server, with and without the
per-principal bound (sessions.py).

    python bench/perf/session_bench.py                  # 3,000 sessions opened by one token
    python bench/perf/session_bench.py --sessions 10000
    python bench/perf/session_bench.py --quick          # 300 sessions: a smoke run

For each setting, one ``agenthold --transport http --json-response`` process with a token; one
client opens ``--sessions`` sessions of the 2025-11-25 protocol (initialize, 8 at a time) and
closes none, as a client that leaves without a DELETE does. The baseline, in the same run, is
``--session-limit 10000``: the SDK's own cap over all callers, which was the only bound before.
The table gives the server's resident memory before and after, what each session cost, how
many of the sessions are still open at the end (a tools/list with each id), and whether a new
client of the same token still gets a session. Memory the server freed is not always given
back to the system, so the bounded figure is an upper bound.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import finish, free_port, machine, machine_line, options, table

TOKEN = "session-bench-token"
ACCEPT = "application/json, text/event-stream"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "session-bench", "version": "0"},
    },
}


def resident_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def one_setting(work: Path, limit: int, sessions: int) -> dict[str, Any]:
    import httpx2

    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server = subprocess.Popen(
        [sys.executable, "-m", "agenthold", "--db", str(work / f"s{limit}.db"),
         "--transport", "http", "--port", str(port), "--claim-ttl", "60", "--json-response",
         "--session-limit", str(limit)],
        env={**os.environ, "AGENTHOLD_AUTH_TOKEN": TOKEN},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    headers = {"Content-Type": "application/json", "Accept": ACCEPT}
    try:
        async with httpx2.AsyncClient(
            timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as http:
            for _ in range(300):  # until it serves
                try:
                    await http.get(url)
                    break
                except httpx2.TransportError:
                    await asyncio.sleep(0.1)
            await http.post(url, json=INITIALIZE, headers=headers)  # warm
            before = resident_kb(server.pid)
            ids: list[str] = []
            gate = asyncio.Semaphore(8)
            started = time.monotonic()

            async def open_one() -> None:
                async with gate:
                    reply = await http.post(url, json=INITIALIZE, headers=headers)
                    if reply.status_code == 200:
                        ids.append(reply.headers["mcp-session-id"])

            await asyncio.gather(*(open_one() for _ in range(sessions)))
            seconds = time.monotonic() - started
            after = resident_kb(server.pid)
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            still_open = 0
            for sid in ids:
                reply = await http.post(
                    url,
                    json=listing,
                    headers={
                        **headers,
                        "Mcp-Session-Id": sid,
                        "MCP-Protocol-Version": "2025-11-25",
                    },
                )
                still_open += reply.status_code == 200
            newcomer = await http.post(url, json=INITIALIZE, headers=headers)
    finally:
        server.terminate()
        server.wait(30)
    return {
        "limit": limit,
        "opened": len(ids),
        "seconds": seconds,
        "before": before,
        "after": after,
        "still_open": still_open,
        "newcomer": newcomer.status_code,
    }


def main(argv: list[str] | None = None) -> int:
    parser = options(__doc__, quick="300 sessions: a smoke run")
    parser.add_argument("--sessions", type=int, help="sessions to open (3000)")
    args = parser.parse_args(argv)
    sessions = args.sessions if args.sessions is not None else 300 if args.quick else 3000
    if not 0 < sessions <= 10_000:
        parser.error(f"--sessions must be from 1 to 10000, got {sessions}")
    facts = machine()
    if not args.json:  # the machine first: the run takes minutes
        print(f"{machine_line(facts)}\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="agenthold-sb-") as work:
        settings = [
            asyncio.run(one_setting(Path(work), limit, sessions)) for limit in (10_000, 256)
        ]
    bounded = settings[1]
    ok = bounded["still_open"] <= 256 and bounded["newcomer"] == 200
    finish(args, {"machine": facts, "settings": settings, "passed": ok}, report)
    return 0 if ok else 1


def report(results: dict[str, Any]) -> str:
    rows = [["--session-limit", "opened", "s", "RSS before MB", "after MB", "kB a session",
             "still open", "a new client"]]  # fmt: skip
    for r in results["settings"]:
        grown = r["after"] - r["before"]
        name = f"{r['limit']:,}" + (" (the SDK's cap: baseline)" if r["limit"] == 10_000 else "")
        rows.append([
            name, f"{r['opened']:,}", f"{r['seconds']:.0f}", f"{r['before'] / 1024:.0f}",
            f"{r['after'] / 1024:.0f}", f"{grown / max(1, r['opened']):.1f}",
            f"{r['still_open']:,}", str(r["newcomer"]),
        ])  # fmt: skip
    verdict = "pass" if results["passed"] else "FAIL"
    return f"{table(rows)}\n\n{verdict}: at most 256 stay open and a new client gets a session"


if __name__ == "__main__":
    sys.exit(main())
