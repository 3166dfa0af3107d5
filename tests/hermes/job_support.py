"""Tasks written, approved and followed through the JSON API, for the real-Hermes job tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

People = tuple[httpx.Client, httpx.Client]


def approved(alice: httpx.Client, root: httpx.Client, prompt: str, profile: str = "default") -> dict[str, Any]:
    """A task by ``alice`` submitted and approved by ``root``; returns the job of the approval answer."""
    task = alice.post("/api/tasks", json={"title": "t", "prompt": prompt, "cell": "local", "profile": profile})
    task_id = task.json()["task"]["id"]
    assert alice.post(f"/api/tasks/{task_id}/submit").status_code == 200
    answer = root.post(f"/api/tasks/{task_id}/approve")
    assert answer.status_code == 200, answer.text
    job: dict[str, Any] = answer.json()["job"]
    return job


def wait_job(root: httpx.Client, job_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        job = root.get(f"/api/jobs/{job_id}").json()["job"]
        if done(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def finished(job: dict[str, Any]) -> bool:
    return job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
