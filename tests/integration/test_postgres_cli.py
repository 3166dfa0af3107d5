"""The offline commands on PostgreSQL (scale.md 5): ``db``, ``admin`` and ``audit verify`` take ``database.url`` from
``TALARIA_DATABASE_URL`` or ``--config`` and work on the database a hub uses; ``db downgrade`` is refused while a hub
holds it."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.postgres import admin
from talaria.testing.postgres_server import PostgresServer
from tests.backends import new_postgres_database, raw_sql
from tests.integration.cli_support import HubProcess, clean_env, talaria

PASSWORD = "correct horse battery staple"


@pytest.fixture
def url(postgres_server: PostgresServer) -> Iterator[str]:
    name = new_postgres_database(postgres_server, migrated=False)
    yield postgres_server.url(name)
    admin.drop_database(postgres_server.url(), name)


def test_db_admin_and_audit_commands_work_on_the_database_url(tmp_path: Path, url: str) -> None:
    env = clean_env(TALARIA_DATABASE_URL=url, TALARIA_DATA_DIR=str(tmp_path / "data"))
    upgraded = talaria("db", "upgrade", cwd=tmp_path, env=env)
    assert upgraded.returncode == 0, upgraded.stderr
    total = sum(len(migrations.available("postgresql", name)) for name in migrations.SETS)
    assert upgraded.stdout.splitlines()[-1] == f"{total} migration(s) applied"
    status = talaria("db", "status", cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    sets, (server, *cluster) = lines[: len(migrations.SETS)], lines[len(migrations.SETS) :]
    assert all(line.endswith("(up to date)") for line in sets)
    assert re.fullmatch(r"server: PostgreSQL 1[5-9]\.\d+; no hub is running on it", server), server
    assert cluster == ["role audit_sealer: free", "role maintenance: free", "role runner_watchdog: free",
                       "audit: 0 event(s) not yet sealed"]  # fmt: skip
    created = talaria("admin", "create-user", "--username", "olga", "--role", "admin", cwd=tmp_path,
                      stdin=PASSWORD + "\n", env=env)  # fmt: skip
    assert created.returncode == 0, created.stderr
    rows = raw_sql(Settings(database_url=url), "SELECT username, role FROM account")
    assert rows == [{"username": "olga", "role": "admin"}]
    verified = talaria("audit", "verify", cwd=tmp_path, env=env)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("audit chain OK: ")
    assert not (tmp_path / "data" / "talaria.sqlite3").exists()


def test_the_config_file_names_the_database_too(tmp_path: Path, url: str) -> None:
    config = tmp_path / "talaria.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[database]\nurl = "{url}"\n')
    done = talaria("db", "upgrade", "--config", str(config), cwd=tmp_path, env=clean_env())
    assert done.returncode == 0, done.stderr
    assert raw_sql(Settings(database_url=url), "SELECT count(*) AS n FROM schema_version") == [{"n": 3}]


def test_downgrade_is_refused_while_a_hub_uses_the_database(tmp_path: Path, url: str) -> None:
    env = clean_env(TALARIA_DATABASE_URL=url, TALARIA_DATA_DIR=str(tmp_path / "data"))
    hub = HubProcess(tmp_path, ["--port", "0"], env)
    try:
        hub.ready()
        status = talaria("db", "status", cwd=tmp_path, env=env)
        lines = status.stdout.splitlines()
        assert any(line.endswith("; 1 hub replica(s) running on it") for line in lines), lines
        (replica,) = [line for line in lines if line.startswith("replica ")]
        assert re.fullmatch(r"replica (rep_\w{26}): release \S+, settings [0-9a-f]{16}", replica), replica
        holder = replica.split()[1].rstrip(":")
        assert f"role audit_sealer: {holder}" in lines and f"role runner_watchdog: {holder}" in lines
        refused = talaria("db", "downgrade", "--set", "team", "--to", "0", "--yes", cwd=tmp_path, env=env)
        assert refused.returncode == 1
        assert refused.stderr.strip() == "talaria db downgrade: a hub uses this database; stop every replica first"
        assert hub.stop(signal.SIGTERM)[0] == 0
    finally:
        hub.close()
    after = talaria("db", "status", cwd=tmp_path, env=env).stdout.splitlines()
    assert not any(line.startswith("replica ") for line in after)  # a stopped replica leaves and lets go of its roles
    assert "role audit_sealer: free" in after
    done = talaria("db", "downgrade", "--set", "team", "--to", "0", "--yes", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "team is now at version 0"
