"""The web API over a real hub (web-api.md 2): sessions, CSRF and Origin; and the helpers the other web API
test files share live in web_support.py.

Other files: test_web_throttle.py (login throttling), test_web_errors.py (error shape, body limits, operations),
test_web_accounts.py (web-api.md 3), test_web_tasks.py (5), test_web_jobs.py (6: jobs and audit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from talaria.clock import ManualClock
from talaria.testing.hub_server import HubServer
from tests.conftest import PASSWORD
from tests.integration.web_support import (
    FOREIGN_ORIGIN,
    TASK,
    Web,
    all_tasks,
    assert_error,
    audit_events,
    create_task,
    dispatched,
    submitted_task,
)

pytestmark = pytest.mark.usefixtures("fast_argon2")


def session_cookie(response: httpx.Response) -> list[str]:
    """The attributes of the ``talaria_session`` Set-Cookie header, the first item being ``name=value``."""
    cookies = [c for c in response.headers.get_list("set-cookie") if c.startswith("talaria_session=")]
    assert len(cookies) == 1, response.headers
    return [part.strip() for part in cookies[0].split(";")]


# --- sessions (web-api.md 2) ----------------------------------------------------------------------------------


def test_login_answers_the_account_and_a_csrf_token(web: Web) -> None:
    client = web.anon(headers={"Origin": web.server.url})
    response = client.post("/api/auth/login", json={"username": "ada", "password": PASSWORD})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"username", "role", "tenant", "csrfToken"}
    assert body["username"] == "ada"
    assert body["role"] == "admin"
    assert body["tenant"] == "default"
    assert isinstance(body["csrfToken"], str)
    assert len(body["csrfToken"]) >= 16


def test_login_sets_an_http_only_lax_session_cookie_without_secure_on_http(web: Web) -> None:
    response = web.peer("127.0.0.1").post("/api/auth/login", json={"username": "uma", "password": PASSWORD})
    assert response.status_code == 200, response.text
    parts = session_cookie(response)
    value = parts[0].split("=", 1)[1]
    attributes = {p.split("=", 1)[0].lower(): (p.split("=", 1)[1] if "=" in p else True) for p in parts[1:]}
    assert value
    assert response.json()["csrfToken"] not in value
    assert attributes.get("httponly") is True
    assert str(attributes.get("samesite", "")).lower() == "lax"
    assert attributes.get("path") == "/"
    assert "secure" not in attributes


def test_each_login_gets_its_own_session_and_csrf_token(web: Web) -> None:
    first = web.login("uma")
    second = web.login("uma")
    assert first.headers["X-CSRF-Token"] != second.headers["X-CSRF-Token"]
    assert first.cookies.get("talaria_session") != second.cookies.get("talaria_session")
    # Each session only accepts its own token.
    first.headers["X-CSRF-Token"] = second.headers["X-CSRF-Token"]
    assert_error(first.post("/api/tasks", json=TASK), 403, "csrf_failed")
    assert second.post("/api/tasks", json=TASK).status_code == 201


def test_wrong_password_and_unknown_user_get_the_same_401(web: Web) -> None:
    wrong = web.attempt("uma", "not the password at all", peer="127.0.0.2")
    unknown = web.attempt("nobody", "not the password at all", peer="127.0.0.3")
    assert_error(wrong, 401, "invalid_credentials")
    assert_error(unknown, 401, "invalid_credentials")
    assert wrong.content == unknown.content
    assert "set-cookie" not in wrong.headers
    assert "set-cookie" not in unknown.headers


def test_disabled_account_cannot_log_in(web: Web) -> None:
    response = web.admin.patch("/api/admin/accounts/uma", json={"enabled": False})
    assert response.status_code == 200, response.text
    refused = web.attempt("uma", PASSWORD)
    assert_error(refused, 401, "invalid_credentials")
    assert "set-cookie" not in refused.headers
    assert refused.content == web.attempt("nobody", PASSWORD, peer="127.0.0.2").content


def test_me_answers_the_signed_in_account(web: Web) -> None:
    response = web.user.get("/api/auth/me")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "username": "uma",
        "role": "user",
        "tenant": "default",
        "csrfToken": web.user.headers["X-CSRF-Token"],
    }


def test_me_without_a_valid_session_is_unauthenticated(web: Web) -> None:
    assert_error(web.anon().get("/api/auth/me"), 401, "unauthenticated")
    forged = web.anon(cookies={"talaria_session": "made-up.signature"})
    assert_error(forged.get("/api/auth/me"), 401, "unauthenticated")
    # A real cookie value with one character changed fails the signature. (Not the last character: its
    # low base64 bits are padding, so some changes there decode to the very same signature bytes.)
    real = web.user.cookies["talaria_session"]
    cut = real.rindex(".") + 1
    tampered = real[:cut] + ("A" if real[cut] != "A" else "B") + real[cut + 1 :]
    assert_error(web.anon(cookies={"talaria_session": tampered}).get("/api/auth/me"), 401, "unauthenticated")


def test_logout_ends_the_session_on_the_server(web: Web) -> None:
    cookie = web.user.cookies["talaria_session"]
    response = web.user.post("/api/auth/logout")
    assert response.status_code == 200, response.text
    assert response.json() == {"ok": True}
    assert_error(web.user.get("/api/auth/me"), 401, "unauthenticated")
    # Replaying the old cookie does not bring the session back: it ended in the store.
    replay = web.anon(cookies={"talaria_session": cookie})
    assert_error(replay.get("/api/auth/me"), 401, "unauthenticated")
    # Other sessions are untouched.
    assert web.other.get("/api/auth/me").status_code == 200


def test_session_expires_after_12_hours_idle(web: Web, clock: ManualClock) -> None:
    assert web.user.get("/api/auth/me").status_code == 200
    clock.advance(11 * 3600 + 59 * 60)
    assert web.user.get("/api/auth/me").status_code == 200
    # Activity moves the idle deadline: almost 24 h after login, still signed in.
    clock.advance(11 * 3600 + 59 * 60)
    assert web.user.get("/api/auth/me").status_code == 200
    clock.advance(12 * 3600 + 1)
    assert_error(web.user.get("/api/auth/me"), 401, "unauthenticated")
    assert_error(web.user.post("/api/tasks", json=TASK), 401, "unauthenticated")


def test_session_ends_7_days_after_login_even_when_active(web: Web, clock: ManualClock) -> None:
    assert web.user.get("/api/auth/me").status_code == 200
    for _ in range(27):  # 162 hours, a request every 6 hours
        clock.advance(6 * 3600)
        assert web.user.get("/api/auth/me").status_code == 200
    clock.advance(5 * 3600 + 58 * 60)  # 7 days less 2 minutes
    assert web.user.get("/api/auth/me").status_code == 200
    clock.advance(3 * 60)  # 7 days and a minute
    assert_error(web.user.get("/api/auth/me"), 401, "unauthenticated")
    # A new sign-in works.
    assert web.login("uma").get("/api/auth/me").status_code == 200


def test_disabling_an_account_ends_its_sessions_at_once(web: Web) -> None:
    second = web.login("uma")
    assert web.user.get("/api/auth/me").status_code == 200
    response = web.admin.patch("/api/admin/accounts/uma", json={"enabled": False})
    assert response.status_code == 200, response.text
    assert response.json()["account"]["enabled"] is False
    assert_error(web.user.get("/api/auth/me"), 401, "unauthenticated")
    assert_error(second.get("/api/tasks"), 401, "unauthenticated")
    assert_error(web.user.post("/api/tasks", json=TASK), 401, "unauthenticated")
    # Enabling it again does not revive the ended sessions.
    assert web.admin.patch("/api/admin/accounts/uma", json={"enabled": True}).status_code == 200
    assert_error(web.user.get("/api/auth/me"), 401, "unauthenticated")
    assert web.login("uma").get("/api/auth/me").status_code == 200
    # The admin's own session is untouched.
    assert web.admin.get("/api/auth/me").status_code == 200


# --- CSRF and Origin (web-api.md 2) ---------------------------------------------------------------------------


def state_changing_routes(web: Web) -> list[tuple[str, str, Any]]:
    """Every state-changing web route, with real ids and valid bodies, so only CSRF or Origin can refuse them."""
    pending = submitted_task(web.user)
    job = dispatched(web)["job"]
    return [
        ("POST", "/api/auth/logout", None),
        ("POST", "/api/admin/accounts", {"username": "newbie", "password": PASSWORD, "role": "user"}),
        ("PATCH", "/api/admin/accounts/uma", {"canManageTeam": True}),
        ("POST", "/api/tasks", TASK),
        ("POST", f"/api/tasks/{create_task(web.admin)['id']}/submit", None),
        ("POST", f"/api/tasks/{pending['id']}/approve", None),
        ("POST", f"/api/tasks/{pending['id']}/reject", {"reason": "no"}),
        ("POST", f"/api/tasks/{pending['id']}/cancel", {"reason": "no"}),
        ("POST", f"/api/jobs/{job['id']}/cancel", {"reason": "no"}),
    ]


def _no_token(client: httpx.Client, server: HubServer) -> None:
    del client.headers["X-CSRF-Token"]


def _wrong_token(client: httpx.Client, server: HubServer) -> None:
    client.headers["X-CSRF-Token"] = client.headers["X-CSRF-Token"][::-1]


def _empty_token(client: httpx.Client, server: HubServer) -> None:
    client.headers["X-CSRF-Token"] = ""


def _foreign_origin(client: httpx.Client, server: HubServer) -> None:
    client.headers["Origin"] = FOREIGN_ORIGIN


def _other_port_origin(client: httpx.Client, server: HubServer) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    client.headers["Origin"] = f"http://127.0.0.1:{port + 1}"


def _null_origin(client: httpx.Client, server: HubServer) -> None:
    client.headers["Origin"] = "null"


def _no_origin(client: httpx.Client, server: HubServer) -> None:
    del client.headers["Origin"]


@pytest.mark.parametrize(
    "spoil",
    [_no_token, _wrong_token, _empty_token, _foreign_origin, _other_port_origin, _null_origin, _no_origin],
    ids=lambda f: f.__name__.strip("_"),
)
def test_state_changing_routes_refuse_a_missing_or_wrong_csrf_token_or_origin(
    web: Web, spoil: Callable[[httpx.Client, HubServer], None]
) -> None:
    routes = state_changing_routes(web)
    tasks_before = all_tasks(web)
    events_before = audit_events(web)
    client = web.login("ada")
    spoil(client, web.server)
    for method, path, body in routes:
        response = client.request(method, path, json=body)
        assert_error(response, 403, "csrf_failed")
    # Nothing changed: no task, no account change, no audit event, the session is still alive.
    assert all_tasks(web) == tasks_before
    assert audit_events(web) == events_before
    accounts = web.admin.get("/api/admin/accounts").json()["accounts"]
    assert sorted(a["username"] for a in accounts) == ["ada", "ulf", "uma"]
    assert {a["username"]: a["authVersion"] for a in accounts}["uma"] == 1
    assert client.get("/api/auth/me").status_code == 200


def test_html_form_post_with_the_csrf_token_field_passes(web: Web) -> None:
    token = web.user.headers.pop("X-CSRF-Token")
    response = web.user.post("/api/auth/logout", data={"csrf_token": token})
    assert response.status_code == 200, response.text
    assert response.json() == {"ok": True}
    assert_error(web.user.get("/api/auth/me"), 401, "unauthenticated")


def test_form_posts_with_a_wrong_field_or_a_foreign_origin_are_refused(web: Web) -> None:
    client = web.login("uma")
    token = client.headers.pop("X-CSRF-Token")
    assert_error(client.post("/api/auth/logout", data={"csrf_token": token[::-1]}), 403, "csrf_failed")
    assert_error(client.post("/api/auth/logout", data={"token": token}), 403, "csrf_failed")
    # Cross-origin: the right token, posted from another site's form.
    client.headers["Origin"] = FOREIGN_ORIGIN
    assert_error(client.post("/api/auth/logout", data={"csrf_token": token}), 403, "csrf_failed")
    del client.headers["Origin"]
    assert_error(client.post("/api/auth/logout", data={"csrf_token": token}), 403, "csrf_failed")
    client.headers["X-CSRF-Token"] = token
    assert client.get("/api/auth/me").status_code == 200


def test_login_with_a_foreign_origin_is_refused(web: Web) -> None:
    client = web.anon(headers={"Origin": FOREIGN_ORIGIN})
    response = client.post("/api/auth/login", json={"username": "uma", "password": PASSWORD})
    assert_error(response, 403, "csrf_failed")
    assert "set-cookie" not in response.headers


def test_login_without_origin_works(web: Web) -> None:
    client = web.anon()
    response = client.post("/api/auth/login", json={"username": "uma", "password": PASSWORD})
    assert response.status_code == 200, response.text
    assert client.get("/api/auth/me").json()["username"] == "uma"


def test_no_session_is_401_before_the_csrf_and_admin_checks(web: Web) -> None:
    for client in (web.anon(), web.anon(headers={"Origin": FOREIGN_ORIGIN, "X-CSRF-Token": "x"})):
        assert_error(client.post("/api/tasks", json=TASK), 401, "unauthenticated")
        assert_error(client.post("/api/admin/accounts", json={}), 401, "unauthenticated")
        assert_error(client.patch("/api/admin/accounts/uma", json={"enabled": False}), 401, "unauthenticated")
        assert_error(client.get("/api/admin/accounts"), 401, "unauthenticated")


def test_user_on_an_admin_route_with_good_csrf_is_admin_required(web: Web) -> None:
    body = {"username": "newbie", "password": PASSWORD, "role": "admin"}
    assert_error(web.user.post("/api/admin/accounts", json=body), 403, "admin_required")
    assert_error(web.user.patch("/api/admin/accounts/uma", json={"role": "admin"}), 403, "admin_required")
    assert_error(web.user.get("/api/admin/accounts"), 403, "admin_required")
    assert_error(web.user.get("/api/audit/verify"), 403, "admin_required")
    accounts = web.admin.get("/api/admin/accounts").json()["accounts"]
    assert "newbie" not in {a["username"] for a in accounts}
    assert web.user.get("/api/auth/me").json()["role"] == "user"


def test_user_on_an_admin_route_without_csrf_is_csrf_failed(web: Web) -> None:
    client = web.login("uma")
    del client.headers["X-CSRF-Token"]
    body = {"username": "newbie", "password": PASSWORD, "role": "admin"}
    assert_error(client.post("/api/admin/accounts", json=body), 403, "csrf_failed")
    assert_error(client.patch("/api/admin/accounts/uma", json={"role": "admin"}), 403, "csrf_failed")
