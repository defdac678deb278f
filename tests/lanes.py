"""The test lanes: which tests are PostgreSQL, subprocess and benchmark-smoke tests, decided at
collection from what each test uses, so that a new test lands in its lane without anyone
remembering to mark it.

- ``postgres``: a test parametrised on the PostgreSQL backend (a fixture parameter
  "postgresql": ``backend``, ``bus``, ...) or one that uses the throwaway cluster
  (``pg_cluster``, through ``pg_url`` or otherwise).
- ``subprocess``: a test that starts a process: it uses the ``stdio_path`` fixture (stdio and
  warm servers), or its code, or that of a fixture it uses, refers to what starts one
  (``subprocess``, ``sys.executable``, ``os.fork``, the SDK's stdio client), directly or
  through the functions and classes of tests/ and bench/ it calls (support.py's
  ``StdioPipes``, ``run_agenthold``, a module's own server class, a torture scenario, ...).
- ``bench``: a test that runs a benchmark script's quick run (its code passes ``--quick``).

The look at a test's code is by name, not by running it: a test that refers to a process
helper on a path it never takes is still a subprocess test (the lane is then slower, never
wrong). What it cannot see (a process started by agenthold's own code, or by an object
handed in from elsewhere) is marked by hand, ``@pytest.mark.subprocess`` or a module's
``pytestmark``; ``slow`` is only ever given by hand (the package-install tests, and the
few that take seconds in one process). Nothing of conftest.py or pgserver.py is looked into:
the cluster's own processes make a test a PostgreSQL test, not a subprocess one.
"""

from __future__ import annotations

import dis
import functools
import inspect
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
LANES = ("slow", "postgres", "subprocess", "bench")
# The developer's lane: everything not in one of LANES (README.md, "Development").
FAST = " and ".join(f"not {lane}" for lane in LANES)

# Names whose use in a test's code means it starts a process: modules and calls of the
# standard library (``sys.executable`` is seen as the attribute ``executable``) and the SDK's
# stdio client, which starts its server itself.
STARTS_A_PROCESS = frozenset(
    {
        "subprocess",
        "Popen",
        "executable",
        "fork",
        "forkpty",
        "posix_spawn",
        "posix_spawnp",
        "execv",
        "execve",
        "system",
        "multiprocessing",
        "open_process",
        "run_process",
        "create_subprocess_exec",
        "create_subprocess_shell",
        "stdio_client",
        "StdioServerParameters",
    }
)
PROCESS_FIXTURES = frozenset({"stdio_path"})  # conftest.py's, which the look passes over
BENCH_FLAG = "--quick"
NOT_LOOKED_INTO = frozenset({"conftest", "pgserver", "lanes"})


# The folders whose code is followed: tests/ (its helpers too) and bench/, whose torture
# scenarios the stress tests call (they start the processes).
_FOLDERS = tuple(str(folder) + os.sep for folder in (TESTS, TESTS.parent / "bench"))


@functools.cache
def _followed(module: types.ModuleType) -> bool:
    """Whether ``module`` is one of _FOLDERS' (but those not looked into)."""
    path = getattr(module, "__file__", None)
    if path is None or module.__name__ in NOT_LOOKED_INTO:
        return False
    return os.path.abspath(path).startswith(_FOLDERS)


def _ours(obj: Any) -> bool:
    """Whether ``obj`` is a function or class of a followed module."""
    module = inspect.getmodule(obj)
    return module is not None and _followed(module)


def _codes(obj: Any) -> Iterator[types.CodeType]:
    """The code objects of a function (its nested functions and lambdas too), or of every
    method of a class and of its bases in the followed folders."""
    if isinstance(obj, type):
        for cls in obj.__mro__:
            if _ours(cls):
                for member in vars(cls).values():
                    for attr in (member, getattr(member, "__func__", None)):
                        if isinstance(attr, types.FunctionType):
                            yield from _codes(attr)
                    if isinstance(member, property):
                        for accessor in (member.fget, member.fset, member.fdel):
                            if accessor is not None:
                                yield from _codes(accessor)
        return
    code = getattr(inspect.unwrap(obj), "__code__", None)
    stack = [code] if isinstance(code, types.CodeType) else []
    while stack:
        code = stack.pop()
        yield code
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


