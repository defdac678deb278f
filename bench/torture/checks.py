"""The checkers of bench/torture/torture.py: what must hold after a kill, over a merged record of
concurrent calls, and across a soak run. Used by the benchmark and by tests/test_torture.py.

Decisions behind it:
- A checker never stops at the first problem: it returns one Check per property, each with a
  count of what it looked at and the first few violations, so a failed run says what broke.
- Properties are checked against the database itself (read with plain sqlite3, or plain
  psycopg for a ``postgresql://`` URL: nothing of agenthold), so a bug in the library cannot
  hide behind the library's own reading of its data. The same SQL serves both engines. "Commit
  order" of one key's (or the claims') rows is the order of their ids on PostgreSQL too: their
  writers take turns under an advisory lock, and each takes its id after the last committed.
- Times in contention records are time.monotonic() readings from several processes; on Linux
  that is CLOCK_MONOTONIC, shared by the whole system, so they can be compared directly.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHOWN = 3  # violations quoted in a failed check's detail


@dataclass
class Check:
    """One property: whether it held, and what was looked at (or the first violations)."""

    name: str
    passed: bool
    detail: str


@dataclass
class Checks:
    """Collects checks; ``expect`` turns a list of violations into one Check."""

    items: list[Check] = field(default_factory=list)

    def expect(self, name: str, violations: Sequence[str], looked_at: str) -> None:
        if violations:
            shown = "; ".join(violations[:SHOWN])
            more = f" (and {len(violations) - SHOWN} more)" if len(violations) > SHOWN else ""
            self.items.append(Check(name, False, f"{len(violations)} violations: {shown}{more}"))
        else:
            self.items.append(Check(name, True, looked_at))

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.items)

    def failed(self) -> list[Check]:
        return [c for c in self.items if not c.passed]


def is_postgres(db: Path | str) -> bool:
    return isinstance(db, str) and db.startswith(("postgresql://", "postgres://"))


class PgConnection:
    """A psycopg connection read with the checkers' SQL (``?`` placeholders), autocommit."""

    dialect = "postgresql"

    def __init__(self, url: str) -> None:
        import psycopg

        self.raw = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.raw.execute(sql.replace("?", "%s"), params)

    def close(self) -> None:
        self.raw.close()


def connect(db: Path | str) -> Any:
    """A plain connection to ``db``: sqlite3 for a file, psycopg for a postgresql:// URL."""
    if is_postgres(db):
        return PgConnection(str(db))
    return sqlite3.connect(db, isolation_level=None)


def history_by_version(conn: Any, namespace: str) -> dict[tuple[str, int], tuple[str, str | None]]:
    """Every history row of ``namespace``: (key, version) -> (event type, the value's JSON
    text, or None for a delete)."""
    return {
        (key, version): (event, value)
        for key, version, event, value in conn.execute(
            "SELECT key, version, event_type, value FROM state_history WHERE namespace = ?",
            (namespace,),
        )
    }


def canonical(value: Any) -> str:
    """A value's JSON text as the store writes it, so stored and acknowledged values compare."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def read_lines(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The JSON lines of ``paths``, whole lines only: a line without its newline was being
    written when its process was killed, so it acknowledged nothing."""
    events: list[dict[str, Any]] = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        events.extend(json.loads(line) for line in text.split("\n")[:-1])
    return events


# --------------------------------------------------------------------------------------------
# Shared: the database file and the claim tables
# --------------------------------------------------------------------------------------------


def check_integrity(conn: Any, checks: Checks) -> None:
    if isinstance(conn, PgConnection):
        check_pg_indexes(conn, checks)
        return
    result = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    checks.expect(
        "PRAGMA integrity_check is ok",
        [] if result == ["ok"] else [f"integrity_check said {result[:SHOWN]}"],
        "ok",
    )


def check_pg_indexes(conn: PgConnection, checks: Checks) -> None:
    """PostgreSQL's counterpart of integrity_check: amcheck's bt_index_check on every index of
    agenthold's tables (in the schema of the URL). Where the extension cannot be created (not a
    superuser, no contrib package), the check says it was not made."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck SCHEMA public")
    except Exception as exc:
        checks.expect(f"indexes not checked (amcheck unavailable: {type(exc).__name__})", [], "")
        return
    indexes = [
        name
        for (name,) in conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_am a ON a.oid = c.relam "
            "WHERE t.relnamespace = current_schema()::regnamespace AND a.amname = 'btree'"
        )
    ]
    broken = []
    for name in indexes:
        try:
            conn.execute("SELECT public.bt_index_check(?::regclass, true)", (name,))
        except Exception as exc:
            broken.append(f"{name}: {exc}")
    checks.expect("amcheck finds every btree index sound", broken, f"{len(indexes)} indexes")


def check_live_rows(conn: Any, namespace: str, checks: Checks) -> None:
    """Each key's live row is its newest history entry (version, value and deleted flag), and
    in commit order its history versions run 1, 2, 3... (a delete's tombstone included)."""
    out_of_step = [
        f"{key}: version {version} committed after version {previous}"
        for key, previous, version in conn.execute(
            "SELECT key, previous, version FROM (SELECT key, version, LAG(version, 1, 0) "
            "OVER (PARTITION BY key ORDER BY id) AS previous FROM state_history "
            "WHERE namespace = ?) AS h WHERE version != previous + 1",
            (namespace,),
        )
    ]
    newest = {
        key: (version, event == "delete", value)
        for key, version, event, value in conn.execute(
            "SELECT key, version, event_type, value FROM state_history WHERE id IN "
            "(SELECT max(id) FROM state_history WHERE namespace = ? GROUP BY key)",
            (namespace,),
        )
    }
    live = {
        key: (version, bool(deleted), value)
        for key, version, deleted, value in conn.execute(
            "SELECT key, version, deleted, value FROM state WHERE namespace = ?", (namespace,)
        )
    }
    mismatched = [
        f"{key}: live {live.get(key, (None,))[:2]}, newest history {newest.get(key, (None,))[:2]}"
        for key in sorted(set(newest) | set(live))
        if live.get(key) != newest.get(key)
    ]
    rows = conn.execute(
        "SELECT count(*) FROM state_history WHERE namespace = ?", (namespace,)
    ).fetchone()[0]
    checks.expect(
        "each key's live version is its newest history version",
        mismatched,
        f"{len(live)} keys",
    )
    checks.expect(
        "each key's history versions run 1, 2, 3... (tombstones included, none reused)",
        out_of_step,
        f"{rows} history rows",
    )


def check_claim_tables(conn: Any, checks: Checks) -> None:
    """No claim is half-applied: each resource's row in ``claims`` says what its newest
    ``claim_events`` row says (held by that agent iff it was a claim; the same version; the
    same outcome and last holder after a release), and in commit order its event versions
    run 1, 2, 3..."""
    out_of_step = [
        f"{resource}: version {version} committed after version {previous}"
        for resource, previous, version in conn.execute(
            "SELECT resource, previous, version FROM (SELECT resource, version, "
            "LAG(version, 1, 0) OVER (PARTITION BY resource ORDER BY id) AS previous "
            "FROM claim_events WHERE resource IS NOT NULL) AS e WHERE version != previous + 1"
        )
    ]
    newest = {
        r[0]: r[1:]
        for r in conn.execute(
            "SELECT resource, agent_id, event, outcome, version FROM claim_events WHERE id IN "
            "(SELECT max(id) FROM claim_events WHERE resource IS NOT NULL GROUP BY resource)"
        )
    }
    rows = {
        r[0]: r[1:]
        for r in conn.execute(
            "SELECT resource, holder, version, last_outcome, last_holder FROM claims"
        )
    }
    half = []
    for resource in sorted(set(newest) | set(rows)):
        if resource not in rows or resource not in newest:
            half.append(
                f"{resource}: claims row {rows.get(resource)}, event {newest.get(resource)}"
            )
            continue
        holder, version, last_outcome, last_holder = rows[resource]
        agent, event, outcome, latest = newest[resource]
        if event == "claimed":
            ok = holder == agent and version == latest
        else:
            after = (last_outcome, last_holder)
            ok = holder is None and version == latest and after == (outcome, agent)
        if not ok:
            half.append(
                f"{resource}: row holder={holder} version={version} outcome={last_outcome}, "
                f"newest event {event} by {agent} version={latest} outcome={outcome}"
            )
    events = conn.execute(
        "SELECT count(*) FROM claim_events WHERE resource IS NOT NULL"
    ).fetchone()[0]
    checks.expect(
        "no claim is half-applied (each claims row agrees with its newest event)",
        half,
        f"{len(rows)} resources",
    )
    checks.expect(
        "each resource's claim versions run 1, 2, 3... (a fencing token, never reused)",
        out_of_step,
        f"{events} claim and release events",
    )


# --------------------------------------------------------------------------------------------
# Crash consistency
# --------------------------------------------------------------------------------------------


@dataclass
class Acks:
    """What crash writers acknowledged, read from their logs (each log once: a killed writer's
    log never changes again). Values are kept as the JSON text the store writes."""

    writes: list[tuple[str, int, str, str | None]] = field(default_factory=list)
    claims: list[tuple[str, int, str, str, str | None]] = field(default_factory=list)

    def read(self, log: Path) -> None:
        for ack in read_lines([log]):
            if ack["op"] in ("write", "delete"):
                text = canonical(ack["value"]) if ack["op"] == "write" else None
                self.writes.append((ack["key"], ack["version"], ack["op"], text))
            else:
                self.claims.append(
                    (ack["resource"], ack["version"], ack["op"], ack["agent"], ack.get("outcome"))
                )

    def __len__(self) -> int:
        return len(self.writes) + len(self.claims)


def check_after_kill(db: Path | str, acks: Acks, namespace: str) -> tuple[Checks, dict[str, int]]:
    """What must hold after a writer was killed: the file is sound; every change the writer
    acknowledged is there (a write or delete in the history with its version and value, a
    claim or release in claim_events with its version, agent and outcome); live rows agree
    with the history and the claim events. Changes that committed without an acknowledgement
    (the kill came between the commit and the log line) are allowed and counted.

    Returns the checks and figures: ``acknowledged`` and ``unacknowledged`` commits."""
    checks = Checks()
    conn = connect(db)
    try:
        check_integrity(conn, checks)
        history = history_by_version(conn, namespace)
        claim_events = {
            (resource, version): (event, agent, outcome)
            for resource, version, event, agent, outcome in conn.execute(
                "SELECT resource, version, event, agent_id, outcome FROM claim_events "
                "WHERE resource IS NOT NULL"
            )
        }
        lost_writes = [
            f"{op} {key} v{version}: history has {history.get((key, version))}"
            for key, version, op, text in acks.writes
            if history.get((key, version)) != (op, text)
        ]
        lost_claims = [
            f"{op} {resource} v{version}: claim_events has {claim_events.get((resource, version))}"
            for resource, version, op, agent, outcome in acks.claims
            if claim_events.get((resource, version)) != (op, agent, outcome)
        ]
        checks.expect(
            "every acknowledged write and delete is in the history, with its version and value",
            lost_writes,
            f"{len(acks.writes)} acknowledged",
        )
        checks.expect(
            "every acknowledged claim and release is in claim_events, with its version",
            lost_claims,
            f"{len(acks.claims)} acknowledged",
        )
        check_live_rows(conn, namespace, checks)
        check_claim_tables(conn, checks)
        figures = {
            "acknowledged": len(acks),
            "unacknowledged": len(history)
            - len({(k, v) for k, v, _, _ in acks.writes})
            + len(claim_events)
            - len({(r, v) for r, v, _, _, _ in acks.claims}),
        }
    finally:
        conn.close()
    return checks, figures


# --------------------------------------------------------------------------------------------
# Contention: the history check
# --------------------------------------------------------------------------------------------


def check_contention(
    db: Path | str,
    records: list[dict[str, Any]],
    *,
    namespace: str,
    counters: Sequence[str],
    initial: dict[str, int],
) -> tuple[Checks, dict[str, Any]]:
    """Check a merged record of concurrent calls against the database they ran on.

    ``records`` are the calls of every thread of every process (see workers.Recorder):
    each has ``op``, ``t0`` (monotonic time just before the call) and ``t1`` (just after the
    answer); "hold" records span from just after a "claimed" answer to just before the release
    was sent. ``initial`` maps a key to the version its set-up write (before any worker ran)
    left. The properties, exactly:

    1. Versions are unique: no two successful writes or deletes of one key answered the same
       version, and every version a successful call answered is in the history as that kind of
       event (with that value, for a write); every history row was answered to some call, or
       is a set-up write: nothing committed that nobody was told about.
    2. Versions only increase, in real time: if a write or delete of a key was answered before
       another one was sent, the later one got the higher version. A successful get returns a
       version no older than any write answered before the get was sent, and never a version
       whose write was sent after the get was answered. History versions run 1, 2, 3... per
       key, tombstones included, so a key deleted and created again continues its sequence.
    3. Every counter's final value is the number of increments answered "ok", and its version
       is its set-up version plus that number.
    4. Holder intervals never overlap: per resource, sorted by start, each hold starts after
       every earlier hold ended. In that order the versions run 1, 2, 3...: each hold's claim
       answered the previous hold's release version + 1, and its release the claim's + 1.
       A "busy" answer names an agent whose hold (from the moment its claim was sent to the
       moment its release was answered) overlaps the busy call.
    5. Every conflict names a newer version than the writer expected: the answered
       ``actual_version`` is above ``expected`` and is in the history as a write with the
       answered ``actual_value``; or, if the key had no live record (``actual_version`` 0),
       the history holds a delete of that key with a version above ``expected``.
    """
    checks = Checks()
    conn = connect(db)
    try:
        check_integrity(conn, checks)
        history = history_by_version(conn, namespace)
        deletes: dict[str, list[int]] = defaultdict(list)
        for (key, version), (event, _) in history.items():
            if event == "delete":
                deletes[key].append(version)
        final = {
            key: (version, value)
            for key, version, value in conn.execute(
                "SELECT key, version, value FROM state WHERE namespace = ? AND deleted = 0",
                (namespace,),
            )
        }
        check_live_rows(conn, namespace, checks)
        check_claim_tables(conn, checks)
        events = Counter(event for (event,) in conn.execute("SELECT event FROM claim_events"))
    finally:
        conn.close()

    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_op[r["op"]].append(r)
    done = [r for r in by_op["set"] + by_op["delete"] if r["outcome"] == "ok"]

    # 1. unique versions, all in the history, and nothing else in it
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    duplicates, missing = [], []
    for r in done:
        where = (r["key"], r["version"])
        if where in seen:
            duplicates.append(f"{where} answered to {who(seen[where])} and {who(r)}")
        seen[where] = r
        wanted = ("write", canonical(r["value"])) if r["op"] == "set" else ("delete", None)
        if history.get(where) != wanted:
            missing.append(f"{r['op']} {where} by {who(r)}: history has {history.get(where)}")
    unanswered = sorted(set(history) - set(seen) - set(initial.items()))
    checks.expect(
        "no two successful writes of one key share a version",
        duplicates,
        f"{len(done)} successful writes and deletes",
    )
    checks.expect(
        "every answered write and delete is in the history with its version and value",
        missing,
        f"{len(done)} answered, {len(history)} history rows",
    )
    checks.expect(
        "every history row was answered to a caller (or is a set-up write)",
        [f"{w} is in the history but no call was told" for w in unanswered],
        f"{len(history)} history rows",
    )

    # 2. real-time order of writes, and of reads against writes
    order, reads = [], []
    writes_by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in done:
        writes_by_key[r["key"]].append(r)
    for key, writes in writes_by_key.items():
        writes.sort(key=lambda r: r["version"])
        earliest_end_above = float("inf")  # earliest answer among higher versions
        for r in reversed(writes):
            if earliest_end_above < r["t0"]:
                order.append(f"{key} v{r['version']} by {who(r)} was sent after a higher version")
            earliest_end_above = min(earliest_end_above, r["t1"])
    ends: dict[str, tuple[list[float], list[int]]] = {}
    for key, writes in writes_by_key.items():
        by_end = sorted(writes, key=lambda r: r["t1"])
        top, highest = [], 0
        for r in by_end:
            highest = max(highest, r["version"])
            top.append(highest)
        ends[key] = ([r["t1"] for r in by_end], top)
    sent_at = {(r["key"], r["version"]): r["t0"] for r in done}
    gets = [r for r in by_op["get"] if r["outcome"] == "ok"]
    for g in gets:
        key, version = g["key"], g["version"]
        if history.get((key, version)) != ("write", canonical(g["value"])):
            reads.append(f"get {key} answered v{version} {g['value']!r}, not in the history")
            continue
        times, top = ends.get(key, ([], []))
        i = bisect.bisect_left(times, g["t0"])
        if i and top[i - 1] > version:
            reads.append(f"get {key} by {who(g)} answered v{version}, older than v{top[i - 1]}")
        if sent_at.get((key, version), float("-inf")) > g["t1"]:
            reads.append(f"get {key} by {who(g)} answered v{version} before it was written")
    checks.expect(
        "a write answered before another was sent has the lower version",
        order,
        f"{len(writes_by_key)} keys",
    )
    checks.expect(
        "a read sees every write answered before it was sent, and none sent after its answer",
        reads,
        f"{len(gets)} reads",
    )

    # 3. counters
    increments = Counter(r["key"] for r in by_op["set"] if r["outcome"] == "ok")
    wrong = []
    for key in counters:
        version, value = final.get(key, (None, None))
        n = increments[key]
        if value is None or json.loads(value) != n or version != initial[key] + n:
            wrong.append(f"{key}: value {value}, version {version}, {n} increments answered ok")
    checks.expect(
        "every counter equals its number of successful increments",
        wrong,
        ", ".join(f"{k}={increments[k]}" for k in counters),
    )

    # 4. holder intervals
    overlaps, fencing, busy_wrong = [], [], []
    holds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for h in by_op["hold"]:
        holds[h["resource"]].append(h)
    for resource, hs in holds.items():
        hs.sort(key=lambda h: h["start"])
        latest: dict[str, Any] | None = None  # the earlier hold that ended last
        released = 0  # the version the previous hold (in time) released
        for h in hs:
            if latest is not None and h["start"] < latest["end"]:
                overlaps.append(
                    f"{resource}: {h['agent']} from {h['start']:.6f} while {latest['agent']} "
                    f"held it until {latest['end']:.6f}"
                )
            if h["claim_version"] != released + 1 or h["release_version"] != released + 2:
                fencing.append(
                    f"{resource}: after v{released}, a hold claimed v{h['claim_version']} "
                    f"and released v{h['release_version']}"
                )
            released = h["release_version"] or 0
            if latest is None or h["end"] > latest["end"]:
                latest = h
    spans: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for h in by_op["hold"]:
        spans[(h["resource"], h["agent"])].append((h["claim_t0"], h["release_t1"]))
    busy = [r for r in by_op["claim"] if r["outcome"] == "busy"]
    for b in busy:
        if not any(
            s < b["t1"] and e > b["t0"] for s, e in spans.get((b["resource"], b["held_by"]), [])
        ):
            busy_wrong.append(f"{b['resource']}: busy at {b['t0']:.6f} named {b['held_by']}")
    checks.expect(
        "at no moment did two agents hold one resource (holder intervals never overlap)",
        overlaps,
        f"{len(by_op['hold'])} holds of {len(holds)} resources",
    )
    checks.expect(
        "claim and release versions follow the holds in time, one apart, from 1",
        fencing,
        f"{len(by_op['hold'])} holds",
    )
    checks.expect(
        "every busy answer names an agent that held the resource during the call",
        busy_wrong,
        f"{len(busy)} busy answers",
    )
    expected_events = {
        "registered": len(by_op["register"]),
        "claimed": sum(r["outcome"] == "claimed" for r in by_op["claim"]),
        "released": sum(r["outcome"] == "released" for r in by_op["release"]),
    }
    checks.expect(
        "claim_events holds one row per answered registration, claim and release",
        [] if dict(events) == expected_events else [f"{dict(events)} != {expected_events}"],
        ", ".join(f"{k} {v}" for k, v in expected_events.items()),
    )

    # 5. conflicts
    conflicts = [r for r in by_op["set"] + by_op["delete"] if r["outcome"] == "conflict"]
    stale = []
    gone = 0
    for c in conflicts:
        key, expected, actual = c["key"], c["expected"], c["actual_version"]
        if actual == 0:
            gone += 1
            if not any(v > expected for v in deletes.get(key, [])):
                stale.append(f"{key}: no live record, but no delete after v{expected}")
        elif actual <= expected:
            stale.append(f"{key}: expected v{expected}, conflict named v{actual}")
        elif history.get((key, actual)) != ("write", canonical(c["actual_value"])):
            stale.append(f"{key}: conflict named v{actual}, which the history does not hold")
    checks.expect(
        "every conflict named a version newer than the one the writer expected",
        stale,
        f"{len(conflicts)} conflicts ({gone} found no live record)",
    )

    unavailable = [r for r in records if r.get("outcome") == "unavailable"]
    figures = {
        "calls": len(records) - len(by_op["hold"]),
        "increments": sum(increments[k] for k in counters),
        "conflicts": len(conflicts),
        "conflicts_no_live_record": gone,
        "deletes": sum(r["outcome"] == "ok" for r in by_op["delete"]),
        "creates": sum(r["outcome"] == "ok" and r["purpose"] == "create" for r in by_op["set"]),
        "holds": len(by_op["hold"]),
        "busy": len(busy),
        "reads": len(gets),
        "unavailable": len(unavailable),
        "max_attempts": max_attempts(by_op["set"]),
    }
    return checks, figures


def who(r: dict[str, Any]) -> str:
    return f"p{r['proc']}/t{r['thread']}"


def max_attempts(sets: list[dict[str, Any]]) -> int:
    """The most attempts one increment took (consecutive increment writes of one thread
    until one succeeded)."""
    longest = 0
    run: dict[tuple[int, int], int] = defaultdict(int)
    for r in sorted(sets, key=lambda r: r["t0"]):
        if r["purpose"] != "increment":
            continue
        thread = (r["proc"], r["thread"])
        run[thread] += 1
        if r["outcome"] != "conflict":
            longest = max(longest, run[thread])
            run[thread] = 0
    return longest


# --------------------------------------------------------------------------------------------
# Soak: leveling off
# --------------------------------------------------------------------------------------------


def growth(values: Sequence[float]) -> float:
    """How much the second half of a run grew a resource, as a fraction: the highest sample
    of the second half over the highest of the first half, minus 1 (0 if it did not grow).

    Highs, because the figures measured here go up and down with the work in flight but, with
    no leak, never past a bound: a pool of worker threads (each with its database connection)
    up to its limit, client connections up to one per client. A leak sets new highs. Medians
    would not do: an idle pool shrinks and grows again with the load, so a median moves
    without any leak. The bound must be reached early, before the samples' first half ends
    (bench/torture/torture.py fills the servers' thread pools before sampling)."""
    half = len(values) // 2
    first, second = max(values[:half]), max(values[half:])
    return max(0.0, second / first - 1) if first else 0.0
