"""The canonical error shape, body limits and the operations routes over a real hub (web-api.md 1 and 7)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import PASSWORD
from tests.integration.web_support import (
    JSON_TYPE,
    MIB,
    TASK,
    Web,
    all_tasks,
    assert_error,
    audit_events,
    create_task,
)

pytestmark = pytest.mark.usefixtures("fast_argon2")


# --- errors (web-api.md 1) ------------------------------------------------------------------------------------


def test_unknown_path_is_the_canonical_404(web: Web) -> None:
    for path in ("/nope", "/api/nope", "/api/tasks/x/unknown", "/api/runner", "/api/admin"):
        response = web.user.get(path)
        assert response.status_code == 404, path
        assert response.headers["content-type"].split(";")[0] == "application/json"
        assert response.json() == {"code": "not_found", "error": "not found"}
        assert_error(web.anon().post(path, json={}), 404, "not_found")


def test_wrong_method_is_405(web: Web) -> None:
    for method, path in (
        ("DELETE", "/api/tasks"),
        ("PUT", "/api/tasks/x"),
        ("GET", "/api/auth/logout"),
        ("PATCH", "/api/jobs"),
        ("GET", "/api/tasks/x/approve"),
        ("DELETE", "/api/admin/accounts/uma"),
    ):
        assert_error(web.user.request(method, path), 405, "method_not_allowed")
    assert len(web.admin.get("/api/admin/accounts").json()["accounts"]) == 3


def test_non_json_body_is_400(web: Web) -> None:
    before = all_tasks(web)
    assert_error(web.user.post("/api/tasks", content=b"title=x", headers=JSON_TYPE), 400, "invalid_request")
    assert_error(web.user.post("/api/tasks", content=b'{"title": "x",', headers=JSON_TYPE), 400, "invalid_request")
    text = {"content-type": "text/plain"}
    assert_error(web.user.post("/api/tasks", content=json.dumps(TASK), headers=text), 400, "invalid_request")
    assert_error(web.anon().post("/api/auth/login", content=b"uma:pw", headers=JSON_TYPE), 400, "invalid_request")
    assert all_tasks(web) == before


def test_json_array_or_scalar_body_is_400(web: Web) -> None:
    assert_error(web.user.post("/api/tasks", json=[TASK]), 400, "invalid_request")
    assert_error(web.user.post("/api/tasks", json="task"), 400, "invalid_request")
    assert_error(web.user.post("/api/tasks", content=b"null", headers=JSON_TYPE), 400, "invalid_request")
    login_body = [{"username": "uma", "password": PASSWORD}]
    assert_error(web.anon().post("/api/auth/login", json=login_body), 400, "invalid_request")
    assert all_tasks(web) == []


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    while total > 0:
        yield b" " * min(size, total)
        total -= size


def test_body_over_1_mib_is_413_when_streamed(web: Web) -> None:
    response = web.user.post("/api/tasks", content=_chunks(MIB + 1), headers=JSON_TYPE)
    assert_error(response, 413, "payload_too_large")
    assert all_tasks(web) == []


def test_body_over_1_mib_is_413_with_a_content_length(web: Web) -> None:
    body = json.dumps(TASK | {"prompt": "x" * 100}).encode()
    body += b" " * (MIB + 1 - len(body))
    assert len(body) == MIB + 1
    try:
        response = web.user.post("/api/tasks", content=body, headers=JSON_TYPE)
    except httpx.TransportError as exc:  # the answer never reached the client
        pytest.fail(f"POST /api/tasks with Content-Length {MIB + 1}: no 413 answer, {exc!r}")
    assert_error(response, 413, "payload_too_large")
    assert all_tasks(web) == []


def test_a_streamed_body_whose_valid_json_prefix_fits_is_refused_without_acting(web: Web) -> None:
    """A chunked body that parses from its first MiB (JSON then spaces) must not run the route."""

    def valid_then_padding() -> Iterator[bytes]:
        yield json.dumps(TASK).encode()
        yield from _chunks(MIB + 64 * 1024)

    response = web.user.post("/api/tasks", content=valid_then_padding(), headers=JSON_TYPE)
    assert_error(response, 413, "payload_too_large")
    assert all_tasks(web) == []


def test_anonymous_requests_are_401_before_their_body_is_read(web: Web) -> None:
    for body in (b"{", b"[]", json.dumps(TASK | {"extra": 1}).encode()):
        assert_error(web.anon().post("/api/tasks", content=body, headers=JSON_TYPE), 401, "unauthenticated")
    no_token = web.login("uma")
    del no_token.headers["X-CSRF-Token"]
    assert_error(no_token.post("/api/tasks", content=b"{", headers=JSON_TYPE), 403, "csrf_failed")
    assert_error(web.user.post("/api/admin/accounts", content=b"{", headers=JSON_TYPE), 403, "admin_required")


def test_exactly_1_mib_is_not_refused_for_its_size(web: Web) -> None:
    head = json.dumps(TASK | {"prompt": ""}).encode()
    body = head.replace(b'"prompt": ""', b'"prompt": "' + b"p" * (MIB - len(head)) + b'"')
    assert len(body) == MIB
    response = web.user.post("/api/tasks", content=body, headers=JSON_TYPE)
    assert_error(response, 400, "invalid_request")  # the prompt is over 200,000 characters, the size is fine
    assert all_tasks(web) == []


def test_refused_requests_change_nothing(web: Web) -> None:
    create_task(web.user)
    tasks, events = all_tasks(web), audit_events(web)
    no_token = web.login("uma")
    del no_token.headers["X-CSRF-Token"]
    refused = [
        web.user.post("/api/tasks", content=_chunks(MIB + 100), headers=JSON_TYPE),
        web.user.post("/api/tasks", content=b"{", headers=JSON_TYPE),
        web.user.post("/api/tasks", json=TASK | {"title": "t" * 201}),
        web.user.post("/api/tasks", json=TASK | {"extra": 1}),
        no_token.post("/api/tasks", json=TASK),
        web.anon().post("/api/tasks", json=TASK),
    ]
    assert [r.status_code for r in refused] == [413, 400, 400, 400, 403, 401]
    for response in refused:
        assert set(response.json()) == {"code", "error"}
    assert all_tasks(web) == tasks
    assert audit_events(web) == events


# --- operations (web-api.md 7) --------------------------------------------------------------------------------


def test_healthz_and_readyz(web: Web) -> None:
    client = web.anon()
    health = client.get("/healthz")
    assert health.status_code == 200
    assert health.json() == {"ok": True}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ok": True}


def test_metrics_from_loopback_is_prometheus_text(web: Web) -> None:
    web.anon().get("/api/auth/me")
    response = web.anon().get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "talaria_http_requests" in response.text
    assert re.search(r'^talaria_http_requests_total\{door="api",status="401"\} [1-9]', response.text, re.M)


def test_openapi_lists_the_web_api(web: Web) -> None:
    response = web.anon().get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    expected = {
        "/api/auth/login": {"post"},
        "/api/auth/logout": {"post"},
        "/api/auth/me": {"get"},
        "/api/admin/accounts": {"get", "post"},
        "/api/admin/accounts/{username}": {"patch"},
        "/api/tasks": {"get", "post"},
        "/api/tasks/{task_id}": {"get"},
        "/api/tasks/{task_id}/submit": {"post"},
        "/api/tasks/{task_id}/approve": {"post"},
        "/api/tasks/{task_id}/reject": {"post"},
        "/api/tasks/{task_id}/cancel": {"post"},
        "/api/jobs": {"get"},
        "/api/jobs/{job_id}": {"get"},
        "/api/jobs/{job_id}/cancel": {"post"},
        "/api/audit": {"get"},
        "/api/audit/verify": {"get"},
        "/healthz": {"get"},
        "/readyz": {"get"},
    }
    for path, methods in expected.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, paths[path])
