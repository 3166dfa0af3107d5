"""Admin account routes over a real hub (web-api.md 3)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from talaria.clock import ManualClock
from tests.conftest import PASSWORD, add_account
from tests.integration.web_support import TASK, Web, assert_error, dispatched

ACCOUNT_KEYS = {"username", "tenant", "role", "enabled", "allowedProfiles", "canManageTeam", "authVersion", "createdAt"}


pytestmark = pytest.mark.usefixtures("fast_argon2")


def new_account(username: Any = "newbie", **fields: Any) -> dict[str, Any]:
    return {"username": username, "password": PASSWORD, "role": "user"} | fields


def account_of(web: Web, username: str) -> dict[str, Any]:
    for account in web.admin.get("/api/admin/accounts", params={"limit": 100}).json()["accounts"]:
        if account["username"] == username:
            return dict(account)
    raise AssertionError(f"no account {username}")


def test_list_accounts_answers_every_account_of_the_tenant(web: Web) -> None:
    response = web.admin.get("/api/admin/accounts")
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"accounts", "nextCursor"}
    assert body["nextCursor"] is None
    assert sorted(a["username"] for a in body["accounts"]) == ["ada", "ulf", "uma"]
    for account in body["accounts"]:
        assert set(account) == ACCOUNT_KEYS
    ada = account_of(web, "ada")
    assert ada["role"] == "admin"
    assert ada["enabled"] is True
    assert ada["tenant"] == "default"


def test_create_account_answers_201_with_the_account(web: Web, clock: ManualClock) -> None:
    body = new_account(allowedProfiles={"local": ["default", "research", "default"]}, canManageTeam=True)
    response = web.admin.post("/api/admin/accounts", json=body)
    assert response.status_code == 201, response.text
    assert response.json() == {
        "account": {
            "username": "newbie",
            "tenant": "default",
            "role": "user",
            "enabled": True,
            "allowedProfiles": {"local": ["default", "research"]},
            "canManageTeam": True,
            "authVersion": 1,
            "createdAt": clock.now_ms(),
        }
    }
    assert "password" not in response.text
    assert PASSWORD not in response.text
    assert account_of(web, "newbie") == response.json()["account"]
    # The new account signs in with its password.
    assert web.login("newbie").get("/api/auth/me").json()["role"] == "user"


def test_create_account_defaults(web: Web) -> None:
    response = web.admin.post("/api/admin/accounts", json=new_account(role="admin"))
    assert response.status_code == 201, response.text
    account = response.json()["account"]
    assert account["role"] == "admin"
    assert account["allowedProfiles"] == {}
    assert account["canManageTeam"] is False


def test_create_an_existing_account_is_409(web: Web) -> None:
    assert_error(web.admin.post("/api/admin/accounts", json=new_account("uma")), 409, "account_exists")
    assert_error(web.admin.post("/api/admin/accounts", json=new_account("ada", role="admin")), 409, "account_exists")
    assert account_of(web, "uma")["role"] == "user"


def test_usernames_of_1_to_64_allowed_characters_are_accepted(web: Web) -> None:
    for username in ("a", "a" * 64, "x.y_z-0", "0"):
        response = web.admin.post("/api/admin/accounts", json=new_account(username))
        assert response.status_code == 201, (username, response.text)
        assert response.json()["account"]["username"] == username


def test_bad_usernames_are_400(web: Web) -> None:
    bad = ("Alice", "a" * 65, "", "with space", "ümlaut", "a/b", "a@b", ".", "..", ".hidden", "-dash", "_under")
    for username in bad:
        response = web.admin.post("/api/admin/accounts", json=new_account(username))
        body = assert_error(response, 400, "invalid_request", username)
        assert "username" in body["error"], body
    assert len(web.admin.get("/api/admin/accounts").json()["accounts"]) == 3


def test_the_last_enabled_admin_of_a_tenant_cannot_disable_or_demote_itself(web: Web) -> None:
    for change in ({"enabled": False}, {"role": "user"}):
        refused = web.admin.patch("/api/admin/accounts/ada", json=change)
        assert_error(refused, 409, "last_admin", change)
    assert account_of(web, "ada")["enabled"] is True and account_of(web, "ada")["role"] == "admin"
    assert account_of(web, "ada")["authVersion"] == 1  # nothing changed
    promoted = web.admin.patch("/api/admin/accounts/ulf", json={"role": "admin"})
    assert promoted.status_code == 200, promoted.text
    assert web.admin.patch("/api/admin/accounts/ada", json={"role": "user"}).status_code == 200  # ulf remains


def test_passwords_of_12_to_1024_characters_are_accepted(web: Web) -> None:
    for length in (12, 1024):
        password = "p" * length
        response = web.admin.post("/api/admin/accounts", json=new_account(f"len{length}", password=password))
        assert response.status_code == 201, response.text
        assert web.login(f"len{length}", password).get("/api/auth/me").status_code == 200


def test_passwords_outside_12_to_1024_characters_are_weak(web: Web) -> None:
    for length in (0, 11, 1025):
        response = web.admin.post("/api/admin/accounts", json=new_account(password="p" * length))
        assert_error(response, 400, "weak_password", length)
    assert "newbie" not in {a["username"] for a in web.admin.get("/api/admin/accounts").json()["accounts"]}


def test_patching_a_weak_password_is_refused(web: Web) -> None:
    assert_error(web.admin.patch("/api/admin/accounts/uma", json={"password": "p" * 11}), 400, "weak_password")
    assert_error(web.admin.patch("/api/admin/accounts/uma", json={"password": "p" * 1025}), 400, "weak_password")
    assert account_of(web, "uma")["authVersion"] == 1
    assert web.user.get("/api/auth/me").status_code == 200


BAD_NEW_ACCOUNTS = [
    new_account(extra=1),
    new_account(role="root"),
    new_account(role=None),
    new_account(canManageTeam="yes"),
    new_account(canManageTeam=1),
    new_account(allowedProfiles=["local"]),
    new_account(allowedProfiles={"local": "default"}),
    new_account(allowedProfiles={"Bad Source": ["default"]}),
    new_account(allowedProfiles={"local": ["bad profile"]}),
    {"username": "newbie", "password": PASSWORD},
    {"username": "newbie", "role": "user"},
    {"password": PASSWORD, "role": "user"},
    new_account(username=7),
    new_account(password=123456789012345),
]


def test_create_account_with_an_unknown_missing_or_mistyped_field_is_400(web: Web) -> None:
    for body in BAD_NEW_ACCOUNTS:
        assert_error(web.admin.post("/api/admin/accounts", json=body), 400, "invalid_request", body)
    assert len(web.admin.get("/api/admin/accounts").json()["accounts"]) == 3


def test_every_patch_bumps_auth_version_by_exactly_one(web: Web) -> None:
    changes: list[dict[str, Any]] = [
        {"canManageTeam": True},
        {"allowedProfiles": {"local": ["default"]}},
        {"role": "admin"},
        {"role": "user"},
        {"enabled": False},
        {"enabled": True},
        {"password": "a new long password"},
        {"allowedProfiles": {"local": ["default"]}, "canManageTeam": False},
    ]
    version = account_of(web, "uma")["authVersion"]
    assert version == 1
    for change in changes:
        response = web.admin.patch("/api/admin/accounts/uma", json=change)
        assert response.status_code == 200, (change, response.text)
        account = response.json()["account"]
        assert set(account) == ACCOUNT_KEYS
        assert account["authVersion"] == version + 1, change
        version = account["authVersion"]
        for key, value in change.items():
            if key != "password":
                assert account[key] == value
    assert account_of(web, "uma")["authVersion"] == 1 + len(changes)
    # The new password is the one that works.
    assert_error(web.attempt("uma", PASSWORD), 401, "invalid_credentials")
    assert web.login("uma", "a new long password").get("/api/auth/me").status_code == 200


def test_patch_leaves_other_accounts_alone(web: Web) -> None:
    before = account_of(web, "ulf")
    assert web.admin.patch("/api/admin/accounts/uma", json={"canManageTeam": True}).status_code == 200
    assert account_of(web, "ulf") == before


BAD_PATCHES = [
    {"username": "other"},
    {"tenant": "elsewhere"},
    {"authVersion": 9},
    {"canManageTeam": "yes"},
    {"enabled": 1},
    {"enabled": "false"},
    {"enabled": None},
    {"role": "root"},
    {"role": None},
    {"password": None},
    {"allowedProfiles": ["local"]},
    {"allowedProfiles": None},
]


def test_patch_with_an_unknown_or_mistyped_field_is_400_and_changes_nothing(web: Web) -> None:
    before = account_of(web, "uma")
    for body in BAD_PATCHES:
        assert_error(web.admin.patch("/api/admin/accounts/uma", json=body), 400, "invalid_request", body)
    assert account_of(web, "uma") == before
    assert_error(web.admin.patch("/api/admin/accounts/uma", json=[{"enabled": False}]), 400, "invalid_request")
    assert account_of(web, "uma") == before


def test_patch_of_an_unknown_account_is_404(web: Web) -> None:
    assert_error(web.admin.patch("/api/admin/accounts/nobody", json={"enabled": False}), 404, "not_found")
    assert_error(web.admin.patch("/api/admin/accounts/nobody", json={"password": PASSWORD}), 404, "not_found")


def test_accounts_page_newest_first_with_a_cursor(web: Web, clock: ManualClock) -> None:
    for name in ("p1", "p2", "p3", "p4"):
        clock.advance(1)
        assert web.admin.post("/api/admin/accounts", json=new_account(name)).status_code == 201
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        response = web.admin.get("/api/admin/accounts", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["accounts"]) <= 2
        seen += [a["username"] for a in body["accounts"]]
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            break
        assert isinstance(cursor, str)
    assert pages == 4  # 7 accounts, 2 a page
    assert seen[:4] == ["p4", "p3", "p2", "p1"]
    assert sorted(seen[4:]) == ["ada", "ulf", "uma"]
    assert len(seen) == len(set(seen))
    created = [account_of(web, name)["createdAt"] for name in seen]
    assert created == sorted(created, reverse=True)


def test_account_list_limits_and_cursors_are_checked(web: Web) -> None:
    assert len(web.admin.get("/api/admin/accounts", params={"limit": 1}).json()["accounts"]) == 1
    assert len(web.admin.get("/api/admin/accounts", params={"limit": 100}).json()["accounts"]) == 3
    bad_cursor = base64.urlsafe_b64encode(json.dumps(["x"]).encode()).decode()
    for params in ({"limit": 0}, {"limit": 101}, {"limit": -1}, {"limit": "ten"}, {"cursor": "garbage!!"}):
        assert_error(web.admin.get("/api/admin/accounts", params=params), 400, "invalid_request")
    assert_error(web.admin.get("/api/admin/accounts", params={"cursor": bad_cursor}), 400, "invalid_request")


def test_account_routes_need_an_admin(web: Web) -> None:
    assert_error(web.user.get("/api/admin/accounts"), 403, "admin_required")
    assert_error(web.user.post("/api/admin/accounts", json=new_account(role="admin")), 403, "admin_required")
    assert_error(web.user.patch("/api/admin/accounts/uma", json={"role": "admin"}), 403, "admin_required")
    assert account_of(web, "uma")["role"] == "user"
    assert_error(web.anon().get("/api/admin/accounts"), 401, "unauthenticated")


# --- tenants (web-api.md 1-3) -------------------------------------------------------------------------------------


def test_objects_of_another_tenant_are_invisible(web: Web) -> None:
    add_account(web.server, "tina", "admin", tenant="acme", allowed_profiles={"local": ["default"]})
    tina = web.login("tina")
    assert tina.get("/api/auth/me").json()["tenant"] == "acme"
    # Usernames are unique across tenants; accounts are listed and changed per tenant.
    assert_error(web.admin.post("/api/admin/accounts", json=new_account("tina")), 409, "account_exists")
    assert "tina" not in {a["username"] for a in web.admin.get("/api/admin/accounts").json()["accounts"]}
    assert [a["username"] for a in tina.get("/api/admin/accounts").json()["accounts"]] == ["tina"]
    assert_error(web.admin.patch("/api/admin/accounts/tina", json={"enabled": False}), 404, "not_found")
    assert_error(tina.patch("/api/admin/accounts/uma", json={"enabled": False}), 404, "not_found")
    created = tina.post("/api/admin/accounts", json=new_account("acme-user"))
    assert created.status_code == 201, created.text
    assert created.json()["account"]["tenant"] == "acme"
    # Tasks, jobs and audit events of the other tenant answer 404 or are not listed.
    answer = dispatched(web)
    task_id, job_id = answer["task"]["id"], answer["job"]["id"]
    assert_error(tina.get(f"/api/tasks/{task_id}"), 404, "not_found")
    assert_error(tina.post(f"/api/tasks/{task_id}/cancel", json={"reason": "x"}), 404, "not_found")
    assert_error(tina.get(f"/api/jobs/{job_id}"), 404, "not_found")
    assert_error(tina.post(f"/api/jobs/{job_id}/cancel", json={"reason": "x"}), 404, "not_found")
    assert tina.get("/api/tasks").json()["tasks"] == []
    assert tina.get("/api/jobs").json()["jobs"] == []
    assert tina.get("/api/audit").json()["events"] == []
    own = tina.post("/api/tasks", json=TASK).json()["task"]
    assert own["tenant"] == "acme"
    assert_error(web.admin.get(f"/api/tasks/{own['id']}"), 404, "not_found")
    assert own["id"] not in {t["id"] for t in web.admin.get("/api/tasks").json()["tasks"]}
    assert web.admin.get(f"/api/jobs/{job_id}").json()["job"]["state"] == "QUEUED"
