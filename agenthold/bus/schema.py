"""The message bus's tables and the SQL its operations run (agenthold.bus.messagebus uses them).

Decisions behind it:
- The bus's tables (``msg_*``) are one ``store.Component`` with its own version, kept per
  component in ``agenthold_components``; each backend owns the scripts that make them
  (agenthold.db); the SQL below is written once, with ``?`` placeholders, for every backend.
- Version 2 adds who acted (the principal a token names, principals.py): the owner of each
  agent, whether it may still be adopted (an agent made only by being named as a participant
  belongs to nobody until a caller first acts as it), the creator and optional unique name of
  each thread (what thread scopes match), and the principal of each message.
"""

from __future__ import annotations

from agenthold.store import ChangeSource, Component, Topic

COMPONENT = "messages"

# --------------------------------------------------------------------------------------------
# Schema: the bus's tables, versioned on their own in agenthold_components
# --------------------------------------------------------------------------------------------

# The bus's tables (msg_agents, msg_threads, msg_participants, msg_messages, msg_deletions) are
# made by each backend's scripts (agenthold/db/sqlite_schema.py, postgres_schema.py); their
# agent rows are the agent registry's (agenthold.identity.agents).
MESSAGES_SCHEMA = Component(COMPONENT, 3)
SCHEMA_VERSION = MESSAGES_SCHEMA.version

MESSAGE_CHANGES = ChangeSource(
    name="messages",
    max_sql="SELECT max(id) FROM msg_messages",
    since_sql="SELECT id, thread_id FROM msg_messages WHERE id > ? ORDER BY id",
    topics=lambda row: (thread_topic(row[1]),),
)
DELETION_CHANGES = ChangeSource(
    name="message-deletions",
    max_sql="SELECT max(id) FROM msg_deletions",
    since_sql="SELECT id, thread_id FROM msg_deletions WHERE id > ? ORDER BY id",
    topics=lambda row: (thread_topic(row[1]),),
)


def thread_topic(thread_id: str) -> Topic:
    """The change-feed topic of one thread's messages."""
    return ("m", thread_id)


# --------------------------------------------------------------------------------------------
# SQL
# --------------------------------------------------------------------------------------------

THREAD = "SELECT created_at, last_seq, last_message_at, name FROM msg_threads WHERE thread_id = ?"
THREAD_INFO = (
    "SELECT created_at, last_seq, last_message_at, name, principal FROM msg_threads "
    "WHERE thread_id = ?"
)
MEMBERS = (
    "SELECT a.agent_id, a.name FROM msg_participants AS p "
    "JOIN msg_agents AS a ON a.agent_id = p.agent_id WHERE p.thread_id = ? "
    "ORDER BY p.joined_at, a.name"
)
BUMP = (
    "UPDATE msg_threads SET last_seq = last_seq + 1, last_message_at = ? "
    "WHERE thread_id = ? RETURNING last_seq"
)
IS_MEMBER = "SELECT 1 FROM msg_participants WHERE thread_id = ? AND agent_id = ?"
INSERT = (
    "INSERT INTO msg_messages (thread_id, seq, sender_id, sender_name, content, created_at, "
    "principal) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
POLL_SIZES = (  # a poll's page is cut by these first (store.page_end), then read by POLL;
    # {content}: the backend's byte count of the column (store.sizes_sql)
    "SELECT seq, {content} FROM msg_messages WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)
POLL = (
    "SELECT seq, sender_id, sender_name, content, created_at, principal FROM msg_messages "
    "WHERE thread_id = ? AND seq > ? AND seq <= ? ORDER BY seq"
)
CURSOR = (
    "SELECT t.last_seq, p.read_seq FROM msg_threads AS t LEFT JOIN msg_participants AS p "
    "ON p.thread_id = t.thread_id AND p.agent_id = ? WHERE t.thread_id = ?"
)
# the columns of an appended message in the event log (MessageBus.read_log)
LOG_COLUMNS = "id, thread_id, seq, sender_id, sender_name, content, created_at, principal"
FIRST_KEPT = "SELECT min(seq) FROM msg_messages WHERE thread_id = ?"
FROM_OTHERS = "SELECT count(*) FROM msg_messages WHERE thread_id = ? AND seq > ? AND sender_id <> ?"
