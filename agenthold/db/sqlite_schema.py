"""SQLite's schema: every component's migration scripts, in order, as this backend runs them.

``MIGRATIONS[name][n]`` takes component ``name`` (the store, claims, the message bus, retention)
from version n to n + 1 on SQLite; read top to bottom, this file is the whole history of an
agenthold SQLite file's tables. A step is never edited once released; a change is a new step,
added here and in postgres_schema.py, and the component's ``version`` raised. ``ADOPTIONS`` are
the steps that run first, inside the same transaction: the store's takes over an agenthold
0.10 file (legacy.py). A script is split into statements at lines ending in ";" (sqlite.py).
Standard library only (the copyable store carries this module, with the store's scripts alone).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agenthold.db.legacy import adopt_0_10

__all__ = ["ADOPTIONS", "MIGRATIONS"]


# -- the store (agenthold.store): keys, values and their history -------------------------------

_STORE_1 = """
    -- The live value of every key ever written. A deleted key keeps its row (deleted = 1,
    -- value NULL) so that its version sequence continues: versions are never reused.
    CREATE TABLE state (
        namespace   TEXT    NOT NULL,
        key         TEXT    NOT NULL,
        value       TEXT,
        version     INTEGER NOT NULL,
        updated_by  TEXT    NOT NULL,
        updated_at  TEXT    NOT NULL,
        deleted     INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (namespace, key)
    ) WITHOUT ROWID;

    -- Every write and delete, append-only. id is the commit order (the change feed's cursor).
    CREATE TABLE state_history (
        id          INTEGER PRIMARY KEY,
        namespace   TEXT    NOT NULL,
        key         TEXT    NOT NULL,
        version     INTEGER NOT NULL,
        value       TEXT,
        updated_by  TEXT    NOT NULL,
        updated_at  TEXT    NOT NULL,
        event_type  TEXT    NOT NULL CHECK (event_type IN ('write', 'delete')),
        UNIQUE (namespace, key, version)
    );
    """

_STORE_2 = """
    -- The principal (the caller a token names, agenthold.identity.principals) that made each write;
    -- NULL where no token said who called.
    ALTER TABLE state_history ADD COLUMN principal TEXT;
    """


# -- claims (agenthold.claims) -----------------------------------------------------------------

# The agents table's rows are the agent registry's (agenthold.identity.agents: registering,
# looking up, owners); its lease columns are the Coordinator's.
_CLAIMS_1 = """
    -- An agent's lease ends at lease_ends_at (unix seconds; NULL = no end);
    -- lease_end_outcome says what its end means.
    CREATE TABLE agents (
        agent_id           TEXT PRIMARY KEY,
        name               TEXT NOT NULL,
        model              TEXT NOT NULL,
        purpose            TEXT NOT NULL,
        registered_at      TEXT NOT NULL,
        last_seen_at       TEXT NOT NULL,
        lease_ends_at      REAL,
        lease_end_outcome  TEXT
    );

    -- One row per resource ever claimed. version is the fencing token: it grows by one with
    -- every claim and release and is never reused.
    CREATE TABLE claims (
        resource         TEXT PRIMARY KEY,
        uri              TEXT    NOT NULL,
        holder           TEXT,
        claimed_at       TEXT,
        version          INTEGER NOT NULL,
        last_outcome     TEXT,
        last_holder      TEXT,
        last_outcome_at  TEXT,
        moved_to         TEXT
    );
    CREATE INDEX claims_by_holder ON claims (holder) WHERE holder IS NOT NULL;

    -- Registrations, claims, releases and lease ends, append-only, for audit and the inspector.
    CREATE TABLE claim_events (
        id        INTEGER PRIMARY KEY,
        at        TEXT    NOT NULL,
        agent_id  TEXT    NOT NULL,
        event     TEXT    NOT NULL,
        resource  TEXT,
        uri       TEXT,
        outcome   TEXT,
        moved_to  TEXT,
        version   INTEGER
    );
"""

# The device and inode ("dev:ino") of a claimed file that existed when it was claimed, so that a
# claim through one hard link is seen through the others (agenthold.claims.names).
_CLAIMS_2 = """
    ALTER TABLE claims ADD COLUMN file_id TEXT;
    CREATE INDEX claims_by_file ON claims (file_id) WHERE file_id IS NOT NULL;
"""

# The principal (the caller a token names, agenthold.identity.principals) an agent belongs to
# and that made each claim event; NULL where no token said who called.
_CLAIMS_3 = """
    ALTER TABLE agents ADD COLUMN principal TEXT;
    ALTER TABLE claim_events ADD COLUMN principal TEXT;
"""

# Directory and glob claims (agenthold.claims.patterns): ``scope`` is the key of the directory a
# pattern lies under (NULL for a file or custom claim), so the patterns that may cover a file
# are found by its ancestor directories, through an index of the held ones.
_CLAIMS_4 = """
    ALTER TABLE claims ADD COLUMN scope TEXT;
    CREATE INDEX claims_by_scope ON claims (scope) WHERE scope IS NOT NULL;
"""

# Shared claims and the queue of waits that claim (agenthold.claims.write). A shared hold is a
# row of claim_shares (the resource's claims row keeps its version and last outcome, with no
# holder); a wait with claim is a row of claim_waiters, its seq the order of arrival, until the
# database time it gives up at, and granted the version it was handed (NULL while it waits).
# An event's mode is 'shared' for a shared claim or release (NULL: exclusive).
_CLAIMS_5 = """
    CREATE TABLE claim_shares (
        resource    TEXT NOT NULL,
        agent_id    TEXT NOT NULL,
        uri         TEXT NOT NULL,
        claimed_at  TEXT NOT NULL,
        scope       TEXT,
        file_id     TEXT,
        PRIMARY KEY (resource, agent_id)
    );
    CREATE INDEX claim_shares_by_scope ON claim_shares (scope) WHERE scope IS NOT NULL;
    CREATE INDEX claim_shares_by_agent ON claim_shares (agent_id);
    CREATE INDEX claim_shares_by_file ON claim_shares (file_id) WHERE file_id IS NOT NULL;
    CREATE TABLE claim_waiters (
        seq            INTEGER PRIMARY KEY AUTOINCREMENT,
        resource       TEXT NOT NULL,
        uri            TEXT NOT NULL,
        scope          TEXT,
        file_id        TEXT,
        agent_id       TEXT NOT NULL,
        mode           TEXT NOT NULL,
        since          TEXT NOT NULL,
        until          REAL NOT NULL,
        granted        INTEGER,
        granted_as     TEXT,
        prev_outcome   TEXT,
        prev_holder    TEXT,
        prev_at        TEXT,
        prev_moved_to  TEXT
    );
    ALTER TABLE claim_events ADD COLUMN mode TEXT;
"""

# The token of the held directory and glob claims (agenthold.claims.index): triggers give it a
# new random value in the transaction of any write that could change which pattern rows are
# held (a row with a scope inserted, deleted, or given a holder, scope or key), so an index of
# them kept by any process stays valid exactly while the token read beside it is unchanged. A
# random value rather than a count: a database restored from an older copy never repeats one.
# (Each trigger is one statement; the SQLite migration runner splits statements at lines
# ending in ";".)
_CLAIMS_6 = """
    CREATE TABLE claim_patterns (token TEXT NOT NULL);
    INSERT INTO claim_patterns (token) VALUES (lower(hex(randomblob(8))));
    CREATE TRIGGER claim_patterns_insert AFTER INSERT ON claims WHEN NEW.scope IS NOT NULL
    BEGIN UPDATE claim_patterns SET token = lower(hex(randomblob(8))); END;
    CREATE TRIGGER claim_patterns_delete AFTER DELETE ON claims WHEN OLD.scope IS NOT NULL
    BEGIN UPDATE claim_patterns SET token = lower(hex(randomblob(8))); END;
    CREATE TRIGGER claim_patterns_update AFTER UPDATE ON claims
    WHEN (NEW.scope IS NOT NULL OR OLD.scope IS NOT NULL) AND (NEW.holder IS NOT OLD.holder
    OR NEW.scope IS NOT OLD.scope OR NEW.resource IS NOT OLD.resource)
    BEGIN UPDATE claim_patterns SET token = lower(hex(randomblob(8))); END;
"""

# A wait in the queue is alive only while its server keeps listening for it: ``alive_until``
# (the database's clock) is pushed ahead by each of its looks, and a row whose waiter stopped
# looking (its process killed, its connection lost, its answer an error) is dropped, or, if it
# was handed a claim meanwhile, gives that claim back (agenthold.claims.write, ClaimWrite.serve).
# NULL (a row left by an older server): alive until its ``until``, as before.
_CLAIMS_7 = "ALTER TABLE claim_waiters ADD COLUMN alive_until REAL;"

# The host process of the client a stdio server served when the agent registered (agenthold.hooks
# .ancestry: "boot id:pid:start time", read from /proc), so that an edit hook run by that same
# host process knows the agent as its own; NULL over HTTP and where /proc cannot say.
_CLAIMS_8 = """
    ALTER TABLE agents ADD COLUMN host TEXT;
    CREATE INDEX agents_by_host ON agents (host) WHERE host IS NOT NULL;
"""


# -- the message bus (agenthold.bus) -----------------------------------------------------------

# One row per agent (its rows are the agent registry's, agenthold.identity.agents, which joins
# them to claims' agents): the name is the identity everyone uses, the UUID never changes. A
# thread's last_seq is its message counter (the newest message's seq). A participant row carries
# its read cursor (the last seq it marked read; 0: none). A message's id is the commit order
# across threads (the SQLite change feed's cursor; never reused, also after a thread is deleted);
# (thread_id, seq) is the order readers see; the sender's name is kept with the message, so it
# survives the agent's deletion. On PostgreSQL, xid is the writing transaction (see
# Database.feed_window): ids there do not commit in order.
_MESSAGES_1 = """
    CREATE TABLE msg_agents (
        agent_id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL);
    CREATE TABLE msg_threads (
        thread_id TEXT PRIMARY KEY, created_at TEXT NOT NULL,
        last_seq INTEGER NOT NULL DEFAULT 0, last_message_at TEXT);
    CREATE TABLE msg_participants (
        thread_id TEXT NOT NULL, agent_id TEXT NOT NULL, joined_at TEXT NOT NULL,
        read_seq INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (thread_id, agent_id));
    CREATE INDEX msg_participants_by_agent ON msg_participants (agent_id);
    CREATE TABLE msg_messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL, seq INTEGER NOT NULL,
        sender_id TEXT NOT NULL, sender_name TEXT NOT NULL, content TEXT NOT NULL,
        created_at TEXT NOT NULL, UNIQUE (thread_id, seq));
