"""The processes bench/torture/torture.py (and tests/test_torture.py) start: a crash writer and a
contention worker, each on a real database file.

    python bench/torture/workers.py crash DB LOG SEED AGENTS [STEPS]
    python bench/torture/workers.py contend DB OUT SEED SECONDS THREADS INDEX

Decisions behind it:
- A worker talks to its parent in lines on stdout, flushed at once ("ready", then a JSON
  result), and waits for "go" on stdin where the start must be shared, so the parent acts at
  known moments without sleeping on guesses. A crash writer says "ready" only after it has
  written, claimed and released on the database it found, so every "ready" proves that the
  database a killed writer left takes new work.
- The crash writer acknowledges a change only after the call returned: it appends one JSON line
  to LOG and flushes it. Flushing hands the line to the kernel, and the page cache survives the
  death of a process (SIGKILL), so no fsync is needed; only a power loss could lose it, which
  is not what is tested. A change may commit and the process die before its line is written:
  that unacknowledged commit is allowed; an acknowledged change that is missing is a bug.
- The contention worker records every call it made and every answer, between two readings of
  time.monotonic(). On Linux that is CLOCK_MONOTONIC, one clock for the whole system, so the
  readings of different processes can be compared directly.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
import harness  # noqa: F401  (it finds this checkout's agenthold if need be)

from agenthold.claims import OUTCOMES, Coordinator
from agenthold.store import BusyError, ConflictError, NotFoundError, StateStore

# The crash scenario's data: its keys, its resources, and the key and resource every new
# writer process writes and claims first, to show it can carry on after a kill.
CRASH_NAMESPACE = "crash"
CRASH_KEYS = tuple(f"k{i}" for i in range(6))
CRASH_RESOURCES = tuple(f"custom://crash/r{i}" for i in range(4))
PROBE_KEY = "probe"
PROBE_RESOURCE = "custom://crash/probe"

# The contention scenario's data: counters are only ever incremented; churn keys are deleted,
# created again and updated; resources are claimed, held a moment and released.
CONTENTION_NAMESPACE = "contention"
COUNTERS = tuple(f"counter-{i}" for i in range(3))
CHURN_KEYS = tuple(f"churn-{i}" for i in range(3))
RESOURCES = tuple(f"custom://contention/r{i}" for i in range(2))

BUSY_TIMEOUT = 60.0  # seconds; a worker should never give up on the write lock in these runs


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# The crash writer
# --------------------------------------------------------------------------------------------


class CrashWriter:
    """OCC writes, deletes, claims and releases in a loop, each acknowledged change logged.

    It is the only writer of its data, so it knows every version it needs; it reads where it
    stands from the database when it starts, because the writer before it was killed."""

    def __init__(self, db: str, log_path: str, seed: int, agents: list[str]) -> None:
        self.rng = random.Random(seed)
        self.store = StateStore(db, busy_timeout=BUSY_TIMEOUT)
        self.coord = Coordinator(self.store)
        self.agents = agents
        self.log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 (open until killed)
        # The version a write must name for each key: the live version, or 0 for none.
        self.expected: dict[str, int] = {}
        for key in (*CRASH_KEYS, PROBE_KEY):
            record = self.store.changed_since(CRASH_NAMESPACE, key, 0)
            self.expected[key] = 0 if record is None or record.deleted else record.version
        self.holders: dict[str, str] = {
            c.uri: c.holder for c in self.coord.list_claims() if c.holder is not None
        }

    def ack(self, event: dict[str, Any]) -> None:
        self.log.write(json.dumps(event) + "\n")
        self.log.flush()

    def write(self, key: str, value: Any) -> None:
        done = self.store.set(
            CRASH_NAMESPACE,
            key,
            value,
            updated_by="crash-writer",
            expected_version=self.expected[key],
        )
        self.expected[key] = done.version
        self.ack({"op": "write", "key": key, "version": done.version, "value": value})

    def delete(self, key: str) -> None:
        done = self.store.delete(
            CRASH_NAMESPACE, key, deleted_by="crash-writer", expected_version=self.expected[key]
        )
        self.expected[key] = 0
        self.ack({"op": "delete", "key": key, "version": done.version})

    def clear(self) -> None:
        before = dict(self.expected)
        for key in self.store.clear_namespace(CRASH_NAMESPACE, deleted_by="crash-writer"):
            self.expected[key] = 0
            self.ack({"op": "delete", "key": key, "version": before[key] + 1})

    def claim(self, resource: str, agent: str) -> None:
        reply = self.coord.claim(resource, agent)
        if reply.status == "claimed":
            self.holders[resource] = agent
            self.ack(
                {"op": "claimed", "resource": resource, "agent": agent, "version": reply.version}
            )
        elif (
            reply.status == "busy"
            and reply.holder
            and reply.holder.agent_id != self.holders.get(resource)
        ):
            raise AssertionError(f"busy reply names an unexpected holder: {reply}")

    def release(self, resource: str, outcome: str) -> None:
        agent = self.holders.pop(resource)
        reply = self.coord.release(resource, agent, outcome)
        if reply.status != "released":
            raise AssertionError(f"the holder's release was refused: {reply}")
        self.ack(
            {
                "op": "released",
                "resource": resource,
                "agent": agent,
                "version": reply.version,
                "outcome": outcome,
            }
        )

    def carry_on(self) -> None:
        """What every new writer does first: write, claim and release, so each one shows that
        the database it found after a kill takes new work."""
        self.write(PROBE_KEY, {"pid": os.getpid(), "at": time.time()})
        if PROBE_RESOURCE in self.holders:
            self.release(PROBE_RESOURCE, "released")
        self.claim(PROBE_RESOURCE, self.agents[0])
        if self.holders.get(PROBE_RESOURCE) != self.agents[0]:
            raise AssertionError("the new writer could not claim the probe resource")
        self.release(PROBE_RESOURCE, "modified")

    def step(self, n: int) -> None:
        rng = self.rng
        roll = rng.random()
        key = rng.choice(CRASH_KEYS)
        live = [k for k in CRASH_KEYS if self.expected[k]]
        if roll < 0.45:
            # Mostly small values; one in five spans several pages (overflow pages in SQLite).
            size = rng.randint(0, 100) if rng.random() < 0.8 else rng.randint(1000, 6000)
            self.write(key, {"pid": os.getpid(), "step": n, "pad": "x" * size})
        elif roll < 0.55 and live:
            self.delete(rng.choice(live))
        elif roll < 0.57 and live:
            self.clear()
        elif roll < 0.78:
            self.claim(rng.choice(CRASH_RESOURCES), rng.choice(self.agents))
        else:
            held = [r for r in CRASH_RESOURCES if r in self.holders]
            if held:
                self.release(rng.choice(held), rng.choice(OUTCOMES[:4]))  # all but "moved"


def crash(db: str, log_path: str, seed: int, agents: str, steps: int | None) -> None:
    writer = CrashWriter(db, log_path, seed, agents.split(","))
    writer.carry_on()
    say("ready")
    n = 0
    while steps is None or n < steps:
        n += 1
        writer.step(n)
    writer.log.close()
    writer.store.close()
    say(json.dumps({"steps": n}))


# --------------------------------------------------------------------------------------------
# The contention worker
# --------------------------------------------------------------------------------------------


class Recorder:
    """One thread's calls and answers, each between two readings of the monotonic clock."""

    def __init__(self, proc: int, thread: int) -> None:
        self.proc, self.thread = proc, thread
        self.records: list[dict[str, Any]] = []

    def add(self, op: str, t0: float, **fields: Any) -> dict[str, Any]:
        record = {"proc": self.proc, "thread": self.thread, "op": op, "t0": t0}
        record["t1"] = time.monotonic()
        record.update(fields)
        self.records.append(record)
        return record


