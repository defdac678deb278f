"""Canonical resource names: one physical resource, one name.

Agents name a resource as a bare path, an absolute path, ``file://<workspace>/<path>`` or
``custom://<name>``; :class:`Resolver` turns every spelling of one resource into one
:class:`Resource`. Input is NFC-normalised, "/" and "\\" both separate path segments, "." and ".."
segments are rejected rather than collapsed, and percent-escapes are never decoded, so a canonical
URI resolves to itself.

``Resource.uri`` is what agents see and carries the workspace name. ``Resource.key``, the identity
claims are keyed on, carries the realpath of the workspace root instead: two processes sharing one
database may give one name (say "default") to different directories, and must not share claims on
different files. So one root under two names is one key, and one name over two roots is two keys,
even though both show agents the same uri.

A file resource is the file it resolves to. When its path (or a prefix of it) exists, symlinks in
the file and every parent are followed, and the resource is named where it ends up: inside some
workspace (its uri and key then name the resolved path, so every alias of one file is one claim),
or nowhere, which is refused, so a link inside a workspace cannot reach ``/etc``. A file that
exists also carries ``file_id`` (device and inode), which claims compare so that hard links to one
file share a claim; ``Resolver.names_of`` finds a file's other names by a bounded walk of the
workspaces, only for a file of several links, so that a claim scope can judge each of them. A
path that does not exist yet is named as written; if it later becomes a
symlink, later calls resolve through the link, and a claim taken earlier stays on the name it was
taken under (docs/claims.md says what that means for its holder).
"""

from __future__ import annotations

import functools
import os
import re
import stat
import sys
import unicodedata

from agenthold.store import INVISIBLE as _INVISIBLE
from agenthold.store import InvalidInputError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Literal

__all__ = [
    "MAX_INPUT_LENGTH",
    "WORKSPACE_NAME_RE",
    "Resolver",
    "Resource",
    "Walk",
    "Workspace",
    "default_workspace",
]

MAX_INPUT_LENGTH = 1024
"""Longest resource name accepted, in characters, once surrounding whitespace is stripped."""

WORKSPACE_NAME_RE: re.Pattern[str] = re.compile(r"[A-Za-z0-9_-]+")
"""What a workspace name may be; match it with ``fullmatch``."""

_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_SEPARATOR_RE = re.compile(r"[/\\]")
_CONTROL = r"[\x00-\x1f\x7f-\x9f]"
_SURROGATE = r"[\ud800-\udfff]"  # not encodable as UTF-8, so never storable


@functools.cache
def _refused(which: str) -> re.Pattern[str]:
    """A control character, an unpaired surrogate, or either or an invisible character
    (store._INVISIBLE), compiled on first use: a name of printable ASCII, the usual kind, is
    clean without them (see _clean), and the edit hook starts a process per edit."""
    if which == "any":
        return re.compile(_CONTROL[:-1] + _SURROGATE[1:] + "|" + _INVISIBLE.pattern)
    return re.compile(_CONTROL if which == "control" else _SURROGATE)


RESOURCE_HINT = (
    "Name the resource as a path relative to the workspace (src/main.py), an absolute path "
    "inside a workspace, file://<workspace>/<path>, or custom://<name> for things that are "
    "not files."
)
NAMES_SEARCHED = 100_000
"""Directory entries ``Resolver.names_of`` looks at, at most, for the other names of a file."""
_NAMES_KEPT = 4096  # names as written whose resolution a Resolver keeps (see _named)
_SHOWN_LENGTH = 160  # characters of a bad input quoted back in an error message
_DOT_SEGMENTS = (
    "path traversal/dot segments are not allowed; give the path relative to the workspace root"
)


def _show(text: str) -> str:
    """Quote ``text`` for an error message, cut short if it is long."""
    if len(text) <= _SHOWN_LENGTH:
        return repr(text)
    return f"{text[:_SHOWN_LENGTH]!r}..."


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _names(workspaces: Sequence[Workspace]) -> str:
    return ", ".join(repr(ws.name) for ws in workspaces)


