"""A throwaway PostgreSQL cluster for the tests: initdb and pg_ctl in a temporary directory,
listening only on a Unix socket there, with fsync off (nothing in it must survive). Run as root,
the server runs as the ``postgres`` user (PostgreSQL refuses to run as root), through runuser.

Each test gets its own schema (``fresh_url``): creating one takes a millisecond where a database
takes a tenth of a second, and agenthold finds its tables through the search_path.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

SKIP_REASON = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found: install postgresql "
    "(apt-get install -y postgresql) to run the PostgreSQL tests"
)


def find_bindir() -> str | None:
    """The directory of initdb and pg_ctl: $PG_BINDIR, Debian's newest, or the PATH."""
    candidates = [os.environ.get("PG_BINDIR", "")]
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    found = shutil.which("initdb")
    candidates.append(os.path.dirname(found) if found else "")
    for bindir in candidates:
        if bindir and os.path.exists(os.path.join(bindir, "initdb")):
            return bindir
    return None


class Cluster:
    """One running server; ``stop`` ends it and removes its files."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="agenthold-pg-"))
        self.data = self.root / "data"
        self.socket_dir = str(self.root)
        self.as_root = os.geteuid() == 0
        self._schemas = itertools.count(1)
        os.chmod(self.root, 0o777)  # the server (user postgres) writes its socket here
        if self.as_root:
            shutil.chown(self.root, "postgres")
        self.run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                 "--no-sync", "--locale=C.UTF-8")  # fmt: skip
        self.start()
        self._reaper = self._start_reaper()

    def _start_reaper(self) -> subprocess.Popen[bytes]:
        """A small process that stops the server and removes its files once this process is
        gone, even if it never ran its teardown (the hang watchdog ends it with os._exit)."""
        stop = [
            os.path.join(self.bindir, "pg_ctl"),
            "stop",
            "-D",
            str(self.data),
            "-m",
            "immediate",
        ]
        if self.as_root:
            stop = ["runuser", "-u", "postgres", "--", *stop]
        script = (
            "import os, shutil, subprocess, sys, time\n"
            "parent, stop, root = int(sys.argv[1]), sys.argv[3:], sys.argv[2]\n"
            "while os.getppid() == parent:\n"
            "    time.sleep(0.5)\n"
            "subprocess.run(stop, capture_output=True)\n"
            "shutil.rmtree(root, ignore_errors=True)\n"
        )
        return subprocess.Popen(
            [sys.executable, "-c", script, str(os.getpid()), str(self.root), *stop],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.startswith("COVERAGE")},
        )

    def run(self, tool: str, *args: str) -> None:
        argv = [os.path.join(self.bindir, tool), *args]
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, cwd=self.root)

    def start(self) -> None:
        options = (
            f"-c listen_addresses='' -k {self.socket_dir} -c fsync=off -c full_page_writes=off "
            "-c synchronous_commit=off -c max_connections=300 -c shared_buffers=32MB"
        )
        self.run("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.root / "log"),
                 "-o", options)  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "stop", "-w", "-D", str(self.data), "-m", mode)

    def restart(self) -> None:
        self.stop("fast")
        self.start()  # with its log file: a server writing to our pipe would keep run() waiting

    def url(self, options: str = "") -> str:
        host = quote(self.socket_dir, safe="")
        url = f"postgresql://postgres@/postgres?host={host}"
        return url + (f"&options={quote(options, safe='')}" if options else "")

    def fresh_url(self) -> str:
        """The URL of a new, empty schema of its own."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._schemas)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return self.url(f"-csearch_path={name}")

    def skewed_url(self, seconds: float) -> str:
        """The URL of a new, empty schema whose clock runs ``seconds`` ahead of this host's
        (behind if negative), as a database server on a host with another clock would: the
        schema's own ``clock_timestamp()`` shadows pg_catalog's, which its search_path names
        last (PostgreSQL searches pg_catalog first only when the path leaves it out)."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._schemas)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
            conn.execute(
                f"CREATE FUNCTION {name}.clock_timestamp() RETURNS timestamptz LANGUAGE sql "
                f"VOLATILE AS $$ SELECT pg_catalog.clock_timestamp() "
                f"+ make_interval(secs => {float(seconds)!r}) $$"
            )
        return self.url(f"-csearch_path={name},pg_catalog")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
        self._reaper.kill()
        self._reaper.wait()
