"""The ``store`` fixture, parametrised over every backend (conventions 3).

Only SQLite exists today; PostgreSQL joins ``BACKENDS`` when its store does. Each backend says how
to open a fresh (unmigrated) store in a temporary place and what one of its driver errors looks
like, so that the conformance tests never name a driver themselves.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from talaria.store import migrations
from talaria.store.sqlite import SQLiteStore


@dataclass(frozen=True)
class Backend:
    name: str
    open: Callable[[Path], Any]
    """Open a fresh, unmigrated store whose files live under the given directory."""
    driver_error: Callable[[], BaseException]
    """A driver-level error, as a fault hook would see it from the database."""


def _sqlite_open(directory: Path) -> SQLiteStore:
    directory.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(directory / "talaria.sqlite3")


BACKENDS = {
    "sqlite": Backend("sqlite", _sqlite_open, lambda: sqlite3.OperationalError("disk I/O error")),
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param]


@pytest.fixture
def make_store(backend: Backend, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``make_store(name="db", migrate=True)``: another store of the same backend; all closed at teardown."""
    made: list[Any] = []

    def factory(name: str = "db", *, migrate: bool = True) -> Any:
        store = backend.open(tmp_path / name)
        made.append(store)
        if migrate:
            migrations.upgrade(store)
        return store

    yield factory
    for store in made:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., Any]) -> Any:
    """A store of the backend with every migration applied."""
    return make_store()
