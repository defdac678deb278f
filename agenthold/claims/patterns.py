"""Directory and glob claims: which names a pattern covers, and whether two patterns overlap.

A file resource written with a trailing ``/`` (``src/api/``) names a directory: the claim covers
every file beneath it. One with ``*``, ``?`` or ``[...]`` in a segment (``src/**/*.py``) is a
glob. Decisions behind it:
- Patterns work on canonical keys, segment by segment ("/"-separated): ``*`` is any run of
  characters within a segment (names starting with "." too), ``?`` one character, ``[abc]``,
  ``[a-z]`` and ``[!abc]`` a character class (a "]" first in it is a member; a range from
  high to low is refused); ``**`` as a whole segment is zero or more segments. ``[*]`` is a
  literal ``*``. A directory ``d/`` is the glob ``d/*/**`` (one or more segments below d).
  ``custom://`` names are never patterns.
- The literal segments before the first wildcard are the pattern's *scope*, a directory key.
  A name can only match a pattern whose scope is one of its ancestors, so finding the patterns
  that may cover a file is an indexed lookup of its few ancestor directories, not a scan.
- Case rules and spellings come from the resolver: the scope is resolved like any path (links
  followed, workspace roots made real), and the rest is folded the way the resolver folds paths.
- Matching never backtracks, so its time grows with the name's length times the pattern's
  (see "one segment" and "a whole pattern" below); no regular expression is involved: a
  backtracking one can take minutes on ``*a*a*...*b*`` against a long run of a's, inside the
  claims write, with every other caller waiting.
- A pattern is refused past MAX_PATTERN_LENGTH characters, MAX_PATTERN_SEGMENTS segments or
  MAX_PATTERN_DEEP ``**`` segments, each named in the error: generous for real globs, and they
  bound what one comparison of two patterns costs (place by place, so their segments times
  each other's).
- Two patterns overlap if some name could match both. The check is exact for literal segments
  and ``**``; for two wildcard segments it compares their literal first and last characters, so
  it may report an overlap that no real name has (``a*b`` and ``a*c*b``...), never the reverse:
  a claim is refused in doubt, never granted over another.
"""

from __future__ import annotations

import bisect
import functools
import unicodedata

from agenthold.claims.names import Resolver, Resource, Walk
from agenthold.store import InvalidInputError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Literal

__all__ = [
    "MAX_PATTERN_DEEP",
    "MAX_PATTERN_LENGTH",
    "MAX_PATTERN_SEGMENTS",
    "Pattern",
    "ancestors",
    "covers_file",
    "held_pattern",
    "is_pattern",
    "overlaps",
    "parse_pattern",
    "resolve_target",
    "tail_of",
]

DEEP = "**"


def _wild(text: str) -> bool:
    """Whether ``text`` has a wildcard ("*", "?" or "[")."""
    return "*" in text or "?" in text or "[" in text


# The classes here are written out, not dataclasses: making a dataclass costs a fresh process
# (the edit hook, which matches files against held patterns) more than its whole look.


