"""The two store backends for the tests that run on both (scale.md 2.6): a test database on SQLite (the data
directory's file) or PostgreSQL (a new database on the worker's server, cloned from a template migrated once), the
settings that point a hub at it, raw SQL beside the store (tampering and checks, ``?`` parameters on both), and a
driver error of the backend for fault hooks."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.interface import Store
from talaria.store.open import open_sqlite
from talaria.store.postgres import admin
from talaria.store.postgres.store import PostgresStore
from talaria.testing.postgres_server import PostgresServer

BACKENDS = ("sqlite", "postgresql")
TEMPLATE = "talaria_migrated"


@dataclass
class BackendDatabase:
    backend: str
    url: str = ""  # PostgreSQL only
    made: list[str] = field(default_factory=list)

    def settings(self) -> dict[str, Any]:
        """Keyword settings that point a hub (``Settings``) at this database."""
        return {"database_url": self.url} if self.url else {}

    def open_store(self, data_dir: Path) -> Store:
        """A store of this database, as a hub process would open it (migrations not applied here)."""
        if not self.url:
            return open_sqlite(data_dir)
        return PostgresStore(self.url)

    def driver_error(self, message: str) -> BaseException:
        return sqlite3.OperationalError(message) if not self.url else psycopg.OperationalError(message)


def raw_sql(settings: Settings, sql: str, *args: Any) -> list[dict[str, Any]]:
    """Run one statement on the hub's database outside its store (autocommit), ``?`` parameters on both backends;
    the rows it returns, if any."""
    if not settings.database_url:
        conn = sqlite3.connect(settings.sqlite_path, isolation_level=None)
        try:
            cur = conn.execute(sql, args)
            names = [d[0] for d in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        finally:
            conn.close()
    with psycopg.connect(settings.database_url, autocommit=True) as pg:
        return PostgresReader(pg).all(sql, *args)


def qmark_to_psycopg(sql: str) -> str:
    """``?`` parameters (the tests' raw SQL, as sqlite3 takes it) in psycopg's style; a literal ``%`` doubled."""
    return sql.replace("%", "%%").replace("?", "%s")


@dataclass
class PostgresReader:
    """Raw SQL on one PostgreSQL connection, ``?`` parameters, rows as dicts (as ``sqlite3.Row`` reads)."""

    conn: psycopg.Connection[Any]

    def all(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        cur = self.conn.execute(qmark_to_psycopg(sql), args)  # type: ignore[arg-type]
        if cur.description is None:
            return []
        names = [d.name for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


_TEMPLATED: set[str] = set()  # servers (by URL) whose template database is migrated


def _template(server: PostgresServer) -> str:
    """A database migrated once per server, cloned for each test (``CREATE DATABASE … TEMPLATE``)."""
    if server.url() not in _TEMPLATED:
        admin.create_database(server.url(), TEMPLATE)
        store = PostgresStore(server.url(TEMPLATE))
        try:
            migrations.upgrade(store)
        finally:
            store.close()
        _TEMPLATED.add(server.url())
    return TEMPLATE


def new_postgres_database(server: PostgresServer, *, migrated: bool) -> str:
    name = f"t_{secrets.token_hex(8)}"
    admin.create_database(server.url(), name, template=_template(server) if migrated else None)
    return name


@contextmanager
def postgres_database(server: PostgresServer, *, migrated: bool) -> Iterator[str]:
    """The URL of a new database on ``server`` (migrated, or empty), dropped afterwards."""
    name = new_postgres_database(server, migrated=migrated)
    try:
        yield server.url(name)
    finally:
        admin.drop_database(server.url(), name)


@pytest.fixture(params=BACKENDS)
def backend_database(request: pytest.FixtureRequest) -> Iterator[BackendDatabase]:
    """One database of each backend (migrated on PostgreSQL; a hub migrates SQLite itself at start)."""
    if request.param == "sqlite":
        yield BackendDatabase("sqlite")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = new_postgres_database(server, migrated=True)
    yield BackendDatabase("postgresql", server.url(name), [name])
    admin.drop_database(server.url(), name)


@pytest.fixture
def postgres_store(postgres_server: PostgresServer) -> Iterator[PostgresStore]:
    """A store of a new migrated PostgreSQL database, closed and dropped afterwards."""
    with postgres_database(postgres_server, migrated=True) as url:
        made = PostgresStore(url)
        try:
            yield made
        finally:
            made.close()
