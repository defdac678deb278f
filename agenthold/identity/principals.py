"""Who is calling: principals, their tokens and scopes, and the token file that lists them
(standard library only, so ``agenthold token …`` never imports mcp).

A principal is a name with one or more bearer tokens and a set of scopes. Decisions behind it:
- The token file is JSON (``--auth-file``): readable by the standard library, by ``jq`` and by
  people. It holds the SHA-256 of each token, never a token: a copy of the file lets nobody in.
  Unknown keys are refused, not ignored, because a misspelt ``"scope"`` would otherwise quietly
  grant everything.
- Tokens are looked up by digest in a dict (its timing depends on a hash of a SHA-256, which
  says nothing about any token), then confirmed by one ``hmac.compare_digest`` over the digests
  of every entry, with the presented digest put in the candidate's place (a spare slot when
  nothing matched). So every entry is compared on every request, in one constant-time pass in
  C, whichever matches, and 1,000 principals cost microseconds, not a Python loop.
- The file is ``stat``-ed on every request (a microsecond or two); when anything about it
  changed, it is read again, so a revoked or added token counts from the next request on. A file
  that can no longer be read as a token file refuses every request until it is fixed: an edit
  that breaks it must not leave a revoked token working.
- ``token add`` and ``token revoke`` each read, change and write the whole file. Two run at
  once would each write what they read, and one's change would be lost (a revoke undone, an
  add dropped), so each holds an exclusive ``flock`` on a lock file beside it (``PATH.lock``,
  mode 0600) for its whole read-modify-write, and writes the file whole through a temporary
  file in the same directory, fsync and rename, so a server reading it sees the old file or
  the new one, never a half.
- Scopes are strings such as ``write:team-a/*``. Each kind limits one thing; a kind a
  principal has none of is not limited (``tools:`` is the coarse switch that shuts a whole kind
  off), so a principal without scopes may do everything.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ALL_ACCESS",
    "SHARED",
    "TOOL_SETS",
    "AuthFileError",
    "Principal",
    "Scopes",
    "TokenTable",
    "add_token",
    "load_file",
    "new_token",
    "revoke",
]

log = logging.getLogger("agenthold")

FILE_VERSION = 1
RACY_NS = 2_000_000_000  # a token file changed this recently is read at every call (_is_racy)
TOOL_SETS = ("standard", "advanced", "messages")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
HEX_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
TOKEN_PREFIX = "aht_"
SCOPE_KINDS = ("tools", "read", "write", "claim", "thread-read", "thread-write")
MAX_SCOPE = 512
SCOPE_HELP = (
    "a scope is tools:SET[,SET] (standard, advanced, messages), read:GLOB or write:GLOB "
    "(namespaces), claim:PATTERN (a workspace name or a resource URI glob), thread-read:GLOB "
    "or thread-write:GLOB (message threads)"
)


class AuthFileError(ValueError):
    """A token file, or a value for one, that cannot be used; the message is one line."""


def _matches(patterns: tuple[str, ...] | None, name: str) -> bool:
    if patterns is None:
        return True
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclass(frozen=True)
class Scopes:
    """What a principal may do; None for a kind means that kind is not limited.

    ``write`` namespaces and threads are readable too. A claim pattern without ':' names a
    workspace (a glob over workspace names); one with ':' is a glob over resource URIs.
    """

    tools: frozenset[str] | None = None
    read: tuple[str, ...] | None = None
    write: tuple[str, ...] | None = None
    claim: tuple[str, ...] | None = None
    thread_read: tuple[str, ...] | None = None
    thread_write: tuple[str, ...] | None = None
    text: tuple[str, ...] = ()

    @classmethod
    def parse(cls, items: Iterable[str]) -> Scopes:
        """Scopes from their strings; AuthFileError naming the first bad one."""
        found: dict[str, list[str]] = {}
        text: list[str] = []
        for item in items:
            if not isinstance(item, str):
                raise AuthFileError(f"a scope must be a string, got {type(item).__name__}")
            kind, sep, value = item.partition(":")
            if not sep or kind not in SCOPE_KINDS or not value or len(item) > MAX_SCOPE:
                raise AuthFileError(f"{item!r} is not a scope; {SCOPE_HELP}")
            if kind == "tools":
                sets = [s.strip() for s in value.split(",")]
                bad = [s for s in sets if s not in TOOL_SETS]
                if bad:
                    raise AuthFileError(
                        f"{item!r}: {bad[0]!r} is not a tool set; use {', '.join(TOOL_SETS)}"
                    )
                found.setdefault(kind, []).extend(sets)
            else:
                found.setdefault(kind, []).append(value)
            if item not in text:
                text.append(item)

        def of(name: str) -> tuple[str, ...] | None:
            return tuple(dict.fromkeys(found[name])) if name in found else None

        write, thread_write = of("write"), of("thread-write")
        read = of("read")
        if read is not None or write is not None:
            read = (read or ()) + (write or ())
        thread_read = of("thread-read")
        if thread_read is not None or thread_write is not None:
            thread_read = (thread_read or ()) + (thread_write or ())
        if write is None and read is not None:
            write = ()
        if thread_write is None and thread_read is not None:
            thread_write = ()
        tools = frozenset(found["tools"]) if "tools" in found else None
        return cls(tools, read, write, of("claim"), thread_read, thread_write, tuple(text))

    @property
    def everything(self) -> bool:
        return not self.text

    def may_use(self, tool_set: str) -> bool:
        return self.tools is None or tool_set in self.tools

    def may_read(self, namespace: str) -> bool:
        return _matches(self.read, namespace)

    def may_write(self, namespace: str) -> bool:
        return _matches(self.write, namespace)

    def may_claim(self, uri: str, workspace: str | None) -> bool:
        if self.claim is None:
            return True
        for pattern in self.claim:
            if ":" in pattern:
                if fnmatch.fnmatchcase(uri, pattern):
                    return True
            elif workspace is not None and fnmatch.fnmatchcase(workspace, pattern):
                return True
        return False

    def may_read_thread(self, thread: str) -> bool:
        return _matches(self.thread_read, thread)

    def may_write_thread(self, thread: str) -> bool:
        return _matches(self.thread_write, thread)


ALL_ACCESS = Scopes()


class ForbiddenError(Exception):
    """A call outside the caller's scopes; the message names the scope that is missing."""

    hint = (
        "Nothing was done. Ask the server's operator for a token with that scope "
        "('agenthold token add NAME --scope SCOPE'), or stay within your scopes."
    )

    def __init__(self, scope: str, what: str) -> None:
        super().__init__(f"this caller's token lacks the scope {scope}: {what}")
        self.scope = scope


