"""Issue 12 over a real hub in a thread: the headers of every API answer, HEAD, the browser's 404 page and the
message for a body that is not JSON (web-api.md 9)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from talaria.testing.hub_server import HubServer
from talaria.testing.runtime_client import RuntimeClient
from tests.conftest import PROXY_SECRET
from tests.integration.web_support import JSON_TYPE, Web, assert_error

NOT_JSON = "request body is not valid JSON"
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


pytestmark = pytest.mark.usefixtures("fast_argon2")


def _api_headers(response: httpx.Response) -> None:
    where = f"{response.request.method} {response.request.url.path} -> {response.status_code}"
    assert response.headers.get("cache-control") == "no-store", where
    assert response.headers.get("x-content-type-options") == "nosniff", where


# --- item 9: Cache-Control: no-store and nosniff on every API answer; nosniff on static files ------------------


def test_every_api_answer_carries_no_store_and_nosniff(web: Web) -> None:
    anon = web.anon(headers={"Origin": web.server.url})
    login = anon.post("/api/auth/login", json={"username": "uma", "password": "correct horse battery staple"})
    assert login.status_code == 200
    _api_headers(login)
    user = web.user
    for response in (
        user.get("/api/auth/me"),
        web.admin.get("/api/admin/accounts"),
        user.get("/api/tasks"),
        user.get("/api/jobs"),
        user.get("/api/sources"),
        web.admin.get("/api/admin/runners"),
        user.get("/api/nope"),  # the framework's 404
        user.request("DELETE", "/api/tasks"),  # the framework's 405
        user.post("/api/tasks", content=b"{", headers=JSON_TYPE),  # validation
        web.anon().get("/api/auth/me"),  # 401
    ):
        _api_headers(response)


def test_runtime_api_answers_carry_no_store_and_nosniff(runtime_hub: HubServer) -> None:
    """Well-formed Runtime API requests are served in front of FastAPI (ADR 0027); they get the same headers."""
    worker = RuntimeClient(runtime_hub.url, PROXY_SECRET, principal="w", roles="runtime", clock=runtime_hub.clock)
    try:
        discovered = worker.discover("local", "default")  # a signed, successful answer of the door
        assert discovered.status_code == 200, discovered.text
        _api_headers(discovered)
    finally:
        worker.close()
    with runtime_hub.client() as client:
        for response in (
            client.get("/internal/runtime/v1/hermes/jobs", params={"cell": "local", "profile": "default"}),  # 401
            client.post("/internal/runtime/v1/hermes/jobs/job_x/claim", json={}),  # 401, the door's own path
            client.get("/internal/runtime/v1/hermes/nope"),  # 404 through FastAPI
        ):
            assert response.status_code in (401, 404), response.text
            _api_headers(response)


def test_runner_machine_api_answers_carry_no_store_and_nosniff(web: Web) -> None:
    client = web.anon()
    for response in (
        client.get(f"/api/runner/v1/{uuid.uuid4()}/poll"),  # 403 runner_unauthorized
        client.get("/api/runner/v1/nope/poll"),  # 404
    ):
        _api_headers(response)


def test_static_files_carry_nosniff(web: Web) -> None:
    for path in ("/static/app.js", "/static/app.css"):
        response = web.anon().get(path)
        assert response.status_code == 200, path
        assert response.headers.get("x-content-type-options") == "nosniff", path


# --- item 14: HEAD like GET without a body --------------------------------------------------------------------


def test_head_answers_like_get_without_a_body_on_health_readiness_and_pages(web: Web) -> None:
    for client, path in (
        (web.anon(), "/healthz"),
        (web.anon(), "/readyz"),
        (web.anon(), "/login"),
        (web.user, "/tasks"),
        (web.admin, "/settings/accounts"),
        (web.anon(), "/static/app.css"),
    ):
        got = client.get(path)
        head = client.head(path)
        assert head.status_code == got.status_code == 200, (path, head.status_code, head.text)
        assert head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
    # a page that redirects on GET redirects on HEAD
    assert web.anon().head("/tasks").status_code == 303


def test_head_on_api_routes_keeps_answering_405(web: Web) -> None:
    response = web.user.head("/api/tasks")
    assert response.status_code == 405


# --- item 15: the HTML 404 page for browsers --------------------------------------------------------------------


def test_an_unknown_path_asked_for_by_a_browser_is_the_html_404_page(web: Web) -> None:
    for client in (web.anon(), web.user):
        response = client.get("/no/such/page", headers=BROWSER)
        assert response.status_code == 404
        assert response.headers["content-type"] == "text/html; charset=utf-8"
        assert "<html" in response.text and "not_found" in response.text
        assert response.headers["x-content-type-options"] == "nosniff"


def test_api_clients_and_api_paths_keep_the_json_404(web: Web) -> None:
    assert web.anon().get("/no/such/page").json() == {"code": "not_found", "error": "not found"}
    assert web.anon().get("/no/such/page", headers={"Accept": "application/json"}).json()["code"] == "not_found"
    api = web.anon().get("/api/nope", headers=BROWSER)
    assert_error(api, 404, "not_found")
    runtime = web.anon().get("/internal/runtime/v1/hermes/jobs", headers=BROWSER)  # the Runtime API is off
    assert runtime.content == b'{"code":"not_found","error":"not found"}'


# --- item 17: a body that is not JSON ---------------------------------------------------------------------------


def test_invalid_json_says_the_request_body_is_not_valid_json(web: Web) -> None:
    for client, path in (
        (web.user, "/api/tasks"),
        (web.admin, "/api/admin/accounts"),
        (web.anon(), "/api/auth/login"),
        (web.admin, "/api/admin/runners"),
    ):
        body = assert_error(client.post(path, content=b'{"title": "x",', headers=JSON_TYPE), 400, "invalid_request")
        assert body["error"] == NOT_JSON, (path, body)
