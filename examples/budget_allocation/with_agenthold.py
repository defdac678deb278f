"""The same two agents and $10,000 budget as without_agenthold.py, kept in agenthold's StateStore.

Each agent writes with the version it read (``expected_version``). The second writer's version is
stale, so its write is refused with a ConflictError instead of silently replacing the first one.
It re-reads the budget, sees what is really left, recomputes its allocation and writes again.
The total committed is exactly $10,000, and the key's history shows who wrote each version.

The agents are real threads, each with its own StateStore on the same database file. ``Turns``
(from examples/_shared.py) only fixes the order of their reads and writes (both read, then each
writes in turn), so every run ends the same way.

    python examples/budget_allocation/with_agenthold.py [--db PATH]

``--db`` keeps the database for inspection (default: a temporary file, removed at the end).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for _shared.py
from _shared import Turns, print_audit_trail  # also finds agenthold in a source checkout

from agenthold.exceptions import ConflictError
from agenthold.store import StateStore

NAMESPACE, KEY = "campaign", "budget"
BUDGET = 10_000
WANTS = {"search-agent": 8_000, "social-agent": 7_000}  # what each agent would like to spend
THINK_SECONDS = 0.1  # stands in for the LLM call between read and write


def dollars(amount: int) -> str:
    return f"${amount:,}"


def allocations(budget: dict[str, Any]) -> str:
    return ", ".join(f"{n} {dollars(a)}" for n, a in budget["allocations"].items()) or "none"


def describe(budget: dict[str, Any]) -> str:
    return f"{dollars(budget['remaining']):>7} left  allocations: {allocations(budget)}"


def agent(name: str, db: Path, turns: Turns, first_step: int, spent: dict[str, int]) -> None:
    """Read the budget, think, spend from what was read; on a conflict re-read and spend again."""
    with StateStore(db) as store:
        with turns.turn(first_step):
            record = store.get(NAMESPACE, KEY)
            left = record.value["remaining"]
            print(f"{name} reads the budget: {dollars(left)} left (v{record.version})")

        time.sleep(THINK_SECONDS)  # choosing channels and amounts: an LLM call in a real agent

        with turns.turn(first_step + 2):
            while True:
                amount = min(WANTS[name], record.value["remaining"])
                budget = {
                    "total": record.value["total"],
                    "remaining": record.value["remaining"] - amount,
                    "allocations": {**record.value["allocations"], name: amount},
                }
                try:
                    result = store.set(
                        NAMESPACE, KEY, budget, updated_by=name, expected_version=record.version
                    )
                    break
                except ConflictError as conflict:
                    print(
                        f"{name} wants to commit {dollars(amount)} but gets a conflict: it read "
                        f"v{record.version}, {conflict.detail['actual_updated_by']} has since "
                        f"written v{conflict.detail['actual_version']}"
                    )
                    record = store.get(NAMESPACE, KEY)
                    left = record.value["remaining"]
                    print(f"{name} re-reads the budget: {dollars(left)} left")
            spent[name] = amount
            print(
                f"{name} commits {dollars(amount)} and writes {dollars(budget['remaining'])} left "
                f"(v{result.version})"
            )


def run(db: Path) -> int:
    with StateStore(db) as store:
        start = store.set(
            NAMESPACE,
            KEY,
            {"total": BUDGET, "remaining": BUDGET, "allocations": {}},
            updated_by="finance",
        ).version
    print(f"finance sets the marketing budget to {dollars(BUDGET)} (v{start})\n")

    turns = Turns()
    spent: dict[str, int] = {}
    threads = [
        threading.Thread(target=agent, args=(name, db, turns, step, spent))
        for step, name in enumerate(WANTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(spent) != len(WANTS):
        print("an agent failed; see the traceback above", file=sys.stderr)
        return 1

    with StateStore(db, read_only=True) as store:
        budget = store.get(NAMESPACE, KEY).value
        trail = [h for h in store.history(NAMESPACE, KEY, limit=100) if h.version >= start]
    total = sum(spent.values())
    print()
    print(f"Budget: {dollars(BUDGET)}")
    print(f"Total committed: {dollars(total)}")
    print(
        f"The budget record says: {dollars(budget['remaining'])} left; "
        f"allocations: {allocations(budget)}"
    )
    print_audit_trail(NAMESPACE, KEY, trail, describe)
    return 0 if total == BUDGET else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="database file (default: a temporary file)")
    args = parser.parse_args()
    if args.db is not None:
        return run(args.db)
    with tempfile.TemporaryDirectory() as tmp:
        return run(Path(tmp) / "budget.db")


if __name__ == "__main__":
    sys.exit(main())
