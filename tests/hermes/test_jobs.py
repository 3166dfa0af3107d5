"""Approved tasks run on a real Hermes through the dispatcher (the dispatcher issue)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from talaria.hub.timings import HubTimings
from talaria.testing.model_server import ModelServer, reply, slow, when
from talaria.testing.real_hermes import RealHermes
from tests.conftest import add_account, login
from tests.hermes.conftest import Node, running_node
from tests.hermes.job_support import People, approved, finished, wait_job
from tests.integration.runner_support import RunnerProcess, wait_until


@pytest.fixture
def people(node: Node) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    add_account(node.server, "root", "admin", allowed_profiles={"local": ["default"]})
    alice, root = login(node.server, "alice"), login(node.server, "root")
    try:
        yield alice, root
    finally:
        alice.close()
        root.close()


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


def test_a_runner_offline_before_submission_makes_the_job_wait_then_run_once(
    tmp_path: Path, hermes: RealHermes, model: ModelServer
) -> None:
    with running_node(tmp_path, hermes, model, timings=HubTimings(command_deadline_s=5)) as node:
        add_account(node.server, "root", "admin", allowed_profiles={"local": ["default"]})
        alice, root = login(node.server, "alice"), login(node.server, "root")
        try:
            _offline_before_submission(node, alice, root)
        finally:
            alice.close()
            root.close()


def _offline_before_submission(node: Node, alice: httpx.Client, root: httpx.Client) -> None:
    node.model.script(when("patience", reply("Worth the wait.")))
    node.runner.proc.send_signal(signal.SIGSTOP)  # frozen: the hub still holds its state, commands go nowhere
    try:
        job = approved(alice, root, "patience, please")
        wait_job(root, job["id"], lambda j: j["state"] == "RUNNING", timeout=10)
        # the first command's deadline passes undelivered: runner_offline, nothing submitted, the job waits
        waits = node.server.hub.dispatcher.pre_submit_waits
        wait_until(lambda: waits[job["id"]] >= 1, timeout=30, what="the job to wait for its runner")
        now = root.get(f"/api/jobs/{job['id']}").json()["job"]
        assert now["state"] == "RUNNING", now  # kept, heartbeating, waiting for the runner
        assert not any("patience" in json.dumps(r.body) for r in node.model.requests())
    finally:
        node.runner.proc.send_signal(signal.SIGCONT)
    done = wait_job(root, job["id"], finished)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 1, done
    assert done["result"]["outputs"]["reply"] == "Worth the wait."
    marker = f":{job['id']}]"
    assert sum(1 for r in node.model.chat_requests() if r.tools and marker in (r.last_user or "")) == 1
