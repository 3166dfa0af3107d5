"""``talaria db copy --to postgresql://…`` (scale.md 5, acceptance scenario 14): a stopped SQLite hub with 100
finished and 5 unfinished jobs moves to PostgreSQL with equal row counts and chain head; the same password and the
same web session work on a hub started on the copy; an unfinished job continues there. Refused (exit 1, the target
untouched) while the hub runs, into a non-empty target, and from a broken chain."""

from __future__ import annotations

import re
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from talaria.clock import SystemClock
from talaria.lifecycle import audit
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.open import open_sqlite
from talaria.store.postgres import bulk as pg_copy
from talaria.store.postgres.store import PostgresStore
from talaria.testing.lifecycles import ADMIN as BOB
from talaria.testing.lifecycles import TENANT, WORKER, WORKER_INSTANCE, idem, lifecycle, prepare_tasks
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database, raw_sql
from tests.integration.cli_support import HubProcess, clean_env, talaria

PASSWORD = "a long enough password"


@pytest.fixture
def target(postgres_server: PostgresServer) -> Iterator[str]:
    with postgres_database(postgres_server, migrated=False) as made:
        yield made


def sqlite_hub_with_jobs(data: Path, finished: int, unfinished: int) -> list[str]:
    """A data directory as a stopped hub leaves it; returns the ids of the unfinished (QUEUED) jobs."""
    store = open_sqlite(data)
    try:
        migrations.upgrade(store)
        clock = SystemClock()
        engine = Engine(store, clock, Settings(data_dir=data))
        with store.write() as tx:
            tx.run("tenant_ensure", name=TENANT, now=clock.now_ms())
        for task_id in prepare_tasks(engine, finished):
            lifecycle(engine, task_id)
        return [engine.dispatch(BOB, tenant=TENANT, task_id=t)[2].id for t in prepare_tasks(engine, unfinished)]
    finally:
        store.close()


def login(url: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=10)
    answer = client.post("/api/auth/login", json={"username": "olga", "password": PASSWORD})
    assert answer.status_code == 200, answer.text
    return client


def test_a_stopped_sqlite_hub_moves_to_postgresql_and_carries_on(tmp_path: Path, target: str) -> None:
    data = tmp_path / "data"
    unfinished = sqlite_hub_with_jobs(data, 100, 5)
    env = clean_env(TALARIA_DATA_DIR=str(data))
    created = talaria("admin", "create-user", "--username", "olga", "--role", "admin", cwd=tmp_path,
                      stdin=PASSWORD + "\n", env=env)  # fmt: skip
    assert created.returncode == 0, created.stderr
    source_line = talaria("audit", "verify", cwd=tmp_path, env=env).stdout.strip()

    hub = HubProcess(tmp_path, ["--port", "0"], env)
    try:
        _, url = hub.ready()
        session = login(url)
        cookies = dict(session.cookies)
        session.close()
        running = talaria("db", "copy", "--to", target, cwd=tmp_path, env=env)
        assert (running.returncode, running.stderr.strip()) == (1, "talaria db copy: the hub is running; stop it first")
        assert pg_copy.tables(target) == []  # untouched
        assert hub.stop(signal.SIGTERM)[0] == 0
    finally:
        hub.close()

    copied = talaria("db", "copy", "--to", target, cwd=tmp_path, env=env, timeout=120)
    assert copied.returncode == 0, copied.stderr
    lines = copied.stdout.splitlines()
    counts = {m.group(1): m.group(2) for line in lines if (m := re.fullmatch(r"(\w+) (\d+) rows", line))}
    assert int(counts["hermes_job"]) == 105 and int(counts["account"]) == 1 and int(counts["web_session"]) >= 1
    assert lines[-2] == source_line  # the same events and head (no event is written by a copy)
    assert lines[-1].startswith("next: set database.url")
    settings = Settings(database_url=target)
    for table, n in counts.items():
        assert raw_sql(settings, f"SELECT count(*) AS n FROM {table}")[0]["n"] == int(n), table
    keys = {row["name"]: bytes(row["value"]) for row in raw_sql(settings, "SELECT name, value FROM hub_secret")}
    assert keys == {"secret.key": (data / "secret.key").read_bytes(), "audit.key": (data / "audit.key").read_bytes()}

    # a hub on the copy, with a data directory of its own: the same password and the same session work
    elsewhere = clean_env(TALARIA_DATA_DIR=str(tmp_path / "pg-data"), TALARIA_DATABASE_URL=target)
    hub = HubProcess(tmp_path, ["--port", "0"], elsewhere)
    try:
        _, url = hub.ready()
        with httpx.Client(base_url=url, timeout=10, cookies=cookies) as again:
            me = again.get("/api/auth/me")
        assert me.status_code == 200 and me.json()["username"] == "olga"
        login(url).close()
        assert hub.stop(signal.SIGTERM)[0] == 0
    finally:
        hub.close()

    # an unfinished job continues on PostgreSQL
    store = PostgresStore(target)
    try:
        engine = Engine(store, SystemClock(), Settings(data_dir=tmp_path / "pg-data", database_url=target))
        found = engine.job(TENANT, unfinished[0])
        assert found is not None
        job = found[0].job
        assert job.state == "QUEUED"
        dispatch = engine.job_dispatch(job)
        assert dispatch is not None
        binding = dispatch.binding(WORKER.principal)
        claimed = engine.claim(WORKER, job_id=job.id, binding=binding, worker_instance=WORKER_INSTANCE,
                               idem=idem(f"copy:{job.id}", {"n": 1}))  # fmt: skip
        assert claimed.answer.state == "LEASED"
        report = audit.verify(store)
        assert report.ok and report.events == int(source_line.split()[3]) + 1
    finally:
        store.close()

    # into a target that is no longer empty: refused, nothing changed
    before = raw_sql(settings, "SELECT count(*) AS n FROM audit_event")
    twice = talaria("db", "copy", "--to", target, cwd=tmp_path, env=env)
    assert (twice.returncode, twice.stderr.strip()) == (1, "talaria db copy: the target database is not empty")
    assert raw_sql(settings, "SELECT count(*) AS n FROM audit_event") == before


def test_a_broken_source_chain_is_refused_and_the_target_stays_empty(tmp_path: Path, target: str) -> None:
    data = tmp_path / "data"
    sqlite_hub_with_jobs(data, 3, 0)
    conn = sqlite3.connect(data / "talaria.sqlite3", isolation_level=None)
    try:
        conn.execute("DROP TRIGGER audit_event_no_update")
        conn.execute("UPDATE audit_event SET type = 'task.tampered' WHERE seq = 4")
    finally:
        conn.close()
    refused = talaria("db", "copy", "--to", target, cwd=tmp_path, env=clean_env(TALARIA_DATA_DIR=str(data)))
    assert refused.returncode == 1
    assert refused.stderr.strip() == "talaria db copy: the source audit chain BROKEN at seq 4: hash_mismatch"
    assert pg_copy.tables(target) == []


def test_copy_needs_a_postgresql_target(tmp_path: Path) -> None:
    done = talaria("db", "copy", "--to", "mysql://x/y", cwd=tmp_path, env=clean_env(TALARIA_DATA_DIR=str(tmp_path)))
    assert (done.returncode, done.stderr.strip()) == (1, "talaria db copy: --to names the target: postgresql://...")
