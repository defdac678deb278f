"""The agent registry: what an agent is, how it is named and found, and who owns it, for claims
and the message bus alike (both use this module; neither knows the other's agents).

Decisions behind it:
- Two tables stay, and this is the one module that joins them. ``agents`` holds claims'
  registrations: an unguessable ``agent-…`` id per registration (names may repeat), with the
  lease claims keep in its row, removed when idle (agenthold.claims). ``msg_agents`` holds the
  bus's agents: one per unique name, a UUID that never changes, deleted only when asked, and
  adoptable by the first caller that acts as it when it was only named as a participant. One
  table would change what an id is, which names may repeat and when an agent goes, and would
  need a migration of every database that merges rows by a name that may repeat; so the tables
  stay, a claims agent id given to the bus stands for the bus agent of its registered name, and
  that join is written here once.
- An agent belongs to the principal (the caller a token names, agenthold.identity.principals)
  that made it; None is a trusted caller, never refused. Acting as another's agent is
  ForeignAgentError (ForeignBusAgentError for a bus agent, a subclass), and changes nothing.
- The tables' definitions stay in the migrations that created them (claims' and the bus's,
  which each backend owns: db/sqlite_schema.py, db/postgres_schema.py); this module owns the
  rows. Reading claims' schema (the edit hook does, at every edit) therefore loads nothing of
  it.
- Functions take the connection of the caller's transaction (or snapshot), so a registration or
  an adoption commits with the write it belongs to; a read outside one takes the database's
  ``fetchone``. The statements are those claims and the bus ran before they shared them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

# The errors' bases and the text checks live with the store's records until db/ holds them.
from agenthold.db.errors import AgentholdError, InvalidInputError
from agenthold.db.records import check_text, utc_iso

__all__ = [
    "AGENT_ID_RE",
    "MAX_AGENT_NAME",
    "MAX_MODEL",
    "MAX_PURPOSE",
    "Agent",
    "BusAgent",
    "ForeignAgentError",
    "ForeignBusAgentError",
    "Registration",
    "UnknownAgentError",
    "check_agent_id",
    "check_owner",
    "unknown_agent",
]

MAX_AGENT_NAME = 128  # claims' and the bus's alike, so one name fits both
MAX_MODEL = 128
MAX_PURPOSE = 1024
AGENT_ID_RE = re.compile(r"agent-[0-9a-f]{8,64}")  # a claims agent id; no bus name looks like it


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class UnknownAgentError(InvalidInputError):
    """The agent id was never registered here, or its agent was removed after a long idle time."""

    hint = (
        "Register the agent (Coordinator.register) to get an agent_id, then use it in every call."
    )


class ForeignAgentError(AgentholdError):
    """A caller named an agent that another principal registered. The message names neither
    the other principal nor anything about the agent."""

    hint = "Use an agent_id that was registered by the same principal; register to get one."

    def __init__(self, agent_id: str) -> None:
        super().__init__(
            f"agent_id {agent_id} belongs to another caller: only the caller that registered an "
            "agent may act as it; nothing was changed"
        )


class ForeignBusAgentError(ForeignAgentError):
    """A caller (a principal) acted as a bus agent that belongs to another caller. The message
    names neither the other caller nor anything about the agent."""

    hint = "Act only as agents this principal made (create_agent); pick another name for yourself."

    def __init__(self, name: str) -> None:
        Exception.__init__(
            self,
            f"agent {name!r} belongs to another caller: only the caller that owns a bus agent "
            "may act as it; nothing was changed",
        )


def check_agent_id(agent_id: object) -> str:
    """Return ``agent_id`` if it is shaped like a claims agent id; UnknownAgentError if not."""
    if not isinstance(agent_id, str):
        raise UnknownAgentError(
            "agent_id must be a string that registering an agent gave, got "
            f"{type(agent_id).__name__}"
        )
    if not AGENT_ID_RE.fullmatch(agent_id):
        shown = agent_id if len(agent_id) <= 60 else agent_id[:60] + "…"
        raise UnknownAgentError(
            f"{shown!r} is not an agent_id: ids look like 'agent-1a2b3c4d5e6f7a8b' and come "
            "from registering an agent"
        )
    return agent_id


def unknown_agent(agent_id: str) -> AgentholdError:
    return UnknownAgentError(
        f"unknown agent_id {agent_id!r}: it was never registered with this database, or it "
        "was removed after a long idle time; register again"
    )


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Agent:
    """A registered agent. ``lease_ends_at`` is unix time, or None for a lease without end."""

    agent_id: str
    name: str
    model: str
    purpose: str
    registered_at: str
    last_seen_at: str
    lease_ends_at: float | None
    lease_end_outcome: str | None
    principal: str | None = None  # the caller it was registered through, if a token said

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "agent_id": self.agent_id,
            "name": self.name,
            "model": self.model,
            "purpose": self.purpose,
            "registered_at": self.registered_at,
            "last_seen_at": self.last_seen_at,
            "lease_ends_at": None if self.lease_ends_at is None else utc_iso(self.lease_ends_at),
            "lease_end_outcome": self.lease_end_outcome,
        }
        if self.principal is not None:
            d["principal"] = self.principal
        return d


@dataclass(frozen=True, slots=True)
class Registration:
    """A new agent: its id, to pass to every later call."""

    agent_id: str
    name: str
    model: str
    registered_at: str
    purpose: str = ""
    status: Literal["registered"] = "registered"


@dataclass(frozen=True, slots=True)
class BusAgent:
    """A named agent of the bus. ``id`` is a UUID that never changes."""

    id: str
    name: str

    def to_dict(self) -> dict[str, Any]:
        return {"agent_id": self.id, "name": self.name}


# Polls build many records. A frozen dataclass's __init__ sets every field through
# object.__setattr__; setting the slots directly builds the same object in half the time.
_new = object.__new__
_set_bus_id, _set_bus_name = (BusAgent.__dict__[n].__set__ for n in ("id", "name"))


def bus_agent_of(row: Any) -> BusAgent:
    """A BusAgent from an (agent_id, name) row."""
    agent: BusAgent = _new(BusAgent)
    _set_bus_id(agent, row[0])
    _set_bus_name(agent, row[1])
    return agent


# --------------------------------------------------------------------------------------------
# Claims' agents: registering, looking up, who owns one
# --------------------------------------------------------------------------------------------

AGENT_ROW = (
    "SELECT agent_id, name, model, purpose, registered_at, last_seen_at, lease_ends_at, "
    "lease_end_outcome, principal FROM agents "
)
AGENT_ROW_BY_ID = AGENT_ROW + "WHERE agent_id = ?"  # a row for Agent(*row)
AGENT_ROWS = AGENT_ROW + "ORDER BY registered_at"
AGENT_NAMES = "SELECT agent_id, name FROM agents"
_REGISTER = (
    "INSERT INTO agents (agent_id, name, model, purpose, registered_at, "
    "last_seen_at, lease_ends_at, lease_end_outcome, principal, host) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_OWNER = "SELECT principal FROM agents WHERE agent_id = ?"
_NAME_AND_OWNER = "SELECT name, principal FROM agents WHERE agent_id = ?"


def check_registration(name: object, model: object, purpose: object) -> None:
    """InvalidInputError unless ``name``, ``model`` and ``purpose`` may describe a new agent
    (a name is required; model and purpose may be empty)."""
    check_text("name", name, MAX_AGENT_NAME)
    if model:
        check_text("model", model, MAX_MODEL)
    elif not isinstance(model, str):
        raise InvalidInputError(f"model must be a string, got {type(model).__name__}")
    if purpose:
        check_text("purpose", purpose, MAX_PURPOSE)
    elif not isinstance(purpose, str):
        raise InvalidInputError(f"purpose must be a string, got {type(purpose).__name__}")


def new_agent_id() -> str:
    """A new claims agent id: unguessable, so knowing one is what lets a caller act as it."""
    import secrets  # here: the edit hook reaches this module (claims.records) and never registers

    return "agent-" + secrets.token_hex(8)


def add_agent(
    conn: Any,
    agent_id: str,
    name: str,
    model: str,
    purpose: str,
    at: str,
    *,
    lease_ends_at: float | None,
    lease_end_outcome: str | None,
    principal: str | None,
    host: str | None,
) -> None:
    """Add the agent ``agent_id`` (checked by check_registration and made by new_agent_id),
    registered and last seen ``at``, belonging to ``principal``; its lease is the caller's."""
    conn.execute(
        _REGISTER,
        (
            agent_id,
            name,
            model,
            purpose,
            at,
            at,
            lease_ends_at,
            lease_end_outcome,
            principal,
            host,
        ),
    )


