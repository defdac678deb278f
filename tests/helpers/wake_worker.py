"""A second process for tests/test_wake.py: commits when told, or waits idle and reports what the
wait cost. Usage (python wake_worker.py COMMAND DB ...):

  writer DB NS KEY           for each line on stdin (a JSON value), set NS/KEY to it and print
                             {"version": ..., "at": unix time just after the commit}
  idle-watch DB NS KEY SECS  start the change feed, say "ready", then watch NS/KEY past its
                             current version for SECS seconds (nobody writes it) and print
                             {"cpu": seconds of CPU this process used meanwhile, "woken": ...,
                             "threads": names of its threads during the wait}
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time

from agenthold.store import StateStore


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def writer(db: str, namespace: str, key: str) -> None:
    with StateStore(db) as store:
        say("ready")
        for line in sys.stdin:
            result = store.set(namespace, key, json.loads(line), updated_by="writer-process")
            say(json.dumps({"version": result.version, "at": time.time()}))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def idle_watch(db: str, namespace: str, key: str, seconds: float) -> None:
    with StateStore(db) as store:
        version = store.get(namespace, key).version
        store.watch(namespace, key, since_version=version, timeout=0)  # the feed starts
        say("ready")
        names: list[str] = []
        timer = threading.Timer(
            seconds / 2, lambda: names.extend(t.name for t in threading.enumerate())
        )
        timer.start()
        before = cpu_seconds()
        record = store.watch(namespace, key, since_version=version, timeout=seconds)
        used = cpu_seconds() - before
        timer.join()
        say(json.dumps({"cpu": used, "woken": record is not None, "threads": sorted(names)}))


def main(argv: list[str]) -> None:
    command, db, *rest = argv
    if command == "writer":
        writer(db, rest[0], rest[1])
    elif command == "idle-watch":
        idle_watch(db, rest[0], rest[1], float(rest[2]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
