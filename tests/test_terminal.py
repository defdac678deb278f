"""``agenthold`` typed in a shell: stdin, stdout and stderr are a terminal.

The terminal here is a pseudo-terminal that is the server's controlling terminal, with the
server in its foreground process group, so Ctrl-C is the line discipline's SIGINT exactly as
in a shell (a signal sent by hand would not prove that). The server must say what it is, read
what is typed, stop at once on Ctrl-C or SIGTERM without a traceback, and leave the terminal
as it found it (blocking: the shell shares its file status flags).
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import child_env

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX terminals only")

BANNER = "this is an MCP server"
PROMPT_STOP = 10.0  # seconds a stop may take on a loaded machine: in practice well under one


@dataclass
class Terminal:
    proc: subprocess.Popen[bytes]
    master: int
    slave: int  # kept open here: the same open file description as the server's 0, 1 and 2
    seen: bytearray = field(default_factory=bytearray)

    def read_until(self, text: str, timeout: float = 60.0) -> str:
        """What the terminal showed, once it shows ``text`` (or fail after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never appeared in {self.seen.decode(errors='replace')!r}"
            if select.select([self.master], [], [], min(left, 0.2))[0]:
                with suppress(OSError):  # EIO: the server has closed the terminal
                    self.seen += os.read(self.master, 65536)
        return self.seen.decode(errors="replace")

    def wait_in_the_foreground(self, timeout: float = 30.0) -> None:
        """Until the server's process group is the terminal's foreground one: a Ctrl-C typed
        before that would reach no process at all."""
        deadline = time.monotonic() + timeout
        while os.tcgetpgrp(self.master) != self.proc.pid:
            assert time.monotonic() < deadline, "the server never took the terminal"
            time.sleep(0.01)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def wait(self) -> tuple[int, float]:
        """The exit status, and how long after this call it came."""
        started = time.monotonic()
        status = self.proc.wait(timeout=PROMPT_STOP + 20)
        elapsed = time.monotonic() - started
        while select.select([self.master], [], [], 0)[0]:  # the last words on the terminal
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.seen += chunk
        return status, elapsed


@contextmanager
def agenthold_on_a_terminal(tmp_path: Path) -> Iterator[Terminal]:
    master, slave = os.openpty()

    def controlling_terminal() -> None:  # in the child, before exec
        # a terminal's shell starts its foreground job with SIGINT at its default, even when
        # this suite runs as a background job with SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    env = child_env()
    env["AGENTHOLD_NO_WARM"] = "1"  # a terminal never goes warm anyway; keep it out of the way
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthold", "--db", str(tmp_path / "typed.db")],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=tmp_path,
        env=env,
        preexec_fn=controlling_terminal,  # runs in the child, before exec
    )
    terminal = Terminal(proc, master, slave)
    try:
        yield terminal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_typed_in_a_shell_it_says_what_it_is_reads_lines_and_stops_at_once(
    tmp_path: Path, stop: str
) -> None:
    with agenthold_on_a_terminal(tmp_path) as terminal:
        shown = terminal.read_until("Ctrl-C quits")
        assert BANNER in shown and "Connect an MCP client" in shown
        terminal.type(b"hello\n")  # not JSON-RPC: answered as such, on the terminal
        terminal.read_until('"code":-32700')
        if stop == "ctrl-c":
            terminal.type(b"\x03")  # the line discipline turns it into SIGINT
        else:
            terminal.proc.send_signal(signal.SIGTERM)
        status, elapsed = terminal.wait()
        assert status == 0 and elapsed < PROMPT_STOP, (status, elapsed, terminal.seen)
        assert b"Traceback" not in terminal.seen
        assert os.get_blocking(terminal.slave)  # the shell gets its terminal back as it was


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_ctrl_c_while_it_is_still_starting_ends_it_without_a_traceback(tmp_path: Path) -> None:
    """Ctrl-C while the SDK is being imported (its pydantic-core library is mapped, the
    server's handlers are not in place yet): the end, with no traceback. (Before agenthold's
    own first line runs, an interrupt is Python's to report, as for any program.)"""
    with agenthold_on_a_terminal(tmp_path) as terminal:
        terminal.wait_in_the_foreground()
        maps = Path(f"/proc/{terminal.proc.pid}/maps")
        deadline = time.monotonic() + 60
        while "pydantic_core" not in maps.read_text():
            assert time.monotonic() < deadline, "the SDK was never imported"
            time.sleep(0.005)
        terminal.type(b"\x03")
        status, elapsed = terminal.wait()
        # 130 if the interrupt landed in the import, 0 if the server's own handler took it
        assert status in (130, 0) and elapsed < PROMPT_STOP, status
        assert b"Traceback" not in terminal.seen, terminal.seen.decode(errors="replace")


@pytest.mark.parametrize("key", [b"\x04", b"\x03"], ids=["ctrl-d", "ctrl-c"])
def test_typed_in_a_shell_it_makes_no_database_until_something_is_typed(
    tmp_path: Path, key: bytes
) -> None:
    """Someone who types ``agenthold`` to see what it is and quits gets no database: it is
    opened (and made) on the first line typed, not before."""
    db = tmp_path / "typed.db"
    with agenthold_on_a_terminal(tmp_path) as terminal:
        terminal.read_until("Ctrl-C quits")
        terminal.wait_in_the_foreground()
        time.sleep(0.2)  # would it make the file while it waits? (a chance to, not a verdict)
        assert not db.exists()
        terminal.type(key)  # at the start of a line: the end of input, or the interrupt
        status, elapsed = terminal.wait()
        assert status == 0 and elapsed < PROMPT_STOP, (status, terminal.seen)
        assert b"Traceback" not in terminal.seen
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_typed_in_a_shell_the_first_line_opens_the_database(tmp_path: Path) -> None:
    with agenthold_on_a_terminal(tmp_path) as terminal:
        terminal.read_until("Ctrl-C quits")
        terminal.type(b"hello\n")
        terminal.read_until('"code":-32700')  # served: the database is open
        assert (tmp_path / "typed.db").exists()
        terminal.type(b"\x04")
        status, _ = terminal.wait()
        assert status == 0
