"""Logs and traces across the hub and the runner (operations.md 5.3, 5.5; scenarios 9.13-9.14): a ``talaria hub``
process writing JSON lines, a runner process with ``--log-format json`` and the Hermes fixture. Every hub line of a
job's work carries its ``job_id`` and ``trace``; the runner's ``command_*`` lines for it carry the trace (trace-v1);
a ``traceparent`` given at the task's creation is the trace."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from talaria.testing.hermes_fixture import HermesFixture
from tests.hermes.site_support import create_user, register_node, sign_in
from tests.integration.cli_support import HubProcess, clean_env, free_port
from tests.integration.runner_support import RunnerProcess, wait_until


def records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[HubProcess, RunnerProcess, str, HermesFixture]]:
    with HermesFixture() as hermes:
        data = tmp_path / "data"
        url = f"http://127.0.0.1:{free_port()}"
        create_user(data, "alice", "user", ("local:default",))
        create_user(data, "root", "admin", ("local:default",))
        config = register_node(tmp_path, url, hermes, "node")
        hub = HubProcess(tmp_path, ["--data-dir", str(data), "--port", url.rsplit(":", 1)[1]], clean_env())
        runner: RunnerProcess | None = None
        try:
            hub.ready()
            argv = [sys.executable, "-m", "talaria", "runner", "--config", str(config), "--log-format", "json"]
            runner = RunnerProcess(config, tmp_path / "logs", argv=argv)
            wait_until(lambda: any(r["event"] == "runner_connected" for r in records(runner.stderr)), timeout=30,
                       what="the runner to connect")  # fmt: skip
            yield hub, runner, url, hermes
        finally:
            if runner is not None:
                runner.close()
            hub.close()


def test_every_line_of_a_job_s_work_carries_its_job_id_and_the_trace_given_at_creation(
    traced: tuple[HubProcess, RunnerProcess, str, HermesFixture],
) -> None:
    hub, runner, url, hermes = traced
    trace = secrets.token_hex(16)
    alice, root = sign_in(url, "alice"), sign_in(url, "root")
    try:
        body = {"title": "traced", "prompt": "a traced prompt", "cell": "local", "profile": "default"}
        created = alice.post("/api/tasks", json=body, headers={"traceparent": f"00-{trace}-{'ab' * 8}-01"})
        task = created.json()["task"]
        assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
        approved = root.post(f"/api/tasks/{task['id']}/approve")
        assert approved.status_code == 200, approved.text
        job_id = approved.json()["job"]["id"]
        wait_until(lambda: root.get(f"/api/jobs/{job_id}").json()["job"]["state"] == "SUCCEEDED", timeout=60,
                   what="the job to succeed")  # fmt: skip
        assert approved.json()["dispatch"]["trace"] == trace, "the given traceparent is kept"
    finally:
        alice.close()
        root.close()
    assert hermes.prompt_count("a traced prompt") == 1

    wait_until(lambda: any(r.get("event") == "dispatcher_job_finished" for r in records(hub.stderr())), timeout=10,
               what="the dispatcher's last line for the job")  # fmt: skip
    hub_lines = records(hub.stderr())
    # the job's work: every line naming the job but this test's own reads of it (GET /api/jobs/<id>)
    mentioning = [r for r in hub_lines if job_id in json.dumps(r) and r["event"] != "request"]
    events = {r["event"] for r in mentioning}
    assert {"dispatcher_job_claimed", "dispatcher_job_finished"} <= events, events
    for record in mentioning:
        assert (record.get("job_id"), record.get("trace")) == (job_id, trace), record
    for record in hub_lines:
        assert "job" not in record and "runner" not in record, f"renamed keys (job_id, runner_id): {record}"

    runner_lines = records(runner.stderr)
    finished = [r for r in runner_lines if r["event"] == "command_finished"]
    ran = [r for r in finished if r["kind"] in ("gateway.open", "gateway.rpc")]
    assert ran and all(r["trace"] == trace for r in ran), finished
    started = {r["command_id"]: r["trace"] for r in runner_lines if r["event"] == "command_started"}
    assert all(started[r["command_id"]] == trace for r in ran)
    for record in runner_lines:
        assert record["runner_id"] and record["instance"], record
    assert "a traced prompt" not in hub.stderr() + runner.stderr, "no message text in logs"
