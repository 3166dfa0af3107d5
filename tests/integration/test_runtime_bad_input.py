"""Bad input on every Runtime API route gets its documented 4xx and changes nothing (lifecycle.md 6)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from talaria.testing.hub_server import HubServer
from tests.conftest import PROXY_SECRET
from tests.integration.runtime_support import Worker, close_clients, code, count, dispatched_job, job_row

PREFIX = "/internal/runtime/v1/hermes"


@pytest.fixture
def hub(make_hub: Callable[..., HubServer]) -> Iterator[HubServer]:
    server = make_hub(runtime_api_enabled=True, runtime_api_proxy_secret=PROXY_SECRET, security_event_rate_per_minute=3)
    yield server
    close_clients()
    assert server.hub.engine.verify_audit().ok


@pytest.fixture
def running(hub: HubServer) -> Worker:
    job, binding = dispatched_job(hub)
    worker = Worker.of(hub, job, binding, "worker-a")
    worker.claim()
    worker.start()
    return worker


def snapshot(hub: HubServer) -> tuple[Any, ...]:
    conn = sqlite3.connect(hub.settings.sqlite_path)
    try:
        return tuple(
            conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("hermes_job", "task", "dispatch", "idempotency_key", "audit_event", "hermes_result")
        )
    finally:
        conn.close()


def raw_post(w: Worker, op: str, raw: bytes, *, content_type: str = "application/json", key: str = "k-1") -> Any:
    target = f"{PREFIX}/jobs/{w.job}/{op}"
    headers = w.client.headers("POST", target, raw) | {"Content-Type": content_type, "Idempotency-Key": key}
    return w.client.http.post(target, content=raw, headers=headers)


BAD_BODIES: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("unknown top-level field", lambda b: b | {"extra": 1}),
    ("missing binding", lambda b: {k: v for k, v in b.items() if k != "binding"}),
    ("binding field missing", lambda b: b | {"binding": {k: v for k, v in b["binding"].items() if k != "run"}}),
    ("binding extra field", lambda b: b | {"binding": b["binding"] | {"actor": "x"}}),
    ("binding field not a string", lambda b: b | {"binding": b["binding"] | {"cell": 7}}),
    ("binding field empty", lambda b: b | {"binding": b["binding"] | {"profile": ""}}),
    ("binding field 257 chars", lambda b: b | {"binding": b["binding"] | {"trace": "a" * 257}}),
    ("lease_epoch a string", lambda b: b | {"lease_epoch": "1"}),
    ("lease_epoch a boolean", lambda b: b | {"lease_epoch": True}),
    ("lease_epoch negative", lambda b: b | {"lease_epoch": -1}),
    ("lease_id a number", lambda b: b | {"lease_id": 5}),
]


@pytest.mark.parametrize(("case", "mutate"), BAD_BODIES, ids=[c for c, _ in BAD_BODIES])
@pytest.mark.parametrize("op", ["start", "heartbeat", "complete", "fail", "cancel"])
def test_malformed_bodies_are_400_and_change_nothing(
    hub: HubServer, running: Worker, op: str, case: str, mutate: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    payload: dict[str, Any] = {"binding": running.binding, **(running.lease or {})}
    payload |= {
        "complete": {"result": {"outputs": {}, "artifacts": [], "summary": ""}},
        "fail": {"error": {"code": "x", "message": "m", "retryable": False}},
        "cancel": {"reason": "r"},
    }.get(op, {})
    before = snapshot(hub)
    response = raw_post(running, op, json.dumps(mutate(payload)).encode())
    assert (response.status_code, code(response)) == (400, "invalid_request"), case
    assert snapshot(hub) == before


@pytest.mark.parametrize(
    ("op", "extra"),
    [
        ("claim", {"worker_instance": ""}),
        ("claim", {"worker_instance": "has space"}),
        ("claim", {"worker_instance": "w" * 129}),
        ("heartbeat", {"progress": [1, 2]}),
        ("heartbeat", {"progress": {"blob": "x" * 4096}}),
        ("complete", {"result": {"outputs": {}, "artifacts": []}}),
        ("complete", {"result": {"outputs": [], "artifacts": [], "summary": ""}}),
        (
            "complete",
            {"result": {"outputs": {}, "artifacts": [{"name": "a", "digest": "nothex", "size": 1}], "summary": ""}},
        ),
        (
            "complete",
            {"result": {"outputs": {}, "artifacts": [{"name": "a", "digest": "0" * 64, "size": -1}], "summary": ""}},
        ),
        ("fail", {"error": {"code": "Bad Code", "message": "m", "retryable": False}}),
        ("fail", {"error": {"code": "x" * 65, "message": "m", "retryable": False}}),
        ("fail", {"error": {"code": "x", "message": "m", "retryable": "no"}}),
        ("cancel", {"reason": ""}),
        ("cancel", {"reason": "r" * 1025}),
    ],
)
def test_payload_rules(hub: HubServer, running: Worker, op: str, extra: dict[str, Any]) -> None:
    before = snapshot(hub)
    body: dict[str, Any] = {"binding": running.binding}
    if op != "claim":
        body |= running.lease or {}
    response = raw_post(running, op, json.dumps(body | extra).encode())
    assert (response.status_code, code(response)) == (400, "invalid_request")
    assert snapshot(hub) == before


def test_edges_that_are_accepted(hub: HubServer, running: Worker) -> None:
    progress = {"blob": "x" * (4096 - len('{"blob":""}'))}  # exactly 4 KiB canonical
    assert running.heartbeat(progress).status_code == 200
    assert running.cancel("r" * 1024).status_code == 200


def test_not_json_wrong_type_and_array(hub: HubServer, running: Worker) -> None:
    before = snapshot(hub)
    for raw, content_type in ((b"{nope", "application/json"), (b"[]", "application/json"), (b"{}", "text/plain")):
        response = raw_post(running, "heartbeat", raw, content_type=content_type)
        assert (response.status_code, code(response)) == (400, "invalid_request")
    assert snapshot(hub) == before


def test_body_over_one_mebibyte(hub: HubServer, running: Worker) -> None:
    before = snapshot(hub)
    big = b'{"pad":"' + b"x" * (1024 * 1024) + b'"}'
    response = raw_post(running, "heartbeat", big)
    assert (response.status_code, code(response)) == (413, "payload_too_large")
    assert snapshot(hub) == before


def test_idempotency_key_header_rules(hub: HubServer, running: Worker) -> None:
    before = snapshot(hub)
    target = f"{PREFIX}/jobs/{running.job}/heartbeat"
    raw = json.dumps({"binding": running.binding, **(running.lease or {})}).encode()
    base = running.client.headers("POST", target, raw) | {"Content-Type": "application/json"}
    missing = running.client.http.post(target, content=raw, headers=base)
    assert (missing.status_code, code(missing)) == (400, "idempotency_key_required")
    for bad in ("", "has space", "k" * 256, "ключ".encode()):
        response = running.client.http.post(target, content=raw, headers=base | {"Idempotency-Key": bad})
        assert (response.status_code, code(response)) == (400, "idempotency_key_invalid"), bad
    twice = running.client.http.post(
        target, content=raw, headers=[*base.items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
    )
    assert (twice.status_code, code(twice)) == (400, "idempotency_key_invalid")
    assert snapshot(hub) == before
    assert running.post("heartbeat", key="k" * 255).status_code == 200


def test_signature_covers_body_target_and_identity(hub: HubServer, running: Worker) -> None:
    before = snapshot(hub)
    target = f"{PREFIX}/jobs/{running.job}/heartbeat"
    raw = json.dumps({"binding": running.binding, **(running.lease or {})}).encode()
    headers = running.client.headers("POST", target, raw) | {"Content-Type": "application/json", "Idempotency-Key": "x"}
    tampered_body = running.client.http.post(target, content=raw + b" ", headers=headers)
    other_roles = running.client.http.post(
        target, content=raw, headers=headers | {"X-Talaria-Roles": "runtime,platform_admin"}
    )
    other_query = running.client.http.post(target + "?a=1", content=raw, headers=headers)
    for response in (tampered_body, other_roles, other_query):
        assert (response.status_code, code(response)) == (401, "proxy_signature_invalid")
    bad_syntax = running.client.http.post(
        target, content=raw, headers=headers | {"X-Talaria-Principal": "bad principal"}
    )
    assert (bad_syntax.status_code, code(bad_syntax)) == (401, "proxy_identity_invalid")
    bad_stamp = running.client.http.post(target, content=raw, headers=headers | {"X-Talaria-Proxy-Timestamp": "-5"})
    assert code(bad_stamp) == "proxy_identity_invalid"
    assert snapshot(hub) == before
    assert "proxy_signature_invalid" in {row[0] for row in _security_codes(hub)}


def _security_codes(hub: HubServer) -> list[tuple[str, int]]:
    conn = sqlite3.connect(hub.settings.sqlite_path)
    try:
        return conn.execute("SELECT code, suppressed_count FROM security_event ORDER BY occurred_at, id").fetchall()
    finally:
        conn.close()


def test_security_events_are_rate_limited_per_peer_and_code(hub: HubServer, running: Worker) -> None:
    for _ in range(5):
        running.client.http.post(f"{PREFIX}/jobs/{running.job}/start", json={}, headers={"Idempotency-Key": "k"})
    rows = [r for r in _security_codes(hub) if r[0] == "proxy_identity_missing"]
    assert len(rows) == 3  # the setting allows 3 per minute
    hub.clock.advance(60)
    running.client.http.post(f"{PREFIX}/jobs/{running.job}/start", json={}, headers={"Idempotency-Key": "k"})
    rows = [r for r in _security_codes(hub) if r[0] == "proxy_identity_missing"]
    assert len(rows) == 4 and rows[-1][1] == 2  # the next row carries the two suppressed ones


def test_unknown_job_and_other_tenant(hub: HubServer, running: Worker) -> None:
    ghost = Worker.of(hub, "job_missing", running.binding | {"job": "job_missing"}, "worker-a")
    response = ghost.claim()
    assert (response.status_code, code(response)) == (404, "job_not_found")
    stranger = Worker.of(hub, running.job, running.binding | {"tenant": "other"}, "worker-a")
    stranger.client.tenant = "other"
    response = stranger.status()
    assert (response.status_code, code(response)) == (404, "job_not_found")


def test_status_query_rules(hub: HubServer, running: Worker) -> None:
    assert running.status().status_code == 200
    partial = {k: v for k, v in running.binding.items() if k != "cell"}
    response = running.client.request("GET", f"/jobs/{running.job}", query=partial)
    assert (response.status_code, code(response)) == (400, "invalid_request")
    extra = running.client.request("GET", f"/jobs/{running.job}", query=running.binding | {"x": "1"})
    assert code(extra) == "invalid_request"
    target = f"{PREFIX}/jobs/{running.job}?" + "&".join(f"{k}={v}" for k, v in running.binding.items()) + "&job=x"
    doubled = running.client.http.get(target, headers=running.client.headers("GET", target, b""))
    assert (doubled.status_code, code(doubled)) == (400, "invalid_request")


def test_discovery_rules(hub: HubServer, running: Worker) -> None:
    queued, _ = dispatched_job(hub)
    listed = running.client.discover("local", "default").json()["jobs"]
    assert [j["binding"]["job"] for j in listed] == [queued]
    assert listed[0]["binding"]["principal"] == "worker-a"
    for state, status, expected in (("LEASED", 403, "role_forbidden"), ("DONE", 400, "invalid_request")):
        response = running.client.discover("local", "default", state=state)
        assert (response.status_code, code(response)) == (status, expected)
    admin = Worker.of(hub, running.job, running.binding, "ops", roles="platform_admin")
    leased = admin.client.discover("local", "default", state="RUNNING").json()["jobs"]
    assert [j["binding"]["job"] for j in leased] == [running.job]
    for limit in ("0", "101", "x"):
        response = running.client.request(
            "GET",
            "/jobs",
            query={"tenant": "default", "cell": "local", "profile": "default", "state": "QUEUED", "limit": limit},
        )
        assert code(response) == "invalid_request", limit
    other = running.client.request(
        "GET", "/jobs", query={"tenant": "t2", "cell": "local", "profile": "default", "state": "QUEUED"}
    )
    assert (other.status_code, code(other)) == (403, "binding_mismatch")


def test_wrong_method_and_unknown_route(hub: HubServer, running: Worker) -> None:
    wrong = running.client.request("GET", f"/jobs/{running.job}/claim")
    assert (wrong.status_code, code(wrong)) == (405, "method_not_allowed")
    unknown = running.client.request("POST", f"/jobs/{running.job}/explode", body={})
    assert (unknown.status_code, code(unknown)) == (404, "not_found")


def test_admin_cancel_needs_platform_admin_and_holder_cancel_needs_runtime(hub: HubServer, running: Worker) -> None:
    before = snapshot(hub)
    response = running.post("cancel", {"reason": "r"}, lease=False)
    assert (response.status_code, code(response)) == (403, "role_forbidden")
    admin = Worker.of(hub, running.job, running.binding, "ops", roles="platform_admin")
    admin.lease = running.lease
    response = admin.cancel()
    assert (response.status_code, code(response)) == (403, "role_forbidden")
    half = running.post("cancel", {"reason": "r", "lease_id": running.lease["lease_id"]}, lease=False)  # type: ignore[index]
    assert code(half) == "invalid_request"
    assert snapshot(hub) == before


def test_reconcile_rejected_rolls_back_the_terminal_transition(hub: HubServer, running: Worker) -> None:
    conn = sqlite3.connect(hub.settings.sqlite_path)
    conn.execute("UPDATE dispatch SET status = 'FAILED' WHERE id = ?", (running.binding["dispatch"],))
    conn.commit()
    conn.close()
    response = running.complete()
    assert (response.status_code, code(response)) == (409, "reconcile_rejected")
    assert job_row(hub, running.job)["state"] == "RUNNING"
    assert count(hub, "SELECT count(*) FROM hermes_result") == 0


def test_unexpected_errors_answer_500_and_roll_back(hub: HubServer, running: Worker) -> None:
    def explode(query: str) -> None:
        if query == "result_insert":
            raise RuntimeError("bug (injected)")

    hub.hub.store.fault_hook = explode  # type: ignore[attr-defined]
    response = running.complete()
    hub.hub.store.fault_hook = None  # type: ignore[attr-defined]
    assert (response.status_code, code(response)) == (500, "internal_error")
    assert job_row(hub, running.job)["state"] == "RUNNING"
    assert running.complete().status_code == 200
