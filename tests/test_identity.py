"""Who is calling, over real HTTP on 127.0.0.1 with several principals and both protocol eras:
agents belong to the principal that registered them, scopes limit tool sets, namespaces and
claims, tools/list shows only what a principal may call, and history and claim events record
the principal beside updated_by. Also: every form of naming another's agent (a wait that
claims, lists of claims and releases) from several callers, names with disguising characters,
and a token file keeping out whoever has none of its tokens before any database work."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from support import (
    ACCEPT,
    ANSWER_LIMIT,
    LEGACY,
    TokenServer,
    flagged_call,
    open_session,
    token_server,
    tools_seen,
)
from test_auth import serving as auth_serving
from test_auth import set_request

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.identity.principals import TokenTable, add_token, revoke
from agenthold.store import StateStore

# slow: every test serves HTTP or MCP in process, about a second each; the fast lane leaves them out
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ERAS = ["auto", "legacy"]
SCOPED = {
    "alice": None,
    "bob": None,
    "standard-only": ["tools:standard"],
    "advanced-only": ["tools:advanced"],
    "team-a": ["write:team-a/*", "read:shared"],
    "repo-only": ["claim:repo"],
    "locks": ["claim:custom://deploy-*"],
    "team-a-claims": ["claim:file://repo/team-a/*"],
}


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, disconnect_grace: float | None = None
) -> AsyncIterator[TokenServer]:
    (tmp_path / "repo").mkdir()
    (tmp_path / "other").mkdir()
    resolver = Resolver(
        [Workspace("repo", str(tmp_path / "repo")), Workspace("other", str(tmp_path / "other"))]
    )
    async with token_server(
        tmp_path, SCOPED, tools="standard,advanced", resolver=resolver,
        disconnect_grace=disconnect_grace,
    ) as s:  # fmt: skip
        yield s


call = flagged_call


def claim_rows(db: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT * FROM claims ORDER BY resource").fetchall()


def events(db: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            "SELECT agent_id, event, uri, principal FROM claim_events ORDER BY id"
        ).fetchall()


def agents(db: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            "SELECT agent_id, last_seen_at, lease_ends_at, principal FROM agents ORDER BY agent_id"
        ).fetchall()


# --------------------------------------------------------------------------------------------
# Binding: an agent belongs to the principal that registered it
# --------------------------------------------------------------------------------------------


def assert_foreign(refused: tuple[bool, dict[str, Any]], *secret_names: str) -> None:
    is_error, reply = refused
    assert is_error and reply["status"] == "error"
    assert "belongs to another caller" in reply["message"]
    assert "nothing was changed" in reply["message"]
    text = str(reply)
    for name in secret_names:
        assert name not in text  # no hint of whose agent it is


@pytest.mark.parametrize("mode", ERAS)
async def test_another_principal_cannot_act_as_an_agent_it_did_not_register(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        async with server.client("alice", mode) as alice:
            _, registered = await call(alice, "agenthold_register", name="alice-agent")
            agent = registered["agent_id"]
            held, _ = await call(
                alice, "agenthold_claim", resource="file://repo/a.py", agent_id=agent
            )
            assert not held
        before = (claim_rows(server.db), events(server.db), agents(server.db))
        for intruder in ("bob", "shared", "repo-only", "standard-only"):
            async with server.client(intruder, mode) as other:
                assert_foreign(
                    await call(
                        other, "agenthold_claim", resource="file://repo/b.py", agent_id=agent
                    ),
                    "alice",
                )
                assert_foreign(
                    await call(
                        other, "agenthold_claim", resource="file://repo/a.py", agent_id=agent
                    ),
                    "alice",
                )
                for outcome in ("released", "modified", "deleted"):
                    assert_foreign(
                        await call(
                            other, "agenthold_release", resource="file://repo/a.py", agent_id=agent,
                            outcome=outcome,
                        ),
                        "alice",
                    )  # fmt: skip
                assert_foreign(
                    await call(
                        other, "agenthold_release", resource="file://repo/a.py", agent_id=agent,
                        outcome="moved", moved_to="file://repo/c.py",
                    ),
                    "alice",
                )  # fmt: skip
        # Nothing changed: no claim, no event, not even the agent's last-seen time or lease.
        assert (claim_rows(server.db), events(server.db), agents(server.db)) == before
        async with server.client("alice", mode) as alice:
            _, status = await call(alice, "agenthold_status", resource="file://repo/a.py")
            assert status["held_by"] == agent
            done, released = await call(
                alice, "agenthold_release", resource="file://repo/a.py", agent_id=agent
            )
            assert not done and released["status"] == "released"


async def test_a_refused_intruders_session_does_not_end_the_owners_lease(tmp_path: Path) -> None:
    """A session of the handshake era ends the leases of the agents it named when it closes
    (after the grace). A call refused because the agent is another principal's names nothing:
    the intruder's session closing leaves the owner's lease and claim alone, while the
    intruder's own agent in that session does lose its claim (the grace did run)."""
    grace = 0.3
    async with serving(tmp_path, disconnect_grace=grace) as server:
        async with server.client("alice", "auto") as alice:  # sessionless: names no session
            _, registered = await call(alice, "agenthold_register", name="alice-agent")
            victim = registered["agent_id"]
            held, _ = await call(
                alice, "agenthold_claim", resource="file://repo/a.py", agent_id=victim
            )
            assert not held
        async with server.client("bob", "legacy") as bob:
            _, own = await call(bob, "agenthold_register", name="bob-agent")
            failed, _ = await call(
                bob, "agenthold_claim", resource="file://repo/b.py", agent_id=own["agent_id"]
            )
            assert not failed
            for resource in ("file://repo/a.py", "file://repo/c.py"):
                assert_foreign(
                    await call(
                        bob, "agenthold_wait", resource=resource, agent_id=victim, claim=True,
                        timeout_seconds=0.2,
                    ),
                    "alice",
                )  # fmt: skip
            assert_foreign(
                await call(bob, "agenthold_claim", resource="file://repo/d.py", agent_id=victim),
                "alice",
            )
            assert_foreign(
                await call(bob, "agenthold_release", resource="file://repo/a.py", agent_id=victim),
                "alice",
            )
        async with server.client("alice", "auto") as alice:
            deadline = time.monotonic() + ANSWER_LIMIT
            while True:  # the intruder's own claim lapses once the grace has passed
                _, b = await call(alice, "agenthold_status", resource="file://repo/b.py")
                if b.get("held_by") is None or time.monotonic() > deadline:
                    break
                await anyio.sleep(0.05)
            assert b.get("held_by") is None, b
            _, a = await call(alice, "agenthold_status", resource="file://repo/a.py")
            assert a.get("held_by") == victim, a
    victims = [e for e in events(server.db) if e[0] == victim]
    assert [e[1] for e in victims] == ["registered", "claimed"], victims
    assert (own["agent_id"], "lease_ends") in [(e[0], e[1]) for e in events(server.db)]
    lease = next(row for row in agents(server.db) if row[0] == victim)[2]
    assert lease is None or lease > time.time() + 60, lease  # not ended by bob's session


