"""``agenthold status``: the whole database on one screen, the first command to type.

Which database this is (path and backend), the agents whose lease is live, the claims held and
the waits queued for them, the latest events, and the bus threads where someone has unread
messages. Decisions behind it:
- It reads through the open, read-only ``Inspector`` it is given (inspect.py), so it opens the
  database exactly as the other subcommands do, refuses what they refuse, never writes and
  never imports mcp. The queue and the shared holds come from the coordinator's read-only
  reads (``Coordinator.queue``, ``shares``), which pass over dead waits instead of deleting them.
- One screen: each section shows its first few rows (``SHOWN``) and says how many more there
  are and which subcommand lists them all. ``--json`` has the same sections and totals, with
  the same rows (the subcommands give programs everything).
- No import of inspect.py (it imports this module for its ``status`` command); only tables.py
  for the text.
"""

from __future__ import annotations

from typing import Any

from agenthold.inspect.tables import Column, age, by_whom, clean, table
from agenthold.retention import retention_summary

SHOWN = 6  # rows of each section on the screen (and in the JSON); the subcommands list all

AGENT_COLUMNS = (
    Column("NAME", cut=2),
    Column("ID"),
    Column("LEASE", cut=1),
    Column("CLAIMS", right=True),
    Column("LAST SEEN"),
)
HELD_COLUMNS = (Column("RESOURCE", cut=2), Column("MODE"), Column("BY", cut=1), Column("SINCE"))
QUEUE_COLUMNS = (
    Column("WAITING FOR", cut=2),
    Column("MODE"),
    Column("WHO", cut=1),
    Column("SINCE"),
    Column("GIVES UP"),
)
EVENT_COLUMNS = (
    Column("TIME (UTC)"),
    Column("ACTOR", cut=2, least=16),
    Column("EVENT"),
    Column("WHAT", cut=1, least=36),
)
THREAD_COLUMNS = (
    Column("THREAD"),
    Column("NAME", cut=1),
    Column("MESSAGES", right=True),
    Column("UNREAD", cut=2),
)

# Every participant behind the end of its thread: how many messages it has not marked read.
_UNREAD = (
    "SELECT t.thread_id, t.name, t.last_seq, a.name, t.last_seq - p.read_seq "
    "FROM msg_threads AS t JOIN msg_participants AS p ON p.thread_id = t.thread_id "
    "JOIN msg_agents AS a ON a.agent_id = p.agent_id WHERE p.read_seq < t.last_seq "
    "ORDER BY t.created_at, t.thread_id, a.name"
)


def collect(inspector: Any) -> dict[str, Any]:
    """The status record (the ``--json`` output; docs/inspector.md names its fields)."""
    store, coordinator, now = inspector.store, inspector.coordinator, inspector.now
    backend = store.db.dialect
    size = None
    if backend == "sqlite" and store.path != ":memory:":
        import os

        try:
            size = os.path.getsize(store.path)
        except OSError:  # pragma: no cover - removed since it was opened
            size = None
    every = coordinator.list_agents()  # [] also where the claims tables were never made
    held_by: dict[str, int] = {}
    claims: list[dict[str, Any]] = []
    for info in coordinator.list_claims():
        held_by[info.holder] = held_by.get(info.holder, 0) + 1
        claims.append(
            {
                "resource": info.uri,  # as `agenthold claims` shows it
                "mode": info.mode,
                "agent_id": info.holder,
                "agent_name": info.holder_name,
                "claimed_at": info.claimed_at,
            }
        )
    queue: list[dict[str, Any]] = []
    if every:  # the claims tables are there (a claim, a share or a wait has an agent)
        for share in coordinator.shares():  # live ones only: an ended lease holds nothing
            held_by[share.holder] = held_by.get(share.holder, 0) + 1
            claims.append(
                {
                    "resource": share.uri,
                    "mode": "shared",
                    "agent_id": share.holder,
                    "agent_name": share.holder_name,
                    "claimed_at": share.claimed_at,
                }
            )
        for wait in coordinator.queue():  # read only: the dead waits are passed over
            queue.append(
                {
                    "seq": wait.seq,
                    "resource": wait.target.uri,
                    "mode": wait.mode,
                    "agent_id": wait.agent_id,
                    "agent_name": wait.name,
                    "since": wait.since,
                    "gives_up_at": _iso(wait.until),
                    "place_kept": wait.parked,
                }
            )
    with store.db.snapshot() as conn:
        events, _ = inspector.latest_events(conn, None, SHOWN)
        unread_rows = conn.execute(_UNREAD).fetchall() if inspector.bus.has_tables else []
    threads: dict[str, dict[str, Any]] = {}
    for thread_id, name, last_seq, member, behind in unread_rows:
        thread = threads.setdefault(
            thread_id,
            {"thread_id": thread_id, "name": name, "message_count": last_seq, "unread": {}},
        )
        thread["unread"][member] = behind
    agents = []
    for agent in every:
        end = agent.lease_ends_at
        if end is not None and end <= now:
            continue  # its lease has ended: it holds nothing and is not around
        agents.append(
            {
                **agent.to_dict(),
                "lease_state": "none" if end is None else "active",
                "claims_held": held_by.get(agent.agent_id, 0),
            }
        )
    agents.sort(key=lambda a: a["last_seen_at"], reverse=True)
    claims.sort(key=lambda c: (c["resource"], c["claimed_at"] or ""))
    return {
        "database": {"path": store.path, "backend": backend, "size_bytes": size},
        "agents": {"registered": len(every), "live": len(agents), "shown": agents[:SHOWN]},
        "claims": {"held": len(claims), "shown": claims[:SHOWN]},
        "queue": {"waiting": len(queue), "shown": queue[:SHOWN]},
        "events": events,
        "threads": {"with_unread": len(threads), "shown": list(threads.values())[:SHOWN]},
        "retention": [r for r in retention_summary(store.db) if r["value"] != "keep"],
    }


