"""Tests for issue 25: ``agenthold hook install HOST`` against real configuration files that
already hold other tools' hooks (merge, idempotence, uninstall, print), and git's pre-commit
and pre-push checks in a real repository, run by git itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import child_env

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.hooks.install import CONFIG
from agenthold.store import StateStore

# What other tools already put in each host's file: their hooks on the same events as ours,
# and settings of the host's own.
EXISTING: dict[str, dict[str, Any]] = {
    "claude-code": {
        "permissions": {"allow": ["Bash(npm test)"]},
        "hooks": {
            "PreToolUse": [
                {"matcher": "Bash", "hooks": [{"type": "command", "command": "guard.sh"}]},
                {"matcher": "Edit", "hooks": []},
            ],
            "PostToolUse": [
                {"matcher": "Write", "hooks": [{"type": "command", "command": "prettier -w"}]}
            ],
        },
    },
    "codex": {
        "hooks": {
            "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "x"}]}],
            "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
        }
    },
    "gemini": {
        "general": {"vimMode": True},
        "hooks": {
            "BeforeTool": [
                {
                    "matcher": "write_file",
                    "hooks": [{"type": "command", "command": "secret-scan", "name": "scan"}],
                }
            ]
        },
    },
    "cursor": {
        "version": 1,
        "hooks": {
            "beforeShellExecution": [{"command": "./audit.sh"}],
            "afterFileEdit": [{"command": "./format.sh"}],
        },
    },
}


def install(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthold", "hook", "install", *args],
        capture_output=True, text=True, cwd=cwd, env={**child_env(), "HOME": str(home)},
        timeout=120,
    )  # fmt: skip


def ours(config: dict[str, Any]) -> list[str]:
    """Every agenthold hook command in a host configuration."""
    found = []
    for entries in config.get("hooks", {}).values():
        for entry in entries:
            for h in entry.get("hooks", [entry]):
                if "agenthold" in h.get("command", ""):
                    found.append(h["command"])
    return found


@pytest.mark.parametrize("host", sorted(CONFIG))
@pytest.mark.parametrize("where", ["project", "user"])
def test_install_merges_beside_other_hooks_is_idempotent_and_uninstalls_cleanly(
    host: str, where: str, tmp_path: Path
) -> None:
    project, home = tmp_path / "project", tmp_path / "home"
    base = project if where == "project" else home
    directory, name = CONFIG[host][0]
    path = base / directory / name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(EXISTING[host], indent=4))
    project.mkdir(exist_ok=True)
    flags = ["--project", str(project)] if where == "project" else ["--user"]

    done = install(host, *flags, "--claim-on-edit", "--db", "~/team.db", cwd=project, home=home)
    assert done.returncode == 0, done.stderr
    config = json.loads(path.read_text())
    commands = ours(config)
    events = {**CONFIG[host][1], **CONFIG[host][2]}
    assert len(commands) == len(events)
    assert all(f"hook {host} --claim-on-edit --db {home}/team.db" in c for c in commands)
    # everything of the others is still there, as it was
    for event, entries in EXISTING[host]["hooks"].items():
        for entry in entries:
            assert entry in config["hooks"][event]
    for key, value in EXISTING[host].items():
        if key != "hooks":
            assert config[key] == value
    # the hook's own input events are where the host looks for them
    for event, matcher in events.items():
        entry = next(e for e in config["hooks"][event] if ours({"hooks": {event: [e]}}))
        assert entry.get("matcher") == matcher

    text = path.read_text()
    again = install(host, *flags, "--claim-on-edit", "--db", "~/team.db", cwd=project, home=home)
    assert again.returncode == 0 and "nothing changed" in again.stdout
    assert path.read_text() == text

    # other flags: our entry is updated in place of the old one, never twice
    install(host, *flags, "--on-error", "deny", cwd=project, home=home)
    config = json.loads(path.read_text())
    assert len(ours(config)) == len(CONFIG[host][1])  # no session-end hook without claim-on-edit
    assert all("--on-error deny" in c and "--claim-on-edit" not in c for c in ours(config))

    printed = install(host, *flags, "--uninstall", "--print", cwd=project, home=home)
    assert printed.returncode == 0 and ours(json.loads(printed.stdout)) == []
    assert path.read_text() != printed.stdout  # --print wrote nothing

    gone = install(host, *flags, "--uninstall", cwd=project, home=home)
    assert gone.returncode == 0, gone.stderr
    config = json.loads(path.read_text())
    assert ours(config) == []
    assert config == {**EXISTING[host]}  # exactly what the other tools had


def test_install_into_a_project_with_no_configuration_yet_and_print(tmp_path: Path) -> None:
    home = tmp_path / "home"
    printed = install("cursor", "--print", cwd=tmp_path, home=home)
    shown = json.loads(printed.stdout)
    assert shown["version"] == 1 and len(ours(shown)) == 2
    assert not (tmp_path / ".cursor").exists()
    done = install("cursor", cwd=tmp_path, home=home)
    assert done.returncode == 0
    assert json.loads((tmp_path / ".cursor" / "hooks.json").read_text()) == shown
    missing = install("gemini", "--uninstall", cwd=tmp_path, home=home)
    assert missing.returncode == 0 and "nothing to take out" in missing.stdout


@pytest.mark.parametrize("host", sorted(CONFIG))
@pytest.mark.parametrize("text", ["", '{"theme": "dark"}'])
def test_install_into_a_file_with_settings_but_no_hooks_yet(
    host: str, text: str, tmp_path: Path
) -> None:
    # the common case: a settings file of the host's own, with no hooks key (or an empty file)
    directory, name = CONFIG[host][0]
    path = tmp_path / directory / name
    path.parent.mkdir()
    path.write_text(text)
    done = install(host, cwd=tmp_path, home=tmp_path)
    assert done.returncode == 0 and "installed" in done.stdout, done.stdout + done.stderr
    config = json.loads(path.read_text())
    assert len(ours(config)) == len(CONFIG[host][1])
    assert all(config[k] == v for k, v in json.loads(text or "{}").items())
    install(host, "--uninstall", cwd=tmp_path, home=tmp_path)
    assert ours(json.loads(path.read_text())) == []


@pytest.mark.parametrize(
    "text, said",
    [
        ("{not json", "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"hooks": []}', "'hooks' is not an object"),
        ('{"hooks": {"PreToolUse": {"x": 1}}}', "'PreToolUse' is not a list"),
    ],
)
def test_a_configuration_that_is_not_json_is_never_overwritten(
    text: str, said: str, tmp_path: Path
) -> None:
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text(text)
    done = install("claude-code", cwd=tmp_path, home=tmp_path)
    assert done.returncode == 1 and said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert path.read_text() == text


def test_install_usage_errors_are_status_2(tmp_path: Path) -> None:
    assert install("vim", cwd=tmp_path, home=tmp_path).returncode == 2
    both = install("codex", "--user", "--project", ".", cwd=tmp_path, home=tmp_path)
    assert both.returncode == 2
    git_user = install("git", "--user", cwd=tmp_path, home=tmp_path)
    assert git_user.returncode == 2 and "--project" in git_user.stderr
    not_repo = install("git", cwd=tmp_path, home=tmp_path)
    assert not_repo.returncode == 1 and "not in a git repository" in not_repo.stderr


# -- git ------------------------------------------------------------------------------------


def git(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**child_env(), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x",
             "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x", **(env or {})},
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_pre_commit_refuses_staged_changes_to_files_others_hold_and_chains(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    hooks = repo / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    existing = hooks / "pre-commit"
    existing.write_text(f"#!/bin/sh\necho ran >> {tmp_path / 'chained.log'}\nexit 0\n")
    existing.chmod(0o755)
    db = str(tmp_path / "git.db")
    for name in ("held.py", "free.py", "dir/inner.py"):
        (repo / name).parent.mkdir(exist_ok=True)
        (repo / name).write_text("v1\n")
    store = StateStore(db)
    coord = Coordinator(store, Resolver([Workspace("default", str(repo))]))
    other = coord.register("other-agent").agent_id
    coord.claim("held.py", other)
    coord.claim("dir/", other)
    store.close()

    shown = install("git", "--project", str(repo), "--db", db, "--print", cwd=repo, home=tmp_path)
    assert shown.stdout.count("#!/bin/sh") == 2 and not (hooks / "pre-push").exists()
    done = install("git", "--project", str(repo), "--db", db, cwd=repo, home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (hooks / "pre-commit.agenthold-chained").exists()
    again = install("git", "--project", str(repo), "--db", db, cwd=repo, home=tmp_path)
    assert again.returncode == 0 and "exist" not in again.stderr  # ours is replaced, not chained

    git("add", "free.py", cwd=repo)
    assert git("commit", "-q", "-m", "free", cwd=repo).returncode == 0
    assert (tmp_path / "chained.log").read_text().count("ran") == 1

    git("add", "held.py", cwd=repo)
    refused = git("commit", "-q", "-m", "held", cwd=repo)
    assert refused.returncode != 0
    assert "other-agent" in refused.stderr and "held.py" in refused.stderr
    assert "Traceback" not in refused.stderr
    git("reset", "-q", cwd=repo)
    git("add", "dir/inner.py", cwd=repo)
    assert "covers it" in git("commit", "-q", "-m", "dir", cwd=repo).stderr

    # a push of commits changing a held file, made past the commit check
    git("commit", "-q", "--no-verify", "-m", "forced", cwd=repo)
    remote = tmp_path / "remote.git"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    git("remote", "add", "origin", str(remote), cwd=repo)
    pushed = git("push", "-q", "origin", "main", cwd=repo)
    assert pushed.returncode != 0 and "dir/inner.py" in pushed.stderr

    gone = install("git", "--project", str(repo), "--uninstall", cwd=repo, home=tmp_path)
    assert gone.returncode == 0
    assert existing.read_text().startswith("#!/bin/sh\necho ran")
    assert not (hooks / "pre-push").exists()
    assert git("push", "-q", "origin", "main", cwd=repo).returncode == 0


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_check_without_a_database_lets_the_commit_go_on_unless_strict(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    (repo / "a.py").write_text("x\n")
    git("add", "a.py", cwd=repo)
    missing = str(tmp_path / "none.db")
    check = [sys.executable, "-m", "agenthold", "hook", "git", "pre-commit", "--db", missing]
    done = subprocess.run(check, cwd=repo, capture_output=True, text=True, env=child_env(),
                          input="", timeout=60)  # fmt: skip
    assert done.returncode == 0 and "could not check the claims" in done.stderr
    strict = subprocess.run([*check, "--on-error", "deny"], cwd=repo, capture_output=True,
                            text=True, env=child_env(), input="", timeout=60)  # fmt: skip
    assert strict.returncode == 1 and "refusing the pre-commit" in strict.stderr
    bad = subprocess.run(check[:5], cwd=repo, capture_output=True, text=True, env=child_env(),
                         timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "name the git hook" in bad.stderr
    wrong = subprocess.run([*check, "--lease", "x"], cwd=repo, capture_output=True, text=True,
                           env=child_env(), timeout=60)  # fmt: skip
    assert wrong.returncode == 2
    assert os.path.exists(repo / "a.py")
