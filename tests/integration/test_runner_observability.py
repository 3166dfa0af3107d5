"""The runner's metrics, health and JSON logs (operations.md 5.2, 5.3; scenarios 9.12-9.13, the runner's half) over
real processes: a hub with the dispatcher, a ``talaria runner`` process and the Hermes fixture. ``/metrics`` is
parsed with prometheus-client's parser."""

from __future__ import annotations

import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.cli_support import free_port
from tests.integration.dispatch_support import Env, hub_env
from tests.integration.runner_support import RunnerProcess, wait_until

LISTENING = re.compile(r"^runner metrics on (http://127\.0\.0\.1:\d+)$")
NODE_METRICS = {
    # name: (type, label names of its samples)
    "talaria_node_build_info": ("gauge", {"version", "protocol"}),
    "talaria_node_connected": ("gauge", set()),
    "talaria_node_draining": ("gauge", set()),
    "talaria_node_hermes_up": ("gauge", set()),
    "talaria_node_gateway_channels": ("gauge", set()),
    "talaria_node_grants": ("gauge", set()),
    "talaria_node_token_age_seconds": ("gauge", set()),
    "talaria_node_epoch_changes": ("counter", set()),
    "talaria_node_disconnects": ("counter", {"reason"}),
    "talaria_node_polls": ("counter", {"outcome"}),
    "talaria_node_commands": ("counter", {"kind", "outcome"}),
    "talaria_node_command_seconds": ("histogram", {"kind"}),
}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with hub_env(tmp_path) as made:
        yield made


def start(env: Env, *options: str, config: Path | None = None, connected: bool = True) -> RunnerProcess:
    if env.runner is not None:
        env.runner.close()
    path = config or env.config_path
    argv = [sys.executable, "-m", "talaria", "runner", "--config", str(path), *options]
    env.runner = RunnerProcess(path, env.tmp / "logs", f"runner-{uuid.uuid4().hex[:8]}", argv=argv)
    if connected:
        env.runner.wait_for("runner connected")
    return env.runner


def metrics_url(runner: RunnerProcess) -> str:
    def listening() -> str | None:
        return next((m.group(1) for line in runner.lines if (m := LISTENING.match(line))), None)

    wait_until(lambda: listening() is not None, timeout=15, what="the metrics listener")
    found = listening()
    assert found is not None
    return found


