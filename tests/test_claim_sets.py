"""Tests for issue 15: directory and glob claims, several resources at once, the read-only
check of several resources, through the library and a real mcp.Client, on both backends.

Other processes are tests/helpers/sets_worker.py (a Coordinator on the test's database that
claims random overlapping sets); a history checker replays the claim events they left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from support import (
    REPO,
    Coordinators,
    OverlapOracle,
    agenthold_args,
    agents,
    child_env,
    in_process_client,
    reply_of,
)

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.claims.patterns import Pattern, ancestors, overlaps, parse_pattern
from agenthold.serve.claim_tools import BUSY_HINT, BUSY_SET_HINT, LAPSED_HINT
from agenthold.store import InvalidInputError, StateStore

WORKER = Path(__file__).parent / "helpers" / "sets_worker.py"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "src" / "api").mkdir(parents=True)
    return path


# --------------------------------------------------------------------------------------------
# Patterns, by themselves
# --------------------------------------------------------------------------------------------


def test_pattern_syntax_covers_what_the_docs_say(root: Path) -> None:
    r = Resolver([Workspace("default", str(root))], case_insensitive=False)

    def key(path: str) -> str:
        return r.resolve(path).key

    directory = parse_pattern(r, "src/api/")
    deep = parse_pattern(r, "src/**/*.py")
    flat = parse_pattern(r, "src/*.py")
    chars = parse_pattern(r, "src/[ab]?.md")
    assert (directory.kind, directory.uri) == ("dir", "file://default/src/api/")
    assert (deep.kind, deep.uri) == ("glob", "file://default/src/**/*.py")
    assert directory.covers(key("src/api/x.py")) and directory.covers(key("src/api/a/b/c"))
    assert not directory.covers(key("src/api")) and not directory.covers(key("src/apix/y"))
    assert deep.covers(key("src/a.py")) and deep.covers(key("src/a/b/c.py"))
    assert not deep.covers(key("src/a.pyc")) and not deep.covers(key("lib/a.py"))
    assert flat.covers(key("src/a.py")) and not flat.covers(key("src/api/a.py"))
    assert chars.covers(key("src/ax.md")) and not chars.covers(key("src/cx.md"))
    assert parse_pattern(r, "src/[!a]*").covers(key("src/b")) and not parse_pattern(
        r, "src/[!a]*"
    ).covers(key("src/a"))
    assert parse_pattern(r, "src/[*].py").covers(key("src/*.py"))  # [*] is a literal *
    # a file whose name has brackets (a route like app/[slug]/page.tsx): [[] is a literal [
    route = parse_pattern(r, "app/[[]slug]/page.tsx")
    assert route.covers(key("app/[slug]/page.tsx")) and not route.covers(key("app/s/page.tsx"))
    assert parse_pattern(r, "src/[&~|^]").covers(key("src/&")) and parse_pattern(
        r, "src/[&~|^]"
    ).covers(key("src/^"))
    assert parse_pattern(r, "**").covers(key("a/b/c")) and parse_pattern(r, "**").covers(key("a"))
    # every spelling of one directory is one pattern
    assert parse_pattern(r, "file://default/src/api/") == directory
    assert parse_pattern(r, f"{root}/src/api/") == directory
    assert parse_pattern(r, "src\\api\\") == directory
    assert overlaps(directory, deep) and overlaps(deep, flat)
    assert not overlaps(directory, flat) and not overlaps(parse_pattern(r, "*.md"), deep)
    assert not overlaps(parse_pattern(r, "src/*.py"), parse_pattern(r, "src/*.md"))
    assert overlaps(parse_pattern(r, "**"), parse_pattern(r, "docs/*.md"))
    assert ancestors("file:///r/src/a.py") == ["file:///", "file:///r/", "file:///r/src/"]
    again = Pattern.from_key(deep.uri, deep.key, deep.scope)
    assert (again.rest, again.kind) == (deep.rest, deep.kind)


def test_patterns_follow_the_platform_case_rules_and_links(root: Path) -> None:
    folded = Resolver([Workspace("default", str(root))], case_insensitive=True)
    upper = parse_pattern(folded, "SRC/API/")
    assert upper == parse_pattern(folded, "src/api/")
    assert upper.covers(folded.resolve("Src/Api/X.py").key)
    (root / "link").symlink_to(root / "src")
    plain = Resolver([Workspace("default", str(root))], case_insensitive=False)
    assert parse_pattern(plain, "link/*.py") == parse_pattern(plain, "src/*.py")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("src/a**/x.py", "'**' must be a whole path segment"),
        ("src/[ab.py", "has no closing ']'"),
        ("src/*/../x.py", "'.' and '..' segments"),
    ],
)
def test_a_bad_glob_is_an_invalid_input_error_with_the_syntax_as_hint(
    root: Path, text: str, why: str
) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(why)) as caught:
        parse_pattern(Resolver([Workspace("default", str(root))]), text)
    assert caught.value.hint is not None and "**" in caught.value.hint


@pytest.mark.parametrize("case_insensitive", [False, True])
def test_patterns_parse_with_several_workspaces_and_none_named_default(
    root: Path, case_insensitive: bool
) -> None:
    """A pattern's directory is found by resolving a name inside it, within the pattern's own
    workspace: no default workspace is needed (there was a bare lookup that needed one, so
    every directory and glob was refused as 'ambiguous' on a server of two named ones)."""
    (root / "repo").mkdir()
    (root / "other").mkdir()
    resolver = Resolver(
        [Workspace("repo", str(root / "repo")), Workspace("other", str(root / "other"))],
        case_insensitive=case_insensitive,
    )
    directory = parse_pattern(resolver, "file://repo/src/")
    assert (directory.uri, directory.kind, directory.workspace) == (
        "file://repo/src/",
        "dir",
        "repo",
    )
    assert directory.covers(resolver.resolve("file://repo/src/a/b.py").key)
    assert not directory.covers(resolver.resolve("file://other/src/a.py").key)
    glob = parse_pattern(resolver, "file://other/**/*.md")
    assert (glob.uri, glob.kind, glob.workspace) == ("file://other/**/*.md", "glob", "other")
    assert glob.covers(resolver.resolve("file://other/docs/x.md").key)


def test_a_glob_outside_every_workspace_is_refused(root: Path) -> None:
    with pytest.raises(InvalidInputError, match="outside every workspace"):
        parse_pattern(Resolver([Workspace("default", str(root))]), "/elsewhere/*.py")


# --------------------------------------------------------------------------------------------
# Directory and glob claims, through the library
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_a_directory_claim_blocks_files_beneath_it_and_files_block_it(coord: Coordinator) -> None:
    a, b = agents(coord, "a", "b")
    assert coord.claim("src/api/", a).status == "claimed"
    busy = coord.claim("src/api/new/later.py", b)  # covers files created later, too
    assert busy.status == "busy" and busy.holder is not None
    assert (busy.holder.agent_id, busy.holder.held_as) == (a, "file://default/src/api/")
    assert coord.claim("src/other.py", b).status == "claimed"
    assert coord.claim("src/api/mine.py", a).status == "claimed"  # its own directory
    status = coord.status("src/api/x.py")
    assert status.status == "claimed" and status.holder is not None
    assert status.holder.held_as == "file://default/src/api/"
    assert coord.release("src/api/", a, "modified").status == "released"
    # now b's file claim blocks a directory claim over it, in the other direction
    assert coord.claim("src/api/x.py", b).status == "claimed"
    blocked = coord.claim("src/", a)
    assert blocked.status == "busy" and blocked.holder is not None
    assert {c.held_as for c in blocked.conflicts} == {
        "file://default/src/api/x.py",
        "file://default/src/other.py",
    }
    assert coord.claim("src/*.md", a).status == "claimed"  # overlaps nothing b holds
    assert coord.status("src/").status == "claimed"


@pytest.mark.backends
def test_globs_conflict_with_overlapping_globs_only(coord: Coordinator) -> None:
    a, b = agents(coord, "a", "b")
    assert coord.claim("src/**/*.py", a).status == "claimed"
    assert coord.claim("src/**/*.md", b).status == "claimed"
    assert coord.claim("docs/", b).status == "claimed"
    assert coord.claim("src/api/*.py", b).status == "busy"
    assert coord.claim("**", b).status == "busy"
    assert coord.claim("src/**/*.py", a).status == "already_claimed"
    assert coord.claim("src/x.md", a).status == "busy"  # b's glob covers it


ROOT_SPELLINGS = ["./", ".\\", "file://default/", "{root}/", "{root}//"]


@pytest.mark.parametrize("spelling", ROOT_SPELLINGS)
def test_a_directory_claim_of_the_workspace_root_is_refused_and_names_the_glob(
    coord: Coordinator, root: Path, spelling: str
) -> None:
    """A stray "./" would hold every file of the workspace (and "." and the root without its
    slash are refused, as 0.10 refused "./"): the whole workspace is claimed as "**", said on
    purpose, which the error names."""
    a, b = agents(coord, "a", "b")
    text = spelling.format(root=root)
    for call in (lambda: coord.claim(text, a), lambda: coord.status(text)):
        with pytest.raises(InvalidInputError, match="claim 'file://default/\\*\\*'") as caught:
            call()
        assert repr(text) in str(caught.value) and "file://default/**" in (caught.value.hint or "")
    assert coord.claim("src/a.py", b).status == "claimed"  # nothing was held
    assert coord.claim("**", a).status == "busy"  # the glob is the whole workspace
    coord.release("src/a.py", b)
    assert coord.claim("**", a).status == "claimed"
    for other in ("deep/down/x.py", "src/", "src/*.py"):
        busy = coord.claim(other, b)
        assert busy.status == "busy" and busy.holder is not None, other
        assert busy.holder.held_as == "file://default/**"
    status = coord.status("deep/down/x.py")
    assert status.holder is not None and status.holder.held_as == "file://default/**"
    assert coord.wait("src/a.py", 0.05).status == "timeout"
    coord.release("**", a)
    assert coord.wait("src/a.py", 0.05).status == "available"


@pytest.mark.backends
def test_custom_names_are_literal_never_patterns(coord: Coordinator) -> None:
    a, b = agents(coord, "a", "b")
    assert coord.claim("custom://queue/*", a).status == "claimed"
    assert coord.claim("custom://queue/1", b).status == "claimed"
    assert coord.claim("custom://queue/", b).status == "claimed"
    assert coord.claim("custom://queue/*", b).status == "busy"


@pytest.mark.backends
def test_a_glob_claim_lapses_with_its_holders_lease_and_wakes_a_waiter(
    opened: Coordinators,
) -> None:
    short = opened(claim_ttl=0.4)
    plain = opened()
    holder = short.register("holder").agent_id
    other = plain.register("other").agent_id
    assert short.claim("src/**/*.py", holder).status == "claimed"
    assert plain.claim("src/a.py", other).status == "busy"
    started = time.monotonic()
    waited = plain.wait("src/a.py", 10)  # no call renews the lease: it ends
    assert waited.status == "available" and time.monotonic() - started < 5
    assert plain.claim("src/a.py", other).status == "claimed"
    late = short.claim("src/b.py", holder)  # the holder is back: its glob is gone
    assert late.status == "claimed"
    assert plain.claim("src/**/*.py", other).status == "busy"  # holder's b.py now blocks it
    released = short.release("src/**/*.py", holder)
    assert released.status == "already_free" and released.ended is not None
    assert released.ended.outcome == "expired"


@pytest.mark.backends
def test_a_wait_for_a_pattern_ends_when_what_it_covers_is_released(coord: Coordinator) -> None:
    a, b = agents(coord, "a", "b")
    coord.claim("src/api/x.py", a)
    assert coord.wait("src/api/", 0.05).status == "timeout"
    coord.release("src/api/x.py", a)
    assert coord.wait("src/api/", 1).status == "available"
    assert coord.claim("src/api/", b).status == "claimed"


# --------------------------------------------------------------------------------------------
# Several resources at once, through the library
# --------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_a_set_is_granted_whole_or_not_at_all(coord: Coordinator) -> None:
    a, b = agents(coord, "a", "b")
    coord.claim("src/b.py", b)
    refused = coord.claim_many(["src/a.py", "src/b.py", "docs/"], a)
    assert refused.status == "busy"
    assert [(r.resource, r.status) for r in refused.results] == [
        ("file://default/src/a.py", "available"),
        ("file://default/src/b.py", "busy"),
        ("file://default/docs/", "available"),
    ]
    assert refused.results[1].holder is not None and refused.results[1].holder.agent_id == b
    assert coord.status("src/a.py").status == "available"  # nothing was granted
    coord.release("src/b.py", b, "modified")
    granted = coord.claim_many(["docs/", "src/a.py", "./src/b.py", "src/b.py"], a)
    assert granted.status == "claimed" and len(granted.results) == 3  # one spelling, once
    assert granted.results[2].previous is not None  # b's outcome is told
    assert granted.results[2].previous.outcome == "modified"
    looked = coord.status_many(["src/a.py", "docs/x.md", "src/c.py"])
    assert [s.status for s in looked] == ["claimed", "claimed", "available"]
    done = coord.release_many(
        [("src/a.py", "modified"), ("docs/", "released"), ("src/b.py", "moved", "src/c.py")], a
    )
    assert [r.status for r in done.results] == ["released"] * 3
    assert done.results[2].moved_to == "file://default/src/c.py"
    coord.claim("src/a.py", a)
    twice = coord.release_many([("src/a.py", "modified"), ("./src/a.py", "modified")], a)
    assert [(r.status, r.version) for r in twice.results] == [("released", 4), ("already_free", 4)]


@pytest.mark.backends
def test_a_release_of_a_set_with_one_foreign_claim_releases_none(coord: Coordinator) -> None:
    a, b = agents(coord, "a", "b")
    coord.claim("src/a.py", a)
    coord.claim("src/b.py", b)
    with pytest.raises(InvalidInputError, match="only the holder"):
        coord.release_many([("src/a.py", "modified"), ("src/b.py", "modified")], a)
    assert coord.status("src/a.py").status == "claimed"


@pytest.mark.backends
def test_a_set_writes_every_row_as_one_claim_at_a_time_would(
    coord: Coordinator, root: Path
) -> None:
    """A set's rows go to the database in one statement per table: versions, outcomes, moved_to,
    file ids and the events come out as single claims and releases leave them."""
    (root / "src" / "kept.py").write_text("x")  # exists: its claim records the file
    a, b = agents(coord, "a", "b")
    coord.claim("src/b.py", b)
    coord.release("src/b.py", b, "modified")  # b.py's row exists, at version 2
    names = ["src/a.py", "src/b.py", "src/kept.py", "custom://lock"]
    first = coord.claim_many(names, a)
    assert [(r.status, r.version) for r in first.results] == [
        ("claimed", 1), ("claimed", 3), ("claimed", 1), ("claimed", 1)
    ]  # fmt: skip
    assert first.results[1].previous is not None and first.results[1].previous.outcome == "modified"
    done = coord.release_many(
        [("src/a.py", "modified"), ("src/b.py", "moved", "src/c.py"), ("src/kept.py", "deleted"),
         ("custom://lock", "released")], a,
    )  # fmt: skip
    assert [(r.status, r.version, r.outcome, r.moved_to) for r in done.results] == [
        ("released", 2, "modified", None),
        ("released", 4, "moved", "file://default/src/c.py"),
        ("released", 2, "deleted", None),
        ("released", 2, "released", None),
    ]
    again = coord.claim_many(list(reversed(names)), a)  # every row exists: all are updated
    assert [(r.resource, r.version) for r in again.results] == [
        ("custom://lock", 3), ("file://default/src/kept.py", 3), ("file://default/src/b.py", 5),
        ("file://default/src/a.py", 3),
    ]  # fmt: skip
    assert {c.uri: (c.holder, c.version) for c in coord.list_claims()} == {
        r.resource: (a, r.version) for r in again.results
    }
    events = coord.db.fetchall(
        "SELECT event, uri, outcome, moved_to, version FROM claim_events "
        "WHERE agent_id = ? AND event != 'registered' ORDER BY id",
        (a,),
    )
    assert events[4:8] == [
        ("released", "file://default/src/a.py", "modified", None, 2),
        ("released", "file://default/src/b.py", "moved", "file://default/src/c.py", 4),
        ("released", "file://default/src/kept.py", "deleted", None, 2),
        ("released", "custom://lock", "released", None, 2),
    ]
    assert [(e[0], e[1], e[4]) for e in events[8:]] == [
        ("claimed", r.resource, r.version) for r in again.results
    ]
    # the file id of kept.py was written with the set: another name of the file is busy
    os.link(root / "src" / "kept.py", root / "src" / "alias.py")
    busy = coord.claim_many(["src/d.py", "src/alias.py"], b)
    assert [r.status for r in busy.results] == ["available", "busy"]
    holder = busy.results[1].holder
    assert holder is not None and (holder.agent_id, holder.held_as) == (
        a, "file://default/src/kept.py"
    )  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [[], "src/a.py", [("src/a.py", "bogus")], [("src/a.py",)], ["src/a.py"] * 101],
)
def test_bad_sets_are_invalid_input(coord: Coordinator, bad: Any) -> None:
    agent = coord.register("a").agent_id
    with pytest.raises(InvalidInputError):
        if bad and isinstance(bad, list) and isinstance(bad[0], tuple):
            coord.release_many(bad, agent)
        else:
            coord.claim_many(bad, agent)
    with pytest.raises(InvalidInputError):
        coord.release_many("src/a.py", agent)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        coord.status_many([])


def test_a_release_set_is_checked_item_by_item(coord: Coordinator) -> None:
    """A release is a tuple or any other sequence of (resource, outcome[, moved_to]); a bare
    string, an empty set and one of more than MAX_SET are refused with the reason."""
    agent = coord.register("a").agent_id
    coord.claim("src/a.py", agent)
    for bad, why in (
        ([], "1 to 100 releases, got 0"),
        ([("src/a.py", "released")] * 101, "1 to 100 releases, got 101"),
        (["src/a.py"], "each release is"),
        ([("src/a.py", "released", None, "x")], "each release is"),
    ):
        with pytest.raises(InvalidInputError, match=why):
            coord.release_many(bad, agent)  # type: ignore[arg-type]
    assert coord.status("src/a.py").holder is not None  # nothing was released
    done = coord.release_many([["src/a.py", "modified"]], agent)  # type: ignore[list-item]
    assert [r.status for r in done.results] == ["released"]


# --------------------------------------------------------------------------------------------
# Many processes claiming overlapping sets in random orders: a history checker
# --------------------------------------------------------------------------------------------

UNIVERSE = ["src/a.py", "src/b.py", "src/api/c.py", "src/api/d.py", "docs/e.md", "custom://lock",
            "src/api/", "src/**/*.py", "docs/*.md", "src/*.py"]  # fmt: skip


def check_history(coord: Coordinator) -> int:
    """Replay the claim events in commit order: no agent is ever granted a claim that conflicts
    with one another agent holds, and only holders release. Returns the events replayed."""
    rows = coord.db.fetchall(
        "SELECT agent_id, event, resource, uri FROM claim_events "
        "WHERE event IN ('claimed', 'released') ORDER BY id"
    )
    overlap = OverlapOracle(UNIVERSE)
    held: dict[str, tuple[str, str]] = {}  # key: (agent, name)
    for agent, event, key, uri in rows:
        if event == "released":
            assert held.pop(key, ("", ""))[0] == agent, (key, agent)
            continue
        name = uri.removeprefix("file://default/")
        for other, (holder, other_name) in held.items():
            if holder != agent:
                assert not overlap(name, other_name), (
                    f"{uri} granted to {agent} while {holder} held {other}"
                )
        held[key] = (agent, name)
    return len(rows)


def test_the_checkers_oracle_agrees_with_the_coordinator_on_the_universe(
    coord: Coordinator,
) -> None:
    """The history checker's oracle (support.OverlapOracle) and the Coordinator decide each
    pair of the workers' names alike: one agent holds one, another claims the other. Neither
    is taken from the other, so a checker with an oracle that saw no overlap at all, or one
    the Coordinator missed, fails here."""
    overlap = OverlapOracle(UNIVERSE)
    a, b = agents(coord, "a", "b")
    found = 0
    for x in UNIVERSE:
        coord.claim(x, a)
        for y in UNIVERSE:
            got = coord.claim(y, b)
            assert (got.status == "busy") == overlap(x, y), (x, y, got.status)
            if got.status == "claimed":
                coord.release(y, b)
            found += got.status == "busy"
        coord.release(x, a)
    assert found > len(UNIVERSE)  # more than each name with itself


@pytest.mark.backends
def test_processes_claiming_overlapping_sets_in_random_orders_never_overlap(
    coord: Coordinator, db_url: str, root: Path
) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), db_url, str(root), str(seed), "25", *UNIVERSE],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=child_env(),
        )
        for seed in range(4)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    granted = [s for r in reports for s in r["granted"]]
    assert granted and sum(r["busy"] for r in reports) > 0  # they did contend
    events = check_history(coord)
    # all or nothing: each granted set's claims are consecutive events of one transaction,
    # and no refused attempt left a claim behind
    rows = coord.db.fetchall(
        "SELECT agent_id, uri, version FROM claim_events WHERE event = 'claimed' ORDER BY id"
    )
    assert len(rows) == sum(len(s["uris"]) for s in granted)
    position = 0
    by_agent: dict[str, list[list[str]]] = {}
    for s in granted:
        by_agent.setdefault(s["agent"], []).append(s["uris"])
    seen: dict[str, int] = {}
    while position < len(rows):
        agent = rows[position][0]
        want = by_agent[agent][seen.get(agent, 0)]
        seen[agent] = seen.get(agent, 0) + 1
        got = [uri for _, uri, _ in rows[position : position + len(want)]]
        assert got == want and {a for a, _, _ in rows[position : position + len(want)]} == {agent}
        position += len(want)
    assert events >= 2 * len(rows)
    assert os.path.isdir(root)


# --------------------------------------------------------------------------------------------
# Through a real mcp.Client
# --------------------------------------------------------------------------------------------


@pytest.fixture
async def client(coord: Coordinator) -> AsyncIterator[Any]:
    async with in_process_client(coord, tools="standard") as (_, c):
        yield c


async def call(client: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    return reply_of(await client.call_tool(tool, arguments))


pytestmark = pytest.mark.anyio


@pytest.mark.backends
async def test_sets_and_patterns_over_mcp(client: Any) -> None:
    a = (await call(client, "agenthold_register", name="a"))["agent_id"]
    b = (await call(client, "agenthold_register", name="b"))["agent_id"]
    claimed = await call(client, "agenthold_claim", resources=["src/api/", "docs/*.md"], agent_id=a)
    assert claimed == {
        "status": "claimed",
        "resources": [
            {"status": "claimed", "resource": "file://default/src/api/", "version": 1},
            {"status": "claimed", "resource": "file://default/docs/*.md", "version": 1},
        ],
    }
    busy = await call(client, "agenthold_claim", resources=["src/x.py", "src/api/y.py"], agent_id=b)
    assert busy["status"] == "busy" and busy["hint"] == BUSY_SET_HINT
    assert busy["resources"][0] == {"status": "available", "resource": "file://default/src/x.py"}
    second = busy["resources"][1]
    assert (second["status"], second["held_by"], second["held_as"]) == (
        "busy",
        a,
        "file://default/src/api/",
    )
    one = await call(client, "agenthold_claim", resource="docs/readme.md", agent_id=b)
    assert one["status"] == "busy" and one["hint"] == BUSY_HINT
    assert one["held_as"] == "file://default/docs/*.md"
    status = await call(client, "agenthold_status", resources=["src/api/z.py", "src/x.py"])
    assert status["status"] == "claimed"
    assert [s["status"] for s in status["resources"]] == ["claimed", "available"]
    released = await call(
        client,
        "agenthold_release",
        agent_id=a,
        resources=[{"resource": "src/api/", "outcome": "modified"}, {"resource": "docs/*.md"}],
    )
    assert released["status"] == "released"
    assert [(r["status"], r["outcome"]) for r in released["resources"]] == [
        ("released", "modified"),
        ("released", "released"),
    ]
    later = await call(client, "agenthold_claim", resources=["src/api/y.py"], agent_id=b)
    assert later["status"] == "claimed"
    await call(client, "agenthold_claim", resource="src/z.py", agent_id=b)
    wide = await call(client, "agenthold_claim", resource="src/", agent_id=a)
    assert wide["status"] == "busy" and wide["hint"] == BUSY_HINT
    assert wide["conflicts"] == [
        {"resource": "file://default/src/api/y.py", "held_by": b},
        {"resource": "file://default/src/z.py", "held_by": b},
    ]


@pytest.mark.backends
async def test_globs_conflict_with_globs_and_held_files_over_mcp(client: Any) -> None:
    a = (await call(client, "agenthold_register", name="a"))["agent_id"]
    b = (await call(client, "agenthold_register", name="b"))["agent_id"]
    glob = await call(client, "agenthold_claim", resource="src/**/*.py", agent_id=a)
    assert glob == {"status": "claimed", "resource": "file://default/src/**/*.py", "version": 1}
    inner = await call(client, "agenthold_claim", resource="src/api/*.py", agent_id=b)
    assert {k: v for k, v in inner.items() if k != "claimed_at"} == {
        "status": "busy", "resource": "file://default/src/api/*.py", "held_by": a,
        "agent_name": "a", "held_as": "file://default/src/**/*.py", "hint": BUSY_HINT,
    }  # fmt: skip
    wide = await call(client, "agenthold_claim", resource="**", agent_id=b)
    assert (wide["status"], wide["held_by"], wide["held_as"]) == (
        "busy", a, "file://default/src/**/*.py",
    )  # fmt: skip
    other = await call(client, "agenthold_claim", resource="src/**/*.md", agent_id=b)
    assert other["status"] == "claimed"  # no file is both *.py and *.md
    await call(client, "agenthold_release", resource="src/**/*.py", agent_id=a)
    # the other way: a glob is busy behind the files another agent holds
    for name in ("src/api/x.py", "src/y.py"):
        await call(client, "agenthold_claim", resource=name, agent_id=b)
    behind = await call(client, "agenthold_claim", resource="src/api/*.py", agent_id=a)
    assert (behind["status"], behind["held_by"], behind["held_as"]) == (
        "busy", b, "file://default/src/api/x.py",
    )  # fmt: skip
    again = await call(client, "agenthold_claim", resource="src/**/*.py", agent_id=a)
    assert again["status"] == "busy" and again["hint"] == BUSY_HINT
    assert again["conflicts"] == [
        {"resource": "file://default/src/api/x.py", "held_by": b},
        {"resource": "file://default/src/y.py", "held_by": b},
    ]
    looked = await call(client, "agenthold_status", resource="src/api/x.py")
    assert (looked["status"], looked["held_by"]) == ("claimed", b)


@pytest.mark.backends
async def test_a_glob_stops_blocking_when_its_holders_claim_ttl_ends_over_mcp(
    opened: Coordinators,
) -> None:
    """With a claim TTL, a glob whose holder makes no call within it lapses: a wait for a file
    it covered answers 'available', the file is granted, and the holder is told its glob
    expired."""
    async with in_process_client(opened(claim_ttl=0.4), tools="standard") as (_, c):
        a = (await call(c, "agenthold_register", name="a"))["agent_id"]
        b = (await call(c, "agenthold_register", name="b"))["agent_id"]
        await call(c, "agenthold_claim", resource="src/**/*.py", agent_id=a)
        busy = await call(c, "agenthold_claim", resource="src/a.py", agent_id=b)
        assert (busy["status"], busy["held_as"]) == ("busy", "file://default/src/**/*.py")
        freed = await call(c, "agenthold_wait", resource="src/a.py", timeout_seconds=10)
        assert freed["status"] == "available" and freed["elapsed_seconds"] < 5
        taken = await call(c, "agenthold_claim", resource="src/a.py", agent_id=b)
        assert taken["status"] == "claimed"
        late = await call(c, "agenthold_release", resource="src/**/*.py", agent_id=a)
        assert late["status"] == "already_free" and "ended (expired)" in late["hint"]
        assert late["hint"].startswith(LAPSED_HINT.split("{")[0])


@pytest.mark.backends
async def test_a_directory_stops_blocking_when_its_holders_client_leaves_over_mcp(
    client: Any, db_url: str, root: Path
) -> None:
    """An agent claims a directory through a stdio server started with --disconnect-grace 0,
    and its client goes away: the server ends the agent's lease, so a file beneath it is
    granted to another agent, through another server, and the holder is told it was
    abandoned."""
    a = (await call(client, "agenthold_register", name="a"))["agent_id"]
    b = (await call(client, "agenthold_register", name="b"))["agent_id"]
    leaving = StdioServerParameters(
        command=sys.executable,
        args=agenthold_args(db_url, root, "--disconnect-grace", "0"),
        cwd=str(root),
        env=child_env(),
    )
    async with Client(leaving, read_timeout_seconds=60) as gone:  # type: ignore[arg-type]
        held = await call(gone, "agenthold_claim", resource="src/api/", agent_id=a)
        assert held["status"] == "claimed"
        busy = await call(client, "agenthold_claim", resource="src/api/x.py", agent_id=b)
        assert (busy["status"], busy["held_as"]) == ("busy", "file://default/src/api/")
    with anyio.fail_after(10):  # the server ends the lease as its input ends
        while (await call(client, "agenthold_status", resource="src/api/x.py"))["status"] != (
            "available"
        ):
            await anyio.sleep(0.05)
    taken = await call(client, "agenthold_claim", resource="src/api/x.py", agent_id=b)
    assert taken["status"] == "claimed"
    late = await call(client, "agenthold_release", resource="src/api/", agent_id=a)
    assert late["status"] == "already_free" and "ended (abandoned)" in late["hint"]


@pytest.mark.parametrize(
    ("tool", "arguments", "said"),
    [
        ("agenthold_claim", {"resources": "src/a.py"}, "must be an array"),
        ("agenthold_claim", {"resources": []}, "list of 1 to 100"),
        ("agenthold_claim", {"resources": [1]}, "must be a string"),
        ("agenthold_claim", {"resource": "a", "resources": ["b"]}, "not both"),
        ("agenthold_claim", {"resource": "src/a**/b"}, "whole path segment"),
        ("agenthold_claim", {"resource": "./"}, "to mean that, claim 'file://default/**'"),
        ("agenthold_status", {"resources": ["src/[x"]}, "no closing"),
        ("agenthold_release", {"resources": ["src/a.py"]}, "must be an object"),
        ("agenthold_release", {"resources": [{"resource": "a", "x": 1}]}, "does not take 'x'"),
        ("agenthold_release", {"resources": [{"resource": "a", "outcome": "gone"}]}, "one of"),
        ("agenthold_release", {"resources": [{"resource": "a", "moved_to": 3}]}, "a string"),
        ("agenthold_release", {"resources": [{"resource": "a"}], "outcome": "modified"}, "inside"),
    ],
)
async def test_bad_sets_and_globs_over_mcp_are_errors_with_hints(
    client: Any, tool: str, arguments: dict[str, Any], said: str
) -> None:
    if tool != "agenthold_status":
        arguments = {**arguments, "agent_id": (await call(client, "agenthold_register", name="x"))[
            "agent_id"
        ]}  # fmt: skip
    reply = reply_of(await client.call_tool(tool, arguments))
    assert reply["status"] == "error" and said in reply["message"], reply
    assert reply["hint"]


ROOT_LENGTH = 100  # characters: a deep checkout, e.g. /home/<user>/src/<org>/<repo> and more


async def test_the_standard_tool_list_and_instructions_fit_in_7_kb(tmp_path: Path) -> None:
    """The standard tool list plus the instructions is at most 7 KB of JSON, laid out as
    json.dumps does by default (a space after each , and :, so a little more than the compact
    JSON a client receives). The instructions name every workspace and its root, so the size
    depends on them: this assumes one workspace named "default" whose root is ROOT_LENGTH
    characters long; each further workspace adds a line of its name and root."""
    base = f"{tmp_path}/"
    assert len(base) < ROOT_LENGTH
    root = Path(base + "r" * (ROOT_LENGTH - len(base)))
    root.mkdir()
    assert len(str(root)) == ROOT_LENGTH
    with StateStore(tmp_path / "size.db") as store:
        coord = Coordinator(store, resolver=Resolver([Workspace("default", str(root))]))
        async with in_process_client(coord, tools="standard") as (_, c):
            tools = (await c.list_tools()).tools
            instructions = c.instructions
    assert instructions is not None and f"- default: {root}\n" in instructions
    listed = json.dumps(
        [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    )
    text = json.dumps(instructions)
    assert len(listed.encode()) + len(text.encode()) <= 7 * 1024, (len(listed), len(text))
