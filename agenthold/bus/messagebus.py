"""The message bus: named agents, threads of participants, ordered messages and read cursors.

It absorbs the AgentMsgs design (``App`` and its methods, under the same names and meanings) into
agenthold's database, beside the state store and claims. Decisions behind it:
- Its own tables (``msg_*``, in bus/schema.py) with their own schema version, kept per
  component in the ``agenthold_components`` table of the shared database, so the bus migrates
  on its own schedule.
- A thread row carries its message counter (``last_seq``). An append bumps the counter and inserts
  the message in one write transaction, so sequences start at 1, have no gaps, are never reused
  and commit in order: a reader polling after N never misses a later commit below N. The counter
  row (not ``max(seq) + 1``) is also what a PostgreSQL backend locks.
- Unread checks read two integers (the counter and the cursor), and a thread's message count is
  its counter (no message is deleted alone), so both cost the same on a thread of a million
  messages as on an empty one.
- ``wait`` is pushed by the store's change feed (topic ``("m", thread_id)``), never polled.
- One name is one agent. Bus agents have unique names and UUIDs; a claims agent id
  (``agent-…``) given where the bus wants an agent stands for the bus agent of the same name, so
  an agent that claims and messages keeps one identity. A bus name may not look like such an id.
  The agent registry (agenthold.identity.agents) owns both agent tables, that join and who owns
  an agent; the bus knows claims only through it.
- An agent belongs to a caller (``principal``: who a token says called; None is a trusted
  caller, never refused): the one that created it, or, for an agent only named as a participant
  of someone's thread, the first caller that acts as it (sends, marks read, joins, leaves,
  deletes, or gets it by name). Acting as another caller's agent is ForeignBusAgentError and
  changes nothing; reading a cursor counts as acting, without adopting.
- Deleting is explicit: ``delete_agent`` removes the agent, its memberships and cursors, and keeps
  the messages it sent (with its name); ``delete_thread`` removes the thread with its messages and
  cursors.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from typing import Any, Literal

from agenthold.bus.records import (
    DEFAULT_POLL_LIMIT,
    MAX_AGENT_NAME,
    MAX_POLL_LIMIT,
    AgentRef,
    BusAgent,
    ForeignBusAgentError,
    Message,
    MessagePage,
    NameTakenError,
    NotParticipantError,
    ReadState,
    Thread,
    ThreadInfo,
    ThreadRef,
    TooFewParticipantsError,
    UnknownThreadError,
    agent_of,
    check_content,
    check_limit,
    check_name,
    check_thread_name,
    message_of,
    past_the_end,
    thread_id_of,
    unknown_agent,
    unknown_thread,
)
from agenthold.bus.schema import (
    BUMP,
    CURSOR,
    DELETION_CHANGES,
    FIRST_KEPT,
    FROM_OTHERS,
    INSERT,
    IS_MEMBER,
    LOG_COLUMNS,
    MEMBERS,
    MESSAGE_CHANGES,
    MESSAGES_SCHEMA,
    POLL,
    POLL_SIZES,
    SCHEMA_VERSION,
    THREAD,
    THREAD_INFO,
    thread_topic,
)
from agenthold.identity.agents import (
    BUS_AGENT_BY_ID,
    BUS_AGENT_BY_NAME,
    BUS_AGENTS,
    BUS_OWNER,
    DELETE_BUS_AGENT,
    adopt_bus_agent,
    bus_agent_query,
    check_owner,
    create_bus_agent,
    ensure_bus_agent,
    is_claims_id,
    own_bus_agent,
    registered_name,
)
from agenthold.store import (
    DEFAULT_MAX_VALUE_BYTES,
    MAX_PAGE_BYTES,
    MAX_SQL_INT,
    MAX_WAIT_SECONDS,
    AgentholdError,
    InvalidInputError,
    StateStore,
    Topic,
    check_int,
    check_seconds,
    check_text,
    page_end,
    read_events,
    sizes_sql,
    utc_iso,
    wait_until,
)

__all__ = [  # the records and errors are defined in message_types and belong here too
    "DEFAULT_POLL_LIMIT",
    "MAX_AGENT_NAME",
    "MAX_POLL_LIMIT",
    "SCHEMA_VERSION",
    "BusAgent",
    "ForeignBusAgentError",
    "Message",
    "MessageBus",
    "MessagePage",
    "NameTakenError",
    "NotParticipantError",
    "ReadState",
    "Thread",
    "ThreadInfo",
    "TooFewParticipantsError",
    "UnknownThreadError",
]

# --------------------------------------------------------------------------------------------
# The bus
# --------------------------------------------------------------------------------------------


KEPT_DELETIONS = 1000  # rows of msg_deletions kept; a feed reads the newest in milliseconds


class MessageBus:
    """Agents, threads, ordered messages and read cursors, safe across threads and processes.

    ``store`` is a file path, ``":memory:"``, a ``postgresql://`` URL, or an open StateStore
    whose database the bus shares (as the server does; closing it is then left to its owner).
    ``read_only``, ``durability`` and ``busy_timeout`` mean what they mean for StateStore.
    ``max_content_bytes`` caps one message's UTF-8 size (default: the store's value limit).
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | StateStore,
        *,
        read_only: bool = False,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout: float = 5.0,
        max_content_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self.max_content_bytes = check_int("max_content_bytes", max_content_bytes, minimum=1)
        if isinstance(store, StateStore):
            self._store, self._owns_store = store, False
        else:
            self._store = StateStore(
                store, read_only=read_only, durability=durability, busy_timeout=busy_timeout
            )
            self._owns_store = True
        self.db = self._store.db
        try:
            # False when a read-only open finds no bus tables: every read then finds nothing
            self._ready = self.db.ensure(MESSAGES_SCHEMA, required=False) > 0
        except BaseException:
            if self._owns_store:
                self._store.close()
            raise
        if self._ready:
            self.db.add_change_source(MESSAGE_CHANGES)
            self.db.add_change_source(DELETION_CHANGES)

    @property
    def path(self) -> str:
        return self._store.path

    @property
    def has_tables(self) -> bool:
        """False for a read-only bus on a file whose bus tables were never created."""
        return self._ready

    @property
    def read_only(self) -> bool:
        return self._store.read_only

    def close(self) -> None:
        """Close the database (unless it belongs to a StateStore given to the constructor)."""
        if self._owns_store:
            self._store.close()

    def __enter__(self) -> MessageBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MessageBus({self.path!r}, read_only={self.read_only})"

    # -- agents --------------------------------------------------------------------------------

    def get_or_create_agent(self, name: str, *, principal: str | None = None) -> BusAgent:
        """The agent called ``name``, created if there is none (a claims agent id stands for
        its registered name). It belongs to ``principal`` (the caller, as a token names it;
        None: a trusted caller): the one that created it, or the first to act as an agent
        that was only named as a participant; ForeignBusAgentError if it is another's."""
        name = self._name(name, principal)
        row = self._fetchone(BUS_AGENT_BY_NAME, (name,))
        if row is not None:
            owner = self._fetchone(BUS_OWNER, (row[0],))
            if owner is not None and not owner[1] and (principal is None or owner[0] == principal):
                return agent_of(row)
        with self.db.write() as (conn, _):
            ensure_bus_agent(conn, name, principal)
            found = self._resolve(conn, name)
            if principal is None:  # a trusted caller's agent: adopted, never refused
                adopt_bus_agent(conn, found.id, None)
            else:
                own_bus_agent(conn, found, principal, adopt=True)
            return found

    def create_agent(self, name: str, *, principal: str | None = None) -> BusAgent:
        """A new agent called ``name``, belonging to ``principal``; NameTakenError if another
        agent has the name."""
        name = self._name(name, principal)
        agent = BusAgent(str(uuid.uuid4()), name)
        with self.db.write() as (conn, _):
            if not create_bus_agent(conn, agent.id, name, principal):
                raise NameTakenError(
                    f"agent name taken: {name!r} already names an agent; use "
                    "get_or_create_agent to reuse it, or pick another name"
                )
        return agent

    def get_agent(self, agent: AgentRef) -> BusAgent | None:
        """The agent with this name, UUID or record, or None if there is none."""
        if isinstance(agent, BusAgent):
            row = self._fetchone(BUS_AGENT_BY_ID, (agent.id,))
        else:
            name = check_text("agent", agent, MAX_AGENT_NAME)
            row = self._fetchone(*bus_agent_query(name))
        return None if row is None else agent_of(row)

    def list_agents(self) -> list[BusAgent]:
        """Every agent, by name."""
        rows = self._fetchall(BUS_AGENTS)
        return [agent_of(r) for r in rows]

    def delete_agent(self, agent: AgentRef, *, principal: str | None = None) -> BusAgent:
        """Delete an agent: it leaves every thread and its cursors go; the messages it sent stay,
        with its name. Its name is free again (a new agent of that name gets a new UUID).
        Returns the deleted agent; UnknownAgentError if there is none, ForeignBusAgentError if
        it belongs to another caller than ``principal``."""
        with self.db.write() as (conn, _):
            found = self._act_as(conn, agent, principal)
            conn.execute("DELETE FROM msg_participants WHERE agent_id = ?", (found.id,))
            conn.execute(DELETE_BUS_AGENT, (found.id,))
        return found

    # -- threads -------------------------------------------------------------------------------

    def create_thread(
        self, *agents: AgentRef, name: str | None = None, principal: str | None = None
    ) -> Thread:
        """A new thread of at least two distinct existing agents (records, names or ids).
        ``name``, if given, is unique among threads (NameTakenError otherwise); thread scopes
        match it. ``principal`` is recorded as the thread's creator."""
        return self._create_thread(agents, create=False, name=name, principal=principal)

    def create_thread_by_names(
        self, names: Iterable[str], *, name: str | None = None, principal: str | None = None
    ) -> Thread:
        """A new thread of the agents with these names, creating those that do not exist (in
        the same transaction), as the spec's MCP tool does. Agents made here belong to nobody
        until a caller first acts as them (naming someone is not acting as it)."""
        if isinstance(names, str) or not isinstance(names, Iterable):
            raise InvalidInputError("participant names must be a list of agent names")
        return self._create_thread(tuple(names), create=True, name=name, principal=principal)

    def _create_thread(
        self,
        agents: tuple[AgentRef, ...],
        *,
        create: bool,
        name: str | None,
        principal: str | None,
    ) -> Thread:
        name = check_thread_name(name)
        if create:
            agents = tuple(self._name(n) for n in agents)
        with self.db.write() as (conn, _):
            if create:
                for each in dict.fromkeys(agents):
                    ensure_bus_agent(conn, each, None, adoptable=True)  # type: ignore[arg-type]
            members = self._members(conn, agents)
            if name is not None:
                self.db.serialize(conn, [f"msg-thread-name:{name}"])  # racing creators queue
                if conn.execute("SELECT 1 FROM msg_threads WHERE name = ?", (name,)).fetchone():
                    raise NameTakenError(
                        f"thread name taken: {name!r} already names a thread; pick another name"
                    )
            thread_id = str(uuid.uuid4())
            now = utc_iso()
            conn.execute(
                "INSERT INTO msg_threads (thread_id, created_at, name, principal) "
                "VALUES (?, ?, ?, ?)",
                (thread_id, now, name, principal),
            )
            conn.executemany(
                "INSERT INTO msg_participants (thread_id, agent_id, joined_at) VALUES (?, ?, ?)",
                [(thread_id, a.id, now) for a in members],
            )
        return Thread(thread_id, members, now, name)

    def get_thread(self, thread_id: ThreadRef) -> Thread | None:
        """The thread with this id, or None."""
        tid = thread_id_of(thread_id)
        if not self._ready:
            return None
        with self.db.snapshot() as conn:
            row = conn.execute(THREAD, (tid,)).fetchone()
            if row is None:
                return None
            members = tuple(agent_of(r) for r in conn.execute(MEMBERS, (tid,)))
        return Thread(tid, members, row[0], row[3])

    def find_threads(self, *agents: AgentRef) -> list[Thread]:
        """Threads that have every one of ``agents`` as a participant (all threads if none are
        given), oldest first. An agent that does not exist is in no thread."""
        if not self._ready:
            return []
        with self.db.snapshot() as conn:
            ids: list[str] = []
            for ref in agents:
                found = self._lookup(conn, ref)
                if found is None:
                    return []
                ids.append(found.id)
            sql = "SELECT thread_id, created_at, name FROM msg_threads AS t"
            for n, _ in enumerate(ids):
                sql += (
                    f" {'WHERE' if n == 0 else 'AND'} EXISTS (SELECT 1 FROM msg_participants AS p "
                    "WHERE p.thread_id = t.thread_id AND p.agent_id = ?)"
                )
            rows = conn.execute(sql + " ORDER BY created_at, thread_id", ids).fetchall()
            return [
                Thread(tid, tuple(agent_of(r) for r in conn.execute(MEMBERS, (tid,))), at, name)
                for tid, at, name in rows
            ]

    def join_thread(
        self,
        thread_id: ThreadRef,
        agent: AgentRef,
        *,
        principal: str | None = None,
        create: bool = False,
    ) -> Thread:
        """Add ``agent`` to the thread (nothing changes if it is in already); its cursor starts
        at 0, so the thread's earlier messages are unread for it. ``create``: an agent given by
        name is created if there is none (as get_or_create_agent would), in the same
        transaction, so a join that fails leaves no new agent behind."""
        tid = thread_id_of(thread_id)
        name = self._name(agent, principal) if create and isinstance(agent, str) else None
        with self.db.write() as (conn, _):
            self._thread_row(conn, tid)
            if name is not None:
                ensure_bus_agent(conn, name, principal)
                if principal is None:  # a trusted caller's agent: adopted, never refused
                    adopt_bus_agent(conn, self._resolve(conn, name).id, None)
            found = self._act_as(conn, agent if name is None else name, principal)
            conn.execute(
                "INSERT INTO msg_participants (thread_id, agent_id, joined_at) VALUES (?, ?, ?) "
                "ON CONFLICT (thread_id, agent_id) DO NOTHING",
                (tid, found.id, utc_iso()),
            )
        thread = self.get_thread(tid)
        assert thread is not None
        return thread

    def leave_thread(
        self, thread_id: ThreadRef, agent: AgentRef, *, principal: str | None = None
    ) -> Thread:
        """Remove ``agent`` from the thread, with its cursor (rejoining starts at 0). The
        thread and its messages stay, even with fewer than two participants left.
        NotParticipantError if the agent was not in it."""
        tid = thread_id_of(thread_id)
        with self.db.write() as (conn, _):
            found = self._act_as(conn, agent, principal)
            self._thread_row(conn, tid)
            gone = conn.execute(
                "DELETE FROM msg_participants WHERE thread_id = ? AND agent_id = ?",
                (tid, found.id),
            ).rowcount
            if not gone:
                raise self._not_participant(found, tid)
        thread = self.get_thread(tid)
        assert thread is not None
        return thread

    def delete_thread(self, thread_id: ThreadRef) -> None:
        """Delete the thread with its messages and every cursor; UnknownThreadError if none."""
        tid = thread_id_of(thread_id)
        with self.db.write() as (conn, changed):
            self._thread_row(conn, tid)
            conn.execute("DELETE FROM msg_messages WHERE thread_id = ?", (tid,))
            conn.execute("DELETE FROM msg_participants WHERE thread_id = ?", (tid,))
            conn.execute("DELETE FROM msg_threads WHERE thread_id = ?", (tid,))
            # waiters learn that it is gone: here at once, in other processes from this row
            conn.execute(
                "INSERT INTO msg_deletions (thread_id, deleted_at) VALUES (?, ?)", (tid, utc_iso())
            )
            # only the newest rows are ever read (by feeds that were listening): keep a few
            conn.execute(
                "DELETE FROM msg_deletions WHERE id <= (SELECT max(id) FROM msg_deletions) - ?",
                (KEPT_DELETIONS,),
            )
            changed.append(thread_topic(tid))

    # -- messages ------------------------------------------------------------------------------

    def append(
        self, thread_id: ThreadRef, sender: AgentRef, content: str, *, principal: str | None = None
    ) -> Message:
        """Append a message from ``sender``, a participant; returns it with its sequence.
        ``principal`` (the caller) must own the sender, and is recorded with the message."""
        tid = thread_id_of(thread_id)
        check_content(content, self.max_content_bytes)
        with self.db.write() as (conn, changed):
            found = self._act_as(conn, sender, principal, member=True)
            now = utc_iso()
            # The counter first: its row lock (PostgreSQL) orders the thread's appends. A call
            # that fails below rolls the bump back, so no sequence is lost.
            bumped = conn.execute(BUMP, (now, tid)).fetchone()
            if bumped is None:
                raise unknown_thread(tid)
            if conn.execute(IS_MEMBER, (tid, found.id)).fetchone() is None:
                raise self._not_participant(found, tid, sending=True)
            seq = bumped[0]
            conn.execute(INSERT, (tid, seq, found.id, found.name, content, now, principal))
            changed.append(thread_topic(tid))
        return Message(tid, seq, found, content, now, principal)

    def poll(
        self,
        thread_id: ThreadRef,
        after_seq: int = 0,
        *,
        limit: int = DEFAULT_POLL_LIMIT,
        max_bytes: int = MAX_PAGE_BYTES,
    ) -> MessagePage:
        """Up to ``limit`` (at most MAX_POLL_LIMIT) messages after ``after_seq``, in order,
        and past the first no more than about ``max_bytes`` of content (4 MiB by default);
        ``more`` on the result says whether more remain. UnknownThreadError if no thread."""
        tid = thread_id_of(thread_id)
        check_int("after_seq", after_seq, maximum=MAX_SQL_INT)
        limit = check_limit(limit)
        check_int("max_bytes", max_bytes, minimum=1)
        if not self._ready:
            raise unknown_thread(tid)
        page = self._page(tid, after_seq, limit, max_bytes)
        if page is None:
            raise unknown_thread(tid)
        return page

    def wait(
        self,
        thread_id: ThreadRef,
        *,
        after_seq: int,
        timeout: float,
        limit: int = DEFAULT_POLL_LIMIT,
        max_bytes: int = MAX_PAGE_BYTES,
    ) -> MessagePage:
        """Wait until the thread has a message after ``after_seq`` and return the page a poll
        would (``limit`` and ``max_bytes`` as there), or an empty page after ``timeout``
        seconds. Returns at once if there is one.
        Woken by commits (this process at once, another within milliseconds), not by polling
        the thread. UnknownThreadError if the thread does not exist (or is deleted meanwhile,
        in this process); InvalidInputError at once for an ``after_seq`` past its last seq."""
        tid = thread_id_of(thread_id)
        check_int("after_seq", after_seq, maximum=MAX_SQL_INT)
        seconds = check_seconds("timeout", timeout, maximum=MAX_WAIT_SECONDS)
        limit = check_limit(limit)
        check_int("max_bytes", max_bytes, minimum=1)
        if (row := self._fetchone(THREAD_INFO, (tid,))) is None:
            raise unknown_thread(tid)
        if after_seq > row[1]:  # no message would ever come next: refused, as mark_read does
            raise past_the_end(tid, after_seq, row[1])
        topics = (thread_topic(tid),)

        def look() -> tuple[MessagePage | None, Iterable[Topic], None]:
            page = self._page(tid, after_seq, limit, max_bytes)
            if page is None:
                raise unknown_thread(tid)
            return (page or None), topics, None

        found: MessagePage | None = wait_until(self.db, look, seconds, topics)
        return found if found is not None else MessagePage((), False, after_seq)

    def read_log(
        self, conn: Any, *, sender: str | None = None, **window: Any
    ) -> tuple[list[Any], Any]:
        """Appended messages ``(id, thread_id, seq, sender_id, sender_name, content, created_at,
        principal)`` in the snapshot ``conn``, oldest first: the last ``limit`` (``after`` None;
        below id ``before``, if given), or those committed after ``after``; and the position to
        follow from (``window``: after, limit, before). ``sender`` (a name) keeps its own."""
        if not self._ready:
            return [], window.get("after")
        where, params = ("sender_name = ?", (sender,)) if sender is not None else ("", ())
        return read_events(
            self.db, conn, "msg_messages", LOG_COLUMNS, **window, where=where, params=params
        )

    def mark_read(
        self, thread_id: ThreadRef, agent: AgentRef, seq: int, *, principal: str | None = None
    ) -> ReadState:
        """Move ``agent``'s cursor forward to ``seq`` and return its read state. A ``seq`` at or
        behind the cursor changes nothing (marking again is harmless); one past the thread's
        last message is an error, as is an agent that is not a participant."""
        tid = thread_id_of(thread_id)
        check_int("seq", seq)
        with self.db.write() as (conn, _):
            found = self._act_as(conn, agent, principal, member=True)
            last_seq, cursor = self._cursor(conn, tid, found)
            if seq > last_seq:
                error = InvalidInputError(
                    f"cannot mark seq {seq} read: thread {tid!r} ends at seq {last_seq}; mark "
                    "the seq of the last message you processed"
                )
                error.hint = f"Mark a seq from 0 to {last_seq}: the last one you processed."
                raise error
            if seq > cursor:
                conn.execute(  # forward only, also against a concurrent mark
                    "UPDATE msg_participants SET read_seq = ? "
                    "WHERE thread_id = ? AND agent_id = ? AND read_seq < ?",
                    (seq, tid, found.id, seq),
                )
                cursor = seq
            return self._state(conn, tid, found, last_seq, cursor)

    def has_unread(
        self, thread_id: ThreadRef, agent: AgentRef, *, principal: str | None = None
    ) -> bool:
        """Whether the thread has messages after ``agent``'s cursor (its own included)."""
        tid = thread_id_of(thread_id)
        if isinstance(agent, BusAgent) and principal is None:  # one statement, no transaction
            row = self.db.fetchone(CURSOR, (agent.id, tid)) if self._ready else None
            last_seq, cursor = self._checked_cursor(row, tid, agent)
        else:
            with self.db.snapshot() as conn:
                found = self._reader(conn, agent, principal)
                last_seq, cursor = self._cursor(conn, tid, found)
        return last_seq > cursor

    def get_thread_info(self, thread_id: ThreadRef) -> ThreadInfo | None:
        """Participants, message count and latest message of the thread, read in one
        snapshot; None if there is no such thread."""
        tid = thread_id_of(thread_id)
        if not self._ready:
            return None
        with self.db.snapshot() as conn:
            row = conn.execute(THREAD_INFO, (tid,)).fetchone()
            if row is None:
                return None
            created, last_seq, last_at, name, creator = row
            members = tuple(agent_of(r) for r in conn.execute(MEMBERS, (tid,)))
            latest = (
                conn.execute(POLL, (tid, last_seq - 1, last_seq)).fetchone() if last_seq else None
            )
        message = None if latest is None else message_of(tid, latest)
        # the count is the counter: seqs start at 1 without gaps and a message is only ever
        # deleted with its whole thread, so no count(*) over a thread of a million messages
        return ThreadInfo(
            tid, members, created, last_seq, last_seq, message, last_at or created, name, creator
        )

    def get_thread_read_state(
        self, thread_id: ThreadRef, agent: AgentRef, *, principal: str | None = None
    ) -> ReadState | None:
        """``agent``'s cursor and unread counts in the thread, read in one snapshot; None if
        there is no such thread. NotParticipantError if the agent is not in it."""
        tid = thread_id_of(thread_id)
        if not self._ready:
            return None
        with self.db.snapshot() as conn:
            if conn.execute(THREAD, (tid,)).fetchone() is None:
                return None
            found = self._reader(conn, agent, principal)
            last_seq, cursor = self._cursor(conn, tid, found)
            return self._state(conn, tid, found, last_seq, cursor)

    # -- helpers -------------------------------------------------------------------------------

    def _fetchone(self, sql: str, params: tuple[Any, ...]) -> Any:
        return self.db.fetchone(sql, params) if self._ready else None

    def _fetchall(self, sql: str) -> list[Any]:
        return self.db.fetchall(sql) if self._ready else []

    def _name(self, name: object, principal: str | None = None) -> str:
        """A new or looked-up agent name; a claims agent id becomes its registered name (and,
        for a ``principal``, must be one it registered)."""
        if is_claims_id(name):
            assert isinstance(name, str)
            registered = registered_name(self.db.fetchone, name, principal)
            if registered is None:
                raise unknown_agent(f"{name!r} (no claims agent has this id)")
            return check_name(registered)
        return check_name(name)

    def _act_as(
        self, conn: Any, ref: AgentRef, principal: str | None, *, member: bool = False
    ) -> BusAgent:
        """The agent a call acts as (sends as, moves the cursor of, joins, leaves or deletes).
        A principal acts only as its own agents: one it made, or one that was only ever named
        as a participant, which it adopts now; another's is ForeignBusAgentError (a claims
        agent_id another caller registered: ForeignAgentError). None: a trusted caller.
        ``member``: the call then checks membership, which proves that a record still exists."""
        if principal is None:
            return self._member_ref(conn, ref) if member else self._resolve(conn, ref)
        found = self._reader(conn, ref, principal)
        own_bus_agent(conn, found, principal, adopt=True)
        return found

    def _reader(self, conn: Any, ref: AgentRef, principal: str | None) -> BusAgent:
        """The agent whose cursor a call reads: for a principal, its own or an unowned one."""
        if principal is not None and is_claims_id(ref):
            assert isinstance(ref, str)
            check_owner(conn, ref, principal)  # the claims agent's owner, before its bus agent's
        found = self._resolve(conn, ref)
        if principal is not None:
            own_bus_agent(conn, found, principal, adopt=False)
        return found

    def _lookup(self, conn: Any, ref: AgentRef) -> BusAgent | None:
        if isinstance(ref, BusAgent):
            row = conn.execute(BUS_AGENT_BY_ID, (ref.id,)).fetchone()
        else:
            name = check_text("agent", ref, MAX_AGENT_NAME)
            row = conn.execute(*bus_agent_query(name)).fetchone()
        return None if row is None else agent_of(row)

    def _member_ref(self, conn: Any, ref: AgentRef) -> BusAgent:
        """The agent for a call that then checks membership: a record is taken as it is (its
        membership row proves it still exists; ids and names never change)."""
        return ref if isinstance(ref, BusAgent) else self._resolve(conn, ref)

    def _resolve(self, conn: Any, ref: AgentRef) -> BusAgent:
        found = self._lookup(conn, ref)
        if found is None:
            shown = repr(ref.name) if isinstance(ref, BusAgent) else repr(ref)
            raise unknown_agent(shown)
        return found

    def _members(self, conn: Any, refs: tuple[AgentRef, ...]) -> tuple[BusAgent, ...]:
        members: dict[str, BusAgent] = {}
        for ref in refs:
            found = self._resolve(conn, ref)
            members.setdefault(found.id, found)
        if len(members) < 2:
            raise TooFewParticipantsError(
                f"need >=2 participants: a thread needs at least two different agents, got "
                f"{len(members)}"
            )
        return tuple(members.values())

    def _thread_row(self, conn: Any, tid: str) -> Any:
        row = conn.execute(THREAD, (tid,)).fetchone()
        if row is None:
            raise unknown_thread(tid)
        return row

    def _cursor(self, conn: Any, tid: str, agent: BusAgent) -> tuple[int, int]:
        return self._checked_cursor(conn.execute(CURSOR, (agent.id, tid)).fetchone(), tid, agent)

    def _checked_cursor(self, row: Any, tid: str, agent: BusAgent) -> tuple[int, int]:
        if row is None:
            raise unknown_thread(tid)
        if row[1] is None:
            raise self._not_participant(agent, tid)
        return int(row[0]), int(row[1])

    def _state(self, conn: Any, tid: str, agent: BusAgent, last_seq: int, cursor: int) -> ReadState:
        others = (
            conn.execute(FROM_OTHERS, (tid, cursor, agent.id)).fetchone()[0]
            if last_seq > cursor
            else 0
        )
        unread = last_seq - cursor
        if unread:  # what is left: retention (retention.py) may have trimmed the oldest
            first = conn.execute(FIRST_KEPT, (tid,)).fetchone()[0]
            unread = 0 if first is None else last_seq - max(cursor, int(first) - 1)
        return ReadState(tid, agent, cursor, last_seq, unread, others)

    def _page(self, tid: str, after_seq: int, limit: int, max_bytes: int) -> MessagePage | None:
        """The messages after ``after_seq``, or None if the thread does not exist. Their
        sizes are read first (store.page_end), so no content past the byte budget is
        fetched; ``more`` is exact. No snapshot is needed (it would cost more than the reads):
        messages never change, and a thread is only deleted whole, never reused."""
        db = self.db
        last, taken, more = page_end(
            db, sizes_sql(db, POLL_SIZES), (tid,), after_seq, limit, max_bytes
        )
        rows = db.fetchall(POLL, (tid, after_seq, last)) if taken else []
        if not rows and db.fetchone(THREAD, (tid,)) is None:
            return None
        return MessagePage([message_of(tid, r) for r in rows], more, after_seq)

    @staticmethod
    def _not_participant(agent: BusAgent, tid: str, *, sending: bool = False) -> AgentholdError:
        what = "sender not in thread" if sending else "agent not in thread"
        return NotParticipantError(
            f"{what}: {agent.name!r} is not a participant of thread {tid!r}; add it with "
            "join_thread first"
        )