def families(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/metrics", timeout=5)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {family.name: family for family in text_string_to_metric_families(answer.text)}


def value(found: dict[str, Any], name: str, **labels: str) -> float:
    family = found[re.sub(r"_(total|count|sum|bucket)$", "", name)]
    for sample in family.samples:
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    raise AssertionError(f"no sample {name} {labels}: {family.samples}")


def counted(url: str, name: str, **labels: str) -> float:
    """A counter's sample, 0 before its first count."""
    try:
        return value(families(url), name, **labels)
    except AssertionError:
        return 0.0


def offline_copy(env: Env) -> Path:
    """The node's runner.json pointing at a port nothing listens on."""
    directory = env.tmp / "offline"
    directory.mkdir(mode=0o700)
    body = json.loads(env.config_path.read_text())
    body["serverURL"] = f"http://127.0.0.1:{free_port()}"
    path = directory / "runner.json"
    path.write_text(json.dumps(body))
    path.chmod(0o600)
    return path


def test_metrics_and_health_of_a_runner(env: Env) -> None:
    lonely = start(env, "--metrics-listen", "127.0.0.1:0", config=offline_copy(env), connected=False)
    url = metrics_url(lonely)
    assert httpx.get(f"{url}/healthz", timeout=5).json() == {"ok": True}
    unready = httpx.get(f"{url}/readyz", timeout=5)
    assert (unready.status_code, unready.json()["code"]) == (503, "runner_offline"), "no poll has succeeded"
    wait_until(lambda: counted(url, "talaria_node_polls_total", outcome="transport") >= 1, timeout=10,
               what="a failed poll counted")  # fmt: skip
    assert lonely.stop() == 0

    runner = start(env, "--metrics-listen", "127.0.0.1:0")
    url = metrics_url(runner)
    wait_until(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200, timeout=10, what="ready")
    assert httpx.get(f"{url}/readyz", timeout=5).json() == {"ok": True}
    for path in ("/", "/metrics/", "/api/runner"):
        missing = httpx.get(f"{url}{path}", timeout=5)
        assert (missing.status_code, missing.json()["code"]) == (404, "not_found"), path
    assert httpx.post(f"{url}/metrics", timeout=5).status_code == 404

    job = env.approved_job("measured")
    env.wait_job(job["id"], lambda j: j["state"] == "SUCCEEDED")
    found = families(url)
    for name, (kind, labels) in NODE_METRICS.items():
        assert name in found and found[name].type == kind, (name, found.get(name))
        for sample in found[name].samples:
            assert set(sample.labels) - {"le"} == labels, (name, sample)
    build = found["talaria_node_build_info"].samples[0]
    assert build.labels["protocol"] == "1" and build.value == 1
    assert value(found, "talaria_node_connected") == 1 and value(found, "talaria_node_draining") == 0
    assert value(found, "talaria_node_hermes_up") == 1
    assert value(found, "talaria_node_epoch_changes_total") == 1
    assert value(found, "talaria_node_polls_total", outcome="ok") >= 1
    assert value(found, "talaria_node_commands_total", kind="gateway.open", outcome="ok") >= 1
    assert value(found, "talaria_node_command_seconds_count", kind="gateway.rpc") >= 1
    assert not found["talaria_node_token_age_seconds"].samples, "runner.json's token has no known issue time"
    # a rotated token's age is known
    assert env.bob.post(f"/api/admin/runners/{env.runner_id}/rotate-token").status_code == 200
    runner.wait_for("runner credential rotated", timeout=10)
    age = value(families(url), "talaria_node_token_age_seconds")
    assert 0 <= age < 60
    runner.assert_silent_about(json.loads(env.config_path.read_text())["token"])


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1:70000", ":80", "host:port"])
def test_a_bad_metrics_address_is_a_usage_error(env: Env, listen: str) -> None:
    runner = RunnerProcess(env.config_path, env.tmp / "logs", f"bad-{uuid.uuid4().hex[:8]}",
                           argv=[sys.executable, "-m", "talaria", "runner", "--config", str(env.config_path),
                                 "--metrics-listen", listen])  # fmt: skip
    try:
        assert runner.wait(15) == 2
        assert "--metrics-listen" in runner.stderr and "is not [HOST:]PORT" in runner.stderr
    finally:
        runner.close()


def test_an_address_in_use_exits_2(env: Env) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        runner = start(env, "--metrics-listen", f"127.0.0.1:{port}", connected=False)
        assert runner.wait(15) == 2
    assert any(line.startswith(f"talaria runner: --metrics-listen: cannot listen on 127.0.0.1:{port}")
               for line in runner.lines), runner.lines  # fmt: skip
    assert runner.lines[-1] == "runner stopped"


def test_json_logs_carry_the_runner_instance_and_epoch_and_every_command(env: Env) -> None:
    runner = RunnerProcess(env.config_path, env.tmp / "logs", "json",
                           argv=[sys.executable, "-m", "talaria", "runner", "--config", str(env.config_path),
                                 "--log-format", "json"])  # fmt: skip
    env.runner = runner

    def records() -> list[dict[str, Any]]:
        return [json.loads(line) for line in runner.lines]

    wait_until(lambda: any(r["event"] == "runner_connected" for r in records()), timeout=15, what="connected")
    job = env.approved_job("logged")
    env.wait_job(job["id"], lambda j: j["state"] == "SUCCEEDED")
    assert runner.stop() == 0
    found = records()
    for record in found:
        assert {"timestamp", "level", "event", "runner_id", "instance", "epoch"} <= set(record), record
        assert record["runner_id"] == env.runner_id
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["timestamp"]), record
    connected = next(r for r in found if r["event"] == "runner_connected")
    assert connected["message"] == "runner connected" and connected["epoch"] is not None
    assert found[-1]["event"] == "runner_stopped"
    started = [r for r in found if r["event"] == "command_started"]
    finished = [r for r in found if r["event"] == "command_finished"]
    assert started and {r["command_id"] for r in started} <= {r["command_id"] for r in finished}
    for record in finished:
        assert {"command_id", "kind", "outcome", "ms", "trace"} <= set(record), record
        assert isinstance(record["ms"], float | int)
    assert {r["kind"] for r in finished} >= {"gateway.open", "gateway.rpc"}
    runner.assert_silent_about(json.loads(env.config_path.read_text())["token"], "logged")
