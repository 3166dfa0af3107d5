"""A hub with the dispatcher, two accounts and one registered node in front of the Hermes fixture, for the
dispatcher's tests: ``alice`` writes tasks, ``bob`` (admin) approves them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from talaria.clock import SystemClock
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.integration.runner_support import RunnerProcess, register_node, wait_until


@dataclass
class Env:
    server: HubServer
    hermes: HermesFixture
    alice: httpx.Client
    bob: httpx.Client
    tmp: Path
    config_path: Path
    runner: RunnerProcess | None = None

    def start_runner(self) -> None:
        if self.runner is not None:
            self.runner.close()  # the previous one (stopped, killed or disabled) releases its files
        self.runner = RunnerProcess(self.config_path, self.tmp / "logs", name=f"runner-{time.monotonic_ns()}")
        self.runner.wait_for("runner connected")

    @property
    def runner_id(self) -> str:
        """The id of the node registered for source ``local``."""
        record = self.server.hub.registry.for_source("default", "local")
        assert record is not None
        return record.id

    def approved_job(self, prompt: str) -> dict[str, Any]:
        body = {"title": "a task", "prompt": prompt, "cell": "local", "profile": "default"}
        task = self.alice.post("/api/tasks", json=body).json()["task"]
        assert self.alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
        approved = self.bob.post(f"/api/tasks/{task['id']}/approve")
        assert approved.status_code == 200, approved.text
        job: dict[str, Any] = approved.json()["job"]
        return job

    def close(self) -> None:
        if self.runner is not None:
            if self.runner.proc.poll() is None:
                self.runner.stop()
            self.runner.close()
        self.alice.close()
        self.bob.close()

    def job(self, job_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.bob.get(f"/api/jobs/{job_id}").json()["job"]
        return found

    def wait_job(self, job_id: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if predicate(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {job['state']}: {job}")
            time.sleep(0.05)


def prepared(server: HubServer, hermes: HermesFixture, tmp_path: Path) -> Env:
    add_account(server, "alice", allowed_profiles={"local": ["default"]})
    add_account(server, "bob", "admin", allowed_profiles={"local": ["default"]})
    path = register_node(server, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token)
    return Env(server, hermes, login(server, "alice"), login(server, "bob"), tmp_path, path)


@contextmanager
def hub_env(tmp_path: Path, **settings: Any) -> Iterator[Env]:
    """A started hub (heartbeat every second unless ``settings`` say otherwise) over a fresh fixture."""
    with HermesFixture() as hermes:
        server = HubServer(tmp_path / "data", SystemClock(), **({"lifecycle_heartbeat_interval_s": 1} | settings))
        server.start()
        made: Env | None = None
        try:
            made = prepared(server, hermes, tmp_path)
            yield made
        finally:
            if made is not None:
                made.close()
            server.stop()


def wait_prompt(env: Env, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while env.hermes.prompt_count(text) == 0:
        assert time.monotonic() < deadline, f"Hermes never got {text!r}"
        time.sleep(0.05)


def expire_attempt(env: Env, job_id: str, timeout: float = 15) -> None:
    """Sweep (what the reaper does) until the job's current attempt has expired (its lease is short)."""
    attempt = env.job(job_id)["attempt"]

    def expired() -> bool:
        env.server.hub.engine.expire_due()
        job = env.job(job_id)
        return bool(job["attempt"] > attempt or job["state"] != "RUNNING")

    wait_until(expired, timeout=timeout, what=f"attempt {attempt} of {job_id} to expire")
