"""Task routes over a real hub (web-api.md 5, lifecycle.md 3)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import pytest

from talaria.clock import ManualClock
from talaria.testing.hub_server import HubServer
from tests.integration.web_support import (
    HEX32,
    JOB_KEYS,
    TASK,
    TASK_KEYS,
    Web,
    all_tasks,
    assert_error,
    create_task,
    dispatched,
    open_web,
    submitted_task,
)

DISPATCH_KEYS = {"id", "runId", "trace", "provenance", "cell", "profile", "status", "binding"}
BINDING_KEYS = {"tenant", "task", "trace", "provenance", "run", "dispatch", "job", "cell", "profile"}
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


pytestmark = pytest.mark.usefixtures("fast_argon2")


def task_ids(response_tasks: list[dict[str, Any]]) -> list[str]:
    return [t["id"] for t in response_tasks]


# --- create -----------------------------------------------------------------------------------------------------


def test_create_task_answers_201_with_a_draft(web: Web, clock: ManualClock) -> None:
    response = web.user.post("/api/tasks", json=TASK)
    assert response.status_code == 201, response.text
    assert set(response.json()) == {"task"}
    task = response.json()["task"]
    assert set(task) == TASK_KEYS
    assert task["id"]
    assert task["tenant"] == "default"
    assert task["title"] == TASK["title"]
    assert task["prompt"] == TASK["prompt"]
    assert task["cell"] == "local"
    assert task["profile"] == "default"
    assert task["state"] == "DRAFT"
    assert task["revision"] == 1
    assert task["createdBy"] == "uma"
    assert task["createdAt"] == clock.now_ms()
    for key in (
        "submittedAt",
        "approvedBy",
        "approvedAt",
        "rejectedBy",
        "rejectedAt",
        "rejectionReason",
        "team",
        "approval",
    ):
        assert task[key] is None, key
    assert task["finishedAt"] is None
    assert task["jobId"] is None
    assert web.user.get(f"/api/tasks/{task['id']}").json() == {"task": task}


def test_title_of_1_and_200_characters_and_prompt_of_1_and_200000_are_accepted(web: Web) -> None:
    for fields in ({"title": "t"}, {"title": "t" * 200}, {"prompt": "p"}, {"prompt": "p" * 200_000}):
        task = create_task(web.user, **fields)
        for key, value in fields.items():
            assert task[key] == value
    assert len(all_tasks(web)) == 4


def test_task_fields_outside_their_limits_are_400(web: Web) -> None:
    for fields in ({"title": ""}, {"title": "t" * 201}, {"prompt": ""}, {"prompt": "p" * 200_001}):
        assert_error(web.user.post("/api/tasks", json=TASK | fields), 400, "invalid_request", list(fields))
    assert all_tasks(web) == []


def test_task_body_is_strict(web: Web) -> None:
    bodies: list[Any] = [
        TASK | {"extra": 1},
        TASK | {"state": "APPROVED"},
        {k: v for k, v in TASK.items() if k != "profile"},
        {k: v for k, v in TASK.items() if k != "title"},
        TASK | {"title": 5},
        TASK | {"prompt": ["a"]},
        TASK | {"cell": None},
        TASK | {"cell": "Not A Cell"},
        TASK | {"profile": "bad profile"},
        TASK | {"cell": ""},
        {},
    ]
    for body in bodies:
        assert_error(web.user.post("/api/tasks", json=body), 400, "invalid_request", body)
    assert_error(web.user.post("/api/tasks"), 400, "invalid_request")
    assert all_tasks(web) == []


# --- list and get -----------------------------------------------------------------------------------------------


def test_a_user_lists_only_their_own_tasks_and_an_admin_all(web: Web) -> None:
    mine = {create_task(web.user)["id"], create_task(web.user)["id"]}
    theirs = {create_task(web.other)["id"]}
    admins = {create_task(web.admin)["id"]}
    response = web.user.get("/api/tasks")
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"tasks", "nextCursor"}
    assert set(task_ids(response.json()["tasks"])) == mine
    assert set(task_ids(web.other.get("/api/tasks").json()["tasks"])) == theirs
    assert set(task_ids(web.admin.get("/api/tasks").json()["tasks"])) == mine | theirs | admins
    for task in web.admin.get("/api/tasks").json()["tasks"]:
        assert set(task) == TASK_KEYS


def test_task_list_filters_by_state(web: Web) -> None:
    draft = create_task(web.user)
    pending = submitted_task(web.user)
    queued = dispatched(web)["task"]
    assert task_ids(web.user.get("/api/tasks", params={"state": "DRAFT"}).json()["tasks"]) == [draft["id"]]
    assert task_ids(web.user.get("/api/tasks", params={"state": "PENDING_APPROVAL"}).json()["tasks"]) == [pending["id"]]
    assert task_ids(web.user.get("/api/tasks", params={"state": "DISPATCHED"}).json()["tasks"]) == [queued["id"]]
    assert web.user.get("/api/tasks", params={"state": "REJECTED"}).json() == {"tasks": [], "nextCursor": None}
    for state in ("BOGUS", "draft", ""):
        assert_error(web.user.get("/api/tasks", params={"state": state}), 400, "invalid_request", state)


def test_task_list_pages_newest_first(web: Web, clock: ManualClock) -> None:
    created = []
    for i in range(5):
        clock.advance(1)
        created.append(create_task(web.user, title=f"task {i}")["id"])
    pages = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        body = web.user.get("/api/tasks", params=params).json()
        pages.append(task_ids(body["tasks"]))
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert pages == [created[4:2:-1], created[2:0:-1], created[0:1]]
    full = web.user.get("/api/tasks").json()
    assert task_ids(full["tasks"]) == created[::-1]
    assert full["nextCursor"] is None


def test_task_list_limits_and_cursors_are_checked(web: Web) -> None:
    for params in ({"limit": 0}, {"limit": 101}, {"limit": "x"}, {"cursor": "not-a-cursor"}, {"cursor": "WzFd"}):
        assert_error(web.user.get("/api/tasks", params=params), 400, "invalid_request", params)
    assert web.user.get("/api/tasks", params={"limit": 100}).status_code == 200


def test_another_users_task_is_404(web: Web) -> None:
    task = create_task(web.other)
    assert_error(web.user.get(f"/api/tasks/{task['id']}"), 404, "not_found")
    assert_error(web.user.get("/api/tasks/tsk_does_not_exist"), 404, "not_found")
    assert web.admin.get(f"/api/tasks/{task['id']}").json()["task"]["id"] == task["id"]
    # Nor can the user act on it.
    assert_error(web.user.post(f"/api/tasks/{task['id']}/submit"), 404, "not_found")
    assert_error(web.user.post(f"/api/tasks/{task['id']}/cancel"), 404, "not_found")
    assert web.other.get(f"/api/tasks/{task['id']}").json()["task"]["state"] == "DRAFT"


# --- submit, approve, reject ------------------------------------------------------------------------------------


def test_author_submits(web: Web, clock: ManualClock) -> None:
    task = create_task(web.user)
    clock.advance(5)
    response = web.user.post(f"/api/tasks/{task['id']}/submit")
    assert response.status_code == 200, response.text
    submitted = response.json()["task"]
    assert submitted["state"] == "PENDING_APPROVAL"
    assert submitted["revision"] == 2
    assert submitted["submittedAt"] == clock.now_ms()
    assert_error(web.user.post(f"/api/tasks/{task['id']}/submit"), 409, "invalid_transition")


def test_submit_by_a_non_author_admin_is_403(web: Web) -> None:
    task = create_task(web.user)
    assert_error(web.admin.post(f"/api/tasks/{task['id']}/submit"), 403, "not_author")
    assert web.user.get(f"/api/tasks/{task['id']}").json()["task"]["state"] == "DRAFT"


def test_approve_by_a_user_is_403(web: Web) -> None:
    task = submitted_task(web.other)
    mine = submitted_task(web.user)
    assert_error(web.user.post(f"/api/tasks/{task['id']}/approve"), 403, "admin_required")
    assert_error(web.user.post(f"/api/tasks/{mine['id']}/approve"), 403, "admin_required")
    assert_error(web.user.post(f"/api/tasks/{mine['id']}/reject", json={"reason": "no"}), 403, "admin_required")
    assert web.user.get(f"/api/tasks/{mine['id']}").json()["task"]["state"] == "PENDING_APPROVAL"


def test_self_approval_is_forbidden_by_default(web: Web) -> None:
    task = submitted_task(web.admin)
    assert_error(web.admin.post(f"/api/tasks/{task['id']}/approve"), 403, "self_approval_forbidden")
    response = web.admin.post(f"/api/tasks/{task['id']}/reject", json={"reason": "mine"})
    assert_error(response, 403, "self_approval_forbidden")
    assert web.admin.get(f"/api/tasks/{task['id']}").json()["task"]["state"] == "PENDING_APPROVAL"
    assert web.admin.get("/api/jobs").json()["jobs"] == []


def test_self_approval_is_allowed_by_the_setting(make_hub: Callable[..., HubServer]) -> None:
    with ExitStack() as stack:
        web = open_web(make_hub, stack, approval_allow_self_approval=True)
        task = submitted_task(web.admin)
        response = web.admin.post(f"/api/tasks/{task['id']}/approve")
        assert response.status_code == 200, response.text
        approved = response.json()["task"]
        assert approved["state"] == "DISPATCHED"
        assert approved["createdBy"] == approved["approvedBy"] == "ada"


def test_approve_answers_the_dispatched_task_its_dispatch_and_queued_job(web: Web, clock: ManualClock) -> None:
    task = submitted_task(web.user)
    clock.advance(7)
    response = web.admin.post(f"/api/tasks/{task['id']}/approve")
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"task", "dispatch", "job"}
    approved, dispatch, job = body["task"], body["dispatch"], body["job"]

    assert set(approved) == TASK_KEYS
    assert approved["id"] == task["id"]
    assert approved["state"] == "DISPATCHED"
    assert approved["approvedBy"] == "ada"
    assert approved["approvedAt"] == clock.now_ms()
    assert approved["jobId"] == job["id"]

    assert set(dispatch) == DISPATCH_KEYS
    assert dispatch["status"] == "OPEN"
    assert (dispatch["cell"], dispatch["profile"]) == ("local", "default")
    assert HEX32.match(dispatch["trace"])
    assert len(dispatch["provenance"]) == 64
    binding = dispatch["binding"]
    assert set(binding) == BINDING_KEYS
    assert "principal" not in binding
    assert binding == {
        "tenant": "default",
        "task": task["id"],
        "trace": dispatch["trace"],
        "provenance": dispatch["provenance"],
        "run": dispatch["runId"],
        "dispatch": dispatch["id"],
        "job": job["id"],
        "cell": "local",
        "profile": "default",
    }

    assert set(job) == JOB_KEYS
    assert job["taskId"] == task["id"]
    assert job["state"] == "QUEUED"
    assert job["revision"] == 1
    assert job["attempt"] == 0
    assert job["maxAttempts"] >= 1
    assert job["cancelRequested"] is False
    assert job["enqueuedAt"] == clock.now_ms()
    assert job["lease"] is None
    assert job["terminal"] is None
    assert isinstance(job["waitingReason"], str)
    assert job["waitingReason"].strip()
    # The author sees the same through the reads.
    assert web.user.get(f"/api/tasks/{task['id']}").json()["task"] == approved
    assert web.user.get(f"/api/jobs/{job['id']}").json()["job"] == job


def test_approving_twice_is_a_409(web: Web) -> None:
    answer = dispatched(web)
    response = web.admin.post(f"/api/tasks/{answer['task']['id']}/approve")
    assert_error(response, 409, "invalid_transition")
    assert len(web.admin.get("/api/jobs").json()["jobs"]) == 1


def test_approving_a_draft_is_a_409(web: Web) -> None:
    task = create_task(web.user)
    assert_error(web.admin.post(f"/api/tasks/{task['id']}/approve"), 409, "invalid_transition")
    assert_error(web.admin.post("/api/tasks/tsk_nope/approve"), 404, "not_found")


def test_reject_with_a_reason_of_1_to_1000_characters(web: Web, clock: ManualClock) -> None:
    for reason in ("n", "r" * 1000):
        task = submitted_task(web.user)
        response = web.admin.post(f"/api/tasks/{task['id']}/reject", json={"reason": reason})
        assert response.status_code == 200, response.text
        rejected = response.json()["task"]
        assert rejected["state"] == "REJECTED"
        assert rejected["rejectedBy"] == "ada"
        assert rejected["rejectedAt"] == clock.now_ms()
        assert rejected["rejectionReason"] == reason
        assert rejected["finishedAt"] == clock.now_ms()
        assert rejected["jobId"] is None
    assert web.admin.get("/api/jobs").json()["jobs"] == []


def test_reject_without_a_good_reason_is_400(web: Web) -> None:
    task = submitted_task(web.user)
    for body in ({"reason": ""}, {"reason": "r" * 1001}, {}, {"reason": 3}, {"reason": "x", "extra": 1}, None):
        assert_error(web.admin.post(f"/api/tasks/{task['id']}/reject", json=body), 400, "invalid_request", body)
    assert web.user.get(f"/api/tasks/{task['id']}").json()["task"]["state"] == "PENDING_APPROVAL"


def test_a_rejected_task_cannot_be_approved(web: Web) -> None:
    task = submitted_task(web.user)
    assert web.admin.post(f"/api/tasks/{task['id']}/reject", json={"reason": "no"}).status_code == 200
    assert_error(web.admin.post(f"/api/tasks/{task['id']}/approve"), 409, "invalid_transition")


# --- cancel -----------------------------------------------------------------------------------------------------


def test_author_cancels_a_draft(web: Web, clock: ManualClock) -> None:
    task = create_task(web.user)
    response = web.user.post(f"/api/tasks/{task['id']}/cancel")
    assert response.status_code == 200, response.text
    cancelled = response.json()["task"]
    assert cancelled["state"] == "CANCELLED"
    assert cancelled["finishedAt"] == clock.now_ms()
    assert_error(web.user.post(f"/api/tasks/{task['id']}/cancel"), 409, "invalid_transition")
    assert_error(web.user.post(f"/api/tasks/{task['id']}/submit"), 409, "invalid_transition")


def test_cancel_takes_an_optional_reason(web: Web) -> None:
    bodies: list[dict[str, Any]] = [{"reason": "changed my mind"}, {}]
    for body in bodies:
        task = submitted_task(web.user)
        response = web.user.post(f"/api/tasks/{task['id']}/cancel", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["task"]["state"] == "CANCELLED"
    task = create_task(web.user)
    for body in ({"reason": ""}, {"reason": 5}, {"why": "x"}):
        assert_error(web.user.post(f"/api/tasks/{task['id']}/cancel", json=body), 400, "invalid_request", body)
    assert web.user.get(f"/api/tasks/{task['id']}").json()["task"]["state"] == "DRAFT"


def test_admin_cancels_a_users_pending_task(web: Web) -> None:
    task = submitted_task(web.user)
    response = web.admin.post(f"/api/tasks/{task['id']}/cancel", json={"reason": "not now"})
    assert response.status_code == 200, response.text
    assert response.json()["task"]["state"] == "CANCELLED"


def test_admin_cancel_of_a_dispatched_task_cancels_its_job_and_the_task(web: Web) -> None:
    answer = dispatched(web)
    task_id, job_id = answer["task"]["id"], answer["job"]["id"]
    response = web.admin.post(f"/api/tasks/{task_id}/cancel", json={"reason": "stop it"})
    assert response.status_code == 200, response.text
    task = response.json()["task"]
    assert task["state"] == "CANCELLED"
    assert task["jobId"] == job_id
    assert task["finishedAt"] is not None
    job = web.admin.get(f"/api/jobs/{job_id}").json()["job"]
    assert job["state"] == "CANCELLED"
    assert job["terminal"]["kind"] == "CANCELLED"
    assert job["waitingReason"] is None
    assert web.user.get(f"/api/tasks/{task_id}").json()["task"]["state"] == "CANCELLED"
    # The job is terminal: a second cancel changes nothing.
    again = web.admin.post(f"/api/tasks/{task_id}/cancel", json={"reason": "again"})
    assert again.status_code == 409, again.text
    assert set(again.json()) == {"code", "error"}
    assert web.admin.get(f"/api/jobs/{job_id}").json()["job"] == job


# --- trace ------------------------------------------------------------------------------------------------------


def trace_of(web: Web, headers: dict[str, str]) -> str:
    response = web.user.post("/api/tasks", json=TASK, headers=headers)
    assert response.status_code == 201, response.text
    task = response.json()["task"]
    assert web.user.post(f"/api/tasks/{task['id']}/submit").status_code == 200
    answer = web.admin.post(f"/api/tasks/{task['id']}/approve").json()
    assert answer["dispatch"]["binding"]["trace"] == answer["dispatch"]["trace"]
    return str(answer["dispatch"]["trace"])


def test_a_valid_traceparent_gives_the_task_its_trace(web: Web) -> None:
    assert trace_of(web, {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}) == TRACE


@pytest.mark.parametrize(
    "traceparent",
    [
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        f"00-{TRACE.upper()}-00f067aa0ba902b7-01",
        f"00-{TRACE}-00f067aa0ba902b7",
        f"00-{TRACE[:-1]}-00f067aa0ba902b7-01",
        TRACE,
        "garbage",
    ],
    ids=["all-zero", "upper-case", "no-flags", "short", "bare-id", "garbage"],
)
def test_a_bad_traceparent_is_replaced_by_a_fresh_trace(web: Web, traceparent: str) -> None:
    trace = trace_of(web, {"traceparent": traceparent})
    assert HEX32.match(trace), trace
    assert trace != "0" * 32
    assert trace.lower() != TRACE[:31]
    assert trace != TRACE


def test_each_task_without_traceparent_gets_its_own_trace(web: Web) -> None:
    first, second = trace_of(web, {}), trace_of(web, {})
    assert HEX32.match(first)
    assert HEX32.match(second)
    assert first != second