class Uses:
    """What a function refers to, transitively through the functions and classes of the
    followed folders it names: every name and every string constant. Cached by object: a
    helper shared by a hundred tests is read once."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[frozenset[str], frozenset[str]]] = {}

    def of(self, obj: Any) -> tuple[frozenset[str], frozenset[str]]:
        """(names, strings) that ``obj`` refers to."""
        key = id(obj)
        if key in self._seen:
            return self._seen[key]
        self._seen[key] = (frozenset(), frozenset())  # a cycle of helpers ends here
        names: set[str] = set()
        strings: set[str] = set()
        namespace = _namespace(obj)
        for code in _codes(obj):
            names.update(code.co_names)
            strings.update(c for c in code.co_consts if isinstance(c, str))
            for found in _called(code, namespace):
                more_names, more_strings = self.of(found)
                names |= more_names
                strings |= more_strings
        self._seen[key] = (frozenset(names), frozenset(strings))
        return self._seen[key]


def _namespace(obj: Any) -> dict[str, Any]:
    if isinstance(obj, type):
        return vars(inspect.getmodule(obj) or types.ModuleType("none"))
    return getattr(inspect.unwrap(obj), "__globals__", {})


def _called(code: types.CodeType, namespace: dict[str, Any]) -> Iterator[Any]:
    """The followed functions and classes that ``code`` names: globals (``run_agenthold``)
    and attributes of followed modules it names (``support.run_agenthold``,
    ``torture.run_crash``) and names it imports from one that is loaded (``from support
    import ...`` inside a test), read from its instructions so that an attribute of anything else
    (``thread.run``) is not taken for a module's function of that name."""
    module = imported = None
    for instruction in dis.get_instructions(code):
        found = None
        name = str(instruction.argval)
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            found = namespace.get(name)
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and module is not None:
            found = getattr(module, name, None)
        elif instruction.opname == "IMPORT_NAME":  # an import inside the function
            imported = sys.modules.get(name)
            found = imported
        elif instruction.opname == "IMPORT_FROM" and imported is not None and _followed(imported):
            found = getattr(imported, name, None)
        module = found if isinstance(found, types.ModuleType) and _followed(found) else None
        if isinstance(found, (type, types.FunctionType)) and _ours(found):
            yield found


def lanes_of(item: pytest.Item, uses: Uses) -> set[str]:
    """The lanes ``item`` belongs to by what it uses (LANES but ``slow``)."""
    found: set[str] = set()
    fixtures = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    if "pg_cluster" in fixtures or any(p == "postgresql" for p in params if isinstance(p, str)):
        found.add("postgres")
    if fixtures & PROCESS_FIXTURES:
        found.add("subprocess")
    names: set[str] = set()
    strings: set[str] = set()
    code = [getattr(item, "obj", None)]
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    code += [defs[-1].func for name, defs in definitions.items() if name in fixtures and defs]
    for obj in code:
        if obj is not None and _ours(inspect.unwrap(obj)):
            more_names, more_strings = uses.of(obj)
            names |= more_names
            strings |= more_strings
    if names & STARTS_A_PROCESS:
        found.add("subprocess")
    if BENCH_FLAG in strings:
        found.add("bench")
    return found


def assign(items: list[pytest.Item]) -> None:
    """Mark every item with the lanes it belongs to (marks given by hand stay)."""
    uses = Uses()
    for item in items:
        have = {mark.name for mark in item.iter_markers()}
        for lane in sorted(lanes_of(item, uses) - have):
            item.add_marker(getattr(pytest.mark, lane))