def _iso(moment: float) -> str:
    from agenthold.store import utc_iso

    return utc_iso(moment)


def _size(size: int | None) -> str:
    """ ", 54.0 KiB": a file's size for the database line ("" for none)."""
    if size is None:
        return ""
    if size < 1024:
        return f", {size} bytes"
    shown, unit = size / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if shown < 1024:
            break
        shown, unit = shown / 1024, bigger
    return f", {shown:.1f} {unit}"


def lines(inspector: Any, status: dict[str, Any]) -> list[str]:
    """The screen of ``status`` for people."""
    width, now = inspector.columns, inspector.now
    db = status["database"]
    out = [f"database: {db['path']} ({db['backend']}{_size(db['size_bytes'])})"]

    def section(
        title: str,
        columns: tuple[Column, ...],
        rows: list[list[str]],
        total: int,
        more: str,
    ) -> None:
        out.append("")
        out.append(title)
        if rows:
            out.extend("  " + line for line in table(columns, _clean(rows, width), width - 2))
        if total > len(rows):
            out.append(f"  ... and {total - len(rows)} more ({more})")

    agents = status["agents"]
    section(
        f"agents: {agents['live']} with a live lease, of {agents['registered']} registered",
        AGENT_COLUMNS,
        [
            [
                by_whom(a["name"], a.get("principal")),
                a["agent_id"],
                inspector.lease_text(a),
                str(a["claims_held"]),
                age(a["last_seen_at"], now),
            ]
            for a in agents["shown"]
        ],
        agents["live"],
        "'agenthold agents' lists them all",
    )
    claims = status["claims"]
    section(
        f"claims: {claims['held']} held",
        HELD_COLUMNS,
        [
            [c["resource"], c["mode"], c["agent_name"] or c["agent_id"], age(c["claimed_at"], now)]
            for c in claims["shown"]
        ],
        claims["held"],
        "'agenthold claims' lists them all",
    )
    queue = status["queue"]
    if queue["waiting"]:
        section(
            f"queue: {queue['waiting']} waiting to claim",
            QUEUE_COLUMNS,
            [
                [
                    q["resource"],
                    q["mode"],
                    q["agent_name"] or q["agent_id"],
                    age(q["since"], now),
                    age(q["gives_up_at"], now),
                ]
                for q in queue["shown"]
            ],
            queue["waiting"],
            "oldest first",
        )
    events = status["events"]
    section(
        f"latest events: {len(events)}" if events else "latest events: none yet",
        EVENT_COLUMNS,
        [_event_row(inspector.log_row(e)) for e in events],
        len(events),
        "",
    )
    if events:
        out.append("  ('agenthold log' shows more, 'agenthold log -f' follows)")
    threads = status["threads"]
    section(
        f"threads with unread messages: {threads['with_unread']}",
        THREAD_COLUMNS,
        [
            [
                t["thread_id"],
                t["name"] or "-",
                str(t["message_count"]),
                ", ".join(f"{who} {n}" for who, n in t["unread"].items()),
            ]
            for t in threads["shown"]
        ],
        threads["with_unread"],
        "'agenthold threads' lists every thread",
    )
    bounded = status["retention"]
    out.append("")
    if bounded:
        rules = ", ".join(
            f"{r['setting']}={r['value']}" + (f" ({r['scope']} {r['name']})" if r["name"] else "")
            for r in bounded
        )
        out.append(f"retention: {rules} ('agenthold retention' shows every rule)")
    else:
        out.append("retention: everything is kept ('agenthold retention set' bounds it)")
    return out


def _event_row(logged: list[str]) -> list[str]:
    """TIME, ACTOR, EVENT and WHAT of a row of `agenthold log` (its VERSION left out)."""
    at, actor, event, _, what = logged
    return [at, actor, event, what]


def _clean(rows: list[list[str]], width: int) -> list[list[str]]:
    return [[clean(cell, width) for cell in row] for row in rows]


def status(inspector: Any) -> int:
    """Print the status of ``inspector``'s database; exit status 0."""
    record = collect(inspector)
    if inspector.as_json:
        import json

        inspector.emit([json.dumps(record, ensure_ascii=False, indent=2)])
    else:
        inspector.emit(lines(inspector, record))
    return 0
