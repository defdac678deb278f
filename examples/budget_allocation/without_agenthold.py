"""Two agents spend one $10,000 marketing budget kept in a plain shared store: the lost update.

Each agent reads the budget, thinks (a short sleep stands in for an LLM call), decides how much to
spend from what it read, and writes the budget back. Both read before either writes, so the
second write quietly replaces the first: $15,000 is committed against a $10,000 budget, and the
budget record remembers only one of the two allocations. Nothing raises an error.

The agents are real threads. ``Turns`` (from examples/_shared.py) only fixes the order of their
reads and writes (both read, then each writes in turn), the unlucky interleaving that real timing
produces now and then, so every run ends the same way. See with_agenthold.py for the same agents
on agenthold.
"""

from __future__ import annotations

import copy
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for _shared.py
from _shared import Turns

BUDGET = 10_000
WANTS = {"search-agent": 8_000, "social-agent": 7_000}  # what each agent would like to spend
THINK_SECONDS = 0.1  # stands in for the LLM call between read and write


class PlainStore:
    """A shared dictionary. Each read and each write is atomic, but a write checks nothing."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        self._lock = threading.Lock()

    def read(self, key: str) -> Any:
        with self._lock:
            return copy.deepcopy(self._data[key])

    def write(self, key: str, value: Any) -> None:
        with self._lock:
            self._data[key] = copy.deepcopy(value)


def dollars(amount: int) -> str:
    return f"${amount:,}"


def allocations(budget: dict[str, Any]) -> str:
    return ", ".join(f"{n} {dollars(a)}" for n, a in budget["allocations"].items()) or "none"


def agent(
    name: str, store: PlainStore, turns: Turns, first_step: int, spent: dict[str, int]
) -> None:
    """Read the budget, think, spend from what was read, write the budget back."""
    with turns.turn(first_step):
        read = store.read("budget")
        print(f"{name} reads the budget: {dollars(read['remaining'])} left")

    time.sleep(THINK_SECONDS)  # choosing channels and amounts: an LLM call in a real agent

    with turns.turn(first_step + 2):
        amount = min(WANTS[name], read["remaining"])
        budget = {
            "total": read["total"],
            "remaining": read["remaining"] - amount,
            "allocations": {**read["allocations"], name: amount},
        }
        store.write("budget", budget)  # replaces whatever is there now, unseen
        spent[name] = amount
        print(f"{name} commits {dollars(amount)} and writes {dollars(budget['remaining'])} left")


def main() -> int:
    store = PlainStore()
    store.write("budget", {"total": BUDGET, "remaining": BUDGET, "allocations": {}})
    print(f"finance sets the marketing budget to {dollars(BUDGET)}\n")

    turns = Turns()
    spent: dict[str, int] = {}
    threads = [
        threading.Thread(target=agent, args=(name, store, turns, step, spent))
        for step, name in enumerate(WANTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(spent) != len(WANTS):
        print("an agent failed; see the traceback above", file=sys.stderr)
        return 1

    budget = store.read("budget")
    total = sum(spent.values())
    print()
    print(f"Budget: {dollars(BUDGET)}")
    print(f"Total committed: {dollars(total)}")
    print(
        f"The budget record says: {dollars(budget['remaining'])} left; "
        f"allocations: {allocations(budget)}"
    )
    for name in spent:
        if name not in budget["allocations"]:
            print(
                f"Lost update: {name}'s {dollars(spent[name])} is committed but missing from "
                "the record: a write based on an older read replaced it."
            )
    print(f"Overspent by {dollars(total - BUDGET)}, and nothing raised an error.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
