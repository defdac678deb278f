"""Faces that load their names on first use: a subpackage's ``__init__.py`` lists which module
defines each public name (its ``_LAZY`` table) and takes its module ``__getattr__`` from here.

A face must be cheap to import: the edit hook and the front of every ``agenthold`` call go
through several of them, and an eager face would load a whole room (and, for serve/, mcp) for
one name. The table stays in the face, as plain strings, so tests/test_package.py can count a
face's imports without running it.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: every face loads this
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def loader(face: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of the face named ``face``: a name of ``table`` is imported
    from its module, kept in the face (so the next lookup is a plain attribute) and returned."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(table[name]), name)
        setattr(sys.modules[face], name, value)
        return value

    return __getattr__
