"""Where the database is when --db is not given, and how --db and --workspace are read.

One database per user (the platform's state directory), the same for the server and the
inspector, overridden by --db and then AGENTHOLD_DB; a leading ~ is expanded; only the server
creates the directory, with mode 0700. Real processes on real files, the state directory pointed
at the test's temporary directory through XDG_STATE_HOME. The server starts run cold and
through a warm server (``stdio_path``): a warm server, which opens the database in a process of
its own, must find the same per-user file and make its directory the same way.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, child_env

from agenthold.cli.main import (
    UsageError,
    build_parser,
    database_path,
    serve_options,
    state_directory,
    workspace_spec,
)

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX modes and HOME")


def agenthold(
    *args: str, cwd: Path, env: dict[str, str], stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthold", *args],
        cwd=cwd,
        env={**child_env(), **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HOME without XDG_STATE_HOME or AGENTHOLD_DB, for this process and its children."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("AGENTHOLD_DB", raising=False)
    return path


# --- the state directory of each platform ----------------------------------------------------


@posix_only
def test_the_state_directory_follows_xdg_state_home_on_linux(home: Path) -> None:
    assert state_directory({}, "linux") == str(home / ".local" / "state" / "agenthold")
    assert state_directory({"XDG_STATE_HOME": "/x/state"}, "linux") == "/x/state/agenthold"
    # a relative XDG_STATE_HOME is not valid, so it is ignored
    assert state_directory({"XDG_STATE_HOME": "rel"}, "linux") == state_directory({}, "linux")


@posix_only
def test_the_state_directory_on_macos_and_windows(home: Path) -> None:
    assert state_directory({}, "darwin") == str(
        home / "Library" / "Application Support" / "agenthold"
    )
    local = os.path.join("C:", "Users", "me", "AppData", "Local")
    assert state_directory({"LOCALAPPDATA": local}, "win32") == os.path.join(local, "agenthold")
    assert state_directory({}, "win32") == str(home / "AppData" / "Local" / "agenthold")


# --- choosing the database -------------------------------------------------------------------


@posix_only
def test_db_flag_beats_agenthold_db_beats_the_state_directory(home: Path) -> None:
    env = {"XDG_STATE_HOME": "/s", "AGENTHOLD_DB": "/e/env.db"}
    assert database_path("/f/flag.db", env) == ("/f/flag.db", False)
    assert database_path(None, env) == ("/e/env.db", False)
    assert database_path(None, {"XDG_STATE_HOME": "/s"}) == ("/s/agenthold/agenthold.db", True)
    assert database_path(None, {"XDG_STATE_HOME": "/s", "AGENTHOLD_DB": ""})[1] is True


@posix_only
def test_a_leading_tilde_is_expanded_in_db_and_workspace(home: Path) -> None:
    assert database_path("~/a.db", {}) == (str(home / "a.db"), False)
    assert database_path(None, {"AGENTHOLD_DB": "~/b.db"}) == (str(home / "b.db"), False)
    assert database_path(":memory:", {}) == (":memory:", False)
    assert workspace_spec("proj=~/code") == f"proj={home}/code"
    assert workspace_spec("~/code") == f"{home}/code"
    assert workspace_spec("proj=/abs") == "proj=/abs"
    (home / "code").mkdir()
    args = build_parser().parse_args(["--db", "~/x.db", "--workspace", "proj=~/code"])
    opts, _ = serve_options(args, {})
    assert opts.db == str(home / "x.db")
    assert [(w.name, w.root) for w in opts.workspaces] == [("proj", str(home / "code"))]


@pytest.mark.parametrize("given", ["", "   "])
def test_an_empty_db_is_a_usage_error(given: str) -> None:
    with pytest.raises(UsageError, match="--db: an empty path"):
        database_path(given, {})


def test_a_db_path_over_the_platforms_limit_names_the_cause(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="longer than this system allows"):
        database_path(str(tmp_path / ("n" * 300)), {})
    with pytest.raises(UsageError, match=r"AGENTHOLD_DB: .*longer than this system allows"):
        database_path(None, {"AGENTHOLD_DB": str(tmp_path / ("n" * 253))})  # fine but its -wal


def test_a_db_path_with_a_nul_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="NUL"):
        database_path("a\x00b", {})


# --- the server and the inspector ------------------------------------------------------------


@posix_only
@pytest.mark.usefixtures("stdio_path")
def test_servers_started_in_different_directories_share_the_per_user_database(
    home: Path, tmp_path: Path
) -> None:
    state = home / ".local" / "state" / "agenthold"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    first = agenthold(cwd=one, env={})  # stdin at its end: open the database, then stop
    assert first.returncode == 0, first.stderr
    assert (state / "agenthold.db").is_file()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert not (one / "agenthold.db").exists()
    second = agenthold(cwd=two, env={})
    assert second.returncode == 0, second.stderr
    assert sorted(p.name for p in state.iterdir() if p.suffix == ".db") == ["agenthold.db"]
    listing = agenthold("claims", "--json", cwd=two, env={})
    assert (listing.returncode, listing.stdout.strip()) == (0, "[]"), listing.stderr


@posix_only
def test_the_inspector_never_creates_the_state_directory(home: Path, tmp_path: Path) -> None:
    result = agenthold("agents", cwd=tmp_path, env={})
    assert result.returncode == 1
    assert str(home / ".local" / "state" / "agenthold" / "agenthold.db") in result.stderr
    assert not (home / ".local").exists()


@pytest.mark.usefixtures("stdio_path")
def test_agenthold_db_picks_the_database_of_server_and_inspector(tmp_path: Path) -> None:
    db = tmp_path / "env.db"
    served = agenthold(cwd=tmp_path, env={"AGENTHOLD_DB": str(db)})
    assert served.returncode == 0, served.stderr
    assert db.is_file()
    listing = agenthold("agents", "--json", cwd=REPO, env={"AGENTHOLD_DB": str(db)})
    assert (listing.returncode, listing.stdout.strip()) == (0, "[]"), listing.stderr


@pytest.mark.parametrize("command", [[], ["claims"]])
def test_an_empty_db_exits_2_for_the_server_and_the_inspector(
    tmp_path: Path, command: list[str]
) -> None:
    result = agenthold(*command, "--db", "", cwd=tmp_path, env={})
    assert result.returncode == 2
    assert result.stderr.startswith("agenthold: --db: an empty path")
    assert "Traceback" not in result.stderr


@posix_only
@pytest.mark.usefixtures("stdio_path")
def test_a_state_directory_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = agenthold(cwd=tmp_path, env={"XDG_STATE_HOME": str(blocker)})
    assert result.returncode == 1
    assert result.stderr.startswith("agenthold: cannot create the database directory")
    assert "Traceback" not in result.stderr
