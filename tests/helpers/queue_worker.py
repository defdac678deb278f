"""A separate process for tests/test_claim_queue.py: one agent taking shared and exclusive
claims, by plain claims and by waits that claim.

Run as ``python tests/helpers/queue_worker.py DB ROOT SEED ROUNDS RESOURCE...``: it registers an
agent on DB (one workspace "default" at ROOT), then ROUNDS times picks a resource and a mode at
random and either claims it or waits in its queue (claim=True, a short timeout); what it gets it
holds a moment and releases. It prints one JSON object: {"granted": n, "handed": n (by the
queue), "busy": n, "timeouts": n}.
"""

from __future__ import annotations

import json
import random
import sys
import time

from agenthold.claims.coordinator import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.store import StateStore


def main() -> None:
    db, root, seed, rounds, *universe = sys.argv[1:]
    rng = random.Random(int(seed))
    store = StateStore(db)
    coord = Coordinator(store, resolver=Resolver([Workspace("default", root)]))
    agent = coord.register(f"worker-{seed}").agent_id
    counts = {"granted": 0, "handed": 0, "busy": 0, "timeouts": 0}
    for _ in range(int(rounds)):
        resource = rng.choice(universe)
        mode = rng.choice(("shared", "exclusive"))
        if rng.random() < 0.5:
            got = coord.claim(resource, agent, mode=mode)
            if got.status == "busy":
                counts["busy"] += 1
                time.sleep(rng.uniform(0, 0.002))
                continue
            counts["granted"] += 1
        else:
            waited = coord.wait(resource, rng.uniform(0.05, 0.5), agent_id=agent, claim=True,
                                mode=mode)  # fmt: skip
            if waited.status not in ("claimed", "already_claimed"):
                counts["timeouts"] += 1
                continue
            counts["handed"] += 1
        time.sleep(rng.uniform(0, 0.004))
        coord.release(resource, agent)
    store.close()
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
