"""The database seam: the backends (SQLite embedded, PostgreSQL) behind one protocol, and
where a command's database is (locations.py)."""