"""

_MESSAGES_2 = """
    ALTER TABLE msg_agents ADD COLUMN principal TEXT;
    ALTER TABLE msg_agents ADD COLUMN adoptable INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE msg_threads ADD COLUMN name TEXT;
    ALTER TABLE msg_threads ADD COLUMN principal TEXT;
    CREATE UNIQUE INDEX msg_threads_by_name ON msg_threads (name);
    ALTER TABLE msg_messages ADD COLUMN principal TEXT;
"""

# 3: deleted threads leave a row, so that waiters in other processes hear of the deletion
# (a SQLite change feed learns topics from new rows; a deletion adds none elsewhere).
_MESSAGES_3 = """
    CREATE TABLE msg_deletions (
        id INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL, deleted_at TEXT NOT NULL);
"""


# -- retention (agenthold.retention): the rules of compaction ----------------------------------

_RETENTION_1 = """
    -- One row per rule set: scope 'database' (name ''), 'namespace' or 'thread'. No row: the
    -- rule is inherited (from the database; from nothing, which keeps everything).
    CREATE TABLE agenthold_retention (
        scope   TEXT    NOT NULL,
        name    TEXT    NOT NULL,
        setting TEXT    NOT NULL,
        value   INTEGER NOT NULL,
        PRIMARY KEY (scope, name, setting)
    );
    """


MIGRATIONS: dict[str, tuple[str, ...]] = {
    "store": (_STORE_1, _STORE_2),
    "claims": (
        _CLAIMS_1,
        _CLAIMS_2,
        _CLAIMS_3,
        _CLAIMS_4,
        _CLAIMS_5,
        _CLAIMS_6,
        _CLAIMS_7,
        _CLAIMS_8,
    ),
    "messages": (_MESSAGES_1, _MESSAGES_2, _MESSAGES_3),
    "retention": (_RETENTION_1,),
}

ADOPTIONS: Mapping[str, Callable[[Any], Callable[[], None] | None]] = {"store": adopt_0_10}
