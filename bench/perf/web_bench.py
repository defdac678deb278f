"""How the live page (``agenthold web``) holds up with 1,000 claims and 100,000 events.

It builds a SQLite database with that many (``--quick``: 100 claims, 5,000 events), then times
the page's reads (``agenthold.web.View``) against the library reads they are built on,
in the same run: the overview against ``Coordinator.list_claims`` alone, a page of the log
against ``StateStore.read_log`` of the same length, a filtered page, and a page far back.
With ``--browser`` it also opens the page in the system's Chromium (Playwright) and reports how
long the page takes to show everything and how many rows the log and claims lists hold in the
DOM (the lists render only what is on screen).

    python bench/perf/web_bench.py [--quick] [--browser] [--json]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the harness
from harness import ROOT, finish, machine, machine_line, options, table

from agenthold import StateStore
from agenthold.claims import Coordinator
from agenthold.web import View


def build(path: Path, claims: int, events: int) -> None:
    with StateStore(str(path)) as store:
        coordinator = Coordinator(store)
        agents = [coordinator.register(f"agent-{n}").agent_id for n in range(50)]
        for n in range(claims):
            coordinator.claim(f"custom://resource-{n:05d}", agents[n % len(agents)])
        for n in range(events - claims - len(agents)):
            store.set(f"ns-{n % 20}", f"key-{n % 500}", {"n": n}, updated_by=f"agent-{n % 50}")


def timed(read: Any, repeats: int) -> float:
    """The median seconds of ``repeats`` calls of ``read``."""
    took = []
    for _ in range(repeats):
        start = time.perf_counter()
        read()
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def browser_figures(path: Path) -> list[list[str]]:
    from playwright.sync_api import sync_playwright

    argv = [sys.executable, "-m", "agenthold", "web", "--db", str(path), "--port", "0"]
    web = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert web.stdout is not None
        url = web.stdout.readline().strip()
        flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path="/usr/bin/chromium", args=flags)
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            start = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#live.on", timeout=60_000)
            page.wait_for_selector("#log .logrow", timeout=60_000)
            shown = time.perf_counter() - start
            rows = page.evaluate("document.querySelectorAll('#log .logrow').length")
            claims = page.evaluate("document.querySelectorAll('#claims .cols').length")
            start = time.perf_counter()
            for _ in range(5):  # scroll to the top: each time an older page is fetched
                page.evaluate("document.getElementById('log').scrollTop = 0")
                page.wait_for_function("!document.getElementById('log-count')"
                                       ".textContent.startsWith('200 ')")  # fmt: skip
                page.wait_for_timeout(100)
            scrolled = (time.perf_counter() - start) / 5
            browser.close()
    finally:
        web.terminate()
        web.wait(30)
    return [
        ["browser: page shown, stream open", f"{shown * 1000:.0f} ms", "-"],
        ["browser: rows of the log in the DOM", str(rows), "-"],
        ["browser: rows of the claims list in the DOM", str(claims), "-"],
        ["browser: one scroll to an older page", f"{scrolled * 1000:.0f} ms", "-"],
    ]


def main() -> int:
    parser = options(__doc__, quick="100 claims, 5,000 events")
    parser.add_argument("--browser", action="store_true", help="also time the page in Chromium")
    args = parser.parse_args()
    claims, events = (100, 5_000) if args.quick else (1_000, 100_000)
    repeats = 3 if args.quick else 7
    results: dict[str, Any] = {"machine": machine(), "claims": claims, "events": events}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.db"
        start = time.perf_counter()
        build(path, claims, events)
        results["build_seconds"] = time.perf_counter() - start
        view = View(str(path))
        store, coordinator = view.store, view.coordinator
        try:

            def raw_page() -> None:
                with store.db.snapshot() as conn:
                    store.read_log(conn, None, limit=200)

            far = view.page(limit=200)
            for _ in range(20):
                far = view.page(far["before"], limit=200)
            rows = [
                ["overview (agents, claims, queue, namespaces, threads)",
                 f"{timed(view.overview, repeats) * 1000:.1f} ms",
                 f"{timed(coordinator.list_claims, repeats) * 1000:.1f} ms (list_claims)"],
                ["a page of 200 events, the newest",
                 f"{timed(lambda: view.page(limit=200), repeats) * 1000:.1f} ms",
                 f"{timed(raw_page, repeats) * 1000:.1f} ms (read_log of 200)"],
                ["a page of 200 events, one agent's",
                 f"{timed(lambda: view.page(limit=200, agent='agent-7'), repeats) * 1000:.1f} ms",
                 "-"],
                ["a page of 200 events, 4,000 back",
                 f"{timed(lambda: view.page(far['before'], limit=200), repeats) * 1000:.1f} ms",
                 "-"],
            ]  # fmt: skip
        finally:
            view.close()
        if args.browser:
            rows += browser_figures(path)
    results["rows"] = [["READ", "MEDIAN", "BASELINE (same run)"], *rows]
    finish(args, results, report)
    return 0


def report(results: dict[str, Any]) -> str:
    return "\n".join(
        [
            machine_line(results["machine"]),
            f"built {results['claims']:,} claims and {results['events']:,} events in "
            f"{results['build_seconds']:.1f} s",
            table(results["rows"]),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
