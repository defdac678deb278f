"""The package's shape: what may import what, the one-file store, and the public API.

store.py is meant to be copied into other projects, and uris.py and auth.py promise the standard
library only; these tests read each module's imports with ``ast`` and run the copied store in an
interpreter that cannot see the installed package (``-S``: no site-packages).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from importlib.metadata import version as distribution_version
from pathlib import Path

import pytest

import agenthold
import agenthold.exceptions
import agenthold.store

PACKAGE = Path(agenthold.__file__).parent
STDLIB = set(sys.stdlib_module_names)


def imported_modules(module: str) -> set[str]:
    """The top-level names of every module ``agenthold/<module>.py`` imports, anywhere in it
    (functions included), and the agenthold submodules it takes from."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "agenthold":  # from agenthold import x: x may be a submodule
                found.update(
                    f"agenthold.{alias.name}"
                    for alias in node.names
                    if (PACKAGE / f"{alias.name}.py").exists()
                )
    return found


def outside_stdlib(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] not in STDLIB and n != "__future__"}


@pytest.mark.parametrize(
    "module", ["store", "uris", "auth", "message_types", "messages", "inspect", "cli", "front"]
)
def test_a_module_that_promises_the_standard_library_imports_nothing_else(module: str) -> None:
    allowed = {
        "store": set(),
        "uris": {"agenthold.store"},
        "auth": set(),
        "message_types": {"agenthold.store", "agenthold.claims"},
        "messages": {"agenthold.store", "agenthold.claims", "agenthold.message_types"},
        "inspect": {
            "agenthold",
            "agenthold.store",
            "agenthold.claims",
            "agenthold.messages",
            "agenthold.uris",
        },
        "cli": {
            "agenthold",
            "agenthold.inspect",
            "agenthold.store",
            "agenthold.claims",
            "agenthold.uris",
            "agenthold.auth",
            "agenthold.server",  # only to serve, inside main()
            "agenthold.front",
            "agenthold.warm",  # only to leave a warm server, inside main()
        },
        "front": {"agenthold.cli"},  # only when no warm server takes the call
    }[module]
    assert outside_stdlib(imported_modules(module)) <= allowed


def test_only_server_imports_mcp_and_imports_flow_one_way() -> None:
    for module in (
        "store",
        "uris",
        "claims",
        "message_types",
        "messages",
        "auth",
        "inspect",
        "cli",
        "exceptions",
        "front",
    ):
        mcp_like = {n for n in imported_modules(module) if n.split(".")[0] in ("mcp", "uvicorn")}
        assert not mcp_like, f"{module} imports {mcp_like}"
    assert "mcp" in {n.split(".")[0] for n in imported_modules("server")}
    claims_imports = {n for n in imported_modules("claims") if n.startswith("agenthold")}
    assert claims_imports <= {"agenthold.store", "agenthold.uris"}
    server_imports = {n for n in imported_modules("server") if n.startswith("agenthold.")}
    assert "agenthold.inspect" not in server_imports
    warm_imports = {n for n in imported_modules("warm") if n.startswith("agenthold.")}
    assert warm_imports <= {
        "agenthold.front",
        "agenthold.server",
        "agenthold.cli",
        "agenthold.claims",
    }


def test_store_py_copied_alone_works_where_agenthold_is_not_installed(tmp_path: Path) -> None:
    shutil.copy(PACKAGE / "store.py", tmp_path / "store.py")
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import store\n"
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
        "s.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-I", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.split() == ["1", "1", "True"]


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