class Workspace:
    """A named directory that file resources live in.

    ``root`` is absolute. Build one with :meth:`parse`, which also normalises the root and checks
    that it is an existing directory. Immutable, compared and hashed by name and root (as a
    frozen dataclass would be; written out, as Resource is).
    """

    __slots__ = ("name", "root")
    __match_args__ = ("name", "root")

    name: str
    root: str

    def __init__(self, name: str, root: str) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "root", root)
        self._check()

    def _check(self) -> None:
        for field, value in (("name", self.name), ("root", self.root)):
            if not isinstance(value, str):
                raise InvalidInputError(
                    f"workspace {field} must be a string, got {type(value).__name__}"
                )
        if not WORKSPACE_NAME_RE.fullmatch(self.name):
            raise InvalidInputError(
                f"workspace name {self.name!r} is not valid; use letters, digits, '_' and '-'"
            )
        if not os.path.isabs(self.root):
            raise InvalidInputError(
                f"workspace root {self.root!r} is not an absolute path; use Workspace.parse, "
                "which resolves a relative path against the current directory"
            )

    def _fields(self) -> tuple[object, ...]:
        return (self.name, self.root)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Workspace)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, root={self.root!r})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a Workspace is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: a Workspace is immutable")

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle, past __setattr__
        return (type(self), self._fields())

    @classmethod
    def parse(cls, spec: str, *, cwd: str | None = None) -> Workspace:
        """Parse ``name=path`` or an absolute path (named after its last directory).

        A relative path is made absolute against ``cwd`` (default: the current directory) and the
        result is normalised lexically (symlinks are kept). Raises InvalidInputError if the spec
        is malformed, the name is not valid, or the root is not an existing directory.
        """
        if not spec:
            raise InvalidInputError(
                "workspace spec is empty; use name=path or an absolute directory path"
            )
        name, equals, path = spec.partition("=")
        if equals and not _SEPARATOR_RE.search(name):
            if not WORKSPACE_NAME_RE.fullmatch(name):
                raise InvalidInputError(
                    f"workspace name {name!r} in {spec!r} is not valid; "
                    "use letters, digits, '_' and '-', as in name=path"
                )
            if not path:
                raise InvalidInputError(
                    f"workspace spec {spec!r} has no path; use name=path, e.g. {name}=/path/to/dir"
                )
        elif os.path.isabs(spec):
            name, path = "", spec
        else:
            raise InvalidInputError(
                f"workspace spec {spec!r} is neither name=path nor an absolute path; "
                f"use name=path, e.g. app={spec}"
            )
        root = os.path.abspath(os.path.join(cwd or os.getcwd(), path))
        if not name:
            name = os.path.basename(root)
            if not WORKSPACE_NAME_RE.fullmatch(name):
                raise InvalidInputError(
                    f"cannot name workspace {spec!r} after its directory {name!r} "
                    "(a name is letters, digits, '_' and '-'); "
                    f"name it explicitly with name=path, e.g. app={root}"
                )
        if not os.path.isdir(root):
            raise InvalidInputError(
                f"workspace root {root!r} (from {spec!r}) is not an existing directory; "
                "create it or fix the path"
            )
        return cls(name=name, root=root)


def default_workspace(cwd: str | None = None) -> Workspace:
    """The workspace used when none is configured: "default" at ``cwd`` or the current directory."""
    return Workspace.parse("default=" + (cwd or os.getcwd()))


