"""What the web API test files share: a hub with an admin and a user signed in (``Web``), the canonical error
check, cheap argon2 for speed, the task fields and keys, and task helpers."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher

from talaria.accounts import passwords
from talaria.testing.hub_server import HubServer
from tests.conftest import PASSWORD, add_account

MIB = 1024 * 1024
HEX32 = re.compile(r"^[0-9a-f]{32}$")
JSON_TYPE = {"content-type": "application/json"}
FOREIGN_ORIGIN = "http://evil.example"
NODELAY = (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
TASK = {
    "title": "Summarise the notes",
    "prompt": "Summarise notes.md in five lines",
    "cell": "local",
    "profile": "default",
}
TASK_KEYS = {
    "id",
    "tenant",
    "title",
    "prompt",
    "team",  # an assignment's attempt, null otherwise (team-tools.md 11)
    "approval",  # its approval by policy, null otherwise
    "cell",
    "profile",
    "state",
    "revision",
    "createdBy",
    "createdAt",
    "submittedAt",
    "approvedBy",
    "approvedAt",
    "rejectedBy",
    "rejectedAt",
    "rejectionReason",
    "finishedAt",
    "jobId",
}
JOB_KEYS = {
    "id",
    "taskId",
    "cell",
    "profile",
    "state",
    "attempt",
    "maxAttempts",
    "revision",
    "cancelRequested",
    "enqueuedAt",
    "startedAt",
    "lease",
    "terminal",
    "result",
    "waitingReason",
}


# --- shared helpers -------------------------------------------------------------------------------------------


def cheapen_argon2(monkeypatch: pytest.MonkeyPatch) -> None:
    """argon2id at its default cost takes 0.1-0.3 s a hash on the test machines. These tests check the API, not
    the hash cost, so they swap in a cheap argon2id hasher (same code paths, same hash format)."""
    cheap = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    monkeypatch.setattr(passwords, "_hasher", cheap)
    monkeypatch.setattr(passwords, "_DUMMY", cheap.hash("talaria-dummy-password"))


def assert_error(response: httpx.Response, status: int, code: str, context: Any = None) -> dict[str, Any]:
    """The canonical error: this status, JSON media type, exactly ``code`` and ``error``."""
    where = f"{response.request.method} {response.request.url.path} {context or ''}"
    assert response.status_code == status, (where, response.text)
    assert response.headers["content-type"].split(";")[0].strip() == "application/json", where
    body = response.json()
    assert set(body) == {"code", "error"}, (where, body)
    assert body["code"] == code, (where, body)
    assert isinstance(body["error"], str)
    assert body["error"]
    return dict(body)


@dataclass
class Web:
    """A hub with three accounts: ``ada`` (admin), ``uma`` and ``ulf`` (users); ``admin``, ``user`` and ``other``
    are their signed-in clients."""

    server: HubServer
    stack: ExitStack
    _peers: dict[str, httpx.Client] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, role in (("ada", "admin"), ("uma", "user"), ("ulf", "user")):
            add_account(self.server, name, role, allowed_profiles={"local": ["default"], "lab": ["default"]})

    # Signed in on first use (each sign-in is a store write).
    @cached_property
    def admin(self) -> httpx.Client:
        return self.login("ada")

    @cached_property
    def user(self) -> httpx.Client:
        return self.login("uma")

    @cached_property
    def other(self) -> httpx.Client:
        return self.login("ulf")

    def login(self, username: str, password: str = PASSWORD) -> httpx.Client:
        """A fresh signed-in client (own session) sending Origin and X-CSRF-Token, as ``conftest.login``."""
        client = self.anon(headers={"Origin": self.server.url})
        response = client.post("/api/auth/login", json={"username": username, "password": password})
        assert response.status_code == 200, response.text
        client.headers["X-CSRF-Token"] = response.json()["csrfToken"]
        return client

    def anon(self, *, peer: str | None = None, **kwargs: Any) -> httpx.Client:
        """A client without a session; ``peer`` picks the local (127.0.0.0/8) address it connects from.

        TCP_NODELAY: httpx writes a request's head and body apart, which Nagle would hold for a delayed ACK."""
        transport = httpx.HTTPTransport(local_address=peer, socket_options=[NODELAY])
        client = self.server.client(transport=transport, **kwargs)
        self.stack.callback(client.close)
        return client

    def peer(self, address: str) -> httpx.Client:
        """An anonymous client connecting from ``address``, no Origin header (one per address)."""
        if address not in self._peers:
            self._peers[address] = self.anon(peer=address)
        return self._peers[address]

    def attempt(self, username: str, password: str, *, peer: str = "127.0.0.1") -> httpx.Response:
        return self.peer(peer).post("/api/auth/login", json={"username": username, "password": password})


def open_web(make_hub: Callable[..., HubServer], stack: ExitStack, **settings: Any) -> Web:
    return Web(make_hub(**settings), stack)


def create_task(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    response = client.post("/api/tasks", json=TASK | fields)
    assert response.status_code == 201, response.text
    task: dict[str, Any] = response.json()["task"]
    return task


def submitted_task(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    task = create_task(client, **fields)
    response = client.post(f"/api/tasks/{task['id']}/submit")
    assert response.status_code == 200, response.text
    submitted: dict[str, Any] = response.json()["task"]
    return submitted


def dispatched(web: Web, author: httpx.Client | None = None, **fields: Any) -> dict[str, Any]:
    """A task written by ``author`` (default ``uma``), approved by ``ada``: the approve answer."""
    task = submitted_task(author or web.user, **fields)
    response = web.admin.post(f"/api/tasks/{task['id']}/approve")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def all_tasks(web: Web) -> list[dict[str, Any]]:
    response = web.admin.get("/api/tasks", params={"limit": 100})
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()["tasks"]
    return tasks


def audit_events(web: Web) -> int:
    response = web.admin.get("/api/audit/verify")
    assert response.status_code == 200, response.text
    assert response.json()["ok"] is True
    return int(response.json()["events"])
