"""Conformance tests of the store contract (``talaria.store.interface``), run against every backend.

The last section holds SQLite-specific checks (PRAGMAs, triggers seen through a raw driver
connection, busy timeout); it is marked as such and uses its own fixture.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from talaria.errors import StoreUnavailable, TalariaError
from talaria.lifecycle.journal import JOB_COLUMNS
from talaria.store import migrations
from talaria.store.sqlite import SQLiteStore

from .conftest import Backend

NOW = 1_784_628_000_000
TENANT = "default"
LIFECYCLE_TABLES = {
    "hermes_job",
    "hermes_result",
    "idempotency_key",
    "execution_evidence",
    "reconciliation",
    "security_event",
}
CORE_TABLES = {"tenant", "account", "web_session", "task", "dispatch", "audit_event", "audit_head"}
TEAM_TABLES = {
    "bot_team", "team", "team_member", "goal", "assignment", "assignment_run", "member_session", "team_delivery",
    "team_request", "team_evidence",
}  # fmt: skip


class Boom(Exception):
    pass


class Interrupted(BaseException):
    pass


# ---------------------------------------------------------------- helpers


def tenants(store: Any) -> set[str]:
    with store.read() as tx:
        return {name for name in ("default", "a", "b", "c") if tx.one("tenant_get", name=name) is not None}


def seed_job(store: Any, suffix: str = "1") -> dict[str, str]:
    """A tenant, a DISPATCHED-shaped task, its dispatch and a QUEUED job, through the named queries."""
    ids = {"task": f"tsk_{suffix}", "dispatch": f"dsp_{suffix}", "run": f"run_{suffix}", "job": f"job_{suffix}"}
    common = {"tenant": TENANT, "trace": "a" * 32, "cell": "local", "profile": "default"}
    with store.write() as tx:
        tx.run("tenant_ensure", name=TENANT, now=NOW)
        assert (
            tx.run(
                "task_insert",
                id=ids["task"],
                title="t",
                spec="{}",
                created_by="acct:default/alice",
                now=NOW,
                **common,
            )
            == 1
        )
        assert (
            tx.run(
                "dispatch_insert",
                id=ids["dispatch"],
                task_id=ids["task"],
                job_id=ids["job"],
                run_id=ids["run"],
                provenance="p" * 64,
                created_by="acct:default/bob",
                now=NOW,
                **common,
            )
            == 1
        )
        assert (
            tx.run(
                "job_insert",
                id=ids["job"],
                task_id=ids["task"],
                dispatch_id=ids["dispatch"],
                run_id=ids["run"],
                provenance="p" * 64,
                max_attempts=3,
                max_life_s=3600,
                now=NOW,
                in_process_only=0,
                **common,
            )
            == 1
        )
    return ids


def get_job(store: Any, job_id: str) -> dict[str, Any]:
    with store.read() as tx:
        row = tx.one("job_get", tenant=TENANT, id=job_id)
    assert row is not None
    return row


def job_update_params(row: dict[str, Any], *, expected_revision: int | None = None, **changes: Any) -> dict[str, Any]:
    params = {col: row[col] for col in JOB_COLUMNS}
    params.update(changes)
    params.update(
        id=row["id"],
        expected_state=row["state"],
        expected_revision=row["revision"] if expected_revision is None else expected_revision,
        require_due=0,
        require_no_cancel=0,
        now=NOW,
    )
    return params


def lease_columns(epoch: int = 1) -> dict[str, Any]:
    return {
        "lease_id": "f" * 32,
        "lease_epoch": epoch,
        "lease_owner_principal": "worker-1",
        "lease_owner_instance": "w1",
        "lease_acquired_at": NOW,
        "lease_expires_at": NOW + 30_000,
    }


def append_audit(store: Any, seq: int = 1, body: str = '{"seq":1}') -> None:
    with store.write() as tx:
        tx.run(
            "audit_insert",
            seq=seq,
            event_id=f"evt_{seq}",
            occurred_at=NOW,
            type="task.created",
            tenant=TENANT,
            task_id=None,
            dispatch_id=None,
            job_id=None,
            conversation_id=None,
            bot_id=None,
            from_state=None,
            to_state="DRAFT",
            revision_before=None,
            revision_after=1,
            lease_epoch=None,
            reason_code=None,
            body=body,
            prev_hash="0" * 64,
            hash="1" * 64,
        )


def audit_rows(store: Any) -> list[dict[str, Any]]:
    with store.read() as tx:
        return tx.all("audit_scan", after_seq=0, limit=100)


def schema(store: Any) -> list[tuple[Any, ...]]:
    with store.read() as tx:
        return [tuple(row.values()) for row in tx.all("schema_tables")]


def table_names(store: Any) -> set[str]:
    with store.read() as tx:
        return {row["name"] for row in tx.all("schema_tables") if row["type"] == "table"}


# ---------------------------------------------------------------- write transactions


def test_write_commits_on_normal_exit(store: Any) -> None:
    with store.write() as tx:
        assert tx.run("tenant_ensure", name="a", now=NOW) == 1
    with store.read() as tx:
        assert tx.one("tenant_get", name="a") == {"name": "a", "created_at": NOW}


@pytest.mark.parametrize(
    "error",
    [Boom("plain exception"), TalariaError("invalid_transition", "refused"), Interrupted()],
    ids=["exception", "talaria_error", "base_exception"],
)
def test_an_exception_inside_write_rolls_back_and_propagates_unchanged(store: Any, error: BaseException) -> None:
    with pytest.raises(type(error)) as info, store.write() as tx:
        tx.run("tenant_ensure", name="a", now=NOW)
        tx.run("tenant_ensure", name="b", now=NOW)
        raise error
    assert info.value is error
    assert tenants(store) == set()
    # the store is usable afterwards
    with store.write() as tx:
        tx.run("tenant_ensure", name="c", now=NOW)
    assert tenants(store) == {"c"}


def test_a_driver_error_becomes_store_unavailable_and_rolls_back(store: Any, backend: Backend) -> None:
    def hook(name: str) -> None:
        if name == "tenant_get":
            raise backend.driver_error()

    with store.write() as tx:
        tx.run("tenant_ensure", name="a", now=NOW)
    store.fault_hook = hook
    with pytest.raises(StoreUnavailable) as info, store.write() as tx:
        tx.run("tenant_ensure", name="b", now=NOW)
        tx.one("tenant_get", name="b")
    store.fault_hook = None
    assert info.value.code == "store_unavailable"
    assert info.value.status == 503
    assert info.value.headers == {"Retry-After": "1"}
    assert tenants(store) == {"a"}
    with store.write() as tx:
        tx.run("tenant_ensure", name="c", now=NOW)
    assert tenants(store) == {"a", "c"}


def test_a_failing_commit_rolls_back(store: Any, backend: Backend) -> None:
    def hook(name: str) -> None:
        if name == "commit":
            raise backend.driver_error()

    store.fault_hook = hook
    with pytest.raises(StoreUnavailable), store.write() as tx:
        tx.run("tenant_ensure", name="a", now=NOW)
        tx.run("tenant_ensure", name="b", now=NOW)
    store.fault_hook = None
    assert tenants(store) == set()
    with store.write() as tx:
        tx.run("tenant_ensure", name="c", now=NOW)
    assert tenants(store) == {"c"}


def test_a_talaria_error_at_commit_rolls_back_and_propagates(store: Any) -> None:
    error = StoreUnavailable("the audit insert failed")

    def hook(name: str) -> None:
        if name == "commit":
            raise error

    store.fault_hook = hook
    with pytest.raises(StoreUnavailable) as info, store.write() as tx:
        tx.run("tenant_ensure", name="a", now=NOW)
    store.fault_hook = None
    assert info.value is error
    assert tenants(store) == set()


def test_the_fault_hook_sees_each_query_then_commit(store: Any) -> None:
    seen: list[str] = []
    store.fault_hook = seen.append
    with store.write() as tx:
        tx.run("tenant_ensure", name="a", now=NOW)
        tx.one("tenant_get", name="a")
        tx.all("tenant_get", name="a")
    store.fault_hook = None
    assert seen == ["tenant_ensure", "tenant_get", "tenant_get", "commit"]


def test_a_constraint_failure_is_store_unavailable_and_rolls_back_the_whole_transaction(store: Any) -> None:
    with pytest.raises(StoreUnavailable), store.write() as tx:
        tx.run("tenant_ensure", name="a", now=NOW)
        # dispatch.task_id references task(id): no such task
        tx.run(
            "dispatch_insert",
            id="dsp_x",
            tenant=TENANT,
            task_id="tsk_missing",
            job_id="job_x",
            run_id="run_x",
            trace="a" * 32,
            provenance="p",
            cell="local",
            profile="default",
            created_by="x",
            now=NOW,
        )
    assert tenants(store) == set()


def test_writes_from_several_threads_are_serialised(store: Any) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(20):
                with store.write() as tx:
                    tx.run("tenant_ensure", name=f"t{n}-{i}", now=NOW)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with store.read() as tx:
        assert all(tx.one("tenant_get", name=f"t{n}-{i}") for n in range(4) for i in range(20))


# ---------------------------------------------------------------- reads


def test_one_and_all(store: Any) -> None:
    with store.read() as tx:
        assert tx.one("tenant_get", name="nobody") is None
        assert tx.all("tenant_get", name="nobody") == []
        assert tx.one("schema_ping") == {"ok": 1}


def test_read_sees_committed_data_only(store: Any) -> None:
    with store.write() as wtx:
        wtx.run("tenant_ensure", name="a", now=NOW)
        with store.read() as rtx:
            assert rtx.one("tenant_get", name="a") is None
    with store.read() as rtx:
        assert rtx.one("tenant_get", name="a") is not None


def test_a_read_is_a_consistent_snapshot(store: Any) -> None:
    with store.read() as rtx:
        assert rtx.one("tenant_get", name="a") is None
        with store.write() as wtx:
            wtx.run("tenant_ensure", name="a", now=NOW)
        assert rtx.one("tenant_get", name="a") is None
    with store.read() as rtx:
        assert rtx.one("tenant_get", name="a") is not None


def test_ping_and_close(make_store: Callable[..., Any]) -> None:
    store = make_store("closing")
    assert store.ping() is True
    store.close()
    assert store.ping() is False
    with pytest.raises(StoreUnavailable), store.write() as tx:
        tx.run("tenant_ensure", name="a", now=NOW)
    store.close()  # idempotent


def test_close_during_a_read_on_another_thread_lets_the_read_finish(make_store: Callable[..., Any]) -> None:
    """A hub's shutdown closes the store while a worker thread may still be reading; with SQLite, closing a
    connection another thread is reading on crashed the process (seen in CI)."""
    store = make_store("closing_mid_read")
    with store.write() as tx:
        tx.run("tenant_ensure", name="a", now=NOW)
    inside, closed = threading.Event(), threading.Event()
    seen: list[object] = []

    def reader() -> None:
        with store.read() as tx:
            inside.set()
            assert closed.wait(10)
            seen.append(tx.one("tenant_get", name="a"))  # its connection is still open
        seen.append("ended")

    thread = threading.Thread(target=reader)
    thread.start()
    assert inside.wait(10)
    store.close()
    closed.set()
    thread.join(10)
    assert not thread.is_alive()
    assert seen[0] is not None and seen[1] == "ended"
    assert store.ping() is False  # a new read after close is refused
    with pytest.raises(StoreUnavailable), store.read():
        pass


def test_maintain_leaves_a_small_store_alone(store: Any) -> None:
    store.maintain()
    assert store.ping() is True


# ---------------------------------------------------------------- row counts and conditional updates


def test_run_returns_the_row_count(store: Any) -> None:
    with store.write() as tx:
        assert tx.run("tenant_ensure", name="a", now=NOW) == 1
        assert tx.run("tenant_ensure", name="a", now=NOW) == 0  # ON CONFLICT DO NOTHING


def test_conditional_job_update(store: Any) -> None:
    ids = seed_job(store)
    row = get_job(store, ids["job"])
    assert (row["state"], row["revision"], row["attempt"], row["lease_epoch"]) == ("QUEUED", 1, 0, 0)

    with store.write() as tx:
        stale = job_update_params(row, expected_revision=2, state="LEASED", revision=2, attempt=1, **lease_columns())
        assert tx.run("job_update", **stale) == 0
    assert get_job(store, ids["job"])["revision"] == 1

    with store.write() as tx:
        wrong_state = job_update_params(row, state="LEASED", revision=2, attempt=1, **lease_columns())
        wrong_state["expected_state"] = "RUNNING"
        assert tx.run("job_update", **wrong_state) == 0

    with store.write() as tx:
        good = job_update_params(row, state="LEASED", revision=2, attempt=1, **lease_columns())
        assert tx.run("job_update", **good) == 1
        # the same expected revision again now matches nothing
        assert tx.run("job_update", **good) == 0
    row = get_job(store, ids["job"])
    assert (row["state"], row["revision"], row["lease_epoch"]) == ("LEASED", 2, 1)


def test_expiry_conditions_of_job_update(store: Any) -> None:
    ids = seed_job(store)
    queued = get_job(store, ids["job"])
    with store.write() as tx:
        tx.run("job_update", **job_update_params(queued, state="LEASED", revision=2, attempt=1, **lease_columns()))
    leased = get_job(store, ids["job"])
    cleared = {key: None for key in lease_columns() if key != "lease_epoch"}
    requeue = job_update_params(leased, state="QUEUED", revision=3, lease_epoch=2, **cleared)

    with store.write() as tx:  # not yet due: lease_expires_at = NOW + 30 s
        assert tx.run("job_update", **{**requeue, "require_due": 1, "now": NOW + 29_999}) == 0
    with store.write() as tx:  # flag set: row 10 must not apply
        flagged = job_update_params(leased, revision=3, cancel_requested=1, cancel_requested_at=NOW)
        assert tx.run("job_update", **flagged) == 1
    flagged_row = get_job(store, ids["job"])
    requeue = job_update_params(flagged_row, state="QUEUED", revision=4, lease_epoch=2, cancel_requested=0, **cleared)
    with store.write() as tx:
        assert tx.run("job_update", **{**requeue, "require_due": 1, "require_no_cancel": 1, "now": NOW + 30_000}) == 0
        assert tx.run("job_update", **{**requeue, "require_due": 1, "now": NOW + 30_000}) == 1
    assert get_job(store, ids["job"])["state"] == "QUEUED"


def test_task_update_is_conditional_on_state_and_revision(store: Any) -> None:
    ids = seed_job(store)
    params = {
        "id": ids["task"],
        "state": "PENDING_APPROVAL",
        "revision": 2,
        "provenance": None,
        "submitted_at": NOW,
        "approved_by": None,
        "approved_at": None,
        "rejected_by": None,
        "rejected_at": None,
        "rejection_reason": None,
        "finished_at": None,
    }
    with store.write() as tx:
        assert tx.run("task_update", **params, expected_state="APPROVED", expected_revision=1) == 0
        assert tx.run("task_update", **params, expected_state="DRAFT", expected_revision=7) == 0
        assert tx.run("task_update", **params, expected_state="DRAFT", expected_revision=1) == 1


# ---------------------------------------------------------------- constraints


def test_audit_events_refuse_update_and_delete(store: Any) -> None:
    append_audit(store)
    before = audit_rows(store)
    assert len(before) == 1
    for statement in (
        "UPDATE audit_event SET body = 'tampered' WHERE seq = 1;",
        "DELETE FROM audit_event WHERE seq = 1;",
    ):
        with pytest.raises(StoreUnavailable), store.write() as tx:
            tx.script(statement)
        assert audit_rows(store) == before


def test_a_leased_job_needs_its_lease_columns(store: Any) -> None:
    ids = seed_job(store)
    row = get_job(store, ids["job"])
    partial = {**lease_columns(), "lease_owner_instance": None}
    for changes in ({}, partial):
        with pytest.raises(StoreUnavailable), store.write() as tx:
            tx.run("job_update", **job_update_params(row, state="LEASED", revision=2, attempt=1, **changes))
        assert get_job(store, ids["job"]) == row


def test_a_queued_job_has_no_lease_and_no_cancel_flag(store: Any) -> None:
    ids = seed_job(store)
    row = get_job(store, ids["job"])
    for changes in (lease_columns(), {"cancel_requested": 1}):
        with pytest.raises(StoreUnavailable), store.write() as tx:
            tx.run("job_update", **job_update_params(row, revision=2, **changes))
        assert get_job(store, ids["job"]) == row


def test_attempt_never_exceeds_max_attempts(store: Any) -> None:
    ids = seed_job(store)
    row = get_job(store, ids["job"])
    with pytest.raises(StoreUnavailable), store.write() as tx:
        tx.run("job_update", **job_update_params(row, state="LEASED", revision=2, attempt=4, **lease_columns()))
    assert get_job(store, ids["job"]) == row


def test_one_dispatch_per_task(store: Any) -> None:
    ids = seed_job(store)
    with pytest.raises(StoreUnavailable), store.write() as tx:
        tx.run(
            "dispatch_insert",
            id="dsp_other",
            tenant=TENANT,
            task_id=ids["task"],
            job_id="job_other",
            run_id="run_other",
            trace="a" * 32,
            provenance="p",
            cell="local",
            profile="default",
            created_by="x",
            now=NOW,
        )


# ---------------------------------------------------------------- migrations


CORE = len(migrations.available("sqlite", "core"))
LIFECYCLE = len(migrations.available("sqlite", "lifecycle"))
TEAM = len(migrations.available("sqlite", "team"))
ALL = {"core": CORE, "lifecycle": LIFECYCLE, "team": TEAM}


def test_current_and_latest_versions(make_store: Callable[..., Any]) -> None:
    fresh = make_store("fresh", migrate=False)
    assert migrations.current(fresh) == {"core": 0, "lifecycle": 0, "team": 0}
    assert migrations.schema(fresh).pending == ALL
    applied = migrations.upgrade(fresh)
    assert len(applied) == CORE + LIFECYCLE + TEAM
    assert all(a.startswith("core ") for a in applied[:CORE])
    assert all(a.startswith("lifecycle ") for a in applied[CORE : CORE + LIFECYCLE])
    assert all(a.startswith("team ") for a in applied[CORE + LIFECYCLE :])
    assert migrations.current(fresh) == migrations.latest(fresh) == ALL
    assert migrations.schema(fresh).pending == {}
    assert migrations.upgrade(fresh) == []


def test_migrated_schema_is_the_same_after_a_lifecycle_round_trip(store: Any, make_store: Callable[..., Any]) -> None:
    migrated = schema(store)
    assert table_names(store) >= LIFECYCLE_TABLES | CORE_TABLES

    undone = migrations.downgrade(store, "lifecycle", 0)
    assert len(undone) == LIFECYCLE
    assert migrations.current(store) == {"core": CORE, "lifecycle": 0, "team": TEAM}
    assert not table_names(store) & LIFECYCLE_TABLES
    core_and_team = make_store("core-and-team", migrate=False)
    migrations.upgrade(core_and_team, "core")
    migrations.upgrade(core_and_team, "team")
    assert schema(store) == schema(core_and_team)

    migrations.upgrade(store)
    assert schema(store) == migrated
    assert schema(make_store("other")) == migrated


def test_migrated_schema_is_the_same_after_a_team_round_trip(store: Any, make_store: Callable[..., Any]) -> None:
    """team-tools.md 3.6: the team set goes alone, and the schema is then exactly core + lifecycle's."""
    migrated = schema(store)
    assert table_names(store) >= TEAM_TABLES
    undone = migrations.downgrade(store, "team", 0)
    assert undone == [f"team {v:04d}_{m.name}" for v, m in reversed(list(enumerate(
        migrations.available("sqlite", "team"), start=1)))]  # fmt: skip
    assert migrations.current(store) == {"core": CORE, "lifecycle": LIFECYCLE, "team": 0}
    assert not table_names(store) & TEAM_TABLES
    without_team = make_store("without-team", migrate=False)
    migrations.upgrade(without_team, "core")
    migrations.upgrade(without_team, "lifecycle")
    assert schema(store) == schema(without_team)
    migrations.upgrade(store)
    assert schema(store) == migrated


