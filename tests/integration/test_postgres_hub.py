"""``talaria hub`` on PostgreSQL as a real process (scale.md 2.1, 6.2; ADR 0041, 0053): it migrates and serves, and
a second hub on the same database joins it as a replica; a wrong, unreachable or driverless ``database.url`` stops
it before it binds with one line, and the URL's password is in no output."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from talaria.settings import Settings
from talaria.store.postgres import admin
from talaria.testing.postgres_server import PostgresServer
from tests.backends import new_postgres_database, raw_sql
from tests.integration.cli_support import HubProcess, clean_env, talaria

PASSWORD = "pw-" + "9f3c1e7a5b"  # trust auth on the socket ignores it; it must still never be printed


@pytest.fixture
def database(postgres_server: PostgresServer) -> Iterator[str]:
    """A new empty database; its URL carries a password."""
    name = new_postgres_database(postgres_server, migrated=False)
    url = postgres_server.url(name).replace("postgres@", f"postgres:{PASSWORD}@", 1)
    yield url
    admin.drop_database(postgres_server.url(), name)


def hub_env(tmp_path: Path, url: str) -> dict[str, str]:
    return clean_env(TALARIA_DATABASE_URL=url, TALARIA_DATA_DIR=str(tmp_path / "data"))


def test_a_hub_migrates_serves_and_a_second_hub_joins_it_as_a_replica(tmp_path: Path, database: str) -> None:
    hub = HubProcess(tmp_path, ["--port", "0"], hub_env(tmp_path, database))
    (tmp_path / "second").mkdir()
    second = HubProcess(tmp_path / "second", ["--port", "0"], hub_env(tmp_path / "second", database))
    try:
        line, url = hub.ready()
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        second_line, second_url = second.ready()
        assert httpx.get(f"{second_url}/readyz", timeout=10).status_code == 200
        replicas = raw_sql(Settings(database_url=database), "SELECT id FROM hub_replica")
        assert len(replicas) == 2, "each replica has its own row (scale.md 1)"
        assert second.stop(signal.SIGTERM)[0] == 0
        code, _ = hub.stop(signal.SIGTERM)
        assert code == 0
        output = hub.stderr() + line + second.stderr() + second_line
    finally:
        second.close()
        hub.close()
    assert PASSWORD not in output
    assert '"migrations_applied"' in output
    assert not (tmp_path / "data" / "talaria.sqlite3").exists()  # nothing went to SQLite
    versions = raw_sql(Settings(database_url=database), "SELECT migration_set, version FROM schema_version")
    assert {row["migration_set"] for row in versions} == {"core", "lifecycle", "team"}
    # a stopped replica left: one started again joins alone
    again = HubProcess(tmp_path, ["--port", "0"], hub_env(tmp_path, database))
    try:
        again.ready()
        assert len(raw_sql(Settings(database_url=database), "SELECT id FROM hub_replica")) == 1
        assert again.stop(signal.SIGTERM)[0] == 0
    finally:
        again.close()


def test_an_unreachable_server_stops_the_hub_before_it_binds(tmp_path: Path) -> None:
    """The port is held by the test: a hub that bound before checking the database would say so instead."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]  # nothing listens there once this closes
        url = f"postgresql://talaria:{PASSWORD}@127.0.0.1:{closed_port}/talaria"
        done = talaria("hub", "--port", str(port), cwd=tmp_path, env=hub_env(tmp_path, url))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"talaria hub: cannot connect to the PostgreSQL database at postgresql://talaria@127.0.0.1:{closed_port}/talaria"
    ), lines
    assert PASSWORD not in done.stdout + done.stderr
    assert not (tmp_path / "data").exists()


def test_a_missing_driver_is_one_line(tmp_path: Path, database: str) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "psycopg.py").write_text("raise ImportError('psycopg is not installed (simulated)')\n")
    env = hub_env(tmp_path, database) | {"PYTHONPATH": str(shadow)}
    done = talaria("hub", "--port", "0", cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "talaria hub: database.url names PostgreSQL but its driver is missing: pip install 'talaria[postgresql]'"
    ]


def test_another_scheme_is_a_settings_error(tmp_path: Path) -> None:
    done = talaria("hub", "--port", "0", cwd=tmp_path, env=hub_env(tmp_path, f"mysql://root:{PASSWORD}@db/t"))
    assert done.returncode == 1
    assert "database.url must be empty (SQLite) or a postgresql:// URL" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr
