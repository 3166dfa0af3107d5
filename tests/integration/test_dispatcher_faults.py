"""The dispatcher under faults, over real sockets with the Hermes fixture: a turn past ``turns.max_turn_s``
ends ``turn_timeout`` (never uncertain); a transient store fault on a heartbeat or on the access check does
not kill a healthy turn; a hub that dies between the turn's end and the job's terminal commit finishes the
job from the turn's record in the next attempt, without opening another Hermes session."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from talaria.errors import StoreUnavailable
from tests.integration.dispatch_support import expire_attempt, hub_env, wait_prompt
from tests.integration.runner_support import wait_until


def test_a_turn_past_turns_max_turn_s_is_interrupted_and_the_job_fails_turn_timeout(tmp_path: Path) -> None:
    with hub_env(tmp_path, turns_max_turn_s=2) as env:
        env.hermes.knobs.delta_count = 100
        env.hermes.knobs.delta_delay = 0.2  # 20 s unless stopped
        env.start_runner()
        job = env.approved_job("an endless story")
        failed = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=20)
        assert failed["state"] == "FAILED", failed
        assert failed["result"]["code"] == "turn_timeout" and failed["result"]["retryable"] is False
        assert failed["attempt"] == 1
        env.hermes.wait_for(lambda: next(t for t in env.hermes.turns() if "endless" in t.text).status == "interrupted")
        assert env.hermes.prompt_count("an endless story") == 1


def _fail_next_call(target: Any, name: str, armed: threading.Event, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Make ``target.name`` raise ``store_unavailable`` on its first call once ``armed`` is set, and only then;
    returns the counts of calls after arming and of faults."""
    real = getattr(target, name)
    counts = {"calls": 0, "faults": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if not armed.is_set():
            return real(*args, **kwargs)
        counts["calls"] += 1
        if counts["faults"] == 0:
            counts["faults"] += 1
            raise StoreUnavailable()
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, flaky)
    return counts


@pytest.mark.parametrize("faulty", ["heartbeat", "access check"])
def test_a_store_fault_on_the_first_heartbeat_does_not_stop_a_healthy_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faulty: str
) -> None:
    with hub_env(tmp_path, lifecycle_lease_ttl_s=3) as env:
        env.hermes.knobs.delta_count = 25
        env.hermes.knobs.delta_delay = 0.2  # a 5 s turn: longer than the lease unless it is renewed
        hub, armed = env.server.hub, threading.Event()
        if faulty == "heartbeat":
            counts = _fail_next_call(hub.engine, "heartbeat", armed, monkeypatch)
        else:  # the access check of the heartbeat loop
            counts = _fail_next_call(hub.dispatcher, "_still_allowed", armed, monkeypatch)
        env.start_runner()
        job = env.approved_job("keep going")
        wait_prompt(env, "keep going")
        armed.set()
        done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED") or j["attempt"] > 1, timeout=30)
        assert done["state"] == "SUCCEEDED", (done["result"], done["terminal"])
        assert done["attempt"] == 1
        assert done["result"]["outputs"]["reply"].startswith("echo: keep going\n[talaria-run:")
        assert counts["faults"] == 1 and counts["calls"] >= 3  # the fault was hit, and later calls went on
        assert env.hermes.prompt_count("keep going") == 1


def test_a_hub_that_dies_between_the_turn_s_end_and_the_complete_commit_finishes_from_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with hub_env(tmp_path, lifecycle_lease_ttl_s=3) as env:
        env.start_runner()
        dispatcher = env.server.hub.dispatcher
        entered, released = threading.Event(), threading.Event()

        def stuck_complete(*args: Any, **kwargs: Any) -> Any:
            entered.set()  # the turn is over and recorded: the hub "dies" before the complete commits
            released.wait(30)
            raise RuntimeError("the hub is gone")  # never reaches the engine

        monkeypatch.setattr(dispatcher.holder, "complete", stuck_complete)
        job = env.approved_job("finish me once")
        assert entered.wait(20), "the turn never ended"
        recorded = dispatcher.turns.get(job["id"])
        assert recorded is not None and recorded.state == "finished" and recorded.outcome == "complete"
        releaser = threading.Thread(target=_release_after_stop, args=(dispatcher, released), daemon=True)
        releaser.start()
        env.server.restart()
        releaser.join(30)
        assert env.job(job["id"])["state"] == "RUNNING"  # attempt 1's lease is left to expire
        expire_attempt(env, job["id"])
        done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=30)
        assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, (done["result"], done["terminal"])
        assert done["result"]["outputs"]["reply"] == recorded.reply
        assert done["result"]["outputs"]["reply"].startswith("echo: finish me once\n[talaria-run:")
        assert len(env.hermes.rpc_requests("session.create")) == 1
        assert env.hermes.prompt_count("finish me once") == 1
        assert env.bob.get("/api/audit/verify").json()["ok"] is True


def _release_after_stop(dispatcher: Any, released: threading.Event) -> None:
    """Let the stuck call go once the dying hub's dispatcher has abandoned the job (its answer is dropped)."""
    wait_until(lambda: dispatcher.stopping and not dispatcher.running, timeout=30, what="the old dispatcher to stop")
    released.set()
