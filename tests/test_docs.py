"""The documentation is true: its examples are run against real servers and compared.

docs/advanced-tools.md and docs/tools.md each tell one story: each ``**Request** to `tool`:``
block followed by a ``**Reply**`` block is a call made, in order, against a fresh in-process
server, through a real ``mcp.Client``. The actual reply must have exactly the documented keys and
values, except timestamps (keys ending in ``_at``) and ``elapsed_seconds``, which only need the
right type. The table of tools and their annotations is checked against the server too.

The README's first five minutes are played against two real stdio servers started with its
arguments, its curl call against a real HTTP server on 127.0.0.1, its wrong-token advice against
a server with a token file, and its install lines in a fresh virtual environment (marked slow).
Its replies are shortened, so there every field shown must be in the real reply with its value.
Links, install lines and the configuration table are checked against the files and the CLI.
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import coordinator_at, in_process_client

from agenthold.claims import Coordinator
from agenthold.claims.names import Resolver, Workspace
from agenthold.store import StateStore

pytestmark = pytest.mark.anyio

DOC = Path(__file__).resolve().parents[1] / "docs" / "advanced-tools.md"
EXAMPLE = re.compile(
    r"\*\*Request\*\* to `(?P<tool>agenthold_\w+)`:\s*```json\n(?P<request>.*?)```"
    r"\s*\*\*Reply\*\*[^\n]*\n\s*```json\n(?P<reply>.*?)```",
    re.DOTALL,
)


def examples() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    text = DOC.read_text(encoding="utf-8")
    found = [
        (m["tool"], json.loads(m["request"]), json.loads(m["reply"]))
        for m in EXAMPLE.finditer(text)
    ]
    assert text.count("**Request**") == len(found), "a request without a reply block"
    return found


def assert_like(documented: Any, actual: Any, where: str) -> None:
    """``actual`` is ``documented`` apart from timestamps and elapsed times."""
    key = where.rsplit(".", 1)[-1]
    if isinstance(documented, dict):
        assert isinstance(actual, dict) and set(actual) == set(documented), (
            f"{where}: documented keys {sorted(documented)}, actual {sorted(actual)}"
        )
        for k, v in documented.items():
            assert_like(v, actual[k], f"{where}.{k}")
    elif isinstance(documented, list):
        assert isinstance(actual, list) and len(actual) == len(documented), where
        for i, (d, a) in enumerate(zip(documented, actual, strict=True)):
            assert_like(d, a, f"{where}[{i}]")
    elif key.endswith("_at") and isinstance(documented, str):
        assert isinstance(actual, str) and datetime.fromisoformat(actual).tzinfo, where
    elif key == "elapsed_seconds":
        assert isinstance(actual, (int, float)) and actual >= 0, where
    else:
        assert actual == documented and type(actual) is type(documented), (
            f"{where}: documented {documented!r}, actual {actual!r}"
        )


async def test_every_example_in_the_advanced_tools_doc_gives_the_documented_reply(
    tmp_path: Path,
) -> None:
    story = examples()
    assert len(story) >= 20
    assert {tool for tool, _, _ in story} >= {
        "agenthold_get", "agenthold_set", "agenthold_list", "agenthold_history",
        "agenthold_delete", "agenthold_watch", "agenthold_clear_namespace", "agenthold_export",
    }  # fmt: skip
    with StateStore(tmp_path / "doc.db") as store:
        coordinator = coordinator_at(store, tmp_path)
        async with in_process_client(coordinator, tools="advanced") as (_, client):
            assert not client.instructions  # the doc says advanced mode sends none
            for number, (tool, request, documented) in enumerate(story, 1):
                result = await client.call_tool(tool, request)
                actual = json.loads(result.content[0].text)
                assert actual == result.structured_content
                assert bool(result.is_error) == (documented["status"] == "error")
                assert_like(documented, actual, f"example {number} ({tool})")


async def test_the_tool_table_of_the_doc_matches_the_servers_annotations(tmp_path: Path) -> None:
    rows = re.findall(
        r"^\| `(agenthold_\w+)` \| [^|]+ \| (yes|no) \| (yes|no) \| (yes|no) \|$",
        DOC.read_text(encoding="utf-8"),
        re.MULTILINE,
    )
    documented = {name: tuple(cell == "yes" for cell in cells) for name, *cells in rows}
    with StateStore(tmp_path / "doc.db") as store:
        coordinator = Coordinator(store, resolver=Resolver([Workspace("d", str(tmp_path))]))
        async with in_process_client(coordinator, tools="advanced") as (_, client):
            tools = (await client.list_tools()).tools
    served = {
        t.name: (
            t.annotations.read_only_hint,
            t.annotations.destructive_hint,
            t.annotations.idempotent_hint,
        )
        for t in tools
        if t.annotations is not None
    }
    assert documented == served


# --------------------------------------------------------------------------------------------
# docs/tools.md: the standard tools' replies
# --------------------------------------------------------------------------------------------

TOOLS_DOC = DOC.parent / "tools.md"
STANDARD_EXAMPLE = re.compile(
    r"\*\*Request\*\* to `(?P<tool>agenthold_\w+)`:\s*```json\n(?P<request>.*?)```"
    r"\s*\*\*Reply\*\*(?P<label>[^\n]*)\n\s*```json\n(?P<reply>.*?)```",
    re.DOTALL,
)
DOC_AGENT_ID = re.compile(r"agent-[0-9a-f]{16}")
MESSAGES_PART = "\n# The messages tools"


def tools_doc_parts() -> tuple[str, str]:
    """docs/tools.md's two parts: the standard tools, then the messages tools."""
    standard, messages = TOOLS_DOC.read_text(encoding="utf-8").split(MESSAGES_PART, 1)
    return standard, messages


