"""The holder's release (ADR 0030) over a real hub and its SQLite file: a lease given back before anything ran
puts the job back in the queue for its next attempt, ends it FAILED with the error once its attempts are used
up, and CANCELLED when a cancel was requested; the holder rules and idempotency hold as for every holder call."""

from __future__ import annotations

from typing import Any

import pytest

from talaria.canonical import digest, sha256_hex
from talaria.errors import TalariaError
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.answers import Ended, Requeued
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import IdemRequest
from talaria.lifecycle.records import LeaseRef
from tests.integration.web_support import Web, dispatched

pytestmark = pytest.mark.usefixtures("fast_argon2")

WORKER = Actor("worker-1", frozenset({"runtime"}), "trusted_proxy", "default")
UNAVAILABLE = {"code": "hermes_unavailable", "message": "Hermes did not answer", "retryable": True}


def queued(web: Web) -> tuple[str, Binding]:
    answer = dispatched(web)
    return answer["job"]["id"], Binding(**answer["dispatch"]["binding"], principal=WORKER.principal)


def claim(web: Web, job_id: str, binding: Binding) -> LeaseRef:
    claimed = web.server.hub.engine.claim(WORKER, job_id=job_id, binding=binding, worker_instance="w1").answer
    assert claimed.lease is not None
    return claimed.lease.ref


def release(web: Web, job_id: str, binding: Binding, lease: LeaseRef, key: str | None = None) -> Any:
    idem = IdemRequest(sha256_hex(key), digest(UNAVAILABLE)) if key else None
    engine = web.server.hub.engine
    return engine.release(WORKER, job_id=job_id, binding=binding, lease=lease, error=UNAVAILABLE, idem=idem)


def job(web: Web, job_id: str) -> dict[str, Any]:
    found: dict[str, Any] = web.admin.get(f"/api/jobs/{job_id}").json()["job"]
    return found


def events(web: Web, job_id: str) -> list[dict[str, Any]]:
    response = web.admin.get("/api/audit", params={"job": job_id, "limit": 100})
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["events"]
    return found


def test_a_released_lease_puts_the_job_back_in_the_queue_and_the_next_attempt_claims_it(web: Web) -> None:
    job_id, binding = queued(web)
    first = claim(web, job_id, binding)
    reply = release(web, job_id, binding, first)
    assert reply.answer == Requeued(job_id, reply.answer.revision, 1)
    shown = job(web, job_id)
    assert (shown["state"], shown["attempt"], shown["lease"], shown["terminal"]) == ("QUEUED", 1, None, None)
    requeued = [e for e in events(web, job_id) if e["type"] == "hermes.job.requeued"]
    assert [(e["reasonCode"], e["actor"]["principal"]) for e in requeued] == [("hermes_unavailable", WORKER.principal)]
    second = claim(web, job_id, binding)
    assert second.lease_epoch == first.lease_epoch + 2  # the release fenced the first lease off
    assert job(web, job_id)["attempt"] == 2
    with pytest.raises(TalariaError) as stale:
        release(web, job_id, binding, first)
    assert stale.value.code == "stale_lease"


def test_a_release_with_its_attempts_used_up_ends_the_job_failed_with_the_error(web: Web) -> None:
    job_id, binding = queued(web)
    for _ in range(2):
        assert isinstance(release(web, job_id, binding, claim(web, job_id, binding)).answer, Requeued)
    last = release(web, job_id, binding, claim(web, job_id, binding)).answer
    assert isinstance(last, Ended)
    assert last.state == "FAILED"
    shown = job(web, job_id)
    assert (shown["state"], shown["attempt"], shown["terminal"]["reasonCode"]) == ("FAILED", 3, "hermes_unavailable")
    task = web.admin.get(f"/api/tasks/{shown['taskId']}").json()["task"]
    assert task["state"] == "FAILED"


def test_a_release_while_a_cancel_was_requested_ends_the_job_cancelled(web: Web) -> None:
    job_id, binding = queued(web)
    lease = claim(web, job_id, binding)
    assert web.admin.post(f"/api/jobs/{job_id}/cancel", json={"reason": "not now"}).status_code == 200
    ended = release(web, job_id, binding, lease).answer
    assert isinstance(ended, Ended)
    assert ended.state == "CANCELLED"
    assert job(web, job_id)["terminal"]["reasonCode"] == "holder_cancel"


def test_a_repeated_release_with_its_key_replays_the_first_answer_and_changes_nothing(web: Web) -> None:
    job_id, binding = queued(web)
    lease = claim(web, job_id, binding)
    first = release(web, job_id, binding, lease, key="k1")
    revision = job(web, job_id)["revision"]
    again = release(web, job_id, binding, lease, key="k1")
    assert again.replayed
    assert again.answer == first.answer
    assert job(web, job_id)["revision"] == revision


def test_a_release_of_a_queued_job_is_refused_and_changes_nothing(web: Web) -> None:
    job_id, binding = queued(web)
    lease = claim(web, job_id, binding)
    release(web, job_id, binding, lease)
    revision = job(web, job_id)["revision"]
    bogus = LeaseRef(lease.lease_id, lease.lease_epoch + 1)
    with pytest.raises(TalariaError) as refused:
        release(web, job_id, binding, bogus)
    assert refused.value.code == "invalid_transition"
    assert job(web, job_id)["revision"] == revision
