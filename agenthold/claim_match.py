"""Directory and glob claims: which names a pattern covers, and whether two patterns overlap.

A file resource written with a trailing ``/`` (``src/api/``) names a directory: the claim covers
every file beneath it. One with ``*``, ``?`` or ``[...]`` in a segment (``src/**/*.py``) is a
glob. Decisions behind it:
- Patterns work on canonical keys, segment by segment ("/"-separated): ``*`` is any run of
  characters within a segment (names starting with "." too), ``?`` one character, ``[abc]``,
  ``[a-z]`` and ``[!abc]`` a character class; ``**`` as a whole segment is zero or more
  segments. ``[*]`` is a literal ``*``. A directory ``d/`` is the glob ``d/*/**`` (one or more
  segments below d). ``custom://`` names are never patterns.
- The literal segments before the first wildcard are the pattern's *scope*, a directory key.
  A name can only match a pattern whose scope is one of its ancestors, so finding the patterns
  that may cover a file is an indexed lookup of its few ancestor directories, not a scan.
- Case rules and spellings come from the resolver: the scope is resolved like any path (links
  followed, workspace roots made real), and the rest is folded the way the resolver folds paths.
- Two patterns overlap if some name could match both. The check is exact for literal segments
  and ``**``; for two wildcard segments it compares their literal first and last characters, so
  it may report an overlap that no real name has (``a*b`` and ``a*c*b``...), never the reverse:
  a claim is refused in doubt, never granted over another.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

from agenthold.store import InvalidInputError
from agenthold.uris import Resolver, Resource, Walk

__all__ = [
    "Pattern",
    "ancestors",
    "covers_file",
    "held_pattern",
    "is_pattern",
    "overlaps",
    "parse_pattern",
    "resolve_target",
]

_WILD = re.compile(r"[*?\[]")
DEEP = "**"


@dataclass(frozen=True, slots=True)
class Pattern:
    """A directory or glob claim: ``uri`` as agents see it, ``key`` its claim identity, ``scope``
    the key of the directory it lies under (ends with "/"), ``rest`` its segments below that."""

    uri: str
    key: str
    kind: Literal["dir", "glob"]
    scope: str
    rest: tuple[str, ...]
    workspace: str | None = None

    @classmethod
    def from_key(cls, uri: str, key: str, scope: str) -> Pattern:
        """The pattern a claim row holds (its uri, key and scope columns)."""
        tail = key[len(scope) :]
        rest = tuple(s for s in tail.split("/") if s)
        if tail == "" or tail.endswith("/"):
            rest += ("*", DEEP)
        workspace = uri[len("file://") :].split("/", 1)[0] if uri.startswith("file://") else None
        return cls(uri, key, "dir" if tail == "" else "glob", scope, rest, workspace)

    def covers(self, key: str) -> bool:
        """Whether the file key ``key`` matches this pattern."""
        if not key.startswith(self.scope):
            return False
        return _regex(self.rest).fullmatch(key[len(self.scope) :]) is not None


@functools.lru_cache(maxsize=8192)
def held_pattern(uri: str, key: str, scope: str) -> Pattern:
    """``Pattern.from_key``, kept: a claim checks every held pattern above its file, and the
    same few hundred rows come back claim after claim."""
    return Pattern.from_key(uri, key, scope)


@functools.lru_cache(maxsize=8192)
def _file_matcher(key: str, scope: str) -> re.Pattern[str]:
    """The regex a file key below ``scope`` must fully match to be covered by pattern ``key``."""
    return _regex(Pattern.from_key("", key, scope).rest)


def covers_file(key: str, scope: str, file_key: str) -> bool:
    """Whether the held pattern with claim key ``key`` and ``scope`` covers ``file_key``: what
    ``Pattern.covers`` says, without building the pattern (one dict lookup when it is known)."""
    return (
        file_key.startswith(scope)
        and _file_matcher(key, scope).fullmatch(file_key, len(scope)) is not None
    )


def is_pattern(text: object) -> bool:
    """Whether a resource as typed is a directory or glob (not for custom:// names)."""
    return isinstance(text, str) and _is_pattern(text)


@functools.lru_cache(maxsize=4096)
def _is_pattern(text: str) -> bool:  # kept: a claim and its release ask it of the same names
    stripped = text.strip()
    if stripped.lower().startswith("custom://"):
        return False
    return stripped.endswith(("/", "\\")) or _WILD.search(stripped) is not None


PROBE = ".agenthold-scope"  # a name resolved inside a pattern's directory to find its key


def resolve_target(resolver: Resolver, text: str, walk: Walk | None = None) -> Resource | Pattern:
    """What ``text`` names: a directory or glob, or else a file or custom resource (``walk``:
    see ``Resolver.resolve``)."""
    if is_pattern(text):
        return parse_pattern(resolver, text)
    return resolver.resolve(text, walk=walk)


def parse_pattern(resolver: Resolver, text: str) -> Pattern:
    """Resolve a directory or glob as typed; InvalidInputError (with a hint) if it is bad."""
    stripped = text.strip()
    is_dir = stripped.endswith(("/", "\\"))
    segments = re.split(r"[/\\]", stripped.rstrip("/\\"))
    # the literal head: everything before the first segment with a wildcard
    first = next((i for i, s in enumerate(segments) if _WILD.search(s)), len(segments))
    head, tail = segments[:first], [s for s in segments[first:] if s]
    for segment in tail:
        if segment in (".", ".."):
            raise _bad(text, "'.' and '..' segments are not allowed")
        if DEEP in segment and segment != DEEP:
            raise _bad(text, "'**' must be a whole path segment, as in src/**/*.py")
        _check_classes(text, segment)
    # The directory's key and URI: those of a name inside it, less that name. Resolving the
    # name follows links in the directory's path and applies the workspace and case rules.
    head_text = "/".join(head)
    probe = resolver.resolve(f"{head_text}/{PROBE}" if head_text else PROBE)
    if probe.kind != "file" or probe.path is None:  # pragma: no cover - custom:// is literal
        raise _bad(text, "only file paths can be directories or globs")
    # PROBE as the resolver folds it. Not by resolving PROBE alone: a bare path needs a default
    # workspace, and with several workspaces and none named default every pattern was refused.
    name = _fold(resolver, PROBE)
    scope, uri_scope = probe.key[: -len(name)], probe.uri[: -len(name)]
    if is_dir and not tail and probe.path == name:
        raise _whole_workspace(text, probe.workspace, uri_scope)
    rest = tuple(_fold(resolver, s) for s in tail)
    shown = "/".join(rest)
    if is_dir:
        shown += "/" if shown else ""
        rest += ("*", DEEP)
    kind: Literal["dir", "glob"] = "dir" if is_dir and not tail else "glob"
    return Pattern(uri_scope + shown, scope + shown, kind, scope, rest, probe.workspace)


def _whole_workspace(text: str, workspace: str | None, uri_scope: str) -> InvalidInputError:
    """The error for a directory claim of a workspace's root ("./", "file://w/"). "." and the
    root without its slash name no file and were refused already (as 0.10 refused "./"); with
    the slash they would lock every file of the workspace, which a stray "./" should not do.
    "**" says "everything" on purpose and claims the same files."""
    error = InvalidInputError(
        f"{text!r} is the root of workspace {workspace!r}: claiming it would hold every file "
        f"in the workspace; to mean that, claim {uri_scope + DEEP!r}"
    )
    error.hint = (
        f"Claim the files or directories you will change (src/api/). To hold the whole "
        f"workspace on purpose, say so with the glob {uri_scope + DEEP}."
    )
    return error


def _fold(resolver: Resolver, text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    return unicodedata.normalize("NFC", text.lower()) if resolver.case_insensitive else text


def _bad(text: str, why: str) -> InvalidInputError:
    error = InvalidInputError(f"{text!r} is not a valid glob: {why}")
    error.hint = (
        "A directory claim ends with '/' (src/api/); a glob uses * (within a segment), ? (one "
        "character), [abc] or [a-z] (a character class) and ** (any number of directories)."
    )
    return error


def _check_classes(text: str, segment: str) -> None:
    i = 0
    while i < len(segment):
        if segment[i] == "[":
            end = segment.find("]", i + 2 if segment[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end < 0:
                raise _bad(text, f"the '[' in {segment!r} has no closing ']'")
            i = end
        i += 1


@functools.lru_cache(maxsize=4096)
def _regex(rest: tuple[str, ...]) -> re.Pattern[str]:
    parts: list[str] = []
    for n, segment in enumerate(rest):
        last, before_last = n == len(rest) - 1, n == len(rest) - 2
        if segment == DEEP:
            parts.append(".*" if last else "(?:[^/]+/)*")
        elif before_last and rest[-1] == DEEP:  # a/** is a and anything beneath it
            parts.append(_segment_regex(segment) + "(?:/.*)?")
            break
        else:
            parts.append(_segment_regex(segment) + ("" if last else "/"))
    return re.compile("".join(parts), re.DOTALL)


def _segment_regex(segment: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            start = i + 1
            negate = segment[start : start + 1] == "!"
            if negate:
                start += 1
            end = segment.find("]", start + 1)
            body = re.sub(r"([\\^\[&~|])", r"\\\1", segment[start:end])  # literal in a class
            out.append(f"[{'^/' if negate else ''}{body}]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def ancestors(key: str) -> list[str]:
    """The directory keys above a file key, each ending with "/" (the scopes that may cover it)."""
    cut = key.find("/", key.find("://") + 3)
    found: list[str] = []
    while cut >= 0:
        found.append(key[: cut + 1])
        cut = key.find("/", cut + 1)
    return found


def _segments_of(pattern: Pattern) -> tuple[str, ...]:
    """The pattern's whole path below the scheme, as segments (the scope's are literal)."""
    scope = pattern.scope[pattern.scope.find("://") + 3 :]
    return tuple(_escape(s) for s in scope.split("/") if s) + pattern.rest


def _escape(literal: str) -> str:
    return (
        "".join(f"[{c}]" if c in "*?[" else c for c in literal)
        if _WILD.search(literal)
        else literal
    )


def overlaps(a: Pattern, b: Pattern) -> bool:
    """Whether some name could match both patterns (in doubt, True)."""
    return _overlap(_segments_of(a), _segments_of(b))


def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    @functools.cache
    def go(i: int, j: int) -> bool:
        if i == len(a) and j == len(b):
            return True
        if i < len(a) and a[i] == DEEP:
            return go(i + 1, j) or (j < len(b) and go(i, j + 1))
        if j < len(b) and b[j] == DEEP:
            return go(i, j + 1) or (i < len(a) and go(i + 1, j))
        if i == len(a) or j == len(b):
            return False
        return _segments_meet(a[i], b[j]) and go(i + 1, j + 1)

    return go(0, 0)


def _segments_meet(x: str, y: str) -> bool:
    wild_x, wild_y = _WILD.search(x) is not None, _WILD.search(y) is not None
    if not wild_x and not wild_y:
        return x == y
    if not wild_x:
        return re.fullmatch(_segment_regex(y), x) is not None
    if not wild_y:
        return re.fullmatch(_segment_regex(x), y) is not None
    # two wildcard segments: compare their literal first and last characters, if both have one
    if x[0] not in "*?[" and y[0] not in "*?[" and x[0] != y[0]:
        return False
    return not (x[-1] not in "*?]" and y[-1] not in "*?]" and x[-1] != y[-1])
