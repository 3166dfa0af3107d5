"""The ``store`` fixture, parametrised over every backend (conventions 3).

Each backend says how to open a fresh (unmigrated) store in a temporary place and what one of its driver errors
looks like, so that the conformance tests never name a driver themselves. PostgreSQL's stores are new databases of
the worker's one server (``postgres_server``), dropped at teardown.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from talaria.store import migrations
from talaria.store.sqlite import SQLiteStore
from talaria.testing.postgres_server import PostgresServer


@dataclass(frozen=True)
class Backend:
    name: str
    open: Callable[[Path], Any]
    """Open a fresh, unmigrated store whose files (SQLite) live under the given directory."""
    driver_error: Callable[[], BaseException]
    """A driver-level error, as a fault hook would see it from the database."""
    cleanup: Callable[[], None] = lambda: None


def _sqlite(request: pytest.FixtureRequest) -> Backend:
    def open_store(directory: Path) -> SQLiteStore:
        directory.mkdir(parents=True, exist_ok=True)
        return SQLiteStore(directory / "talaria.sqlite3")

    return Backend("sqlite", open_store, lambda: sqlite3.OperationalError("disk I/O error"))


def _postgresql(request: pytest.FixtureRequest) -> Backend:
    import psycopg

    from talaria.store.postgres import admin
    from talaria.store.postgres.store import PostgresStore

    server: PostgresServer = request.getfixturevalue("postgres_server")
    made: list[str] = []

    def open_store(directory: Path) -> PostgresStore:
        name = f"t{len(made)}_{secrets.token_hex(6)}"
        admin.create_database(server.url(), name)
        made.append(name)
        return PostgresStore(server.url(name))

    def cleanup() -> None:
        for name in made:
            admin.drop_database(server.url(), name)

    return Backend("postgresql", open_store, lambda: psycopg.OperationalError("disk I/O error"), cleanup)


BACKENDS = {"sqlite": _sqlite, "postgresql": _postgresql}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    chosen = BACKENDS[request.param](request)
    yield chosen
    chosen.cleanup()


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
