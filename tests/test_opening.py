"""Opening a SQLite file where SQLite alone says only "unable to open database file".

Two such places, each through the library, the inspector and the server: a path longer than
SQLite takes (it resolves symbolic links, so no shorter name of the same file helps: the cause
is named, with the limit), and a read-only directory holding a WAL database without its -shm
file, which SQLite cannot create there. Read-only openings read such a file by itself when
that is exact (its log holds no commit); when the log holds commits, the cause is named. Real
files, real processes; the read-only directory is tested as an ordinary user (as root, under
setpriv without the capabilities that let root ignore file modes).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from support import agenthold_args, child_env

from agenthold.store import SQLITE_MAX_PATH, IncompatibleDatabaseError, StateStore


def long_path(tmp_path: Path, length: int) -> Path:
    """A new file name under ``tmp_path`` whose full path is ``length`` bytes long."""
    folder = Path(os.path.realpath(tmp_path))
    while len(str(folder)) < length - 60:
        folder = folder / ("d" * 40)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / ("x" * (length - len(str(folder)) - 1))


def run(*argv: str, ordinary_user: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, *argv]
    if ordinary_user and os.geteuid() == 0:
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=child_env(),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_path_longer_than_sqlite_takes_is_refused_naming_the_limit(tmp_path: Path) -> None:
    longest = long_path(tmp_path, SQLITE_MAX_PATH)
    with StateStore(longest) as store:  # the longest path SQLite takes opens as any other
        store.set("ns", "k", 1, updated_by="t")
        assert store.get("ns", "k").value == 1
    too_long = long_path(tmp_path, SQLITE_MAX_PATH + 1)
    with pytest.raises(IncompatibleDatabaseError, match=r"full path is 505 bytes") as caught:
        StateStore(too_long)
    assert "over 504 bytes" in str(caught.value) and "shorter path" in (caught.value.hint or "")
    assert not too_long.exists()
    link = tmp_path / "short.db"  # a short name of the same file is no way round it
    link.symlink_to(longest.parent / (longest.name + "y"))
    with pytest.raises(IncompatibleDatabaseError, match="full path is 505 bytes"):
        StateStore(link)
    for argv in (
        ["-m", "agenthold", "namespaces", "--db", str(too_long)],
        agenthold_args(too_long, tmp_path),
    ):
        done = run(*argv)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr  # a bad --db: usage
        assert "SQLite opens no database whose full path is over 504 bytes" in lines[0]
        assert "full path is 505 bytes" in lines[0]


def test_the_command_line_and_the_store_know_one_path_limit() -> None:
    from agenthold import store
    from agenthold.db import locations

    assert locations.SQLITE_MAX_PATH == store.SQLITE_MAX_PATH


@pytest.fixture
def file_modes_apply(tmp_path: Path) -> None:
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("as root, a process held to file modes needs setpriv (util-linux)")
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0o444)
    tried = run("-c", f"open({str(probe)!r}, 'a')", ordinary_user=True)
    probe.unlink()
    if tried.returncode == 0:
        pytest.skip("this process cannot start a process that is held to file modes")


READ = (
    "import sys; from agenthold.store import StateStore; "
    "s = StateStore(sys.argv[1], read_only=True); print(s.get('ns', 'k').value)"
)
EXIT_WITH_LOG = (  # a writer that ends without closing: its log stays, with its commits
    "import os, sys; from agenthold.store import StateStore; "
    "s = StateStore(sys.argv[1]); s.set('ns', 'k', 'in the log', updated_by='t'); os._exit(0)"
)


def read_only_folder(tmp_path: Path, log: str) -> Path:
    """A WAL database in a directory that cannot be written, without its -shm file; ``log``:
    "none" (a clean close removed it), "empty" (checkpointed to nothing), "commits"."""
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "agenthold.db"
    with StateStore(db) as store:
        store.set("ns", "k", "in the file", updated_by="t")
    if log == "commits":
        assert run("-c", EXIT_WITH_LOG, str(db)).returncode == 0
    elif log == "empty":
        Path(f"{db}-wal").write_bytes(b"")
    Path(f"{db}-shm").unlink(missing_ok=True)
    for path in folder.iterdir():
        path.chmod(0o444)
    folder.chmod(0o555)
    return db


@pytest.mark.usefixtures("file_modes_apply")
@pytest.mark.parametrize("log", ["none", "empty"])
def test_a_read_only_directory_without_the_shm_file_is_read_when_the_log_holds_nothing(
    tmp_path: Path, log: str
) -> None:
    db = read_only_folder(tmp_path, log)
    before = {p.name: p.read_bytes() for p in db.parent.iterdir()}
    try:
        read = run("-c", READ, str(db), ordinary_user=True)
        assert (read.returncode, read.stdout.strip()) == (0, "in the file"), read.stderr
        listed = run("-m", "agenthold", "keys", "ns", "--db", str(db), ordinary_user=True)
        assert listed.returncode == 0 and "k" in listed.stdout, listed.stderr
        assert {p.name: p.read_bytes() for p in db.parent.iterdir()} == before
    finally:
        db.parent.chmod(0o755)


@pytest.mark.usefixtures("file_modes_apply")
def test_a_read_only_directory_whose_log_holds_commits_without_the_shm_file_names_the_cause(
    tmp_path: Path,
) -> None:
    db = read_only_folder(tmp_path, "commits")
    before = {p.name: p.read_bytes() for p in db.parent.iterdir()}
    try:
        for argv in (["-c", READ, str(db)], ["-m", "agenthold", "namespaces", "--db", str(db)]):
            done = run(*argv, ordinary_user=True)
            assert done.returncode == 1, done.stderr
            assert "unable to open" not in done.stderr
            assert "holds commits that are not in the file yet" in done.stderr
            assert "cannot be created in the read-only directory" in done.stderr
        lines = done.stderr.strip().splitlines()  # the inspector's: one line
        assert len(lines) == 1, done.stderr
        assert {p.name: p.read_bytes() for p in db.parent.iterdir()} == before
    finally:
        db.parent.chmod(0o755)
    read = run("-c", READ, str(db), ordinary_user=True)  # once the directory can be written
    assert (read.returncode, read.stdout.strip()) == (0, "in the log"), read.stderr


@pytest.mark.usefixtures("file_modes_apply")
def test_a_rollback_journal_file_in_a_read_only_directory_is_opened_as_sqlite_opens_it(
    tmp_path: Path,
) -> None:
    """Only a WAL database needs the -shm file: another SQLite file in a read-only directory
    is opened as ever, and refused for what it is."""
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "plain.db"
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("CREATE TABLE t (x)")
    folder.chmod(0o555)
    try:
        done = run("-m", "agenthold", "namespaces", "--db", str(db), ordinary_user=True)
    finally:
        folder.chmod(0o755)
    assert done.returncode == 1 and "not an agenthold database" in done.stderr, done.stderr


@pytest.mark.usefixtures("file_modes_apply")
def test_a_read_only_directory_whose_log_cannot_be_read_is_never_read_without_it(
    tmp_path: Path,
) -> None:
    """A log this process may not read could hold commits: reading the file alone would
    answer with data older than what was acknowledged. It is refused, never read past."""
    db = read_only_folder(tmp_path, "commits")
    Path(f"{db}-wal").chmod(0o000)
    try:
        done = run("-c", READ, str(db), ordinary_user=True)
        assert "in the file" not in done.stdout, done.stdout
        assert done.returncode == 1, done.stderr
        listed = run("-m", "agenthold", "namespaces", "--db", str(db), ordinary_user=True)
        assert listed.returncode == 1 and len(listed.stderr.strip().splitlines()) == 1
        assert f"{db}-wal" in listed.stderr, listed.stderr
    finally:
        db.parent.chmod(0o755)
        Path(f"{db}-wal").chmod(0o644)
