"""Text fields and the author's profiles on tasks (web-api.md 9, issue 12 items 3 and 4), over a real hub."""

from __future__ import annotations

from talaria.testing.hub_server import HubServer
from tests.conftest import add_account
from tests.integration.web_support import TASK, Web, assert_error, create_task, submitted_task

BAD_ONE_LINE = ["   ", "a\u0000b", "\u202etxt.exe", "a\nb", "a\u2066b", "a\x85b"]
BAD_MULTI_LINE = [" \n\t ", "a\u0000b", "\u202eevil", "a\rb"]


def test_one_line_and_multi_line_task_fields_refuse_blanks_controls_and_bidi(web: Web) -> None:
    before = len(web.admin.get("/api/tasks").json()["tasks"])
    for bad in BAD_ONE_LINE:
        body = assert_error(web.user.post("/api/tasks", json=TASK | {"title": bad}), 400, "invalid_request", bad)
        assert body["error"].startswith("title must not"), body
    for bad in BAD_MULTI_LINE:
        body = assert_error(web.user.post("/api/tasks", json=TASK | {"prompt": bad}), 400, "invalid_request", bad)
        assert body["error"].startswith("prompt must not"), body
    assert len(web.admin.get("/api/tasks").json()["tasks"]) == before, "nothing was created"
    task = create_task(web.user, title="  Release notes  ", prompt="line one\n\tline two")
    assert task["title"] == "Release notes"
    shown = web.user.get(f"/api/tasks/{task['id']}").json()["task"]
    assert shown["title"] == "Release notes"


def test_reasons_are_one_line_fields(web: Web) -> None:
    task = submitted_task(web.user)
    for bad in BAD_ONE_LINE:
        refused = web.admin.post(f"/api/tasks/{task['id']}/reject", json={"reason": bad})
        assert_error(refused, 400, "invalid_request", bad)
        assert_error(web.user.post(f"/api/tasks/{task['id']}/cancel", json={"reason": bad}), 400, "invalid_request")
    assert web.user.get(f"/api/tasks/{task['id']}").json()["task"]["state"] == "PENDING_APPROVAL"
    job = web.admin.post(f"/api/tasks/{task['id']}/approve").json()["job"]
    assert_error(web.admin.post(f"/api/jobs/{job['id']}/cancel", json={"reason": "\u202eno"}), 400, "invalid_request")
    assert web.admin.post(f"/api/jobs/{job['id']}/cancel", json={"reason": "  not needed  "}).status_code == 200


def test_a_runner_name_is_a_one_line_field(web: Web) -> None:
    base = {"hermesURL": "http://127.0.0.1:9119", "allowedProfiles": ["default"]}
    for bad in ("   ", "node\u0000", "\u202enode"):
        refused = web.admin.post("/api/admin/runners", json=base | {"name": bad})
        body = assert_error(refused, 400, "invalid_runner_config", bad)
        assert body["error"].startswith("name:"), body
    made = web.admin.post("/api/admin/runners", json=base | {"name": "  kitchen  "})
    assert made.status_code == 201, made.text
    assert made.json()["runner"]["name"] == "kitchen"


def test_a_task_for_a_profile_its_author_may_not_use_is_403_at_create_submit_and_approve(web: Web) -> None:
    for cell, profile in (("nowhere", "notmine"), ("local", "research"), ("lab", "other")):
        refused = web.user.post("/api/tasks", json=TASK | {"cell": cell, "profile": profile})
        assert_error(refused, 403, "profile_not_allowed", (cell, profile))
    draft = create_task(web.user)
    pending = submitted_task(web.user)
    server: HubServer = web.server
    server.hub.accounts.update("uma", "default", {"allowedProfiles": {"lab": ["default"]}})
    assert_error(web.user.post(f"/api/tasks/{draft['id']}/submit"), 403, "profile_not_allowed")
    # the approver may use the profile; the author no longer may: refused, nothing dispatched
    assert_error(web.admin.post(f"/api/tasks/{pending['id']}/approve"), 403, "profile_not_allowed")
    assert web.user.get(f"/api/tasks/{pending['id']}").json()["task"]["state"] == "PENDING_APPROVAL"
    server.hub.accounts.update("uma", "default", {"allowedProfiles": {"local": ["default"]}})
    assert web.admin.post(f"/api/tasks/{pending['id']}/approve").status_code == 200


def test_an_author_whose_account_was_disabled_cannot_have_a_task_approved(web: Web) -> None:
    add_account(web.server, "vic", allowed_profiles={"local": ["default"]})
    vic = web.login("vic")
    pending = submitted_task(vic)
    web.server.hub.accounts.update("vic", "default", {"enabled": False})
    assert_error(web.admin.post(f"/api/tasks/{pending['id']}/approve"), 403, "profile_not_allowed")