def require_tool_set(principal: Principal | None, tool_set: str, tool: str) -> None:
    if principal is not None and not principal.scopes.may_use(tool_set):
        raise ForbiddenError(f"tools:{tool_set}", f"{tool} is one of the {tool_set} tools")


def require_namespace(principal: Principal | None, namespace: str, *, write: bool) -> None:
    if principal is None:
        return
    if write and not principal.scopes.may_write(namespace):
        raise ForbiddenError(f"write:{namespace}", f"it may not change namespace {namespace!r}")
    if not write and not principal.scopes.may_read(namespace):
        raise ForbiddenError(f"read:{namespace}", f"it may not read namespace {namespace!r}")


def require_claim(principal: Principal | None, uri: str, workspace: str | None) -> None:
    if principal is not None and not principal.scopes.may_claim(uri, workspace):
        where = workspace if workspace is not None else uri
        raise ForbiddenError(f"claim:{where}", f"it may not claim {uri}")


def require_thread(principal: Principal | None, thread: str, *, write: bool) -> None:
    if principal is None:
        return
    if write and not principal.scopes.may_write_thread(thread):
        raise ForbiddenError(f"thread-write:{thread}", f"it may not post to thread {thread!r}")
    if not write and not principal.scopes.may_read_thread(thread):
        raise ForbiddenError(f"thread-read:{thread}", f"it may not read thread {thread!r}")


@dataclass(frozen=True)
class Principal:
    """A caller known by a token: ``name`` is what agents and history entries are bound to."""

    name: str
    scopes: Scopes = field(default=ALL_ACCESS)


# The principal of --auth-token / AGENTHOLD_AUTH_TOKEN: one name for everyone who has the
# token, spelt so that no principal in a token file can be called the same.
SHARED = Principal("(shared token)")


def digest(token: bytes) -> bytes:
    """The SHA-256 a token is known by."""
    return hashlib.sha256(token).digest()


