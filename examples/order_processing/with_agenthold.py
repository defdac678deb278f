"""The same two agents and order as without_agenthold.py, kept in agenthold's StateStore.

Each agent writes the order with the version it read (``expected_version``). The second writer's
version is stale, so its write is refused with a ConflictError instead of undoing the first
agent's change. It re-reads the order and applies its own change to the fresh copy, which merges
the two: the order ends up both shipped and discounted, and its history shows who wrote each
version.

The agents are real threads, each with its own StateStore on the same database file. ``Turns``
(from examples/_shared.py) only fixes the order of their reads and writes (both read, then each
writes in turn), so every run ends the same way.

    python examples/order_processing/with_agenthold.py [--db PATH]

``--db`` keeps the database for inspection (default: a temporary file, removed at the end).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for _shared.py
from _shared import Turns, print_audit_trail  # also finds agenthold in a source checkout

from agenthold.exceptions import ConflictError
from agenthold.store import StateStore

Order = dict[str, Any]
NAMESPACE, KEY = "orders", "order-1234"
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


def describe(order: Order) -> str:
    discount = f" (discount {order['discount']})" if order["discount"] else ""
    return (
        f"status {order['status']}, tracking {order['tracking'] or 'none'}, "
        f"total ${order['total']:,}{discount}"
    )


def changed_fields(before: Order, after: Order) -> Order:
    return {k: v for k, v in after.items() if before.get(k) != v}


def agent(name: str, db: Path, turns: Turns, first_step: int, wanted: dict[str, Order]) -> None:
    """Read the order, think, change its own fields, write with the version read; on a
    conflict re-read and apply the change to the fresh order."""
    change, doing = AGENTS[name]
    with StateStore(db) as store:
        with turns.turn(first_step):
            record = store.get(NAMESPACE, KEY)
            print(f"{name} reads the order: {describe(record.value)} (v{record.version})")

        time.sleep(THINK_SECONDS)  # checking stock or the customer's tier: an LLM call

        with turns.turn(first_step + 2):
            while True:
                updated = change(record.value)
                try:
                    result = store.set(
                        NAMESPACE, KEY, updated, updated_by=name, expected_version=record.version
                    )
                    break
                except ConflictError as conflict:
                    print(
                        f"{name} tries to write but gets a conflict: it read v{record.version}, "
                        f"{conflict.detail['actual_updated_by']} has since written "
                        f"v{conflict.detail['actual_version']}"
                    )
                    record = store.get(NAMESPACE, KEY)
                    print(f"{name} re-reads the order: {describe(record.value)}")
            wanted[name] = changed_fields(record.value, updated)
            print(f"{name} {doing} and writes the order: {describe(updated)} (v{result.version})")


def run(db: Path) -> int:
    with StateStore(db) as store:
        start = store.set(NAMESPACE, KEY, NEW_ORDER, updated_by="intake-agent").version
    print(f"intake-agent records {KEY}: {describe(NEW_ORDER)} (v{start})\n")

    turns = Turns()
    wanted: dict[str, Order] = {}
    threads = [
        threading.Thread(target=agent, args=(name, db, turns, step, wanted))
        for step, name in enumerate(AGENTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(wanted) != len(AGENTS):
        print("an agent failed; see the traceback above", file=sys.stderr)
        return 1

    with StateStore(db, read_only=True) as store:
        final = store.get(NAMESPACE, KEY).value
        trail = [h for h in store.history(NAMESPACE, KEY, limit=100) if h.version >= start]
    print(f"\nFinal order: {describe(final)}")
    lost = False
    for name, fields in wanted.items():
        kept = all(final[k] == v for k, v in fields.items())
        lost = lost or not kept
        shown = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        print(f"{'Kept' if kept else 'LOST'}: {name}'s change ({shown})")
    print_audit_trail(NAMESPACE, KEY, trail, describe)
    return 1 if lost else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="database file (default: a temporary file)")
    args = parser.parse_args()
    if args.db is not None:
        return run(args.db)
    with tempfile.TemporaryDirectory() as tmp:
        return run(Path(tmp) / "orders.db")


if __name__ == "__main__":
    sys.exit(main())
