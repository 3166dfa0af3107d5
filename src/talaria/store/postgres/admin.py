"""Server-level operations on PostgreSQL outside the store's pool: the start-up check of ``database.url`` and
creating or dropping a database (tests, ``db copy``). Replicas share a database freely (scale.md 1; ADR 0053)."""

from __future__ import annotations

from psycopg import sql

from talaria.store.postgres.store import check_version, connect


def check_server(url: str) -> int:
    """The server's version number (``server_version_num``); ``StoreUnavailable`` with one line when it cannot be
    reached or is older than PostgreSQL 15."""
    with connect(url) as conn:
        version = conn.info.server_version
    check_version(url, version)
    return version


def create_database(url: str, name: str, *, template: str | None = None) -> None:
    """``CREATE DATABASE name [TEMPLATE template]`` through ``url`` (a maintenance database)."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    with connect(url) as conn:
        conn.execute(statement)


def drop_database(url: str, name: str) -> None:
    with connect(url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