def new_token() -> str:
    """A fresh random token: 256 bits, URL-safe, with a prefix that secret scanners can find."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


# -- the token file -------------------------------------------------------------------------


@dataclass
class Entry:
    """One principal as the token file holds it."""

    name: str
    tokens: list[dict[str, str]]
    scopes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "scopes": self.scopes}


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise AuthFileError(
            f"{name!r} is not a principal name: 1 to 64 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter or digit"
        )
    return name


def _parse(text: str) -> list[Entry]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AuthFileError(
            f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise AuthFileError(
            'not a token file: expected an object {"version": 1, "principals": {…}}'
        )
    unknown = sorted(set(data) - {"version", "principals"})
    if unknown:
        raise AuthFileError(f"unknown key {unknown[0]!r} at the top level")
    if data.get("version") != FILE_VERSION:
        raise AuthFileError(
            f"version {data.get('version')!r} is not one this agenthold reads ({FILE_VERSION})"
        )
    principals = data.get("principals")
    if not isinstance(principals, dict):
        raise AuthFileError(
            '"principals" must be an object of name: {"tokens": […], "scopes": […]}'
        )
    entries: list[Entry] = []
    seen: dict[str, str] = {}
    for name, body in principals.items():
        _check_name(name)
        where = f"principal {name!r}"
        if not isinstance(body, dict):
            raise AuthFileError(f"{where}: expected an object with tokens and scopes")
        extra = sorted(set(body) - {"tokens", "scopes"})
        if extra:
            raise AuthFileError(f"{where}: unknown key {extra[0]!r}")
        tokens, scopes = body.get("tokens"), body.get("scopes", [])
        if not isinstance(tokens, list) or not tokens:
            raise AuthFileError(f"{where}: tokens must be a list of at least one token digest")
        for token in tokens:
            if not isinstance(token, dict) or not isinstance(token.get("sha256"), str):
                raise AuthFileError(f'{where}: a token must be an object with "sha256"')
            if set(token) - {"sha256", "created_at"}:
                raise AuthFileError(f"{where}: unknown key in a token")
            hexed = token["sha256"]
            if not HEX_DIGEST_RE.fullmatch(hexed):
                raise AuthFileError(f"{where}: sha256 must be 64 lowercase hex digits")
            if hexed in seen:
                raise AuthFileError(f"{where}: a token digest is also listed for {seen[hexed]!r}")
            seen[hexed] = name
        if not isinstance(scopes, list):
            raise AuthFileError(f"{where}: scopes must be a list of strings")
        try:
            Scopes.parse(scopes)
        except AuthFileError as exc:
            raise AuthFileError(f"{where}: {exc}") from None
        entries.append(Entry(name, tokens, scopes))
    return entries


def load_file(path: str | os.PathLike[str]) -> list[Entry]:
    """The principals of a token file; AuthFileError (one line, naming the file) if unusable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AuthFileError(
            f"{os.fspath(path)}: no such file; create it with "
            f"'agenthold token add NAME --auth-file {os.fspath(path)}'"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthFileError(f"{os.fspath(path)}: cannot be read ({type(exc).__name__})") from None
    try:
        return _parse(text)
    except AuthFileError as exc:
        raise AuthFileError(f"{os.fspath(path)}: {exc}") from None


def exposure_warning(path: str | os.PathLike[str]) -> str | None:
    """A warning if other users can read or change the token file, else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if os.name == "nt":  # pragma: no cover - modes mean little there
        return None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"warning: the token file {os.fspath(path)} can be changed by other users, who could "
            "add a token of their own; run chmod 600 on it"
        )
    if mode & stat.S_IROTH:
        return (
            f"warning: the token file {os.fspath(path)} is readable by every user on this machine "
            "(it holds only token digests, but who may call is nobody else's business); run "
            "chmod 600 on it"
        )
    return None


def _write(path: Path, entries: Sequence[Entry]) -> None:
    """Replace the file whole (a reader sees the old file or the new one), mode 0600 for a new
    file, the old mode for an existing one."""
    body = {"version": FILE_VERSION, "principals": {e.name: e.to_json() for e in entries}}
    text = json.dumps(body, indent=2) + "\n"
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where directories can be opened and synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - a directory that cannot be opened (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - a file system that cannot sync a directory
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of the token file ``path`` (on ``PATH.lock``, created with mode
    0600 if missing): one read-modify-write at a time, whichever process runs it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no flock; one command at a time there
        yield
        return
    fd = os.open(f"{os.fspath(path)}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _entries_or_empty(path: Path) -> list[Entry]:
    return load_file(path) if path.exists() else []


def add_token(
    path: str | os.PathLike[str], name: str, scopes: Sequence[str] | None = None
) -> tuple[str, bool]:
    """Add a new token for principal ``name`` (created if missing; ``scopes`` replace its
    scopes when given). Returns the token, which is stored nowhere, and whether the principal
    is new."""
    _check_name(name)
    if scopes is not None:
        Scopes.parse(scopes)
    file = Path(path)
    token = new_token()
    record = {
        "sha256": digest(token.encode()).hex(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with _locked(file):
        entries = _entries_or_empty(file)
        entry = next((e for e in entries if e.name == name), None)
        if entry is None:
            entries.append(Entry(name, [record], list(scopes or [])))
        else:
            entry.tokens.append(record)
            if scopes is not None:
                entry.scopes = list(scopes)
        _write(file, entries)
    return token, entry is None


def revoke(path: str | os.PathLike[str], name: str) -> int:
    """Remove principal ``name`` and every token of it; returns how many tokens went."""
    file = Path(path)
    with _locked(file):
        entries = load_file(file)
        entry = next((e for e in entries if e.name == name), None)
        if entry is None:
            raise AuthFileError(f"{os.fspath(path)}: there is no principal named {name!r}")
        _write(file, [e for e in entries if e is not entry])
    return len(entry.tokens)


# -- checking tokens ------------------------------------------------------------------------

DIGEST_SIZE = 32


class Table:
    """Token digests and their principals, checked in one constant-time pass."""

    def __init__(self, pairs: Iterable[tuple[bytes, Principal]]) -> None:
        self.principals: list[Principal] = []
        self._index: dict[bytes, int] = {}
        digests: list[bytes] = []
        for d, principal in pairs:
            if d in self._index:
                continue  # the same token listed twice: the first one counts
            self._index[d] = len(digests)
            digests.append(d)
            self.principals.append(principal)
        # a spare slot that no token hashes to, compared when nothing matched
        digests.append(secrets.token_bytes(DIGEST_SIZE))
        self._all = b"".join(digests)
        # the buffer a request's digest is written into, over its candidate's, for the one
        # pass; written back after it (a copy of every digest per request cost more)
        self._probe = bytearray(self._all)
        self._probing = threading.Lock()

    def __len__(self) -> int:
        return len(self.principals)

    def match(self, presented: bytes) -> Principal | None:
        """The principal whose token has digest ``presented``, or None."""
        if len(presented) != DIGEST_SIZE:
            return None
        slot = self._index.get(presented, len(self.principals))
        at, end = slot * DIGEST_SIZE, (slot + 1) * DIGEST_SIZE
        with self._probing:
            self._probe[at:end] = presented
            try:
                same = hmac.compare_digest(self._probe, self._all)
            finally:
                self._probe[at:end] = self._all[at:end]
        if same and slot < len(self.principals):
            return self.principals[slot]
        return None


def _table(entries: Sequence[Entry]) -> Table:
    pairs = []
    for e in entries:
        principal = Principal(e.name, Scopes.parse(e.scopes))
        pairs += [(bytes.fromhex(t["sha256"]), principal) for t in e.tokens]
    return Table(pairs)


class TokenTable:
    """The principals of a token file, read again whenever the file changes.

    ``current()`` costs one ``stat`` while the file is unchanged. When the file cannot be used
    any more, ``current()`` returns None and ``problem`` says why (never the file's contents),
    until the file is fixed.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._signature = self._stat()
        self._table: Table | None = _table(load_file(self.path))  # may raise AuthFileError
        self.problem: str | None = None

    @staticmethod
    def _is_racy(signature: tuple[int, ...] | None) -> bool:
        """Whether the file was changed so recently that another edit of the same size could
        follow within the file system's timestamp tick and leave the signature as it is: then
        it is read again at every call until it is RACY_NS old."""
        return signature is not None and time.time_ns() - signature[3] < RACY_NS

    def _stat(self) -> tuple[int, ...] | None:
        try:
            s = os.stat(self.path)
        except OSError:
            return None
        return (s.st_ino, s.st_dev, s.st_size, s.st_mtime_ns, s.st_ctime_ns)

    def knows(self, name: str) -> bool:
        """Whether a principal called ``name`` still has a token (the file is read again if it
        changed). False only when the file, read fine, no longer lists it: a file that cannot
        be used says nothing either way (requests are refused meanwhile, and what a principal
        has in flight, a wait in line, goes on)."""
        table = self.current()
        return table is None or any(p.name == name for p in table.principals)

    def current(self) -> Table | None:
        signature = self._stat()
        changed = signature != self._signature
        if changed or self._is_racy(signature):
            self._signature = signature
            try:
                self._table = _table(load_file(self.path))
                self.problem = None
            except AuthFileError as exc:
                self._table, self.problem = None, str(exc)
                log.warning(
                    "the token file changed and cannot be used, so its principals are refused "
                    "until it is fixed: %s",
                    exc,
                )
            else:
                if changed:
                    log.info("token file %s read again: %d tokens", self.path, len(self._table))
        return self._table
