"""The decision against the database: which live claims of other agents stand in the way of an
edit, and, with ``--claim-on-edit``, claiming what an edit touches first and freeing it when the
session ends.

Decisions behind it:
- A lean read path. The hook is a fresh process on every edit, and ``agenthold.claims`` with
  its records and the queue costs more to import than the whole budget of the hook. So a look
  imports the store, the resolver (``claims.names``), the pattern rules (``claims.patterns``)
  and the claims SQL (``claims.schema``), and reads with the statements the coordinator itself
  uses: ``CLAIM_ROW`` for the file's own names, ``PATTERN_KEYS_AT`` and ``covers_file`` for the
  directory and glob claims above it, ``ALIASES`` for its hard links. What stays restated
  here is one line, the liveness of a claim (its holder's row exists and its lease has not
  ended: ``claims.rows.claim_info``); tests/test_hooks.py compares the verdicts with
  ``Coordinator.status`` on the same claims. Shared holds are rarer: when any exists the
  claims' own ``ClaimRows.shares_in_way`` is imported and asked. Where nothing is held at all,
  the hook does not get here (glance.py).
- Every name of the file: as written and through its links (``Resolver.resolve_both``: a claim
  taken before a link appeared stays on the name as written), its hard links (the claim's
  recorded device and inode, counted only while the claimed name still leads to the file).
- Whose edit it is (``Own``): agents of the same host process (agenthold.hooks.ancestry), the
  agent named after this host session (made by ``--claim-on-edit``), and the agents of a
  principal given with ``--principal``. Every other holder is someone else.
- Writing (a claim on edit, a release at the session's end) goes through ``Coordinator``,
  imported only then: the first edit of a file pays for it, later ones only look.
"""

from __future__ import annotations

import os

from agenthold.claims.names import Resolver, Resource, Workspace, default_workspace
from agenthold.claims.patterns import ancestors, covers_file
from agenthold.claims.schema import ALIASES, CLAIM_ROW, HELD_UNDER, PATTERN_KEYS_AT

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from agenthold.store import StateStore

ROOT_WORKSPACE = "agenthold-hook-root"  # files outside every workspace still have a claim key
TOP = "\U0010ffff"  # as claims.rows.TOP: [k, k + TOP) is every key that starts with k
SESSION_PURPOSE = "edits of one host session, claimed by agenthold's edit hook"

# Plain classes with __slots__, not dataclasses: see hosts.py.


class Blocker:
    """A live claim of someone else in an edit's way."""

    __slots__ = ("agent_id", "claimed_at", "how", "lease_ends_at", "name", "path", "uri", "wait_on")

    def __init__(
        self,
        path: str,  # the file the edit writes, as the hook was given it (absolute)
        uri: str,  # the claim's resource, as its holder's server named it
        agent_id: str,
        name: str,
        claimed_at: str | None,
        lease_ends_at: float | None,
        how: str,  # "exclusive", "covering" (a directory or glob claim), "link" (a hard link),
        # "shared", "inside" (a claim on something under a directory the edit removes or moves)
        wait_on: str,  # the resource to give agenthold_wait
    ) -> None:
        self.path = path
        self.uri = uri
        self.agent_id = agent_id
        self.name = name
        self.claimed_at = claimed_at
        self.lease_ends_at = lease_ends_at
        self.how = how
        self.wait_on = wait_on

    def __repr__(self) -> str:
        return f"Blocker({self.path!r}, {self.uri!r}, {self.agent_id!r}, how={self.how!r})"


class Own:
    """Who the edit belongs to: agents of ``host``, the agent named ``session_agent``, the
    agents of ``principal``."""

    __slots__ = ("host", "principal", "session_agent")

    def __init__(
        self, host: str | None, session_agent: str | None, principal: str | None = None
    ) -> None:
        self.host = host
        self.session_agent = session_agent
        self.principal = principal


def resolver_for(workspaces: Sequence[Workspace], cwd: str) -> Resolver:
    """The configured workspaces (else one at the host's directory), and the filesystem root
    last, so that a file outside them still gets the key a claim on it would have."""
    chosen = list(workspaces) or [default_workspace(cwd if os.path.isdir(cwd) else None)]
    if all(os.path.realpath(w.root) != os.sep for w in chosen):
        chosen.append(Workspace(ROOT_WORKSPACE, os.sep))
    return Resolver(chosen)


def _live(row: Sequence[Any], now: float) -> bool:
    # as claims.rows.claim_info judges a row: held, its agent still there, its lease not ended
    return row[2] is not None and row[9] is not None and (row[11] is None or row[11] > now)


def _names(resolver: Resolver, path: str) -> tuple[list[Resource], str | None]:
    """The resources ``path`` is known by (as written, through its links) and its file id."""
    try:
        named, followed = resolver.resolve_both(path)
    except ValueError:  # not a name any claim could have (a NUL byte, a workspace root, ...)
        return [], None
    found = [named]
    file_id = None
    if isinstance(followed, Resource):
        file_id = followed.file_id
        if followed.key != named.key:
            found.append(followed)
    return found, file_id


def _inside(resolver: Resolver, path: str) -> list[str]:
    """The key prefixes of everything under ``path`` when it is a directory (as named and
    through its links; the workspace root too), else none. A command that removes or moves a
    directory (``rm -r``, ``mv``, ``git checkout -- DIR``) writes every file in it."""
    if not os.path.isdir(path):
        return []
    try:  # a child's keys, less the child: the resolver's own spelling of the directory
        named, followed = resolver.resolve_both(os.path.join(path, "x"))
    except ValueError:
        return []
    found = [named.key[:-1]]
    if isinstance(followed, Resource):
        found.append(followed.key[:-1])
    return list(dict.fromkeys(found))


def _alias_still_there(key: str, file_id: str) -> bool:
    # as ClaimRows._alias: a claim through a hard link counts while its name leads to the file
    try:
        found = os.stat(key.removeprefix("file://"))
    except (OSError, ValueError):
        return False
    return f"{found.st_dev}:{found.st_ino}" == file_id


def in_the_way(
    store: StateStore, resolver: Resolver, paths: Sequence[str], *, trees: bool = False
) -> list[Blocker]:
    """The live claims (of anyone) that an edit of ``paths`` would break: on any name of each
    file, a directory or glob claim covering it, or a shared hold on any of those; with
    ``trees`` (a shell command, a delete), a claim on anything under a path that is a
    directory too."""
    db = store.db
    found: list[Blocker] = []
    shares: bool | None = None
    for path in paths:
        names, file_id = _names(resolver, path)
        hits: list[tuple[Any, str, str]] = []
        for prefix in _inside(resolver, path) if trees else ():
            hits += [
                (row, "inside", row[1]) for row in db.fetchall(HELD_UNDER, (prefix, prefix + TOP))
            ]
        if not names:
            found += _live_hits(db, hits, path)
            continue
        keys = tuple(dict.fromkeys(r.key for r in names))
        rows = db.fetchall(CLAIM_ROW + f"WHERE c.resource IN ({', '.join('?' * len(keys))})", keys)
        hits += [(row, "exclusive", row[1]) for row in rows]
        above = tuple(dict.fromkeys(a for k in keys for a in ancestors(k)))
        if above:
            marks = ", ".join("?" * len(above))
            covering = [
                k
                for k, scope in db.fetchall(PATTERN_KEYS_AT.format(marks=marks), above)
                if any(covers_file(k, scope, key) for key in keys)
            ]
            if covering:
                marks = ", ".join("?" * len(covering))
                rows = db.fetchall(CLAIM_ROW + f"WHERE c.resource IN ({marks})", tuple(covering))
                hits += [(row, "covering", path) for row in rows]
        if file_id is not None:
            rows = db.fetchall(ALIASES, (file_id, names[-1].key))
            hits += [
                (row, "link", path)
                for row in rows
                if row[0] not in keys and _alias_still_there(row[0], file_id)
            ]
        found += _live_hits(db, hits, path)
        if shares is None:
            shares = bool(db.fetchall("SELECT EXISTS (SELECT 1 FROM claim_shares)")[0][0])
        if shares:
            found += _shared(store, names, path)
    return found


def _live_hits(db: Any, hits: Sequence[tuple[Any, str, str]], path: str) -> list[Blocker]:
    if not hits:
        return []
    now = db.now()
    return [
        Blocker(path, row[1], row[2], row[9], row[3], row[11], how, wait_on)
        for row, how, wait_on in hits
        if _live(row, now)
    ]


