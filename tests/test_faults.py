"""Faults under a running server: a full disk, a write lock held elsewhere, a database file that
is read-only or deleted.

What must hold under each: every call gets a clear answer within a bounded time (over MCP a
failed write answers status "unavailable" with a message naming the cause and a hint; nothing
is an internal error and nothing crashes), nothing stored before is lost or changed (a canary
record and a canary claim, and every write the server acknowledged), reads keep working while
the file can be read, other callers are served meanwhile, and writes work again once the fault
is gone.

How each fault is made real, without touching agenthold's code:
- A full disk, three ways. SQLite's page limit (``PRAGMA max_page_count``), which SQLite reports
  exactly as it reports a full disk, put on every connection of an in-process server: the ones
  it has (``store.db._connections``) and the ones its worker threads open later (through the
  store's ``PRAGMAS``, which every new connection applies). A file-size limit (RLIMIT_FSIZE) put
  on a stdio server process from outside with prlimit, so the operating system refuses the
  writes. And, where the test may mount one (root on Linux), a real 1 MiB tmpfs that fills up.
- The write lock: another process (tests/helpers/store_worker.py hold-lock) holds it.
- Read-only: the file's mode is 0444 under a stdio server process. File modes do not stop root,
  so as root the server runs under setpriv without CAP_DAC_OVERRIDE.
- Deleted: the database's files are unlinked under a running in-process server.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from support import (
    ANSWER_LIMIT,
    StdioPipes,
    agenthold_args,
    another_process_holds_the_write_lock,
    child_env,
    coordinator_at,
    in_process_client,
    reply_of,
)

import agenthold.store as store_module
from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.serve.app import Agenthold
from agenthold.store import StateStore

pytestmark = pytest.mark.anyio

UNAVAILABLE_KEYS = {"status", "message", "hint"}
CANARY_NS, CANARY_KEY, CANARY_RESOURCE = "canary-ns", "canary", "custom://canary"


# --------------------------------------------------------------------------------------------
# The canary, and replies
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Canary:
    value: Any
    version: int
    holder: str | None
    claim_version: int


def plant_canary(coordinator: Coordinator) -> Canary:
    coordinator.store.set(
        CANARY_NS, CANARY_KEY, {"kept": ["a", 1]}, updated_by="canary", expected_version=0
    )
    agent = coordinator.register("canary").agent_id
    coordinator.claim(CANARY_RESOURCE, agent)
    return read_canary(coordinator)


def read_canary(coordinator: Coordinator) -> Canary:
    record = coordinator.store.get(CANARY_NS, CANARY_KEY)
    info = coordinator.info(coordinator.resolver.resolve(CANARY_RESOURCE))
    assert info is not None
    return Canary(record.value, record.version, info.holder, info.version)


def faults_reply(result: Any) -> dict[str, Any]:
    """A tool reply: strict JSON text equal to the structured content, never an internal error."""
    reply = reply_of(result)
    assert reply.get("error") != "internal", reply
    return reply


def assert_unavailable(reply: dict[str, Any], *says: str) -> None:
    assert set(reply) == UNAVAILABLE_KEYS and reply["status"] == "unavailable", reply
    assert reply["hint"], reply
    for words in says:
        assert words in reply["message"], reply


# --------------------------------------------------------------------------------------------
# An in-process server
# --------------------------------------------------------------------------------------------


@dataclass
class Served:
    client: Client
    app: Agenthold
    coordinator: Coordinator
    canary: Canary

    @property
    def store(self) -> StateStore:
        return self.coordinator.store

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        with anyio.fail_after(ANSWER_LIMIT):
            return faults_reply(await self.client.call_tool(tool, arguments))


@contextlib.asynccontextmanager
async def serving(
    root: Path, *, tools: str, mode: str = "auto", busy_timeout: float = 5.0
) -> AsyncIterator[Served]:
    store = StateStore(root / "faults.db", busy_timeout=busy_timeout)
    try:
        coordinator = coordinator_at(store, root)
        canary = plant_canary(coordinator)
        async with in_process_client(coordinator, tools=tools, mode=mode) as (app, client):
            yield Served(client, app, coordinator, canary)
        assert app.in_flight == 0
    finally:
        store.close()


def cap_growth(store: StateStore, monkeypatch: pytest.MonkeyPatch, pages: int) -> None:
    """Let the database file grow to at most ``pages`` pages (a number below its size stands
    for its size), on every connection the store holds and every one it opens later."""
    monkeypatch.setitem(store_module.PRAGMAS, "max_page_count", str(pages))
    for conn, _ in list(store.db._connections.values()):  # each with the lock of its use
        conn.execute(f"PRAGMA max_page_count = {pages}")


NO_GROWTH, ROOM = 1, 2**30


def integrity(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        result: str = conn.execute("PRAGMA integrity_check").fetchone()[0]
    return result


# --------------------------------------------------------------------------------------------
# A full disk
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_full_disk_makes_store_writes_unavailable_loses_nothing_and_then_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    async with serving(tmp_path, tools="advanced", mode=mode) as s:
        acked: dict[str, tuple[Any, int]] = {}  # what the server said it stored
        for i in range(5):
            done = await s.call(
                "agenthold_set",
                namespace="n",
                key=f"k{i}",
                value=[i],
                updated_by="w",
                expected_version=0,
            )
            acked[f"k{i}"] = ([i], done["version"])
        cap_growth(s.store, monkeypatch, NO_GROWTH)

        refused = 0
        for i in range(400):  # writes of 2 KB fill what room is left within a few pages
            key = f"k{i % 8}"
            value, version = acked.get(key, (None, 0))
            done = await s.call(
                "agenthold_set",
                namespace="n",
                key=key,
                value=["x" * 2000, i],
                updated_by="w",
                expected_version=version,
            )
            if done["status"] == "ok":
                acked[key] = (["x" * 2000, i], done["version"])
                continue
            assert_unavailable(done, "cannot grow", "nothing was written")
            refused += 1
            if refused == 5:
                break
        assert refused == 5, "the page limit never stopped a write"
        # small writes may still fit in a page with room left; each is done whole or not at all
        deleted = await s.call(
            "agenthold_delete",
            namespace="n",
            key="k0",
            deleted_by="w",
            expected_version=acked["k0"][1],
        )
        if deleted["status"] == "ok":
            del acked["k0"]
        else:
            assert_unavailable(deleted, "cannot grow")

        # reads go on, and see exactly what was acknowledged
        listed = await s.call("agenthold_list", namespace="n")
        assert {r["key"]: (r["value"], r["version"]) for r in listed["records"]} == acked
        history = await s.call("agenthold_history", namespace="n", key="k1", limit=1000)
        assert history["history"][0]["version"] == acked["k1"][1]
        watched = await s.call(
            "agenthold_watch", namespace="n", key="k1", since_version=0, timeout_seconds=0
        )
        assert (watched["status"], watched["version"]) == ("ok", acked["k1"][1])
        exported = await s.call("agenthold_export", namespace="n")
        assert exported["status"] == "ok" and len(exported["records"]) == len(acked)
        assert integrity(tmp_path / "faults.db") == "ok"

        cap_growth(s.store, monkeypatch, ROOM)  # room is made
        value, version = acked["k1"]
        done = await s.call(
            "agenthold_set",
            namespace="n",
            key="k1",
            value="after",
            updated_by="w",
            expected_version=version,
        )
        assert (done["status"], done["version"]) == ("ok", version + 1)
        acked["k1"] = ("after", version + 1)
        for key, (value, version) in acked.items():
            got = await s.call("agenthold_get", namespace="n", key=key)
            assert (got["value"], got["version"]) == (value, version)
        assert read_canary(s.coordinator) == s.canary
    assert integrity(tmp_path / "faults.db") == "ok"


async def test_a_full_disk_makes_claims_unavailable_keeps_every_acknowledged_claim_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(tmp_path, tools="standard") as s:
        agent = (await s.call("agenthold_register", name="filler"))["agent_id"]
        cap_growth(s.store, monkeypatch, NO_GROWTH)
        held: dict[str, int] = {}  # resource -> the version of the claim the server granted
        refused: list[str] = []
        for i in range(3000):  # each claim adds a row and an event: pages fill up
            resource = f"custom://r{i}"
            done = await s.call("agenthold_claim", resource=resource, agent_id=agent)
            if done["status"] == "unavailable":
                assert_unavailable(done, "cannot grow")
                refused.append(resource)
                if len(refused) == 3:
                    break
                continue
            assert done["status"] == "claimed", done
            held[resource] = done["version"]
        assert len(refused) == 3 and held, "the page limit never stopped a claim"
        for resource in refused:  # a refused claim left nothing behind
            assert (await s.call("agenthold_status", resource=resource))["status"] == "available"

        for resource, version in held.items():  # reads answer, with what was acknowledged
            status = await s.call("agenthold_status", resource=resource)
            assert (status["status"], status["held_by"], status["version"]) == (
                "claimed",
                agent,
                version,
            )
        waited = await s.call("agenthold_wait", resource="custom://free", timeout_seconds=0)
        assert waited["status"] == "available"
        assert read_canary(s.coordinator) == s.canary

        cap_growth(s.store, monkeypatch, ROOM)
        first = next(iter(held))
        released = await s.call(
            "agenthold_release", resource=first, agent_id=agent, outcome="modified"
        )
        assert (released["status"], released["version"]) == ("released", held[first] + 1)
        again = await s.call("agenthold_claim", resource="custom://after", agent_id=agent)
        assert again["status"] == "claimed"
        assert read_canary(s.coordinator) == s.canary
    assert integrity(tmp_path / "faults.db") == "ok"


# The stdio servers below serve their calls themselves (no ``stdio_path``): a file-size limit
# is put on the server by its pid (a warm call's pid is its front's), the full file system's
# checker runs once the server process has ended (a warm server would live on), and the
# read-only files are served as another user, whose runtime directory is not this one's.


class RawStdio(StdioPipes):
    """A stdio server process (``argv``) spoken to over its pipes, with the 2025-11-25
    handshake; a thread files what it writes by id (a line without an id under None)."""

    def handshake(self, client: str = "faults") -> None:
        super().handshake(client)

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = self.request("tools/call", {"name": tool, "arguments": arguments})
        reply: dict[str, Any] = json.loads(result["content"][0]["text"])
        assert reply == result["structuredContent"]
        assert reply.get("error") != "internal", reply
        return reply


def agenthold_argv(db: Path, root: Path, *flags: str) -> list[str]:
    return [sys.executable, *agenthold_args(db, root, *flags)]


@contextlib.contextmanager
def raw_stdio(root: Path, db: Path, *flags: str, ordinary_user: bool = False) -> Iterator[RawStdio]:
    argv = agenthold_argv(db, root, *flags)
    server = RawStdio(as_ordinary_user(argv) if ordinary_user else argv, root)
    try:
        server.handshake()
        yield server
    finally:
        status, err = server.close()
    assert status == 0 and "Traceback" not in err, err


def test_a_file_size_limit_refuses_writes_as_unavailable_and_lifting_it_recovers(
    tmp_path: Path,
) -> None:
    """The operating system refuses the writes (EFBIG): SQLite calls that an I/O error, and
    agenthold answers it as unavailable. Nothing acknowledged is lost."""
    db = tmp_path / "limited.db"
    with StateStore(db) as store:
        store.set("n", "before", "kept", updated_by="w")
    with raw_stdio(tmp_path, db, "--tools", "advanced") as server:
        server.call("agenthold_set", namespace="n", key="warm", value=1, updated_by="w", force=True)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        biggest = max(p.stat().st_size for p in tmp_path.glob("limited.db*"))
        resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (biggest, hard))
        acked: dict[str, int] = {}
        refused = []
        try:
            for i in range(60):
                done = server.call(
                    "agenthold_set",
                    namespace="n",
                    key=f"k{i}",
                    value="x" * 20_000,
                    updated_by="w",
                    expected_version=0,
                )
                if done["status"] == "ok":
                    acked[f"k{i}"] = done["version"]
                else:
                    refused.append(done)
            got = server.call("agenthold_get", namespace="n", key="before")
            assert got["value"] == "kept"  # reads go on
        finally:
            resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
        assert refused, "the file-size limit never stopped a write"
        for reply in refused:
            assert_unavailable(reply, "disk")  # today: "the database failed: disk I/O error"
        after = server.call(
            "agenthold_set",
            namespace="n",
            key="after",
            value="x" * 20_000,
            updated_by="w",
            expected_version=0,
        )
        assert after["status"] == "ok"
    with StateStore(db) as store:
        assert store.get("n", "before").value == "kept"
        assert {k: store.get("n", k).version for k in acked} == acked
        assert store.get("n", "after").version == 1
        assert store.db.fetchone("PRAGMA integrity_check")[0] == "ok"


def can_mount_tmpfs() -> bool:
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && umount /mnt"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root and mount namespaces (Linux)")
def test_a_filesystem_that_runs_out_of_space_refuses_writes_and_recovers_when_room_is_made(
    tmp_path: Path,
) -> None:
    """A real ENOSPC: the server runs in a private mount namespace on a 1 MiB tmpfs, half of
    it taken by a filler file. The test reaches the files through /proc/<pid>/root and makes
    room by deleting the filler; a checker in the same namespace reads the file afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    db = mount / "full.db"
    checker = (
        "import json;from agenthold.store import StateStore;"
        f"s=StateStore({str(db)!r});"
        "print(json.dumps({'integrity':s.db.fetchone('PRAGMA integrity_check')[0],"
        "'versions':{r.key:r.version for r in s.list_keys('n')}}))"
    )
    script = (
        f"mount -t tmpfs -o size=1m tmpfs {mount} && "
        f"dd if=/dev/zero of={mount}/filler bs=1k count=600 2>/dev/null && "
        f"{' '.join(agenthold_argv(db, tmp_path, '--tools', 'advanced'))} && "
        f'{sys.executable} -c "{checker}"'
    )
    server = RawStdio(["unshare", "-m", "sh", "-c", script], tmp_path)
    try:
        server.handshake()
        acked: dict[str, int] = {}
        refused = 0
        for i in range(300):  # 300 writes of 4 KB: more than the room left
            done = server.call(
                "agenthold_set",
                namespace="n",
                key=f"k{i}",
                value="y" * 4000,
                updated_by="w",
                expected_version=0,
            )
            if done["status"] == "ok":
                acked[f"k{i}"] = done["version"]
                continue
            assert_unavailable(done, "cannot grow", "nothing was written")
            refused += 1
            if refused == 5:
                break
        assert acked and refused == 5
        # every acknowledged write, in one page (a default page is 32 KiB: these are 4 kB)
        listed = server.call("agenthold_list", namespace="n", limit=1000, max_bytes=2**24)
        assert {r["key"]: r["version"] for r in listed["records"]} == acked
        # unshare became the shell, which runs the server: its root shows the small mount
        (Path(f"/proc/{server.proc.pid}/root") / str(mount).lstrip("/") / "filler").unlink()
        after = server.call(
            "agenthold_set",
            namespace="n",
            key="after",
            value="z",
            updated_by="w",
            expected_version=0,
        )
        assert after["status"] == "ok"
        acked["after"] = after["version"]
    finally:
        status, err = server.close()
    assert status == 0 and "Traceback" not in err, err
    checked = server.reply(None)  # the checker's line, written after the server ended
    assert checked == {"integrity": "ok", "versions": acked}


