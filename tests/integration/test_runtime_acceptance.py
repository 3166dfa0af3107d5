"""Acceptance scenarios 1-25 of lifecycle.md 11 over a real uvicorn hub on 127.0.0.1, on SQLite and on PostgreSQL
(scale.md 6.1: ``make_hub`` here points every hub at ``backend_database``).

Each scenario ends with the audit chain verified and a scan proving the proxy secret is in no file
of the data directory and in no captured output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from talaria.canonical import digest
from talaria.clock import ManualClock
from talaria.testing.hub_server import HubServer
from tests.backends import BackendDatabase, raw_sql
from tests.conftest import PROXY_SECRET
from tests.integration.runtime_support import (
    APPROVER,
    RESULT,
    Worker,
    close_clients,
    code,
    count,
    dispatched_job,
    job_row,
    new_task,
    scan_for_secret,
)


@pytest.fixture
def make_hub(
    tmp_path: Path, clock: ManualClock, backend_database: BackendDatabase
) -> Iterator[Callable[..., HubServer]]:
    """The root ``make_hub``, on each backend in turn."""
    made: list[HubServer] = []

    def factory(**settings: Any) -> HubServer:
        server = HubServer(tmp_path / "data", clock, **backend_database.settings(), **settings).start()
        made.append(server)
        return server

    yield factory
    for server in made:
        server.stop()


@pytest.fixture
def hub(
    make_hub: Callable[..., HubServer], backend_database: BackendDatabase, capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> Iterator[HubServer]:  # fmt: skip
    server = make_hub(runtime_api_enabled=True, runtime_api_proxy_secret=PROXY_SECRET)
    assert server.hub.store.dialect == backend_database.backend
    yield server
    close_clients()
    assert server.hub.engine.verify_audit().ok
    captured = capfd.readouterr()
    phases = ("setup", "call", "teardown")
    logs = "\n".join(record.getMessage() for phase in phases for record in caplog.get_records(phase))  # type: ignore[arg-type]
    assert "recovery_done" in logs  # the hub's logs were captured, so the scan below sees them
    assert scan_for_secret(server.data_dir, captured.out + captured.err + logs) == []


def events(server: HubServer, job: str) -> list[str]:
    rows = server.hub.engine.list_audit("default", task_id=None, job_id=job, before_seq=None, limit=1000)
    return [r.type for r in reversed(rows)]


def states(server: HubServer, job: str) -> tuple[str, str, str]:
    row = job_row(server, job)
    with server.hub.store.read() as tx:
        task = tx.one("task_get", tenant="default", id=row["task_id"])
        dispatch = tx.one("dispatch_get", id=row["dispatch_id"])
    assert task is not None and dispatch is not None
    return row["state"], task["state"], dispatch["status"]


def test_1_happy_path(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    assert w.claim().json()["state"] == "LEASED"
    assert w.start().json()["state"] == "RUNNING"
    beat = w.heartbeat({"step": 1})
    assert beat.status_code == 200 and beat.json()["cancel_requested"] is False
    done = w.complete()
    assert done.status_code == 200
    assert done.json() == {
        "job": job,
        "state": "SUCCEEDED",
        "revision": 5,
        "result_digest": digest(RESULT),
        "task_state": "SUCCEEDED",
        "dispatch_state": "SUCCEEDED",
    }
    assert done.headers["cache-control"] == "no-store"
    assert states(hub, job) == ("SUCCEEDED", "SUCCEEDED", "SUCCEEDED")
    job_events = [e for e in events(hub, job) if e.startswith("hermes.job.")]
    assert job_events == [
        "hermes.job.enqueued",
        "hermes.job.claimed",
        "hermes.job.started",
        "hermes.job.heartbeat",
        "hermes.job.completed",
    ]
    assert "task.reconciled" in events(hub, job)
    assert count(hub, "SELECT count(*) FROM execution_evidence WHERE job_id = ?", job) == 5
    assert count(hub, "SELECT count(*) FROM reconciliation WHERE job_id = ?", job) == 1


def test_2_fail_path_stores_the_error(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    failed = w.fail("tool.crashed")
    assert failed.status_code == 200 and failed.json()["task_state"] == "FAILED"
    assert states(hub, job) == ("FAILED", "FAILED", "FAILED")
    with hub.hub.store.read() as tx:
        result = tx.one("result_get", job_id=job)
    assert result is not None and '"code":"tool.crashed"' in result["payload"]
    assert job_row(hub, job)["terminal_reason"] == "tool.crashed"


def test_3_worker_cancel(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    cancelled = w.cancel("user asked")
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "CANCELLED" and cancelled.json()["cancel_requested"] is False
    assert states(hub, job) == ("CANCELLED", "CANCELLED", "CANCELLED")
    assert job_row(hub, job)["terminal_reason"] == "holder_cancel"


def test_4_status_hides_the_lease_id_from_others(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    other = Worker.of(hub, job, binding, "worker-b")
    admin = Worker.of(hub, job, binding, "ops", roles="platform_admin")
    for step in (w.claim, w.start, w.heartbeat):
        step()
        mine = w.status().json()
        assert mine["lease"]["lease_id"] == w.lease["lease_id"]  # type: ignore[index]
        for viewer in (other, admin):
            seen = viewer.status()
            assert seen.status_code == 200
            body = seen.json()
            assert "lease_id" not in body["lease"] and w.lease["lease_id"] not in seen.text  # type: ignore[index]
            assert (body["state"], body["revision"], body["attempt"]) == (mine["state"], mine["revision"], 1)


def test_5_default_closed(make_hub: Callable[..., HubServer]) -> None:
    server = make_hub()
    with server.client() as http:
        unknown = http.get("/no/such/path")
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
            for path in ("/internal/runtime/v1/hermes/jobs", "/internal/runtime/v1/hermes/jobs/x/claim"):
                response = http.request(method, path)
                assert response.status_code == 404
                assert response.content == unknown.content == b'{"code":"not_found","error":"not found"}'
                assert response.headers["content-type"] == unknown.headers["content-type"]


def test_6_identity_failures(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    body = {"binding": w.binding, "worker_instance": "w"}
    path = f"/jobs/{job}/claim"
    assert code(w.client.request("POST", path, body=body, extra_headers={"X-Talaria-Principal": ""})) in (
        "proxy_identity_invalid",
    )
    plain = w.client.http.post(f"/internal/runtime/v1/hermes{path}", json=body, headers={"Idempotency-Key": "k"})
    assert (plain.status_code, code(plain)) == (401, "proxy_identity_missing")
    forged = w.client.headers("POST", "/x", b"")
    forged["X-Talaria-Proxy-Signature"] = "0" * 64
    bad = w.client.http.post(f"/internal/runtime/v1/hermes{path}", json=body, headers=forged | {"Idempotency-Key": "k"})
    assert (bad.status_code, code(bad)) == (401, "proxy_signature_invalid")
    hub.clock.advance(0)
    skewed = Worker.of(hub, job, binding, "worker-a")
    skewed.client.clock = type(hub.clock)(hub.clock.now_ms() - 61_000)
    assert code(skewed.claim()) == "proxy_timestamp_skew"
    # a duplicated identity header
    headers = w.client.headers("POST", f"/internal/runtime/v1/hermes{path}", b"{}")
    raw = [*headers.items(), ("X-Talaria-Roles", "runtime"), ("Idempotency-Key", "k")]
    dup = w.client.http.post(f"/internal/runtime/v1/hermes{path}", content=b"{}", headers=raw)
    assert (dup.status_code, code(dup)) == (401, "proxy_identity_invalid")
    for roles in ("viewer", "Runtime"):
        r = Worker.of(hub, job, binding, "worker-a", roles=roles).claim()
        assert (r.status_code, code(r)) == (403, "role_forbidden")
    assert job_row(hub, job)["state"] == "QUEUED"
    assert count(hub, "SELECT count(*) FROM security_event WHERE status = 401") >= 4


def _non_loopback_address() -> str | None:
    import socket

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent; this picks the outbound interface
        address = str(probe.getsockname()[0])
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_6_non_loopback_peer_is_refused(make_hub: Callable[..., HubServer]) -> None:
    import asyncio
    import threading

    import httpx
    import uvicorn

    from talaria.hub.app import create_app
    from talaria.hub.server import bind

    address = _non_loopback_address()
    assert address is not None, "this machine has no non-loopback IPv4 address to test with"
    server = make_hub(runtime_api_enabled=True, runtime_api_proxy_secret=PROXY_SECRET)
    sock = bind("0.0.0.0", 0)
    app = create_app(server.settings, clock=server.clock, run_reaper=False)
    uv = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
    server.stop()  # one hub process per data directory
    thread = threading.Thread(target=lambda: asyncio.run(uv.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        while not uv.started:
            thread.join(0.01)
        port = sock.getsockname()[1]
        response = httpx.get(f"http://{address}:{port}/internal/runtime/v1/hermes/jobs", timeout=5)
        assert (response.status_code, code(response)) == (403, "peer_not_allowed")
        assert httpx.get(f"http://{address}:{port}/healthz", timeout=5).status_code == 200
    finally:
        uv.should_exit = True
        thread.join(10)
        sock.close()


FIELDS = ("tenant", "task", "trace", "principal", "provenance", "run", "dispatch", "job", "cell", "profile")


@pytest.mark.parametrize("field", FIELDS)
def test_7_binding_mismatch(hub: HubServer, field: str) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.binding[field] = w.binding[field] + "x"
    before = job_row(hub, job)
    before_events = count(hub, "SELECT count(*) FROM security_event")
    response = w.claim()
    expected = 403 if field in ("tenant", "principal") else 409
    assert (response.status_code, code(response)) == (expected, "binding_mismatch")
    assert job_row(hub, job) == before
    assert count(hub, "SELECT count(*) FROM idempotency_key") == 0
    assert count(hub, "SELECT count(*) FROM security_event") == before_events + 1
    assert states(hub, job)[1] == "DISPATCHED"


def test_8_not_approved(hub: HubServer) -> None:
    engine = hub.hub.engine
    draft = engine.create_task(
        APPROVER, tenant="default", title="t", spec={}, cell="local", profile="d", trace="c" * 32
    )
    pending = new_task(hub)
    rejected = new_task(hub)
    engine.reject_task(APPROVER, tenant="default", task_id=rejected, reason="no")
    for task_id in (draft.id, pending, rejected):
        with pytest.raises(Exception) as refused:
            engine.dispatch(APPROVER, tenant="default", task_id=task_id)
        assert getattr(refused.value, "code", None) == "not_approved"
    assert count(hub, "SELECT count(*) FROM dispatch") == 0
    assert count(hub, "SELECT count(*) FROM hermes_job") == 0
    job, binding = dispatched_job(hub)
    raw_sql(hub.settings, "UPDATE task SET state = 'APPROVED' WHERE id = ?", binding["task"])
    response = Worker.of(hub, job, binding, "worker-a").claim()
    assert (response.status_code, code(response)) == (409, "not_approved")
    assert job_row(hub, job)["state"] == "QUEUED"
    self_task = new_task(hub)
    with pytest.raises(Exception) as refused:
        engine.approve_task(type(APPROVER)("acct:default/alice", frozenset({"platform_admin"}), "web", "default"),
                            tenant="default", task_id=self_task)  # fmt: skip
    assert getattr(refused.value, "code", None) == "self_approval_forbidden"


@pytest.mark.parametrize("tamper", ["delete", "alter"])
def test_9_dispatch_first(hub: HubServer, tamper: str) -> None:
    job, binding = dispatched_job(hub)
    if tamper == "delete":
        raw_sql(hub.settings, "DELETE FROM dispatch WHERE id = ?", binding["dispatch"])
    else:
        raw_sql(hub.settings, "UPDATE dispatch SET run_id = 'run_other' WHERE id = ?", binding["dispatch"])
    before = job_row(hub, job)
    response = Worker.of(hub, job, binding, "worker-a").claim()
    assert response.status_code == 409
    assert code(response) == ("dispatch_missing" if tamper == "delete" else "binding_mismatch")
    assert job_row(hub, job) == before
    assert count(hub, "SELECT count(*) FROM idempotency_key") == 0


def test_10_double_claim(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    a, b = Worker.of(hub, job, binding, "worker-a"), Worker.of(hub, job, binding, "worker-b")
    a.claim()
    response = b.claim()
    assert (response.status_code, code(response)) == (409, "already_leased")
    assert job_row(hub, job)["lease_id"] == a.lease["lease_id"]  # type: ignore[index]
    assert a.start().status_code == 200


def test_11_foreign_lease(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    a, b = Worker.of(hub, job, binding, "worker-a"), Worker.of(hub, job, binding, "worker-b")
    a.claim()
    b.lease = dict(a.lease or {})
    assert code(b.start()) == "lease_mismatch"
    a.start()
    assert code(b.heartbeat()) == "lease_mismatch"
    assert code(b.complete()) == "lease_mismatch"
    assert a.complete().status_code == 200


def test_12_invalid_transitions(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.lease = {"lease_id": "0" * 32, "lease_epoch": 0}
    assert code(w.heartbeat()) == "invalid_transition"  # heartbeat on QUEUED
    w.claim()
    assert code(w.complete()) == "invalid_transition"  # complete from LEASED
    w.start()
    assert code(w.start()) == "invalid_transition"  # start twice
    assert job_row(hub, job)["state"] == "RUNNING"


def test_13_heartbeats_keep_the_lease_until_max_life(make_hub: Callable[..., HubServer]) -> None:
    hub = make_hub(runtime_api_enabled=True, runtime_api_proxy_secret=PROXY_SECRET, lifecycle_max_lease_life_s=200)
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    for _ in range(15):  # 150 s = 5 x TTL
        hub.clock.advance(10)
        assert hub.hub.engine.expire_due() == 0
        assert w.heartbeat().status_code == 200
    hub.clock.advance(9)  # now = acquired + 159 s; beats keep a full TTL while the cap is far
    assert w.heartbeat().json()["expires_at"] == "2026-07-21T10:03:09.000Z"
    hub.clock.advance(21)  # now = acquired + 180 s
    last = w.heartbeat().json()
    assert last["expires_at"] == "2026-07-21T10:03:20.000Z"  # acquired + 200 s, not now + TTL
    hub.clock.advance(20)  # now = acquired + 200 s
    assert code(w.heartbeat()) == "lease_expired"
    assert job_row(hub, job)["state"] == "QUEUED"


def test_14_expiry(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    before = job_row(hub, job)
    hub.clock.advance(30)
    response = w.heartbeat()
    assert (response.status_code, code(response)) == (409, "lease_expired")
    after = job_row(hub, job)
    assert after["state"] == "QUEUED" and after["lease_owner_principal"] is None and after["lease_id"] is None
    assert (after["lease_epoch"], after["revision"]) == (before["lease_epoch"] + 1, before["revision"] + 1)
    assert events(hub, job)[-1] == "hermes.job.requeued"


def test_15_fencing(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    old, new = Worker.of(hub, job, binding, "worker-a"), Worker.of(hub, job, binding, "worker-c")
    old.claim()
    hub.clock.advance(31)
    assert hub.hub.engine.expire_due() == 1
    assert new.claim().status_code == 200
    for step in (old.start, old.heartbeat, old.complete):
        assert code(step()) == "stale_lease"
    new.start()
    assert new.complete().status_code == 200


def test_16_same_key_same_body_replays(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    first = w.complete(key="complete-1")
    again = w.complete(key="complete-1")
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert count(hub, "SELECT count(*) FROM reconciliation") == 1
    assert count(hub, "SELECT count(*) FROM execution_evidence WHERE kind = 'complete'") == 1


def test_17_same_key_other_body(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    w.heartbeat({"n": 1}).raise_for_status()
    before = job_row(hub, job)
    reused = w.post("heartbeat", {"progress": {"n": 2}}, key=None)
    assert reused.status_code == 200  # a fresh key is fine
    key = "hb-same"
    assert w.post("heartbeat", {"progress": {"n": 3}}, key=key).status_code == 200
    before = job_row(hub, job)
    response = w.post("heartbeat", {"progress": {"n": 4}}, key=key)
    assert (response.status_code, code(response)) == (422, "idempotency_key_reused")
    assert job_row(hub, job) == before


def test_18_terminal_replay_under_a_new_key(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    first = w.complete(key="k1")
    second = w.complete(key="k2")
    assert second.status_code == 200 and second.content == first.content
    assert "idempotent-replayed" not in second.headers
    assert count(hub, "SELECT count(*) FROM reconciliation") == 1
    assert count(hub, "SELECT count(*) FROM idempotency_key") == 3  # claim, start, first complete


def test_19_terminal_conflict(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    w.complete()
    for response in (
        w.fail(),
        w.complete({"outputs": {}, "artifacts": [], "summary": "other"}),
        w.heartbeat(),
        w.claim(),
    ):
        assert (response.status_code, code(response)) == (409, "terminal_conflict")
    assert states(hub, job) == ("SUCCEEDED", "SUCCEEDED", "SUCCEEDED")


def test_20_restart_with_an_expired_lease(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    before = job_row(hub, job)
    hub.stop()
    hub.clock.advance(60)
    hub.start()
    after = job_row(hub, job)  # before any request
    assert after["state"] == "QUEUED" and after["revision"] == before["revision"] + 1
    last = hub.hub.engine.list_audit("default", task_id=None, job_id=job, before_seq=None, limit=1)[0]
    assert (last.type, last.reason_code) == ("hermes.job.requeued", "lease_expired_on_recovery")
    w.client.http.base_url = hub.url  # type: ignore[assignment]
    assert code(w.heartbeat()) == "stale_lease"


def test_21_restart_with_a_live_lease(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    hub.restart()
    w.client.http.base_url = hub.url  # type: ignore[assignment]
    hub.clock.advance(10)
    assert w.heartbeat().status_code == 200
    assert w.complete().status_code == 200


def test_22_keys_survive_restart(hub: HubServer) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    first = w.complete(key="before-restart")
    hub.restart()
    w.client.http.base_url = hub.url  # type: ignore[assignment]
    again = w.complete(key="before-restart")
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"


@pytest.mark.parametrize("fault_at", ["evidence_insert", "reconciliation_insert", "commit"])
def test_23_crash_atomicity(hub: HubServer, fault_at: str, backend_database: BackendDatabase) -> None:
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    store = hub.hub.store
    seen: list[str] = []

    def fault(query: str) -> None:
        seen.append(query)
        if query == fault_at and "job_finish" in seen:  # the job UPDATE of a complete
            raise backend_database.driver_error("disk I/O error (injected)")

    store.fault_hook = fault  # type: ignore[attr-defined]
    failed = w.complete(key="crash")
    store.fault_hook = None  # type: ignore[attr-defined]
    assert (failed.status_code, code(failed), failed.headers["retry-after"]) == (503, "store_unavailable", "1")
    row = job_row(hub, job)
    assert row["state"] == "RUNNING"
    assert count(hub, "SELECT count(*) FROM hermes_result") == 0
    assert count(hub, "SELECT count(*) FROM idempotency_key WHERE operation = 'complete'") == 0
    assert states(hub, job)[1] == "DISPATCHED"
    retry = w.complete(key="crash")
    assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers
    assert count(hub, "SELECT count(*) FROM reconciliation") == 1


def test_24_orchestrator_authority(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from talaria.lifecycle.tasks import TaskEntries as tasks

    calls: list[str] = []
    for name in ("create_task", "submit_task", "approve_task", "reject_task", "cancel_task", "dispatch"):
        original = getattr(tasks, name)

        def spy(*args: object, _name: str = name, _original: Callable[..., object] = original, **kw: object) -> object:
            calls.append(_name)
            return _original(*args, **kw)

        monkeypatch.setattr(tasks, name, spy)
    job, binding = dispatched_job(hub)
    calls.clear()
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    w.start()
    w.heartbeat()
    w.complete()
    assert calls == []  # Runtime handlers never call Task or Dispatch writers
    queued, queued_binding = dispatched_job(hub)
    admin = Worker.of(hub, queued, queued_binding, "ops", roles="platform_admin")
    cancelled = admin.cancel("not needed")
    assert cancelled.json()["state"] == "CANCELLED"
    assert states(hub, queued) == ("CANCELLED", "CANCELLED", "CANCELLED")
    running, running_binding = dispatched_job(hub)
    holder = Worker.of(hub, running, running_binding, "worker-a")
    holder.claim()
    holder.start()
    admin = Worker.of(hub, running, running_binding, "ops", roles="platform_admin")
    flagged = admin.cancel("stop it")
    assert flagged.json()["cancel_requested"] is True
    assert flagged.json()["state"] == "RUNNING"
    again = admin.cancel("stop it")  # while the flag is set: no change, no key
    assert again.status_code == 200 and again.json()["revision"] == flagged.json()["revision"]
    assert holder.heartbeat().json()["cancel_requested"] is True
    hub.clock.advance(31)
    hub.hub.engine.expire_due()
    assert states(hub, running) == ("CANCELLED", "CANCELLED", "CANCELLED")
    assert job_row(hub, running)["terminal_reason"] == "lease_expired_cancel_requested"


@pytest.mark.parametrize("fault_at", ["audit_insert", "evidence_insert"])
def test_25_fail_closed_audit(hub: HubServer, fault_at: str, backend_database: BackendDatabase) -> None:
    if fault_at == "audit_insert" and backend_database.backend == "postgresql":
        fault_at = "audit_pending_insert"  # the audited transaction's own write there (scale.md 2.4)
    job, binding = dispatched_job(hub)
    w = Worker.of(hub, job, binding, "worker-a")
    w.claim()
    before = job_row(hub, job)

    def fault(query: str) -> None:
        if query == fault_at:
            raise backend_database.driver_error("audit insert failed (injected)")

    hub.hub.store.fault_hook = fault  # type: ignore[attr-defined]
    response = w.post("start", key="start-1")
    hub.hub.store.fault_hook = None  # type: ignore[attr-defined]
    assert (response.status_code, code(response)) == (503, "store_unavailable")
    assert job_row(hub, job) == before
    assert count(hub, "SELECT count(*) FROM idempotency_key WHERE operation = 'start'") == 0
    assert states(hub, job)[1] == "DISPATCHED"
