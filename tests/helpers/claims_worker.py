"""A separate process for tests/test_claims.py: a Coordinator on the test's database file.

Run as ``python tests/helpers/claims_worker.py DB ROOT [TTL]``: it opens DB with one workspace
"default" at ROOT (and claim TTL TTL seconds, if given), says "ready", then obeys one JSON command
per stdin line and answers each with one JSON line (flushed, because the test reads it live).
It ends when stdin closes.

Commands (every reply also carries ``at``, this process's time.time() right after the work):
  {"op": "call", "method": M, "args": [...], "kwargs": {...}, "delay": S}
      sleep S seconds (default 0), call Coordinator.M; reply {"result": ...} or
      {"error": class name, "message": ...}
  {"op": "race", "resource": R, "agent_id": A, "start_at": T}
      sleep until time.time() >= T, then claim R; reply {"result": claim reply}
  {"op": "stress", "resource": R, "agent_id": A, "rounds": N, "hold": S}
      N times: claim R (on "busy", wait for it and try again), hold it S seconds, release it;
      reply {"result": [[start, end, claimed version, released version], ...]} where start is
      time.time() right after "claimed" and end is time.time() right before the release
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from agenthold.claims.coordinator import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.serve.claim_tools import reply
from agenthold.store import AgentholdError, StateStore


def say(message: dict[str, Any] | str) -> None:
    sys.stdout.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
    sys.stdout.flush()


def stress(coord: Coordinator, resource: str, agent_id: str, rounds: int, hold: float) -> list:
    intervals = []
    for _ in range(rounds):
        while True:
            claimed = coord.claim(resource, agent_id)
            if claimed.status == "claimed":
                break
            coord.wait(resource, 10)
        start = time.time()
        time.sleep(hold)
        end = time.time()
        released = coord.release(resource, agent_id)
        intervals.append([start, end, claimed.version, released.version])
    return intervals


def obey(coord: Coordinator, command: dict[str, Any]) -> dict[str, Any]:
    op = command["op"]
    try:
        if op == "call":
            time.sleep(command.get("delay", 0))
            method = getattr(coord, command["method"])
            result = method(*command.get("args", []), **command.get("kwargs", {}))
            if command["method"] in ("register", "claim", "release", "status", "wait"):
                result = reply(result)  # the reply an agent reads, as JSON
        elif op == "race":
            time.sleep(max(0.0, command["start_at"] - time.time()))
            result = reply(coord.claim(command["resource"], command["agent_id"]))
        elif op == "stress":
            result = stress(
                coord, command["resource"], command["agent_id"], command["rounds"], command["hold"]
            )
        else:
            raise ValueError(f"unknown op {op!r}")
    except AgentholdError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "at": time.time()}
    return {"result": result, "at": time.time()}


def main() -> None:
    db, root = sys.argv[1], sys.argv[2]
    ttl = float(sys.argv[3]) if len(sys.argv) > 3 else None
    store = StateStore(db)
    coord = Coordinator(store, resolver=Resolver([Workspace("default", root)]), claim_ttl=ttl)
    say("ready")
    for line in sys.stdin:
        if line.strip():
            say(obey(coord, json.loads(line)))
    store.close()


if __name__ == "__main__":
    main()