# --------------------------------------------------------------------------------------------
# Another process holds the write lock
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tools", ["standard", "advanced"])
async def test_a_write_lock_held_elsewhere_makes_writes_unavailable_while_reads_are_served(
    tmp_path: Path, tools: str
) -> None:
    """A dozen writers queue behind a lock another process holds: each is told "unavailable"
    (no sooner than the busy timeout), while reads, waits and watches of other callers are all
    answered before the first writer gives up. Once the lock is gone, writes work again."""
    busy = 2.0  # the margin the reads get: on a loaded 2-core machine they took 1.8 s
    async with serving(tmp_path, tools=tools, busy_timeout=busy) as s:
        agent = s.coordinator.register("worker").agent_id
        if tools == "standard":
            writes = [
                ("agenthold_claim", {"resource": f"w{i}.md", "agent_id": agent}) for i in range(12)
            ]
            reads = [
                ("agenthold_status", {"resource": CANARY_RESOURCE}),
                ("agenthold_wait", {"resource": CANARY_RESOURCE, "timeout_seconds": 0.05}),
                ("agenthold_wait", {"resource": "free.md", "timeout_seconds": 1}),
            ] * 4
        else:
            writes = [
                (
                    "agenthold_set",
                    {
                        "namespace": "n",
                        "key": f"w{i}",
                        "value": i,
                        "updated_by": "w",
                        "expected_version": 0,
                    },
                )
                for i in range(12)
            ]
            reads = [
                ("agenthold_get", {"namespace": CANARY_NS, "key": CANARY_KEY}),
                ("agenthold_list", {"namespace": CANARY_NS}),
                ("agenthold_history", {"namespace": CANARY_NS, "key": CANARY_KEY}),
                ("agenthold_export", {"namespace": CANARY_NS}),
                (
                    "agenthold_watch",
                    {
                        "namespace": CANARY_NS,
                        "key": CANARY_KEY,
                        "since_version": 0,
                        "timeout_seconds": 1,
                    },
                ),
            ] * 3
        answers: list[tuple[str, dict[str, Any], float]] = []
        start = time.monotonic()

        async def one(kind: str, tool: str, arguments: dict[str, Any]) -> None:
            reply = await s.call(tool, **arguments)
            answers.append((kind, reply, time.monotonic() - start))

        with another_process_holds_the_write_lock(tmp_path / "faults.db"):
            async with anyio.create_task_group() as tg:
                for tool, arguments in writes:
                    tg.start_soon(one, "write", tool, arguments)
                for tool, arguments in reads:
                    tg.start_soon(one, "read", tool, arguments)
        written = [(reply, at) for kind, reply, at in answers if kind == "write"]
        read = [(reply, at) for kind, reply, at in answers if kind == "read"]
        for reply, at in written:
            assert_unavailable(reply, "busy_timeout")
            assert "retry" in reply["hint"].lower()
            assert at >= busy * 0.9  # a writer waits for the lock before it gives up
        for reply, _ in read:
            assert reply["status"] in {"claimed", "timeout", "available", "ok"}, reply
            if "value" in reply:
                assert reply["value"] == s.canary.value  # not the holder's uncommitted change
        assert max(at for _, at in read) < min(at for _, at in written)

        tool, arguments = writes[0]
        assert (await s.call(tool, **arguments))["status"] in {"claimed", "ok"}
        assert read_canary(s.coordinator) == s.canary


