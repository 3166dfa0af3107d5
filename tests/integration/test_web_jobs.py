"""Job and audit routes over a real hub (web-api.md 6, lifecycle.md 4 and 8)."""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from itertools import pairwise
from typing import Any

import pytest

from talaria.clock import ManualClock
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.answers import encode
from talaria.lifecycle.binding import Binding
from tests.integration.web_support import (
    JOB_KEYS,
    Web,
    assert_error,
    create_task,
    dispatched,
)

WORKER = Actor("worker-1", frozenset({"runtime"}), "trusted_proxy", "default")
LEASE_KEYS = {"epoch", "ownerPrincipal", "ownerInstance", "acquiredAt", "expiresAt", "lastHeartbeatAt"}
TERMINAL_KEYS = {"kind", "reasonCode", "resultDigest", "finishedAt"}
AUDIT_KEYS = {
    "seq",
    "eventId",
    "occurredAt",
    "type",
    "actor",
    "subject",
    "fromState",
    "toState",
    "revisionBefore",
    "revisionAfter",
    "leaseEpoch",
    "reasonCode",
    "prevHash",
    "hash",
    "evidence",
    "team",  # team-tools.md 11: a team event's ids, null on other events
}
HEX64 = re.compile(r"^[0-9a-f]{64}$")


pytestmark = pytest.mark.usefixtures("fast_argon2")


def claim(web: Web, answer: dict[str, Any]) -> dict[str, Any]:
    """Claim the approved job as a Runtime API worker would, through the engine; the lease it got."""
    binding = Binding(**answer["dispatch"]["binding"], principal=WORKER.principal)
    result = web.server.hub.engine.claim(WORKER, job_id=answer["job"]["id"], binding=binding, worker_instance="w1")
    lease: dict[str, Any] = json.loads(encode(result.answer))["lease"]
    return lease


def job_ids(jobs: list[dict[str, Any]]) -> list[str]:
    return [j["id"] for j in jobs]


# --- list and get -----------------------------------------------------------------------------------------------


def test_a_user_sees_the_jobs_of_their_own_tasks_only(web: Web) -> None:
    mine = dispatched(web)["job"]["id"]
    theirs = dispatched(web, web.other)["job"]["id"]
    response = web.user.get("/api/jobs")
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"jobs", "nextCursor"}
    assert job_ids(response.json()["jobs"]) == [mine]
    assert response.json()["nextCursor"] is None
    assert job_ids(web.other.get("/api/jobs").json()["jobs"]) == [theirs]
    assert set(job_ids(web.admin.get("/api/jobs").json()["jobs"])) == {mine, theirs}
    assert web.user.get(f"/api/jobs/{mine}").status_code == 200
    assert_error(web.user.get(f"/api/jobs/{theirs}"), 404, "not_found")
    assert_error(web.user.get("/api/jobs/job_does_not_exist"), 404, "not_found")
    assert web.admin.get(f"/api/jobs/{theirs}").json()["job"]["id"] == theirs


def test_job_object_has_exactly_the_documented_keys(web: Web) -> None:
    answer = dispatched(web)
    job = web.user.get(f"/api/jobs/{answer['job']['id']}").json()["job"]
    assert set(job) == JOB_KEYS
    assert job["taskId"] == answer["task"]["id"]
    assert (job["cell"], job["profile"]) == ("local", "default")
    assert job["state"] == "QUEUED"
    assert job["startedAt"] is None
    assert job["lease"] is None
    assert job["terminal"] is None
    assert job["result"] is None
    assert isinstance(job["waitingReason"], str)
    assert job["waitingReason"]
    listed = web.user.get("/api/jobs").json()["jobs"]
    assert listed == [job]


def test_job_list_filters_by_state_and_cell(web: Web, clock: ManualClock) -> None:
    local = dispatched(web)["job"]["id"]
    clock.advance(1)
    lab = dispatched(web, cell="lab")["job"]["id"]
    clock.advance(1)
    cancelled = dispatched(web)["job"]["id"]
    assert web.admin.post(f"/api/jobs/{cancelled}/cancel", json={"reason": "no"}).status_code == 200

    def listed(**params: Any) -> list[str]:
        response = web.user.get("/api/jobs", params=params)
        assert response.status_code == 200, response.text
        return job_ids(response.json()["jobs"])

    assert listed() == [cancelled, lab, local]
    assert listed(state="QUEUED") == [lab, local]
    assert listed(state="CANCELLED") == [cancelled]
    assert listed(cell="lab") == [lab]
    assert listed(cell="local", state="QUEUED") == [local]
    assert listed(state="RUNNING") == []
    assert listed(limit=1) == [cancelled]
    cursor = web.user.get("/api/jobs", params={"limit": 2}).json()["nextCursor"]
    assert isinstance(cursor, str)
    second = web.user.get("/api/jobs", params={"limit": 2, "cursor": cursor}).json()
    assert job_ids(second["jobs"]) == [local]
    assert second["nextCursor"] is None
    for params in ({"state": "BOGUS"}, {"limit": 0}, {"limit": 101}, {"cursor": "%%%"}):
        assert_error(web.user.get("/api/jobs", params=params), 400, "invalid_request", params)


