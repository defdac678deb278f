"""Smoke test of bench/perf/mcp_bench.py: its quick run completes and prints every table.

The benchmark is run as a user runs it, in a process of its own that spawns real agenthold
servers over stdio in both protocol eras. Nothing here judges speed: the numbers of a quick run
on a shared machine mean nothing, only that each measurement ran and was reported.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "perf" / "mcp_bench.py"
MS = r"\d+\.\d\d ms"


@pytest.mark.usefixtures("no_child_coverage")
def test_quick_run_prints_every_table_and_exits_zero() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "agenthold MCP stdio benchmark (quick run)" in out
    assert re.search(r"machine: \d+ CPUs, .*mcp \d", out)
    assert "per-call cost, mode auto (protocol 2026-07-28)" in out
    assert "per-call cost, mode legacy (protocol 2025-11-25)" in out
    for mode in ("auto", "legacy"):
        for row in (
            rf"agenthold_get +{MS} +{MS} +bench_noop +{MS} +{MS} +[+-]{MS}",
            rf"agenthold_set +{MS} +{MS} +bench_noop +{MS} +{MS} +[+-]{MS}",
            rf"claim \+ release +{MS} +{MS} +two no-ops +{MS} +{MS} +[+-]{MS}",
        ):
            assert re.search(row, out.split(f"per-call cost, mode {mode}")[1]), row
        assert re.search(rf"mode {mode} +{MS} +{MS} +{MS} +\d+ +\d+ +\d+", out)
        assert re.search(rf"mode {mode}: python -m agenthold +{MS} +{MS} +{MS} +1\n", out)
        assert re.search(rf"mode {mode}: bare mcp Server +{MS} +{MS} +{MS} +1\n", out)
        assert re.search(rf"{mode}: wake-up by another process: p99 <= 15 ms +{MS} +", out)
        assert re.search(rf"mode {mode}: python -m agenthold, warm +{MS} +{MS} +{MS} +3\n", out)
        assert re.search(rf"mode {mode}: python -m agenthold --no-warm +{MS} +{MS} +{MS} +1\n", out)
        assert re.search(rf"{mode}: per-call client, warm: median <= 150 ms +{MS} +", out)
        assert re.search(rf"{mode}: per-call client, first call: median <= --no-warm's", out)
        assert re.search(rf"{mode}: warm server idle: no CPU in 2 s +\d+ ms +(pass|MISS)\n", out)
        assert re.search(rf"{mode}: warm server memory <= 1.2 x a --no-warm server's +\d", out)
        assert re.search(
            rf"mode {mode}: warm server \d+\.\d MiB resident \(a --no-warm server \d+\.\d MiB\), "
            rf"\d+ ms of CPU",
            out,
        )
    cpu = r"\d+ ms \(\d+\.\d\d%\)"
    for feed in ("file events", "2 ms poll"):
        assert re.search(rf"\n{feed} +{MS} +{MS} +{cpu} +{cpu} +{cpu}\n", out), feed
    for target in ("100 waits in flight in one server", "an idle log --follow"):
        assert re.search(rf"{target}: CPU < 0.2% of a core +\d+\.\d\d\d% +", out), target
    assert len(re.findall(r"  (pass|MISS)$", out, re.MULTILINE)) == 28  # 6 rows + 22 targets
