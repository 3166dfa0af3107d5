"""A PostgreSQL hub restored with PostgreSQL's own tools (operations.md 7.3): ``pg_dump --format=custom`` of a hub's
database, ``pg_restore`` into a new one, ``talaria db mark-restored --yes``, then a ``talaria hub`` process on it.
The mark is refused while a replica is live and without ``--yes``; it seals the pending audit rows whatever the
horizon (a logical copy carries the old server's transaction ids); the start ends the web sessions and cancels the
unfinished jobs (operations.md 7.2); ``db restore`` itself refuses on PostgreSQL."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.clock import SystemClock
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store.postgres import admin
from talaria.store.postgres.store import PostgresStore
from talaria.testing.lifecycles import ADMIN, TENANT, prepare_tasks
from talaria.testing.postgres_server import PostgresServer
from tests.backends import new_postgres_database, raw_sql
from tests.hermes.site_support import PASSWORD, sign_in
from tests.integration.cli_support import HubProcess, clean_env, talaria
from tests.integration.runner_support import wait_until


@pytest.fixture
def databases(postgres_server: PostgresServer) -> Iterator[tuple[str, str]]:
    """A migrated database a hub uses, and an empty one to restore it into."""
    source = new_postgres_database(postgres_server, migrated=True)
    target = new_postgres_database(postgres_server, migrated=False)
    yield postgres_server.url(source), postgres_server.url(target)
    for name in (source, target):
        admin.drop_database(postgres_server.url(), name)


def queued_jobs(url: str, count: int) -> list[str]:
    """``count`` approved tasks dispatched in process (their audit rows left pending: no sealer runs here)."""
    store = PostgresStore(url)
    try:
        engine = Engine(store, SystemClock(), Settings(database_url=url))
        return [engine.dispatch(ADMIN, tenant=TENANT, task_id=task)[2].id for task in prepare_tasks(engine, count)]
    finally:
        store.close()


def test_a_database_restored_with_pg_restore_is_marked_and_its_first_start_ends_unfinished_work(
    tmp_path: Path, databases: tuple[str, str], postgres_server: PostgresServer
) -> None:  # fmt: skip
    source, target = databases
    env = clean_env(TALARIA_DATABASE_URL=source, TALARIA_DATA_DIR=str(tmp_path / "data"))
    made = talaria("admin", "create-user", "--username", "root", "--role", "admin", cwd=tmp_path, env=env,
                   stdin=PASSWORD + "\n")  # fmt: skip
    assert made.returncode == 0, made.stderr
    refused = talaria("db", "restore", "--from", str(tmp_path / "any"), "--yes", cwd=tmp_path, env=env)
    assert refused.returncode == 1 and "talaria db mark-restored --yes" in refused.stderr, refused.stderr
    hub = HubProcess(tmp_path, ["--port", "0"], env)
    try:
        _, url = hub.ready()
        root = sign_in(url, "root")
        live = talaria("db", "mark-restored", "--yes", cwd=tmp_path, env=env)
        assert (live.returncode, live.stderr.strip()) == (1, "talaria db mark-restored: a hub replica uses this "
                                                          "database; stop every replica first; the database was not "
                                                          "marked")  # fmt: skip
        assert hub.stop(signal.SIGTERM)[0] == 0
    finally:
        hub.close()
    jobs = queued_jobs(source, 2)
    dump = tmp_path / "hub.pgdump"
    bindir = postgres_server.bindir
    subprocess.run([str(bindir / "pg_dump"), "--format=custom", f"--file={dump}", f"--dbname={source}"], check=True)
    restored = Settings(database_url=target)
    target_env = clean_env(TALARIA_DATABASE_URL=target, TALARIA_DATA_DIR=str(tmp_path / "data"))
    empty = talaria("db", "mark-restored", "--yes", cwd=tmp_path, env=target_env)
    assert (empty.returncode, empty.stderr.strip()) == (1, "talaria db mark-restored: the database holds no Talaria "
                                                        "schema; the database was not marked")  # fmt: skip
    assert raw_sql(restored, "SELECT to_regclass('schema_version') IS NULL AS untouched") == [{"untouched": True}]
    subprocess.run([str(bindir / "pg_restore"), "--no-owner", f"--dbname={target}", str(dump)], check=True)
    (pending,) = raw_sql(restored, "SELECT COUNT(*) AS n FROM audit_pending")
    assert pending["n"] >= 2, "the in-process dispatches left their audit rows unsealed"
    # as if the dump came from another server: transaction ids far beyond this server's horizon
    raw_sql(restored, "UPDATE audit_pending SET xact = (xact::text::bigint + 1000000000)::text::xid8")

    unconfirmed = talaria("db", "mark-restored", cwd=tmp_path, env=target_env)
    assert unconfirmed.returncode == 1 and "add --yes" in unconfirmed.stderr, unconfirmed.stderr
    marked = talaria("db", "mark-restored", "--yes", cwd=tmp_path, env=target_env)
    assert marked.returncode == 0, marked.stderr
    lines = marked.stdout.splitlines()
    assert f"sealed {pending['n']} pending audit event(s)" in lines, lines
    assert any(line.startswith("audit chain OK: ") for line in lines), lines
    assert ("at its next start the hub ends every web session; gives every runner a new epoch; cancels 2 unfinished "
            "job(s), ends 0 queued or pending chat turn(s) uncertain and stops 0 team goal(s), each with the reason "
            "restored_from_backup") in lines, lines  # fmt: skip
    assert raw_sql(restored, "SELECT COUNT(*) AS n FROM audit_pending") == [{"n": 0}]
    assert raw_sql(restored, "SELECT source, resume_unfinished FROM restore_marker") == [
        {"source": "postgresql", "resume_unfinished": 0}]  # fmt: skip

    hub = HubProcess(tmp_path, ["--port", "0"], target_env)
    try:
        _, url = hub.ready()
        old = root.get(f"{url}/api/auth/me")
        assert old.status_code == 401, "the session ended (the session key came with the dump)"
        root.close()
        root = sign_in(url, "root")
        for job_id in jobs:
            wait_until(lambda job_id=job_id: root.get(f"/api/jobs/{job_id}").json()["job"]["state"] == "CANCELLED",
                       timeout=30, what=f"{job_id} cancelled")  # fmt: skip
        events = root.get("/api/audit", params={"job": jobs[0]}).json()["events"]
        assert any(e["toState"] == "CANCELLED" and e["actor"]["via"] == "recovery" for e in events), events
        assert raw_sql(restored, "SELECT COUNT(*) AS n FROM restore_marker") == [{"n": 0}]
        assert hub.stop(signal.SIGTERM)[0] == 0
    finally:
        root.close()
        hub.close()
    verified = talaria("audit", "verify", cwd=tmp_path, env=target_env)
    assert verified.returncode == 0 and verified.stdout.startswith("audit chain OK: "), verified.stdout