def test_a_leased_job_shows_its_lease_but_never_the_lease_id(web: Web, clock: ManualClock) -> None:
    answer = dispatched(web)
    clock.advance(3)
    lease = claim(web, answer)
    lease_id = lease["lease_id"]
    assert lease_id
    response = web.user.get(f"/api/jobs/{answer['job']['id']}")
    assert response.status_code == 200, response.text
    job = response.json()["job"]
    assert job["state"] == "LEASED"
    assert job["attempt"] == 1
    assert job["waitingReason"] is None
    assert set(job["lease"]) == LEASE_KEYS
    assert job["lease"]["epoch"] == 1
    assert job["lease"]["ownerPrincipal"] == "worker-1"
    assert job["lease"]["ownerInstance"] == "w1"
    assert job["lease"]["acquiredAt"] == clock.now_ms()
    assert job["lease"]["expiresAt"] > clock.now_ms()
    assert lease_id not in response.text
    for path in ("/api/jobs", "/api/audit", f"/api/audit?job={answer['job']['id']}"):
        listed = web.admin.get(path)
        assert listed.status_code == 200, listed.text
        assert lease_id not in listed.text, path
    assert lease_id not in web.user.get(f"/api/tasks/{answer['task']['id']}").text


# --- cancel -----------------------------------------------------------------------------------------------------


def test_admin_cancel_of_a_queued_job_cancels_it(web: Web, clock: ManualClock) -> None:
    answer = dispatched(web)
    job_id, task_id = answer["job"]["id"], answer["task"]["id"]
    clock.advance(2)
    response = web.admin.post(f"/api/jobs/{job_id}/cancel", json={"reason": "not needed"})
    assert response.status_code == 200, response.text
    job = response.json()["job"]
    assert set(job) == JOB_KEYS
    assert job["state"] == "CANCELLED"
    assert job["revision"] == 2
    assert job["cancelRequested"] is False
    assert job["waitingReason"] is None
    assert set(job["terminal"]) == TERMINAL_KEYS
    assert job["terminal"]["kind"] == "CANCELLED"
    assert job["terminal"]["finishedAt"] == clock.now_ms()
    assert web.user.get(f"/api/jobs/{job_id}").json()["job"] == job
    # Reconciled: the task follows.
    assert web.user.get(f"/api/tasks/{task_id}").json()["task"]["state"] == "CANCELLED"
    assert_error(web.admin.post(f"/api/jobs/{job_id}/cancel", json={"reason": "again"}), 409, "terminal_conflict")


def test_admin_cancel_of_a_leased_job_requests_cancellation(web: Web) -> None:
    answer = dispatched(web)
    job_id = answer["job"]["id"]
    claim(web, answer)
    response = web.admin.post(f"/api/jobs/{job_id}/cancel", json={"reason": "stop"})
    assert response.status_code == 200, response.text
    job = response.json()["job"]
    assert job["state"] == "LEASED"
    assert job["cancelRequested"] is True
    assert job["terminal"] is None
    assert job["lease"]["epoch"] == 1
    # A second request while the flag is set changes nothing and answers the job as it is.
    again = web.admin.post(f"/api/jobs/{job_id}/cancel", json={"reason": "stop"})
    assert again.status_code == 200, again.text
    assert again.json()["job"] == job
    assert web.user.get(f"/api/tasks/{answer['task']['id']}").json()["task"]["state"] == "DISPATCHED"


def test_job_cancel_needs_an_admin_and_a_reason(web: Web) -> None:
    answer = dispatched(web)
    job_id = answer["job"]["id"]
    assert_error(web.user.post(f"/api/jobs/{job_id}/cancel", json={"reason": "mine"}), 403, "admin_required")
    assert_error(web.other.post(f"/api/jobs/{job_id}/cancel", json={"reason": "x"}), 403, "admin_required")
    for body in ({}, {"reason": ""}, {"reason": "r" * 1025}, {"reason": 1}, {"reason": "x", "extra": 1}, None):
        assert_error(web.admin.post(f"/api/jobs/{job_id}/cancel", json=body), 400, "invalid_request", body)
    assert_error(web.admin.post("/api/jobs/job_nope/cancel", json={"reason": "x"}), 404, "not_found")
    assert web.user.get(f"/api/jobs/{job_id}").json()["job"]["state"] == "QUEUED"


# --- audit ------------------------------------------------------------------------------------------------------