def test_full_round_trip_to_zero(store: Any) -> None:
    migrated = schema(store)
    migrations.downgrade(store, "team", 0)
    migrations.downgrade(store, "lifecycle", 0)
    migrations.downgrade(store, "core", 0)
    assert migrations.current(store) == {"core": 0, "lifecycle": 0, "team": 0}
    assert table_names(store) <= {"schema_version"}
    migrations.upgrade(store)
    assert schema(store) == migrated


def test_downgrading_lifecycle_keeps_core_data(store: Any) -> None:
    ids = seed_job(store)
    append_audit(store)
    migrations.downgrade(store, "lifecycle", 0)
    with store.read() as tx:
        task = tx.one("task_get", tenant=TENANT, id=ids["task"])
        dispatch = tx.one("dispatch_get", id=ids["dispatch"])
    assert task is not None and task["state"] == "DRAFT"
    assert dispatch is not None and dispatch["job_id"] == ids["job"]
    assert len(audit_rows(store)) == 1
    with pytest.raises(StoreUnavailable), store.read() as tx:
        tx.one("job_get", tenant=TENANT, id=ids["job"])

    migrations.upgrade(store)
    with store.read() as tx:
        assert tx.one("job_get", tenant=TENANT, id=ids["job"]) is None
        assert tx.one("task_get", tenant=TENANT, id=ids["task"]) is not None


