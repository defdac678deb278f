"""Shared fixtures: real state stores on real SQLite files or ":memory:", closed after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthold.store import StateStore


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where a test's database file lives (not created yet)."""
    return tmp_path / "state.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[StateStore]:
    """A StateStore on a fresh database file."""
    with StateStore(db_path) as s:
        yield s


@pytest.fixture
def memory_store() -> Iterator[StateStore]:
    """A StateStore on a private in-memory database."""
    with StateStore(":memory:") as s:
        yield s
