"""Where the database is: the per-user state directory, the database a command uses (``--db``,
$AGENTHOLD_DB or the per-user default), and the checks that make a bad ``--db`` one line with
exit status 2 before anything opens it.

Decisions behind it:
- One database per user by default, in the platform's state directory, not in the current
  directory: hosts start servers in different directories, and servers that silently opened
  different files would never coordinate. The server and the inspector resolve it the same way.
- The standard library only (``cli.py`` imports it for ``--help`` too).
"""

from __future__ import annotations

import errno
import os
import sys

DB_FILE = "agenthold.db"
DB_ENV = "AGENTHOLD_DB"


class UsageError(Exception):
    """A bad command-line value: printed as one line, exit status 2."""


def state_directory(environ: dict[str, str], platform: str = sys.platform) -> str:
    """Where agenthold keeps per-user state: $XDG_STATE_HOME/agenthold (or
    ~/.local/state/agenthold) on Linux and other Unix, ~/Library/Application Support/agenthold
    on macOS, %LOCALAPPDATA%\\agenthold on Windows."""
    home = os.path.expanduser("~")
    if platform == "win32":
        base = environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
    elif platform == "darwin":
        base = os.path.join(home, "Library", "Application Support")
    else:
        base = environ.get("XDG_STATE_HOME", "")
        if not os.path.isabs(base):  # the XDG spec says to ignore a relative value
            base = os.path.join(home, ".local", "state")
    return os.path.join(base, "agenthold")


def database_path(given: str | None, environ: dict[str, str]) -> tuple[str, bool]:
    """The database file to use and whether it is the per-user default: ``--db`` if given,
    else $AGENTHOLD_DB if set and not empty, else agenthold.db in ``state_directory``. A
    leading ``~`` is expanded (JSON host configurations have no shell to do it)."""
    if given is None:
        given = environ.get(DB_ENV) or None
        flag = DB_ENV
    else:
        flag = "--db"
    if given is None:
        return os.path.join(state_directory(environ), DB_FILE), True
    if not given.strip():
        raise UsageError(
            f"{flag}: an empty path; give a database file, or leave it out for the "
            f"per-user default ({os.path.join(state_directory(environ), DB_FILE)})"
        )
    path = given if given == ":memory:" else os.path.expanduser(given)
    for name in (path, path + "-wal"):  # SQLite also needs the write-ahead log's name
        try:
            os.stat(name)
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise UsageError(
                    f"{flag}: {path!r} is longer than this system allows for a path or one of "
                    "its names (with the '-wal' suffix SQLite adds); use a shorter path"
                ) from None
        except ValueError:
            raise UsageError(f"{flag}: {path!r} contains a NUL character") from None
    return path, False


SQLITE_HEADER = b"SQLite format 3\x00"  # store.SQLITE_MAGIC, here so a check imports nothing


# SQLite's limit on a database's full path (links resolved), as store.SQLITE_MAX_PATH says it:
# 512 bytes less the '-journal' it adds (tests/test_opening.py checks that the two agree).
SQLITE_MAX_PATH = 512 - len("-journal")


def _shown(path: str) -> str:
    return path if len(path) <= 120 else path[:60] + "..." + path[-40:]


def check_db(path: str, *, creates: bool) -> None:
    """A UsageError (exit status 2) when the database file ``path`` cannot be one: its directory
    is missing, it is a directory, it is not a SQLite file, or (``creates`` False: the
    inspector and ``backup``, which never create one) it does not exist. The store checks the
    same as it opens; checked here first, a bad ``--db`` is a usage error like any bad flag,
    for the server and every subcommand alike. PostgreSQL URLs and ':memory:' pass."""
    if path == ":memory:" or path.startswith(("postgresql://", "postgres://")):
        return
    full = len(os.fsencode(os.path.abspath(os.path.realpath(path))))
    if full > SQLITE_MAX_PATH:  # SQLite itself would say only "unable to open database file"
        raise UsageError(
            f"--db: cannot open database {_shown(path)!r}: its full path is {full} bytes long, and "
            f"SQLite opens no database whose full path is over {SQLITE_MAX_PATH} bytes; move it "
            "to a shorter path (a symbolic link does not help: SQLite follows it)"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(
            f"--db: cannot open database {path!r}: the directory {parent!r} does not exist"
        )
    if os.path.isdir(path):
        raise UsageError(f"--db: cannot open database {path!r}: it is a directory")
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        if creates:
            return
        raise UsageError(
            f"--db: no database at {path!r} (the inspector never creates one; a server makes "
            "it on its first call)"
        ) from None
    except OSError as exc:
        raise UsageError(f"--db: cannot read database {path!r}: {exc.strerror}") from None
    if header and header != SQLITE_HEADER:
        raise UsageError(
            f"--db: {path!r} is not a SQLite database, so not an agenthold database; give "
            "another --db path"
        )


def workspace_spec(spec: str) -> str:
    """``spec`` with a leading ``~`` of its path expanded, in NAME=~/dir as in ~/dir."""
    name, equals, path = spec.partition("=")
    if equals and path.startswith("~") and "/" not in name and "\\" not in name:
        return f"{name}={os.path.expanduser(path)}"
    return os.path.expanduser(spec) if spec.startswith("~") else spec
