"""Server-level operations on PostgreSQL outside the store's pool: the start-up check of ``database.url``, the
one-hub lock of this release, and creating or dropping a database (tests, ``db copy``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from talaria.errors import StoreUnavailable
from talaria.store.postgres.store import check_version, connect

# pg_advisory_lock key of "one hub per database" (ADR 0041): the bytes of "talaria1" as a bigint
SINGLE_HUB_KEY = int.from_bytes(b"talaria1", "big", signed=True)


def check_server(url: str) -> int:
    """The server's version number (``server_version_num``); ``StoreUnavailable`` with one line when it cannot be
    reached or is older than PostgreSQL 15."""
    with connect(url) as conn:
        version = conn.info.server_version
    check_version(url, version)
    return version


@dataclass
class SingleHubLock:
    """A session advisory lock on a dedicated connection, held while the hub runs."""

    conn: psycopg.Connection[Any]

    def release(self) -> None:
        """Unlock first: a closed session's locks go only when its server process has exited, which a hub
        restarted at once could otherwise race."""
        with contextlib.suppress(psycopg.Error):  # the lock ends with the session either way
            self.conn.execute("SELECT pg_advisory_unlock(%s)", (SINGLE_HUB_KEY,))
        with contextlib.suppress(psycopg.Error):
            self.conn.close()


def single_hub_lock(url: str) -> SingleHubLock:
    """Hold "one hub per database": ``StoreUnavailable`` naming the refusal when another hub holds it."""
    conn = connect(url, application_name="talaria/hub-lock")
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (SINGLE_HUB_KEY,)).fetchone()
    if not row or not row[0]:
        conn.close()
        raise StoreUnavailable("another hub uses this database (several hub replicas are not supported yet)")
    return SingleHubLock(conn)


def hub_running(url: str) -> bool:
    """Whether a hub holds the one-hub lock of this database now."""
    with connect(url, application_name="talaria/cli") as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (SINGLE_HUB_KEY,)).fetchone()
        taken = bool(row and row[0])
        if taken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (SINGLE_HUB_KEY,))
    return not taken


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