def swap_ids(value: Any, ids: dict[str, str]) -> Any:
    """``value`` with every documented agent id replaced by the real one it stands for."""
    text = json.dumps(value)
    for documented, real in ids.items():
        text = text.replace(documented, real)
    return json.loads(text)


async def test_every_reply_in_the_standard_tools_doc_is_the_servers(tmp_path: Path) -> None:
    import os
    import sqlite3

    text = tools_doc_parts()[0]
    story = list(STANDARD_EXAMPLE.finditer(text))
    assert text.count("**Request**") == len(story), "a request without a reply block"
    statuses = {json.loads(m["reply"])["status"] for m in story}
    assert statuses == {
        "registered", "claimed", "already_claimed", "busy", "released", "already_free",
        "not_found", "available", "timeout", "unavailable", "error",
    }  # fmt: skip
    root = tmp_path / "proj"
    root.mkdir()
    (root / "AGENTS.md").write_text("rules")
    os.link(root / "AGENTS.md", root / "CLAUDE.md")
    ids: dict[str, str] = {}

    def check(number: int, tool: str, label: str, documented: Any, result: Any) -> None:
        actual = json.loads(result.content[0].text)
        assert actual == result.structured_content
        assert bool(result.is_error) == (documented["status"] == "error")
        assert ("isError" in label) == bool(result.is_error), f"example {number}"
        if tool == "agenthold_register":
            ids[documented["agent_id"]] = actual["agent_id"]
            documented["agent_id"] = actual["agent_id"]
        where = f"example {number} ({tool})"
        assert_like(swap_ids(documented, ids), actual, where)
        assert list(actual) == list(documented), f"{where}: field order"

    async def in_line() -> None:
        """Until a wait with claim is in the queue (the example after it must find it)."""
        with anyio.fail_after(5), contextlib.closing(sqlite3.connect(tmp_path / "doc.db")) as db:
            sql = "SELECT count(*) FROM claim_waiters WHERE granted IS NULL"
            while db.execute(sql).fetchone()[0] == 0:
                await anyio.sleep(0.01)

    with StateStore(tmp_path / "doc.db", busy_timeout=0.1) as store:
        coordinator = coordinator_at(store, root, claim_ttl=1800)
        async with (
            in_process_client(coordinator, tools="standard") as (_, client),
            anyio.create_task_group() as tg,
        ):
            waits: list[tuple[int, str, str, Any, dict[str, Any]]] = []  # answered later
            for number, match in enumerate(story, 1):
                tool, label = match["tool"], match["label"]
                request = swap_ids(json.loads(match["request"]), ids)
                documented = json.loads(match["reply"])
                if "meanwhile the wait is in line" in label:  # answered by a later example
                    box: dict[str, Any] = {}

                    async def wait(
                        tool: str = tool, request: Any = request, box: Any = box
                    ) -> None:
                        box["result"] = await client.call_tool(tool, request)

                    tg.start_soon(wait)
                    await in_line()
                    waits.append((number, tool, label, documented, box))
                    continue
                locker = None
                if "write lock" in label:  # another process holds the lock past the timeout
                    locker = sqlite3.connect(tmp_path / "doc.db", isolation_level=None)
                    locker.execute("BEGIN IMMEDIATE")
                try:
                    result = await client.call_tool(tool, request)
                finally:
                    if locker is not None:
                        locker.execute("ROLLBACK")
                        locker.close()
                check(number, tool, label, documented, result)
                if "the wait above answers" in label:
                    number, tool, label, documented, box = waits.pop()
                    with anyio.fail_after(5):
                        while "result" not in box:
                            await anyio.sleep(0.01)
                    check(number, tool, label, documented, box["result"])
            assert not waits, "a wait in line that no later example answered"
    assert len(ids) == 2 and all(DOC_AGENT_ID.fullmatch(i) for i in ids)


