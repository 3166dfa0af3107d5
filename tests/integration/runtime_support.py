"""Helpers for the Runtime API acceptance scenarios (lifecycle.md 11)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from talaria.hub.api.views import dispatch_json
from talaria.lifecycle.actor import Actor
from talaria.testing.hub_server import HubServer
from talaria.testing.runtime_client import RuntimeClient
from tests.backends import raw_sql
from tests.conftest import PROXY_SECRET

AUTHOR = Actor("acct:default/alice", frozenset(), "web", "default")
APPROVER = Actor("acct:default/bob", frozenset({"platform_admin"}), "web", "default")
RESULT = {"outputs": {"reply": "done"}, "artifacts": [], "summary": "done"}


def new_task(server: HubServer, *, cell: str = "local", profile: str = "default") -> str:
    engine = server.hub.engine
    task = engine.create_task(
        AUTHOR, tenant="default", title="t", spec={"prompt": "p"}, cell=cell, profile=profile, trace="ab" * 16
    )
    engine.submit_task(AUTHOR, tenant="default", task_id=task.id)
    return task.id


def dispatched_job(server: HubServer, **kwargs: Any) -> tuple[str, dict[str, str]]:
    """A QUEUED job; returns its id and the binding without principal."""
    task_id = new_task(server, **kwargs)
    _, dispatch, job = server.hub.engine.approve_and_dispatch(APPROVER, tenant="default", task_id=task_id)
    binding = dispatch_json(dispatch)["binding"]  # the nine fields the web API shows, without principal
    return job.id, binding


_OPEN: list[RuntimeClient] = []


def close_clients() -> None:
    """Close every client ``Worker.of`` made (sockets left open become ResourceWarnings)."""
    while _OPEN:
        _OPEN.pop().close()


@dataclass
class Worker:
    client: RuntimeClient
    job: str
    binding: dict[str, str]
    lease: dict[str, Any] | None = None

    @classmethod
    def of(cls, server: HubServer, job: str, binding: dict[str, str], principal: str, roles: str = "runtime") -> Worker:
        client = RuntimeClient(server.url, PROXY_SECRET, principal=principal, roles=roles, clock=server.clock)
        _OPEN.append(client)
        return cls(client, job, dict(binding) | {"principal": principal})

    def post(
        self, op: str, extra: dict[str, Any] | None = None, *, key: str | None = None, lease: bool = True
    ) -> httpx.Response:
        body: dict[str, Any] = {"binding": self.binding}
        if lease and self.lease is not None:
            body |= self.lease
        body |= extra or {}
        return self.client.post(self.job, op, body, key=key)

    def claim(self, instance: str = "w-1") -> httpx.Response:
        response = self.post("claim", {"worker_instance": instance}, lease=False)
        if response.status_code == 200:
            lease = response.json()["lease"]
            self.lease = {"lease_id": lease["lease_id"], "lease_epoch": lease["lease_epoch"]}
        return response

    def start(self) -> httpx.Response:
        return self.post("start")

    def heartbeat(self, progress: dict[str, Any] | None = None) -> httpx.Response:
        return self.post("heartbeat", {"progress": progress} if progress is not None else None)

    def complete(self, result: dict[str, Any] | None = None, key: str | None = None) -> httpx.Response:
        return self.post("complete", {"result": result or RESULT}, key=key)

    def fail(self, code: str = "boom", key: str | None = None) -> httpx.Response:
        return self.post("fail", {"error": {"code": code, "message": "it broke", "retryable": False}}, key=key)

    def cancel(self, reason: str = "stop", key: str | None = None) -> httpx.Response:
        return self.post("cancel", {"reason": reason}, key=key)

    def status(self) -> httpx.Response:
        return self.client.status(self.job, self.binding)


def code(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"code", "error"}, body
    return str(body["code"])


def job_row(server: HubServer, job: str) -> dict[str, Any]:
    with server.hub.store.read() as tx:
        row = tx.one("job_get", tenant="default", id=job)
    assert row is not None
    return row


def count(server: HubServer, sql: str, *args: Any) -> int:
    """The one value ``sql`` selects, read beside the hub's store (SQLite or PostgreSQL)."""
    (row,) = raw_sql(server.settings, sql, *args)
    (value,) = row.values()
    return int(value)


def scan_for_secret(root: Path, text: str) -> list[Path]:
    needle = PROXY_SECRET.encode()
    found = [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]
    if PROXY_SECRET in text:
        found.append(Path("<captured output>"))
    return found
