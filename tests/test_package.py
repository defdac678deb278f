"""The package's shape: what may import what, the one-file store, and the public API.

The store is meant to be copied into other projects as one file (vendor/agenthold_store.py,
built from store.py and agenthold/db/ by tools/build_store_file.py), and several modules promise
the standard library only; these tests read each module's imports with ``ast`` and run the
copied store in an interpreter that cannot see the installed package (``-S``: no site-packages).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import shutil
import subprocess
import sys
from importlib.metadata import version as distribution_version
from pathlib import Path
from typing import Any

import pytest

import agenthold
import agenthold.exceptions
import agenthold.store

PACKAGE = Path(agenthold.__file__).parent
STDLIB = set(sys.stdlib_module_names)


def _dotted_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Every module by its name under agenthold (``claims.schema``; a subpackage's face by the
# subpackage's name, ``claims``; the package root as ``""`` is left out).
ALL_MODULES = sorted(
    name for p in PACKAGE.rglob("*.py") if (name := _dotted_name(p)) and "static" not in p.parts
)


def module_path(module: str) -> Path:
    """The file of a module named as in ``agenthold.<module>``: ``claims.schema`` is
    claims/schema.py, ``claims`` (a subpackage) its face claims/__init__.py."""
    path = PACKAGE / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@functools.cache
def imported_modules(module: str) -> frozenset[str]:
    """The names of every module ``agenthold.<module>`` imports, anywhere in it (functions
    included), the agenthold submodules it takes from, and the agenthold modules it names as a
    whole string (``importlib.import_module("agenthold.db.postgres")``, a lazy face's table):
    an import through importlib is an import too."""
    tree = ast.parse(module_path(module).read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # from agenthold.claims import x: x may be a submodule
            prefix = node.module.removeprefix("agenthold").lstrip(".")
            found.update(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if node.module.startswith("agenthold")
                and f"{prefix}.{alias.name}".lstrip(".") in ALL_MODULES
            )
        found.update(name for name in _loaded_by_name(node) if name.startswith("agenthold."))
    return frozenset(found)


def _loaded_by_name(node: ast.AST) -> list[str]:
    """The module names a node loads through importlib: ``import_module("x")`` (and
    ``find_spec``, ``__import__``), or the values of a lazy face's ``_LAZY`` table."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("import_module", "find_spec", "__import__"):
            return [str(node.args[0].value)]
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
            return [str(v.value) for v in node.value.values if isinstance(v, ast.Constant)]
    return []


def outside_stdlib(names: frozenset[str] | set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] not in STDLIB and n != "__future__"}