def test_core_cannot_go_before_lifecycle_or_team(store: Any) -> None:
    with pytest.raises(ValueError, match="team"):
        migrations.downgrade(store, "core", 0)
    migrations.downgrade(store, "team", 0)
    with pytest.raises(ValueError, match="lifecycle"):
        migrations.downgrade(store, "core", 0)
    assert migrations.current(store) == {"core": CORE, "lifecycle": LIFECYCLE, "team": 0}


@pytest.mark.parametrize(("set_name", "version"), [("lifecycle", -1), ("lifecycle", LIFECYCLE + 1), ("nonsense", 0)])
def test_bad_downgrades_are_refused(store: Any, set_name: str, version: int) -> None:
    before = schema(store)
    with pytest.raises(ValueError):
        migrations.downgrade(store, set_name, version)
    assert schema(store) == before


def test_a_migration_step_is_one_transaction(make_store: Callable[..., Any], backend: Backend) -> None:
    fresh = make_store("faulty", migrate=False)
    migrations.upgrade(fresh, "core")

    def hook(name: str) -> None:
        if name == "schema_version_set":
            raise backend.driver_error()

    fresh.fault_hook = hook
    with pytest.raises(StoreUnavailable):
        migrations.upgrade(fresh, "lifecycle")
    fresh.fault_hook = None
    assert migrations.current(fresh) == {"core": CORE, "lifecycle": 0, "team": 0}
    assert not table_names(fresh) & LIFECYCLE_TABLES
    migrations.upgrade(fresh)
    assert table_names(fresh) >= LIFECYCLE_TABLES | TEAM_TABLES


