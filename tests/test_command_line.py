"""The command line's own promises (agenthold/cli.py, locations.py, completion.py): a bad
``--db`` is a usage error for every command, PostgreSQL's refusals say what to do, Ctrl-C stops
whatever agenthold runs in the foreground however the shell started it, and shell completion is
generated from the parser. Real databases, real child processes, a real PostgreSQL cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import REPO, LineProcess, child_env
from support import run_cli as run

from agenthold.cli.main import build_parser
from agenthold.inspect import commands as inspector
from agenthold.store import StateStore

posix_only = pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")


# --------------------------------------------------------------------------------------------
# A bad --db
# --------------------------------------------------------------------------------------------

EVERY_COMMAND = [
    [],  # the server
    ["status"],
    ["agents"],
    ["claims"],
    ["namespaces"],
    ["keys", "ns"],
    ["history", "ns", "k"],
    ["log"],
    ["log", "--follow"],
    ["threads"],
    ["messages", "00000000-0000-0000-0000-000000000000"],
    ["backup", "copy.db"],
]


def bad_dbs(tmp_path: Path) -> list[tuple[str, str]]:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n")
    return [
        ("/nonexistent/dir/x.db", "the directory '/nonexistent/dir' does not exist"),
        (str(notes), "is not a SQLite database"),
        (str(tmp_path), "it is a directory"),
    ]


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=lambda c: " ".join(c[:1]) or "server")
def test_a_bad_db_is_one_line_and_exit_status_2_for_every_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]
) -> None:
    for db, fragment in bad_dbs(tmp_path):
        status, out, err = run(capsys, *command, "--db", db)
        assert (status, out) == (2, ""), (db, err)
        assert err.startswith("agenthold: --db: ") and err.count("\n") == 1, err
        assert fragment in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing created


def test_every_subcommand_is_in_the_bad_db_test() -> None:
    named = {c[0] for c in EVERY_COMMAND if c}
    assert set(inspector.COMMANDS) | {"backup"} <= named


@pytest.mark.parametrize("command", [c for c in EVERY_COMMAND if c and c[0] != "backup"][:3])
def test_a_missing_file_is_exit_status_2_for_the_inspector(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]
) -> None:
    status, _, err = run(capsys, *command, "--db", str(tmp_path / "typo.db"))
    assert status == 2 and "no database at" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["--db", "/nonexistent/dir/x.db"], ["--db", "/etc/passwd"]])
@pytest.mark.parametrize("command", [[], ["claims"]], ids=["server", "claims"])
def test_the_issues_examples_exit_2_as_a_process(
    tmp_path: Path, argv: list[str], command: list[str]
) -> None:
    if not Path("/etc/passwd").exists():  # pragma: no cover - not Unix
        pytest.skip("no /etc/passwd")
    done = subprocess.run(
        [sys.executable, "-m", "agenthold", *command, *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**child_env(), "AGENTHOLD_NO_WARM": "1"},
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("agenthold: --db: ")


def test_a_good_db_still_serves_and_reads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "state.db"
    StateStore(db).close()
    assert run(capsys, "agents", "--db", str(db))[0] == 0
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")  # an empty file becomes a new database for a server
    assert run(capsys, "backup", str(tmp_path / "b.db"), "--db", str(db))[0] == 0


# --------------------------------------------------------------------------------------------
# PostgreSQL: a database no server has used yet, and a password it wants
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["agents"], ["log"]])
def test_a_postgresql_database_without_tables_says_to_start_a_server(
    capsys: pytest.CaptureFixture[str], pg_url: str, command: list[str]
) -> None:
    status, out, err = run(capsys, *command, "--db", pg_url)
    assert (status, out) == (1, "")
    assert "no agenthold tables yet: start a server on it first" in err
    assert "it is empty" not in err and err.count("\n") == 1


@pytest.fixture
def password_role(pg_cluster: Any) -> Iterator[str]:
    """A role that must give a password (scram-sha-256), by a pg_hba.conf line of its own at
    the top (the rest of the cluster keeps trust), and the URL that logs in as it."""
    import psycopg

    name = f"pw_{os.getpid()}"
    hba = Path(pg_cluster.data) / "pg_hba.conf"
    before = hba.read_text()
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {name}")
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'right-one'")
        hba.write_text(f"local all {name} scram-sha-256\n" + before)
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield pg_cluster.url().replace("postgres@", f"{name}@", 1)
    finally:
        hba.write_text(before)
        with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"DROP ROLE IF EXISTS {name}")


@pytest.mark.parametrize("password", [None, "wrong-one"], ids=["missing", "wrong"])
def test_a_password_refused_names_pgpassword_and_pgpass(
    password_role: str, tmp_path: Path, password: str | None
) -> None:
    env = {k: v for k, v in child_env().items() if k != "PGPASSWORD"}
    env["PGPASSFILE"] = str(tmp_path / "no-pgpass")
    if password is not None:
        env["PGPASSWORD"] = password
    for command in (["status"], []):  # the inspector and the server alike
        done = subprocess.run(
            [sys.executable, "-m", "agenthold", *(command or ["--no-warm"]), "--db", password_role],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "PGPASSWORD" in done.stderr and "~/.pgpass" in done.stderr, done.stderr
        assert "right-one" not in done.stderr and (password or "\x00") not in done.stderr


def test_a_refusal_for_another_reason_names_no_password(
    capsys: pytest.CaptureFixture[str], pg_cluster: Any
) -> None:
    url = pg_cluster.url().replace("/postgres?", "/no_such_database?", 1)
    status, _, err = run(capsys, "status", "--db", url)
    assert status == 1 and "does not exist" in err and "PGPASSWORD" not in err


# --------------------------------------------------------------------------------------------
# Ctrl-C, however the shell started agenthold
# --------------------------------------------------------------------------------------------


def _ignore_sigint() -> None:  # pragma: no cover - runs in the child
    # As a shell without job control starts a background job (`agenthold log -f &` in a
    # script); the tests below prove agenthold takes Ctrl-C back.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@posix_only
@pytest.mark.backends
def test_log_follow_started_with_sigint_ignored_stops_on_sigint(db_url: str) -> None:
    with StateStore(db_url) as store:
        store.set("ns", "k", 1, updated_by="writer")
    follow = LineProcess(
        [sys.executable, "-m", "agenthold", "log", "-f", "--json", "--db", db_url],
        env=child_env(),
        stderr=subprocess.PIPE,
        encoding="utf-8",
        cwd=REPO,
        preexec_fn=_ignore_sigint,
    )
    try:
        assert '"write"' in follow.next_line(30)  # following now
        follow.proc.send_signal(signal.SIGINT)
        assert follow.proc.wait(timeout=20) == 0
        assert follow.proc.stderr is not None and "Traceback" not in follow.proc.stderr.read()
    finally:
        follow.kill()


@posix_only
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_a_server_started_with_sigint_ignored_stops_on_sigint_while_starting(
    tmp_path: Path,
) -> None:
    """SIGINT while the SDK is being imported (before the server's own handlers are in
    place), to a server whose shell started it with SIGINT ignored: it ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthold", "--db", str(tmp_path / "s.db"), "--no-warm"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=tmp_path,
        preexec_fn=_ignore_sigint,
    )
    try:
        maps = Path(f"/proc/{proc.pid}/maps")
        deadline = time.monotonic() + 60
        while "pydantic_core" not in maps.read_text():
            assert time.monotonic() < deadline, "the SDK was never imported"
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        status = proc.wait(timeout=30)  # stdin stays open: only the signal can end it
        assert status in (130, 0), status  # in the import, or once its handler was in place
        assert b"Traceback" not in proc.communicate()[1]
    finally:
        if proc.poll() is None:  # pragma: no cover - only when the test failed
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------------------------
# Shell completion
# --------------------------------------------------------------------------------------------


