"""The read-only inspector: ``agenthold agents|claims|namespaces|keys|history|log`` and the
message bus's ``threads|messages``.

A person debugging a multi-agent run sees who is registered, what is claimed, what changed and
who changed it, without an MCP client. Decisions behind it:
- Strictly read-only. The database is opened with ``StateStore(path, read_only=True)``: a
  ``mode=ro`` connection with ``query_only``, which never creates a missing file, never migrates
  a schema and refuses files that are not agenthold databases. Claims and agents are read through
  ``Coordinator``, whose reads never write and which reports a claim whose holder's lease ended
  as free ("expired" or "abandoned"), so an expired claim is never shown as claimed.
- Fast to start. At module level only ``argparse``, ``sys`` and two small modules of its own
  are imported: inspect_args.py (the subcommands' parsers, which ``agenthold --help`` builds)
  and tables.py (text for terminals); the store, the claims code and the rest of the standard
  library are imported inside ``run``. Nothing here imports ``mcp``.
- One set of records per command: each command builds the list of dicts that ``--json`` prints
  (documented in docs/inspector.md), and the table for people is drawn from the same dicts.
- ``log --follow`` is woken by the store's change feed (``SQLiteDatabase.subscribe``), which
  notices commits by any process within milliseconds (through file events where the platform
  has them, so following costs no CPU while nothing happens); it also looks once a second on
  its own as a safety net. New rows are found by id (the event tables and message ids are
  append-only).
- The message bus (``threads``, ``messages`` and appends in ``log``) is read through a read-only
  ``MessageBus``; a database whose bus tables were never created simply has no threads.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Sequence

    from agenthold.bus.messagebus import MessageBus
    from agenthold.claims.coordinator import Coordinator
    from agenthold.store import StateStore

from agenthold.inspect.args import (
    COMMANDS,
    DEFAULT_LIMIT,
    UsageError,
    add_subcommands,
    parse_after,
    parse_limit,
)
from agenthold.inspect.tables import (
    DAMAGED,
    GAP,
    MIN_CUT,
    Column,
    age,
    by_whom,
    clean,
    clock,
    compact_json,
    flagged,
    format_row,
    header_lines,
    layout,
    parse_time,
    shown_value,
    span,
    table,
)

__all__ = ["COMMANDS", "DEFAULT_LIMIT", "add_subcommands", "run"]

FALLBACK_COLUMNS = 100  # terminal width assumed when the output is not a terminal
FOLLOW_RECHECK = 1.0  # seconds: `log --follow` looks for new events at least this often


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Run the inspector subcommand ``args.command``; returns the exit status.

    Errors are one line on standard error: 2 for a bad command-line value, 1 for a database
    that cannot be read as asked (missing, not agenthold's, newer schema, unknown name).
    """
    from agenthold.store import AgentholdError

    try:
        limit = parse_limit(getattr(args, "limit", None))
    except UsageError as exc:
        return _error(str(exc), 2)
    _protect_stdout()
    try:
        inspector = Inspector.open(args.db, as_json=getattr(args, "json", False))
        try:
            commands: dict[str, Callable[[argparse.Namespace, int], int]] = {
                "agents": inspector.agents,
                "claims": inspector.claims,
                "namespaces": inspector.namespaces,
                "keys": inspector.keys,
                "history": inspector.history,
                "log": inspector.log,
                "threads": inspector.threads,
                "messages": inspector.messages,
                "status": inspector.status,
            }
            return commands[args.command](args, limit)
        finally:
            inspector.close()
    except UsageError as exc:
        return _error(str(exc), 2)
    except AgentholdError as exc:
        return _error(str(exc), 1)
    except BrokenPipeError:
        # The reader went away (`agenthold log -f | head`): stop quietly. Python would report
        # the failed flush of sys.stdout at exit, so point it at /dev/null first.
        _silence_stdout()
        return 0
    except KeyboardInterrupt:  # pragma: no cover - Ctrl-C during a one-shot read
        return 130


def _error(message: str, status: int) -> int:
    print(f"agenthold: {message}", file=sys.stderr)
    return status


