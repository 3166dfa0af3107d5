"""Credential rotation (operations.md 4; scenarios 9.9-9.11) over real processes: a hub with the dispatcher, a
``talaria runner`` process and the Hermes fixture. The runner keeps its rotated token in ``credential.json`` and
every step of a rotation, killed, leaves a working credential.

Crashes are real SIGKILLs at the step: a ``sitecustomize`` on the runner's ``PYTHONPATH`` wraps the step so that the
process kills itself there (after the rotate answer arrived, before the rename, after the rename).
"""

from __future__ import annotations

import json
import stat
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from talaria.canonical import sha256_hex
from tests.integration.dispatch_support import Env, hub_env
from tests.integration.runner_support import RunnerProcess, runner_summary, wait_until

ROTATED = "runner credential rotated"
RESTORED = "runner credential restored: the hub refused the new token and accepted the previous one"

CRASH_HOOK = """
import os
import signal

POINT = os.environ.get("ROTATION_CRASH_AT")


def die():
    os.kill(os.getpid(), signal.SIGKILL)


if POINT == "answer":
    from talaria.runner import hub_client

    post = hub_client.HubClient.post

    async def crashing_post(self, op, epoch, body):
        answer = await post(self, op, epoch, body)
        if op == "rotate":
            die()
        return answer

    hub_client.HubClient.post = crashing_post
elif POINT in ("before-rename", "renamed"):
    from talaria.runner import credential

    install = credential.CredentialFile._install

    def crashing_install(self, temp):
        if POINT == "renamed":
            install(self, temp)
        die()

    credential.CredentialFile._install = crashing_install
"""


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with hub_env(tmp_path) as made:
        yield made


def config_token(env: Env) -> str:
    token: str = json.loads(env.config_path.read_text())["token"]
    return token


def state_dir(env: Env) -> Path:
    return env.config_path.parent / "state" / env.runner_id


def credential(env: Env) -> dict[str, Any]:
    path = state_dir(env) / "credential.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    body: dict[str, Any] = json.loads(path.read_text())
    assert set(body) == {"token", "issuedAt", "previous"}
    return body


def start(env: Env, crash_at: str | None = None) -> RunnerProcess:
    if env.runner is not None:
        env.runner.close()
    extra: dict[str, str] = {}
    if crash_at is not None:
        shadow = env.tmp / "shadow"
        shadow.mkdir(exist_ok=True)
        (shadow / "sitecustomize.py").write_text(CRASH_HOOK)
        extra = {"PYTHONPATH": str(shadow), "ROTATION_CRASH_AT": crash_at}
    argv = [sys.executable, "-m", "talaria", "runner", "--config", str(env.config_path)]
    name = f"runner-{uuid.uuid4().hex[:8]}"
    env.runner = RunnerProcess(env.config_path, env.tmp / "logs", name, argv=argv, env=extra)
    env.runner.wait_for("runner connected")
    return env.runner


def ask(env: Env) -> None:
    answer = env.bob.post(f"/api/admin/runners/{env.runner_id}/rotate-token")
    assert (answer.status_code, answer.json()) == (200, {"ok": True}), answer.text


def accepted(env: Env, token: str) -> bool:
    """Gate 1 as the hub sees it: the current token's hash."""
    record = env.server.hub.registry.get(env.runner_id)
    assert record is not None
    return record.token_hash == sha256_hex(token)


def refused_raw(env: Env, token: str) -> None:
    """A raw request with ``token`` gets 403 ``runner_unauthorized`` (a new instance: refused at gate 1, it replaces
    nothing)."""
    import httpx

    response = httpx.get(
        f"{env.server.url}/api/runner/v1/{env.runner_id}/poll",
        headers={"Authorization": f"Bearer {token}", "X-Runner-Instance": str(uuid.uuid4()), "X-Runner-Protocol": "1"},
        timeout=10,
    )
    assert (response.status_code, response.json()["code"]) == (403, "runner_unauthorized"), response.text


def job_runs(env: Env, prompt: str) -> None:
    job = env.approved_job(prompt)
    done = env.wait_job(job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=30)
    assert done["state"] == "SUCCEEDED", done


def assert_no_tokens(env: Env, *tokens: str) -> None:
    assert env.runner is not None
    env.runner.assert_silent_about(*tokens)
    shown = env.bob.get("/api/admin/runners").text + env.bob.get("/settings/nodes/live").text
    for token in tokens:
        assert token not in shown