@pytest.mark.parametrize("mode", ERAS)
async def test_a_principal_acts_as_its_own_agents_from_any_connection(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        async with server.client("bob", mode) as first:
            _, registered = await call(first, "agenthold_register", name="b")
        agent = registered["agent_id"]
        async with server.client("bob", "legacy" if mode == "auto" else "auto") as second:
            failed, claimed = await call(
                second, "agenthold_claim", resource="file://repo/x", agent_id=agent
            )
        assert not failed and claimed["status"] == "claimed"
        assert agents(server.db)[0][3] == "bob"


@pytest.mark.parametrize("mode", ERAS)
async def test_an_agent_registered_with_the_shared_token_is_not_a_file_principals(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        async with server.client("shared", mode) as shared:
            _, registered = await call(shared, "agenthold_register", name="s")
            agent = registered["agent_id"]
            ok, _ = await call(shared, "agenthold_claim", resource="file://repo/s", agent_id=agent)
            assert not ok
        async with server.client("alice", mode) as alice:
            assert_foreign(
                await call(alice, "agenthold_claim", resource="file://repo/t", agent_id=agent)
            )


async def test_an_unknown_agent_is_unknown_not_foreign(tmp_path: Path) -> None:
    async with serving(tmp_path) as server, server.client("alice", "auto") as alice:
        failed, reply = await call(
            alice, "agenthold_claim", resource="file://repo/a", agent_id="agent-0123456789abcdef"
        )
    assert failed and "belongs to another caller" not in reply["message"]
    assert "unknown" in reply["message"] or "not registered" in reply["message"]


async def test_agents_registered_through_a_trusted_transport_are_refused_to_principals(
    tmp_path: Path,
) -> None:
    """An agent without a principal (stdio, or HTTP without tokens) is not any principal's."""
    async with serving(tmp_path) as server:
        with StateStore(server.db) as store:
            agent = Coordinator(store).register("local").agent_id
        async with server.client("alice", "auto") as alice:
            assert_foreign(
                await call(alice, "agenthold_claim", resource="file://repo/a", agent_id=agent)
            )


# --------------------------------------------------------------------------------------------
# Who did it: history entries and claim events
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_history_and_claim_events_record_the_principal_beside_updated_by(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        async with server.client("alice", mode) as alice:
            await call(alice, "agenthold_set", namespace="n", key="k", value=1,
                       updated_by="claims-to-be-bob", expected_version=0)  # fmt: skip
            _, r = await call(alice, "agenthold_register", name="a")
            await call(alice, "agenthold_claim", resource="file://repo/f", agent_id=r["agent_id"])
            await call(alice, "agenthold_release", resource="file://repo/f", agent_id=r["agent_id"])
        async with server.client("shared", mode) as shared:
            await call(shared, "agenthold_delete", namespace="n", key="k",
                       deleted_by="x", expected_version=1)  # fmt: skip
            _, history = await call(shared, "agenthold_history", namespace="n", key="k")
    entries = history["history"]
    assert [(e["updated_by"], e["principal"]) for e in entries] == [
        ("x", "(shared token)"),
        ("claims-to-be-bob", "alice"),
    ]
    assert [(e[1], e[3]) for e in events(server.db)] == [
        ("registered", "alice"),
        ("claimed", "alice"),
        ("released", "alice"),
    ]


# --------------------------------------------------------------------------------------------
# Scopes
# --------------------------------------------------------------------------------------------

STANDARD = {
    "agenthold_register", "agenthold_claim", "agenthold_release", "agenthold_status",
    "agenthold_wait",
}  # fmt: skip
ADVANCED = {
    "agenthold_get", "agenthold_set", "agenthold_list", "agenthold_history", "agenthold_delete",
    "agenthold_watch", "agenthold_clear_namespace", "agenthold_export",
}  # fmt: skip


@pytest.mark.parametrize("mode", ERAS)
async def test_tools_list_shows_a_principal_only_the_tools_it_may_call(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        seen = await tools_seen(server, ["alice", "standard-only", "advanced-only", "team-a"], mode)
    assert seen["alice"] == seen["team-a"] == STANDARD | ADVANCED
    assert seen["standard-only"] == STANDARD
    assert seen["advanced-only"] == ADVANCED


ADVANCED_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("agenthold_get", {"namespace": "n", "key": "k"}),
    ("agenthold_set", {"namespace": "n", "key": "k", "value": 1, "updated_by": "x",
                       "force": True}),
    ("agenthold_list", {"namespace": "n"}),
    ("agenthold_history", {"namespace": "n", "key": "k"}),
    ("agenthold_delete", {"namespace": "n", "key": "k", "deleted_by": "x", "force": True}),
    ("agenthold_watch", {"namespace": "n", "key": "k", "since_version": 0,
                         "timeout_seconds": 0.1}),
    ("agenthold_clear_namespace", {"namespace": "n", "deleted_by": "x"}),
    ("agenthold_export", {"namespace": "n"}),
]  # fmt: skip
STANDARD_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("agenthold_register", {"name": "x"}),
    ("agenthold_claim", {"resource": "file://repo/a", "agent_id": "agent-0123456789abcdef"}),
    ("agenthold_release", {"resource": "file://repo/a", "agent_id": "agent-0123456789abcdef"}),
    ("agenthold_status", {"resource": "file://repo/a"}),
    ("agenthold_wait", {"resource": "file://repo/a", "timeout_seconds": 0.1}),
]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_tool_outside_a_principals_tool_sets_is_refused_naming_the_scope(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        before = events(server.db)
        for who, calls, missing in (
            ("standard-only", ADVANCED_CALLS, "tools:advanced"),
            ("advanced-only", STANDARD_CALLS, "tools:standard"),
        ):
            async with server.client(who, mode) as c:
                for tool, arguments in calls:
                    failed, reply = await call(c, tool, **arguments)
                    assert failed and reply["error"] == "forbidden", (tool, reply)
                    assert missing in reply["message"], reply
        with StateStore(server.db) as store:
            assert store.list_keys("n") == [] and store.history("n", "k") == []
        assert events(server.db) == before


@pytest.mark.parametrize("mode", ERAS)
async def test_namespace_scopes_limit_reading_and_writing_by_glob(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        async with server.client("alice", mode) as alice:
            for ns in ("team-a/x", "shared", "team-b"):
                await call(alice, "agenthold_set", namespace=ns, key="k", value=ns,
                           updated_by="alice", force=True)  # fmt: skip
        async with server.client("team-a", mode) as c:
            for tool, arguments in ADVANCED_CALLS:
                if tool == "agenthold_clear_namespace":
                    continue  # run last: it empties the namespace
                failed, reply = await call(c, tool, **{**arguments, "namespace": "team-a/x"})
                assert not failed, (tool, reply)
            for tool, arguments in ADVANCED_CALLS:
                failed, reply = await call(c, tool, **{**arguments, "namespace": "team-b"})
                assert failed and reply["error"] == "forbidden", (tool, reply)
                write = tool in ("agenthold_set", "agenthold_delete", "agenthold_clear_namespace")
                needed = "write:team-b" if write else "read:team-b"
                assert needed in reply["message"], (tool, reply)
            ok, got = await call(c, "agenthold_get", namespace="shared", key="k")
            assert not ok and got["value"] == "shared"
            for tool in ("agenthold_set", "agenthold_delete", "agenthold_clear_namespace"):
                arguments = dict(ADVANCED_CALLS)[tool]
                failed, reply = await call(c, tool, **{**arguments, "namespace": "shared"})
                assert failed and "write:shared" in reply["message"], (tool, reply)
            failed, _ = await call(
                c, "agenthold_clear_namespace", namespace="team-a/x", deleted_by="t"
            )
            assert not failed
    with StateStore(server.db) as store:
        assert [r.value for r in store.list_keys("team-b")] == ["team-b"]
        assert [r.value for r in store.list_keys("shared")] == ["shared"]


@pytest.mark.parametrize("mode", ERAS)
async def test_claim_scopes_limit_which_resources_a_principal_may_claim(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as server:
        for who, allowed, refused in (
            ("repo-only", ["file://repo/a.py", str(tmp_path / "repo" / "b.py")],
             ["file://other/a.py", "custom://deploy-prod"]),
            ("locks", ["custom://deploy-prod"], ["file://repo/a.py", "custom://other"]),
        ):  # fmt: skip
            async with server.client(who, mode) as c:
                _, registered = await call(c, "agenthold_register", name=who)
                agent = registered["agent_id"]
                for resource in allowed:
                    failed, reply = await call(
                        c, "agenthold_claim", resource=resource, agent_id=agent
                    )
                    assert not failed and reply["status"] == "claimed", (resource, reply)
                for resource in refused:
                    failed, reply = await call(
                        c, "agenthold_claim", resource=resource, agent_id=agent
                    )
                    assert failed and reply["error"] == "forbidden", (resource, reply)
                    assert "claim:" in reply["message"], reply
                    failed, reply = await call(  # nor may it queue for one (issue 15)
                        c, "agenthold_wait", resource=resource, agent_id=agent, claim=True,
                        timeout_seconds=0,
                    )  # fmt: skip
                    assert failed and reply["error"] == "forbidden", (resource, reply)
                    _, status = await call(c, "agenthold_status", resource=resource)
                    assert status.get("held_by") != agent  # nothing was claimed
                failed, reply = await call(
                    c, "agenthold_wait", resource=allowed[0], agent_id=agent, claim=True,
                    timeout_seconds=0,
                )  # fmt: skip
                assert not failed and reply["status"] == "already_claimed", reply


@pytest.mark.parametrize("mode", ERAS)
async def test_a_claim_scope_judges_every_name_of_a_hard_linked_file(
    tmp_path: Path, mode: str
) -> None:
    """A hard link inside a principal's claim scope to a file outside it is refused: the claim
    would block the file under its other name too. A link between two names in scope, and a
    file of one name, are claimed as before."""
    async with serving(tmp_path) as server:
        repo = tmp_path / "repo"
        (repo / "team-a").mkdir()
        (repo / "team-b").mkdir()
        (repo / "team-b" / "secret.py").write_text("b\n")
        os.link(repo / "team-b" / "secret.py", repo / "team-a" / "hl")
        (repo / "team-a" / "own.py").write_text("a\n")
        os.link(repo / "team-a" / "own.py", repo / "team-a" / "own-too.py")
        (repo / "team-a" / "plain.py").write_text("a\n")
        (tmp_path / "elsewhere.py").write_text("x\n")  # a name outside every workspace
        os.link(tmp_path / "elsewhere.py", repo / "team-a" / "far.py")
        async with server.client("team-a-claims", mode) as c:
            _, registered = await call(c, "agenthold_register", name="a")
            agent = registered["agent_id"]
            for tool, extra in (("agenthold_claim", {}), ("agenthold_wait", {
                "claim": True, "timeout_seconds": 0,
            })):  # fmt: skip
                failed, reply = await call(
                    c, tool, resource="file://repo/team-a/hl", agent_id=agent, **extra
                )
                assert failed and reply["error"] == "forbidden", reply
                assert "file://repo/team-b/secret.py" in reply["message"], reply
                assert "hard link" in reply["message"] and reply["hint"]
            failed, reply = await call(
                c,
                "agenthold_claim",
                resources=["file://repo/team-a/plain.py", "file://repo/team-a/hl"],
                agent_id=agent,
            )
            assert failed and reply["error"] == "forbidden", reply  # a set: none of it
            failed, reply = await call(
                c, "agenthold_claim", resource="file://repo/team-a/far.py", agent_id=agent
            )
            assert failed and reply["error"] == "forbidden", reply
            assert "not all of them could be found" in reply["message"], reply
            for name in (
                "file://repo/team-a/own.py", "file://repo/team-a/plain.py",
                "file://repo/team-a/new.py", "file://repo/team-a/*.md",
            ):  # fmt: skip
                failed, reply = await call(c, "agenthold_claim", resource=name, agent_id=agent)
                assert not failed and reply["status"] == "claimed", (name, reply)
        async with server.client("alice", mode) as c:  # nothing of the refused claims holds
            _, registered = await call(c, "agenthold_register", name="alice")
            failed, reply = await call(
                c, "agenthold_claim", resource="file://repo/team-b/secret.py",
                agent_id=registered["agent_id"],
            )  # fmt: skip
            assert not failed and reply["status"] == "claimed", reply


def test_the_other_names_of_a_file_are_found_or_the_search_says_it_could_not(
    tmp_path: Path,
) -> None:
    root = tmp_path / "w"
    (root / "d").mkdir(parents=True)
    (root / "one.py").write_text("1")
    (root / "two.py").write_text("2")
    os.link(root / "two.py", root / "d" / "again.py")
    os.link(root / "two.py", tmp_path / "outside.py")  # a name no workspace holds
    (root / "three.py").write_text("3")
    os.link(root / "three.py", root / "d" / "three.py")
    resolver = Resolver([Workspace("w", str(root))])
    one = resolver.resolve("one.py")
    assert resolver.names_of(one) == [str(root / "one.py")]
    assert resolver.names_of(resolver.resolve("missing.py")) == [str(root / "missing.py")]
    assert resolver.names_of(resolver.resolve("two.py")) is None  # one name is outside
    three = resolver.names_of(resolver.resolve("three.py"))
    assert three == [str(root / "three.py"), os.path.join(os.path.realpath(root), "d", "three.py")]
    assert resolver.names_of(resolver.resolve("three.py"), limit=1) is None  # walk cut short


# --------------------------------------------------------------------------------------------
# Sessions of the handshake era belong to the principal that opened them
# --------------------------------------------------------------------------------------------


async def test_a_session_whose_owner_was_forgotten_is_refused_not_served_to_anyone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owners of sessions are remembered up to a bound; past it, a session id of no known
    owner may be a forgotten one's, so it is refused (its client opens a new session) rather
    than served to whoever names it."""
    from agenthold.serve import auth

    monkeypatch.setattr(auth, "MAX_SESSIONS", 2)
    async with serving(tmp_path) as server:
        token = server.tokens["alice"]
        async with httpx2.AsyncClient(
            timeout=10, headers={"Authorization": f"Bearer {token}"}
        ) as alice:
            sessions = [await open_session(alice, server.url) for _ in range(3)]
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

            async def status(session: str) -> int:
                headers = {"Content-Type": "application/json", "Accept": ACCEPT,
                           "MCP-Protocol-Version": LEGACY, "Mcp-Session-Id": session}  # fmt: skip
                return (await alice.post(server.url, json=listing, headers=headers)).status_code

            assert [await status(x) for x in sessions] == [404, 200, 200]


async def test_a_session_cannot_be_used_or_ended_by_another_principal(tmp_path: Path) -> None:
    async with serving(tmp_path) as server:

        def http(who: str) -> httpx2.AsyncClient:
            token = server.shared if who == "shared" else server.tokens[who]
            return httpx2.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {token}"})

        async with http("alice") as alice, http("bob") as bob, http("shared") as shared:
            session = await open_session(alice, server.url)
            headers = {
                "Content-Type": "application/json",
                "Accept": ACCEPT,
                "MCP-Protocol-Version": LEGACY,
                "Mcp-Session-Id": session,
            }
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            for other in (bob, shared):
                used = await other.post(server.url, json=listing, headers=headers)
                ended = await other.delete(server.url, headers=headers)
                assert (used.status_code, ended.status_code) == (404, 404)
                assert used.json()["error"] == "unknown_session"
            still = await alice.post(server.url, json=listing, headers=headers)
            assert still.status_code == 200, still.text
            assert (await alice.delete(server.url, headers=headers)).status_code in (200, 204)


# --------------------------------------------------------------------------------------------
# Every way of naming another principal's agent, in both eras
# --------------------------------------------------------------------------------------------

INTRUDERS = ("bob", "shared", "repo-only", "standard-only")


def claim_state(db: Path) -> list[list[tuple[Any, ...]]]:
    """Every row of every claims table: what a refused call must leave exactly as it was (the
    agents' last-seen times and leases included)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("agents", "claims", "claim_events", "claim_shares", "claim_waiters")
        ]


async def alices_agent_holding(server: TokenServer, mode: str, resource: str) -> str:
    """An agent of alice's that holds ``resource``."""
    async with server.client("alice", mode) as alice:
        _, registered = await call(alice, "agenthold_register", name="alice-agent")
        agent: str = registered["agent_id"]
        failed, held = await call(alice, "agenthold_claim", resource=resource, agent_id=agent)
        assert not failed and held["status"] == "claimed", held
    return agent


@pytest.mark.parametrize("mode", ERAS)
async def test_a_wait_that_claims_for_another_principals_agent_is_refused_in_both_eras(
    tmp_path: Path, mode: str
) -> None:
    """agenthold_wait with claim: true hands a claim to the agent it names, so it is the same
    act as a claim: refused for an agent of another principal, whether the resource is free
    (it would be claimed at the first look), held (it would queue), a directory or a glob, and
    whatever the mode and timeout; no row changes and nobody is left in a queue."""
    async with serving(tmp_path) as server:
        victim = await alices_agent_holding(server, mode, "file://repo/held.py")
        before = claim_state(server.db)
        for intruder in INTRUDERS:
            async with server.client(intruder, mode) as other:
                for resource, extra in (
                    ("file://repo/free.py", {"timeout_seconds": 0}),
                    ("file://repo/free.py", {"timeout_seconds": 0.2, "mode": "shared"}),
                    ("file://repo/held.py", {"timeout_seconds": 0.2}),
                    ("file://repo/src/", {"timeout_seconds": 0}),
                    ("file://repo/**/*.py", {"timeout_seconds": 0}),
                ):
                    assert_foreign(
                        await call(
                            other, "agenthold_wait", resource=resource, agent_id=victim,
                            claim=True, **extra,
                        ),
                        "alice",
                    )  # fmt: skip
            assert claim_state(server.db) == before, intruder
        async with server.client("alice", mode) as alice:  # the owner still may
            failed, got = await call(
                alice, "agenthold_wait", resource="file://repo/free.py", agent_id=victim,
                claim=True, timeout_seconds=0,
            )  # fmt: skip
            assert not failed and got["status"] == "claimed", got


@pytest.mark.parametrize("mode", ERAS)
async def test_a_claim_or_release_of_a_list_for_another_principals_agent_changes_nothing(
    tmp_path: Path, mode: str
) -> None:
    """The list forms of agenthold_claim and agenthold_release name one agent for every item:
    another principal's agent is refused for the whole list (free resources and the ones the
    agent holds alike, in either claim mode, with any outcome), and nothing changes."""
    async with serving(tmp_path) as server:
        victim = await alices_agent_holding(server, mode, "file://repo/held.py")
        before = claim_state(server.db)
        claims: list[dict[str, Any]] = [
            {"resources": ["file://repo/a.py", "file://repo/b.py"]},
            {"resources": ["file://repo/a.py", "file://repo/held.py"]},
            {"resources": ["file://repo/docs/", "file://repo/**/*.md"], "mode": "shared"},
        ]
        releases: list[list[dict[str, Any]]] = [
            [{"resource": "file://repo/held.py"}],
            [{"resource": "file://repo/held.py", "outcome": "deleted"},
             {"resource": "file://repo/a.py", "outcome": "modified"}],
            [{"resource": "file://repo/held.py", "outcome": "moved",
              "moved_to": "file://repo/moved.py"}],
        ]  # fmt: skip
        for intruder in INTRUDERS:
            async with server.client(intruder, mode) as other:
                for arguments in claims:
                    assert_foreign(
                        await call(other, "agenthold_claim", agent_id=victim, **arguments),
                        "alice",
                    )
                for items in releases:
                    assert_foreign(
                        await call(other, "agenthold_release", agent_id=victim, resources=items),
                        "alice",
                    )
            assert claim_state(server.db) == before, intruder
        async with server.client("alice", mode) as alice:
            failed, released = await call(
                alice, "agenthold_release", agent_id=victim,
                resources=[{"resource": "file://repo/held.py"}],
            )  # fmt: skip
            assert not failed and released["status"] == "released", released


# --------------------------------------------------------------------------------------------
# Names that would disguise themselves
# --------------------------------------------------------------------------------------------

DISGUISES = ["\u202e", "\u200b"]  # right-to-left override; zero-width space


def every_table(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        tables = [
            t
            for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not t.startswith("sqlite_")
        ]
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in tables}


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("char", DISGUISES, ids=["U+202E", "U+200B"])
async def test_names_with_a_disguising_character_are_refused_by_every_tool_that_takes_one(
    tmp_path: Path, mode: str, char: str
) -> None:
    """A bidirectional override or a zero-width space makes two different names look alike (or
    one read backwards): agenthold_register's name, and every agent and thread name of the
    message tools, refuse them with a message naming the character, and nothing is stored."""
    resolver = Resolver([Workspace("repo", str(tmp_path))])
    async with token_server(
        tmp_path, {"alice": None}, tools="standard,messages", resolver=resolver
    ) as server, server.client("alice", mode) as alice:  # fmt: skip
        failed, made = await call(
            alice, "agenthold_create_thread", participant_names=["ann", "ben"], name="t"
        )
        assert not failed, made
        thread = made["thread_id"]
        bad = f"ann{char}gpj.exe"
        calls: list[tuple[str, dict[str, Any]]] = [
            ("agenthold_register", {"name": bad}),
            ("agenthold_create_agent", {"name": bad}),
            ("agenthold_create_thread", {"participant_names": ["ann", bad]}),
            ("agenthold_create_thread", {"participant_names": ["ann", "ben"], "name": bad}),
            ("agenthold_join_thread", {"thread_id": thread, "agent_name": bad}),
            ("agenthold_leave_thread", {"thread_id": thread, "agent_name": bad}),
            ("agenthold_thread_status", {"thread_id": thread, "agent_name": bad}),
            ("agenthold_has_unread", {"thread_id": thread, "agent_name": bad}),
            ("agenthold_mark_read", {"thread_id": thread, "agent_name": bad, "seq": 0}),
            ("agenthold_append", {"thread_id": thread, "sender_name": bad, "content": "hi"}),
            ("agenthold_delete_account", {"agent_id": bad}),
        ]
        before = every_table(server.db)
        for tool, arguments in calls:
            failed, reply = await call(alice, tool, **arguments)
            assert failed and reply["status"] == "error", (tool, reply)
            assert f"U+{ord(char):04X}" in reply["message"], (tool, reply)
            assert reply["hint"], (tool, reply)
        assert every_table(server.db) == before


# --------------------------------------------------------------------------------------------
# A token file keeps out whoever has no token of it, before any database work
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_shared_token", [False, True], ids=["auth-file", "both"])
async def test_a_request_without_a_token_of_the_file_gets_401_before_any_database_work(
    tmp_path: Path, with_shared_token: bool
) -> None:
    """With --auth-file (alone, or beside --auth-token), a request with no token, a wrong one,
    a revoked one or a digest copied from the file is answered 401, and the write it carries
    is never made, while a principal's token in the same run is served (the proof of
    tests/test_auth.py for --auth-token, for the file)."""
    auth_file = tmp_path / "tokens.json"
    alice, _ = add_token(auth_file, "alice")
    revoked, _ = add_token(auth_file, "gone")
    revoke(auth_file, "gone")
    copied = json.loads(auth_file.read_text())["principals"]["alice"]["tokens"][0]["sha256"]
    refusals = [None, "Bearer wrong-token", f"Bearer {revoked}", f"Bearer {copied}",
                f"Basic {alice}", "Bearer"]  # fmt: skip
    shared = ["shared-token-for-everyone"] if with_shared_token else []
    async with (
        auth_serving(tmp_path, shared, auth_file=TokenTable(auth_file)) as url,
        httpx2.AsyncClient(timeout=10) as http,
    ):
        for n, authorization in enumerate(refusals):
            body, headers = set_request(f"refused-{n}")
            extra = {} if authorization is None else {"Authorization": authorization}
            refused = await http.post(url, json=body, headers={**headers, **extra})
            assert refused.status_code == 401, (authorization, refused.text)
            assert refused.json()["error"] == "unauthorized"
        body, headers = set_request("accepted")
        accepted = await http.post(
            url, json=body, headers={**headers, "Authorization": f"Bearer {alice}"}
        )
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["result"]["structuredContent"]["status"] == "ok"
    with StateStore(tmp_path / "state.db") as store:
        assert [r.key for r in store.list_keys("n")] == ["accepted"]
        assert [e.principal for e in store.history("n", "accepted")] == ["alice"]
