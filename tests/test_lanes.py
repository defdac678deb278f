"""The test lanes (lanes.py): each is a declared marker, and the fast lane a developer runs
(README.md, "Development") is most of the suite, with no PostgreSQL test and none that
starts a process, as lanes.py decides them; checked on the real suite, collected by pytest in
a process of its own (one test id a line: without the project's options, whose -q would
halve the listing again)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from lanes import FAST, LANES
from support import REPO, child_env

# tests the fast lane must leave out, each for a way lanes.py tells a process is started
STARTS_PROCESSES = [
    # through support.py's helper, imported inside the test
    "tests/test_restore.py::test_a_file_without_an_id_opens_while_another_process_holds_the_write_lock",
    # through a module's own server class (test_restore.Server)
    "tests/test_restore.py::test_a_wal_left_by_a_killed_server_is_still_recovered_on_its_own_file",
    # through a torture scenario of bench/ (torture.run_crash)
    "tests/test_torture.py::test_killed_writers_lose_no_acknowledged_change_and_leave_no_half_applied_claim",
]
# and one it must keep: its store's backup() is a method, not test_restore.backup(), which
# runs the command
IN_PROCESS = (
    "tests/test_restore.py::"
    "test_a_copy_put_in_place_under_a_store_of_the_same_process_is_not_opened_beside_it"
)


def test_every_lane_is_a_declared_marker(pytestconfig: pytest.Config) -> None:
    declared = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert set(LANES) <= declared
    assert FAST == "not slow and not postgres and not subprocess and not bench"


def test_the_readme_gives_the_fast_lane_as_its_expression() -> None:
    development = (REPO / "README.md").read_text(encoding="utf-8").split("\n## Development")[1]
    command = f'python3 -m pytest -m "{FAST}" -n 4 --no-cov'
    assert f"```bash\n{command}\n```" in development.split("\n## ")[0]


def test_the_fast_lane_is_most_of_the_suite_without_postgresql_or_processes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-o", "addopts=", "-q",
         "--strict-markers", "-p", "no:cacheprovider", "-m", FAST, "tests"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    selected = [line for line in done.stdout.splitlines() if "::" in line]
    counted = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", done.stdout)
    assert counted, done.stdout[-2000:]
    chosen, total, _ = map(int, counted.groups())
    assert chosen == len(selected)
    assert chosen >= 1000 and chosen >= total // 2, (chosen, total)
    on_postgresql = [n for n in selected if re.search(r"[\[-]postgresql[\]-]", n)]
    assert on_postgresql == []
    assert not set(STARTS_PROCESSES) & set(selected)
    assert IN_PROCESS in selected
