"""Two agents update one order record in a plain shared store: one agent's change disappears.

A fulfilment agent ships the order (status and tracking number) while a pricing agent applies a
loyalty discount (discount code and total). Each reads the whole order, thinks (a short sleep
stands in for an LLM call), changes its own fields and writes the whole order back. Both read
before either writes, so the second write carries the first agent's fields as they were before:
the order ends up discounted but "received" again, though it has shipped. Nothing raises an error.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for _shared.py
from _shared import Turns

Order = dict[str, Any]
THINK_SECONDS = 0.1  # stands in for the LLM call between read and write


def ship(order: Order) -> Order:
    return {**order, "status": "shipped", "tracking": "TRK-4821"}


def apply_loyalty_discount(order: Order) -> Order:
    return {**order, "discount": "LOYALTY10", "total": order["subtotal"] * 90 // 100}


# Each agent, the change it makes, and what it says it does.
AGENTS: dict[str, tuple[Callable[[Order], Order], str]] = {
    "fulfilment-agent": (ship, "ships it"),
    "pricing-agent": (apply_loyalty_discount, "applies a 10% loyalty discount"),
}

NEW_ORDER: Order = {
    "order_id": "order-1234",
    "items": [{"sku": "KB-01", "qty": 1, "price": 120}, {"sku": "MS-02", "qty": 2, "price": 40}],
    "subtotal": 200,
    "total": 200,
    "discount": None,
    "status": "received",
    "tracking": None,
}


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


def describe(order: Order) -> str:
    discount = f" (discount {order['discount']})" if order["discount"] else ""
    return (
        f"status {order['status']}, tracking {order['tracking'] or 'none'}, "
        f"total ${order['total']:,}{discount}"
    )


def changed_fields(before: Order, after: Order) -> Order:
    return {k: v for k, v in after.items() if before.get(k) != v}


def agent(
    name: str, store: PlainStore, turns: Turns, first_step: int, wanted: dict[str, Order]
) -> None:
    """Read the order, think, change its own fields, write the whole order back."""
    change, doing = AGENTS[name]
    with turns.turn(first_step):
        order = store.read("order-1234")
        print(f"{name} reads the order: {describe(order)}")

    time.sleep(THINK_SECONDS)  # checking stock or the customer's tier: an LLM call in a real agent

    with turns.turn(first_step + 2):
        updated = change(order)
        store.write("order-1234", updated)  # replaces whatever is there now, unseen
        wanted[name] = changed_fields(order, updated)
        print(f"{name} {doing} and writes the order: {describe(updated)}")


def main() -> int:
    store = PlainStore()
    store.write("order-1234", NEW_ORDER)
    print(f"intake-agent records order-1234: {describe(NEW_ORDER)}\n")

    turns = Turns()
    wanted: dict[str, Order] = {}
    threads = [
        threading.Thread(target=agent, args=(name, store, turns, step, wanted))
        for step, name in enumerate(AGENTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(wanted) != len(AGENTS):
        print("an agent failed; see the traceback above", file=sys.stderr)
        return 1

    final = store.read("order-1234")
    print(f"\nFinal order: {describe(final)}")
    for name, fields in wanted.items():
        lost = {k: v for k, v in fields.items() if final[k] != v}
        if lost:
            shown = ", ".join(f"{k}={v!r}" for k, v in lost.items())
            print(
                f"Lost update: {name}'s change ({shown}) is gone: a write based on an older "
                "read replaced it, and nothing raised an error."
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
