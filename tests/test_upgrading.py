"""docs/upgrading.md and the packaging files tell the truth.

Each 0.11 spelling in docs/upgrading.md's table is run here against a real store; server.json
(the MCP registry's description of the package) must name the package's own version and the
README's mcp-name line; docs/store.md's retry loop runs as printed, first on a key that does not
exist yet, then against a rival writer.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from support import REPO, in_process_client, reply_of, run_agenthold, write_0_10_database

from agenthold.cli.main import TOOL_SET_NAMES, _tool_sets
from agenthold.store import (
    MAX_KEY_LENGTH,
    MAX_NAMESPACE_LENGTH,
    ConflictError,
    DeleteResult,
    Export,
    InvalidInputError,
    NamespaceInfo,
    NotFoundError,
    StateStore,
)


def test_the_tables_0_11_spellings_behave_as_documented(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        StateStore()  # type: ignore[call-arg]
    store = StateStore(tmp_path / "up.db")
    assert store.path == str(tmp_path / "up.db")
    with pytest.raises(TypeError):
        store.set("ns", "k", 1, "writer")  # type: ignore[misc]
    first = store.set("ns", "k", 1, updated_by="writer")
    assert first.previous_version == 0
    record = store.get("ns", "k")
    assert isinstance(record.updated_at, str) and record.updated_at.endswith("+00:00")
    assert record.to_dict()["value"] == 1
    with pytest.raises(ConflictError) as conflict:
        store.set("ns", "k", 2, updated_by="other", expected_version=7)
    assert isinstance(conflict.value.detail, dict)
    assert conflict.value.detail["actual_version"] == 1
    assert conflict.value.detail["actual_updated_by"] == "writer"
    assert conflict.value.current == record
    assert [n.namespace for n in store.list_namespaces()] == ["ns"]
    assert all(isinstance(n, NamespaceInfo) for n in store.list_namespaces())
    entry = store.history("ns", "k")[0]
    assert not hasattr(entry, "namespace") and entry.event_type == "write"
    exported = store.export("ns")
    assert isinstance(exported, Export) and exported.record_count == 1
    assert [(i.record.key, len(i.history)) for i in exported.records] == [("k", 1)]
    deleted = store.delete("ns", "k", deleted_by="writer")
    assert isinstance(deleted, DeleteResult) and deleted.deleted_version == 1
    assert deleted.version == 2 == store.history("ns", "k")[0].version  # the tombstone's own
    with pytest.raises(NotFoundError):
        store.delete("ns", "k", deleted_by="writer")
    assert store.set("ns", "k", 3, updated_by="writer").version == 3  # versions never repeat
    assert store.clear_namespace("ns", deleted_by="writer") == ["k"]
    with pytest.raises(ValueError):
        store.set("ns", "k", float("nan"), updated_by="writer")
    assert issubclass(InvalidInputError, ValueError)
    assert not hasattr(store, "export_namespace")
    store.close()


def test_a_0_10_namespace_of_its_longest_length_stays_usable(tmp_path: Path) -> None:
    """0.10 took namespaces and keys of up to 512 characters; 0.11 keeps that for namespaces
    (and takes keys up to 1,024), so every call reaches what a 0.10 database holds."""
    ns, key = "n" * 512, "k" * 512
    write_0_10_database(tmp_path / "old.db", [(ns, key)])
    with StateStore(tmp_path / "old.db") as store:
        assert [n.namespace for n in store.list_namespaces()] == [ns]
        assert store.get(ns, key).value == 1
        assert store.set(ns, key, 2, updated_by="w", expected_version=1).version == 2
        assert [h.version for h in store.history(ns, key)] == [2, 1]
        assert store.export(ns).record_count == 1
        assert store.delete(ns, key, deleted_by="w").deleted_version == 2
        store.set(ns, "k2", 1, updated_by="w")
        assert store.clear_namespace(ns, deleted_by="w") == ["k2"]
        with pytest.raises(InvalidInputError, match="the limit is 512"):
            store.set(ns + "n", "k", 1, updated_by="w")
    assert (MAX_NAMESPACE_LENGTH, MAX_KEY_LENGTH) == (512, 1024)
    assert "namespaces up to 512 characters (as in 0.10)" in UPGRADING


def test_a_0_10_file_opens_read_only_once_imported_and_a_damaged_value_is_one_keys(
    tmp_path: Path,
) -> None:
    import sqlite3

    from agenthold.store import DamagedRecordError, IncompatibleDatabaseError

    write_0_10_database(tmp_path / "old.db", [("ns", "a"), ("ns", "b")])
    with pytest.raises(IncompatibleDatabaseError, match=r"0\.10"):
        StateStore(tmp_path / "old.db", read_only=True)
    StateStore(tmp_path / "old.db").close()  # the import
    with sqlite3.connect(tmp_path / "old.db") as raw:  # a value another tool damaged
        raw.execute("UPDATE state SET value = '{not json' WHERE key = 'a'")
    raw.close()
    with StateStore(tmp_path / "old.db", read_only=True) as store:
        with pytest.raises(DamagedRecordError) as damaged_one:
            store.list_keys("ns")
        assert isinstance(damaged_one.value, ValueError)
        damaged: list[DamagedRecordError] = []
        assert [r.key for r in store.list_keys("ns", damaged=damaged)] == ["b"]
        assert [d.key for d in damaged] == ["a"]


ODD_0_10_NAMES = [
    (" ", "k"),
    ("line\nbreak", "k"),
    ("ok", "a\nb"),
    ("ok", "\u202etxt"),
    ("ok", "fine"),
]


def test_0_10_names_that_0_11_refuses_are_reported_at_import_and_cleared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """0.10 checked names only for emptiness, NUL and length: a blank namespace or a key with a
    newline is imported as it is, named in one warning, listed, and removed by
    clear_namespace; every other call, and any new write, still refuses such a name."""
    write_0_10_database(tmp_path / "state.db", ODD_0_10_NAMES)
    with caplog.at_level("WARNING", logger="agenthold.store"), StateStore(tmp_path / "state.db"):
        pass
    (warning,) = [r.getMessage() for r in caplog.records if "0.10" in r.getMessage()]
    assert "namespaces ' ', 'line\\nbreak'; keys 'a\\nb' in 'ok', '\\u202etxt' in 'ok'." in warning
    assert "clear_namespace" in warning and "docs/upgrading.md" in warning
    with StateStore(tmp_path / "state.db") as store:
        assert [n.namespace for n in store.list_namespaces()] == [" ", "line\nbreak", "ok"]
        odd_keys = ["a\nb", "fine", "\u202etxt"]
        assert [r.key for r in store.list_keys("ok")] == odd_keys
        assert [i.record.key for i in store.export("ok").records] == odd_keys
        shown = run_agenthold(tmp_path, "namespaces", "--json")  # the inspector
        assert [n["namespace"] for n in json.loads(shown.stdout)] == [" ", "line\nbreak", "ok"]
        with pytest.raises(InvalidInputError, match="control character"):
            store.get("line\nbreak", "k")
        with pytest.raises(InvalidInputError, match="control character"):
            store.delete("ok", "a\nb", deleted_by="w")
        assert store.clear_namespace(" ", deleted_by="w") == ["k"]
        assert store.clear_namespace("ok", deleted_by="w") == odd_keys
        # a refused name that holds nothing is refused here too, and new writes always are
        for gone in (" ", "never\twritten"):
            with pytest.raises(InvalidInputError):
                store.clear_namespace(gone, deleted_by="w")
        with pytest.raises(InvalidInputError, match="control character"):
            store.set("line\nbreak", "k2", 1, updated_by="w")
        assert [n.namespace for n in store.list_namespaces()] == ["line\nbreak"]


@pytest.mark.anyio
async def test_agenthold_clear_namespace_removes_a_0_10_namespace_0_11_refuses(
    tmp_path: Path,
) -> None:
    from agenthold.claims import Coordinator

    write_0_10_database(tmp_path / "old.db", ODD_0_10_NAMES)
    with StateStore(tmp_path / "old.db") as store:
        async with in_process_client(Coordinator(store), tools="advanced") as (_, client):
            args = {"namespace": "line\nbreak", "deleted_by": "w"}
            done = reply_of(await client.call_tool("agenthold_clear_namespace", args))
            assert (done["status"], done["deleted_keys"]) == ("ok", ["k"])
            again = reply_of(await client.call_tool("agenthold_clear_namespace", args))
            assert again["error"] == "invalid_input" and "control character" in again["message"]


# --- the MCP registry --------------------------------------------------------------------------


PYPROJECT = (REPO / "pyproject.toml").read_text(encoding="utf-8")  # no tomllib on Python 3.10


def package_version() -> str:
    match = re.search(r'^version = "([^"]+)"$', PYPROJECT, re.MULTILINE)
    assert match is not None
    return match.group(1)


def test_server_json_names_the_packages_version_and_the_readmes_mcp_name() -> None:
    server = json.loads((REPO / "server.json").read_text(encoding="utf-8"))
    assert server["$schema"] == (
        "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
    )
    assert server["version"] == package_version()
    (package,) = server["packages"]
    assert (package["registryType"], package["identifier"]) == ("pypi", "agenthold")
    assert package["version"] == package_version()
    assert package["transport"] == {"type": "stdio"}
    assert re.fullmatch(r"io\.github\.[A-Za-z0-9-]+/agenthold", server["name"])
    assert 1 <= len(server["description"]) <= 100  # the registry's limit
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"mcp-name: {server['name']}" in readme  # how the registry checks a PyPI package
    for argument in package["packageArguments"]:
        assert argument["name"] in ("--workspace", "--tools")
    assert [v["name"] for v in package["environmentVariables"]] == ["AGENTHOLD_DB"]


def test_server_json_says_this_version_is_not_published_and_how_to_install_it() -> None:
    """Until a release is on PyPI (which has only 0.10.0, broken with mcp 2.x), server.json
    advertises no runner that would fetch the package from there, and its publisher note says
    so and gives install lines the README documents for a checkout."""
    server = json.loads((REPO / "server.json").read_text(encoding="utf-8"))
    (package,) = server["packages"]
    assert "runtimeHint" not in package and "runtimeArguments" not in package
    note = server["_meta"]["io.modelcontextprotocol.registry/publisher-provided"]
    assert note["published"] is False
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for line in ("pipx install /path/to/checkout", "uvx --from /path/to/checkout agenthold"):
        assert line in note["install"] and f"`{line}`" in readme, line
    assert "0.10.0" in note["install"]
    # the package's own description names the bus, as server.json's does
    described = re.search(r'^description = "([^"]+)"$', PYPROJECT, re.MULTILINE)
    assert described is not None and "message bus" in described.group(1)


# What a named argument of the 2025-12-11 server.json schema may hold (its NamedArgument: Input,
# InputWithVariables and its own fields); the registry refuses a file with other keys.
NAMED_ARGUMENT_KEYS = {
    "type", "name", "description", "isRequired", "isRepeated", "format", "value", "isSecret",
    "default", "placeholder", "choices", "variables",
}  # fmt: skip


def test_server_jsons_tools_argument_offers_what_the_cli_accepts() -> None:
    """--tools takes any of cli.TOOL_SET_NAMES, or a comma list of them: the registry's
    "choices" would make a client offer one name alone (it once offered standard and advanced
    only), so there are none; the description names every set, and the default and the
    placeholder are values the CLI itself accepts. The server's description names the bus."""
    server = json.loads((REPO / "server.json").read_text(encoding="utf-8"))
    assert "message bus" in server["description"]
    (package,) = server["packages"]
    for argument in package["packageArguments"]:
        assert set(argument) <= NAMED_ARGUMENT_KEYS, argument["name"]
        assert argument["type"] == "named"
    (tools,) = [a for a in package["packageArguments"] if a["name"] == "--tools"]
    assert "choices" not in tools
    for name in TOOL_SET_NAMES:
        assert name in tools["description"], name
    assert "comma list" in tools["description"]
    assert _tool_sets(tools["default"]) == tools["default"] == "standard"
    assert _tool_sets(tools["placeholder"]) == tools["placeholder"]
    assert "," in tools["placeholder"]