def test_the_standard_tools_doc_lists_every_field_the_replies_have() -> None:
    text = tools_doc_parts()[0]
    fields = set(re.findall(r"^\| `(\w+)` \|", text.split("### Fields", 1)[1], re.MULTILINE))
    in_examples = {
        key for m in STANDARD_EXAMPLE.finditer(text) for key in json.loads(m["reply"])
    } - {"status"}
    assert in_examples <= fields, in_examples - fields


# --------------------------------------------------------------------------------------------
# docs/tools.md, second part: the messages tools' replies
# --------------------------------------------------------------------------------------------

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def learn_ids(documented: Any, actual: Any, ids: dict[str, str]) -> None:
    """Map each documented UUID to the one the server gave in the same place, the first time
    it appears (the ids of agents and threads are random)."""
    if isinstance(documented, dict) and isinstance(actual, dict):
        for key, value in documented.items():
            if key in actual:
                learn_ids(value, actual[key], ids)
    elif isinstance(documented, list) and isinstance(actual, list):
        for d, a in zip(documented, actual, strict=False):
            learn_ids(d, a, ids)
    elif isinstance(documented, str) and UUID_RE.fullmatch(documented):
        found = UUID_RE.fullmatch(actual) if isinstance(actual, str) else None
        if found is not None:
            ids.setdefault(documented, found.group())


async def test_every_reply_in_the_messages_tools_doc_is_the_servers(tmp_path: Path) -> None:
    text = tools_doc_parts()[1]
    story = list(STANDARD_EXAMPLE.finditer(text))
    assert text.count("**Request**") == len(story), "a request without a reply block"
    from agenthold.serve.message_tools import MESSAGES_NAMES

    assert {m["tool"] for m in story} == MESSAGES_NAMES  # every tool is shown
    ids: dict[str, str] = {}
    with StateStore(tmp_path / "doc.db") as store:
        async with in_process_client(coordinator_at(store, tmp_path), tools="messages") as (
            _,
            client,
        ):
            for number, match in enumerate(story, 1):
                tool, label = match["tool"], match["label"]
                request = swap_ids(json.loads(match["request"]), ids)
                documented = json.loads(match["reply"])
                result = await client.call_tool(tool, request)
                actual = json.loads(result.content[0].text)
                assert actual == result.structured_content
                assert ("isError" in label) == bool(result.is_error), f"example {number}"
                assert bool(result.is_error) == (documented["status"] == "error")
                learn_ids(documented, actual, ids)
                where = f"example {number} ({tool})"
                assert_like(swap_ids(documented, ids), actual, where)
                assert list(actual) == list(documented), f"{where}: field order"
    assert len(ids) >= 3  # two agents and a thread at least


# --------------------------------------------------------------------------------------------
# README.md: what it promises a newcomer, run as printed
# --------------------------------------------------------------------------------------------

REPO = DOC.parents[1]
README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
#: Targets another branch adds (the hooks page, the web view's screenshot): a link to one may
#: point nowhere until that branch lands, and must resolve once the file exists.
PENDING = {"docs/hooks.md", "docs/web.png"}
FIVE_MINUTES = "\n## Your first five minutes"
CURL = "\n## Talk to it over HTTP with curl"


