"""Start-up time of the ``agenthold`` command: ``--help`` and the inspector, against Python itself.

    python bench/perf/cli_bench.py                  # 20 runs of each command, a table
    python bench/perf/cli_bench.py --runs 50        # more runs
    python bench/perf/cli_bench.py --quick          # 3 runs of each: a smoke run
    python bench/perf/cli_bench.py --json           # the same results as JSON
    python bench/perf/cli_bench.py --make-demo PATH # only the demo database of docs/inspector.md

What is measured: the wall time of whole processes, started one after another with
``subprocess.run`` (so it includes the interpreter's start-up, imports, opening the database and
printing), for

1. ``python -c pass``: the interpreter alone, the floor nothing can go below;
2. ``agenthold --help``;
3. ``agenthold claims --db small.db``, ``agenthold agents`` and ``agenthold log`` on a small
   database made by the real StateStore and Coordinator (a few agents, claims and keys).

``agenthold`` is the console script installed beside this Python when there is one, else
``python -m agenthold``. The target is a median under 150 ms for ``--help`` and ``claims``
(agenthold 0.10.0 took about 0.5 s for ``--help``, most of it importing ``mcp``). The script
also checks, with ``python -X importtime``, that no inspector command imports ``mcp``.

Before timing, the package's bytecode is compiled (``compileall``, as pip does when it installs
a package), so that a source tree run with PYTHONDONTWRITEBYTECODE is not timed compiling
agenthold on every start. An editable install (``pip install -e``) also costs a few
milliseconds of import hooks at every start that a normal install does not.

Medians, because the machine is shared and single runs are noisy; the best run is shown too. A
missed target is reported, not fatal (speed depends on the machine); the exit status is 1 only
if a command fails or imports ``mcp``.
"""

from __future__ import annotations

import compileall
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import finish, options

import agenthold.store
from agenthold.claims import Coordinator
from agenthold.store import StateStore

TARGET_MS = 150.0


def make_demo(path: str | os.PathLike[str], *, pause: float = 0.0) -> None:
    """Build the demo database of docs/inspector.md at ``path`` (which must not exist).

    ``pause`` seconds pass between the steps of the story, so relative ages differ; the lease
    of "refactor-agent" runs out ``pause`` seconds after it claims (at least 0.2 s).
    """
    if os.path.exists(path):
        raise SystemExit(f"{path} exists; give a new path")
    store = StateStore(path)
    coord = Coordinator(store)
    editor = coord.register("editor-agent", "claude-sonnet-4", "drafts chapter 1").agent_id
    reviewer = coord.register("review-bot", "gpt-4o", "reviews the API").agent_id
    store.set("orders", "order-1", {"status": "received", "total": 80.99}, updated_by="intake")
    store.set("orders", "order-2", {"status": "received", "total": 12.5}, updated_by="intake")
    coord.claim("src/old_api.py", reviewer)
    coord.release("src/old_api.py", reviewer, "moved", moved_to="src/api.py")
    coord.claim("src/config.py", reviewer)
    coord.release("src/config.py", reviewer, "modified")
    time.sleep(pause)
    store.set(
        "orders",
        "order-1",
        {"status": "paid", "total": 80.99},
        updated_by="billing",
        expected_version=1,
    )
    store.delete("orders", "order-2", deleted_by="cleanup")
    store.set(
        "reports",
        "summary",
        "Chapter 1 is drafted; the review found three naming problems in the API and one "
        "missing test, all fixed in the second pass. Next: chapter 2 and the config loader.",
        updated_by="editor-agent",
    )
    store.set(
        "notes", "café", {"text": "naïve → naive ✓", "lang": "日本語"}, updated_by="editor-agent"
    )
    ttl = Coordinator(store, claim_ttl=max(0.2, pause))
    refactor = ttl.register("refactor-agent", "claude-haiku", "splits utils.py").agent_id
    ttl.claim("src/utils.py", refactor)
    tester = coord.register("test-runner", "", "runs the test suite").agent_id
    coord.claim("custom://test-lock", tester)
    time.sleep(pause)
    coord.claim("custom://chapter-1", editor)
    coord.claim("src/main.py", reviewer)
    store.set(
        "orders",
        "order-1",
        {"status": "shipped", "total": 80.99},
        updated_by="shipping",
        expected_version=2,
    )
    coord.end_lease(tester, 300)  # its connection closed; it has 5 minutes to come back
    time.sleep(max(0.2, pause) + 0.05)  # refactor-agent's lease runs out
    store.close()