def test_project_urls_and_the_changelog_exist() -> None:
    urls = PYPROJECT.split("[project.urls]\n", 1)[1].split("\n\n", 1)[0]
    names = {line.split(" = ", 1)[0] for line in urls.splitlines()}
    assert {"Homepage", "Repository", "Issues", "Changelog"} <= names
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## " + package_version().split(".dev")[0] in changelog


# --- the retry loop of docs/store.md --------------------------------------------------------------


def retry_loop_source() -> str:
    page = (REPO / "docs" / "store.md").read_text(encoding="utf-8")
    section = page.split("\n### The retry loop", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


def run_retry_loop(store: StateStore, think_hard: Any, apply: Any) -> None:
    exec(retry_loop_source(), {"store": store, "think_hard": think_hard, "apply": apply})


def test_the_readmes_retry_loop_works_on_its_first_run(tmp_path: Path) -> None:
    with StateStore(tmp_path / "loop.db") as store:
        run_retry_loop(store, lambda value: 100, lambda plan, value: (value or 0) + plan)
        assert store.get("campaign", "budget").value == 100  # the key did not exist
        run_retry_loop(store, lambda value: 50, lambda plan, value: (value or 0) + plan)
        assert store.get("campaign", "budget").value == 150


def test_the_readmes_retry_loop_retries_after_a_rival_write(tmp_path: Path) -> None:
    with StateStore(tmp_path / "loop.db") as store:
        rival_wrote = threading.Event()

        def think_hard(value: Any) -> int:
            # Another agent creates the key while this one thinks.
            store.set("campaign", "budget", 1000, updated_by="rival", expected_version=0)
            rival_wrote.set()
            return 10

        run_retry_loop(store, think_hard, lambda plan, value: (value or 0) + plan)
        assert rival_wrote.is_set()
        assert store.get("campaign", "budget").value == 1010  # built on the rival's value
        assert [h.updated_by for h in store.history("campaign", "budget")] == ["planner", "rival"]


# 0.10's names, where 0.10 had them (docs/upgrading.md, first section)
OLD_NAMES = {
    "agenthold": [
        "DEFAULT_WORKSPACE_NAME",
        "BusyError",
        "ConflictError",
        "Coordinator",
        "NotFoundError",
        "ResourceId",
        "SetResult",
        "StateRecord",
        "StateRecordHistory",
        "StateStore",
        "Workspace",
        "WorkspaceRegistry",
    ],
    "agenthold.models": ["ConflictDetail", "SetResult", "StateRecord", "StateRecordHistory"],
    "agenthold.resources": [
        "DEFAULT_WORKSPACE_NAME",
        "ResourceId",
        "Workspace",
        "WorkspaceRegistry",
        "parse_resource_input",
    ],
    "agenthold.coordinator": ["Coordinator"],
    "agenthold.exceptions": ["AgentholdError", "BusyError", "ConflictError", "NotFoundError"],
}


@pytest.mark.parametrize("module", sorted(OLD_NAMES))
def test_every_name_0_10_exported_imports_from_where_0_10_had_it(module: str) -> None:
    import importlib

    loaded = importlib.import_module(module)
    for name in OLD_NAMES[module]:
        assert getattr(loaded, name) is not None, f"{module}.{name}"


def test_the_old_names_are_the_0_11_classes() -> None:
    import agenthold
    from agenthold import models, store
    from agenthold.claims import coordinator as claims

    assert models.StateRecord is store.Record
    assert models.StateRecordHistory is store.HistoryEntry
    assert agenthold.Coordinator is claims.Coordinator
    assert agenthold.StateRecord is store.Record
    assert agenthold.DEFAULT_WORKSPACE_NAME == "default"


def test_a_conflict_detail_has_the_keys_its_typed_dict_names(tmp_path: Path) -> None:
    from agenthold.models import ConflictDetail

    store = StateStore(tmp_path / "c.db")
    store.set("ns", "k", 1, updated_by="a")
    with pytest.raises(ConflictError) as caught:
        store.set("ns", "k", 2, updated_by="b", expected_version=5)
    assert set(caught.value.detail) == set(ConflictDetail.__annotations__)


def test_a_0_10_coordinator_call_works_with_a_registered_agent(tmp_path: Path) -> None:
    from agenthold.claims.records import NotHolderError, UnknownAgentError
    from agenthold.coordinator import Coordinator
    from agenthold.resources import Workspace, WorkspaceRegistry, parse_resource_input

    registry = WorkspaceRegistry([Workspace(name="default", root=str(tmp_path))])
    coordinator = Coordinator(StateStore(tmp_path / "c.db"), registry, 60)  # 0.10's positionals
    assert coordinator.claim_ttl == 60
    assert coordinator.registry is registry is coordinator.resolver  # 0.10's read-only property
    with pytest.raises(AttributeError):
        coordinator.registry = registry  # type: ignore[misc]
    with pytest.raises(UnknownAgentError):
        coordinator.claim("src/a.py", "agent-a")  # 0.10's library took any string
    agent_id = coordinator.register("builder").agent_id
    assert coordinator.agent(agent_id).name == "builder"  # is_registered
    granted = coordinator.claim("src/a.py", agent_id)
    assert (granted.status, granted.resource) == ("claimed", "file://default/src/a.py")
    other = coordinator.register("r" * 128, "m" * 128).agent_id  # the longest name and model
    with pytest.raises(InvalidInputError, match="limit is 128"):
        coordinator.register("r" * 129)
    assert len(agent_id) == len("agent-") + 16
    busy = coordinator.claim("src/a.py", other)
    assert busy.holder is not None and busy.holder.agent_id == agent_id  # 0.10's held_by
    with pytest.raises(NotHolderError) as not_holder:  # 0.10 returned an error dict
        coordinator.release("src/a.py", other)
    assert not_holder.value.held_by == agent_id
    coordinator.release("src/a.py", agent_id)
    assert coordinator.status("src/a.py").previous is None  # a plain release is not reported
    coordinator.claim("src/a.py", agent_id)
    assert coordinator.status("src/a.py").status == "claimed"  # interpret_state
    rid = parse_resource_input("src/a.py", coordinator.resolver)  # canonicalize
    assert rid.to_uri() == coordinator.resolver.resolve("src/a.py").uri == granted.resource
    # deactivate_agent, both ways
    assert coordinator.release_all(agent_id) == ["file://default/src/a.py"]
    assert coordinator.status("src/a.py").status == "available"
    coordinator.claim("src/a.py", agent_id)
    coordinator.end_lease(agent_id, 0)
    ended = coordinator.status("src/a.py")
    assert ended.status == "available" and ended.previous is not None
    assert ended.previous.outcome == "abandoned"


def test_a_workspace_registry_resolves_as_the_server_does(tmp_path: Path) -> None:
    from agenthold.claims.names import Resolver
    from agenthold.claims.names import Workspace as PlainWorkspace
    from agenthold.resources import ResourceId, Workspace, WorkspaceRegistry, parse_resource_input

    outer, inner = tmp_path / "outer", tmp_path / "outer" / "inner"
    inner.mkdir(parents=True)
    spellings = [Workspace(name="outer", root=str(outer)), Workspace(name="inner", root=str(inner))]
    registry = WorkspaceRegistry(spellings)
    plain = Resolver([PlainWorkspace(name=w.name, root=w.root) for w in spellings])
    for text in ("file://outer/inner/x.py", f"{inner}/x.py", "file://outer/a//b.py", "custom://T"):
        assert parse_resource_input(text, registry).to_uri() == plain.resolve(text).uri
    assert parse_resource_input("custom://T", registry) == ResourceId("custom", None, "T")
    assert str(ResourceId("file", "w", "a.py")) == "file://w/a.py"
    with pytest.raises(InvalidInputError, match="unknown resource scope"):
        ResourceId("bogus", None, "x").to_uri()
    # 0.10's lookups
    assert registry.get("inner") == spellings[1] and registry.get("nope") is None
    assert registry.require("outer") == spellings[0]
    with pytest.raises(InvalidInputError, match="unknown workspace 'nope'"):
        registry.require("nope")
    assert registry.default_for_bare_paths() is None  # two workspaces, none named "default"
    assert registry.longest_match(f"{inner}/sub/x.py") == (spellings[1], "sub/x.py")
    assert registry.longest_match(str(outer)) == (spellings[0], "")
    assert registry.longest_match(f"{tmp_path}/elsewhere") is None
    with pytest.raises(InvalidInputError, match="bare path"):
        parse_resource_input("x.py", registry)
    with pytest.raises(InvalidInputError, match="must be a string"):
        parse_resource_input(7, registry)


def test_a_workspace_registry_refuses_what_0_10_refused_and_mixed_case_rules() -> None:
    from agenthold.resources import Workspace, WorkspaceRegistry

    with pytest.raises(InvalidInputError, match="at least one workspace"):
        WorkspaceRegistry([])
    with pytest.raises(InvalidInputError, match="configured twice"):
        WorkspaceRegistry([Workspace(name="d", root="/a"), Workspace(name="d", root="/b")])
    with pytest.raises(InvalidInputError, match="not an absolute path"):
        Workspace(name="p", root="relative/path")
    with pytest.raises(InvalidInputError, match="is not valid"):
        Workspace(name="bad name", root="/abs")
    with pytest.raises(InvalidInputError, match="all be case-sensitive or all not"):
        WorkspaceRegistry(
            [
                Workspace(name="a", root="/a", case_sensitive=True),
                Workspace(name="b", root="/b", case_sensitive=False),
            ]
        )
    folding = WorkspaceRegistry([Workspace(name="default", root="/p", case_sensitive=False)])
    assert (
        folding.case_insensitive
        and not WorkspaceRegistry(
            [Workspace(name="default", root="/p", case_sensitive=True)]
        ).case_insensitive
    )
    assert folding.resolve("Src/A.py").uri == "file://default/src/a.py"
    assert Workspace(name="w", root="/p", case_sensitive=False).fold("ABC") == "abc"
    assert Workspace(name="w", root="/p", case_sensitive=True).fold("ABC") == "ABC"


# Every public name of 0.10.0's modules, as released (read from its sources): each must import
# from where 0.10 had it, or be a row of docs/upgrading.md's table of what is gone.
ZERO_TEN_PUBLIC = {
    "agenthold": ["__version__", *OLD_NAMES["agenthold"]],
    "agenthold.coordinator": ["AGENT_OUTCOMES", "ALL_OUTCOMES", "Coordinator"],
    "agenthold.exceptions": ["AgentholdError", "ConflictError", "NotFoundError", "BusyError"],
    "agenthold.inspector": [
        "CLAIMS_NAMESPACE",
        "AGENTS_NAMESPACE",
        "register_subcommands",
        "run",
    ],
    "agenthold.models": ["StateRecord", "StateRecordHistory", "SetResult", "ConflictDetail"],
    "agenthold.notifier": ["KeyNotifier"],
    "agenthold.resources": [
        "DEFAULT_WORKSPACE_NAME",
        "Workspace",
        "ResourceId",
        "WorkspaceRegistry",
        "parse_resource_input",
    ],
    "agenthold.server": [
        "coordination_instructions",
        "COORDINATION_INSTRUCTIONS",
        "make_server",
        "build_http_app",
        "main",
    ],
    "agenthold.store": ["SCHEMA", "StateStore"],
}
UPGRADING = (REPO / "docs" / "upgrading.md").read_text(encoding="utf-8")
GONE_ROW = re.compile(r"^\| `(from [\w.]+ import \w+)` \| `(from [\w.]+ import [\w, ]+)`", re.M)


def runs(statement: str) -> bool:
    """Whether ``statement`` (an import) runs in a fresh namespace; False on ImportError."""
    try:
        exec(statement, {})  # the doc's own import lines
    except ImportError:
        return False
    return True


def test_every_public_name_of_0_10_imports_where_it_was_or_the_doc_says_what_replaced_it() -> None:
    gone = dict(GONE_ROW.findall(UPGRADING.split("## The Python API")[0]))
    assert gone, "the table of what is gone was not found"
    for module, names in ZERO_TEN_PUBLIC.items():
        for name in names:
            line = f"from {module} import {name}"
            if line in gone:
                assert not runs(line), f"the doc says {line!r} fails, but it imports"
                assert runs(gone[line]), f"the doc's replacement {gone[line]!r} does not import"
            else:
                assert runs(line), f"{line!r} fails and the doc does not say what replaced it"
    assert set(gone) <= {f"from {m} import {n}" for m, ns in ZERO_TEN_PUBLIC.items() for n in ns}


def test_0_10s_outcome_sets_keep_their_meaning() -> None:
    from agenthold.claims import LAPSE_OUTCOMES, OUTCOMES
    from agenthold.coordinator import AGENT_OUTCOMES, ALL_OUTCOMES

    assert {"released", "modified", "created", "deleted", "moved"} == AGENT_OUTCOMES
    assert set(OUTCOMES) == AGENT_OUTCOMES
    assert AGENT_OUTCOMES | {"abandoned", "expired"} == ALL_OUTCOMES
    assert set(OUTCOMES + LAPSE_OUTCOMES) == ALL_OUTCOMES
