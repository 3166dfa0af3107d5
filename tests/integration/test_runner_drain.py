"""Draining a runner (operations.md 3; scenarios 9.5-9.7) over real processes: a hub with the dispatcher, a
``talaria runner`` process and the Hermes fixture. A drain takes no new work, lets what runs finish and stops the
runner with exit 0; a runner started again is not draining.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from talaria.errors import TalariaError
from talaria.hub.runners import limits
from talaria.hub.runners.connection_state import AccountRef
from tests.integration.dispatch_support import Env, hub_env, wait_prompt
from tests.integration.runner_support import RunnerProcess, clean_env, outcome, runner_summary, send, wait_until

DRAINING = "runner draining"
DRAINED = "runner drained"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with hub_env(tmp_path) as made:
        yield made


def summary(env: Env) -> dict[str, Any]:
    return runner_summary(env.bob, env.runner_id)


def start(env: Env, *options: str) -> RunnerProcess:
    if env.runner is not None:
        env.runner.close()  # the previous one (stopped) releases its files
    argv = [sys.executable, "-m", "talaria", "runner", "--config", str(env.config_path), *options]
    env.runner = RunnerProcess(env.config_path, env.tmp / "logs", f"runner-{uuid.uuid4().hex[:8]}", argv=argv)
    env.runner.wait_for("runner connected")
    return env.runner


def test_sigquit_during_a_turn_takes_no_new_work_finishes_the_turn_and_exits_0(env: Env) -> None:
    env.hermes.delta_delay_for("the long one", 30)  # held until released below
    runner = start(env)
    job = env.approved_job("the long one")
    wait_prompt(env, "the long one")

    runner.proc.send_signal(signal.SIGQUIT)
    runner.wait_for(DRAINING)
    wait_until(lambda: summary(env)["draining"] is True, timeout=5, what="the hub to show the drain")
    assert isinstance(summary(env)["drainingSince"], int)
    page = env.bob.get("/settings/nodes/live")
    assert 'data-testid="node-status">Draining<' in page.text
    assert "Drain node" not in page.text, "no Drain button on a draining node"

    # new work: the hub refuses it before sending, the runner itself refuses what reaches it
    turn = env.bob.post(f"/api/admin/runners/{env.runner_id}/test-turn", json={"prompt": "hello"})
    assert (turn.status_code, turn.json()["code"]) == (503, "runner_draining"), turn.text
    direct = outcome(env.server, send(env.server, env.runner_id, {"connectionId": str(uuid.uuid4())}, "gateway.open"))
    assert isinstance(direct, TalariaError) and (direct.code, direct.status) == ("runner_draining", 503), direct
    assert env.hermes.prompt_count("hello") == 0
    second = env.approved_job("approved meanwhile")
    wait_until(lambda: env.job(second["id"]).get("waitingReason") == "node node is draining", timeout=10,
               what="the second job to wait for the drain")  # fmt: skip
    assert env.job(second["id"])["state"] == "QUEUED"

    env.hermes.delta_delay_for("the long one", 0)
    done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=30)
    assert done["state"] == "SUCCEEDED", done
    assert env.hermes.prompt_count("the long one") == 1
    assert runner.wait(30) == 0, runner.stderr
    lines = runner.lines
    assert lines.index(DRAINING) < lines.index(DRAINED) < len(lines) - 1 and lines[-1] == "runner stopped", lines
    assert next(t for t in env.hermes.turns() if "the long one" in t.text).status == "complete"

    # started again, the runner is not draining and takes the job that waited
    start(env)
    assert summary(env)["draining"] is False
    ran = env.wait_job(second["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=30)
    assert ran["state"] == "SUCCEEDED", ran


def test_an_admin_drain_through_the_api_stops_an_idle_runner(env: Env) -> None:
    runner = start(env)
    answer = env.bob.post(f"/api/admin/runners/{env.runner_id}/drain")
    assert (answer.status_code, answer.json()) == (200, {"ok": True}), answer.text
    runner.wait_for(DRAINING, timeout=5)
    assert runner.wait(15) == 0, runner.stderr
    assert runner.lines[-2:] == [DRAINED, "runner stopped"], runner.lines
    again = env.bob.post(f"/api/admin/runners/{env.runner_id}/drain")
    assert (again.status_code, again.json()["code"]) == (503, "runner_offline")


def test_the_command_line_drains_a_runner_at_its_next_request(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "POLL_HOLD_S", 1)  # the request is applied at the runner's next poll
    runner = start(env)
    command = [sys.executable, "-m", "talaria", "admin", "runners", "drain", env.runner_id, "--data-dir",
               str(env.server.data_dir)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=clean_env(), timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    runner.wait_for(DRAINING, timeout=10)
    assert runner.wait(15) == 0, runner.stderr
    assert DRAINED in runner.lines


def test_a_drain_timeout_interrupts_the_turn_exits_0_and_the_job_is_never_replayed(env: Env) -> None:
    env.hermes.delta_delay_for("ten seconds", 30)
    runner = start(env, "--drain-timeout", "2")
    job = env.approved_job("ten seconds")
    wait_prompt(env, "ten seconds")
    runner.proc.send_signal(signal.SIGQUIT)
    runner.wait_for(DRAINING)
    assert runner.wait(30) == 0, runner.stderr
    assert "runner drain timed out: 1 channels open" in runner.lines, runner.lines
    assert DRAINED not in runner.lines
    wait_until(lambda: next(t for t in env.hermes.turns() if "ten seconds" in t.text).status == "interrupted",
               timeout=10, what="the turn to be interrupted")  # fmt: skip
    env.hermes.delta_delay_for("ten seconds", 0)
    start(env)  # the next attempt recovers on the node: no reply, so uncertain, and never submitted again
    done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=90)
    assert done["state"] == "FAILED", done
    assert done["result"]["code"] == "runner_command_uncertain", done["result"]
    assert env.hermes.prompt_count("ten seconds") == 1


def test_sigterm_during_a_drain_stops_at_once_and_a_second_sigquit_does_nothing(env: Env) -> None:
    env.hermes.delta_delay_for("stays open", 30)
    runner = start(env)
    env.approved_job("stays open")
    wait_prompt(env, "stays open")
    runner.proc.send_signal(signal.SIGQUIT)
    runner.wait_for(DRAINING)
    runner.proc.send_signal(signal.SIGQUIT)
    runner.proc.send_signal(signal.SIGTERM)
    assert runner.wait(30) == 0, runner.stderr
    assert runner.lines.count(DRAINING) == 1
    assert DRAINED not in runner.lines and runner.lines[-1] == "runner stopped"
    env.hermes.delta_delay_for("stays open", 0)


def test_draining_takes_no_new_grant_or_prompt_on_an_open_channel(env: Env) -> None:
    runner = start(env)
    channels = env.server.hub.channels
    alice = env.server.hub.accounts.get("alice")
    assert alice is not None
    account = AccountRef(alice.username, alice.tenant, alice.auth_version)
    gateway = env.server.call(channels.open_gateway(env.runner_id, account))
    created = env.server.call(channels.rpc(gateway, "session.create", {"close_on_disconnect": False}))
    runner.proc.send_signal(signal.SIGQUIT)
    runner.wait_for(DRAINING)
    with pytest.raises(TalariaError) as refused:
        env.server.call(channels.rpc(gateway, "prompt.submit", {"session_id": created["session_id"], "text": "x"}))
    assert refused.value.code == "runner_draining"
    # what is not new work still runs on the open channel
    usage = env.server.call(channels.rpc(gateway, "session.usage", {"session_id": created["session_id"]}))
    assert isinstance(usage, dict)
    assert runner.proc.poll() is None, "an open channel keeps the runner"
    env.server.call(channels.close_gateway(gateway))
    assert runner.wait(15) == 0, runner.stderr
    assert DRAINED in runner.lines
    assert env.hermes.prompt_count("x") == 0
