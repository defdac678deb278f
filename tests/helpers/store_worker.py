"""A separate process for tests/test_store.py: writes, waits or holds locks on a state database.

Run as ``python tests/helpers/store_worker.py COMMAND DB ...``. Each command says "ready" (or
"locked") on stdout once it has opened the database, so a test can act at a known moment; results
come back as one JSON line. Stdout is flushed after every line because the test reads it live.

Commands:
  crash-writer DB LOG SEED       write and delete in a loop until killed; after each acknowledged
                                 change append one JSON line to LOG (flushed before the next one)
  increment DB N                 add 1 to counters/n N times with the read-check-retry loop
  hold-lock DB                   hold the write lock (BEGIN IMMEDIATE, an uncommitted change) on a
                                 raw sqlite3 connection until a line arrives on stdin
  open-new DB NAME               wait for a line on stdin, then open DB and create openers/NAME
  set-when-told DB NS KEY JSON   wait for a line on stdin, then set NS/KEY to the JSON value
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import sys

from agenthold.store import ConflictError, NotFoundError, StateStore

CRASH_NAMESPACE = "crash"
CRASH_KEYS = [f"k{i}" for i in range(6)]


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def crash_writer(db: str, log_path: str, seed: int) -> None:
    rng = random.Random(seed)
    store = StateStore(db)
    # Versions of the keys as this writer last left them (it is the only writer).
    versions = {
        k: (h[0].version if (h := store.history(CRASH_NAMESPACE, k, limit=1)) else 0)
        for k in CRASH_KEYS
    }
    live = {k: store.changed_since(CRASH_NAMESPACE, k, 0) for k in CRASH_KEYS}
    alive = {k for k, r in live.items() if r is not None and not r.deleted}
    with open(log_path, "a+", encoding="utf-8") as log:
        if log.tell() > 0:  # a writer killed before us may have left half a line: end it
            log.seek(log.tell() - 1)
            if log.read(1) != "\n":
                log.write("\n")

        def ack(event: dict[str, object]) -> None:
            log.write(json.dumps(event) + "\n")
            log.flush()

        say("ready")
        step = 0
        while True:
            step += 1
            key = rng.choice(CRASH_KEYS)
            roll = rng.random()
            if roll < 0.05 and alive:
                deleted = store.clear_namespace(CRASH_NAMESPACE, deleted_by="crash-writer")
                for k in deleted:
                    versions[k] += 1
                    ack({"op": "delete", "key": k, "version": versions[k]})
                alive.clear()
            elif roll < 0.20 and key in alive:
                result = store.delete(
                    CRASH_NAMESPACE, key, deleted_by="crash-writer", expected_version=versions[key]
                )
                versions[key] = result.version
                alive.discard(key)
                ack({"op": "delete", "key": key, "version": result.version})
            else:
                value = {"pid": os.getpid(), "step": step, "pad": "x" * rng.randint(0, 4000)}
                expected = versions[key] if key in alive else 0
                result = store.set(
                    CRASH_NAMESPACE,
                    key,
                    value,
                    updated_by="crash-writer",
                    expected_version=expected,
                )
                versions[key] = result.version
                alive.add(key)
                ack({"op": "write", "key": key, "version": result.version, "value": value})


def increment_with_retry(store: StateStore, writer: str) -> int:
    """Add 1 to counters/n with the read, check, retry loop; the conflicts it met. (The
    threads of tests/test_store.py call it too, imported from here.)"""
    conflicts = 0
    record = store.get("counters", "n")
    while True:
        try:
            store.set(
                "counters",
                "n",
                record.value + 1,
                updated_by=writer,
                expected_version=record.version,
            )
            return conflicts
        except ConflictError:
            conflicts += 1
            record = store.get("counters", "n")


def increment(db: str, count: int) -> None:
    store = StateStore(db)
    say("ready")
    conflicts = sum(increment_with_retry(store, f"proc-{os.getpid()}") for _ in range(count))
    store.close()
    say(json.dumps({"increments": count, "conflicts": conflicts}))


def hold_lock(db: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE state SET value = '\"uncommitted\"', version = version + 1")
    say("locked")
    sys.stdin.readline()
    conn.execute("ROLLBACK")
    conn.close()


def open_new(db: str, name: str) -> None:
    say("ready")
    sys.stdin.readline()
    with StateStore(db) as store:
        result = store.set("openers", name, os.getpid(), updated_by=name, expected_version=0)
    say(json.dumps({"version": result.version}))


def set_when_told(db: str, namespace: str, key: str, value: str) -> None:
    store = StateStore(db)
    with contextlib.suppress(NotFoundError):
        store.get(namespace, key)  # open this thread's connection before saying ready
    say("ready")
    sys.stdin.readline()
    result = store.set(namespace, key, json.loads(value), updated_by="other-process")
    store.close()
    say(json.dumps({"version": result.version}))


def main(argv: list[str]) -> None:
    command, db, *rest = argv
    if command == "crash-writer":
        crash_writer(db, rest[0], int(rest[1]))
    elif command == "increment":
        increment(db, int(rest[0]))
    elif command == "hold-lock":
        hold_lock(db)
    elif command == "open-new":
        open_new(db, rest[0])
    elif command == "set-when-told":
        set_when_told(db, rest[0], rest[1], rest[2])
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
