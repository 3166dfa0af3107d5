"""The hubs of a test that must hold on both backends (scale.md 2.6, 4): one SQLite hub, or two PostgreSQL replicas
of one database, with the world made on the ``front`` one and the requests sent to the ``back`` one (or to both), and
a snapshot of either backend's tables for "a refused request changes nothing"."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from talaria.clock import SystemClock
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database
from tests.integration.route_matrix_support import MOVING, snapshot

# What replicas write on their own clocks: their liveness rows and the role leases.
REPLICAS_MOVING = ("hub_replica", "hub_role_lease")
SEALED_WITHIN_S = 10.0  # the sealer runs every 200 ms


def state(server: HubServer) -> dict[str, list[tuple[Any, ...]]]:
    """A snapshot of the hub's database, whichever backend it is on (PostgreSQL rows in a stable order)."""
    url = server.settings.database_url
    if not url:
        return snapshot(server.settings.data_dir)
    with psycopg.connect(url, autocommit=True) as conn:
        # audited writes wait in audit_pending until a replica's sealer chains them: a snapshot taken before they
        # are sealed would see the chain move later, a write of no request's
        deadline = time.monotonic() + SEALED_WITHIN_S
        while (pending := conn.execute("SELECT count(*) FROM audit_pending").fetchone()) and pending[0]:
            assert time.monotonic() < deadline, f"{pending[0]} audit events still unsealed after {SEALED_WITHIN_S} s"
            time.sleep(0.05)
        tables = [row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        assert "account" in tables and "audit_event" in tables, tables
        return {table: sorted(conn.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr)
                for table in tables if table not in MOVING + REPLICAS_MOVING}  # fmt: skip


@dataclass
class FrontBack:
    """Where a test's world is made (``front``) and where its requests go (``back``, or both): the same SQLite hub,
    or two PostgreSQL replicas of one database, so that what one replica made or changed (a session, a disabled
    account, a password change, a removed runner, an epoch, a live turn) the other knows by the database alone."""

    front: HubServer
    back: HubServer

    def state(self) -> dict[str, list[tuple[Any, ...]]]:
        return state(self.back)

    def moved(self, client: httpx.Client) -> httpx.Client:
        """A client of the back hub with ``client``'s session and CSRF token (and the back hub's own Origin)."""
        headers = {name: value for name, value in client.headers.items() if name.lower() != "origin"}
        made = self.back.client(headers={**headers, "Origin": self.back.url})
        made.cookies.update(client.cookies)
        return made


@contextmanager
def front_and_back(request: pytest.FixtureRequest, directory: Path, **settings: Any) -> Iterator[FrontBack]:
    """The hubs of ``request.param`` (``sqlite`` or ``postgresql``) with ``settings``, stopped afterwards."""
    with ExitStack() as stack:
        if request.param == "sqlite":
            server = HubServer(directory / "data", SystemClock(), **settings).start()
            stack.callback(server.stop)
            yield FrontBack(server, server)
            return
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        url = stack.enter_context(postgres_database(postgres, migrated=True))
        front = HubServer(directory / "a", SystemClock(), database_url=url, **settings).start()
        stack.callback(front.stop)
        back = HubServer(directory / "b", SystemClock(), database_url=url, **settings).start()
        stack.callback(back.stop)
        yield FrontBack(front, back)
