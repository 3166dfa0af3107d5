"""A Hermes outage before anything was submitted (issue 12 item 5, ADR 0030), over real sockets with a real runner
and the Hermes fixture: the attempt is given back with the retryable ``hermes_unavailable``, the node is held
until its Hermes answers again, and the next attempt then runs the prompt once; a job whose attempts are used up
ends FAILED with ``hermes_unavailable``, retryable, never ``runner_command_not_admitted``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from talaria.hub.timings import HubTimings
from tests.integration.dispatch_support import Env, hub_env
from tests.integration.runner_support import wait_until

QUICK = HubTimings(hermes_retry_s=0.2, hermes_retry_max_s=0.4)


def requeues(env: Env, job_id: str) -> list[dict[str, Any]]:
    events = env.bob.get("/api/audit", params={"job": job_id, "limit": 100}).json()["events"]
    return [e for e in events if e["type"] == "hermes.job.requeued"]


def test_a_hermes_outage_gives_the_attempt_back_and_the_next_attempt_runs_once_hermes_is_back(tmp_path: Path) -> None:
    with hub_env(tmp_path, timings=QUICK) as env:
        env.hermes.fail_route("/api/status", 503)  # Hermes cannot be reached or authenticated: hermes_unavailable
        env.start_runner()
        job = env.approved_job("wait for hermes")
        wait_until(lambda: requeues(env, job["id"]), timeout=20, what="the first attempt to be given back")
        holds = env.server.hub.dispatcher.holds
        probes = holds.probes
        wait_until(lambda: holds.probes >= probes + 2, timeout=20, what="the held node's Hermes to be asked again")
        waiting = env.job(job["id"])
        assert (waiting["state"], waiting["attempt"]) == ("QUEUED", 1), waiting  # held: not claimed again
        assert waiting["waitingReason"] == (
            "Hermes on execution node 'node' is unavailable; the job runs when it answers again"
        )
        assert [e["reasonCode"] for e in requeues(env, job["id"])] == ["hermes_unavailable"]
        assert env.hermes.prompt_count("wait for hermes") == 0
        env.hermes.reset_knobs()  # Hermes is back
        done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=30)
        assert (done["state"], done["attempt"]) == ("SUCCEEDED", 2), (done["result"], done["terminal"])
        assert done["result"]["outputs"]["reply"].startswith("echo: wait for hermes\n[talaria-run:")
        assert env.hermes.prompt_count("wait for hermes") == 1
        assert env.bob.get("/api/audit/verify").json()["ok"] is True


def test_a_job_whose_attempts_all_meet_the_outage_fails_hermes_unavailable_and_retryable(tmp_path: Path) -> None:
    with hub_env(tmp_path, timings=QUICK, lifecycle_max_attempts=1) as env:
        env.hermes.fail_route("/api/status", 503)
        env.start_runner()
        job = env.approved_job("never reaches hermes")
        done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=30)
        assert (done["state"], done["attempt"]) == ("FAILED", 1), done
        assert done["terminal"]["reasonCode"] == "hermes_unavailable"
        assert done["result"]["code"] == "hermes_unavailable" and done["result"]["retryable"] is True
        assert requeues(env, job["id"]) == []
        assert env.hermes.prompt_count("never reaches hermes") == 0


def test_a_held_node_that_is_disabled_ends_its_watch(tmp_path: Path) -> None:
    with hub_env(tmp_path, timings=QUICK) as env:
        env.hermes.fail_route("/api/status", 503)
        env.start_runner()
        job = env.approved_job("held then disabled")
        wait_until(lambda: requeues(env, job["id"]), timeout=20, what="the attempt to be given back")
        holds = env.server.hub.dispatcher.holds
        runner_id = json.loads(env.config_path.read_text())["runnerId"]
        assert holds.is_held(runner_id)
        assert env.bob.delete(f"/api/admin/runners/{runner_id}").status_code == 200
        wait_until(lambda: not holds.is_held(runner_id), timeout=20, what="the watch of the disabled node to end")
        assert env.job(job["id"])["state"] == "QUEUED"  # no node serves it now
        assert env.hermes.prompt_count("held then disabled") == 0
