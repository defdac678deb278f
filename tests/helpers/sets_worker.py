"""A separate process for tests/test_claim_sets.py: one agent claiming random overlapping sets.

Run as ``python tests/helpers/sets_worker.py DB ROOT SEED ROUNDS RESOURCE...``: it registers an
agent on DB (one workspace "default" at ROOT), then ROUNDS times claims a random subset of the
resources in a random order; a granted set is held a moment and released whole. It prints one
JSON object: {"granted": [{"agent", "uris"}...], "busy": number of refused sets}.
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
    granted, busy = [], 0
    for _ in range(int(rounds)):
        chosen = rng.sample(universe, rng.randint(1, 4))
        got = coord.claim_many(chosen, agent)
        if got.status == "busy":
            busy += 1
            time.sleep(rng.uniform(0, 0.002))
            continue
        granted.append({"agent": agent, "uris": [r.resource for r in got.results]})
        time.sleep(rng.uniform(0, 0.004))
        coord.release_many([(uri, "released") for uri in chosen], agent)
    store.close()
    print(json.dumps({"granted": granted, "busy": busy}))


if __name__ == "__main__":
    main()
