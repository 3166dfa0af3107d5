"""Approved tasks run on a real Hermes through the dispatcher (the dispatcher issue)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from talaria.testing.model_server import reply, slow, when
from tests.conftest import add_account, login
from tests.hermes.conftest import Node
from tests.integration.runner_support import RunnerProcess

People = tuple[httpx.Client, httpx.Client]


@pytest.fixture
def people(node: Node) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    add_account(node.server, "root", "admin", allowed_profiles={"local": ["default"]})
    alice, root = login(node.server, "alice"), login(node.server, "root")
    try:
        yield alice, root
    finally:
        alice.close()
        root.close()


def approved(alice: httpx.Client, root: httpx.Client, prompt: str, profile: str = "default") -> dict[str, Any]:
    task = alice.post("/api/tasks", json={"title": "t", "prompt": prompt, "cell": "local", "profile": profile})
    task_id = task.json()["task"]["id"]
    assert alice.post(f"/api/tasks/{task_id}/submit").status_code == 200
    answer = root.post(f"/api/tasks/{task_id}/approve")
    assert answer.status_code == 200, answer.text
    job: dict[str, Any] = answer.json()["job"]
    return job


def wait_job(root: httpx.Client, job_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        job = root.get(f"/api/jobs/{job_id}").json()["job"]
        if done(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def finished(job: dict[str, Any]) -> bool:
    return job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")


def test_an_approved_task_succeeds_with_the_model_s_reply(node: Node, people: People) -> None:
    alice, root = people
    node.model.script(when("release notes", reply("The release adds durable jobs.")))
    job = approved(alice, root, "Summarise the release notes")
    done = wait_job(root, job["id"], finished)
    assert done["state"] == "SUCCEEDED", done
    assert done["result"]["outputs"]["reply"] == "The release adds durable jobs."
    assert done["result"]["summary"] == "The release adds durable jobs."
    marker = f":{job['id']}]"
    assert sum(1 for r in node.model.chat_requests() if r.tools and marker in (r.last_user or "")) == 1
    assert root.get("/api/audit/verify").json()["ok"] is True


def test_cancel_mid_turn_ends_cancelled_within_five_seconds(node: Node, people: People) -> None:
    alice, root = people
    node.model.script(when("endless", slow("word " * 400, chunk_delay_s=0.5)))
    job = approved(alice, root, "write an endless essay")
    node.model.wait_for(lambda log: any("endless" in (r.last_user or "") for r in log), timeout=60)
    asked = time.monotonic()
    assert root.post(f"/api/jobs/{job['id']}/cancel", json={"reason": "stop"}).status_code == 200
    done = wait_job(root, job["id"], finished, timeout=5)
    assert time.monotonic() - asked < 5
    assert done["state"] == "CANCELLED", done


def test_a_runner_killed_after_submission_completes_the_job_from_the_history(node: Node, people: People) -> None:
    alice, root = people
    node.model.script(when("keep going", slow("still here " * 10, first_byte_delay_s=1.0, chunk_delay_s=0.1)))
    job = approved(alice, root, "keep going after the runner dies")
    node.model.wait_for(lambda log: any("keep going" in (r.last_user or "") for r in log), timeout=60)
    node.runner.proc.kill()
    node.runner.proc.wait(10)
    node.runner.close()
    node.runner = RunnerProcess(node.config_path, node.runner.err_path.parent, name="runner-after-kill")
    node.runner.wait_for("runner connected")
    done = wait_job(root, job["id"], finished)
    assert done["state"] == "SUCCEEDED", done
    assert done["result"]["outputs"]["reply"] == ("still here " * 10).strip()  # Hermes trims the reply
    marker = f":{job['id']}]"
    assert sum(1 for r in node.model.chat_requests() if r.tools and marker in (r.last_user or "")) == 1


def test_the_author_losing_the_profile_while_queued_fails_not_admitted_and_the_model_never_sees_it(
    node: Node, people: People
) -> None:
    alice, root = people
    assert node.runner.stop() == 0  # no node connected: the job waits, queued
    job = approved(alice, root, "a prompt nobody may run")
    assert root.get(f"/api/jobs/{job['id']}").json()["job"]["state"] == "QUEUED"
    assert root.patch("/api/admin/accounts/alice", json={"allowedProfiles": {"local": []}}).status_code == 200
    node.runner.close()
    node.runner = RunnerProcess(node.config_path, node.runner.err_path.parent, name="runner-again")
    node.runner.wait_for("runner connected")
    done = wait_job(root, job["id"], finished)
    assert done["state"] == "FAILED" and done["result"]["code"] == "runner_command_not_admitted", done["result"]
    assert not any("nobody may run" in json.dumps(r.body) for r in node.model.requests())
