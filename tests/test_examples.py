"""The worked examples and the store benchmark, run the way a user runs them: as scripts.

Each script runs in a subprocess with this interpreter. A "without" example must show its lost
update; a "with" example must end correct, both in what it prints and in the database it leaves
behind (``--db`` under tmp_path). The benchmark only gets a smoke run: speed is never asserted.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agenthold.store import StateStore

ROOT = Path(__file__).resolve().parents[1]


def run_script(relative: str, *args: str, timeout: float = 60) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / relative), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def printed_dollars(output: str, label: str) -> int:
    match = re.search(rf"^{label}: \$([\d,]+)$", output, re.MULTILINE)
    assert match, f"no {label!r} line in:\n{output}"
    return int(match.group(1).replace(",", ""))


def printed_line(output: str, prefix: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"expected one {prefix!r} line in:\n{output}"
    return lines[0]


def writers_oldest_first(db: Path, namespace: str, key: str) -> list[tuple[int, str]]:
    with StateStore(db, read_only=True) as store:
        return [(h.version, h.updated_by) for h in reversed(store.history(namespace, key, 100))]


def test_budget_without_agenthold_commits_15000_of_a_10000_budget() -> None:
    out = run_script("examples/budget_allocation/without_agenthold.py")

    assert printed_dollars(out, "Budget") == 10_000
    assert printed_dollars(out, "Total committed") == 15_000
    record = printed_line(out, "The budget record says:")
    assert "social-agent $7,000" in record
    assert "search-agent" not in record  # the first allocation was overwritten
    assert "Lost update: search-agent's $8,000" in out


def test_budget_with_agenthold_commits_exactly_the_budget_after_one_conflict(
    tmp_path: Path,
) -> None:
    db = tmp_path / "budget.db"
    out = run_script("examples/budget_allocation/with_agenthold.py", "--db", str(db))

    assert printed_dollars(out, "Total committed") == 10_000
    assert out.count("gets a conflict") == 1
    assert "social-agent re-reads the budget: $2,000 left" in out
    with StateStore(db, read_only=True) as store:
        budget = store.get("campaign", "budget")
    assert budget.value["allocations"] == {"search-agent": 8_000, "social-agent": 2_000}
    assert budget.value["remaining"] == 0
    assert budget.version == 3
    assert budget.updated_by == "social-agent"
    assert writers_oldest_first(db, "campaign", "budget") == [
        (1, "finance"),
        (2, "search-agent"),
        (3, "social-agent"),
    ]


def test_order_without_agenthold_loses_the_fulfilment_agents_status() -> None:
    out = run_script("examples/order_processing/without_agenthold.py")

    final = printed_line(out, "Final order:")
    assert "status received" in final  # the order shipped, but the record says otherwise
    assert "tracking none" in final
    assert "total $180 (discount LOYALTY10)" in final
    assert "Lost update: fulfilment-agent's change" in out
    assert "Lost update: pricing-agent" not in out


def test_order_with_agenthold_keeps_both_agents_changes(tmp_path: Path) -> None:
    db = tmp_path / "orders.db"
    out = run_script("examples/order_processing/with_agenthold.py", "--db", str(db))

    final = printed_line(out, "Final order:")
    assert "status shipped, tracking TRK-4821, total $180 (discount LOYALTY10)" in final
    assert out.count("gets a conflict") == 1
    assert "LOST" not in out
    with StateStore(db, read_only=True) as store:
        order = store.get("orders", "order-1234")
        history = {h.version: h.value for h in store.history("orders", "order-1234", 100)}
    assert order.version == 3
    assert (order.value["status"], order.value["tracking"]) == ("shipped", "TRK-4821")
    assert (order.value["total"], order.value["discount"]) == (180, "LOYALTY10")
    assert (history[2]["status"], history[2]["total"]) == ("shipped", 200)
    assert writers_oldest_first(db, "orders", "order-1234") == [
        (1, "intake-agent"),
        (2, "fulfilment-agent"),
        (3, "pricing-agent"),
    ]


def test_with_agenthold_example_continues_an_existing_database(tmp_path: Path) -> None:
    db = tmp_path / "budget.db"
    run_script("examples/budget_allocation/with_agenthold.py", "--db", str(db))
    out = run_script("examples/budget_allocation/with_agenthold.py", "--db", str(db))

    assert printed_dollars(out, "Total committed") == 10_000
    trail = out.split("Audit trail")[1]
    assert re.findall(r"^  v(\d+) ", trail, re.MULTILINE) == ["4", "5", "6"]


@pytest.mark.usefixtures("no_child_coverage")
def test_store_bench_quick_prints_its_tables_and_exits_0() -> None:
    out = run_script("bench/perf/store_bench.py", "--quick", timeout=180)

    assert out.startswith("agenthold StateStore benchmark (quick run)")
    for heading in (
        "set with expected_version",
        "contention: 4 processes x 25 increments",
        "history(limit=10)",
        "list_keys of 500 keys",
        "targets",
    ):
        assert heading in out
    target_lines = [line for line in out.splitlines() if re.match(r"  (pass|FAIL)  ", line)]
    assert len(target_lines) == 10
    # Correctness is asserted, speed is not: no increment may be lost under contention.
    assert "  pass  contention (agenthold) loses no increment: final value 100: 100" in out
    assert "  pass  contention (raw sqlite3) loses no increment: final value 100: 100" in out


@pytest.mark.usefixtures("no_child_coverage")
def test_pg_bench_quick_prints_its_tables_and_exits_0(pg_url: str) -> None:
    out = run_script("bench/perf/pg_bench.py", "--db", pg_url, "--quick", timeout=180)

    assert "via server B -> via server A: release committed -> wait answered" in out
    assert "baseline, library: release in another process -> wait returned" in out
    assert "baseline, raw psycopg: NOTIFY in another process -> LISTEN heard" in out
    assert re.search(r"^set \(expected_version\) +[\d,]+ +[\d,]+ +[\d.]+$", out, re.MULTILINE), out
    assert re.search(r"^get +[\d,]+ +[\d,]+ +[\d.]+$", out, re.MULTILINE), out
    assert len(re.findall(r"^  (pass|FAIL)  ", out, re.MULTILINE)) == 4, out