def complete(script: str, shell: str, *words: str) -> list[str]:
    """What ``shell`` offers for the command line ``words`` (the last one being typed)."""
    quoted = " ".join(f"'{w}'" for w in words)
    probe = (
        f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); "
        'if [ -n "$ZSH_VERSION" ]; then COMP_CWORD=$(( COMP_CWORD + 1 )); fi; '
        '_agenthold; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    argv = [shell, "-c", probe] if shell == "bash" else [shell, "-f", "-c", probe]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_a_script_that_completes_the_subcommands_and_flags(
    capsys: pytest.CaptureFixture[str], shell: str
) -> None:
    status, script, err = run(capsys, "completion", shell)
    assert (status, err) == (0, "")
    parser = build_parser()
    for name in ("status", "agents", "claims", "log", "backup", "token", "completion"):
        assert name in script
    if not __import__("shutil").which(shell):
        pytest.skip(f"{shell} is not installed: the script was made, not run")
    if shell == "zsh":
        script = "autoload -U compinit && compinit -u\n" + script
    subcommands = complete(script, shell, "agenthold", "")
    assert subcommands[:2] == ["status", "agents"]
    assert {"claims", "token", "completion"} <= set(subcommands)
    assert complete(script, shell, "agenthold", "st") == ["status"]
    assert "--follow" in complete(script, shell, "agenthold", "log", "--")
    assert complete(script, shell, "agenthold", "--db", "x.db", "cl") == ["claims"]
    assert complete(script, shell, "agenthold", "token", "") == ["add", "list", "revoke"]
    assert complete(script, shell, "agenthold", "--transport", "") == ["stdio", "http"]
    assert complete(script, shell, "agenthold", "completion", "") == ["bash", "zsh"]
    flags = [a.option_strings for a in parser._actions if a.option_strings]
    offered = set(complete(script, shell, "agenthold", "--"))
    assert {"--db", "--tools", "--no-warm", "--version"} <= offered
    assert "--json" not in offered  # hidden from --help, hidden here
    assert len(flags) > 10


def test_completion_of_an_unknown_shell_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(capsys, "completion", "fish")
    assert status == 2 and out == "" and "'fish'" in err and err.count("\n") == 1