# ---------------------------------------------------------------- SQLite-specific (backend internals)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "talaria.sqlite3")
    migrations.upgrade(store)
    yield store
    store.close()


def test_sqlite_pragmas_on_every_connection(sqlite_store: SQLiteStore) -> None:
    """SQLite-specific: WAL, synchronous=FULL, busy_timeout and foreign keys (lifecycle.md 9.1)."""
    with sqlite_store.read() as tx:
        tx.one("schema_ping")
    connections = [sqlite_store._writer, *sqlite_store._idle]
    assert len(connections) >= 2  # the writer and at least one reader
    for conn in connections:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.isolation_level is None


def test_sqlite_audit_triggers_through_a_raw_connection(sqlite_store: SQLiteStore) -> None:
    """SQLite-specific: the append-only triggers themselves refuse UPDATE and DELETE."""
    append_audit(sqlite_store)
    raw = sqlite3.connect(sqlite_store.path)
    try:
        for statement in ("UPDATE audit_event SET body = 'x' WHERE seq = 1", "DELETE FROM audit_event"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                raw.execute(statement)
            raw.rollback()
        assert raw.execute("SELECT count(*) FROM audit_event").fetchone()[0] == 1
        triggers = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert {"audit_event_no_update", "audit_event_no_delete"} <= triggers
    finally:
        raw.close()


def test_sqlite_busy_after_the_timeout_is_store_unavailable(tmp_path: Path) -> None:
    """SQLite-specific: another process holding the write lock past busy_timeout gives 503."""
    store = SQLiteStore(tmp_path / "busy.sqlite3", busy_timeout_ms=100)
    try:
        migrations.upgrade(store)
        other = sqlite3.connect(store.path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreUnavailable), store.write() as tx:
                tx.run("tenant_ensure", name="a", now=NOW)
            other.execute("ROLLBACK")
        finally:
            other.close()
        with store.write() as tx:
            assert tx.run("tenant_ensure", name="a", now=NOW) == 1
    finally:
        store.close()


def test_sqlite_wal_guard_truncates_a_large_wal(tmp_path: Path) -> None:
    """SQLite-specific: maintain() checkpoints with TRUNCATE once the -wal file exceeds the limit (9.1)."""
    store = SQLiteStore(tmp_path / "wal.sqlite3", wal_limit_bytes=4096)
    try:
        migrations.upgrade(store)
        for i in range(50):
            with store.write() as tx:
                tx.run("tenant_ensure", name=f"t{i}", now=NOW)
        wal = Path(str(store.path) + "-wal")
        assert wal.stat().st_size > 4096
        store.maintain()
        assert wal.stat().st_size == 0
        with store.read() as tx:
            assert tx.one("tenant_get", name="t49") is not None
    finally:
        store.close()


def test_sqlite_refuses_a_database_without_wal() -> None:
    """SQLite-specific: start-up fails when WAL cannot be set (an in-memory database answers 'memory')."""
    with pytest.raises(StoreUnavailable, match="WAL"):
        SQLiteStore(Path(":memory:"))


def test_sqlite_store_files_live_in_the_given_place(sqlite_store: SQLiteStore, tmp_path: Path) -> None:
    assert sqlite_store.path == tmp_path / "talaria.sqlite3"
    assert sqlite_store.path.exists()
    assert sqlite_store.dialect == "sqlite"


# ---------------------------------------------------------------- rolling upgrades (scale.md 2.5)


def steps(store: Any) -> list[tuple[str, int, int]]:
    with store.read() as tx:
        return [(r["migration_set"], r["version"], r["additive"]) for r in tx.all("schema_step_list")]


def a_newer_step(store: Any, set_name: str, additive: bool) -> None:
    """What a newer release's upgrade leaves: one more version of ``set_name``, recorded with its kind."""
    version = ALL[set_name] + 1
    with store.write() as tx:
        tx.run("schema_version_set", migration_set=set_name, version=version)
        tx.run("schema_step_set", migration_set=set_name, version=version, additive=int(additive))


def test_each_applied_step_is_recorded_with_its_kind_and_forgotten_when_reverted(store: Any) -> None:
    recorded = steps(store)
    expected = [(name, m.version, int(m.additive)) for name in sorted(migrations.SETS)
                for m in migrations.available("sqlite", name)]  # fmt: skip
    assert recorded == expected
    assert ("core", 4, 0) in recorded
    migrations.downgrade(store, "team", 0)
    assert [s for s in steps(store) if s[0] == "team"] == []
    assert migrations.schema(store).newer_steps == []


def test_a_newer_additive_step_is_tolerated_and_a_newer_other_one_is_not(store: Any) -> None:
    a_newer_step(store, "lifecycle", additive=True)
    assert migrations.schema(store).newer_steps == [("lifecycle", LIFECYCLE + 1, True)]
    assert migrations.schema(store).pending == {}
    a_newer_step(store, "team", additive=False)
    assert ("team", TEAM + 1, False) in migrations.schema(store).newer_steps