class Pattern:
    """A directory or glob claim: ``uri`` as agents see it, ``key`` its claim identity, ``scope``
    the key of the directory it lies under (ends with "/"), ``rest`` its segments below that.
    Immutable, compared and hashed by its fields."""

    __slots__ = ("key", "kind", "rest", "scope", "uri", "workspace")
    __match_args__ = ("uri", "key", "kind", "scope", "rest", "workspace")

    uri: str
    key: str
    kind: Literal["dir", "glob"]
    scope: str
    rest: tuple[str, ...]
    workspace: str | None

    def __init__(
        self,
        uri: str,
        key: str,
        kind: Literal["dir", "glob"],
        scope: str,
        rest: tuple[str, ...],
        workspace: str | None = None,
    ) -> None:
        put = object.__setattr__
        put(self, "uri", uri)
        put(self, "key", key)
        put(self, "kind", kind)
        put(self, "scope", scope)
        put(self, "rest", rest)
        put(self, "workspace", workspace)

    def _fields(self) -> tuple[object, ...]:
        return (self.uri, self.key, self.kind, self.scope, self.rest, self.workspace)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Pattern)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Pattern(uri={self.uri!r}, key={self.key!r}, kind={self.kind!r}, "
            f"scope={self.scope!r}, rest={self.rest!r}, workspace={self.workspace!r})"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a Pattern is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: a Pattern is immutable")

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle, past __setattr__
        return (Pattern, self._fields())

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
        return _path_matches(_row(self.rest), key[len(self.scope) :])


@functools.lru_cache(maxsize=8192)
def held_pattern(uri: str, key: str, scope: str) -> Pattern:
    """``Pattern.from_key``, kept: a claim checks every held pattern above its file, and the
    same few hundred rows come back claim after claim."""
    return Pattern.from_key(uri, key, scope)


@functools.lru_cache(maxsize=8192)
def _file_matcher(key: str, scope: str) -> _Row:
    """What the part of a file key below ``scope`` must match to be covered by pattern ``key``."""
    return _row(Pattern.from_key("", key, scope).rest)


def covers_file(key: str, scope: str, file_key: str) -> bool:
    """Whether the held pattern with claim key ``key`` and ``scope`` covers ``file_key``: what
    ``Pattern.covers`` says, without building the pattern (one dict lookup when it is known)."""
    return file_key.startswith(scope) and _path_matches(
        _file_matcher(key, scope), file_key[len(scope) :]
    )


def tail_of(key: str, scope: str) -> str:
    """The literal characters every file name covered by the pattern ``key`` at ``scope`` ends
    with ("" if any name may: its last segment is ``**`` or ends with a wildcard)."""
    last = _compiled(Pattern.from_key("", key, scope).rest)[-1]
    return "" if last is None else last.tail


def is_pattern(text: object) -> bool:
    """Whether a resource as typed is a directory or glob (not for custom:// names)."""
    return isinstance(text, str) and _is_pattern(text)


@functools.lru_cache(maxsize=4096)
def _is_pattern(text: str) -> bool:  # kept: a claim and its release ask it of the same names
    stripped = text.strip()
    if stripped.lower().startswith("custom://"):
        return False
    return stripped.endswith(("/", "\\")) or _wild(stripped)


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
    if len(stripped) > MAX_PATTERN_LENGTH:
        raise _over(
            text, f"it is {len(stripped):,} characters long", MAX_PATTERN_LENGTH, "characters"
        )
    is_dir = stripped.endswith(("/", "\\"))
    segments = stripped.rstrip("/\\").replace("\\", "/").split("/")
    count = sum(1 for s in segments if s)
    if count > MAX_PATTERN_SEGMENTS:
        raise _over(text, f"it has {count} segments", MAX_PATTERN_SEGMENTS, "segments")
    deep = segments.count(DEEP)
    if deep > MAX_PATTERN_DEEP:
        raise _over(text, f"it has {deep} '**' segments", MAX_PATTERN_DEEP, "'**' segments")
    # the literal head: everything before the first segment with a wildcard
    first = next((i for i, s in enumerate(segments) if _wild(s)), len(segments))
    head, tail = segments[:first], [s for s in segments[first:] if s]
    for segment in tail:
        if segment in (".", ".."):
            raise _bad(text, "'.' and '..' segments are not allowed")
        if DEEP in segment and segment != DEEP:
            raise _bad(text, "'**' must be a whole path segment, as in src/**/*.py")
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
    for segment in rest:
        if segment != DEEP:
            try:
                _segment(segment)
            except _Unreadable as exc:
                raise _bad(text, str(exc)) from None
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


def _show(text: str) -> str:
    """``text`` quoted for a message, cut short if it is long."""
    return repr(text) if len(text) <= 120 else f"{text[:120]!r}..."


def _over(text: str, what: str, limit: int, unit: str) -> InvalidInputError:
    error = InvalidInputError(
        f"{_show(text.strip())} is too large a directory or glob: {what}, and the limit is "
        f"{limit} {unit}"
    )
    error.hint = LIMITS_HINT
    return error


def _bad(text: str, why: str) -> InvalidInputError:
    error = InvalidInputError(f"{_show(text)} is not a valid glob: {why}")
    error.hint = (
        "A directory claim ends with '/' (src/api/); a glob uses * (within a segment), ? (one "
        "character), [abc] or [a-z] (a character class) and ** (any number of directories)."
    )
    return error


# -- limits -----------------------------------------------------------------------------------

MAX_PATTERN_LENGTH = 1024
"""Longest directory or glob accepted, in characters, as typed (surrounding spaces stripped)."""
MAX_PATTERN_SEGMENTS = 32
"""Most "/"-separated segments a directory or glob may have, as typed."""
MAX_PATTERN_DEEP = 4
"""Most ``**`` segments a glob may have."""
LIMITS_HINT = (
    f"A directory or glob has at most {MAX_PATTERN_LENGTH} characters, {MAX_PATTERN_SEGMENTS} "
    f"segments and {MAX_PATTERN_DEEP} '**' segments; claim a shorter pattern, or several."
)


# -- one segment ------------------------------------------------------------------------------
# A segment's wildcards are compiled once into a list of tokens that each match one character
# (a literal, "?", a class) and the places between them where a "*" stands. Matching a name
# then runs the set of tokens reached so far over the name's characters at once, as the bits
# of one integer (bit t: the first t tokens are matched): a character moves each reached token
# whose own token accepts it one place on, and a "*" keeps a place reached. That is one step
# per character of the name, whatever the pattern, with no going back.


class _Unreadable(ValueError):
    """A segment that is not a valid glob; the message says why (parse_pattern words it)."""


class _Segment:
    """One compiled segment of a pattern (never changed once made)."""

    __slots__ = (
        "anyone", "bounds", "chars", "classes", "first", "last", "literal", "outside", "pieces",
        "size", "stars", "tail", "text", "toggles",
    )  # fmt: skip

    def __init__(
        self,
        text: str,
        literal: str | None,  # the segment itself when it has no wildcard
        pieces: tuple[str, ...] | None,  # its literal runs around each "*", if "*" is its only
        # wildcard
        size: int,  # tokens that match one character each
        stars: int,  # bit t: a "*" stands before token t (bit ``size``: after the last)
        chars: dict[str, int],  # bits of the literal tokens, by their character
        anyone: int,  # bits of the "?" tokens
        bounds: tuple[int, ...],  # code points at which some class's membership changes, ascending
        classes: tuple[int, ...],  # bits of the class tokens that accept code points from each
        # bound
        outside: int,  # bits of the class tokens that accept code points below the first bound
        toggles: tuple[tuple[int, int], ...],  # (code point, class bits whose membership flips)
        first: str | None,  # the literal character every match starts with, if there is one
        last: str | None,  # and ends with
        tail: str,  # the literal characters every match ends with ("" after a wildcard)
    ) -> None:
        self.text = text
        self.literal = literal
        self.pieces = pieces
        self.size = size
        self.stars = stars
        self.chars = chars
        self.anyone = anyone
        self.bounds = bounds
        self.classes = classes
        self.outside = outside
        self.toggles = toggles
        self.first = first
        self.last = last
        self.tail = tail


@functools.lru_cache(maxsize=8192)
def _segment(text: str) -> _Segment:
    """``text`` compiled; _Unreadable if a class is not closed or has a range running backwards.

    A class opens at "[", then "!" negates it, and it closes at the next "]" after its first
    character (so "[]a]" and "[!]a]" hold "]"); inside it, "x-y" is a range and every other
    character (a "-" first or last too) is itself."""
    if not _wild(text):
        return _literal(text)
    tokens: list[str | tuple[bool, list[tuple[int, int]]] | None] = []  # None: "?"
    stars, i = 0, 0
    while i < len(text):
        c = text[i]
        i += 1
        if c == "*":
            stars |= 1 << len(tokens)
        elif c == "?":
            tokens.append(None)
        elif c == "[":
            negate = text[i : i + 1] == "!"
            start = i + 1 if negate else i
            end = text.find("]", start + 1)
            if end < 0:
                raise _Unreadable(f"the '[' in {_show(text)} has no closing ']'")
            tokens.append((negate, _ranges(text, text[start:end])))
            i = end + 1
        else:
            tokens.append(c)
    size = len(tokens)
    chars: dict[str, int] = {}
    anyone = outside = 0
    toggles: dict[int, int] = {}
    for t, token in enumerate(tokens):
        bit = 1 << t
        if token is None:
            anyone |= bit
        elif isinstance(token, str):
            chars[token] = chars.get(token, 0) | bit
        else:
            negate, ranges = token
            if negate:
                outside |= bit
            for low, high in ranges:  # merged, so each toggles the bit on and off once
                toggles[low] = toggles.get(low, 0) ^ bit
                toggles[high + 1] = toggles.get(high + 1, 0) ^ bit
    flips = tuple(sorted(toggles.items()))
    bounds, classes = _class_table(flips, outside)
    first = tokens[0] if tokens and not stars & 1 and isinstance(tokens[0], str) else None
    closed = not (stars >> size) & 1
    last = tokens[-1] if tokens and closed and isinstance(tokens[-1], str) else None
    tail = ""
    t = size
    while t > 0 and not (stars >> t) & 1 and isinstance(tokens[t - 1], str):
        t -= 1
    if closed:
        tail = "".join(token for token in tokens[t:] if isinstance(token, str))
    only_stars = all(isinstance(token, str) for token in tokens) and "[" not in text
    pieces = tuple(text.split("*")) if only_stars else None
    return _Segment(
        text, None, pieces, size, stars, chars, anyone, bounds, classes, outside, flips,
        first, last, tail,
    )  # fmt: skip


def _class_table(
    flips: Sequence[tuple[int, int]], outside: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The bounds and the class bits in force from each, for membership changes ``flips``
    (ascending) over the bits ``outside`` in force below them."""
    classes, now = [], outside
    for _, bits in flips:
        now ^= bits
        classes.append(now)
    return tuple(code for code, _ in flips), tuple(classes)


@functools.lru_cache(maxsize=8192)
def _literal(text: str) -> _Segment:
    """A segment that matches ``text`` alone, whatever characters it has."""
    chars: dict[str, int] = {}
    for t, c in enumerate(text):
        chars[c] = chars.get(c, 0) | 1 << t
    return _Segment(
        text, text, None, len(text), 0, chars, 0, (), (), 0, (), text[:1], text[-1:], text
    )


def _ranges(text: str, body: str) -> list[tuple[int, int]]:
    """The code point ranges of a class's ``body``, merged."""
    found: list[tuple[int, int]] = []
    k = 0
    while k < len(body):
        low = body[k]
        if k + 2 < len(body) and body[k + 1] == "-":
            high = body[k + 2]
            if high < low:
                raise _Unreadable(
                    f"the range {low}-{high} in {_show(text)} runs backwards; "
                    "write a range from low to high, as in [a-z]"
                )
            found.append((ord(low), ord(high)))
            k += 3
        else:
            found.append((ord(low), ord(low)))
            k += 1
    found.sort()
    merged = [found[0]]
    for start, stop in found[1:]:
        if start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _accepting(segment: _Segment, c: str) -> int:
    """The bits of ``segment``'s tokens that accept the character ``c``."""
    bits = segment.chars.get(c, 0) | segment.anyone
    if segment.bounds:
        at = bisect.bisect_right(segment.bounds, ord(c)) - 1
        bits |= segment.classes[at] if at >= 0 else segment.outside
    return bits


def _segment_matches(segment: _Segment, name: str) -> bool:
    """Whether the segment of a name ``name`` matches ``segment``: in one pass over ``name``."""
    if segment.literal is not None:
        return name == segment.literal
    pieces = segment.pieces
    if pieces is not None:  # "*" alone: the leftmost place of each piece is the right one
        first, last = pieces[0], pieces[-1]
        end = len(name) - len(last)
        if end < len(first) or not name.startswith(first) or not name.endswith(last):
            return False
        at = len(first)
        for piece in pieces[1:-1]:
            if piece:
                at = name.find(piece, at, end)
                if at < 0:
                    return False
                at += len(piece)
        return True
    reached, stars = 1, segment.stars
    seen: dict[str, int] = {}
    for c in name:
        bits = seen.get(c)
        if bits is None:
            bits = seen[c] = _accepting(segment, c)
        reached = ((reached & bits) << 1) | (reached & stars)
        if not reached:
            return False
    return bool((reached >> segment.size) & 1)


# -- a whole pattern --------------------------------------------------------------------------
# Below its scope, a pattern is a list of segments, None standing for "**". A name is matched
# segment by segment, keeping the set of pattern places its segments so far can have reached
# (a "**" reaches the place after it at once and stays reached over each whole segment). All
# of a pattern's segments are laid side by side in one row of bits, each segment's tokens and
# one bit after them ("matched whole"), a "**" one bit; the bit where a segment starts stands
# for "this place is reached". So one pass over a name segment's characters moves every
# reached segment at once, and a segment matched whole reaches the next one by one more shift:
# a few operations per character of the name, whatever the pattern, with no going back.

_Compiled = tuple[_Segment | None, ...]


@functools.lru_cache(maxsize=4096)
def _compiled(rest: tuple[str, ...]) -> _Compiled:
    """The segments below a pattern's scope, compiled. A row of an older agenthold may hold a
    segment that is not valid now: it is read as "*", so that it covers too much, never less."""
    items: list[_Segment | None] = []
    for segment in rest:
        try:
            items.append(None if segment == DEEP else _segment(segment))
        except _Unreadable:
            items.append(_segment("*"))
    return tuple(items)


class _Row:
    """A pattern's segments in one row of bits (see above; never changed once made)."""

    __slots__ = (
        "anyone", "bounds", "chars", "classes", "deep", "deep_last", "done", "ends", "only",
        "outside", "shape", "stars", "starts",
    )  # fmt: skip

    def __init__(
        self,
        starts: int,  # the first bit of each segment (not "**")
        ends: int,  # the "matched whole" bit of each segment
        deep: int,  # the bit of each "**"
        deep_last: int,  # the bit of a "**" that ends the pattern: anything below matches
        done: int,  # the bit after the last segment: the whole pattern matched
        shape: int,  # one of the common shapes below, matched without the row, or _ANY_SHAPE
        only: _Segment | None,  # the one segment of such a shape
        stars: int,
        chars: dict[str, int],
        anyone: int,
        bounds: tuple[int, ...],
        classes: tuple[int, ...],
        outside: int,
    ) -> None:
        self.starts = starts
        self.ends = ends
        self.deep = deep
        self.deep_last = deep_last
        self.done = done
        self.shape = shape
        self.only = only
        self.stars = stars
        self.chars = chars
        self.anyone = anyone
        self.bounds = bounds
        self.classes = classes
        self.outside = outside


# Shapes most patterns have, each one segment and perhaps a "**": they are matched by looking
# at the one segment of the name that can meet it (the same answer as the row's, sooner).
_ANY_SHAPE, _EVERYTHING, _ONE, _LAST, _FIRST = range(5)  # -, **, s, **/s, s/**


def _shape(items: _Compiled) -> tuple[int, _Segment | None]:
    if len(items) == 1:
        return (_EVERYTHING, None) if items[0] is None else (_ONE, items[0])
    if len(items) == 2:
        first, last = items
        if first is None and last is not None:
            return _LAST, last
        if first is not None and last is None:
            return _FIRST, first
    return _ANY_SHAPE, None


@functools.lru_cache(maxsize=4096)
def _row(rest: tuple[str, ...]) -> _Row:
    items = _compiled(rest)
    starts = ends = deep = deep_last = stars = anyone = outside = 0
    chars: dict[str, int] = {}
    flips: dict[int, int] = {}
    at = 0
    for n, item in enumerate(items):
        if item is None:
            deep |= 1 << at
            if n == len(items) - 1:
                deep_last = 1 << at
            at += 1
            continue
        starts |= 1 << at
        ends |= 1 << (at + item.size)
        stars |= item.stars << at
        anyone |= item.anyone << at
        outside |= item.outside << at
        for c, bits in item.chars.items():
            chars[c] = chars.get(c, 0) | bits << at
        for code, bits in item.toggles:
            flips[code] = flips.get(code, 0) ^ bits << at
        at += item.size + 1
    bounds, classes = _class_table(sorted(flips.items()), outside)
    return _Row(
        starts, ends, deep, deep_last, 1 << at, *_shape(items), stars, chars, anyone,
        bounds, classes, outside,
    )  # fmt: skip


def _path_matches(row: _Row, path: str) -> bool:
    """Whether the part of a file key below a pattern's scope, ``path``, matches ``row``:
    "*", "?" and classes within a segment, "**" zero or more whole segments (so "x/**"
    covers x itself too)."""
    shape, only = row.shape, row.only
    if shape == _EVERYTHING:
        return True
    if only is not None:
        if shape == _ONE:
            return "/" not in path and _segment_matches(only, path)
        if shape == _LAST:
            return _segment_matches(only, path[path.rfind("/") + 1 :])
        return _segment_matches(only, path.split("/", 1)[0])  # _FIRST
    deep, stars, starts, chars, anyone = row.deep, row.stars, row.starts, row.chars, row.anyone
    seen: dict[str, int] = {}
    reached = 1  # the first place
    for name in path.split("/"):
        while True:  # a reached "**" reaches the place after it
            wider = reached | (reached & deep) << 1
            if wider == reached:
                break
            reached = wider
        if reached & row.deep_last:  # "**" last: whatever is left
            return True
        moving = reached & starts
        for c in name:
            if not moving:
                break
            bits = seen.get(c)
            if bits is None:
                bits = chars.get(c, 0) | anyone
                if row.bounds:
                    at = bisect.bisect_right(row.bounds, ord(c)) - 1
                    bits |= row.classes[at] if at >= 0 else row.outside
                seen[c] = bits
            moving = ((moving & bits) << 1) | (moving & stars)
        # a segment matched whole reaches the next place; a "**" takes the segment and stays
        reached = (moving & row.ends) << 1 | (reached & deep)
        if not reached:
            return False
    while True:
        wider = reached | (reached & deep) << 1
        if wider == reached:
            break
        reached = wider
    return bool(reached & row.done)


def ancestors(key: str) -> list[str]:
    """The directory keys above a file key, each ending with "/" (the scopes that may cover it)."""
    cut = key.find("/", key.find("://") + 3)
    found: list[str] = []
    while cut >= 0:
        found.append(key[: cut + 1])
        cut = key.find("/", cut + 1)
    return found


def _segments_of(pattern: Pattern) -> _Compiled:
    """The pattern's whole path below the scheme, compiled (the scope's segments literal)."""
    scope = pattern.scope[pattern.scope.find("://") + 3 :]
    return tuple(_literal(s) for s in scope.split("/") if s) + _compiled(pattern.rest)


def overlaps(a: Pattern, b: Pattern) -> bool:
    """Whether some name could match both patterns (in doubt, True)."""
    return _overlap(_segments_of(a), _segments_of(b))


def _overlap(a: _Compiled, b: _Compiled) -> bool:
    """Whether some path can match both ``a`` and ``b``: whether ``a[i:]`` and ``b[j:]`` can
    meet, for every place from the ends back, one row at a time (a "**" meets any number of
    the other's segments). Each pair of places is looked at once."""
    n, m = len(a), len(b)
    met: dict[tuple[int, int], bool] = {}  # the same two segments meet at many places
    below = [False] * (m + 1)  # row i + 1
    for i in range(n, -1, -1):
        row = [False] * (m + 1)
        for j in range(m, -1, -1):
            if i == n and j == m:
                row[j] = True
            elif i < n and a[i] is None:
                row[j] = below[j] or (j < m and row[j + 1])
            elif j < m and b[j] is None:
                row[j] = row[j + 1] or (i < n and below[j])
            elif i == n or j == m:
                row[j] = False
            else:
                x, y = a[i], b[j]
                assert x is not None and y is not None
                if below[j + 1]:
                    pair = (id(x), id(y))
                    meets = met.get(pair)
                    if meets is None:
                        meets = met[pair] = _segments_meet(x, y)
                    row[j] = meets
        below = row
    return below[0]


def _segments_meet(x: _Segment, y: _Segment) -> bool:
    """Whether some segment of a name matches both (in doubt, True)."""
    if x.literal is not None and y.literal is not None:
        return x.literal == y.literal
    if x.literal is not None:
        return _segment_matches(y, x.literal)
    if y.literal is not None:
        return _segment_matches(x, y.literal)
    # two wildcard segments: compare their literal first and last characters, if both have one
    if x.first is not None and y.first is not None and x.first != y.first:
        return False
    return not (x.last is not None and y.last is not None and x.last != y.last)
