"""The agent registry (agenthold.identity.agents), which claims and the bus share: its tables are
as they were released, a claims agent id stands for the bus agent of its registered name,
and who owns an agent is decided in the registry, on both backends."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import uuid

import pytest

from agenthold.bus.schema import MESSAGES_SCHEMA
from agenthold.claims import Coordinator
from agenthold.claims.schema import CLAIMS_SCHEMA
from agenthold.db import postgres_schema, sqlite_schema
from agenthold.identity import agents as registry
from agenthold.messages import MessageBus
from agenthold.store import Component, InvalidInputError, StateStore


def _statements(script: str) -> list[str]:
    script = re.sub(r"--[^\n]*", "", script)
    return [" ".join(s.split()) for s in script.split(";") if s.strip()]


SCRIPTS = {"sqlite": sqlite_schema.MIGRATIONS, "postgresql": postgres_schema.MIGRATIONS}


def _digest(component: Component, dialect: str) -> str:
    steps = SCRIPTS[dialect][component.name][: component.version]
    text = "\n".join(";".join(_statements(step)) for step in steps)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# The released steps' statements (comments and spacing aside), as 0.11's claims (8 steps) and
# bus (3 steps) shipped them, before their agent tables moved into the registry.
RELEASED = {
    ("claims", "sqlite"): "765ebe2e5e31b7fd",
    ("claims", "postgresql"): "26d9e0d12230287e",
    ("messages", "sqlite"): "cfb2d4c6d51ce306",
    ("messages", "postgresql"): "312926c1d1d21cd4",
}


@pytest.mark.parametrize("component", [CLAIMS_SCHEMA, MESSAGES_SCHEMA], ids=lambda c: c.name)
@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_agent_tables_moved_into_the_registry_without_changing_a_released_step(
    component: Component, dialect: str
) -> None:
    """A database migrated by an older release and one created now run the same statements:
    the agent tables, whose rows moved into the registry, are defined as they were released."""
    assert _digest(component, dialect) == RELEASED[(component.name, dialect)]


@pytest.mark.backends
def test_a_claims_agent_id_finds_the_bus_agent_of_its_registered_name(db_url: str) -> None:
    with StateStore(db_url) as store:
        coord, bus = Coordinator(store), MessageBus(store)
        worker = coord.register("worker", principal="alice").agent_id
        other = coord.register("worker", principal="bob").agent_id  # names may repeat in claims
        created = bus.create_agent("worker", principal="alice")
        with store.db.snapshot() as conn:
            for ref in (worker, "worker", created.id):
                row = conn.execute(*registry.bus_agent_query(ref)).fetchone()
                assert registry.bus_agent_of(row) == created
            assert conn.execute(*registry.bus_agent_query("agent-00000000")).fetchone() is None
        assert registry.registered_name(store.db.fetchone, worker, "alice") == "worker"
        assert registry.registered_name(store.db.fetchone, worker, None) == "worker"  # trusted
        assert registry.registered_name(store.db.fetchone, "agent-00000000", "alice") is None
        with pytest.raises(registry.ForeignAgentError):
            registry.registered_name(store.db.fetchone, other, "alice")
        # the bus asks the registry: bob's claims id is not alice's, though the name is hers
        with pytest.raises(registry.ForeignAgentError):
            bus.get_or_create_agent(other, principal="alice")


@pytest.mark.backends
def test_an_unowned_bus_agent_is_adopted_once_and_then_refuses_others(db_url: str) -> None:
    with StateStore(db_url) as store:
        bus = MessageBus(store)
        bus.create_thread_by_names(["named", "creator"], principal="carol")
        named = bus.get_agent("named")
        assert named is not None
        with store.db.write() as (conn, _):
            registry.own_bus_agent(conn, named, "dave", adopt=False)  # a read: not adopted
            registry.own_bus_agent(conn, named, "erin", adopt=True)  # acting as it: erin's
            registry.own_bus_agent(conn, named, "erin", adopt=True)
            assert not registry.adopt_bus_agent(conn, named.id, "dave")  # adopted once only
        with store.db.write() as (conn, _), pytest.raises(registry.ForeignBusAgentError):
            registry.own_bus_agent(conn, named, "dave", adopt=True)
        with store.db.write() as (conn, _):  # a name is one agent: taken is taken
            assert not registry.create_bus_agent(conn, str(uuid.uuid4()), "named", "dave")
        assert bus.get_agent("named") == named


@pytest.mark.backends
def test_a_claims_agent_belongs_to_the_principal_that_registered_it(db_url: str) -> None:
    with StateStore(db_url) as store:
        coord = Coordinator(store)
        mine = coord.register("w", principal="alice").agent_id
        trusted = coord.register("t").agent_id
        with store.db.write() as (conn, _):
            registry.check_owner(conn, mine, "alice")
            registry.check_owner(conn, mine, None)  # a trusted caller is never refused
            registry.check_owner(conn, "agent-00000000", "alice")  # unknown: the call says so
            with pytest.raises(registry.ForeignAgentError):
                registry.check_owner(conn, mine, "bob")
            with pytest.raises(registry.ForeignAgentError):
                registry.check_owner(conn, trusted, "bob")  # registered with no principal
        assert coord.agent(mine).principal == "alice"


@pytest.mark.usefixtures("no_child_coverage")  # coverage itself loads what is counted
def test_the_claims_schema_the_edit_hook_reads_loads_nothing_of_the_registry() -> None:
    """The edit hook runs at every edit and reads claims' schema, which keeps the agent tables'
    definitions: the registry (its records, checks and SQL, uuid, secrets) is not loaded."""
    code = (
        "import sys, agenthold.claims.schema; "
        "print(sorted(m for m in ('agenthold.identity.agents', 'uuid', 'secrets') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_registry_checks_ids_names_and_registrations() -> None:
    assert registry.check_agent_id("agent-0123456789abcdef") == "agent-0123456789abcdef"
    assert registry.AGENT_ID_RE.fullmatch(registry.new_agent_id())
    for bad in ("agent-xyz", "Agent-0123456789", 7):
        with pytest.raises(registry.UnknownAgentError):
            registry.check_agent_id(bad)
    with pytest.raises(InvalidInputError, match="looks like a claims agent id"):
        registry.check_bus_name("agent-0123456789abcdef")
    assert registry.check_bus_name("reviewer") == "reviewer"
    assert registry.is_claims_id("agent-0123456789abcdef") and not registry.is_claims_id("w")
    registry.check_registration("w", "", "")
    with pytest.raises(InvalidInputError, match="model must be a string"):
        registry.check_registration("w", None, "")
    with pytest.raises(InvalidInputError):
        registry.check_registration("w" * (registry.MAX_AGENT_NAME + 1), "", "")