def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text of ``heading`` (a line starting with #s) up to the next heading of its level."""
    level = heading.strip().split(" ", 1)[0]
    body = text.split(heading, 1)[1]
    return re.split(rf"\n{level} ", body, maxsplit=1)[0]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def test_the_opening_names_every_part_of_the_product() -> None:
    opening = readme().split("\n## ", 1)[0].lower()
    for part in (
        "resource claims", "directory", "glob", "fifo", "shared", "lease", "fencing",
        "versioned state store", "message bus", "token", "scopes", "sqlite", "postgresql",
        "inspector", "agenthold status", "warm server", "agenthold hook install", "agenthold web",
    ):  # fmt: skip
        assert part in opening, part


def test_set_up_has_two_commands_after_the_venv_advice_and_ci_runs_the_same_tests() -> None:
    set_up = section(readme(), "\n## Set up")
    commands = [
        line for b in blocks(set_up.split("\n### ", 1)[0], "bash") for line in b.split("\n") if line
    ]
    assert commands == [
        "python3 -m pip install . && agenthold",
        'python3 -m pip install -e ".[test]" && python3 -m pytest',
    ]
    assert set_up.index("python3 -m venv .venv") < set_up.index("```bash")
    # .ci/run runs the README's test command (with its interpreter, and -rs to see the skips)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    install, test = commands[1].replace("python3", '"$PYTHON"').split(" && ")
    assert install in ci
    assert any(line == test or line.startswith(test + " ") for line in ci), test


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        anchor, n = github_anchor(heading), 1
        while anchor in found:  # GitHub numbers repeated headings
            anchor, n = f"{github_anchor(heading)}-{n}", n + 1
        found.add(anchor)
    return found


def test_every_relative_link_of_the_readme_and_the_docs_leads_somewhere() -> None:
    checked = 0
    for page in [README, *PAGES]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            goal = (page.parent / path).resolve() if path else page
            name = goal.relative_to(REPO).as_posix() if goal.is_relative_to(REPO) else str(goal)
            if not goal.exists():
                assert name in PENDING, f"{page.name}: {target} leads nowhere"
                continue
            if anchor:
                assert anchor in anchors(goal), f"{page.name}: no heading for {target}"
            checked += 1
    assert checked > 60


#: How each install line reads from the package registry: right only once 0.11 is published.
REGISTRY_INSTALL = re.compile(
    r"pip install [\"']?agenthold\b|pipx install [\"']?agenthold\b|uvx (--from )?agenthold\b"
)


def test_no_install_line_or_hint_takes_agenthold_from_the_registry_before_it_is_published() -> None:
    """The registry has only 0.10.0 (broken with mcp 2.x, no postgres extra): a line that
    installs from it may appear only where it says how it will read once published."""
    texts = {p: p.read_text(encoding="utf-8") for p in [README, *PAGES, REPO / "server.json"]}
    texts |= {p: p.read_text(encoding="utf-8") for p in (REPO / "agenthold").glob("*.py")}
    texts |= {p: p.read_text(encoding="utf-8") for p in (REPO / "examples").rglob("*.py")}
    published = 0
    for path, text in texts.items():
        for line in text.splitlines():
            if REGISTRY_INSTALL.search(line):
                assert "published" in line or (
                    path == README and line.startswith("| ") and line.count("|") == 4
                ), f"{path.name}: {line.strip()}"
                published += 1
    table = section(readme(), "\n### Other ways to install")
    assert "| to | today, from a checkout | once 0.11 is published |" in table
    rows = [r for r in table.splitlines() if r.startswith("| ") and "`" in r]
    assert len(rows) == 4 and all(REGISTRY_INSTALL.search(r.split("|")[3]) for r in rows)
    assert not any(REGISTRY_INSTALL.search(r.split("|")[2]) for r in rows)
    assert published >= 4


def test_the_psycopg_hint_and_the_postgres_page_ask_for_what_the_extra_installs() -> None:
    """Where psycopg is missing, the library's one line names the postgres extra's own
    requirement (installable today, unlike "agenthold[postgres]"), as docs/postgres.md does."""
    import subprocess
    import sys

    from support import child_env

    extra = re.search(r'^postgres = \["([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert extra is not None
    script = (
        "import sys\nsys.modules['psycopg'] = None\n"
        "from agenthold.store import StateStore, InvalidInputError\n"
        "try:\n    StateStore('postgresql://u@h/db')\n"
        "except InvalidInputError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert done.returncode == 0, done.stderr
    wanted = f'pip install "{extra.group(1)}"'
    assert wanted in done.stdout, done.stdout
    assert wanted in (REPO / "docs" / "postgres.md").read_text(encoding="utf-8")


def host_workspaces(text: str) -> list[str]:
    """Every --workspace value of the README's host configurations."""
    connect = section(text, "\n## Connect an MCP client")
    found = []
    for block in blocks(connect, "bash"):
        for line in block.splitlines():
            found += re.findall(r"--workspace (\S+)", line)
    for block in blocks(connect, "json"):
        args = json.loads(block)["mcpServers"]["agenthold"]["args"]
        found.append(args[args.index("--workspace") + 1])
    for block in blocks(connect, "toml"):
        assert block.startswith("[mcp_servers.agenthold]\n"), block
        # a TOML array of plain strings reads as JSON (tomllib is Python 3.11 and later only)
        args = json.loads(re.search(r"^args = (\[.*\])$", block, re.MULTILINE).group(1))  # type: ignore[union-attr]
        found.append(args[args.index("--workspace") + 1])
    uv_args = re.search(r'`"args": (\[[^`]+\])`', connect)
    assert uv_args is not None
    args = json.loads(uv_args.group(1))
    found.append(args[args.index("--workspace") + 1])
    return found


def five_minute_command(text: str) -> list[str]:
    (block,) = blocks(section(text, FIVE_MINUTES), "bash")
    argv = block.split()
    assert argv[0] == "agenthold"
    return argv[1:]


def test_the_host_configurations_and_the_first_five_minutes_name_one_workspace() -> None:
    text = readme()
    workspaces = host_workspaces(text)
    assert len(workspaces) >= 5 and set(workspaces) == {"proj=/home/me/proj"}
    argv = five_minute_command(text)
    assert argv[argv.index("--workspace") + 1] == "proj=/home/me/proj"
    exchange = blocks(section(text, FIVE_MINUTES), "text")[0]
    uris = set(re.findall(r'"(file://[^/"]+)/', exchange))
    assert uris == {"file://proj"}  # the names that workspace gives, no file://default


CALL_LINE = re.compile(r"^(?P<who>[AB])  (?P<tool>agenthold_\w+) (?P<request>\{.*\})$")


def exchange_steps(text: str) -> list[tuple[str, str, dict[str, Any], str, Any]]:
    """The exchange as (who, tool, request, how it is answered, documented reply): how is
    "now", "later" (a wait in line, answered by the line after the next call's reply) or
    "answered" (that line)."""
    lines = blocks(section(text, FIVE_MINUTES), "text")[0].splitlines()
    steps: list[tuple[str, str, dict[str, Any], str, Any]] = []
    for n, line in enumerate(lines):
        call = CALL_LINE.match(line)
        if call is None:
            continue
        after = lines[n + 1].strip()
        if after.startswith("…"):
            steps.append((call["who"], call["tool"], json.loads(call["request"]), "later", None))
        else:
            assert after.startswith("→ {"), after
            steps.append(
                (
                    call["who"],
                    call["tool"],
                    json.loads(call["request"]),
                    "now",
                    json.loads(after[2:]),
                )
            )
        if n + 2 < len(lines) and lines[n + 2].strip().startswith("→ B's wait answers: "):
            reply = json.loads(lines[n + 2].strip().split(": ", 1)[1])
            steps.append(("B", "", {}, "answered", reply))
    return steps


def assert_shows(documented: Any, actual: Any, where: str) -> None:
    """Every field the README shows is in the real reply with that value (times any time)."""
    if isinstance(documented, dict):
        assert isinstance(actual, dict), where
        for key, value in documented.items():
            assert key in actual, f"{where}: no {key} in {actual}"
            assert_shows(value, actual[key], f"{where}.{key}")
    elif isinstance(documented, list):
        assert isinstance(actual, list) and len(actual) == len(documented), where
        for i, (d, a) in enumerate(zip(documented, actual, strict=True)):
            assert_shows(d, a, f"{where}[{i}]")
    else:
        assert_like(documented, actual, where)


async def test_the_first_five_minutes_are_what_two_real_servers_answer(tmp_path: Path) -> None:
    """Both agents' servers are real stdio processes started with the README's arguments (the
    project directory moved to tmp_path), on one database, as two hosts would start them."""
    import os
    import sqlite3
    import sys

    from mcp import Client, StdioServerParameters
    from support import child_env

    text = readme()
    root = tmp_path / "proj"
    (root / "src" / "api").mkdir(parents=True)
    argv = [a.replace("/home/me/proj", str(root)) for a in five_minute_command(text)]
    env = {**child_env(), "AGENTHOLD_DB": str(tmp_path / "five.db")}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "agenthold", *argv], cwd=str(tmp_path), env=env
    )
    steps = exchange_steps(text)
    tools = {tool for _, tool, _, _, _ in steps if tool}
    assert {"agenthold_claim", "agenthold_wait", "agenthold_set", "agenthold_append"} <= tools
    ids: dict[str, str] = {}
    async with (
        Client(params, read_timeout_seconds=60) as a,  # type: ignore[arg-type]
        Client(params, read_timeout_seconds=60) as b,  # type: ignore[arg-type]
        anyio.create_task_group() as tg,
    ):
        clients = {"A": a, "B": b}
        box: dict[str, Any] = {}
        for number, (who, tool, request, how, documented) in enumerate(steps, 1):
            where = f"step {number} ({tool or 'the wait'})"
            if how == "answered":
                with anyio.fail_after(30):
                    while "reply" not in box:
                        await anyio.sleep(0.01)
                assert_shows(swap_ids(documented, ids), box.pop("reply"), where)
                continue
            request = swap_ids(request, ids)
            if how == "later":

                async def wait(c: Any = clients[who], tool: str = tool, r: Any = request) -> None:
                    box["reply"] = (await c.call_tool(tool, r)).structured_content

                tg.start_soon(wait)
                with (  # until it is in line: the release after it must hand it the claim
                    anyio.fail_after(30),
                    contextlib.closing(sqlite3.connect(env["AGENTHOLD_DB"])) as db,
                ):
                    sql = "SELECT count(*) FROM claim_waiters WHERE granted IS NULL"
                    while db.execute(sql).fetchone()[0] == 0:
                        await anyio.sleep(0.01)
                continue
            result = await clients[who].call_tool(tool, request)
            actual = result.structured_content
            assert not result.is_error, (where, actual)
            if tool == "agenthold_register":
                ids[documented["agent_id"]] = actual["agent_id"]
            learn_ids(documented, actual, ids)
            assert_shows(swap_ids(documented, ids), actual, where)
    assert len(ids) >= 3 and os.path.exists(env["AGENTHOLD_DB"])


# --- HTTP by hand: the README's curl call, its 400s, and a wrong token -----------------------


@contextlib.contextmanager
def http_server(tmp_path: Path, argv: list[str]) -> Any:
    """``python -m agenthold ARGV --port 0`` on a database of its own; yields its URL once it
    says where it serves. Its standard error is read by a thread (kept in the list it yields)."""
    import subprocess
    import sys
    import threading

    from support import child_env

    args = [sys.executable, "-m", "agenthold", *argv, "--port", "0"]
    args += ["--db", str(tmp_path / "http.db")]
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=child_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if " serving " in line:
                started.set()
        started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(60) and proc.poll() is None, "".join(lines)
        url = re.search(r"serving \S+ tools at (http://127\.0\.0\.1:\d+/mcp)", "".join(lines))
        assert url is not None, lines
        yield url.group(1), lines
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(5)
    assert "Traceback" not in "".join(lines)


def curl_lines(text: str) -> tuple[list[str], str, Any]:
    """The README's server arguments, its curl command and the answer it shows."""
    part = section(text, CURL)
    (block,) = blocks(part, "bash")
    server, curl = block.split("\n", 1)
    assert server.startswith("agenthold ") and curl.startswith("curl ")
    documented = json.loads(blocks(part, "json")[0])
    return server.split()[1:], curl, documented


def run_curl(command: str, url: str) -> Any:
    import subprocess

    command = command.replace("http://127.0.0.1:8417/mcp", url)
    done = subprocess.run(
        ["bash", "-c", command.rstrip() + " -w '\\n%{http_code}'"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    body, status = done.stdout.rsplit("\n", 1)
    return int(status), json.loads(body)


needs_curl = pytest.mark.skipif(
    __import__("shutil").which("curl") is None, reason="curl is not installed"
)


@needs_curl
def test_the_readmes_curl_call_gets_the_documented_answer_from_a_real_server(
    tmp_path: Path,
) -> None:
    argv, curl, documented = curl_lines(readme())
    assert "--workspace" in argv and argv[argv.index("--workspace") + 1] == "proj=/home/me/proj"
    root = tmp_path / "proj"
    root.mkdir()
    argv = [a.replace("/home/me/proj", str(root)) for a in argv]
    with http_server(tmp_path, argv) as (url, _):
        status, answer = run_curl(curl, url)
    assert status == 200
    assert_shows(documented, answer, "the curl answer")
    content = json.loads(answer["result"]["content"][0]["text"])
    assert content == answer["result"]["structuredContent"]  # "the same JSON as text"
    assert answer["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "agenthold"


@needs_curl
def test_the_curl_call_without_each_part_gets_the_400_the_readme_describes(
    tmp_path: Path,
) -> None:
    text = readme()
    argv, curl, _ = curl_lines(text)
    described = " ".join(section(text, CURL).split())
    assert "a `400` that names what is wrong" in described and '"Missing session ID"' in described
    root = tmp_path / "proj"
    root.mkdir()
    argv = [a.replace("/home/me/proj", str(root)) for a in argv]
    cases = [  # what is left out, and what the 400 then says
        ("_meta", "io.modelcontextprotocol/protocolVersion"),
        ("Mcp-Method", "mcp-method header"),
        ("Mcp-Name", "mcp-name header"),
        ("MCP-Protocol-Version", "Missing session ID"),
    ]
    with http_server(tmp_path, argv) as (url, _):
        for left_out, said in cases:
            assert f"`{left_out}`" in described  # the README says what leaving it out does
            if left_out == "_meta":
                cut = re.sub(r',\s*"_meta": \{.*?\}\}', "", curl, flags=re.DOTALL)
            else:
                cut = re.sub(rf"\s*-H '{left_out}: [^']*' \\\n", "\n", curl)
            assert cut != curl, left_out
            status, answer = run_curl(cut, url)
            assert status == 400, (left_out, answer)
            assert said in answer["error"]["message"], (left_out, answer)


@needs_curl
async def test_a_wrong_token_gets_the_readmes_401_and_the_sdk_client_an_mcperror(
    tmp_path: Path,
) -> None:
    """Against a server started with --auth-file: curl with a wrong token gets the 401 body the
    README prints; a real mcp.Client (both protocol eras) fails as it connects with the
    MCPError the README names, which does not carry the server's message."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    from agenthold.identity.principals import add_token

    part = section(readme(), CURL)
    body = re.search(r"`(\{\"error\": \"unauthorized\".*?\})`", " ".join(part.split()))
    assert body is not None
    documented = json.loads(body.group(1))
    assert "MCPError: Server returned an error response` (code -32603)" in " ".join(part.split())
    token = add_token(tmp_path / "tokens.json", "alice", None)[0]
    argv, curl, _ = curl_lines(readme())
    argv = [a.replace("/home/me/proj", str(tmp_path)) for a in argv]
    with http_server(tmp_path, [*argv, "--auth-file", str(tmp_path / "tokens.json")]) as (url, _):
        wrong = curl.replace("curl -s", "curl -s -H 'Authorization: Bearer not-the-token'")
        status, answer = await anyio.to_thread.run_sync(run_curl, wrong, url)
        assert (status, answer) == (401, documented)
        right = curl.replace("curl -s", f"curl -s -H 'Authorization: Bearer {token}'")
        status, answer = await anyio.to_thread.run_sync(run_curl, right, url)
        assert status == 200 and answer["result"]["isError"] is False
        for mode in ("auto", "legacy"):
            headers = {"Authorization": "Bearer not-the-token"}
            connected = False
            with pytest.raises(BaseException) as refused:  # what it is: checked below
                async with (
                    httpx2.AsyncClient(headers=headers, timeout=30) as http,
                    Client(streamable_http_client(url, http_client=http), mode=mode) as client,  # type: ignore[arg-type]
                ):
                    connected = True  # not reached: it fails "as it connects"
                    await client.list_tools()
            assert not connected, mode
            errors = list(leaves(refused.value))
            assert [type(e) for e in errors] == [MCPError], (mode, errors)
            (error,) = errors
            assert isinstance(error, MCPError)
            assert (error.error.code, error.error.message) == (
                -32603,
                "Server returned an error response",
            )
            assert documented["message"] not in repr(refused.value)  # the server's words
            assert hasattr(refused.value, "exceptions")  # "wrapped in an exception group"


def leaves(error: BaseException) -> Any:
    """The exceptions inside nested exception groups."""
    if hasattr(error, "exceptions"):  # BaseExceptionGroup, built in from Python 3.11
        for inner in error.exceptions:
            yield from leaves(inner)
    else:
        yield error


# --- the install lines, run from a copy of the checkout -------------------------------------


def documented_install_lines() -> list[str]:
    """Every install command the README gives for today (from a checkout), as printed."""
    text = readme()
    lines = [
        b.split(" && ")[0]
        for b in blocks(section(text, "\n## Set up").split("\n### ", 1)[0], "bash")
    ]
    table = section(text, "\n### Other ways to install")
    for row in table.splitlines():
        if row.startswith("| ") and "`" in row:
            lines += [c for c in re.findall(r"`([^`]+)`", row.split("|")[2])]
    return lines


def venv_env() -> dict[str, str]:
    """The environment of a process of the test venv: no PYTHONPATH (it would import this
    tree) and no coverage hooks (they would measure the copy)."""
    import os

    drop = ("PYTHONPATH", "COV_CORE_", "COVERAGE_", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def copy_checkout(tmp_path: Path) -> Path:
    """What a build of the checkout reads, copied (a build writes into its source tree)."""
    import shutil

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, checkout / name)
    shutil.copytree(REPO / "agenthold", checkout / "agenthold",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return checkout


@pytest.mark.slow
def test_every_install_line_for_a_checkout_installs_a_working_agenthold(tmp_path: Path) -> None:
    """Each pip line of the README, run as printed in a copy of the checkout, inside a fresh
    venv that sees this environment's packages (--system-site-packages) and with --no-deps
    added, so the dependencies are the ones the suite runs on and nothing of agenthold comes
    from the registry. The build backend the checkout asks for (setuptools>=77) is installed
    into the venv once from the configured index, as `pip install .` itself would fetch it.
    The pipx and uv lines are the next test's."""
    import subprocess
    import sys

    lines = documented_install_lines()
    assert lines == [
        "python3 -m pip install .",
        'python3 -m pip install -e ".[test]"',
        "python3 -m pip install .",
        'python3 -m pip install ".[postgres]"',
        "pipx install .",
        "pipx install /path/to/checkout",
        "uvx --from /path/to/checkout agenthold",
    ]
    checkout = copy_checkout(tmp_path)
    venv = tmp_path / "venv"
    env = venv_env()

    def run(*argv: str | Path, cwd: Path = checkout) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
            timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    made = run(sys.executable, "-m", "venv", "--system-site-packages", venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python3"
    backend = run(python, "-m", "pip", "install", "--quiet", "setuptools>=77")
    if backend.returncode != 0:
        pytest.skip(f"setuptools>=77 could not be installed into the venv: {backend.stderr}")
    for line in dict.fromkeys(lines):  # each distinct line once
        argv = line.split()
        if argv[0] in ("pipx", "uvx"):
            continue
        assert argv[:4] == ["python3", "-m", "pip", "install"], line
        target = [a.strip('"') for a in argv[4:]]
        done = run(python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", *target)
        assert done.returncode == 0, (line, done.stderr)
        version = run(venv / "bin" / "agenthold", "--version", cwd=tmp_path)
        assert version.returncode == 0, (line, version.stderr)
        assert version.stdout == "agenthold 0.11.0.dev0\n", line
        where = run(python, "-c", "import agenthold; print(agenthold.__file__)", cwd=tmp_path)
        installed = Path(where.stdout.strip())
        editable = "-e" in argv
        assert installed.is_relative_to(checkout if editable else venv), (line, installed)
        extras = run(
            python, "-c", "import importlib.metadata as m; "
            "print(m.metadata('agenthold').get_all('Provides-Extra'))", cwd=tmp_path,
        )  # fmt: skip
        assert "postgres" in extras.stdout and "test" in extras.stdout, extras.stdout
        served = run(venv / "bin" / "agenthold", "--db", ":memory:", cwd=tmp_path)
        assert served.returncode == 0 and served.stderr == "", (line, served.stderr)
        # every subpackage and the page's files are installed, not only the top package
        packages = sorted(p.parent.name for p in (checkout / "agenthold").glob("*/__init__.py"))
        found = run(
            python, "-c", "import importlib, importlib.resources as r, sys; "
            "[importlib.import_module('agenthold.' + n) for n in sys.argv[1:]]; "
            "print(r.files('agenthold.web').joinpath('static/index.html').is_file())",
            *packages, cwd=tmp_path,
        )  # fmt: skip
        assert found.returncode == 0 and found.stdout == "True\n", (line, found.stderr)
        assert {"hooks", "web"} <= set(packages)


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["pipx", "uvx"])
def test_the_pipx_and_uv_lines_for_a_checkout_install_a_working_agenthold(
    tmp_path: Path, tool: str
) -> None:
    """`pipx install .`, `pipx install /path/to/checkout` and `uvx --from /path/to/checkout
    agenthold`, as printed, with the checkout copied to tmp_path; run where the tool is
    installed (they fetch the dependencies from the configured index themselves)."""
    import shutil
    import subprocess

    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed here, so its README lines were not run")
    checkout = copy_checkout(tmp_path)
    lines = [line for line in documented_install_lines() if line.startswith(tool + " ")]
    assert lines
    for n, line in enumerate(lines):
        home = tmp_path / f"tool-{n}"  # each line installs into a home of its own
        env = {
            **venv_env(),
            "PIPX_HOME": str(home / "pipx"),
            "PIPX_BIN_DIR": str(home / "bin"),
            "UV_TOOL_DIR": str(home / "uv"),
        }
        argv = line.replace("/path/to/checkout", str(checkout)).split()
        if tool == "uvx":
            argv.append("--version")
        done = subprocess.run(
            argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=600,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 0, (line, done.stderr)
        if tool == "pipx":
            done = subprocess.run(
                [str(home / "bin" / "agenthold"), "--version"], env=env, capture_output=True,
                text=True, timeout=60, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        assert done.stdout == "agenthold 0.11.0.dev0\n", (line, done.stderr)


# --- the reference pages moved out of the README --------------------------------------------


def test_the_configuration_page_has_a_row_for_every_flag_the_server_takes() -> None:
    from agenthold.cli.main import build_parser

    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (`--.*?) \|", page, re.MULTILINE)
    documented = {flag for row in rows for flag in re.findall(r"`(--[a-z-]+)", row)}
    served = {o for a in build_parser()._actions for o in a.option_strings if o.startswith("--")}
    # --help is argparse's; --json belongs to the inspector's subcommands (docs/inspector.md)
    assert documented == served - {"--help", "--json"}


def test_every_install_line_of_the_docs_pages_is_one_the_readme_test_runs() -> None:
    """A page may repeat an install line of the README (which the slow test runs), or say how
    a line will read once published; it brings no line of its own that nothing runs."""
    runs = set(documented_install_lines())
    for page in PAGES:
        for block in blocks(page.read_text(encoding="utf-8"), r"(?:sh|bash)"):
            for line in block.splitlines():
                command = line.split("#", 1)[0].strip()
                if re.search(r"\b(pip|pipx) install\b|\buvx\b", command):
                    assert command in runs, f"{page.name}: {command}"


def test_the_store_pages_first_example_runs_as_printed(tmp_path: Path) -> None:
    """docs/store.md's library example runs as printed (its write with the version it read goes
    through), and a stale write's ConflictError carries the detail keys its comment names."""
    import os

    from agenthold.exceptions import ConflictError

    page = (REPO / "docs" / "store.md").read_text(encoding="utf-8")
    code = blocks(section(page, "\n## The state store as a Python library"), "python")[0]
    named = re.search(r"exc\.detail  # (.*)", code)
    assert named is not None
    here = os.getcwd()
    os.chdir(tmp_path)  # the example opens ./state.db
    try:
        exec(code, {})
    finally:
        os.chdir(here)
    with StateStore(tmp_path / "state.db") as store:
        assert store.get("order-1234", "status").value == "packed"
        with pytest.raises(ConflictError) as stale:
            store.set("order-1234", "status", "lost", updated_by="late", expected_version=1)
    assert set(named.group(1).split(", ")) <= set(stale.value.detail)