class Resource:
    """A resolved resource.

    ``uri`` is the canonical name shown to agents; ``key`` is the identity claims are keyed on (see
    the module docstring). ``workspace`` and ``path`` (relative, "/"-separated) are set for files
    and None for custom resources. ``file_id`` is "<device>:<inode>" of a file (not a directory)
    that existed when the name was resolved, else None; it is a fact about the disk at that
    moment, so it takes no part in comparing resources.

    Immutable, compared and hashed by its other fields, as a frozen dataclass would be; written
    out because making a dataclass costs a fresh process (the edit hook) more than its lookups.
    """

    __slots__ = ("file_id", "key", "kind", "path", "uri", "workspace")
    __match_args__ = ("uri", "key", "kind", "workspace", "path", "file_id")

    uri: str
    key: str
    kind: Literal["file", "custom"]
    workspace: str | None
    path: str | None
    file_id: str | None

    def __init__(
        self,
        uri: str,
        key: str,
        kind: Literal["file", "custom"],
        workspace: str | None,
        path: str | None,
        file_id: str | None = None,
    ) -> None:
        put = object.__setattr__
        put(self, "uri", uri)
        put(self, "key", key)
        put(self, "kind", kind)
        put(self, "workspace", workspace)
        put(self, "path", path)
        put(self, "file_id", file_id)

    def _compared(self) -> tuple[object, ...]:
        return (self.uri, self.key, self.kind, self.workspace, self.path)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Resource)
        return self._compared() == other._compared()

    def __hash__(self) -> int:
        return hash(self._compared())

    def __repr__(self) -> str:
        return (
            f"Resource(uri={self.uri!r}, key={self.key!r}, kind={self.kind!r}, "
            f"workspace={self.workspace!r}, path={self.path!r}, file_id={self.file_id!r})"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a Resource is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: a Resource is immutable")

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle, past __setattr__
        return (Resource, (self.uri, self.key, self.kind, self.workspace, self.path, self.file_id))


class Walk:
    """What one call has seen of the disk on the way to its files: each directory it looked at
    (its lstat, or None if missing), so that the files of a set that share directories cost one
    look at each. Make one per call and drop it after: the disk changes between calls."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: dict[str, os.stat_result | None] = {}


class _Anchor:
    """One spelling of a workspace root, split for matching absolute paths against it."""

    __slots__ = ("drive", "segments", "workspace")

    def __init__(self, drive: str, segments: tuple[str, ...], workspace: Workspace) -> None:
        self.drive = drive
        self.segments = segments
        self.workspace = workspace


class Resolver:
    """Turns the ways agents name a resource into one canonical :class:`Resource`.

    With no workspaces, a single "default" workspace at ``cwd`` (or the current directory) is
    used. ``case_insensitive`` says whether file paths match regardless of case; None follows
    the platform (True on macOS and Windows). Raises InvalidInputError on duplicate names.
    """

    def __init__(
        self,
        workspaces: Sequence[Workspace] = (),
        *,
        case_insensitive: bool | None = None,
        cwd: str | None = None,
    ) -> None:
        chosen = tuple(workspaces) or (default_workspace(cwd),)
        by_name: dict[str, Workspace] = {}
        for ws in chosen:
            if ws.name in by_name:
                raise InvalidInputError(
                    f"workspace name {ws.name!r} is configured twice "
                    f"({by_name[ws.name].root!r} and {ws.root!r}); give each workspace its own name"
                )
            by_name[ws.name] = ws
        if case_insensitive is None:
            case_insensitive = sys.platform in ("darwin", "win32")
        self._workspaces = chosen
        self._by_name = by_name
        self._case_insensitive = case_insensitive
        self._bare = by_name.get("default") or (chosen[0] if len(chosen) == 1 else None)
        self._names: dict[str, tuple[str, Resource]] = {}  # see _named
        self._key_prefixes: dict[str, str] = {}
        self._real_roots: dict[str, str] = {}
        self._walk_roots: dict[str, str] = {}  # each real root with one separator after it
        anchors: list[_Anchor] = []
        for ws in chosen:
            real = os.path.realpath(ws.root)
            self._real_roots[ws.name] = real
            self._walk_roots[ws.name] = real.rstrip(os.sep) + os.sep
            posix_real = _nfc(real).replace(os.sep, "/").rstrip("/")
            self._key_prefixes[ws.name] = self._fold(f"file://{posix_real}/")
            for spelling in dict.fromkeys((os.path.normpath(ws.root), real)):
                drive, rest = os.path.splitdrive(_nfc(spelling))
                segments = tuple(self._fold(s) for s in _SEPARATOR_RE.split(rest) if s)
                anchors.append(_Anchor(drive.lower(), segments, ws))
        # Longest root first; the stable sort keeps configuration order between equal lengths.
        anchors.sort(key=lambda anchor: -len(anchor.segments))
        self._anchors = tuple(anchors)
        # Workspaces whose roots lie inside another's (or equal it): a path of the outer one
        # that leads into an inner root is named in the inner workspace, as its absolute path
        # is (the longest root wins; between equal roots, the first configured), so that every
        # spelling of one file gives one URI. Deepest first.
        order = {ws.name: i for i, ws in enumerate(chosen)}
        nested: dict[str, list[tuple[tuple[str, ...], Workspace]]] = {}
        for outer in anchors:
            for inner in anchors:
                length = len(outer.segments)
                if (
                    inner.workspace.name != outer.workspace.name
                    and inner.drive == outer.drive
                    and inner.segments[:length] == outer.segments
                    and (
                        len(inner.segments) > length
                        or order[inner.workspace.name] < order[outer.workspace.name]
                    )
                ):
                    entry = (inner.segments[length:], inner.workspace)
                    found = nested.setdefault(outer.workspace.name, [])
                    if entry not in found:
                        found.append(entry)
        for found in nested.values():
            found.sort(key=lambda entry: -len(entry[0]))
        self._nested = nested

    @property
    def workspaces(self) -> tuple[Workspace, ...]:
        """The configured workspaces, in configuration order."""
        return self._workspaces

    @property
    def case_insensitive(self) -> bool:
        """Whether file paths match regardless of case (custom:// names never do)."""
        return self._case_insensitive

    def resolve(
        self, text: str, *, follow_links: bool = True, walk: Walk | None = None
    ) -> Resource:
        """Canonicalise a bare path, an absolute path, a file:// URI or a custom:// URI.

        With ``follow_links`` false, symbolic links are not followed and no ``file_id`` is
        read: the name as written, which a claim taken before a link appeared is keyed on.
        ``walk``, shared by the resolutions of one call, spares looking at a directory twice.

        Raises InvalidInputError, naming the input and what to do, when it is empty, too long,
        contains control characters or unpaired surrogates, has "." or ".." segments, names a
        workspace root, lies outside every workspace, names an unknown workspace or scheme, or
        is a malformed URI.
        """
        try:
            text, resource = self._named(text)
            if resource.kind == "file" and follow_links:
                resource = self._follow(resource, text, walk)
        except InvalidInputError as exc:
            exc.hint = exc.hint or RESOURCE_HINT
            raise
        if len(resource.uri) > MAX_INPUT_LENGTH:
            raise InvalidInputError(
                f"resource {_show(text)} would have a canonical URI of {len(resource.uri)} "
                f"characters; the limit is {MAX_INPUT_LENGTH}, use a shorter path or name"
            )
        return resource

    def resolve_both(
        self, text: str, *, walk: Walk | None = None
    ) -> tuple[Resource, Resource | InvalidInputError]:
        """``text`` as written (``follow_links=False``) and as resolved through its links, or
        the error resolving through them gives; in one pass over the text."""
        named = self.resolve(text, follow_links=False)
        if named.kind != "file":
            return named, named
        try:
            followed = self._follow(named, text.strip(), walk)
        except InvalidInputError as exc:
            exc.hint = exc.hint or RESOURCE_HINT
            return named, exc
        if len(followed.uri) > MAX_INPUT_LENGTH:
            return named, self.resolve(text)  # pragma: no cover - raises the length error
        return named, followed

    def names_of(self, resource: Resource, *, limit: int = NAMES_SEARCHED) -> list[str] | None:
        """Every path inside the workspaces that is a name of ``resource``'s file (hard links
        of it; its own path first), or None if they are not all found: the file has more
        links than the walk of the workspaces met within ``limit`` entries, or than lie inside
        them. A file of one link costs one stat; only a file of several walks the workspaces.
        A resource with no file (no ``file_id``) has only its own name."""
        own = None if resource.workspace is None else self.filesystem_path(resource)
        if own is None or resource.file_id is None:
            return [] if own is None else [own]
        try:
            found = os.stat(own)
        except (OSError, ValueError):  # pragma: no cover - removed since it was resolved
            return [own]
        if found.st_nlink <= 1:
            return [own]
        names = [own]
        seen = 0
        for real in dict.fromkeys(self._real_roots.values()):
            for directory, subdirectories, files in os.walk(real):  # links are not followed
                seen += len(subdirectories) + len(files)
                if seen > limit:
                    return None
                for name in files:
                    path = os.path.join(directory, name)
                    try:
                        there = os.lstat(path)
                    except OSError:  # pragma: no cover - removed during the walk
                        continue
                    same = (there.st_dev, there.st_ino) == (found.st_dev, found.st_ino)
                    if same and os.path.realpath(path) != os.path.realpath(own):
                        names.append(path)
                if len(names) >= found.st_nlink:
                    return names
        return None

    def filesystem_path(self, resource: Resource) -> str | None:
        """The absolute path on disk of a file resource; None for a custom resource.

        The resource's uri is resolved again first, so a Resource built by hand cannot point
        outside its workspace. On a case-insensitive resolver the path is in lower case.
        """
        checked = self.resolve(resource.uri)
        if checked.workspace is None or checked.path is None:
            return None
        root = self._by_name[checked.workspace].root
        return os.path.normpath(os.path.join(root, *checked.path.split("/")))

    def _follow(self, resource: Resource, text: str, walk: Walk | None = None) -> Resource:
        """The resource a file path resolves to on disk: symlinks of the file and its parents
        followed as far as the path exists, refused if that leads outside every workspace.

        The common case costs one lstat per segment below the workspace's real root (the
        directories ``walk`` has seen: none): a walk that meets no symlink already names the
        file; only one that meets a link resolves the whole path (os.path.realpath) and names
        it again."""
        assert resource.workspace is not None and resource.path is not None
        current = self._walk_roots[resource.workspace]
        *directories, name = resource.path.split("/")
        seen = None if walk is None else walk.seen
        for segment in directories:
            current += segment
            if seen is None:
                found = _lstat(current)
            elif current in seen:
                found = seen[current]
            else:
                found = seen[current] = _lstat(current)
            if found is None:  # missing (or unreadable): no link below this point
                return resource
            if stat.S_ISLNK(found.st_mode):
                return self._through_link(resource, text)
            current += os.sep
        found = _lstat(current + name)
        if found is None:
            return resource
        if stat.S_ISLNK(found.st_mode):
            return self._through_link(resource, text)
        return _with_file_id(resource, found)

    def _through_link(self, resource: Resource, text: str) -> Resource:
        assert resource.workspace is not None and resource.path is not None
        real = os.path.realpath(
            os.path.join(self._real_roots[resource.workspace], *resource.path.split("/"))
        )
        try:
            resource = self._resolve_absolute(text, real)
        except InvalidInputError:
            roots = ", ".join(repr(ws.root) for ws in self._workspaces)
            raise InvalidInputError(
                f"{_show(text)} resolves through a symbolic link to {real!r}, which is not "
                f"a file inside any workspace (roots: {roots}); a resource is the file a "
                "path leads to, so name files that lie inside a workspace"
            ) from None
        try:
            found = os.stat(real)
        except (OSError, ValueError):
            return resource
        return _with_file_id(resource, found)

    def _named(self, text: str) -> tuple[str, Resource]:
        """``text`` cleaned, and the resource it names as written (no link followed), kept:
        that part depends only on the text and this resolver's configuration, which never
        changes, while a claim resolves the same few names call after call. The disk is read
        again every time (``_follow``)."""
        found = self._names.get(text) if isinstance(text, str) else None
        if found is None:
            cleaned = self._clean(text)
            found = (cleaned, self._resolve(cleaned))
            if len(self._names) >= _NAMES_KEPT:  # a crude bound: start over
                self._names.clear()
            self._names[text] = found
        return found

    def _resolve(self, text: str) -> Resource:
        drive, rest = os.path.splitdrive(text)
        if drive or rest.startswith(("/", "\\")):
            return self._resolve_absolute(text, text)
        scheme = _SCHEME_RE.match(text)
        if scheme is None:
            return self._resolve_bare(text)
        remainder = text[scheme.end() :]
        match scheme.group(1).lower():
            case "file":
                return self._resolve_file_uri(text, remainder)
            case "custom":
                if not remainder:
                    raise InvalidInputError(f"{_show(text)} has no name; use custom://<name>")
                uri = "custom://" + remainder
                return Resource(uri=uri, key=uri, kind="custom", workspace=None, path=None)
            case other:
                raise InvalidInputError(
                    f"unsupported scheme {other!r} in {_show(text)}; use a path, "
                    "file://<workspace>/<path> or custom://<name>"
                )

    def _fold(self, text: str) -> str:
        """Lower-case ``text`` on a case-insensitive resolver (re-normalised, as lower() may
        decompose); leave it alone otherwise."""
        return _nfc(text.lower()) if self._case_insensitive else text

    @staticmethod
    def _clean(text: str) -> str:
        if not isinstance(text, str):
            raise InvalidInputError(
                f"a resource must be a string, not {type(text).__name__}; "
                "pass a path, file://<workspace>/<path> or custom://<name>"
            )
        text = text.strip()  # surrounding whitespace (a pasted newline too) is not part of it
        if not text:
            raise InvalidInputError(
                "resource is empty; pass a path, file://<workspace>/<path> or custom://<name>"
            )
        if len(text) > MAX_INPUT_LENGTH:
            raise InvalidInputError(
                f"resource {_show(text)} is {len(text)} characters long; "
                f"the limit is {MAX_INPUT_LENGTH}, use a shorter path or name"
            )
        if text.isascii() and text.isprintable():  # no control, surrogate or invisible one
            return text  # and its own NFC form
        if _refused("any").search(text) is None:
            return _nfc(text)
        control = _refused("control").search(text)
        if control is not None:
            raise InvalidInputError(
                f"resource {_show(text)} contains the control character {control.group()!r} "
                + ("(a null byte) " if control.group() == "\x00" else "")
                + f"at index {control.start()}; remove it"
            )
        surrogate = _refused("surrogate").search(text)
        if surrogate is not None:
            raise InvalidInputError(
                f"resource {_show(text)} contains the unpaired surrogate {surrogate.group()!r} "
                f"at index {surrogate.start()}; send valid Unicode text"
            )
        invisible = _INVISIBLE.search(text)
        assert invisible is not None  # what else _refused("any") matches
        raise InvalidInputError(
            f"resource {_show(text)} contains the invisible character "
            f"U+{ord(invisible.group()):04X} at index {invisible.start()} (a bidirectional "
            "control, zero-width space or line separator, which would let two different "
            "names look alike); name it without"
        )

    def _resolve_bare(self, text: str) -> Resource:
        if self._bare is None:
            raise InvalidInputError(
                f"bare path {_show(text)} is ambiguous: no workspace is named 'default' and "
                f"several are configured ({_names(self._workspaces)}); "
                "use file://<name>/<path> with one of them"
            )
        parts = _SEPARATOR_RE.split(text)
        if parts[0] == ".":  # a leading "./" is the one dot segment allowed
            parts = parts[1:]
        return self._file(self._bare, parts, text)

    def _resolve_file_uri(self, text: str, remainder: str) -> Resource:
        if not remainder:
            raise InvalidInputError(
                f"{_show(text)} has no workspace or path; use file://<workspace>/<path>"
            )
        separator = _SEPARATOR_RE.search(remainder)
        if separator is None:
            name, path = remainder, ""
        else:
            name, path = remainder[: separator.start()], remainder[separator.end() :]
        if not name:  # file:///absolute/path
            return self._resolve_absolute(text, remainder)
        ws = self._by_name.get(name)
        if ws is None:
            raise InvalidInputError(
                f"unknown workspace {name!r} in {_show(text)}; configured workspaces: "
                f"{_names(self._workspaces)}. Use file://<name>/<path> with one of them"
            )
        return self._file(ws, _SEPARATOR_RE.split(path), text)

    def _resolve_absolute(self, text: str, path: str) -> Resource:
        drive, rest = os.path.splitdrive(path)
        segments = _segments(_SEPARATOR_RE.split(rest), text)
        folded = tuple(self._fold(s) for s in segments)
        drive = drive.lower()
        for anchor in self._anchors:
            length = len(anchor.segments)
            if anchor.drive == drive and folded[:length] == anchor.segments:
                return self._file(anchor.workspace, segments[length:], text)
        roots = ", ".join(repr(ws.root) for ws in self._workspaces)
        raise InvalidInputError(
            f"path {_show(text)} is outside every workspace (roots: {roots}); "
            "give a path inside a workspace root, or a path relative to one"
        )

    def _file(self, ws: Workspace, parts: Sequence[str], text: str) -> Resource:
        segments = _segments(parts, text)
        nested = self._nested.get(ws.name)
        if segments and nested:
            folded = tuple(self._fold(s) for s in segments)
            for relative, inner in nested:
                if folded[: len(relative)] == relative:
                    return self._file(inner, segments[len(relative) :], text)
        if not segments:
            raise InvalidInputError(
                f"{_show(text)} names the root of workspace {ws.name!r}, not a file in it; "
                "give a path inside the workspace"
            )
        if segments[-1] != segments[-1].rstrip():
            raise InvalidInputError(
                f"{_show(text)}: the last path segment {segments[-1]!r} ends in whitespace, "
                "which a canonical URI cannot keep; remove the trailing whitespace"
            )
        path = self._fold("/".join(segments))
        return Resource(
            uri=f"file://{ws.name}/{path}",
            key=self._key_prefixes[ws.name] + path,
            kind="file",
            workspace=ws.name,
            path=path,
        )


def _with_file_id(resource: Resource, found: os.stat_result | None) -> Resource:
    """``resource`` with the device and inode of ``found``, unless that is a directory."""
    if found is None or stat.S_ISDIR(found.st_mode):
        return resource
    r = resource  # built directly: dataclasses.replace costs more than the lstat calls
    return Resource(r.uri, r.key, r.kind, r.workspace, r.path, f"{found.st_dev}:{found.st_ino}")


def _segments(parts: Sequence[str], text: str) -> list[str]:
    """Drop empty segments; reject "." and ".." ones."""
    segments = [part for part in parts if part]
    if "." in segments or ".." in segments:
        raise InvalidInputError(f"{_show(text)}: {_DOT_SEGMENTS}")
    return segments


def _lstat(path: str) -> os.stat_result | None:
    """``os.lstat(path)``, or None if there is nothing there (or it cannot be read)."""
    try:
        return os.lstat(path)
    except (OSError, ValueError):
        return None
