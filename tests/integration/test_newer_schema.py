"""A database a newer release upgraded (scale.md 2.5), on both backends, with real ``talaria`` processes: a newer step
that is not additive stops the hub with one line before it listens; an additive one lets it run and says so."""

from __future__ import annotations

import signal
from pathlib import Path

from talaria.settings import Settings
from talaria.store import migrations
from tests.backends import BackendDatabase, raw_sql
from tests.integration.cli_support import HubProcess, clean_env, talaria


def environment(tmp_path: Path, database: BackendDatabase) -> dict[str, str]:
    extra = {"TALARIA_DATABASE_URL": database.url} if database.url else {}
    return clean_env(TALARIA_DATA_DIR=str(tmp_path / "data"), **extra)


def upgraded_by_a_newer_release(tmp_path: Path, database: BackendDatabase, *, additive: bool) -> None:
    env = environment(tmp_path, database)
    done = talaria("db", "upgrade", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    settings = Settings(data_dir=tmp_path / "data", **database.settings())
    version = len(migrations.available("sqlite", "team")) + 1
    raw_sql(settings, "UPDATE schema_version SET version = ? WHERE migration_set = 'team'", version)
    raw_sql(settings, "INSERT INTO schema_step (migration_set, version, additive) VALUES ('team', ?, ?)",
            version, int(additive))  # fmt: skip


def test_a_newer_step_that_is_not_additive_stops_the_hub(tmp_path: Path, backend_database: BackendDatabase) -> None:
    upgraded_by_a_newer_release(tmp_path, backend_database, additive=False)
    done = talaria("hub", "--port", "0", cwd=tmp_path, env=environment(tmp_path, backend_database))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["talaria hub: a newer release changed the schema; upgrade this replica"]
    assert "listening" not in done.stdout
    status = talaria("db", "status", cwd=tmp_path, env=environment(tmp_path, backend_database))
    assert "team: version" in status.stdout and "(newer than this release)" in status.stdout
    assert not any(line.startswith("replica ") for line in status.stdout.splitlines())  # a refused hub never joined


def test_a_newer_additive_step_lets_the_hub_run(tmp_path: Path, backend_database: BackendDatabase) -> None:
    upgraded_by_a_newer_release(tmp_path, backend_database, additive=True)
    hub = HubProcess(tmp_path, ["--port", "0"], environment(tmp_path, backend_database))
    try:
        hub.ready()
        assert hub.stop(signal.SIGTERM)[0] == 0
        assert '"database_newer_than_release"' in hub.stderr()
    finally:
        hub.close()


def test_a_running_hub_is_unready_once_a_newer_release_changes_the_schema_in_a_way_it_cannot_use(
    tmp_path: Path, backend_database: BackendDatabase
) -> None:
    """Operations.md 5.4: ``/readyz`` answers 200 for this release's schema or a newer additive one, else 503."""
    import httpx

    upgraded_by_a_newer_release(tmp_path, backend_database, additive=True)
    hub = HubProcess(tmp_path, ["--port", "0"], environment(tmp_path, backend_database))
    try:
        url = hub.ready()[1]
        assert httpx.get(f"{url}/readyz", timeout=10).json() == {"ok": True}
        settings = Settings(data_dir=tmp_path / "data", **backend_database.settings())
        version = len(migrations.available("sqlite", "team")) + 2
        raw_sql(settings, "UPDATE schema_version SET version = ? WHERE migration_set = 'team'", version)
        raw_sql(settings, "INSERT INTO schema_step (migration_set, version, additive) VALUES ('team', ?, 0)", version)
        answer = httpx.get(f"{url}/readyz", timeout=10)
        assert (answer.status_code, answer.json()["code"]) == (503, "store_unavailable"), answer.text
        assert "newer release" in answer.json()["error"]
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    finally:
        hub.close()
