"""Speed of agenthold's message bus: append and poll rates, unread checks on a huge thread, and
how fast a wait is woken by another process.

    python bench/perf/messages_bench.py            # the full run, about half a minute
    python bench/perf/messages_bench.py --quick    # a smoke run (too small to judge)
    python bench/perf/messages_bench.py --json     # the same results as JSON instead of tables
    python bench/perf/messages_bench.py --db postgresql://user@host/dbname   # on PostgreSQL

What is measured, on files in a temporary directory, with the default durability ("normal": WAL
and synchronous NORMAL):

1. Appends per second: one sender appends short messages to one thread through
   ``MessageBus.append`` (validating the ids and content, bumping the thread's counter,
   checking membership and inserting the row in one ``BEGIN IMMEDIATE`` transaction).
2. Polls per second: ``MessageBus.poll`` of 10 messages after a cursor (a statement that
   reads the sizes of 11 rows, so the page stops at its byte budget and knows whether more
   remain, then one that reads the rows that fit) and the message records built from them.
3. Unread checks per second (``has_unread``, the agent given as its record: one statement that
   reads the thread's counter and the agent's cursor) on a thread of 1,000,000 messages and on
   an empty one, to show that the check does not grow with the thread. The same for
   ``get_thread_info`` (three statements in one snapshot: the thread row with its counter, which
   is also the message count, the participants, and the newest message) on the huge thread and
   on a thread of one message (so both read a newest message).

The baseline of 1 to 3 is a raw ``sqlite3`` connection on the same database file running the
statements the bus runs for the same calls, written out below. With ``--db`` and a
PostgreSQL URL, everything runs on that database (in new threads of its own; the huge thread is
filled by one INSERT ... SELECT, then vacuumed so that autovacuum does not run while the checks
are timed) and the baseline is a raw psycopg connection in autocommit
running the same statements, with BEGIN, and the NOTIFY the bus sends with its COMMIT. Rates
are the best of several runs, library and raw taking turns, because on a shared machine the best
run is the one least disturbed by other work.

4. Wake-up latency of ``wait``: another process waits on the thread; this process appends after
   a short random delay. The latency is the waiter's time.time() when ``wait`` returned minus
   this process's time.time() right after the append committed (one system-wide clock). An
   append by another thread of this process is measured the same way, for comparison.

The exit status is 1 only when a correctness check fails (a wait that returned the wrong
message); a missed speed target is reported, not fatal.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import (
    Loop,
    as_targets,
    best_rates,
    finish,
    machine,
    machine_line,
    options,
    percentile,
    raw_connection,
    table,
    target_lines,
    utc_iso,
)

from agenthold.messages import BusAgent, MessageBus

# The bus's statements for an append, a poll, an unread check and a thread's info, as it runs
# them on SQLite; PostgreSQL's spelling follows (its placeholders, and octet_length for the
# byte size of a text, which SQLite counts as the length of the text cast to a blob).
SQL = {
    "bump": "UPDATE msg_threads SET last_seq = last_seq + 1, last_message_at = ? "
    "WHERE thread_id = ? RETURNING last_seq",
    "member": "SELECT 1 FROM msg_participants WHERE thread_id = ? AND agent_id = ?",
    "insert": "INSERT INTO msg_messages (thread_id, seq, sender_id, sender_name, content, "
    "created_at, principal) VALUES (?, ?, ?, ?, ?, ?, ?)",
    "poll": "SELECT seq, sender_id, sender_name, content, created_at, principal "
    "FROM msg_messages WHERE thread_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
    "sizes": "SELECT seq, length(CAST(content AS BLOB)) FROM msg_messages "
    "WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT ?",
    "cursor": "SELECT t.last_seq, p.read_seq FROM msg_threads AS t LEFT JOIN msg_participants "
    "AS p ON p.thread_id = t.thread_id AND p.agent_id = ? WHERE t.thread_id = ?",
    "info": "SELECT created_at, last_seq, last_message_at, name, principal FROM msg_threads "
    "WHERE thread_id = ?",
    "members": "SELECT a.agent_id, a.name FROM msg_participants AS p JOIN msg_agents AS a "
    "ON a.agent_id = p.agent_id WHERE p.thread_id = ? ORDER BY p.joined_at, a.name",
}
PG_SQL = {name: text.replace("?", "%s") for name, text in SQL.items()}
PG_SQL["sizes"] = (
    "SELECT seq, octet_length(content) FROM msg_messages "
    "WHERE thread_id = %s AND seq > %s ORDER BY seq LIMIT %s"
)

CONTENT = "Tests pass on branch fix-123; please review src/app.py lines 40-80."
PAGE = 10  # messages per measured poll


@dataclass(frozen=True)
class Sizes:
    label: str
    repeats: int  # runs of each rate measurement; the best counts
    appends: int  # appends per run
    polls: int  # polls per run
    checks: int  # unread checks per run
    huge: int  # messages in the long thread of the unread check
    trials: int  # wake-ups measured for each appender (another process, another thread)


FULL = Sizes("full", 3, 5_000, 5_000, 20_000, 1_000_000, 200)
QUICK = Sizes("quick", 2, 300, 300, 1_000, 20_000, 20)


# --------------------------------------------------------------------------------------------
# 1-3: rates
# --------------------------------------------------------------------------------------------


class Raw:
    """messages.py's statements for one append, one poll, one unread check and one thread info,
    on one plain sqlite3 connection."""

    def __init__(self, path: Path | str, thread_id: str, agent: BusAgent) -> None:
        assert isinstance(path, Path)
        self.conn = raw_connection(path)
        self.cur = self.conn.cursor()
        self.tid, self.agent = thread_id, agent

    def close(self) -> None:
        self.conn.close()

    def append(self, content: str) -> int:
        cur, tid, now = self.cur, self.tid, utc_iso()
        cur.execute("BEGIN IMMEDIATE")
        seq = cur.execute(SQL["bump"], (now, tid)).fetchone()[0]
        cur.execute(SQL["member"], (tid, self.agent.id)).fetchone()
        cur.execute(SQL["insert"], (tid, seq, self.agent.id, self.agent.name, content, now, None))
        cur.execute("COMMIT")
        return int(seq)

    def poll(self, after_seq: int) -> list[Any]:
        cur, tid = self.cur, self.tid
        sizes = cur.execute(SQL["sizes"], (tid, after_seq, PAGE + 1)).fetchall()[:PAGE]
        return cur.execute(SQL["poll"], (tid, after_seq, sizes[-1][0])).fetchall() if sizes else []

    def has_unread(self, thread_id: str) -> bool:
        last, cursor = self.cur.execute(SQL["cursor"], (self.agent.id, thread_id)).fetchone()
        return bool(last > cursor)

    def thread_info(self, thread_id: str) -> tuple[Any, ...]:
        cur = self.cur
        cur.execute("BEGIN")
        row = cur.execute(SQL["info"], (thread_id,)).fetchone()
        members = cur.execute(SQL["members"], (thread_id,)).fetchall()
        last = row[1]
        latest = cur.execute(SQL["poll"], (thread_id, last - 1, last)).fetchone() if last else None
        cur.execute("COMMIT")
        return row, members, latest


class RawPostgres(Raw):
    """The same statements on one plain psycopg connection (autocommit, explicit BEGIN and
    COMMIT, as the bus's pool runs them)."""

    def __init__(self, url: Path | str, thread_id: str, agent: BusAgent) -> None:
        import psycopg

        self.pg = psycopg.connect(str(url), autocommit=True)
        self.tid, self.agent = thread_id, agent
        self.sql = PG_SQL
        topic = json.dumps([["m", thread_id]])  # what the bus notifies: the thread's topic
        self.notify = f"NOTIFY agenthold, '{topic}'; COMMIT"

    def close(self) -> None:
        self.pg.close()

    def append(self, content: str) -> int:
        pg, tid, now, sql = self.pg, self.tid, utc_iso(), self.sql
        pg.execute("BEGIN")
        seq = pg.execute(sql["bump"], (now, tid)).fetchone()[0]
        pg.execute(sql["member"], (tid, self.agent.id)).fetchone()
        pg.execute(sql["insert"], (tid, seq, self.agent.id, self.agent.name, content, now, None))
        pg.execute(self.notify)
        return int(seq)

    def poll(self, after_seq: int) -> list[Any]:
        pg, sql, tid = self.pg, self.sql, self.tid
        sizes = pg.execute(sql["sizes"], (tid, after_seq, PAGE + 1)).fetchall()[:PAGE]
        return pg.execute(sql["poll"], (tid, after_seq, sizes[-1][0])).fetchall() if sizes else []

    def has_unread(self, thread_id: str) -> bool:
        row = self.pg.execute(self.sql["cursor"], (self.agent.id, thread_id)).fetchone()
        return bool(row[0] > row[1])

    def thread_info(self, thread_id: str) -> tuple[Any, ...]:
        pg, sql = self.pg, self.sql
        pg.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        row = pg.execute(sql["info"], (thread_id,)).fetchone()
        members = pg.execute(sql["members"], (thread_id,)).fetchall()
        last = row[1]
        latest = pg.execute(sql["poll"], (thread_id, last - 1, last)).fetchone() if last else None
        pg.execute("COMMIT")
        return row, members, latest


def fill(db: Path | str, thread_id: str, sender: BusAgent, count: int) -> None:
    """Give the thread ``count`` messages quickly: one transaction, on a plain connection, of
    the rows that many appends would write (the benchmark measures reading them, not writing)."""
    now = utc_iso()
    last = "SELECT last_seq FROM msg_threads WHERE thread_id = ?"
    bump = "UPDATE msg_threads SET last_seq = ?, last_message_at = ? WHERE thread_id = ?"
    if isinstance(db, str):  # PostgreSQL: the rows made by the server, in one statement
        import psycopg

        with psycopg.connect(db) as pg, pg.transaction():
            start = pg.execute(last.replace("?", "%s"), (thread_id,)).fetchone()[0]
            pg.execute(
                "INSERT INTO msg_messages (thread_id, seq, sender_id, sender_name, content, "
                "created_at, principal) SELECT %s, s, %s, %s, %s, %s, NULL "
                "FROM generate_series(%s::int8, %s::int8) AS s",
                (thread_id, sender.id, sender.name, CONTENT, now, start + 1, start + count),
            )
            pg.execute(bump.replace("?", "%s"), (start + count, now, thread_id))
        return
    conn = raw_connection(db)
    try:
        conn.execute("BEGIN IMMEDIATE")
        start = conn.execute(last, (thread_id,)).fetchone()[0]
        conn.executemany(
            SQL["insert"],
            (
                (thread_id, seq, sender.id, sender.name, CONTENT, now, None)
                for seq in range(start + 1, start + count + 1)
            ),
        )
        conn.execute(bump, (start + count, now, thread_id))
        conn.execute("COMMIT")
    finally:
        conn.close()


def where(tmp: Path, name: str, url: str | None) -> Path | str:
    """The database of one measurement: a file in ``tmp``, or the PostgreSQL database."""
    return url if url is not None else tmp / name


def measure_rates(tmp: Path, sizes: Sizes, url: str | None = None) -> dict[str, Any]:
    db = where(tmp, "rates.db", url)
    bus = MessageBus(db)
    alice, bob = bus.get_or_create_agent("alice"), bus.get_or_create_agent("bob")
    lib_thread = bus.create_thread(alice, bob).id
    raw_thread = bus.create_thread(alice, bob).id
    raw = (Raw if url is None else RawPostgres)(db, raw_thread, alice)
    try:
        append, poll = bus.append, bus.poll
        appends: dict[str, Loop] = {
            "library": lambda n: [append(lib_thread, alice, CONTENT) for _ in range(n)] and None,
            "raw": lambda n: [raw.append(CONTENT) for _ in range(n)] and None,
        }
        for loop in appends.values():
            loop(100)  # warm up connections and statement caches
        out: dict[str, Any] = {"append": best_rates(appends, sizes.appends, sizes.repeats)}

        polls: dict[str, Loop] = {
            "library": lambda n: [poll(lib_thread, i % 50, limit=PAGE) for i in range(n)] and None,
            "raw": lambda n: [raw.poll(i % 50) for i in range(n)] and None,
        }
        out["poll"] = best_rates(polls, sizes.polls, sizes.repeats)
        if len(poll(lib_thread, 0, limit=PAGE)) != PAGE or len(raw.poll(0)) != PAGE:
            raise RuntimeError("a poll returned the wrong number of messages")

        empty = bus.create_thread(alice, bob).id
        huge = bus.create_thread(alice, bob).id
        fill(db, huge, alice, sizes.huge)
        if url is not None:  # settle now, not in autovacuum while the checks are timed
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM (ANALYZE) msg_messages")
        bus.mark_read(huge, bob, sizes.huge // 2)  # half of it unread
        if not bus.has_unread(huge, bob) or bus.has_unread(empty, bob):
            raise RuntimeError("has_unread gave a wrong answer")
        has_unread = bus.has_unread
        checks: dict[str, Loop] = {
            "empty": lambda n: [has_unread(empty, bob) for _ in range(n)] and None,
            "huge": lambda n: [has_unread(huge, bob) for _ in range(n)] and None,
            "raw_empty": lambda n: [raw.has_unread(empty) for _ in range(n)] and None,
            "raw_huge": lambda n: [raw.has_unread(huge) for _ in range(n)] and None,
        }
        out["unread"] = best_rates(checks, sizes.checks, sizes.repeats)

        one = bus.create_thread(alice, bob).id  # a latest message to read, as the huge one has
        bus.append(one, alice, CONTENT)
        info = bus.get_thread_info
        found, small = info(huge), info(one)
        if found is None or found.message_count != sizes.huge or small is None:
            raise RuntimeError("get_thread_info gave a wrong count")
        infos: dict[str, Loop] = {
            "one": lambda n: [info(one) for _ in range(n)] and None,
            "huge": lambda n: [info(huge) for _ in range(n)] and None,
            "raw_one": lambda n: [raw.thread_info(one) for _ in range(n)] and None,
            "raw_huge": lambda n: [raw.thread_info(huge) for _ in range(n)] and None,
        }
        out["info"] = best_rates(infos, sizes.checks, sizes.repeats)
    finally:
        raw.close()
        bus.close()
    return out


# --------------------------------------------------------------------------------------------
# 4: wake-up latency of wait
# --------------------------------------------------------------------------------------------


def waiter(path: str, thread_id: str, conn: Any) -> None:
    """Another process: waits on the thread when told to, and answers with its time.time()
    when the wait returned and the seq it got."""
    bus = MessageBus(path)
    bus.poll(thread_id)  # open the connection before the first wait
    conn.send("ready")
    while True:
        command = conn.recv()
        if command[0] != "wait":
            break
        conn.send("waiting")
        page = bus.wait(thread_id, after_seq=command[1], timeout=10)
        conn.send((time.time(), page[0].seq if page else None))
    bus.close()


def summary(latencies: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in latencies]
    return {
        "trials": len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
    }


def measure_wake(tmp: Path, sizes: Sizes, url: str | None = None) -> dict[str, Any]:
    path = where(tmp, "wake.db", url)
    bus = MessageBus(path)
    alice, bob = bus.get_or_create_agent("alice"), bus.get_or_create_agent("bob")
    tid = bus.create_thread(alice, bob).id
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter, as another server is
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=waiter, args=(str(path), tid, theirs))
    proc.start()
    rng = random.Random(7)
    out: dict[str, Any] = {}
    try:
        if not mine.poll(60):
            raise RuntimeError("the waiting process did not start")
        mine.recv()
        latencies = []
        for _ in range(sizes.trials):
            last = bus.get_thread_info(tid).last_seq  # type: ignore[union-attr]
            mine.send(("wait", last))
            mine.recv()
            time.sleep(rng.uniform(0.005, 0.015))  # the waiter is inside wait by now
            message = bus.append(tid, alice, CONTENT)
            appended = time.time()
            returned, seq = mine.recv()
            if seq != message.seq:
                raise RuntimeError(f"the wait returned seq {seq}, not {message.seq}")
            latencies.append(returned - appended)
        out["process"] = summary(latencies)

        latencies = []
        for _ in range(sizes.trials):
            last = bus.get_thread_info(tid).last_seq  # type: ignore[union-attr]
            result: list[Any] = []
            started = threading.Event()

            def wait(after: int = last, into: list[Any] = result, began: Any = started) -> None:
                began.set()
                page = bus.wait(tid, after_seq=after, timeout=10)
                into.append((time.time(), page[0].seq if page else None))

            thread = threading.Thread(target=wait)
            thread.start()
            started.wait()
            time.sleep(rng.uniform(0.005, 0.015))
            message = bus.append(tid, bob, CONTENT)
            appended = time.time()
            thread.join()
            returned, seq = result[0]
            if seq != message.seq:
                raise RuntimeError(f"the wait returned seq {seq}, not {message.seq}")
            latencies.append(max(0.0, returned - appended))
        out["thread"] = summary(latencies)
    finally:
        mine.send(("stop",))
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
        bus.close()
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rates, wake = results["rates"], results["wake"]["process"]
    append = rates["append"]["library"] / rates["append"]["raw"]
    unread = rates["unread"]["huge"] / rates["unread"]["empty"]
    info = rates["info"]["huge"] / rates["info"]["one"]
    checks = [
        (f"append >= 0.6 of {results['raw']}", append >= 0.6, f"{append:.0%}"),
        (
            "has_unread on a 1,000,000-message thread within 20% of an empty thread",
            unread >= 0.8,
            f"{unread:.0%} of the empty thread's rate",
        ),
        (
            "get_thread_info on a 1,000,000-message thread within 20% of a 1-message thread",
            info >= 0.8,
            f"{info:.0%} of the 1-message thread's rate",
        ),
        (
            "wake-up by another process: median <= 10 ms",
            wake["median_ms"] <= 10,
            f"{wake['median_ms']:.2f} ms",
        ),
        (
            "wake-up by another process: p99 <= 30 ms",
            wake["p99_ms"] <= 30,
            f"{wake['p99_ms']:.2f} ms",
        ),
    ]
    return as_targets(checks)


def report(results: dict[str, Any]) -> str:
    m, sizes, rates, wake = results["machine"], results["sizes"], results["rates"], results["wake"]
    a, p, u, t = rates["append"], rates["poll"], rates["unread"], rates["info"]
    huge = f"{sizes['huge']:,}"
    out = [
        f"agenthold message bus benchmark ({sizes['label']} run)",
        machine_line(m),
        f"rates: best of {sizes['repeats']} runs, library and raw taking turns",
        "",
        table(
            [
                [f"operation ({results['engine']})", "agenthold/s", "raw/s", "of raw"],
                [
                    "append",
                    f"{a['library']:,.0f}",
                    f"{a['raw']:,.0f}",
                    f"{a['library'] / a['raw']:.0%}",
                ],
                [
                    f"poll {PAGE} messages",
                    f"{p['library']:,.0f}",
                    f"{p['raw']:,.0f}",
                    f"{p['library'] / p['raw']:.0%}",
                ],
                [
                    "has_unread, empty thread",
                    f"{u['empty']:,.0f}",
                    f"{u['raw_empty']:,.0f}",
                    f"{u['empty'] / u['raw_empty']:.0%}",
                ],
                [
                    f"has_unread, thread of {huge} messages",
                    f"{u['huge']:,.0f}",
                    f"{u['raw_huge']:,.0f}",
                    f"{u['huge'] / u['raw_huge']:.0%}",
                ],
                [
                    "get_thread_info, thread of 1 message",
                    f"{t['one']:,.0f}",
                    f"{t['raw_one']:,.0f}",
                    f"{t['one'] / t['raw_one']:.0%}",
                ],
                [
                    f"get_thread_info, thread of {huge} messages",
                    f"{t['huge']:,.0f}",
                    f"{t['raw_huge']:,.0f}",
                    f"{t['huge'] / t['raw_huge']:.0%}",
                ],
            ]
        ),
        "",
    ]
    rows = [["wake-up latency of wait (append committed -> wait returned)"]]
    rows[0] += ["median", "p99", "max", "trials"]
    for key, label in (("process", "append in another process"), ("thread", "append in a thread")):
        w = wake[key]
        rows.append(
            [
                label,
                f"{w['median_ms']:.2f} ms",
                f"{w['p99_ms']:.2f} ms",
                f"{w['max_ms']:.2f} ms",
                f"{w['trials']}",
            ]
        )
    out += [table(rows), "", *target_lines(results["targets"], quick=sizes["label"] == "quick")]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = options(__doc__)
    parser.add_argument("--db", metavar="URL", help="a postgresql:// URL to run on instead")
    args = parser.parse_args(argv)
    if args.db is not None and not args.db.startswith(("postgresql://", "postgres://")):
        parser.error("--db takes a postgresql:// URL (SQLite runs on files of its own)")
    sizes = QUICK if args.quick else FULL
    results: dict[str, Any] = {"machine": machine(), "sizes": sizes.__dict__}
    postgres = args.db is not None
    results["engine"] = "PostgreSQL" if postgres else "file database, durability normal"
    results["raw"] = "raw psycopg" if postgres else "raw sqlite3"
    try:
        with tempfile.TemporaryDirectory(prefix="agenthold-messages-bench-") as tmp:
            results["rates"] = measure_rates(Path(tmp), sizes, args.db)
            results["wake"] = measure_wake(Path(tmp), sizes, args.db)
    except RuntimeError as exc:
        print(f"correctness check failed: {exc}", file=sys.stderr)
        return 1
    results["targets"] = targets(results)
    finish(args, results, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