def test_an_admin_rotation_is_taken_within_one_poll_and_retires_the_old_token(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    runner = start(env)
    old = config_token(env)
    created = runner_summary(env.bob, env.runner_id)["createdAt"]
    assert "rotate-v1" in runner_summary(env.bob, env.runner_id)["features"]
    ask(env)
    runner.wait_for(ROTATED, timeout=10)
    body = credential(env)
    new = body["token"]
    assert new != old and body["previous"] == old and isinstance(body["issuedAt"], int)
    assert accepted(env, new), "promoted at its first use"
    refused_raw(env, old)
    summary = runner_summary(env.bob, env.runner_id)
    assert summary["tokenIssuedAt"] > created and summary["rotationPending"] is False
    assert json.loads(env.config_path.read_text())["token"] == old, "runner.json is never rewritten"
    job_runs(env, "after the rotation")
    assert runner.lines.count("runner connected") == 1, "the epoch did not change"
    assert runner.stop() == 0
    assert_no_tokens(env, old, new)
    assert "runner_token_rotated" in caplog.text
    assert old not in caplog.text and new not in caplog.text, "no token in the hub's log"

    # started again, the runner uses credential.json's token
    start(env)
    job_runs(env, "after a restart")
    assert env.runner is not None and ROTATED not in env.runner.lines


@pytest.mark.parametrize("crash_at", ["answer", "before-rename", "renamed"])
def test_a_rotation_killed_at_any_step_leaves_a_working_credential(env: Env, crash_at: str) -> None:
    runner = start(env, crash_at)
    old = config_token(env)
    ask(env)
    assert runner.wait(15) == -9, runner.stderr
    directory = state_dir(env)
    leftovers = sorted(p.name for p in directory.iterdir() if p.name.startswith(".credential-"))
    record = env.server.hub.registry.get(env.runner_id)
    assert record is not None and record.token_next_hash is not None, "the hub issued a next token"
    if crash_at == "renamed":
        assert leftovers == [] and credential(env)["previous"] == old
        new = credential(env)["token"]
    else:
        assert not (directory / "credential.json").exists()
        assert len(leftovers) == (1 if crash_at == "before-rename" else 0), leftovers
    assert accepted(env, old), "nothing promoted yet"

    restarted = start(env)
    assert not any((directory / name).exists() for name in leftovers), "a crash's leftover is removed"
    if crash_at == "renamed":  # the new token promotes at the first request; nothing is asked any more
        wait_until(lambda: accepted(env, new), timeout=10, what="the new token to promote")
        assert credential(env) == {"token": new, "issuedAt": credential(env)["issuedAt"], "previous": old}
    else:  # the old token works, the hub asks again and the unused next is replaced
        restarted.wait_for(ROTATED, timeout=10)
        new = credential(env)["token"]
        assert accepted(env, new) and credential(env)["previous"] == old
        assert runner_summary(env.bob, env.runner_id)["tokenNextReplacedAt"] is not None
    refused_raw(env, old)
    job_runs(env, f"after a crash at {crash_at}")
    assert_no_tokens(env, old, new)


def test_a_next_token_the_hub_dropped_falls_back_to_previous(tmp_path: Path) -> None:
    with hub_env(tmp_path, runners_token_overlap_s=1) as env:
        runner = start(env, "renamed")
        old = config_token(env)
        ask(env)
        assert runner.wait(15) == -9, runner.stderr
        dropped = credential(env)["token"]
        registry = env.server.hub.registry

        def expired() -> bool:
            record = registry.get(env.runner_id)
            return record is not None and not record.next_live(env.server.hub.clock.now_ms(), 1000)

        wait_until(expired, timeout=5, what="the hub to drop the unused next token")
        restarted = start(env)
        restarted.wait_for(RESTORED, timeout=10)
        restarted.wait_for(ROTATED, timeout=10)  # still asked: it rotates again from the restored token
        body = credential(env)
        assert body["previous"] == old and body["token"] not in (old, dropped)
        assert accepted(env, body["token"])
        refused_raw(env, dropped)
        job_runs(env, "after the fallback")
        assert_no_tokens(env, old, dropped, body["token"])


def test_scheduled_rotation_once_the_token_is_old_enough(tmp_path: Path) -> None:
    with hub_env(tmp_path, runners_token_rotate_after_s=5) as env:
        runner = start(env)
        created = runner_summary(env.bob, env.runner_id)["createdAt"]
        runner.wait_for(ROTATED, timeout=20)
        issued = credential(env)["issuedAt"]
        assert issued >= created + 5000, "none before the token is 5 s old"
        assert runner.lines.count(ROTATED) == 1
        assert runner_summary(env.bob, env.runner_id)["tokenIssuedAt"] >= issued


def test_an_invalid_credential_file_stops_the_runner_with_status_2(env: Env) -> None:
    start(env)
    assert env.runner is not None and env.runner.stop() == 0
    path = state_dir(env) / "credential.json"
    path.write_text('{"token": "t"}')
    path.chmod(0o600)
    runner = RunnerProcess(env.config_path, env.tmp / "logs", "invalid")
    try:
        assert runner.wait(15) == 2
        assert f"talaria runner: {path}: invalid credential file: expected exactly the keys" in runner.stderr
    finally:
        runner.close()
