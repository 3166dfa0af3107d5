"""The first start after a restore (operations.md 7.2) on both backends, through ``hub.restored.apply`` on a real
store and engine with a manual clock: web sessions end, no conversation or goal member resumes its Hermes session, a
QUEUED job is cancelled at once (row 8) and a LEASED one flagged, then cancelled at its expiry (row 12), terminal
jobs stay, and the marker goes last, so a start that failed half-way repeats the steps without doing any twice;
``--resume-unfinished`` leaves the jobs be."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from talaria.clock import ManualClock
from talaria.hub import restored
from talaria.lifecycle import audit
from talaria.lifecycle.engine import Engine
from talaria.lifecycle.records import Job
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.data_dir import prepare
from talaria.store.interface import Store
from talaria.testing.lifecycles import ADMIN, TENANT, WORKER, WORKER_INSTANCE, lifecycle, prepare_tasks
from tests.backends import BackendDatabase, raw_sql

TTL_MS = 30_000


@dataclass
class Restored:
    store: Store
    engine: Engine
    settings: Settings
    clock: ManualClock
    queued: str
    leased: str
    done: str

    def job(self, job_id: str) -> Job:
        found = self.engine.job(TENANT, job_id)
        assert found is not None
        return found[0].job

    def state(self, job_id: str) -> str:
        return str(self.job(job_id).state)

    def cancels(self, job_id: str) -> int:
        """The job's admin-cancel events (the flag or the cancel itself), sealed first on PostgreSQL."""
        audit.seal_all(self.store)
        rows = raw_sql(self.settings, "SELECT COUNT(*) AS n FROM audit_event WHERE job_id = ? AND type LIKE ?",
                       job_id, "%cancel%")  # fmt: skip
        return int(rows[0]["n"])

    def apply(self) -> restored.Applied | None:
        return restored.apply(self.store, self.engine, self.settings, self.clock)


@pytest.fixture
def hub(tmp_path: Path, backend_database: BackendDatabase) -> Iterator[Restored]:
    data = tmp_path / "data"
    prepare(data)
    settings = Settings(data_dir=data, lifecycle_lease_ttl_s=TTL_MS // 1000, **backend_database.settings())
    store = backend_database.open_store(data)
    try:
        migrations.upgrade(store)
        clock = ManualClock(1_800_000_000_000)
        engine = Engine(store, clock, settings)
        with store.write() as tx:
            tx.run("tenant_ensure", name=TENANT, now=clock.now_ms())
        queued, leased, done = prepare_tasks(engine, 3)
        lifecycle(engine, done)
        jobs = [engine.dispatch(ADMIN, tenant=TENANT, task_id=task)[2] for task in (queued, leased)]
        binding = engine.job_dispatch(jobs[1])
        assert binding is not None
        engine.claim(WORKER, job_id=jobs[1].id, binding=binding.binding(WORKER.principal),
                     worker_instance=WORKER_INSTANCE)  # fmt: skip
        finished = raw_sql(settings, "SELECT id FROM hermes_job WHERE state = 'SUCCEEDED'")
        yield Restored(store, engine, settings, clock, jobs[0].id, jobs[1].id, finished[0]["id"])
    finally:
        store.close()


def add_session(hub: Restored) -> None:
    raw_sql(hub.settings, "INSERT INTO account (username, tenant, role, password_hash, created_at, updated_at) "
            "VALUES ('olga', 'default', 'user', 'x', 0, 0)")  # fmt: skip
    raw_sql(hub.settings, "INSERT INTO web_session (id_hash, username, csrf_token, auth_version, created_at, "
            "last_seen_at) VALUES ('h', 'olga', 'c', 1, 0, 0)")  # fmt: skip


def test_no_marker_no_steps(hub: Restored) -> None:
    assert hub.apply() is None
    assert (hub.state(hub.queued), hub.state(hub.leased)) == ("QUEUED", "LEASED")


def test_the_steps_run_once_and_an_interrupted_start_repeats_them(
    hub: Restored, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    add_session(hub)
    postgres = bool(hub.settings.database_url)
    if postgres:  # a runner's operational state (scale.md 3.1), which the restore drops; the runner stays
        for sql in ("INSERT INTO source (tenant, name, created_at) VALUES ('default', 'local', 0)",
                    "INSERT INTO runner (id, tenant, name, source, allowed_profiles, token_hash, enabled, server_url, "
                    "hermes_url, artifact_roots, allow_insecure_lan, created_at) VALUES ('r1', 'default', 'node', "
                    "'local', '[]', 'h', 1, 'http://hub', 'http://hermes', '[]', 0, 0)",
                    "INSERT INTO runner_conn (runner_id, instance, epoch, created_at, seen_at) VALUES ('r1', 'i', "
                    "'e', 0, 0)",
                    "INSERT INTO runner_retired (runner_id, instance, retired_at) VALUES ('r1', 'i0', 0)"):  # fmt: skip
            raw_sql(hub.settings, sql)
    restored.mark(hub.store, source="hub.sqlite3", resume_unfinished=False, now_ms=hub.clock.now_ms())

    def fail(*_: object) -> int:
        raise RuntimeError("the start failed here")

    monkeypatch.setattr(restored, "_end_waiting_turns", fail)
    with pytest.raises(RuntimeError):
        hub.apply()
    assert restored.marker(hub.store) is not None, "kept until every step committed"
    assert raw_sql(hub.settings, "SELECT COUNT(*) AS n FROM web_session") == [{"n": 0}]
    assert (hub.state(hub.queued), hub.state(hub.leased)) == ("CANCELLED", "LEASED")
    if postgres:
        gone = "SELECT (SELECT COUNT(*) FROM runner_conn) + (SELECT COUNT(*) FROM runner_retired) AS n"
        assert raw_sql(hub.settings, gone) == [{"n": 0}]
        assert raw_sql(hub.settings, "SELECT id FROM runner") == [{"id": "r1"}]
    monkeypatch.undo()

    applied = hub.apply()
    assert applied == restored.Applied(sessions=0, jobs=0, turns=0, goals=0, resumed=False), "nothing twice"
    assert restored.marker(hub.store) is None
    assert hub.apply() is None
    assert (hub.cancels(hub.queued), hub.cancels(hub.leased), hub.cancels(hub.done)) == (1, 1, 0)
    assert hub.state(hub.done) == "SUCCEEDED"
    hub.clock.advance((TTL_MS - 1) / 1000)
    hub.engine.recover()
    assert hub.state(hub.leased) == "LEASED", "its lease runs until it expires"
    hub.clock.advance(0.001)
    hub.engine.recover()
    job = hub.job(hub.leased)
    assert (job.state, job.terminal_reason) == ("CANCELLED", "lease_expired_cancel_requested")


def test_a_restore_with_resume_unfinished_leaves_the_jobs(hub: Restored) -> None:
    add_session(hub)
    restored.mark(hub.store, source="hub.sqlite3", resume_unfinished=True, now_ms=hub.clock.now_ms())
    assert restored.unfinished(hub.store) == restored.Unfinished(jobs=2, turns=0, goals=0)
    applied = hub.apply()
    assert applied == restored.Applied(sessions=1, jobs=0, turns=0, goals=0, resumed=True)
    assert raw_sql(hub.settings, "SELECT COUNT(*) AS n FROM web_session") == [{"n": 0}]
    assert (hub.state(hub.queued), hub.state(hub.leased)) == ("QUEUED", "LEASED")
    assert (hub.cancels(hub.queued), hub.cancels(hub.leased)) == (0, 0)