def _shared(store: StateStore, names: Sequence[Resource], path: str) -> list[Blocker]:
    """The shared holds in the way of an exclusive use of ``names``, by the claims' own rules."""
    from agenthold.claims.rows import ClaimRows  # only when some shared hold exists

    db = store.db
    rows = ClaimRows(db.fetchall, db.now())
    seen: set[tuple[str, str]] = set()
    found = []
    for resource in names:
        for info in rows.shares_in_way(resource):
            assert info.holder is not None
            if (info.resource, info.holder) in seen:
                continue
            seen.add((info.resource, info.holder))
            found.append(
                Blocker(
                    path,
                    info.uri,
                    info.holder,
                    info.holder_name or info.holder,
                    info.claimed_at,
                    info.lease_ends_at,
                    "shared",
                    path,
                )
            )
    return found


def own_agents(store: StateStore, own: Own, agent_ids: Sequence[str]) -> set[str]:
    """Which of ``agent_ids`` are the edit's own (see ``Own``)."""
    ids = tuple(dict.fromkeys(agent_ids))
    if not ids:
        return set()
    marks = ", ".join("?" * len(ids))
    rows = store.db.fetchall(
        f"SELECT agent_id, name, principal, host FROM agents WHERE agent_id IN ({marks})", ids
    )
    return {
        agent_id
        for agent_id, name, principal, host in rows
        if (own.host is not None and host == own.host)
        or (own.session_agent is not None and name == own.session_agent)
        or (own.principal is not None and principal == own.principal)
    }


def refused(store: StateStore, resolver: Resolver, paths: Sequence[str], own: Own) -> list[Blocker]:
    """The claims of others in the way of an edit of ``paths`` (none: the edit may go on)."""
    blockers = in_the_way(store, resolver, paths)
    if not blockers:
        return []
    mine = own_agents(store, own, [b.agent_id for b in blockers])
    return [b for b in blockers if b.agent_id not in mine]


# -- writing: claims on edit and the session's end ------------------------------------------


def _live_agent(store: StateStore, where: str, args: tuple[Any, ...]) -> str | None:
    now = store.db.now()
    rows = store.db.fetchall(
        "SELECT agent_id, lease_ends_at FROM agents WHERE " + where + " ORDER BY registered_at",
        args,
    )
    live = [agent_id for agent_id, ends in rows if ends is None or ends > now]
    return live[-1] if live else None


def claim_on_edit(
    store: StateStore,
    resolver: Resolver,
    paths: Sequence[str],
    own: Own,
    *,
    host_name: str,
    lease: float,
) -> list[Blocker]:
    """Claim ``paths`` (all or none) for the edit's agent: the host's own agent registered over
    MCP if it has one, else the agent named after the session (registered now if missing,
    with a lease of ``lease`` seconds, renewed by each claim). Returns what stood in the way
    (nothing claimed then)."""
    from agenthold.claims.coordinator import Coordinator

    agent_id = None
    if own.host is not None:
        agent_id = _live_agent(store, "host = ? AND purpose != ?", (own.host, SESSION_PURPOSE))
    ttl: float | None = None  # an agent of a server keeps the lease its server gives it
    if agent_id is None:
        assert own.session_agent is not None
        ttl = lease
        agent_id = _live_agent(store, "name = ?", (own.session_agent,))
    coordinator = Coordinator(store, resolver, claim_ttl=ttl)
    if agent_id is None:
        agent_id = coordinator.register(
            own.session_agent or host_name, host_name, SESSION_PURPOSE, host=own.host
        ).agent_id
    result = coordinator.claim_many(list(dict.fromkeys(paths)), agent_id)
    if result.status == "claimed":
        return []
    blockers = []
    for path, one in zip(dict.fromkeys(paths), result.results, strict=True):
        for h in one.conflicts or ((one.holder,) if one.holder else ()):
            blockers.append(
                Blocker(
                    path,
                    h.held_as or one.resource,
                    h.agent_id,
                    h.name or h.agent_id,
                    h.claimed_at,
                    h.lease_ends_at,
                    h.mode if h.mode == "shared" else "exclusive",
                    path,
                )
            )
    return blockers


def end_session(store: StateStore, resolver: Resolver, own: Own) -> list[str]:
    """Release what the session's agent claimed on edit (outcome "modified": it claimed them
    because it edited them); the URIs released."""
    from agenthold.claims.coordinator import Coordinator

    if own.session_agent is None:
        return []
    agent_id = _live_agent(store, "name = ?", (own.session_agent,))
    if agent_id is None:
        return []
    return Coordinator(store, resolver).release_all(agent_id, "modified")
