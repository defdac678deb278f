"""bench/ uses agenthold as any other program does: through its public faces only.

A benchmark that imports a private name (``_GET``, ``_pg``) or a module behind a face
(``agenthold.claims.queue``) measures a house that may be rebuilt under it, and breaks when it
is. So every file under bench/ is parsed (ast, not imported: some need PostgreSQL or a browser)
and each import of agenthold is checked: the module is a face, and no imported name starts with
``_``. A raw baseline writes its SQL itself (bench/harness.py says why).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PACKAGE = ROOT / "agenthold"

# The top-level modules users import by name (0.10's paths and the documented ones); the other
# faces are the package root and each subpackage's __init__.py.
TOP_LEVEL_FACES = {
    "store",
    "messages",
    "server",
    "models",
    "resources",
    "coordinator",
    "exceptions",
    "retention",
}


def faces() -> set[str]:
    """The dotted names of agenthold's public faces."""
    found = {"agenthold"} | {f"agenthold.{name}" for name in TOP_LEVEL_FACES}
    for init in PACKAGE.rglob("__init__.py"):
        parts = init.parent.relative_to(ROOT).parts
        if "static" not in parts:
            found.add(".".join(parts))
    return found


def is_module(dotted: str) -> bool:
    """Whether ``agenthold...`` names a module or subpackage of this checkout."""
    path = ROOT / dotted.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def violations(source: str, known_faces: set[str]) -> list[str]:
    """What in ``source`` reaches past agenthold's faces: a module that is not a face, or a
    name that starts with ``_``, imported from agenthold (also through importlib)."""
    found: list[tuple[int, str]] = []

    def check_module(name: str, line: int) -> None:
        if name.split(".")[0] != "agenthold":
            return
        if any(part.startswith("_") for part in name.split(".")):
            found.append((line, f"line {line}: private module {name}"))
        elif name not in known_faces:
            found.append((line, f"line {line}: {name} is not a public face"))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check_module(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "agenthold":
                continue
            check_module(node.module, node.lineno)
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if alias.name.startswith("_"):
                    found.append((node.lineno, f"line {node.lineno}: private name {sub}"))
                elif is_module(sub):  # from agenthold.serve import stdio: a module, not a name
                    check_module(sub, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", ""))
            in ("import_module", "__import__")
        ):
            check_module(node.args[0].value, node.lineno)
    return [text for _, text in sorted(found)]


BENCH_FILES = sorted(BENCH.rglob("*.py"))


# Scripts another script starts as its child, with arguments of its own: not a command line
# a person runs, so not the harness's.
CHILDREN = {"perf/mcp_bench_server.py", "torture/workers.py", "torture/loris.py"}


def harness_options_used(source: str) -> bool:
    """Whether ``source`` builds its command line with the harness's ``options``."""
    tree = ast.parse(source)
    imported = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "harness"
        and any(alias.name == "options" for alias in node.names)
        for node in ast.walk(tree)
    )
    called = any(
        isinstance(node, ast.Call) and getattr(node.func, "id", "") == "options"
        for node in ast.walk(tree)
    )
    return imported and called


def test_bench_is_split_into_performance_and_torture_around_one_harness() -> None:
    assert (BENCH / "harness.py").exists()
    assert {p.parent.name for p in BENCH_FILES if p.name != "harness.py"} == {"perf", "torture"}


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in BENCH_FILES
        if '__name__ == "__main__"' in p.read_text(encoding="utf-8")
        and str(p.relative_to(BENCH)) not in CHILDREN
    ],
    ids=lambda p: str(p.relative_to(BENCH)),
)
def test_every_script_a_person_runs_takes_the_harness_options(path: Path) -> None:
    """--quick, --full, --json and --output FILE, from bench/harness.py's one parser."""
    assert harness_options_used(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", BENCH_FILES, ids=lambda p: str(p.relative_to(BENCH)))
def test_a_bench_file_imports_only_public_faces_and_no_private_name(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8"), faces()) == []


def test_the_check_catches_a_private_name_a_module_behind_a_face_and_a_lazy_import() -> None:
    bad = "\n".join(
        [
            "from agenthold.store import _GET",
            "from agenthold.claims.queue import QUEUE",
            "from agenthold.serve import stdio",
            "import agenthold.db.postgres",
            "importlib.import_module('agenthold.bus.schema')",
            "from agenthold.claims import Coordinator, _held",
        ]
    )
    assert violations(bad, faces()) == [
        "line 1: private name agenthold.store._GET",
        "line 2: agenthold.claims.queue is not a public face",
        "line 3: agenthold.serve.stdio is not a public face",
        "line 4: agenthold.db.postgres is not a public face",
        "line 5: agenthold.bus.schema is not a public face",
        "line 6: private name agenthold.claims._held",
    ]
    good = "\n".join(
        [
            "import agenthold.store",
            "from agenthold import StateStore, cli, serve",
            "from agenthold.claims import Coordinator",
            "from agenthold.serve import ToolSpec",
            "import mcp.types",
        ]
    )
    assert violations(good, faces()) == []


def test_the_harness_options_take_one_size_and_finish_writes_the_results_where_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("bench_harness", BENCH / "harness.py")
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    parser = harness.options("A bench.\n\nMore.")
    args = parser.parse_args(["--quick", "--output", str(tmp_path / "out.json")])
    assert (args.quick, args.full, args.json) == (True, False, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--quick", "--full"])
    capsys.readouterr()
    harness.finish(args, {"rate": 5}, lambda results: f"rate {results['rate']}")
    assert capsys.readouterr().out == "rate 5\n"
    assert json.loads((tmp_path / "out.json").read_text()) == {"rate": 5}
    harness.finish(parser.parse_args(["--json"]), {"rate": 5}, None)
    assert json.loads(capsys.readouterr().out) == {"rate": 5}
