"""A hub drained by SIGTERM for a planned restart (operations.md 3.4; scenario 9.8): a ``talaria hub`` process over
SQLite, a runner process and the Hermes fixture. With time to drain, the running job turn finishes before the hub
exits 0 and nothing new starts meanwhile; with too little, ADR 0017's outcomes hold.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.testing.hermes_fixture import HermesFixture
from tests.hermes.chat_support import make_bot, send, start_chat, wait_turn
from tests.hermes.site_support import create_user, register_node, sign_in
from tests.integration.cli_support import HubProcess, clean_env, free_port
from tests.integration.runner_support import RunnerProcess, wait_until

LEASE = {"TALARIA_LIFECYCLE_LEASE_TTL_S": "3", "TALARIA_LIFECYCLE_HEARTBEAT_INTERVAL_S": "1",
         "TALARIA_LIFECYCLE_REAPER_INTERVAL_S": "1"}  # fmt: skip


@dataclass
class Site:
    tmp: Path
    url: str
    hermes: HermesFixture
    config: Path
    hub: HubProcess
    runner: RunnerProcess
    alice: httpx.Client
    root: httpx.Client

    def start_hub(self, drain_timeout: int) -> None:
        self.hub.close()
        args = ["--data-dir", str(self.tmp / "data"), "--port", self.url.rsplit(":", 1)[1]]
        self.hub = HubProcess(self.tmp, [*args, "--drain-timeout", str(drain_timeout)], clean_env(**LEASE))
        self.hub.ready()

    def approved_job(self, prompt: str) -> str:
        body = {"title": "a task", "prompt": prompt, "cell": "local", "profile": "default"}
        task = self.alice.post("/api/tasks", json=body).json()["task"]
        assert self.alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
        approved = self.root.post(f"/api/tasks/{task['id']}/approve")
        assert approved.status_code == 200, approved.text
        job_id: str = approved.json()["job"]["id"]
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.root.get(f"/api/jobs/{job_id}").json()["job"]
        return found

    def ended(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        wait_until(lambda: self.job(job_id)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=timeout,
                   what=f"job {job_id} to end")  # fmt: skip
        return self.job(job_id)

    def runner_id(self) -> str:
        found: str = json.loads(self.config.read_text())["runnerId"]
        return found


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with HermesFixture() as hermes:
        data = tmp_path / "data"
        url = f"http://127.0.0.1:{free_port()}"
        create_user(data, "alice", "user", ("local:default",))
        create_user(data, "root", "admin", ("local:default",))
        config = register_node(tmp_path, url, hermes, "node")  # the fixture's url and token, as real Hermes has
        args = ["--data-dir", str(data), "--port", url.rsplit(":", 1)[1], "--drain-timeout", "60"]
        hub = HubProcess(tmp_path, args, clean_env(**LEASE))
        runner: RunnerProcess | None = None
        made: Site | None = None
        try:
            hub.ready()
            runner = RunnerProcess(config, tmp_path / "logs")
            runner.wait_for("runner connected", timeout=30)
            made = Site(tmp_path, url, hermes, config, hub, runner, sign_in(url, "alice"), sign_in(url, "root"))
            yield made
        finally:
            if made is not None:
                made.alice.close()
                made.root.close()
                hub = made.hub
            if runner is not None:
                runner.close()
            hub.close()


def wait_prompt(hermes: HermesFixture, text: str) -> None:
    wait_until(lambda: hermes.prompt_count(text) > 0, timeout=30, what=f"Hermes to get {text!r}")


def test_sigterm_drains_the_running_job_turn_before_the_hub_exits_and_starts_nothing_new(site: Site) -> None:
    site.hermes.delta_delay_for("the long job", 30)  # held until released below
    first = site.approved_job("the long job")
    wait_prompt(site.hermes, "the long job")

    site.hub.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: httpx.get(f"{site.url}/readyz", timeout=10).status_code == 503, timeout=5,
               what="readyz to say the hub drains")  # fmt: skip
    ready = httpx.get(f"{site.url}/readyz", timeout=10)
    assert ready.json()["code"] == "hub_draining", ready.text
    turn = site.root.post(f"/api/admin/runners/{site.runner_id()}/test-turn", json={"prompt": "a test"})
    assert (turn.status_code, turn.json()["code"]) == (503, "hub_draining"), turn.text
    assert turn.headers["retry-after"] == "1"
    second = site.approved_job("approved while draining")  # the API serves on; the job waits for the restart
    time.sleep(0.3)  # give a dispatcher that wrongly claimed it the time to do so
    assert site.job(second)["state"] == "QUEUED"
    assert site.hermes.prompt_count("approved while draining") == 0
    assert site.hub.proc.poll() is None, "the hub waits for its running turn"

    site.hermes.delta_delay_for("the long job", 0)
    assert site.hub.proc.wait(30) == 0, site.hub.stderr()
    log = site.hub.stderr()
    assert '"hub_draining"' in log and '"running_turns": 1' in log, log[-2000:]
    assert '"hub_drained"' in log
    assert next(t for t in site.hermes.turns() if "the long job" in t.text).status == "complete", "no interrupt"

    site.start_hub(60)
    done = site.ended(first)
    assert done["state"] == "SUCCEEDED", done
    assert site.hermes.prompt_count("the long job") == 1
    ran = site.ended(second)
    assert ran["state"] == "SUCCEEDED", ran
    assert site.hermes.prompt_count("approved while draining") == 1


def test_a_second_signal_stops_at_once_and_adr_0017_s_outcomes_hold(site: Site) -> None:
    site.hermes.delta_delay_for("cut short", 30)
    job = site.approved_job("cut short")
    wait_prompt(site.hermes, "cut short")
    site.hub.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: httpx.get(f"{site.url}/readyz", timeout=10).status_code == 503, timeout=5,
               what="readyz to say the hub drains")  # fmt: skip
    site.hub.proc.send_signal(signal.SIGTERM)  # the second: step 3 at once
    assert site.hub.proc.wait(30) == 0, site.hub.stderr()
    assert '"hub_drained"' not in site.hub.stderr()
    site.start_hub(60)  # a restarted SQLite hub: new epochs, the runner interrupts what it still runs
    done = site.ended(job, timeout=90)
    assert done["state"] == "FAILED" and done["result"]["code"] == "runner_command_uncertain", done
    assert site.hermes.prompt_count("cut short") == 1, "never submitted twice"
    site.hermes.delta_delay_for("cut short", 0)


def test_a_drain_timeout_ends_the_wait(site: Site) -> None:
    site.start_hub(1)
    site.runner.wait_for("runner connected", count=2, timeout=40)
    site.hermes.delta_delay_for("too long", 30)
    job = site.approved_job("too long")
    wait_prompt(site.hermes, "too long")
    site.hub.proc.send_signal(signal.SIGTERM)
    assert site.hub.proc.wait(30) == 0, site.hub.stderr()
    assert '"hub_drain_timed_out"' in site.hub.stderr()
    site.start_hub(60)
    done = site.ended(job, timeout=90)
    assert done["state"] == "FAILED" and done["result"]["code"] == "runner_command_uncertain", done
    assert site.hermes.prompt_count("too long") == 1
    site.hermes.delta_delay_for("too long", 0)


def test_a_chat_turn_streaming_through_a_drain_completes_and_a_new_message_is_refused(site: Site) -> None:
    bot = make_bot(site.alice)
    conversation = start_chat(site.alice, bot)
    site.hermes.delta_delay_for("chat through", 30)
    sent = send(site.alice, conversation, "chat through the drain")
    assert sent.status_code == 202, sent.text
    turn_id = sent.json()["turn"]["id"]
    wait_prompt(site.hermes, "chat through")

    site.hub.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: httpx.get(f"{site.url}/readyz", timeout=10).status_code == 503, timeout=5,
               what="readyz to say the hub drains")  # fmt: skip
    other = start_chat(site.alice, bot)
    refused = send(site.alice, other, "not now")
    assert (refused.status_code, refused.json()["code"]) == (503, "hub_draining"), refused.text
    assert refused.headers["retry-after"] == "1"

    site.hermes.delta_delay_for("chat through", 0)
    assert site.hub.proc.wait(30) == 0, site.hub.stderr()
    site.start_hub(60)
    turn = wait_turn(site.alice, conversation, turn_id)
    assert turn["state"] == "completed", turn
    assert site.hermes.prompt_count("chat through") == 1
    assert next(t for t in site.hermes.turns() if "chat through" in t.text).status == "complete"
    assert site.hermes.prompt_count("not now") == 0