@pytest.mark.parametrize(
    "module",
    [
        "store",
        "db.errors",
        "db.records",
        "db.schema",
        "db.base",
        "db.wait",
        "db.feed",
        "db.watch",
        "db.sqlite_feed",
        "db.sqlite",
        "db.wal",
        "db.legacy",
        "db.sqlite_schema",
        "db.postgres_schema",
        "db.backends",
        "claims.names",
        "identity.principals",
        "identity.agents",
        "serve.auth",
        "serve.limits",
        "serve.sessions",
        "claims.records",
        "claims.schema",
        "claims.patterns",
        "claims.index",
        "claims.rows",
        "claims.targets",
        "claims.write",
        "claims.coordinator",
        "bus.records",
        "bus.schema",
        "bus.messagebus",
        "inspect.commands",
        "inspect.args",
        "inspect.tables",
        "inspect.status",
        "db.locations",
        "cli.completion",
        "cli.backup",
        "retention",
        "cli.retention",
        "cli.tokens",
        "cli.main",
        "serve.front",
        "serve.warm_protocol",
        "serve.rpc_id",
    ],
)
def test_a_module_that_promises_the_standard_library_imports_nothing_else(module: str) -> None:
    allowed = {
        "store": {
            "agenthold.db.backends",
            "agenthold.db.base",
            "agenthold.db.errors",
            "agenthold.db.legacy",
            "agenthold.db.records",
            "agenthold.db.schema",
            "agenthold.db.sqlite",
            "agenthold.db.wait",
            "agenthold.db.wal",
        },
        "db.errors": set(),
        "db.records": {"agenthold.db.errors"},
        "db.schema": {"agenthold.db.records"},
        "db.base": {"agenthold.db.records", "agenthold.db.schema"},
        "db.wait": {"agenthold.db.base", "agenthold.db.records"},
        "db.feed": {"agenthold.db.records"},
        "db.watch": set(),
        "db.sqlite_schema": {"agenthold.db.legacy"},
        "db.postgres_schema": set(),
        "db.sqlite_feed": {
            "agenthold.db.feed",
            "agenthold.db.records",
            "agenthold.db.schema",
            "agenthold.db.watch",
        },
        "db.sqlite": {
            "agenthold.db.base",
            "agenthold.db.errors",
            "agenthold.db.feed",  # for typing only
            "agenthold.db.legacy",
            "agenthold.db.records",
            "agenthold.db.schema",
            "agenthold.db.sqlite_feed",  # with the first subscriber
            "agenthold.db.sqlite_schema",
            "agenthold.db.wal",
        },
        "db.wal": {"agenthold.db.schema"},
        "db.legacy": {"agenthold.db.base", "agenthold.db.records"},
        # the backends by the scheme of a URL: postgres.py (psycopg) only for postgresql://
        "db.backends": {
            "agenthold.db.base",
            "agenthold.db.errors",
            "agenthold.db.sqlite",
            "agenthold.db.postgres",
        },
        "claims.names": {"agenthold.store"},
        "identity.principals": set(),
        "identity.agents": {"agenthold.db.errors", "agenthold.db.records"},
        "serve.auth": {"agenthold.identity.principals"},
        "serve.limits": set(),
        "serve.sessions": {"agenthold.serve.auth", "agenthold.identity.principals"},
        "claims.records": {  # names and patterns for types only
            "agenthold.store",
            "agenthold.identity.agents",
            "agenthold.claims.names",
            "agenthold.claims.patterns",
        },
        "claims.schema": {"agenthold.store"},
        "claims.patterns": {"agenthold.store", "agenthold.claims.names"},
        "claims.index": {"agenthold.claims.patterns"},
        "claims.rows": {
            "agenthold.store",
            "agenthold.claims.names",
            "agenthold.claims.patterns",
            "agenthold.claims.index",
            "agenthold.claims.schema",
            "agenthold.claims.records",
        },
        "claims.targets": {
            "agenthold.store",
            "agenthold.claims.names",
            "agenthold.claims.patterns",
            "agenthold.claims.records",
        },
        "claims.write": {
            "agenthold.store",
            "agenthold.claims.names",
            "agenthold.claims.patterns",
            "agenthold.claims.index",
            "agenthold.claims.schema",
            "agenthold.claims.records",
            "agenthold.claims.rows",
            "agenthold.claims.targets",
            "agenthold.identity.agents",
        },
        "claims.coordinator": {
            "agenthold.store",
            "agenthold.identity.agents",
            "agenthold.claims.names",
            "agenthold.claims.records",
            "agenthold.claims.schema",
            "agenthold.claims.patterns",
            "agenthold.claims.index",
            "agenthold.claims.rows",
            "agenthold.claims.targets",
            "agenthold.claims.write",
        },
        "bus.records": {"agenthold.store", "agenthold.identity.agents"},
        "bus.schema": {"agenthold.store"},
        "bus.messagebus": {
            "agenthold.store",
            "agenthold.identity.agents",
            "agenthold.bus.records",
            "agenthold.bus.schema",
        },
        "inspect.args": set(),
        "inspect.tables": set(),
        "inspect.status": {"agenthold.inspect.tables", "agenthold.store", "agenthold.retention"},
        "db.locations": set(),
        "cli.completion": set(),
        "cli.backup": {"agenthold.store"},
        "retention": {"agenthold.store"},
        "cli.retention": {"agenthold.store", "agenthold.retention"},
        "cli.tokens": {"agenthold", "agenthold.identity", "agenthold.identity.principals"},
        "inspect.commands": {
            "agenthold",
            "agenthold.inspect.args",
            "agenthold.inspect.tables",
            "agenthold.inspect.status",  # agenthold status
            "agenthold.store",
            "agenthold.claims.coordinator",
            "agenthold.bus.messagebus",
            "agenthold.claims.names",
        },
        "cli.main": {
            "agenthold",
            "agenthold.inspect.commands",
            "agenthold.cli.backup",
            "agenthold.db.locations",
            "agenthold.cli.completion",
            "agenthold.cli.retention",
            "agenthold.cli.tokens",
            "agenthold.store",
            "agenthold.claims.coordinator",
            "agenthold.claims.names",
            "agenthold.serve.auth",
            "agenthold.identity.principals",
            "agenthold.serve.limits",
            "anyio",  # only to serve, inside serve()
            "agenthold.serve.app",  # only to serve, inside serve()
            "agenthold.serve.stdio",
            "agenthold.serve.http",
            "agenthold.serve.front",
            "agenthold.serve.warm",  # only to leave a warm server, inside main()
            "agenthold.web",  # the live page: its flags, and its run inside main()
            "agenthold.hooks",  # agenthold hook ..., inside main()
            "agenthold.serve",  # the faces of the rooms above
            "agenthold.inspect",
        },
        "serve.front": {"agenthold.serve.warm_protocol"},  # every warm call: these two alone
        "serve.warm_protocol": set(),
        "serve.rpc_id": set(),
    }[module]
    assert outside_stdlib(imported_modules(module)) <= allowed


MODULES = [m for m in ALL_MODULES if m != "__main__"]
WEB = {m for m in MODULES if m.split(".")[0] == "web"}  # uvicorn and starlette, never mcp
# the modules that import mcp themselves (the server shim re-exports serve.app's names; the
# warm server serves through stdio.py)
SERVING = {"serve.toolkit", "serve.app", "serve.stdio", "serve.http", "serve.compat.mcp_sdk"}
# ... and those that import uvicorn, sse-starlette or h11 outside the live page: HTTP and the
# compatibility modules of those libraries
ON_HTTP_SERVERS = {"serve.http", "serve.compat.uvicorn_h11", "serve.compat.sse"}
HTTP_SERVERS = ("uvicorn", "sse_starlette", "h11")


