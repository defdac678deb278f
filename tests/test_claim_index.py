"""Tests of agenthold.claims.index: the held patterns a Coordinator keeps between claims are never
stale (another process's or another connection's glob claim is seen by the very next claim, on
both backends), and the index finds exactly the patterns covers_file finds.

Other processes are ``python -c`` children running a Coordinator on the test's database.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, Coordinators, child_env

from agenthold.claims import Coordinator
from agenthold.claims.index import HeldPatterns
from agenthold.claims.names import Resolver, Workspace
from agenthold.claims.patterns import covers_file, parse_pattern

# argv: db, root, then "claim PATTERN" (prints the new agent's id) or "release PATTERN AGENT"
CHILD = """
import sys
from agenthold.claims import Coordinator
from agenthold.store import StateStore
from agenthold.claims.names import Resolver, Workspace
db, root, op, pattern, *agent = sys.argv[1:]
store = StateStore(db)
coord = Coordinator(store, resolver=Resolver([Workspace("default", root)]))
if op == "claim":
    agent = coord.register("other").agent_id
    assert coord.claim(pattern, agent).status == "claimed"
    print(agent)
else:
    assert coord.release(pattern, agent[0]).status == "released"
store.close()
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "src").mkdir(parents=True)
    return path


def child(db: str, root: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, db, str(root), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=child_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def claim_and_release(coord: Coordinator, agent: str, resource: str) -> None:
    assert coord.claim(resource, agent).status == "claimed"
    assert coord.release(resource, agent).status == "released"


@pytest.mark.backends
def test_a_glob_claimed_in_another_process_is_seen_by_the_next_claim(
    opened: Coordinators, db_url: str, root: Path
) -> None:
    coord = opened()
    me = coord.register("me").agent_id
    claim_and_release(coord, me, "src/a.py")  # the index is built: no pattern held
    other = child(db_url, root, "claim", "src/*.py")
    busy = coord.claim("src/a.py", me)
    assert busy.status == "busy"
    assert busy.holder is not None and busy.holder.agent_id == other
    assert busy.holder.held_as == "file://default/src/*.py"
    claim_and_release(coord, me, "src/a.txt")  # not covered: the index was rebuilt, not lost
    child(db_url, root, "release", "src/*.py", other)
    claim_and_release(coord, me, "src/a.py")
    # and a second glob among many kept ones: the index is rebuilt again, then kept
    for i in range(30):
        assert coord.claim(f"src/x{i}*.md", me).status == "claimed"
    claim_and_release(coord, me, "src/a.py")
    other = child(db_url, root, "claim", "src/**/a.p?")
    assert coord.claim("src/a.py", me).status == "busy"


@pytest.mark.backends
def test_a_directory_claimed_through_another_connection_is_seen_at_once(
    opened: Coordinators,
) -> None:
    mine, theirs = opened(), opened()  # two stores: two connections, as two servers have
    me, them = mine.register("me").agent_id, theirs.register("them").agent_id
    claim_and_release(mine, me, "src/deep/a.py")
    assert theirs.claim("src/", them).status == "claimed"
    assert mine.claim("src/deep/a.py", me).status == "busy"
    assert mine.claim_many(["src/b.txt", "README.md"], me).status == "busy"
    theirs.release("src/", them)
    assert mine.claim_many(["src/b.txt", "README.md"], me).status == "claimed"


def delete_patterns(coord: Coordinator) -> None:
    with coord.db.write() as (conn, _):
        conn.execute("DELETE FROM claims WHERE scope IS NOT NULL")


def token(coord: Coordinator) -> str:
    return str(coord.db.fetchone("SELECT token FROM claim_patterns")[0])


@pytest.mark.backends
def test_the_pattern_token_changes_with_every_pattern_write_and_no_file_write(
    opened: Coordinators,
) -> None:
    coord = opened()
    me = coord.register("me").agent_id
    seen = [token(coord)]
    claim_and_release(coord, me, "src/a.py")
    assert coord.claim_many(["src/b.py", "custom://lock"], me).status == "claimed"
    assert token(coord) == seen[-1]  # files and custom names leave it alone
    for write in (
        lambda: coord.claim("src/*.py", me),  # a new pattern row
        lambda: coord.release("src/*.py", me),
        lambda: coord.claim("src/*.py", me),  # an old row held again
        lambda: coord.release_all(me),
        lambda: delete_patterns(coord),
    ):
        write()
        assert token(coord) not in seen
        seen.append(token(coord))


def test_the_index_finds_exactly_what_covers_file_finds(root: Path) -> None:
    resolver = Resolver([Workspace("default", str(root))], case_insensitive=False)
    patterns = [
        parse_pattern(resolver, text)
        for text in (
            "src/", "src/api/", "src/*.py", "src/**/*.py", "src/**/x?.md", "src/[ab]*.txt",
            "src/[!a]b", "src/a[*]", "src/**", "src/*", "src/a*b*c", "s?c/x.md", "**/*.py",
            "src/*/t[0-9]", "src/x*", "*", "src/*.p[xy]", "src/**/api/*", "src/[]]x",
        )
    ]  # fmt: skip
    index = HeldPatterns.build("t", [(p.key, p.scope) for p in patterns])
    names = ["a.py", "x1.md", "xy.md", "a.txt", "b.txt", "bb", "ab", "a*", "abc", "t7", "x",
             "a.px", "]x", "api"]  # fmt: skip
    dirs = ["", "src/", "src/api/", "src/deep/", "src/deep/api/", "sxc/", "other/"]
    prefix = resolver.resolve("f").key[: -len("f")]
    rng = random.Random(15)
    files = [prefix + d + n for d, n in itertools.product(dirs, names)]
    for file in files:
        expected = {p.key for p in patterns if covers_file(p.key, p.scope, file)}
        assert set(index.covering([file])) == expected, file
    for _ in range(50):
        some = rng.sample(files, 5)
        expected = {p.key for p in patterns for f in some if covers_file(p.key, p.scope, f)}
        assert set(index.covering(some)) == expected
    assert HeldPatterns.build("t", []).covering(files) == []


@pytest.mark.backends
def test_without_a_pattern_token_every_claim_reads_the_patterns_afresh(
    opened: Coordinators,
) -> None:
    """A database whose token row is gone (emptied by hand) has nothing to key an index on:
    claims still see every glob, read from the claims table each time."""
    coord = opened()
    me, them = coord.register("me").agent_id, coord.register("them").agent_id
    with coord.db.write() as (conn, _):
        conn.execute("DELETE FROM claim_patterns")
    claim_and_release(coord, me, "src/a.py")
    assert coord.claim("src/*.py", them).status == "claimed"
    assert coord.claim("src/a.py", me).status == "busy"
    coord.release("src/*.py", them)
    claim_and_release(coord, me, "src/a.py")
