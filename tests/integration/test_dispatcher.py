"""The in-process dispatcher with the Hermes fixture, over real sockets: an approved task runs on the node and
its job ends SUCCEEDED with the reply; a job whose author lost the profile fails runner_command_not_admitted
without the prompt reaching Hermes; an admin cancel interrupts the turn."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from talaria.clock import SystemClock
from talaria.hub.timings import HubTimings
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.integration.dispatch_support import Env, expire_attempt, hub_env, prepared, wait_prompt
from tests.integration.runner_support import RunnerProcess, register_node, wait_until


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with hub_env(tmp_path) as made:
        yield made


def test_an_approved_task_runs_on_the_node_and_its_job_succeeds_with_the_reply(env: Env) -> None:
    env.start_runner()
    job = env.approved_job("Summarise notes.md in five lines")
    done = env.wait_job(job["id"], lambda j: j["state"] == "SUCCEEDED")
    reply = done["result"]["outputs"]["reply"]
    assert reply.startswith("echo: Summarise notes.md in five lines\n[talaria-run:")
    assert reply.endswith(f":{job['id']}]")
    assert done["result"]["summary"] == reply[:200]
    assert done["result"]["artifacts"] == []
    assert done["result"]["outputs"]["storedSessionId"]
    assert done["lease"] is None and done["attempt"] == 1
    marker = reply.rsplit("\n", 1)[1]
    assert env.hermes.prompt_count(marker) == 1
    task = env.alice.get(f"/api/tasks/{job['taskId']}").json()["task"]
    assert task["state"] == "SUCCEEDED"
    assert env.bob.get("/api/audit/verify").json()["ok"] is True
    events = env.bob.get("/api/audit", params={"job": job["id"]}).json()["events"]
    actors = {e["actor"]["principal"] for e in events if e["type"].startswith("hermes.job.")}
    assert "talaria-hub" in actors


def test_a_job_whose_author_lost_the_profile_fails_not_admitted_and_hermes_never_sees_it(env: Env) -> None:
    job = env.approved_job("secret plan")  # no runner connected yet: the job waits, queued
    scans = env.server.hub.dispatcher.scans
    wait_until(lambda: env.server.hub.dispatcher.scans >= scans + 2, what="two dispatcher scans")
    queued = env.job(job["id"])
    assert queued["state"] == "QUEUED"
    assert queued["waitingReason"] == "waiting for execution node 'node' (cell local) to connect"
    changed = env.bob.patch("/api/admin/accounts/alice", json={"allowedProfiles": {"local": []}})
    assert changed.status_code == 200, changed.text
    env.start_runner()
    failed = env.wait_job(job["id"], lambda j: j["state"] == "FAILED")
    assert failed["result"]["code"] == "runner_command_not_admitted"
    assert failed["result"]["retryable"] is False
    assert failed["terminal"]["reasonCode"] == "runner_command_not_admitted"
    assert env.hermes.prompt_count("secret plan") == 0


def test_an_admin_cancel_interrupts_the_turn_and_the_job_ends_cancelled(env: Env) -> None:
    env.hermes.knobs.delta_count = 50
    env.hermes.knobs.delta_delay = 0.5  # a 25 s turn
    env.start_runner()
    job = env.approved_job("a long essay")
    env.wait_job(job["id"], lambda j: j["state"] == "RUNNING")
    deadline = time.monotonic() + 10
    while env.hermes.prompt_count("a long essay") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    asked = time.monotonic()
    assert env.bob.post(f"/api/jobs/{job['id']}/cancel", json={"reason": "changed my mind"}).status_code == 200
    cancelled = env.wait_job(job["id"], lambda j: j["state"] == "CANCELLED", timeout=5)
    assert time.monotonic() - asked < 5
    assert cancelled["terminal"]["kind"] == "CANCELLED"
    assert next(t for t in env.hermes.turns() if "a long essay" in t.text).status == "interrupted"


def test_a_runner_killed_after_submission_and_restarted_completes_from_the_history(env: Env) -> None:
    env.hermes.knobs.delta_count = 10
    env.hermes.knobs.delta_delay = 0.3  # a 3 s turn
    env.start_runner()
    job = env.approved_job("survive the runner")
    wait_prompt(env, "survive the runner")
    assert env.runner is not None
    env.runner.proc.kill()  # SIGKILL: no goodbye; Hermes keeps the detached turn running
    env.runner.proc.wait(10)
    env.start_runner()
    done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=60)
    assert done["state"] == "SUCCEEDED", done
    assert done["result"]["outputs"]["reply"].startswith("echo: survive the runner\n[talaria-run:")
    assert done["attempt"] == 1
    assert env.hermes.prompt_count("survive the runner") == 1


def test_a_hub_restarted_mid_turn_never_replays_the_prompt(tmp_path: Path) -> None:
    """The runner's poll fails when the hub goes away, and its local disconnect interrupts the running
    session (runner-protocol.md 5.2): the next attempt recovers, finds no reply, and fails uncertain."""
    with HermesFixture() as hermes:
        hermes.knobs.delta_count = 10
        hermes.knobs.delta_delay = 0.3
        server = HubServer(tmp_path / "data", SystemClock(), lifecycle_heartbeat_interval_s=1,
                           lifecycle_lease_ttl_s=3).start()  # fmt: skip
        env = prepared(server, hermes, tmp_path)
        try:
            env.start_runner()
            job = env.approved_job("survive the hub")
            wait_prompt(env, "survive the hub")
            server.restart()  # the turn goes on in Hermes; the job's lease is left to expire
            expire_attempt(env, job["id"])  # the reaper: attempt 1 expired, requeued
            done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=60)
            assert done["state"] == "FAILED" and done["attempt"] == 2, (done["result"], done["terminal"])
            assert done["result"]["code"] == "runner_command_uncertain"
            assert hermes.prompt_count("survive the hub") == 1
            assert next(t for t in hermes.turns() if "survive the hub" in t.text).status == "interrupted"
        finally:
            env.close()
            server.stop()


def test_a_node_re_registered_between_attempts_fails_the_job_target_changed(tmp_path: Path) -> None:
    with HermesFixture() as hermes:
        hermes.knobs.delta_count = 20
        hermes.knobs.delta_delay = 0.3
        server = HubServer(tmp_path / "data", SystemClock(), lifecycle_heartbeat_interval_s=1,
                           lifecycle_lease_ttl_s=3).start()  # fmt: skip
        env = prepared(server, hermes, tmp_path)
        try:
            env.start_runner()
            job = env.approved_job("moving target")
            wait_prompt(env, "moving target")
            old = server.hub.registry.for_source("default", "local")
            assert old is not None
            server.restart()
            assert env.bob.delete(f"/api/admin/runners/{old.id}").status_code == 200
            assert env.runner is not None
            env.runner.wait(15)  # the disabled runner stops for good
            env.config_path = register_node(
                server, tmp_path / "node-2", hermes_url=hermes.url, session_token=hermes.session_token
            )
            env.start_runner()
            expire_attempt(env, job["id"])
            failed = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=60)
            assert failed["state"] == "FAILED" and failed["result"]["code"] == "runner_target_changed", failed
            assert hermes.prompt_count("moving target") == 1
        finally:
            env.close()
            server.stop()


def test_the_author_losing_access_mid_turn_interrupts_it_and_fails_access_revoked(env: Env) -> None:
    env.hermes.knobs.delta_count = 40
    env.hermes.knobs.delta_delay = 0.5  # a 20 s turn
    env.start_runner()
    job = env.approved_job("revoke me")
    wait_prompt(env, "revoke me")
    assert env.bob.patch("/api/admin/accounts/alice", json={"allowedProfiles": {"local": []}}).status_code == 200
    failed = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=10)
    assert failed["state"] == "FAILED" and failed["result"]["code"] == "access_revoked", failed["result"]
    deadline = time.monotonic() + 5
    while next(t for t in env.hermes.turns() if "revoke me" in t.text).status == "running":
        assert time.monotonic() < deadline, "the turn was not interrupted"
        time.sleep(0.05)
    assert next(t for t in env.hermes.turns() if "revoke me" in t.text).status == "interrupted"


@pytest.mark.slow
def test_fifty_jobs_across_three_profiles_on_two_runners_all_finish_none_twice(tmp_path: Path) -> None:
    profiles = ["default", "work", "research"]
    with HermesFixture(profiles=profiles) as hermes:
        server = HubServer(tmp_path / "data", SystemClock(), lifecycle_heartbeat_interval_s=1).start()
        runners: list[RunnerProcess] = []
        alice = bob = None
        try:
            add_account(server, "alice", allowed_profiles={"local": profiles, "lab": profiles})
            add_account(server, "bob", "admin", allowed_profiles={"local": ["default"]})
            for source in ("local", "lab"):
                path = register_node(server, tmp_path / source, hermes_url=hermes.url,
                                     session_token=hermes.session_token, name=source, source=source,
                                     allowedProfiles=profiles)  # fmt: skip
                runners.append(RunnerProcess(path, tmp_path / "logs", name=source))
            for runner in runners:
                runner.wait_for("runner connected")
            alice, bob = login(server, "alice"), login(server, "bob")
            jobs = {}
            for index in range(50):
                cell, profile = ("local", "lab")[index % 2], profiles[index % 3]
                body = {"title": f"t{index}", "prompt": f"job number {index}", "cell": cell, "profile": profile}
                task = alice.post("/api/tasks", json=body).json()["task"]
                assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
                job = bob.post(f"/api/tasks/{task['id']}/approve").json()["job"]
                jobs[job["id"]] = index
            deadline = time.monotonic() + 120
            while True:
                states = {j: bob.get(f"/api/jobs/{j}").json()["job"] for j in jobs}
                if all(s["state"] == "SUCCEEDED" for s in states.values()):
                    break
                assert time.monotonic() < deadline, [s["state"] for s in states.values()]
                time.sleep(0.3)
            for job_id, index in jobs.items():
                reply = states[job_id]["result"]["outputs"]["reply"]
                assert reply.startswith(f"echo: job number {index}\n") and reply.endswith(f":{job_id}]")
                assert hermes.prompt_count(f":{job_id}]") == 1
                assert states[job_id]["attempt"] == 1
            assert len(hermes.turns()) == 50
        finally:
            for client in (alice, bob):
                if client is not None:
                    client.close()
            for runner in runners:
                runner.stop()
                runner.close()
            server.stop()


def test_a_runner_offline_before_submission_makes_the_job_wait_then_run_once(tmp_path: Path) -> None:
    with hub_env(tmp_path, timings=HubTimings(command_deadline_s=2)) as env:
        _offline_before_submission(env)


def _offline_before_submission(env: Env) -> None:
    env.start_runner()
    assert env.runner is not None
    env.runner.proc.send_signal(signal.SIGSTOP)  # frozen: the hub still has its state, commands go nowhere
    try:
        job = env.approved_job("patience")
        env.wait_job(job["id"], lambda j: j["state"] == "RUNNING", timeout=10)
        # the first command's deadline passes undelivered: runner_offline, nothing submitted, the job waits
        waits = env.server.hub.dispatcher.pre_submit_waits
        wait_until(lambda: waits[job["id"]] >= 1, timeout=15, what="the job to wait for its runner")
        now = env.job(job["id"])
        assert now["state"] == "RUNNING", now["result"]  # kept, heartbeating, waiting for the runner
        assert env.hermes.prompt_count("patience") == 0
    finally:
        env.runner.proc.send_signal(signal.SIGCONT)
    done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=60)
    assert done["state"] == "SUCCEEDED", done["result"]
    assert done["attempt"] == 1
    assert env.hermes.prompt_count("patience") == 1


def test_a_turn_hermes_ends_with_an_error_fails_the_job_hermes_error_with_its_message(env: Env) -> None:
    env.hermes.fail_turn_for("doomed", "the model provider refused the request")
    env.start_runner()
    job = env.approved_job("a doomed request")
    failed = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"))
    assert failed["state"] == "FAILED"
    assert failed["result"]["code"] == "hermes_error" and failed["result"]["retryable"] is False
    assert "the model provider refused the request" in failed["result"]["message"]
    assert env.hermes.prompt_count("a doomed request") == 1


def test_tenants_take_turns_when_the_hub_has_one_slot(tmp_path: Path) -> None:
    with HermesFixture() as hermes:
        hermes.knobs.delta_count = 5
        hermes.knobs.delta_delay = 0.2  # a 1 s turn: every job is queued before the first one ends
        server = HubServer(tmp_path / "data", SystemClock(), lifecycle_heartbeat_interval_s=1,
                           dispatcher_per_hub=1).start()  # fmt: skip
        runners: list[RunnerProcess] = []
        clients: list[httpx.Client] = []
        try:
            for tenant, author, admin in (("default", "alice", "bob"), ("acme", "carol", "dave")):
                add_account(server, author, tenant=tenant, allowed_profiles={"local": ["default"]})
                add_account(server, admin, "admin", tenant=tenant, allowed_profiles={"local": ["default"]})
                path = register_node(server, tmp_path / tenant, hermes_url=hermes.url,
                                     session_token=hermes.session_token, tenant=tenant, name=tenant)  # fmt: skip
                runners.append(RunnerProcess(path, tmp_path / "logs", name=tenant))
                clients += [login(server, author), login(server, admin)]
            for runner in runners:
                runner.wait_for("runner connected")
            by_tenant: dict[str, list[str]] = {"default": [], "acme": []}
            for round_ in range(3):  # each tenant queues three jobs, the default tenant first
                for index, tenant in enumerate(("default", "acme")):
                    author, admin = clients[2 * index], clients[2 * index + 1]
                    body = {"title": "t", "prompt": f"{tenant} {round_}", "cell": "local", "profile": "default"}
                    task = author.post("/api/tasks", json=body).json()["task"]
                    assert author.post(f"/api/tasks/{task['id']}/submit").status_code == 200
                    by_tenant[tenant].append(admin.post(f"/api/tasks/{task['id']}/approve").json()["job"]["id"])
            deadline = time.monotonic() + 60
            while True:
                jobs = [
                    (clients[1] if t == "default" else clients[3]).get(f"/api/jobs/{j}").json()["job"] | {"t": t}
                    for t, ids in by_tenant.items() for j in ids
                ]  # fmt: skip
                if all(j["state"] == "SUCCEEDED" for j in jobs):
                    break
                assert time.monotonic() < deadline, [j["state"] for j in jobs]
                time.sleep(0.2)
            order = [j["t"] for j in sorted(jobs, key=lambda j: j["startedAt"])]
            # after the first job, the tenants alternate: one tenant's backlog never takes two slots in a row
            assert all(a != b for a, b in itertools.pairwise(order[1:])), order
        finally:
            for client in clients:
                client.close()
            for runner in runners:
                runner.stop()
                runner.close()
            server.stop()
