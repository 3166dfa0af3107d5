"""Conformance of the per-transition job statements (``journal.SETS``) and the bound read, every backend.

Each hot transition has its own conditional UPDATE that sets only the columns it changes; like
``job_update`` it must match nothing at a stale revision or another state, and leave the other columns.
"""

from __future__ import annotations

from typing import Any

from talaria.lifecycle.journal import SETS

from .test_store import NOW, TENANT, get_job, lease_columns, seed_job


def _params(row: dict[str, Any], statement: str, **changes: Any) -> dict[str, Any]:
    after = row | changes
    params = {col: after[col] for col in SETS[statement]}
    return params | {"id": row["id"], "expected_state": row["state"], "expected_revision": row["revision"]}


def _step(store: Any, statement: str, **changes: Any) -> dict[str, Any]:
    """Run ``statement`` at a stale revision (no row), at another state (no row), then right (one row)."""
    row = get_job(store, changes.pop("job"))
    good = _params(row, statement, revision=row["revision"] + 1, **changes)
    with store.write() as tx:
        assert tx.run(statement, **(good | {"expected_revision": row["revision"] + 1})) == 0
        assert tx.run(statement, **(good | {"expected_state": "CANCELLED"})) == 0
        assert tx.run(statement, **good) == 1
        assert tx.run(statement, **good) == 0  # the expected revision is gone
    after = get_job(store, row["id"])
    untouched = set(row) - set(SETS[statement]) - {"revision"}
    assert {k: after[k] for k in untouched} == {k: row[k] for k in untouched}, statement
    return after


def test_the_transition_statements_are_conditional_and_set_only_their_columns(store: Any) -> None:
    ids = seed_job(store)
    job = ids["job"]
    leased = _step(store, "job_claim", job=job, state="LEASED", attempt=1, last_heartbeat_at=None, **lease_columns())
    assert (leased["state"], leased["revision"], leased["attempt"], leased["lease_epoch"]) == ("LEASED", 2, 1, 1)
    running = _step(store, "job_start", job=job, state="RUNNING", started_at=NOW + 1, lease_expires_at=NOW + 30_001)
    assert (running["state"], running["started_at"], running["lease_expires_at"]) == ("RUNNING", NOW + 1, NOW + 30_001)
    beat = _step(
        store, "job_heartbeat", job=job, progress='{"p":1}', lease_expires_at=NOW + 40_000, last_heartbeat_at=NOW + 2
    )
    assert (beat["state"], beat["progress"], beat["last_heartbeat_at"]) == ("RUNNING", '{"p":1}', NOW + 2)
    cleared = dict.fromkeys(("lease_id", "lease_owner_principal", "lease_owner_instance", "lease_acquired_at"))
    done = _step(
        store,
        "job_finish",
        job=job,
        state="SUCCEEDED",
        finished_at=NOW + 3,
        terminal_kind="SUCCEEDED",
        terminal_reason=None,
        terminal_lease_id="f" * 32,
        terminal_epoch=1,
        result_digest="d" * 64,
        terminal_response=b'{"state":"SUCCEEDED"}',
        lease_expires_at=None,
        **cleared,
    )
    assert (done["state"], done["revision"], done["lease_id"], done["lease_epoch"]) == ("SUCCEEDED", 5, None, 1)
    assert bytes(done["terminal_response"]) == b'{"state":"SUCCEEDED"}'


def test_the_bound_read_brings_the_dispatch_and_the_task_state(store: Any) -> None:
    ids = seed_job(store, "2")
    with store.read() as tx:
        row = tx.one("job_get_bound", tenant=TENANT, id=ids["job"])
        assert tx.one("job_get_bound", tenant="other", id=ids["job"]) is None
        task = tx.one("task_get", tenant=TENANT, id=ids["task"])
        dispatch = tx.one("dispatch_get", id=ids["dispatch"])
    assert row is not None and task is not None and dispatch is not None
    assert {k: row[k] for k in get_job(store, ids["job"])} == get_job(store, ids["job"])
    assert {k: row["d_" + k] for k in dispatch} == dispatch
    assert (row["t_state"], row["t_approved_by"]) == (task["state"], task["approved_by"])
