"""Throughput of StateStore on PostgreSQL beside raw psycopg running the same statements.

    python bench/pg_bench.py --db postgresql://user@/dbname?host=/run/postgresql
    python bench/pg_bench.py --db URL --quick      # a smoke run

Needs the ``agenthold[postgres]`` extra and a server (a Unix socket is what the targets mean).
The database (or the schema named by ``options=-csearch_path=...``) must be empty or agenthold's;
the benchmark writes namespace ``bench`` in it.

1. ``set`` with ``expected_version`` on one key, one write after another.
2. ``get`` of one key.

The baseline is one psycopg connection in autocommit mode doing what PostgresDatabase does for
the same call: get is the SELECT plus json.loads; set is json.dumps, a UTC timestamp, BEGIN, the
advisory locks and clock read, the SELECT of the current version, the history INSERT, the state
UPSERT, and NOTIFY with COMMIT in one round trip. The ratio store/raw is what validation, the
pool and record objects cost. Target: at least 0.7 for both. Rates are the best of several runs,
store and raw taking turns.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import psycopg
from _common import best_rates, check_line, table

from agenthold import store as st
from agenthold.postgres import lock_key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True, help="a postgresql:// URL")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, repeats = (200, 2) if args.quick else (3000, 5)

    store = st.StateStore(args.db)
    store.set("bench", "occ", 0, updated_by="bench")
    store.set("bench", "raw", 0, updated_by="bench")
    raw = psycopg.connect(args.db, autocommit=True)
    current = st._CURRENT.replace("?", "%s")
    get_sql = st._GET.replace("?", "%s")
    history_sql = st._INSERT_HISTORY.replace("?", "%s")
    upsert_sql = st._UPSERT.replace("?", "%s")
    locks = (
        "SELECT extract(epoch FROM clock_timestamp())::float8 FROM (SELECT "
        "pg_advisory_xact_lock_shared(%s::int8), pg_advisory_xact_lock(%s::int8)) AS l"
    )
    ns_lock, key_lock = lock_key("state\x1fbench"), lock_key("state\x1fbench\x1fraw")

    def store_set(count: int) -> None:
        version = store.get("bench", "occ").version
        for i in range(count):
            version = store.set(
                "bench", "occ", {"i": i}, updated_by="bench", expected_version=version
            ).version

    def raw_set(count: int) -> None:
        for i in range(count):
            text = json.dumps({"i": i}, separators=(",", ":"))
            now = st.utc_iso()
            raw.execute("BEGIN")
            raw.execute(locks, (ns_lock, key_lock))
            row = raw.execute(current, ("bench", "raw")).fetchone()
            assert row is not None
            version = row[0] + 1
            raw.execute(history_sql, ("bench", "raw", version, text, "bench", now, "write"))
            raw.execute(upsert_sql, ("bench", "raw", text, version, "bench", now))
            raw.execute("""NOTIFY agenthold, '[["k","bench","raw"]]'; COMMIT""")

    def store_get(count: int) -> None:
        for _ in range(count):
            store.get("bench", "occ")

    def raw_get(count: int) -> None:
        for _ in range(count):
            row = raw.execute(get_sql, ("bench", "raw")).fetchone()
            json.loads(row[0])

    sets = best_rates({"store": store_set, "raw": raw_set}, n, repeats)
    gets = best_rates({"store": store_get, "raw": raw_get}, n * 3, repeats)
    rows = [["operation", "store/s", "raw psycopg/s", "ratio"]]
    checks = []
    for name, rates in (("set (expected_version)", sets), ("get", gets)):
        ratio = rates["store"] / rates["raw"]
        rows.append([name, f"{rates['store']:,.0f}", f"{rates['raw']:,.0f}", f"{ratio:.2f}"])
        checks.append(check_line(ratio >= 0.7, f"{name} at least 0.7 of raw", f"{ratio:.2f}"))
    print(table(rows))
    print("\n".join(checks))
    raw.close()
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
