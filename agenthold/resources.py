"""agenthold 0.10's names for workspaces and resource names, kept importable.

0.10 had its own module for these (``Workspace``, ``WorkspaceRegistry``, ``ResourceId``,
``parse_resource_input``). 0.11 names resources in :mod:`agenthold.claims.names`, and this module
maps the old names onto it rather than keeping a second set of rules: a name parsed here is the name
the server would give the same text, symlinks, Unicode normalisation and nested workspaces
included. What differs from 0.10 is listed in docs/upgrading.md (roots are absolute paths of
this host; case folding is one choice per registry, not per workspace; error wording).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from agenthold.claims.names import _SEPARATOR_RE, Resolver
from agenthold.claims.names import Workspace as _Workspace
from agenthold.store import InvalidInputError

__all__ = [
    "DEFAULT_WORKSPACE_NAME",
    "ResourceId",
    "Workspace",
    "WorkspaceRegistry",
    "parse_resource_input",
]

DEFAULT_WORKSPACE_NAME = "default"
"""The workspace a bare path resolves in when several are configured."""


def _platform_case_sensitive() -> bool:
    return sys.platform not in ("darwin", "win32")


class Workspace(_Workspace):
    """A workspace as 0.10 spelled it: :class:`agenthold.claims.names.Workspace` plus whether its
    file names are case-sensitive (by default: not on macOS and Windows)."""

    __slots__ = ("case_sensitive",)
    __match_args__ = ("name", "root", "case_sensitive")

    case_sensitive: bool

    def __init__(self, name: str, root: str, case_sensitive: bool | None = None) -> None:
        if case_sensitive is None:
            case_sensitive = _platform_case_sensitive()
        object.__setattr__(self, "case_sensitive", case_sensitive)
        super().__init__(name, root)

    def _fields(self) -> tuple[object, ...]:
        return (self.name, self.root, self.case_sensitive)

    def __repr__(self) -> str:
        return (
            f"Workspace(name={self.name!r}, root={self.root!r}, "
            f"case_sensitive={self.case_sensitive!r})"
        )

    def fold(self, path: str) -> str:
        """``path`` as this workspace compares it."""
        return path if self.case_sensitive else path.casefold()


@dataclass(frozen=True, slots=True)
class ResourceId:
    """0.10's parsed resource: ``scope`` "file" (with ``workspace`` and a relative ``path``) or
    "custom" (``path`` is the name, ``workspace`` None)."""

    scope: str
    workspace: str | None
    path: str

    def to_uri(self) -> str:
        """The canonical URI: ``file://<workspace>/<path>`` or ``custom://<name>``."""
        if self.scope == "file":
            return f"file://{self.workspace}/{self.path}"
        if self.scope == "custom":
            return f"custom://{self.path}"
        raise InvalidInputError(f"unknown resource scope {self.scope!r}; use 'file' or 'custom'")

    def __str__(self) -> str:
        return self.to_uri()


class WorkspaceRegistry(Resolver):
    """0.10's registry of workspaces: a :class:`~agenthold.claims.names.Resolver` over them, with
    0.10's lookups. At least one workspace is required (0.10 had no implicit default). A
    :class:`Workspace` of this module carries ``case_sensitive``; the workspaces of one registry
    must agree on it, because 0.11 folds case per resolver."""

    def __init__(self, workspaces: Sequence[_Workspace]) -> None:
        chosen = list(workspaces)
        if not chosen:
            raise InvalidInputError("a WorkspaceRegistry needs at least one workspace")
        flags = {ws.case_sensitive for ws in chosen if isinstance(ws, Workspace)}
        if len(flags) > 1:
            raise InvalidInputError(
                "the workspaces of one registry must all be case-sensitive or all not; "
                "agenthold folds case for all of a server's workspaces alike"
            )
        super().__init__(chosen, case_insensitive=(not flags.pop()) if flags else None)

    def get(self, name: str) -> _Workspace | None:
        """The workspace called ``name``, or None."""
        return self._by_name.get(name)

    def require(self, name: str) -> _Workspace:
        """The workspace called ``name``; InvalidInputError naming the configured ones if none."""
        found = self._by_name.get(name)
        if found is None:
            names = ", ".join(repr(ws.name) for ws in self.workspaces)
            raise InvalidInputError(f"unknown workspace {name!r}; configured workspaces: {names}")
        return found

    def default_for_bare_paths(self) -> _Workspace | None:
        """The workspace a bare relative path resolves in: the one named "default", else the
        only one, else None (bare paths are then refused)."""
        return self._bare

    def longest_match(self, abs_path: str) -> tuple[_Workspace, str] | None:
        """The workspace whose root holds ``abs_path`` (the deepest root wins) and the rest of
        the path after that root ("" for the root itself), or None if no root holds it."""
        drive, rest = os.path.splitdrive(abs_path)
        segments = [part for part in _SEPARATOR_RE.split(rest) if part]
        folded = tuple(self._fold(part) for part in segments)
        for anchor in self._anchors:  # deepest root first
            depth = len(anchor.segments)
            if anchor.drive == drive.lower() and folded[:depth] == anchor.segments:
                return anchor.workspace, "/".join(folded[depth:])
        return None


def parse_resource_input(raw: object, registry: Resolver) -> ResourceId:
    """Canonicalise ``raw`` as ``registry`` does (:meth:`agenthold.claims.names.Resolver.resolve`)
    and return it as a :class:`ResourceId`. Raises InvalidInputError (a ValueError) on bad input."""
    resource = registry.resolve(raw)  # type: ignore[arg-type]  # it refuses a non-string
    if resource.kind == "custom":
        return ResourceId(scope="custom", workspace=None, path=resource.uri[len("custom://") :])
    assert resource.path is not None
    return ResourceId(scope="file", workspace=resource.workspace, path=resource.path)