def test_only_the_serving_modules_import_mcp_and_the_library_knows_no_transport() -> None:
    for module in MODULES:
        tops = {n.split(".")[0] for n in imported_modules(module)}
        if module in SERVING:
            assert "mcp" in tops, f"{module} is listed as serving MCP but imports no mcp"
        else:
            assert "mcp" not in tops, f"{module} imports mcp"
        if module not in WEB:
            servers = tops & set(HTTP_SERVERS)
            assert bool(servers) == (module in ON_HTTP_SERVERS), (module, servers)
    claims_imports = {
        n for n in imported_modules("claims.coordinator") if n.startswith("agenthold")
    }
    assert claims_imports <= {
        "agenthold.store",
        "agenthold.identity.agents",
        "agenthold.claims.names",
        "agenthold.claims.records",
        "agenthold.claims.schema",
        "agenthold.claims.patterns",
        "agenthold.claims.index",
        "agenthold.claims.rows",
        "agenthold.claims.targets",
        "agenthold.claims.write",
    }
    server_imports = {n for n in imported_modules("serve.app") if n.startswith("agenthold.")}
    assert not server_imports & {
        "agenthold.inspect.commands",
        "agenthold.cli.main",
        "agenthold.serve.stdio",
        "agenthold.serve.http",
    }
    for transport in ("serve.stdio", "serve.http"):
        other = {"serve.stdio": "agenthold.serve.http", "serve.http": "agenthold.serve.stdio"}[
            transport
        ]
        assert other not in imported_modules(transport)
        assert "agenthold.cli.main" not in imported_modules(transport)
    postgres_imports = outside_stdlib(imported_modules("db.postgres"))
    assert postgres_imports <= {
        "agenthold.db.base",
        "agenthold.db.errors",
        "agenthold.db.feed",
        "agenthold.db.postgres_schema",
        "agenthold.db.records",
        "agenthold.db.schema",
        "psycopg",
        "psycopg_pool",
    }


