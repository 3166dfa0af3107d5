"""People change their own password (web-api.md 9, issue 12 item 11): ``POST /api/auth/password``."""

from __future__ import annotations

import pytest

from talaria.accounts.passwords import verify_password
from talaria.limits import LOGIN_MAX_FAILURES
from tests.conftest import PASSWORD
from tests.integration.web_support import Web, assert_error

NEW = "a brand new and long password"


pytestmark = pytest.mark.usefixtures("fast_argon2")


def test_changing_one_s_password_keeps_this_session_and_ends_the_others(web: Web) -> None:
    here, elsewhere = web.login("uma"), web.login("uma")
    before = web.server.hub.accounts.get("uma")
    assert before is not None
    changed = here.post("/api/auth/password", json={"currentPassword": PASSWORD, "newPassword": NEW})
    assert changed.status_code == 200, changed.text
    assert changed.json() == {"ok": True}
    after = web.server.hub.accounts.get("uma")
    assert after is not None and after.auth_version == before.auth_version + 1
    assert here.get("/api/auth/me").status_code == 200, "the session that changed it goes on"
    assert_error(elsewhere.get("/api/auth/me"), 401, "unauthenticated")
    old = web.anon(headers={"Origin": web.server.url}).post(
        "/api/auth/login", json={"username": "uma", "password": PASSWORD}
    )
    assert_error(old, 401, "invalid_credentials")
    assert web.login("uma", NEW).get("/api/auth/me").json()["username"] == "uma"


def test_a_wrong_current_password_is_401_counts_for_throttling_and_changes_nothing(web: Web) -> None:
    client = web.login("uma")
    for _ in range(LOGIN_MAX_FAILURES):
        wrong = client.post("/api/auth/password", json={"currentPassword": "not my password", "newPassword": NEW})
        assert_error(wrong, 401, "invalid_credentials")
    throttled = client.post("/api/auth/password", json={"currentPassword": PASSWORD, "newPassword": NEW})
    assert_error(throttled, 429, "login_throttled")
    assert throttled.headers["retry-after"]
    assert client.get("/api/auth/me").status_code == 200, "a wrong current password does not sign out"
    stored = web.server.hub.accounts.password_hash("uma")
    assert stored is not None and verify_password(stored, PASSWORD), "nothing changed"


def test_the_new_password_follows_the_rule_and_the_body_is_strict(web: Web) -> None:
    client = web.login("uma")
    weak = client.post("/api/auth/password", json={"currentPassword": PASSWORD, "newPassword": "short"})
    assert_error(weak, 400, "weak_password")
    for body in ({"currentPassword": PASSWORD}, {"newPassword": NEW}, {"currentPassword": PASSWORD,
                 "newPassword": NEW, "username": "ada"}, {"currentPassword": 1, "newPassword": NEW}):  # fmt: skip
        assert_error(client.post("/api/auth/password", json=body), 400, "invalid_request", body)
    assert web.login("uma", PASSWORD)


def test_the_password_route_needs_a_session_and_the_csrf_token(web: Web) -> None:
    body = {"currentPassword": PASSWORD, "newPassword": NEW}
    assert_error(web.anon(headers={"Origin": web.server.url}).post("/api/auth/password", json=body), 401,
                 "unauthenticated")  # fmt: skip
    client = web.login("uma")
    del client.headers["X-CSRF-Token"]
    assert_error(client.post("/api/auth/password", json=body), 403, "csrf_failed")
    assert web.login("uma", PASSWORD)