def command_prefix() -> list[str]:
    """How to start agenthold: the installed console script beside this Python, or -m."""
    script = Path(sys.executable).parent / ("agenthold.exe" if os.name == "nt" else "agenthold")
    if script.exists():
        return [str(script)]
    found = shutil.which("agenthold")
    return [found] if found else [sys.executable, "-m", "agenthold"]


def time_runs(argv: list[str], runs: int, env: dict[str, str]) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append((time.perf_counter() - start) * 1000)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode().strip()}")
    return times


def imports_mcp(argv: list[str], env: dict[str, str]) -> bool:
    """Whether ``python -X importtime -m agenthold ARGV`` imports mcp."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "agenthold", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    modules = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    return any(m == "mcp" or m.startswith("mcp.") for m in modules)


def main() -> int:
    parser = options(__doc__, quick="3 runs of each: a smoke run, too few to judge")
    parser.add_argument("--runs", type=int, help="runs of each command (default 20)")
    parser.add_argument("--make-demo", metavar="PATH", help="only build the demo database")
    args = parser.parse_args()
    if args.make_demo:
        make_demo(args.make_demo, pause=2.0)
        print(f"demo database written to {args.make_demo}")
        return 0
    runs = args.runs if args.runs is not None else 3 if args.quick else 20
    if runs < 1:
        parser.error("--runs must be 1 or more")

    env = {**os.environ, "COLUMNS": "100"}
    prefix = command_prefix()
    package = Path(agenthold.store.__file__).parent
    compileall.compile_dir(str(package), quiet=1)  # what pip does at install time
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "small.db")
        make_demo(db)
        cases: list[tuple[str, list[str], float | None]] = [
            ("python -c pass", [sys.executable, "-c", "pass"], None),
            ("agenthold --help", [*prefix, "--help"], TARGET_MS),
            ("agenthold claims", [*prefix, "claims", "--db", db], TARGET_MS),
            ("agenthold agents", [*prefix, "agents", "--db", db], None),
            ("agenthold log", [*prefix, "log", "--db", db], None),
        ]
        for _, argv, _ in cases:  # warm the file cache once
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results: list[dict[str, Any]] = []
        for name, argv, target in cases:
            times = time_runs(argv, runs, env)
            median = statistics.median(times)
            results.append(
                {
                    "command": name,
                    "median_ms": round(median, 1),
                    "best_ms": round(min(times), 1),
                    "target_ms": target,
                    "passed": None if target is None else median < target,
                }
            )
        mcp = {
            " ".join(c): imports_mcp(c, env)
            for c in (["--help"], ["claims", "--db", db], ["log", "--db", db])
        }

    summary = {
        "python": platform.python_version(),
        "agenthold": " ".join(prefix),
        "runs": runs,
        "results": results,
        "imports_mcp": mcp,
    }
    finish(args, summary, report)
    return 1 if any(mcp.values()) else 0


def report(summary: dict[str, Any]) -> str:
    out = [
        f"Python {summary['python']}, {summary['runs']} runs each, command: {summary['agenthold']}",
        "",
        f"{'COMMAND':<18}  {'MEDIAN':>9}  {'BEST':>9}  {'TARGET':>9}  RESULT",
        f"{'-' * 18}  {'-' * 9}  {'-' * 9}  {'-' * 9}  ------",
    ]
    for r in summary["results"]:
        target = "-" if r["target_ms"] is None else f"< {r['target_ms']:.0f} ms"
        verdict = "-" if r["passed"] is None else "pass" if r["passed"] else "MISSED"
        out.append(
            f"{r['command']:<18}  {r['median_ms']:>6.1f} ms  {r['best_ms']:>6.1f} ms  "
            f"{target:>9}  {verdict}"
        )
    out.append("")
    for argv, imported in summary["imports_mcp"].items():
        out.append(
            f"agenthold {argv.split(' --db')[0]}: {'IMPORTS mcp' if imported else 'no mcp import'}"
        )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
