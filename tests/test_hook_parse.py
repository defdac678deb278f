"""Tests for issue 25: the files a patch or a shell command writes, as the edit hook reads them
(agenthold.hooks.parse), and what it leaves unread (docs/hooks.md lists the same)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agenthold.hooks.hosts import CODEX, HOSTS
from agenthold.hooks.parse import patch_paths, shell_paths


def test_every_header_of_a_patch_names_a_file() -> None:
    text = """*** Begin Patch
*** Update File: src/a.py
@@ def f():
-    return 1
+    return 2
*** Add File: src/new.py
+print("hi")
*** Delete File: old/gone.py
*** Update File: src/b.py
*** Move to: src/c.py
@@
-x
+y
*** Update File: src/a.py
*** End Patch
"""
    assert patch_paths(text) == ["src/a.py", "src/new.py", "old/gone.py", "src/b.py", "src/c.py"]
    assert patch_paths("+*** Update File: not/a/header\n") == []
    assert patch_paths("no patch at all") == []


@pytest.mark.parametrize(
    "command, written",
    [
        ("echo hi > out.txt", ["out.txt"]),
        ("echo hi >> log.txt", ["log.txt"]),
        ("cmd 2> err.txt", ["err.txt"]),
        ("cmd &> both.txt", ["both.txt"]),
        ("cmd >| forced.txt", ["forced.txt"]),
        ("cmd > /dev/null 2>&1", []),
        ("cmd 2>&1 | tee -a a.txt b.txt", ["a.txt", "b.txt"]),
        ("sed -i 's/a/b/' x.py", ["x.py"]),
        ("sed -i.bak -e 's/a/b/' -e 's/c/d/' x.py y.py", ["x.py", "y.py"]),
        ("sed -Ei 's/a/b/' x.py", ["x.py"]),
        ("sed --in-place=.orig 's/a/b/' x.py", ["x.py"]),
        ("sed 's/a/b/' x.py", []),  # prints, writes nothing
        ("sed -n -e p x.py", []),
        ("mv a.py b.py", ["a.py", "b.py"]),
        ("cp -r a.py b.py", ["b.py"]),
        ("cp a.py", []),
        ("rm -rf build/x.o y.o", ["build/x.o", "y.o"]),
        ("rm -- -weird", ["-weird"]),
        ("touch new.py && truncate -s 0 t.log", ["new.py", "t.log"]),
        ("git checkout -- a.py b.py", ["a.py", "b.py"]),
        ("git checkout HEAD~1 -- a.py", ["a.py"]),
        ("git checkout main", []),
        ("git restore --staged a.py", ["a.py"]),
        ("git -C other checkout -- a.py", []),  # another directory: not followed
        ("git -c core.autocrlf=false checkout -- a.py", ["a.py"]),  # a setting: same files
        ("git -c user.name=x rm a.py", ["a.py"]),
        ("git status", []),
        ("cd src; echo x > y.txt", ["y.txt"]),
        ("FOO=1 sudo -E tee /etc/x < in", ["/etc/x"]),
        ("bash -c 'echo x > inner.txt'", ["inner.txt"]),
        ('sh -lc "rm a.py"', ["a.py"]),
        ("echo 'a > b'", []),  # quoted: not a redirection
        ('echo x > "$OUT"', []),  # a variable: not guessed
        ("echo x > `pick`", []),
        ('python -c \'open("f", "w")\'', []),  # a program's own writes: not parsed
        ("cat <<EOF > gen.txt\nhello\nEOF", ["gen.txt"]),
        ("echo 'unclosed > x", []),
        ("ls # > not.txt", []),
        ("", []),
    ],
)
def test_a_shell_command_plainly_writing_a_file_names_it(
    command: str, written: list[str], tmp_path: Path
) -> None:
    assert shell_paths(command, str(tmp_path)) == written


def test_globs_expand_in_the_commands_directory_and_moves_into_a_directory(tmp_path: Path) -> None:
    for name in ("a.py", "b.py", "c.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "dest").mkdir()
    cwd = str(tmp_path)
    assert shell_paths("rm *.py", cwd) == [str(tmp_path / "a.py"), str(tmp_path / "b.py")]
    # a destination directory itself is not rewritten: only the names the sources get in it
    assert shell_paths("mv c.txt dest", cwd) == ["c.txt", "dest/c.txt"]
    assert shell_paths("cp a.py b.py dest/", cwd) == ["dest/a.py", "dest/b.py"]
    assert shell_paths("touch dest c.txt", cwd) == ["c.txt"]
    assert shell_paths("cp -t dest a.py", cwd) == []  # the option's value: not read


def test_codex_shell_calls_are_read_as_argv_or_as_a_script(tmp_path: Path) -> None:
    cwd = str(tmp_path)

    def paths(command: object) -> tuple[str, ...]:
        return CODEX.read(
            {
                "hook_event_name": "PreToolUse",
                "cwd": cwd,
                "tool_name": "shell",
                "tool_input": {"command": command},
            }
        ).paths

    assert paths(["bash", "-lc", "echo x > a.txt"]) == (f"{cwd}/a.txt",)
    assert paths(["rm", "b.txt"]) == (f"{cwd}/b.txt",)
    patch_text = "*** Begin Patch\n*** Add File: c.txt\n+x\n*** End Patch"
    assert paths(["apply_patch", patch_text]) == (f"{cwd}/c.txt",)
    assert paths(f"apply_patch <<'EOF'\n{patch_text}\nEOF") == (f"{cwd}/c.txt",)
    assert paths(patch_text) == (f"{cwd}/c.txt",)
    assert paths(42) == ()


def test_an_input_without_a_cwd_takes_the_hooks_own_directory() -> None:
    import os

    call = HOSTS["gemini"].read(
        {
            "hook_event_name": "BeforeTool",
            "tool_name": "write_file",
            "tool_input": {"file_path": "rel.txt"},
        }
    )
    assert call.paths == (os.path.join(os.getcwd(), "rel.txt"),)
    with pytest.raises(ValueError, match="command"):
        HOSTS["cursor"].read({"hook_event_name": "beforeShellExecution", "command": 3})
    empty = HOSTS["claude-code"].read({"tool_name": "Write", "tool_input": None})
    assert empty.kind == "none"