# --------------------------------------------------------------------------------------------
# A read-only database file
# --------------------------------------------------------------------------------------------


def as_ordinary_user(argv: list[str]) -> list[str]:
    """``argv``, run so that file modes hold for it. They do not stop root, so as root it runs
    under setpriv without the capabilities that let root ignore them (CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH leave the bounding set, so the program never has them)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *argv]


@pytest.fixture
def file_modes_apply(tmp_path: Path) -> None:
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("as root, a server held to file modes needs setpriv (util-linux)")
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0o444)
    tried = subprocess.run(
        as_ordinary_user([sys.executable, "-c", f"open({str(probe)!r}, 'a')"]),
        capture_output=True,
    )
    probe.unlink()
    if tried.returncode == 0:
        pytest.skip("this process cannot start a server that is held to file modes")


def read_only_database(root: Path) -> tuple[Path, Canary]:
    db = root / "ro.db"
    with StateStore(db) as store:
        canary = plant_canary(Coordinator(store, resolver=Resolver([Workspace("d", "/")])))
    db.chmod(0o444)  # the last connection has closed: no -wal or -shm file is left
    return db, canary


def assert_intact(db: Path, canary: Canary) -> None:
    with StateStore(db) as store:
        assert read_canary(Coordinator(store, resolver=Resolver([Workspace("d", "/")]))) == canary
        assert store.db.fetchone("PRAGMA integrity_check")[0] == "ok"


@pytest.mark.usefixtures("file_modes_apply")
@pytest.mark.parametrize("tools", ["standard", "advanced"])
def test_a_read_only_database_file_serves_reads_and_answers_writes_unavailable(
    tmp_path: Path, tools: str
) -> None:
    db, canary = read_only_database(tmp_path)
    if tools == "standard":
        read = ("agenthold_status", {"resource": CANARY_RESOURCE})
        writes = [
            ("agenthold_register", {"name": "writer"}),
            ("agenthold_claim", {"resource": "x.md", "agent_id": canary.holder}),
        ]
    else:
        read = ("agenthold_get", {"namespace": CANARY_NS, "key": CANARY_KEY})
        writes = [
            (
                "agenthold_set",
                {
                    "namespace": "n",
                    "key": "k",
                    "value": 1,
                    "updated_by": "w",
                    "expected_version": 0,
                },
            ),
            (
                "agenthold_delete",
                {"namespace": CANARY_NS, "key": CANARY_KEY, "deleted_by": "w", "force": True},
            ),
        ]
    with raw_stdio(tmp_path, db, "--tools", tools, ordinary_user=True) as server:
        for _ in range(3):
            assert server.call(read[0], **read[1])["status"] in {"ok", "claimed"}
            for tool, arguments in writes:
                assert_unavailable(server.call(tool, **arguments), "read-only")
        # Made writable again while it runs, the file still refuses this server's writes:
        # SQLite keeps the read-only handles it opened.
        db.chmod(0o644)
        tool, arguments = writes[0]
        assert_unavailable(server.call(tool, **arguments), "read-only")
    assert_intact(db, canary)


@pytest.mark.usefixtures("file_modes_apply")
def test_after_a_read_only_spell_writes_need_the_shm_file_made_writable_too(
    tmp_path: Path,
) -> None:
    """SQLite gives the -shm file it creates the database file's mode. A server that ran on a
    read-only file leaves a read-only -shm behind, and until that is writable (or removed
    while no process has the database open) every later server is read-only too, even with
    the database file itself writable again."""
    db, canary = read_only_database(tmp_path)
    write = {"namespace": "n", "key": "k", "value": 1, "updated_by": "w", "expected_version": 0}
    with raw_stdio(tmp_path, db, "--tools", "advanced", ordinary_user=True) as server:
        assert_unavailable(server.call("agenthold_set", **write), "read-only")
    shm = tmp_path / "ro.db-shm"
    assert shm.stat().st_mode & 0o777 == 0o444
    db.chmod(0o644)
    with raw_stdio(tmp_path, db, "--tools", "advanced", ordinary_user=True) as server:
        assert_unavailable(server.call("agenthold_set", **write), "read-only")
    shm.chmod(0o644)
    with raw_stdio(tmp_path, db, "--tools", "advanced", ordinary_user=True) as server:
        assert server.call("agenthold_set", **write)["status"] == "ok"
    assert_intact(db, canary)


@pytest.mark.usefixtures("file_modes_apply")
def test_a_database_that_cannot_be_opened_for_writing_or_reading_stops_the_server_in_one_line(
    tmp_path: Path,
) -> None:
    """A read-only file in a read-only directory: SQLite cannot create the shared-memory
    file a WAL database needs even to read. The server says so once and exits 1, before any
    transport opens (a client that restarts it gets the same line, not a crash)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    with StateStore(folder / "ro.db") as store:
        store.set("n", "k", 1, updated_by="w")
    (folder / "ro.db").chmod(0o444)
    folder.chmod(0o555)
    try:
        done = subprocess.run(
            as_ordinary_user(agenthold_argv(folder / "ro.db", tmp_path)),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=child_env(),
            timeout=60,
        )
    finally:
        folder.chmod(0o755)
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert len(lines) == 1 and lines[0].startswith("agenthold: --db: "), done.stderr
    assert "read-only" in lines[0]


