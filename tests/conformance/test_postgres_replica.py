"""A hub as one replica on PostgreSQL (scale.md 1, 3.6; ADR 0044): its row, role leases taken by conditional update
and taken over once expired, a holder that stops acting before anyone may take its role, /readyz's reasons, and the
clock compared with the database server's. Driven with manual clocks and explicit rounds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from talaria.clock import ManualClock, SystemClock
from talaria.errors import TalariaError
from talaria.hub.replica import ROLES, Replica
from talaria.settings import Settings
from talaria.store.open import open_sqlite
from talaria.store.postgres.store import PostgresStore
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database, raw_sql

ACTIVITY = (
    "SELECT application_name FROM pg_stat_activity"
    " WHERE datname = current_database() AND backend_type = 'client backend'"
)


@pytest.fixture
def stores(postgres_server: PostgresServer) -> Iterator[list[PostgresStore]]:
    with postgres_database(postgres_server, migrated=True) as url:
        made = [PostgresStore(url), PostgresStore(url)]
        yield made
        for store in made:
            store.close()


def roles(store: PostgresStore) -> dict[str, tuple[str | None, int]]:
    with store.read() as tx:
        return {r["role"]: (r["holder"], int(r["counter"])) for r in tx.all("hub_role_lease_list")}


def live(store: PostgresStore, now: int) -> list[str]:
    with store.read() as tx:
        return [r["id"] for r in tx.all("hub_replica_live", since=now - 20_000)]


def test_roles_go_to_one_replica_and_pass_on_only_after_its_lease_expired(stores: list[PostgresStore]) -> None:
    clock = ManualClock(SystemClock().now_ms())  # near the server's clock: join compares them
    a = Replica(stores[0], Settings(), clock=clock)
    b = Replica(stores[1], Settings(), clock=clock)
    a.join()
    b.join()
    assert sorted(live(stores[0], clock.now_ms())) == sorted([a.id, b.id])
    assert all(a.holds(role) and not b.holds(role) for role in ROLES)
    assert roles(stores[0]) == {role: (a.id, 1) for role in ROLES}
    clock.advance(5)
    a.tick()
    b.tick()  # a renewed: nothing to take
    assert roles(stores[0]) == {role: (a.id, 1) for role in ROLES}
    clock.advance(10)  # a silent for 10 s: it stops acting before its lease (15 s) lets anyone else in
    assert not a.holds("audit_sealer")
    b.tick()
    assert not b.holds("audit_sealer")  # still a's until it expires
    clock.advance(5)
    assert a.unready() is not None and a.unready().code == "store_unavailable"  # type: ignore[union-attr]
    b.tick()
    assert all(b.holds(role) for role in ROLES)
    assert roles(stores[0]) == {role: (b.id, 2) for role in ROLES}  # each take counts
    clock.advance(10)
    assert a.id not in live(stores[0], clock.now_ms())  # 20 s after its last renewal a is not live
    b.stop()
    assert roles(stores[0]) == {role: (None, 2) for role in ROLES}
    assert live(stores[0], clock.now_ms()) == []


def test_a_clock_far_from_the_servers_refuses_the_start_and_later_makes_the_replica_unready(
    stores: list[PostgresStore],
) -> None:
    settings = Settings(database_max_clock_skew_ms=2000)
    off = Replica(stores[0], settings, clock=ManualClock(SystemClock().now_ms() + 60_000))
    with pytest.raises(TalariaError, match=r"clock differs from the database server's by \d+ ms"):
        off.join()
    assert live(stores[0], SystemClock().now_ms()) == []
    clock = ManualClock(SystemClock().now_ms())
    drifting = Replica(stores[0], settings, clock=clock, clock_check_s=60)
    drifting.join()
    assert drifting.unready() is None and drifting.holds("maintenance")
    clock.advance(90)  # by this clock 90 s passed, by the server's a moment: the two are 90 s apart
    drifting.tick()
    problem = drifting.unready()
    assert problem is not None and problem.code == "clock_skew"
    assert not drifting.holds("maintenance")  # no role leases while the clock strays


def test_a_sqlite_hub_holds_every_role_and_keeps_no_row(tmp_path: Path) -> None:
    store = open_sqlite(tmp_path / "data")
    try:
        replica = Replica(store, Settings(data_dir=tmp_path / "data"))
        replica.join()
        replica.start()
        assert all(replica.holds(role) for role in ROLES) and replica.unready() is None
        replica.stop()
    finally:
        store.close()


def test_readyz_answers_503_with_the_replicas_reason(postgres_server: PostgresServer, tmp_path: Path) -> None:
    with postgres_database(postgres_server, migrated=True) as url:
        readyz_answers_the_replicas_reason(HubServer(tmp_path / "data", ManualClock(), database_url=url).start())


def readyz_answers_the_replicas_reason(server: HubServer) -> None:
    try:
        assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200
        clock = ManualClock(SystemClock().now_ms())
        stray = Replica(server.hub.store, server.hub.settings, clock=clock, clock_check_s=1)
        stray.join()
        own, server.hub.replica = server.hub.replica, stray
        clock.advance(90)
        stray.tick()  # its clock now strays 90 s from the server's
        answer = httpx.get(f"{server.url}/readyz", timeout=10)
        assert (answer.status_code, answer.json()["code"]) == (503, "clock_skew")
        stray.stop()
        server.hub.replica = own
    finally:
        server.stop()


def test_a_replicas_connections_are_named_talaria_slash_its_id(postgres_server: PostgresServer, tmp_path: Path) -> None:
    """application_name = talaria/<replica id> (scale.md 2.2): an operator sees in pg_stat_activity whose they are."""
    with postgres_database(postgres_server, migrated=True) as url:
        server = HubServer(tmp_path / "data", ManualClock(), database_url=url).start()
        try:
            replica_id = server.hub.replica.id
            assert replica_id.startswith("rep_")
            wanted = {f"talaria/{replica_id}", f"talaria/{replica_id}/listen"}  # the pool's, the listener's
            deadline = time.monotonic() + 10
            while not wanted <= (names := {r["application_name"] for r in raw_sql(server.hub.settings, ACTIVITY)}):
                assert time.monotonic() < deadline, names  # the listen connection is made on its own thread
                time.sleep(0.02)
        finally:
            server.stop()
