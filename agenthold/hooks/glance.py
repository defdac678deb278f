"""A glance before the look: whether a SQLite database holds no live claim at all, read with
one plain connection before the store, the resolver and the claims' rooms are imported.

Most edits meet a database in which nobody holds anything, and for those the store's opening
(its module alone is most of the hook's budget) only confirms what one query says. Decisions
behind it:
- It answers only "nothing is held", and only when it is sure: a file agenthold made
  (``application_id``) at exactly the layout and component versions this code reads (else the
  store would migrate or refuse it), without the claims tables, or with no claim whose holder
  is live (registered, its lease not ended, by the host's clock, which is SQLite's) and no
  shared hold at all. Anything else, or any error, says "look", and the hook opens the store
  as before: the glance can make a verdict sooner, never a different one.
- Read-only (``mode=ro``, ``query_only``): it never creates, migrates or checkpoints a file.
- Only with ``--on-error allow`` (the default) and for an edit that claims nothing: the store's
  own checks of the file (a log left by another database, a file replaced under a server)
  are skipped here, and in strict mode those must refuse the edit, so strict mode always looks.
- The versions are restated (importing the store to read them would cost what the glance
  saves); tests/test_hooks.py keeps them equal to the store's and the claims schema's.
"""

from __future__ import annotations

import os

APPLICATION_ID = 0x41474844  # store.APPLICATION_ID
LAYOUT = 4  # store.SCHEMA_VERSION
STORE_VERSION = 2  # store.STORE_SCHEMA.version
CLAIMS_VERSION = 8  # claims.schema.CLAIMS_SCHEMA.version

_ANY_HELD = (
    "SELECT EXISTS (SELECT 1 FROM claims AS c JOIN agents AS a ON a.agent_id = c.holder "
    "WHERE c.holder IS NOT NULL AND (a.lease_ends_at IS NULL OR a.lease_ends_at > ?)) "
    "OR EXISTS (SELECT 1 FROM claim_shares)"
)


def nothing_held(path: str) -> bool:
    """Whether the SQLite database at ``path`` surely holds no live claim (False: look)."""
    if path == ":memory:" or "://" in path:
        return False
    import sqlite3
    import time

    real = os.path.realpath(path)
    uri = "file:" + real.replace("%", "%25").replace("?", "%3f").replace("#", "%23") + "?mode=ro"
    try:
        # no waiting: a file locked by a writer outside WAL mode is the store's to wait for
        conn = sqlite3.connect(uri, uri=True, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        conn.execute("PRAGMA query_only = 1")
        conn.execute("BEGIN")  # one snapshot: the versions and the claims read together
        if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            return False
        if conn.execute("PRAGMA user_version").fetchone()[0] != LAYOUT:
            return False
        versions = dict(conn.execute("SELECT component, version FROM agenthold_components"))
        if versions.get("store") != STORE_VERSION:
            return False
        if "claims" not in versions:  # the claims tables were never made: nothing is held
            return True
        if versions["claims"] != CLAIMS_VERSION:
            return False
        return not conn.execute(_ANY_HELD, (time.time(),)).fetchone()[0]
    except sqlite3.Error:  # no such table, a damaged file, a busy one...: look
        return False
    finally:
        conn.close()