def check_owner(conn: Any, agent_id: str, principal: str | None) -> None:
    """ForeignAgentError if ``principal`` is not who ``agent_id`` belongs to (None: trusted).
    An unknown agent passes here; the call that follows says it is unknown."""
    if principal is None:
        return
    row = conn.execute(_OWNER, (agent_id,)).fetchone()
    if row is not None and row[0] != principal:
        raise ForeignAgentError(agent_id)


def registered_name(
    fetchone: Callable[[str, tuple[Any, ...]], Any], agent_id: str, principal: str | None
) -> str | None:
    """The name the claims agent ``agent_id`` registered with (which the bus knows it by), or
    None if there is none; ForeignAgentError if it is not ``principal``'s (None: trusted).
    ``fetchone(sql, params)`` reads one row (a database's, outside any transaction)."""
    row = fetchone(_NAME_AND_OWNER, (agent_id,))
    if row is None:
        return None
    if principal is not None and row[1] != principal:
        raise ForeignAgentError(agent_id)
    return str(row[0])


# --------------------------------------------------------------------------------------------
# The bus's agents: by name, UUID or claims id; creating, adopting, owning
# --------------------------------------------------------------------------------------------

BUS_AGENT_BY_NAME = "SELECT agent_id, name FROM msg_agents WHERE name = ?"
BUS_AGENT_BY_ID = "SELECT agent_id, name FROM msg_agents WHERE agent_id = ?"
BUS_AGENTS = "SELECT agent_id, name FROM msg_agents ORDER BY name"
DELETE_BUS_AGENT = "DELETE FROM msg_agents WHERE agent_id = ?"
# The one join of the two tables: the bus agent a claims agent id stands for.
_BUS_AGENT_OF_CLAIMS_ID = (
    "SELECT m.agent_id, m.name FROM agents AS c "
    "JOIN msg_agents AS m ON m.name = c.name WHERE c.agent_id = ?"
)
_BUS_AGENT_BY_UUID_OR_NAME = (
    "SELECT agent_id, name FROM msg_agents WHERE agent_id = ? OR name = ? "
    "ORDER BY agent_id = ? DESC LIMIT 1"
)
BUS_OWNER = "SELECT principal, adoptable FROM msg_agents WHERE agent_id = ?"
_ADOPT = "UPDATE msg_agents SET principal = ?, adoptable = 0 WHERE agent_id = ? AND adoptable = 1"
_NEW_BUS_AGENT = (
    "INSERT INTO msg_agents (agent_id, name, created_at, principal, adoptable) "
    "VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (name) DO NOTHING RETURNING agent_id"
)