# --------------------------------------------------------------------------------------------
# A database file deleted under a running server
# --------------------------------------------------------------------------------------------


def delete_database(root: Path) -> None:
    for path in root.glob("faults.db*"):
        path.unlink()


async def test_a_database_deleted_under_a_running_server_answers_every_call_without_crashing(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, tools="advanced") as s:
        await s.call(
            "agenthold_set", namespace="n", key="k", value=1, updated_by="w", expected_version=0
        )
        delete_database(tmp_path)
        statuses: list[str] = []

        async def calls(i: int) -> None:
            for tool, arguments in [
                ("agenthold_get", {"namespace": "n", "key": "k"}),
                (
                    "agenthold_set",
                    {
                        "namespace": "n",
                        "key": f"k{i}",
                        "value": i,
                        "updated_by": "w",
                        "force": True,
                    },
                ),
                ("agenthold_list", {"namespace": "n"}),
            ]:
                reply = await s.call(tool, **arguments)  # within ANSWER_LIMIT, never internal
                statuses.append(reply["status"])

        async with anyio.create_task_group() as tg:  # on several worker threads at once
            for i in range(20):
                tg.start_soon(calls, i)
        assert set(statuses) <= {"ok", "not_found", "unavailable"}
        assert len(statuses) == 60


async def test_writes_after_the_database_file_is_deleted_are_refused_not_lost(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, tools="advanced") as s:
        await s.call(
            "agenthold_set", namespace="n", key="k", value=1, updated_by="w", expected_version=0
        )
        delete_database(tmp_path)
        for i in range(10):  # whichever worker thread and connection answers
            reply = await s.call(
                "agenthold_set", namespace="n", key="k", value=i + 2, updated_by="w", force=True
            )
            assert_unavailable(reply, "deleted")
        assert not list(tmp_path.glob("faults.db*"))  # no empty database took its place
