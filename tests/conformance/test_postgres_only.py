"""What only the PostgreSQL backend has (scale.md 2.3, 2.5; ADR 0041), on the worker's PostgreSQL 15: the migration
lock, append-only audit triggers that also refuse TRUNCATE, byte-ordered text whatever the database's locale, and the
hub keys as rows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from talaria.store import migrations
from talaria.store.hub_keys import hub_key
from talaria.store.postgres import admin
from talaria.store.postgres.store import PostgresStore
from talaria.testing.postgres_server import PostgresServer
from tests.backends import new_postgres_database, postgres_database

NOW = 1_784_628_000_000


@pytest.fixture
def url(postgres_server: PostgresServer) -> Iterator[str]:
    name = new_postgres_database(postgres_server, migrated=False)
    yield postgres_server.url(name)
    admin.drop_database(postgres_server.url(), name)


def test_two_upgrades_at_once_apply_each_step_once(url: str) -> None:
    """Scale.md 6.15: processes upgrading one database together apply every step once between them."""
    stores = [PostgresStore(url), PostgresStore(url)]
    applied: list[list[str]] = [[], []]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def upgrade(index: int) -> None:
        barrier.wait()
        try:
            applied[index] = migrations.upgrade(stores[index])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=upgrade, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        total = sum(len(migrations.available("postgresql", name)) for name in migrations.SETS)
        assert errors == []
        assert sorted(len(a) for a in applied) == [0, total]
    finally:
        for store in stores:
            store.close()


def test_the_audit_table_refuses_update_delete_and_truncate(url: str) -> None:
    store = PostgresStore(url)
    try:
        migrations.upgrade(store)
    finally:
        store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenant (name, created_at) VALUES ('default', %s)", (NOW,))
        conn.execute(
            "INSERT INTO audit_event (seq, event_id, occurred_at, type, tenant, body, prev_hash, hash)"
            " VALUES (1, 'evt_1', %s, 'task.created', 'default', '{}', %s, %s)",
            (NOW, "0" * 64, "1" * 64),
        )
        for statement in ("UPDATE audit_event SET type = 'x'", "DELETE FROM audit_event",
                          "TRUNCATE audit_event, execution_evidence, team_evidence"):  # fmt: skip
            with pytest.raises(psycopg.errors.IntegrityError, match="append-only"):
                conn.execute(statement)
        assert conn.execute("SELECT count(*) FROM audit_event").fetchone() == (1,)


def test_text_orders_by_bytes_in_a_database_of_another_locale(postgres_server: PostgresServer) -> None:
    """Keyset cursors and name orderings equal SQLite's even where the database collates by a language."""
    name = "t_locale_en"
    admin.drop_database(postgres_server.url(), name)
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'")
    store = PostgresStore(postgres_server.url(name))
    try:
        migrations.upgrade(store)
        ids = ["ten_B", "ten_a", "ten_Z", "ten__z", "ten_é"]
        with store.write() as tx:
            for tenant in ids:
                tx.run("tenant_ensure", name=tenant, now=NOW)
        with psycopg.connect(postgres_server.url(name)) as conn:
            rows = conn.execute("SELECT name FROM tenant ORDER BY name").fetchall()
        assert [r[0] for r in rows] == sorted(ids)  # Python's str order: code points, as SQLite's BINARY
    finally:
        store.close()
        admin.drop_database(postgres_server.url(), name)


def test_the_hub_keys_are_rows_made_once_and_a_kept_file_carries_over(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Scale.md 1: replicas share ``hub_secret`` rows; the first one's key wins, and a hub that kept ``audit.key``
    in its data directory before the rows existed brings those bytes."""
    with postgres_database(postgres_server, migrated=True) as url:
        stores = [PostgresStore(url), PostgresStore(url)]
        keys_are_made_once(stores, tmp_path)


def keys_are_made_once(stores: list[PostgresStore], tmp_path: Path) -> None:
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        kept = b"k" * 32
        (tmp_path / "a" / "audit.key").write_bytes(kept)
        assert hub_key(stores[0], tmp_path / "a", "audit.key", NOW) == kept
        assert hub_key(stores[1], tmp_path / "b", "audit.key", NOW) == kept  # the row, not a new key
        made = hub_key(stores[1], tmp_path / "b", "secret.key", NOW)
        assert len(made) == 32 and hub_key(stores[0], tmp_path / "a", "secret.key", NOW) == made
        assert not (tmp_path / "b" / "secret.key").exists()  # nothing written to the data directory
    finally:
        for store in stores:
            store.close()