def test_the_inspector_holds_no_sql_and_names_no_table() -> None:
    """The inspector reads through StateStore, Coordinator and MessageBus, which own their
    tables and speak each backend's SQL; a statement or table name of its own would tie it to
    one schema (and possibly one backend)."""
    from agenthold.bus.schema import MESSAGES_SCHEMA
    from agenthold.claims.schema import CLAIMS_SCHEMA
    from agenthold.db.sqlite_schema import MIGRATIONS

    tables = set()
    for component in (agenthold.store.STORE_SCHEMA, CLAIMS_SCHEMA, MESSAGES_SCHEMA):
        for script in MIGRATIONS[component.name]:
            tables.update(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", script))
    assert {"state", "claim_events", "msg_messages"} <= tables
    # names that are also words ("state", "claims", "agents") are the inspector's subcommands
    tables = {t for t in tables if "_" in t}
    tree = ast.parse(_source("inspect.commands"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(re.findall(r"\b(?:SELECT|INSERT|UPDATE|DELETE|WHERE)\b", node.value))
            found.update(set(re.findall(r"\w+", node.value)) & tables)
        elif isinstance(node, ast.Attribute) and node.attr in {"execute", "fetchone", "fetchall"}:
            found.add(node.attr)
        elif isinstance(node, ast.alias) and node.name == "read_events":
            found.add(node.name)
    assert not found, f"inspect.py has SQL of its own: {sorted(found)}"


# The library: what Python callers use without MCP. Its messages and hints name its own
# methods; the tool sets word them for agents (ToolSet.error_hints).
# Every module but those that serve or word replies for agents (a new module is library unless
# listed here, so it is checked from its first line).
NOT_LIBRARY = {"serve", "serve.tools", "server", "serve.front", "serve.auth", "serve.sessions",
               "serve.limits", "serve.rpc_id", "serve.warm", "serve.warm_protocol"}  # fmt: skip
LIBRARY = tuple(
    m
    for m in MODULES
    if m not in SERVING | NOT_LIBRARY
    and not m.endswith("_tools")
    and m.split(".")[0] not in ("cli", "inspect", "hooks")  # they word what people read
)


def tool_names() -> set[str]:
    from agenthold.serve.tools import TOOL_SETS

    return {name for tool_set in TOOL_SETS.values() for name in tool_set.names}


@pytest.mark.parametrize("module", LIBRARY)
def test_the_library_names_no_tool_in_what_it_says(module: str) -> None:
    tree = ast.parse(module_path(module).read_text(encoding="utf-8"))
    words = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            words.update(re.findall(r"agenthold_[a-z_]+", node.value))
    assert not words & tool_names(), f"{module} names tools: {sorted(words & tool_names())}"


def test_the_tool_sets_word_the_librarys_errors_in_tool_names() -> None:
    from agenthold.bus.records import ForeignBusAgentError
    from agenthold.claims.records import NotHolderError, UnknownAgentError
    from agenthold.serve.app import hint_for

    unknown = UnknownAgentError("unknown agent_id")
    assert "agenthold_" not in (unknown.hint or "")
    assert "agenthold_register" in (hint_for("agenthold_claim", unknown) or "")
    assert "agenthold_create_agent" in (hint_for("agenthold_append", unknown) or "")
    not_holder = NotHolderError("x", held_by="agent-0123456789abcdef")
    assert "agenthold_status" in (hint_for("agenthold_release", not_holder) or "")
    foreign = ForeignBusAgentError("w")  # a subclass of the claims' ForeignAgentError
    assert "agenthold_create_agent" in (hint_for("agenthold_poll", foreign) or "")
    assert "agenthold_register" in (hint_for("agenthold_claim", foreign) or "")
    # an error no tool set words keeps the library's own hint
    other = UnknownAgentError("x")
    other.hint = "own"
    assert hint_for("agenthold_set", other) == "own"


def test_claims_and_the_bus_know_agents_only_through_one_registry() -> None:
    """What an agent is lives in one place, agenthold.identity.agents: the bus imports nothing
    of claims, both rooms import the registry, and neither names the other's agent table."""
    graph = import_graph()
    for module in (m for m in MODULES if room_of(m) == "bus"):
        assert not {i for i in graph[module] if room_of(i) == "claims"}, module
    assert "identity.agents" in graph["bus.messagebus"] & graph["claims.coordinator"]
    table = {"bus": r"\b(?:FROM|JOIN|INTO|UPDATE)\s+agents\b", "claims": r"\bmsg_agents\b"}
    for module in (m for m in MODULES if room_of(m) in table):
        for node in ast.walk(ast.parse(_source(module))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not re.search(table[room_of(module)], node.value), (module, node.value)
    # ... and its errors are the ones both rooms raise, under their public names
    import agenthold.bus
    import agenthold.claims
    import agenthold.identity.agents as registry

    assert agenthold.claims.ForeignAgentError is registry.ForeignAgentError
    assert agenthold.claims.UnknownAgentError is registry.UnknownAgentError
    assert agenthold.bus.ForeignBusAgentError is registry.ForeignBusAgentError
    assert issubclass(registry.ForeignBusAgentError, registry.ForeignAgentError)
    assert agenthold.claims.AGENT_ID_RE is registry.AGENT_ID_RE
    assert agenthold.bus.BusAgent is registry.BusAgent


def import_graph() -> dict[str, set[str]]:
    """Which agenthold module imports which, counting every import in the file: those inside
    functions and under TYPE_CHECKING too (a cycle there is still two rooms that know each
    other), and those made through importlib by a module's whole name. Importing
    ``agenthold.claims.schema`` does not count as importing the face ``agenthold.claims``: a
    face that names its modules (to load them lazily) would otherwise be in a cycle with each."""
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        names = imported_modules(module)
        graph[module] = {n.removeprefix("agenthold.") for n in names} & set(MODULES)
        graph[module].discard(module)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``graph`` as a path that ends where it starts, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_imports_flow_one_way_with_no_cycle_anywhere_in_the_package() -> None:
    graph = import_graph()
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"
    assert graph["serve.app"] >= {"serve.tools", "serve.toolkit"}  # the graph is read
    assert "db.postgres" in graph["db.backends"]  # ... with what importlib loads by name
    assert not {m for m in graph if room_of(m) == "db"} & {"store"}
    # db/ stands on nothing of the package but the faces' loader
    assert all(room_of(i) in ("db", "lazy") for m in graph if room_of(m) == "db" for i in graph[m])


def test_postgresqls_feed_builds_on_the_public_base_only() -> None:
    """postgres.py's feed overrides only ChangeFeed's public hooks and reads no private
    attribute of the base (it once subclassed store.py's private feed and replaced its private
    methods)."""
    from agenthold.db.feed import ChangeFeed

    base_private = {n for n in vars(ChangeFeed) if n.startswith("_") and not n.startswith("__")}
    base_private |= {"_by_topic", "_everything", "_count"}  # set in ChangeFeed.__init__
    tree = ast.parse(_source("db.postgres"))
    (feed,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_Feed"]
    defined = {n.name for n in feed.body if isinstance(n, ast.FunctionDef)}
    used = {
        n.attr
        for n in ast.walk(feed)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }
    assert not (defined | used) & base_private, sorted((defined | used) & base_private)
    assert {"start", "halt"} <= defined


# The components: they speak to the Database seam and name no engine.
COMPONENT_ROOMS = ("claims", "bus", "retention", "store", "serve")
COMPONENTS = [m for m in MODULES if m.split(".")[0] in COMPONENT_ROOMS]


@pytest.mark.parametrize("module", COMPONENTS)
def test_a_component_names_no_dialect_and_no_driver(module: str) -> None:
    """No component branches on ``db.dialect`` or imports a driver: where the engines differ,
    the backend supplies the SQL (``Database.byte_length``, ``side_file``, ``has_table``,
    ``give_space_back``) and the tables' scripts (``Database.migrations``), so no component
    names a dialect either."""
    tree = ast.parse(_source(module))
    dialect = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "dialect"]
    assert not dialect, f"{module} reads .dialect"
    named = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value in ("sqlite", "postgresql", "postgres")
    ]
    assert not named, f"{module} names a dialect on lines {named}"
    drivers = {"sqlite3", "psycopg", "psycopg_pool"}
    assert not {n.split(".")[0] for n in imported_modules(module)} & drivers


DDL = re.compile(r"\b(?:CREATE\s+(?:UNIQUE\s+)?(?:TABLE|INDEX|TRIGGER)|ALTER\s+TABLE)\b")


def test_no_module_outside_the_seam_holds_a_tables_definition() -> None:
    """Each backend owns its DDL (agenthold/db/sqlite_schema.py, postgres_schema.py): a
    component declares its name and version, and no module above the seam creates or alters a
    table, an index or a trigger."""
    held = {
        f"{module}:{node.lineno}"
        for module in MODULES
        if module.split(".")[0] != "db"
        for node in ast.walk(ast.parse(_source(module)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and DDL.search(node.value)
    }
    assert not held, sorted(held)
    assert DDL.search(_source("db.sqlite_schema")) and DDL.search(_source("db.postgres_schema"))


def _components() -> dict[str, Any]:
    """Every Component the package declares (the modules that call ``Component(``), by name."""
    from agenthold.db.schema import Component

    found: dict[str, Any] = {}
    for module in MODULES:
        tree = ast.parse(_source(module))
        calls = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Component"
        ]
        if calls and module.split(".")[0] != "db":
            loaded = importlib.import_module(f"agenthold.{module}")
            for value in vars(loaded).values():
                if isinstance(value, Component):
                    found[value.name] = value
    return found


def test_each_backend_has_the_scripts_of_every_component_at_its_version() -> None:
    """Each backend's file is the whole history of its schema: a script per version of every
    component, no more and no fewer; a component whose backend lacks a step is refused, not
    half made."""
    from agenthold.db import postgres_schema, sqlite_schema
    from agenthold.db.postgres import PostgresDatabase
    from agenthold.db.schema import Component
    from agenthold.db.sqlite import SQLiteDatabase

    components = _components()
    assert {"store", "claims", "messages", "retention"} <= set(components)
    for backend in (sqlite_schema, postgres_schema):
        versions = {name: len(scripts) for name, scripts in backend.MIGRATIONS.items()}
        assert versions == {c.name: c.version for c in components.values()}, backend.__name__
    for cls, table in ((SQLiteDatabase, sqlite_schema), (PostgresDatabase, postgres_schema)):
        for name in components:  # what the runner asks each backend for is its file's
            assert cls.migrations(None, name) == table.MIGRATIONS[name]  # type: ignore[arg-type]
    store = agenthold.store.StateStore(":memory:")
    with store, pytest.raises(RuntimeError, match="0 migration scripts for 'unknown'"):
        store.db.ensure(Component("unknown", 1))


def test_the_cycle_finder_finds_a_cycle_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"b"}}) is None


# The rooms from the top down: a module may import modules of its own room and of the rooms
# below it, never above. The public import paths kept at the top level (0.10's among them) form
# one room between the inspector and the libraries; the server shim sits above serve/.
LAYERS: list[set[str]] = [
    {"__main__"},
    {"cli"},
    {"web"},
    {"server"},
    {"serve"},
    {"hooks"},
    {"inspect"},
    {"messages", "coordinator", "exceptions", "resources", "models"},
    {"bus"},
    {"claims"},
    {"retention"},
    {"store"},
    {"identity"},
    {"db"},
    {"lazy"},
]


def room_of(module: str) -> str:
    return module.split(".")[0]


def layer_of(module: str) -> int:
    (index,) = [i for i, rooms in enumerate(LAYERS) if room_of(module) in rooms]
    return index


def test_every_room_imports_only_its_own_room_and_the_rooms_below_it() -> None:
    graph = import_graph()
    assert {room_of(m) for m in ALL_MODULES} == set().union(*LAYERS), "a room has no layer"
    upward = sorted(
        (module, imported)
        for module, imports in graph.items()
        for imported in imports
        if layer_of(imported) < layer_of(module)
    )
    assert upward == [], f"imports that climb back up: {upward}"
    # the rule is checked, not vacuous: the command line sits over the server over the store
    assert layer_of("cli.main") < layer_of("serve.app") < layer_of("store") < layer_of("db.sqlite")


def test_the_layer_rule_catches_an_import_from_above() -> None:
    assert layer_of("store") > layer_of("claims.coordinator")  # store importing claims: upward


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
THIRD_PARTY = {"mcp": {"mcp", "mcp_types"}, "psycopg": {"psycopg", "psycopg_pool"}}


def rooms_table() -> list[tuple[str, str]]:
    """docs/architecture.md's table of rooms, top to bottom: each row's room (its backticked
    first cell: ``cli/`` or ``store.py``) and its "imports" cell."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## The rooms", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            for name in re.findall(r"`([a-z_]+)(?:/|\.py)`", cells[0]):
                rows.append((name, cells[2]))
    return rows


def test_the_architecture_table_names_every_import_of_every_room() -> None:
    """The "imports" column is the real import graph between rooms: each row lists exactly the
    rooms its modules import, all of them in rows below, and exactly the mcp or psycopg it
    imports."""
    graph = import_graph()
    rows = rooms_table()
    rooms = [name for name, _ in rows]
    assert sorted(rooms) == sorted({room_of(m) for m in MODULES}), "every room has one row"
    for index, (room, cell) in enumerate(rows):
        modules = [m for m in MODULES if room_of(m) == room]
        # lazy.py, the faces' loader, is used by every lazy face and not listed in the table
        imports = {room_of(i) for m in modules for i in graph[m]} - {room, "lazy"}
        words = set(re.findall(r"[a-z_]+", cell))
        assert words & set(rooms) == imports, (room, cell, sorted(imports))
        assert imports <= set(rooms[index + 1 :]), f"{room} imports {imports} from above"
        names = set().union(*(imported_modules(m) for m in modules))
        third = {k for k, tops in THIRD_PARTY.items() if {n.split(".")[0] for n in names} & tops}
        assert words & set(THIRD_PARTY) == third, (room, cell, third)
    sentence = re.search(r"Only (.*?) import `mcp`", " ".join(ARCHITECTURE.read_text().split()))
    assert sentence is not None
    named = {m.replace("/", ".") for m in re.findall(r"`([a-z_/]+)\.py`", sentence.group(1))}
    assert named == SERVING


def test_the_architecture_doc_gives_build_server_every_parameter_it_has() -> None:
    """A new transport is told to call server.build_server(...): the call the doc shows names
    each of the function's parameters, in order (it once left out principal_of, the one that
    says who is calling)."""
    tree = ast.parse(module_path("serve.app").read_text(encoding="utf-8"))
    (function,) = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "build_server"
    ]
    parameters = [a.arg for a in function.args.args]
    assert parameters[0] == "app" and len(parameters) > 1
    text = " ".join(ARCHITECTURE.read_text(encoding="utf-8").split())
    calls = re.findall(r"build_server\(([^)]*)\)", text)
    assert calls, "the doc shows no build_server call"
    for call in calls:
        assert [a.strip() for a in call.split(",")] == parameters, call


# What changes the whole process rather than one server or call: logging's set-up, the exit
# status, signal handlers, the garbage collector, resource limits, the umask, the session. cli.py
# owns all of it (issue 12). Called as module.function, or as a method of any object.
PROCESS_WIDE_CALLS = {
    "logging.basicConfig", "logging.disable", "logging.captureWarnings",
    "logging.config.dictConfig", "logging.config.fileConfig", "logging.setLoggerClass",
    "sys.exit", "os._exit", "os.abort", "SystemExit",
    "signal.signal", "signal.set_wakeup_fd", "signal.siginterrupt", "signal.pthread_sigmask",
    "signal.setitimer", "signal.alarm", "anyio.open_signal_receiver", "open_signal_receiver",
    "gc.freeze", "gc.unfreeze", "gc.disable", "gc.enable", "gc.set_threshold",
    "resource.setrlimit", "os.umask", "os.setsid", "os.setpgid", "os.nice", "os.chdir",
    "faulthandler.enable", "sys.setswitchinterval", "sys.setrecursionlimit",
    "sys.set_int_max_str_digits", "asyncio.set_event_loop_policy", "locale.setlocale",
}  # fmt: skip
PROCESS_WIDE_METHODS = {"addHandler", "removeHandler", "setLevel", "add_signal_handler"}
PROCESS_WIDE_NAMES = {  # assigned to
    "sys.excepthook", "threading.excepthook", "sys.stdout", "sys.stderr", "sys.stdin",
    "sys.breakpointhook", "sse_starlette.sse.AppStatus.should_exit",
}  # fmt: skip
# The uses that stay outside cli.py, each counted, and why. Any other fails the test below.
PROCESS_WIDE_ELSEWHERE = {
    # ``python -m agenthold``: the exit status that main() returns (from the front or cli.py)
    ("__main__", "sys.exit"): 1,
    # ``agenthold hook ...`` (a fresh process on every edit) ends with os._exit once its
    # databases are closed and its output flushed: the teardown cost it 5-15 ms. hooks.end is
    # called by __main__ alone, for the process that is the hook's own
    ("hooks", "os._exit"): 1,
    # a warm call forwards SIGTERM and SIGINT to its warm server, and a second one ends it. That
    # path imports front.py alone: going through cli.py would add its imports (about 17 ms,
    # argparse and dataclasses among them) to every warm call.
    ("serve.front", "signal.signal"): 3,
    # the forked warm server leaves its caller's session, and its children end with os._exit
    # (never returning into the caller's stack): the process is the warm server's own
    ("serve.warm", "os.setsid"): 1,
    ("serve.warm", "os._exit"): 2,
    # ... and holds its stop signals back from its first instruction until the receiver cli.py
    # hands it is listening (a SIGTERM in between would end it with its pid file left behind)
    ("serve.warm", "signal.pthread_sigmask"): 2,
    # sse-starlette's class-wide "close every stream" flag, put back to its import-time value
    # each time HTTP is served (a second server in one process, as in the tests, would
    # otherwise close its streams at once): in its compatibility module, with the other
    # private parts agenthold relies on
    ("serve.compat.sse", "sse_starlette.sse.AppStatus.should_exit"): 1,
}


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def process_wide_uses(module: str) -> list[str]:
    """What ``agenthold/<module>.py`` does to the whole process, one entry per use, found in
    its syntax tree (so a comment or a docstring that names a call is not one)."""
    tree = ast.parse(_source(module))
    aliases = {}  # from signal import signal as s: s is signal.signal
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname})
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func, aliases)
            if name in PROCESS_WIDE_CALLS:
                uses.append(name)
            elif isinstance(node.func, ast.Attribute) and node.func.attr in PROCESS_WIDE_METHODS:
                uses.append(f".{node.func.attr}")
        elif isinstance(node, ast.Raise) and node.exc is not None:
            if _dotted(node.exc, aliases) == "SystemExit":  # raise SystemExit, uncalled
                uses.append("SystemExit")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            uses += [n for t in targets if (n := _dotted(t, aliases)) in PROCESS_WIDE_NAMES]
    return sorted(uses)


def test_only_the_command_line_changes_the_whole_process() -> None:
    """Logging's set-up, exit status, signal handlers, the garbage collector, limits: cli.py's
    alone (issue 12), so that a library user or a test that serves in-process keeps its own. The
    transports and the warm server are handed what they need (the signal source, the logging
    set-up for the warm server's handler, the garbage collector's freeze as ``ready``)."""
    found: dict[tuple[str, str], int] = {}
    for module in [*MODULES, "__main__"]:
        if module != "cli.main":
            for use in process_wide_uses(module):
                found[module, use] = found.get((module, use), 0) + 1
    assert found == PROCESS_WIDE_ELSEWHERE
    assert not {module for module, _ in found} & SERVING
    # the check sees what cli.py does, so an empty result above means something
    assert {"logging.basicConfig", ".addHandler", "signal.signal", "resource.setrlimit",
            "gc.freeze", "SystemExit", "anyio.open_signal_receiver"} <= set(
        process_wide_uses("cli.main"))  # fmt: skip


def _source(module: str) -> str:
    return module_path(module).read_text()


VENDORED = PACKAGE.parent / "vendor" / "agenthold_store.py"


def _store_file_builder() -> Any:
    spec = importlib.util.spec_from_file_location(
        "build_store_file", PACKAGE.parent / "tools" / "build_store_file.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_one_file_store_is_current_and_imports_the_standard_library_only() -> None:
    """vendor/agenthold_store.py is what tools/build_store_file.py makes of today's modules
    (run it after changing the store or agenthold/db/), and needs nothing but the standard
    library."""
    assert VENDORED.read_text(encoding="utf-8") == _store_file_builder().build(), (
        "vendor/agenthold_store.py is not current: run python tools/build_store_file.py"
    )
    tree = ast.parse(VENDORED.read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert outside_stdlib(imported) == set()
    assert set(agenthold.store.__all__) <= {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
    } | {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


def test_the_one_file_store_copied_alone_works_where_agenthold_is_not_installed(
    tmp_path: Path,
) -> None:
    shutil.copy(VENDORED, tmp_path / "agenthold_store.py")
    script = (
        "import sys, threading\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import agenthold_store as store\n"
        "try:\n"
        "    import agenthold\n"
        "    raise SystemExit('agenthold is importable: this run proves nothing')\n"
        "except ImportError:\n"
        "    pass\n"
        f"s = store.StateStore({str(tmp_path / 'copied.db')!r})\n"
        "v = s.set('ns', 'k', {'n': 1}, updated_by='me', expected_version=0).version\n"
        "try:\n"
        "    s.set('ns', 'k', {'n': 2}, updated_by='me', expected_version=0)\n"
        "except store.ConflictError as e:\n"
        "    print(v, e.detail['actual_version'], isinstance(e, store.AgentholdError))\n"
        "other = store.StateStore(s.path)  # a second store, as another process would open it\n"
        "writer = threading.Thread(target=other.set, args=('ns', 'k', {'n': 3}),\n"
        "                          kwargs={'updated_by': 'you', 'expected_version': 1})\n"
        "writer.start()\n"
        "seen = s.watch('ns', 'k', since_version=1, timeout=60)\n"
        "writer.join()\n"
        "print(seen.version, seen.value['n'], seen.updated_by)\n"
        "print([h.version for h in s.history('ns', 'k')])\n"
        "print(sorted(m for m in sys.modules if m.startswith('agenthold')))\n"
        "other.close()\n"
        "s.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-I", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "1 1 True",
        "2 3 you",
        "[2, 1]",
        "['agenthold_store']",
    ]


@pytest.mark.usefixtures("no_child_coverage")  # coverage itself loads what is counted
def test_opening_a_sqlite_store_loads_no_change_feed_watcher_or_postgres(tmp_path: Path) -> None:
    """The edit hook is a fresh process per edit: opening a SQLite file read/write, reading and
    writing must not import the change feed, the file watchers (ctypes), PostgreSQL's backend,
    logging (nothing was logged) or uuid (a new id is made only for a new file); a first watch
    loads the feed."""
    agenthold.store.StateStore(tmp_path / "made.db").close()
    script = (
        "import sys\n"
        "from agenthold.store import StateStore\n"
        f"s = StateStore({str(tmp_path / 'made.db')!r})\n"
        "s.set('ns', 'k', 1, updated_by='me'); s.get('ns', 'k')\n"
        "late = ('ctypes', 'uuid', 'logging', 'psycopg', 'agenthold.db.feed',\n"
        "        'agenthold.db.watch', 'agenthold.db.sqlite_feed', 'agenthold.db.postgres')\n"
        "print([m for m in late if m in sys.modules])\n"
        "s.watch('ns', 'k', since_version=0, timeout=1)\n"
        "print([m for m in late if m in sys.modules])\n"
        "s.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.splitlines()
    assert before == "[]"
    assert {"agenthold.db.feed", "agenthold.db.sqlite_feed"} <= set(ast.literal_eval(after))


def test_the_package_root_loads_its_names_lazily_and_gives_the_installed_version() -> None:
    script = (
        "import sys, agenthold\n"
        "before = sorted(m for m in sys.modules if m.startswith('agenthold.'))\n"
        "from agenthold import StateStore, ConflictError, InvalidInputError\n"
        "import agenthold.store as st\n"
        "print(before, StateStore is st.StateStore, ConflictError is st.ConflictError,\n"
        "      issubclass(InvalidInputError, ValueError), 'mcp' in sys.modules)\n"
        "print(agenthold.__version__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "[] True True True False"  # nothing loaded until asked; no mcp
    assert second == distribution_version("agenthold")


def test_the_documented_exceptions_module_re_exports_the_stores_own_classes() -> None:
    for name in ("AgentholdError", "ConflictError", "NotFoundError", "BusyError"):
        assert getattr(agenthold.exceptions, name) is getattr(agenthold.store, name)
    assert issubclass(agenthold.exceptions.InvalidInputError, agenthold.exceptions.AgentholdError)
    assert issubclass(agenthold.exceptions.InvalidInputError, ValueError)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        agenthold.Nope  # noqa: B018


def test_the_command_line_knows_every_tool_set_of_the_catalogue_and_takes_a_comma_list() -> None:
    from agenthold.cli import main as cli
    from agenthold.serve import tools

    assert tuple(tools.TOOL_SETS) == cli.TOOL_SET_NAMES
    args = cli.build_parser().parse_args(["--tools", "advanced, standard"])
    assert args.tools == "advanced,standard"
    assert tools.parse_tool_sets(args.tools) == ("advanced", "standard")
    assert cli.build_parser().parse_args([]).tools == tools.DEFAULT_TOOLS
    for bad in ("standard,standard", "standard,", "bus"):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["--tools", bad])


def test_every_package_the_code_imports_is_declared_with_bounds() -> None:
    text = (PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8")
    block = text[text.index("dependencies = [") : text.index("]", text.index("dependencies = ["))]
    declared = {
        re.split(r"[<>=!~]", line.strip().strip('",'))[0]: line
        for line in block.splitlines()[1:]
        if line.strip().startswith('"')
    }
    # the optional PostgreSQL backend's packages come with the extra agenthold[postgres]
    extra = text[text.index("postgres = [") : text.index("\n", text.index("postgres = ["))]
    for spec in re.findall(r'"([^"]+)"', extra):
        declared[re.split(r"[<>=!~\[]", spec)[0]] = spec
    imported = set()
    for module in MODULES:
        imported |= {n.split(".")[0] for n in outside_stdlib(imported_modules(module))}
    imported -= {"agenthold"}
    distributions = {name.replace("_", "-") for name in imported}
    assert distributions <= set(declared), distributions - set(declared)
    for name in distributions:
        assert ">=" in declared[name] and "<" in declared[name], declared[name]


def test_the_claims_modules_import_no_private_name_of_each_other() -> None:
    """SQL belongs to claims/schema.py (public names) or to the one module that runs it, so no
    module of the room reaches into another's private constants or helpers."""
    for module in ALL_MODULES:
        if not module.startswith("claims"):
            continue
        tree = ast.parse(module_path(module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "agenthold.claims"
            ):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{module} imports {private} from {node.module}"