def test_audit_lists_events_newest_first_with_evidence_on_job_events(web: Web) -> None:
    answer = dispatched(web)
    claim(web, answer)
    response = web.admin.get("/api/audit")
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"events", "nextCursor"}
    events = body["events"]
    assert [e["type"] for e in events] == [
        "hermes.job.claimed",
        "hermes.job.enqueued",
        "task.dispatched",
        "task.approved",
        "task.submitted",
        "task.created",
    ]
    assert [e["seq"] for e in events] == [6, 5, 4, 3, 2, 1]
    for newer, older in pairwise(events):
        assert newer["prevHash"] == older["hash"]
    assert events[-1]["prevHash"] == "0" * 64
    for event in events:
        assert set(event) == AUDIT_KEYS
        assert HEX64.match(event["hash"])
        if event["type"].startswith("hermes.job."):
            assert set(event["evidence"]) == {"kind", "contentDigest"}
            assert HEX64.match(event["evidence"]["contentDigest"])
        else:
            assert event["evidence"] is None, event
    assert events[0]["evidence"]["kind"] == "claim"
    assert events[1]["evidence"]["kind"] == "enqueue"
    assert events[0]["leaseEpoch"] == 1
    assert events[0]["subject"]["job"] == answer["job"]["id"]
    assert events[0]["actor"]["principal"] == "worker-1"
    assert events[3]["actor"]["principal"].endswith("/ada")
    assert (events[3]["fromState"], events[3]["toState"]) == ("PENDING_APPROVAL", "APPROVED")


def test_audit_filters_by_task_and_job(web: Web) -> None:
    first = dispatched(web)
    second = dispatched(web, web.other)
    task_events = web.admin.get("/api/audit", params={"task": first["task"]["id"]}).json()["events"]
    assert len(task_events) == 5
    assert {e["subject"]["task"] for e in task_events} == {first["task"]["id"]}
    job_events = web.admin.get("/api/audit", params={"job": second["job"]["id"]}).json()["events"]
    assert [e["type"] for e in job_events] == ["hermes.job.enqueued", "task.dispatched"]
    assert {e["subject"]["job"] for e in job_events} == {second["job"]["id"]}
    both = web.admin.get("/api/audit", params={"task": first["task"]["id"], "job": second["job"]["id"]})
    assert both.json()["events"] == []
    assert web.admin.get("/api/audit", params={"task": "tsk_nope"}).json()["events"] == []


def test_audit_pages_with_a_cursor(web: Web) -> None:
    dispatched(web)
    seqs: list[int] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        body = web.admin.get("/api/audit", params=params).json()
        seqs += [e["seq"] for e in body["events"]]
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert seqs == [5, 4, 3, 2, 1]
    for params in ({"limit": 0}, {"limit": 101}, {"cursor": "nope"}):
        assert_error(web.admin.get("/api/audit", params=params), 400, "invalid_request", params)


def test_a_user_reads_the_audit_of_their_own_task_or_job_only(web: Web) -> None:
    mine = dispatched(web)
    theirs = dispatched(web, web.other)
    assert_error(web.user.get("/api/audit"), 403, "admin_required")
    own = web.user.get("/api/audit", params={"task": mine["task"]["id"]})
    assert own.status_code == 200, own.text
    assert {e["subject"]["task"] for e in own.json()["events"]} == {mine["task"]["id"]}
    assert web.user.get("/api/audit", params={"job": mine["job"]["id"]}).status_code == 200
    assert_error(web.user.get("/api/audit", params={"task": theirs["task"]["id"]}), 404, "not_found")
    assert_error(web.user.get("/api/audit", params={"job": theirs["job"]["id"]}), 404, "not_found")
    assert_error(web.user.get("/api/audit", params={"task": "tsk_nope"}), 404, "not_found")
    mixed = {"task": mine["task"]["id"], "job": theirs["job"]["id"]}
    assert_error(web.user.get("/api/audit", params=mixed), 404, "not_found")
    draft = create_task(web.other)
    assert_error(web.user.get("/api/audit", params={"task": draft["id"]}), 404, "not_found")


def test_audit_verify_reports_the_intact_chain(web: Web) -> None:
    dispatched(web)
    response = web.admin.get("/api/audit/verify")
    assert response.status_code == 200, response.text
    body = response.json()
    newest = web.admin.get("/api/audit").json()["events"][0]
    assert body == {"ok": True, "events": 5, "head": newest["hash"]}
    assert_error(web.user.get("/api/audit/verify"), 403, "admin_required")


def test_audit_verify_finds_a_tampered_event(web: Web) -> None:
    dispatched(web)
    database = web.server.data_dir / "talaria.sqlite3"
    with closing(sqlite3.connect(database)) as db:
        db.execute("DROP TRIGGER audit_event_no_update")
        db.execute("UPDATE audit_event SET body = body || ' ' WHERE seq = 2")
        db.commit()
    response = web.admin.get("/api/audit/verify")
    assert response.status_code == 200, response.text
    assert response.json() == {"ok": False, "brokenAt": 2, "reason": "hash_mismatch"}