def check_bus_name(value: object) -> str:
    """Return a usable bus agent name: the store's rules for names, and not shaped like a
    claims agent id (which stands for the agent of its name)."""
    name = check_text("agent name", value, MAX_AGENT_NAME)
    if AGENT_ID_RE.fullmatch(name):
        raise InvalidInputError(
            f"agent name {name!r} looks like a claims agent id; pick another name (a claims "
            "agent id given to the bus stands for that agent's registered name)"
        )
    return name


def is_claims_id(ref: object) -> bool:
    """Whether ``ref`` is a claims agent id (given to the bus, it stands for its name)."""
    return isinstance(ref, str) and AGENT_ID_RE.fullmatch(ref) is not None


def bus_agent_query(ref: str) -> tuple[str, tuple[Any, ...]]:
    """The query that finds the bus agent ``ref`` names: a UUID, a claims id or a name."""
    if AGENT_ID_RE.fullmatch(ref):
        return _BUS_AGENT_OF_CLAIMS_ID, (ref,)
    import uuid  # here, as in ensure_bus_agent: loaded by the bus already, never by the edit hook

    try:
        as_uuid = str(uuid.UUID(ref))
    except ValueError:
        return BUS_AGENT_BY_NAME, (ref,)
    return _BUS_AGENT_BY_UUID_OR_NAME, (as_uuid, ref, as_uuid)


def create_bus_agent(conn: Any, agent_id: str, name: str, principal: str | None) -> bool:
    """Add the bus agent ``name`` with the UUID ``agent_id``, owned by ``principal``; False
    (and nothing changed) if another agent has the name. One statement, so two callers racing
    for a name cannot both get it."""
    new = (agent_id, name, utc_iso(), principal, 0)
    return conn.execute(_NEW_BUS_AGENT, new).fetchone() is not None


def ensure_bus_agent(
    conn: Any, name: str, principal: str | None, *, adoptable: bool = False
) -> None:
    """Create the bus agent ``name`` unless it exists (also if another caller creates it at
    this very moment: the INSERT then does nothing), owned by ``principal`` or, if
    ``adoptable``, by the first caller to act as it."""
    import uuid

    conn.execute(_NEW_BUS_AGENT, (str(uuid.uuid4()), name, utc_iso(), principal, int(adoptable)))


def adopt_bus_agent(conn: Any, agent_id: str, principal: str | None) -> bool:
    """Give the bus agent ``agent_id`` to ``principal`` if nobody has it yet (it was only
    named as a participant); whether it was adoptable. None: a trusted caller's, never refused."""
    return bool(conn.execute(_ADOPT, (principal, agent_id)).rowcount)


def own_bus_agent(conn: Any, agent: BusAgent, principal: str, *, adopt: bool) -> None:
    """ForeignBusAgentError unless ``agent`` is ``principal``'s. An agent nobody owns yet is
    adopted if ``adopt`` (the caller acts as it), else passes (the caller only reads its
    cursor). An agent that is gone passes: the call's own checks say so."""
    row = conn.execute(BUS_OWNER, (agent.id,)).fetchone()
    if row is None:
        return
    owner, adoptable = row
    if adoptable:
        if not adopt or adopt_bus_agent(conn, agent.id, principal):
            return
        owner = conn.execute(BUS_OWNER, (agent.id,)).fetchone()[0]  # adopted meanwhile
    if owner != principal:
        raise ForeignBusAgentError(agent.name)