def _protect_stdout() -> None:
    """Make sure any text can be printed: on a terminal that cannot show a character (say an
    ASCII-only one), print an escape instead of failing."""
    out = sys.stdout
    try:
        "…→é".encode(out.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        reconfigure = getattr(out, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # pragma: no cover - stdout is not a file
        pass


# --------------------------------------------------------------------------------------------
# The commands
# --------------------------------------------------------------------------------------------

AGENT_COLUMNS = (
    Column("ID"),
    Column("NAME", cut=2),
    Column("MODEL", cut=2),
    Column("REGISTERED"),
    Column("LAST SEEN"),
    Column("LEASE"),
    Column("CLAIMS", right=True),
)
CLAIM_COLUMNS = (
    Column("RESOURCE", cut=3),
    Column("STATE", cut=1),
    Column("BY", cut=2),
    Column("SINCE"),
)
NAMESPACE_COLUMNS = (
    Column("NAMESPACE", cut=2),
    Column("KEYS", right=True),
    Column("DELETED", right=True),
    Column("LAST CHANGE"),
    Column("BY", cut=2),
)
KEY_COLUMNS = (
    Column("KEY", cut=3),
    Column("VERSION", right=True),
    Column("UPDATED BY", cut=2),
    Column("UPDATED"),
    Column("VALUE", cut=1),
)
HISTORY_COLUMNS = (
    Column("VERSION", right=True),
    Column("EVENT"),
    Column("BY", cut=2),
    Column("WHEN"),
    Column("VALUE", cut=1),
)
LOG_ACTOR_WIDTH = (16, 24)  # the ACTOR column is fixed at start: this wide at least, at most
LOG_WHAT_WIDTH = 36  # a long value gives way first, but a resource keeps this much first
LOG_COLUMNS = (
    Column("TIME (UTC)"),
    Column("ACTOR", cut=2, least=LOG_ACTOR_WIDTH[0]),
    Column("EVENT"),
    Column("VERSION", right=True),
    Column("WHAT", cut=1, least=LOG_WHAT_WIDTH),
)
THREAD_COLUMNS = (
    Column("THREAD"),
    Column("NAME", cut=2),
    Column("CREATED BY", cut=3),
    Column("PARTICIPANTS", cut=1),
    Column("MESSAGES", right=True),
    Column("LAST ACTIVITY"),
)
MESSAGE_COLUMNS = (
    Column("SEQ", right=True),
    Column("SENDER", cut=2),
    Column("SENT"),
    Column("CONTENT", cut=1),
)
EVENT_NAMES = (
    "write",
    "delete",
    "registered",
    "claimed",
    "released",
    "lease_ends",
    "reaped",
    "appended",
)


class Inspector:
    """One open, read-only database and the commands that read it."""

    def __init__(self, store: StateStore, *, as_json: bool) -> None:
        from agenthold.claims.coordinator import Coordinator

        self.store = store
        self.coordinator: Coordinator = Coordinator(store)
        self.as_json = as_json
        self.now = store.db.now()  # the database's clock, by which leases are judged
        # messages and threads are stamped by the writing host's wall clock, not the
        # database's (docs/architecture.md): their ages are judged by this host's
        self.wall_clock = time.time()

    @classmethod
    def open(cls, path: str, *, as_json: bool) -> Inspector:
        from agenthold.store import StateStore

        store = StateStore(path, read_only=True)
        try:
            return cls(store, as_json=as_json)
        except BaseException:  # pragma: no cover - Coordinator only reads settings here
            store.close()
            raise

    def close(self) -> None:
        self.store.close()

    @property
    def bus(self) -> MessageBus:
        """The message bus of the database, read-only (opened on first use)."""
        try:
            return self._bus
        except AttributeError:
            from agenthold.bus.messagebus import MessageBus

            self._bus: MessageBus = MessageBus(self.store)
            return self._bus

    # -- output ----------------------------------------------------------------------------------

    @property
    def columns(self) -> int:
        import shutil

        return shutil.get_terminal_size((FALLBACK_COLUMNS, 24)).columns

    def emit(self, lines: Sequence[str]) -> None:
        out = sys.stdout
        out.write("".join(line + "\n" for line in lines))
        out.flush()

    def show(self, records: list[dict[str, Any]], columns: Sequence[Column], rows: Any) -> int:
        """Print ``records`` as JSON, or the table of ``rows(records)``; exit status 0."""
        if self.as_json:
            import json

            self.emit([json.dumps(records, ensure_ascii=False, indent=2)])
        else:
            width = self.columns
            self.emit(table(columns, [[clean(c, width) for c in r] for r in rows()], width))
        return 0

    # -- checks ----------------------------------------------------------------------------------

    def check_namespace(self, namespace: str) -> None:
        """Raise unless ``namespace`` was ever written (a namespace of deleted keys counts)."""
        from agenthold.store import MAX_NAMESPACE_LENGTH, AgentholdError, check_text

        check_text("namespace", namespace, MAX_NAMESPACE_LENGTH)
        if not self.store.was_written(namespace):
            raise AgentholdError(
                f"no namespace {namespace!r} in {self.store.path}: nothing was ever written "
                "to it ('agenthold namespaces' lists the namespaces)"
            )

    def check_key(self, namespace: str, key: str) -> None:
        """Raise unless ``key`` was ever written in ``namespace`` (deleted keys count)."""
        import shlex

        from agenthold.store import MAX_KEY_LENGTH, AgentholdError, check_text

        self.check_namespace(namespace)
        check_text("key", key, MAX_KEY_LENGTH)
        if not self.store.was_written(namespace, key):
            raise AgentholdError(
                f"no key {key!r} in namespace {namespace!r}: it was never written "
                f"('agenthold keys {shlex.quote(namespace)}' lists its keys)"
            )

    def agent_names(self) -> dict[str, str]:
        return self.coordinator.agent_names()

    # -- agents ----------------------------------------------------------------------------------

    def agents(self, args: argparse.Namespace, limit: int) -> int:
        held: dict[str, int] = {}
        for info in self.coordinator.list_claims():
            assert info.holder is not None
            held[info.holder] = held.get(info.holder, 0) + 1
        records = []
        for agent in self.coordinator.list_agents():
            end = agent.lease_ends_at
            lease_state = "none" if end is None else "active" if end > self.now else "ended"
            records.append(
                {
                    **agent.to_dict(),
                    "lease_state": lease_state,
                    "claims_held": held.get(agent.agent_id, 0),
                }
            )

        def rows() -> list[list[str]]:
            return [
                [
                    r["agent_id"],
                    by_whom(r["name"], r.get("principal")),
                    r["model"] or "-",
                    age(r["registered_at"], self.now),
                    age(r["last_seen_at"], self.now),
                    self.lease_text(r),
                    str(r["claims_held"]),
                ]
                for r in records
            ]

        return self.show(records, AGENT_COLUMNS, rows)

    def lease_text(self, record: dict[str, Any]) -> str:
        """The LEASE cell: "no expiry", "ends in 4m", "ends in 5m (disconnected)" or
        "ended 2s ago (expired)"."""
        if record["lease_state"] == "none":
            return "no expiry"
        end = parse_time(record["lease_ends_at"]) or 0.0
        outcome = record["lease_end_outcome"] or "expired"
        if record["lease_state"] == "active":
            left = f"ends in {span(end - self.now)}"
            return left + " (disconnected)" if outcome == "abandoned" else left
        return f"ended {span(self.now - end)} ago ({outcome})"

    def status(self, args: argparse.Namespace, limit: int) -> int:
        from agenthold.inspect.status import status

        return status(self)

    # -- claims ----------------------------------------------------------------------------------

    def claims(self, args: argparse.Namespace, limit: int) -> int:
        names = self.agent_names()
        records = []
        for info in self.coordinator.list_claims(include_free=args.all):
            record = info.to_dict()
            record["last_holder_name"] = names.get(info.last_holder or "")
            records.append(record)

        def rows() -> list[list[str]]:
            shown = []
            for r in records:
                if r["state"] == "claimed":
                    by, since = r["agent_name"], r["claimed_at"]
                else:
                    by = r["last_holder_name"] or r["last_holder"] or "-"
                    since = r["last_outcome_at"]
                shown.append([r["resource"], claim_state(r), by, age(since, self.now)])
            return shown

        return self.show(records, CLAIM_COLUMNS, rows)

    # -- namespaces, keys, history ---------------------------------------------------------------

    def namespaces(self, args: argparse.Namespace, limit: int) -> int:
        records = self.store.namespace_summaries()

        def rows() -> list[list[str]]:
            return [
                [
                    r["namespace"],
                    str(r["record_count"]),
                    str(r["deleted_count"]),
                    age(r["updated_at"], self.now),
                    r["updated_by"],
                ]
                for r in records
            ]

        return self.show(records, NAMESPACE_COLUMNS, rows)

    def keys(self, args: argparse.Namespace, limit: int) -> int:
        self.check_namespace(ns := args.namespace)
        records = flagged(lambda d: self.store.list_keys(ns, damaged=d), namespace=ns)

        def rows() -> list[list[str]]:
            return [
                [
                    r["key"],
                    str(r["version"]),
                    r["updated_by"],
                    age(r["updated_at"], self.now),
                    shown_value(r),
                ]
                for r in records
            ]

        return self.show(records, KEY_COLUMNS, rows)

    def history(self, args: argparse.Namespace, limit: int) -> int:
        self.check_key(ns := args.namespace, k := args.key)
        records = flagged(lambda d: self.store.history(ns, k, limit, damaged=d), event_type="write")

        def rows() -> list[list[str]]:
            return [
                [
                    str(r["version"]),
                    r["event_type"],
                    by_whom(r["updated_by"], r.get("principal")),
                    age(r["updated_at"], self.now),
                    shown_value(r),
                ]
                for r in records
            ]

        return self.show(records, HISTORY_COLUMNS, rows)

    # -- the message bus -----------------------------------------------------------------------

    def threads(self, args: argparse.Namespace, limit: int) -> int:
        records: list[dict[str, Any]] = []
        for thread in self.bus.find_threads():
            info = self.bus.get_thread_info(thread.id)
            if info is None:  # pragma: no cover - deleted between the two reads
                continue
            records.append(
                {
                    "thread_id": info.thread_id,
                    "name": info.name,
                    "created_by": info.created_by,
                    "participants": [a.name for a in info.participants],
                    "message_count": info.message_count,
                    "last_seq": info.last_seq,
                    "created_at": info.created_at,
                    "last_activity_at": info.latest_activity_at,
                }
            )

        def rows() -> list[list[str]]:
            return [
                [
                    r["thread_id"],
                    r["name"] or "-",
                    r["created_by"] or "-",
                    ", ".join(r["participants"]) or "-",
                    str(r["message_count"]),
                    age(r["last_activity_at"], self.wall_clock),
                ]
                for r in records
            ]

        return self.show(records, THREAD_COLUMNS, rows)

    def messages(self, args: argparse.Namespace, limit: int) -> int:
        from agenthold.bus.messagebus import MAX_POLL_LIMIT, UnknownThreadError
        from agenthold.store import AgentholdError, InvalidInputError

        after = parse_after(args.after)
        try:
            thread = self.bus.get_thread(args.thread_id)
        except InvalidInputError as exc:
            raise UsageError(f"THREAD_ID: {exc}") from None
        if thread is None:
            raise AgentholdError(
                f"no thread {args.thread_id!r} in {self.store.path} ('agenthold threads' lists "
                "the threads)"
            )
        records: list[dict[str, Any]] = []
        while len(records) < limit:
            try:
                page = self.bus.poll(thread.id, after, limit=min(MAX_POLL_LIMIT, limit))
            except UnknownThreadError:  # pragma: no cover - deleted while being read
                break
            records.extend(m.to_dict() for m in page[: limit - len(records)])
            after = page.next_after_seq
            if not page.more:
                break

        def rows() -> list[list[str]]:
            return [
                [
                    str(r["seq"]),
                    by_whom(r["sender"], r.get("principal")),
                    age(r["created_at"], self.wall_clock),
                    r["content"],
                ]
                for r in records
            ]

        return self.show(records, MESSAGE_COLUMNS, rows)

    # -- log ---------------------------------------------------------------------------------

    def log(self, args: argparse.Namespace, limit: int) -> int:
        namespace: str | None = args.namespace
        if args.follow:
            return self.follow(namespace, limit)  # the namespace may be written later
        if namespace is not None:
            self.check_namespace(namespace)
        with self.store.db.snapshot() as conn:
            events, _ = self.latest_events(conn, namespace, limit)
        return self.show(events, LOG_COLUMNS, lambda: [self.log_row(e) for e in events])

    def latest_events(
        self, conn: Any, namespace: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], list[Any]]:
        """The last ``limit`` events recorded, in time order, and the positions to follow from.

        Rows are picked newest id first (the primary key, so a large history is not sorted):
        ids follow the commits, which follow time, except that a release recorded for a lapsed
        lease carries the earlier time the lease ended; it is shown at that time."""
        state, state_at = self.store.read_log(conn, namespace, limit=limit)
        claims, claims_at = self.coordinator.read_log(conn, limit=limit)
        appends, appends_at = self.bus.read_log(conn, limit=limit)
        if namespace is not None:
            claims, appends = [], []
        names = self.coordinator.agent_names(conn)
        events = self.events(state, claims, names, appends)
        return events[-limit:], [state_at, claims_at, appends_at]

    def events(
        self,
        state: Sequence[Any],
        claims: Sequence[Any],
        names: dict[str, str],
        appends: Sequence[Any] = (),
    ) -> list[dict[str, Any]]:
        """State-history, claim-event and message rows as log records, in time order."""
        from agenthold.store import decode_value

        keyed: list[tuple[tuple[str, int, int], dict[str, Any]]] = []
        for row_id, ns, key, version, value, by, at, event, principal in state:
            record = {
                "at": at,
                "event": event,
                "actor": by,
                "principal": principal,
                "agent_id": None,
                "namespace": ns,
                "key": key,
                "resource": None,
                "version": version,
                "value": decode_value(value, damaged=DAMAGED),
                "outcome": None,
                "moved_to": None,
                "thread_id": None,
            }
            keyed.append(((at, 0, row_id), record))
        for row_id, at, agent_id, event, uri, outcome, moved_to, version, principal in claims:
            record = {
                "at": at,
                "event": event,
                "actor": names.get(agent_id, agent_id),
                "principal": principal,
                "agent_id": agent_id,
                "namespace": None,
                "key": None,
                "resource": uri,
                "version": version,
                "value": None,
                "outcome": outcome,
                "moved_to": moved_to,
                "thread_id": None,
            }
            keyed.append(((at, 1, row_id), record))
        for row_id, thread_id, seq, sender_id, sender, content, at, principal in appends:
            record = {
                "at": at,
                "event": "appended",
                "actor": sender,
                "principal": principal,
                "agent_id": sender_id,
                "namespace": None,
                "key": None,
                "resource": None,
                "version": seq,
                "value": content,
                "outcome": None,
                "moved_to": None,
                "thread_id": thread_id,
            }
            keyed.append(((at, 2, row_id), record))
        keyed.sort(key=lambda pair: pair[0])
        return [record for _, record in keyed]

    def log_row(self, e: dict[str, Any]) -> list[str]:
        """TIME, ACTOR, EVENT, VERSION and WHAT of one event."""
        event = e["event"]
        if e["namespace"] is not None:
            what = f"{e['namespace']}/{e['key']}"
            if event == "write":
                what += " = " + compact_json(e["value"])
        elif event == "claimed":
            what = e["resource"]
        elif event == "released":
            detail = e["outcome"]
            if detail == "moved":
                detail = f"moved → {e['moved_to']}"
            what = f"{e['resource']} ({detail})"
        elif event == "registered":
            what = f"as {e['agent_id']}"
        elif event == "lease_ends":
            what = f"its claims end as {e['outcome']} unless it acts again"
        elif event == "reaped":
            what = f"{e['agent_id']} removed after a long idle time"
        elif event == "appended":
            what = f"thread {e['thread_id'][:8]}: {e['value']}"
        else:  # an event this version does not know
            what = e["resource"] or ""
        version = "-" if e["version"] is None else str(e["version"])
        return [clock(e["at"]), by_whom(e["actor"], e["principal"]), event, version, what]

    def follow(self, namespace: str | None, limit: int) -> int:
        """Print the last ``limit`` events, then every new event as it is committed, until
        SIGINT or SIGTERM (exit status 0: cli.py makes SIGTERM raise KeyboardInterrupt as
        SIGINT does). One line per event, flushed at once; with --json, one JSON object per
        line (JSON Lines)."""
        import threading

        woken = threading.Event()
        try:
            # Subscribed first, then one snapshot for the last events and the cursors, so no
            # commit falls between what is printed now and what is printed next.
            with self.store.db.subscribe(None, woken.set):
                with self.store.db.snapshot() as conn:
                    events, cursors = self.latest_events(conn, namespace, limit)
                show = self.follow_printer(events)
                show(events)
                self.follow_loop(namespace, cursors, woken, show)
        except KeyboardInterrupt:
            return 0
        raise AssertionError("unreachable")  # pragma: no cover

    def follow_printer(self, first: list[dict[str, Any]]) -> Callable[[list[dict[str, Any]]], None]:
        """Print the table header (column widths fixed by ``first`` and the terminal) and
        return the function that prints a batch of events, one flushed line each."""
        import json

        width = self.columns
        if self.as_json:

            def show_json(batch: list[dict[str, Any]]) -> None:
                self.emit([json.dumps(e, ensure_ascii=False) for e in batch])

            return show_json
        rows = [[clean(c, width) for c in self.log_row(e)] for e in first]
        widths = layout(LOG_COLUMNS, rows, width)
        low, high = LOG_ACTOR_WIDTH
        widths[1] = min(max(widths[1], low), high)
        widths[2] = max(widths[2], max(map(len, EVENT_NAMES)))
        widths[4] = max(MIN_CUT, width - sum(widths[:4]) - len(GAP) * 4)
        self.emit(header_lines(LOG_COLUMNS, widths))

        def show_table(batch: list[dict[str, Any]]) -> None:
            for e in batch:
                cells = [clean(c, width) for c in self.log_row(e)]
                self.emit([format_row(LOG_COLUMNS, widths, cells)])

        return show_table

    def follow_loop(
        self,
        namespace: str | None,
        cursors: list[Any],
        woken: threading.Event,
        show: Callable[[list[dict[str, Any]]], None],
    ) -> None:
        """Wait for commits and print the events after ``cursors`` (positions), forever."""
        names = self.agent_names()
        while True:
            woken.wait(FOLLOW_RECHECK)
            woken.clear()
            with self.store.db.snapshot() as conn:
                state, cursors[0] = self.store.read_log(conn, namespace, after=cursors[0])
                claims, cursors[1] = self.coordinator.read_log(conn, after=cursors[1])
                appends, cursors[2] = self.bus.read_log(conn, after=cursors[2])
            if namespace is not None:
                claims, appends = [], []
            if claims and any(row[2] not in names for row in claims):
                names = self.agent_names()
            if state or claims or appends:
                show(self.events(state, claims, names, appends))


def claim_state(record: dict[str, Any]) -> str:
    """A claim's state in words: "claimed", "free", "free (modified)", "free (moved → URI)",
    "expired" or "abandoned" (the holder's lease ended while it held the claim)."""
    if record["state"] == "claimed":
        return "claimed"
    outcome = record["last_outcome"]
    if outcome in (None, "released"):
        return "free"
    if outcome in ("expired", "abandoned"):
        return str(outcome)
    if outcome == "moved":
        return f"free (moved → {record['moved_to']})"
    return f"free ({outcome})"