class Contender:
    """One thread of a contention worker: increments, churn and claims until the deadline."""

    def __init__(
        self, store: StateStore, coord: Coordinator, rng: random.Random, rec: Recorder
    ) -> None:
        self.store, self.coord, self.rng, self.rec = store, coord, rng, rec
        self.writer = f"p{rec.proc}-t{rec.thread}"
        t0 = time.monotonic()
        self.agent = coord.register(self.writer).agent_id
        rec.add("register", t0, agent=self.agent)

    def get(self, key: str) -> tuple[int, Any] | None:
        t0 = time.monotonic()
        try:
            record = self.store.get(CONTENTION_NAMESPACE, key)
        except NotFoundError:
            self.rec.add("get", t0, key=key, outcome="not_found")
            return None
        self.rec.add("get", t0, key=key, outcome="ok", version=record.version, value=record.value)
        return record.version, record.value

    def set(self, key: str, value: Any, expected: int, purpose: str) -> ConflictError | None:
        """Write with ``expected``; the conflict if there was one (recorded either way)."""
        t0 = time.monotonic()
        fields = {"key": key, "expected": expected, "value": value, "purpose": purpose}
        try:
            done = self.store.set(
                CONTENTION_NAMESPACE, key, value, updated_by=self.writer, expected_version=expected
            )
        except ConflictError as exc:
            self.rec.add("set", t0, **fields, **conflict_fields(exc))
            return exc
        except BusyError as exc:
            self.rec.add("set", t0, **fields, outcome="unavailable", error=str(exc))
            return None
        self.rec.add("set", t0, **fields, outcome="ok", version=done.version)
        return None

    def delete(self, key: str, expected: int) -> None:
        t0 = time.monotonic()
        fields = {"key": key, "expected": expected}
        try:
            done = self.store.delete(
                CONTENTION_NAMESPACE, key, deleted_by=self.writer, expected_version=expected
            )
        except ConflictError as exc:
            self.rec.add("delete", t0, **fields, **conflict_fields(exc))
            return
        except NotFoundError:
            self.rec.add("delete", t0, **fields, outcome="not_found")
            return
        except BusyError as exc:
            self.rec.add("delete", t0, **fields, outcome="unavailable", error=str(exc))
            return
        self.rec.add("delete", t0, **fields, outcome="ok", version=done.version)

    def increment(self) -> None:
        """Add 1 to a shared counter with the read, check, retry loop; a conflict hands back
        the current value and version, which the next attempt uses."""
        key = self.rng.choice(COUNTERS)
        read = self.get(key)
        assert read is not None, f"counter {key} has no live record"
        version, value = read
        while True:
            conflict = self.set(key, value + 1, version, "increment")
            if conflict is None:
                return
            current = conflict.current
            assert current is not None, f"counter {key} lost its live record"
            version, value = current.version, current.value
            self.pause()

    def churn(self) -> None:
        """Delete a churn key, create it again, or update it, each with the version just read."""
        key = self.rng.choice(CHURN_KEYS)
        read = self.get(key)
        self.pause()
        if read is None:
            self.set(key, {"by": self.writer, "life": "new"}, 0, "create")
        elif self.rng.random() < 0.5:
            self.delete(key, read[0])
        else:
            self.set(key, {"by": self.writer, "after": read[0]}, read[0], "update")

    def hold(self) -> None:
        """Claim a shared resource, hold it a moment, release it; on "busy", sometimes wait."""
        resource = self.rng.choice(RESOURCES)
        t0 = time.monotonic()
        reply = self.coord.claim(resource, self.agent)
        claim = self.rec.add(
            "claim",
            t0,
            resource=resource,
            agent=self.agent,
            outcome=reply.status,
            version=reply.version,
            held_by=reply.holder and reply.holder.agent_id,
        )
        if reply.status == "busy":
            if self.rng.random() < 0.5:
                t0 = time.monotonic()
                waited = self.coord.wait(resource, 0.05)
                self.rec.add("wait", t0, resource=resource, outcome=waited.status)
            return
        if reply.status != "claimed":
            raise AssertionError(f"unexpected claim reply {reply}")
        start = claim["t1"]  # the hold begins when the "claimed" answer is in hand
        time.sleep(self.rng.uniform(0, 0.003))
        end = time.monotonic()  # and ends before the release is sent
        released = self.coord.release(resource, self.agent, self.rng.choice(OUTCOMES[:4]))
        self.rec.add(
            "release",
            end,
            resource=resource,
            agent=self.agent,
            outcome=released.status,
            version=released.version,
        )
        self.rec.add(
            "hold",
            start,
            resource=resource,
            agent=self.agent,
            start=start,
            end=end,
            claim_t0=claim["t0"],
            release_t1=self.rec.records[-1]["t1"],
            claim_version=reply.version,
            release_version=released.version,
        )

    def pause(self) -> None:
        if self.rng.random() < 0.3:
            time.sleep(self.rng.uniform(0, 0.002))

    def run(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            roll = self.rng.random()
            if roll < 0.45:
                self.increment()
            elif roll < 0.7:
                self.churn()
            else:
                self.hold()
            self.pause()


def conflict_fields(exc: ConflictError) -> dict[str, Any]:
    return {
        "outcome": "conflict",
        "actual_version": exc.detail["actual_version"],
        "actual_value": exc.detail["actual_value"],
    }


def contend(db: str, out: str, seed: int, seconds: float, threads: int, index: int) -> None:
    store = StateStore(db, busy_timeout=BUSY_TIMEOUT)
    coord = Coordinator(store)
    recorders = [Recorder(index, t) for t in range(threads)]
    contenders = [
        Contender(store, coord, random.Random(seed * 1000 + t), rec)
        for t, rec in enumerate(recorders)
    ]
    failures: list[str] = []

    def body(contender: Contender, deadline: float) -> None:
        try:
            contender.run(deadline)
        except BaseException:
            failures.append(traceback.format_exc())

    say("ready")
    sys.stdin.readline()  # "go": every worker starts at once
    deadline = time.monotonic() + seconds
    running = [threading.Thread(target=body, args=(c, deadline)) for c in contenders]
    for t in running:
        t.start()
    for t in running:
        t.join()
    with open(out, "w", encoding="utf-8") as f:
        for rec in recorders:
            for record in rec.records:
                f.write(json.dumps(record) + "\n")
    store.close()
    say(json.dumps({"calls": sum(len(r.records) for r in recorders), "failures": failures}))
    if failures:
        raise SystemExit(1)


def main(argv: list[str]) -> None:
    command, *rest = argv
    if command == "crash":
        db, log_path, seed, agents, *steps = rest
        crash(db, log_path, int(seed), agents, int(steps[0]) if steps else None)
    elif command == "contend":
        db, out, seed, seconds, threads, index = rest
        contend(db, out, int(seed), float(seconds), int(threads), int(index))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
