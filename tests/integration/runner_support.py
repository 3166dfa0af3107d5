"""Shared helpers for the runner tests (runner-protocol.md 2-6, 8, 9, 14): a raw machine-API client, commands
scheduled on the hub's event loop, runner daemons as real processes and a raw-socket POST for oversized bodies.

Used by test_runner_registration.py, test_machine_api.py and test_runner_daemon.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from talaria.canonical import canonical_json
from talaria.errors import TalariaError
from talaria.hub.runners.connection_state import Command
from talaria.hub.runners.connections import RunnerHub
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.integration.web_support import assert_error

MACHINE = "/api/runner/v1"
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{43}$")
SUMMARY_KEYS = {
    "id",
    "tenant",
    "name",
    "source",
    "allowedProfiles",
    "enabled",
    "createdAt",
    "online",
    "lastSeenAt",
    "connectedAt",
    "features",
    "runnerVersion",
    "draining",
    "drainingSince",
    "tokenIssuedAt",
    "rotationPending",
    "tokenNextReplacedAt",
}
# An http command the runner refuses by its allow-list without calling Hermes: a reply that needs no Hermes.
OFF_LIST = {"path": "/api/not-on-the-allow-list", "method": "GET", "search": ""}
_KEEP = object()


# --- the hub and its admin API ----------------------------------------------------------------------------------


def admin_of(server: HubServer, username: str = "root", **kwargs: Any) -> httpx.Client:
    """A signed-in admin (allowed profile ``local:default``); the caller closes it."""
    kwargs.setdefault("allowed_profiles", {"local": ["default"]})
    add_account(server, username, "admin", **kwargs)
    return login(server, username)


def register(admin: httpx.Client, **fields: Any) -> dict[str, Any]:
    """``POST /api/admin/runners``; the 201 body ``{runner, token, config}``."""
    body = {"name": "node 1", "allowedProfiles": ["default"]} | fields
    response = admin.post("/api/admin/runners", json=body)
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


def runner_summary(admin: httpx.Client, runner_id: str) -> dict[str, Any]:
    response = admin.get("/api/admin/runners")
    assert response.status_code == 200, response.text
    found = [r for r in response.json()["runners"] if r["id"] == runner_id]
    assert len(found) == 1, response.text
    summary: dict[str, Any] = found[0]
    return summary


def assert_machine_error(response: httpx.Response, status: int, code: str, context: Any = None) -> dict[str, Any]:
    """The canonical error body and ``Cache-Control: no-store`` (runner-protocol.md 4)."""
    body = assert_error(response, status, code, context)
    assert response.headers.get("cache-control") == "no-store", (context, dict(response.headers))
    return body


def assert_machine_ok(response: httpx.Response, context: Any = None) -> Any:
    assert response.status_code == 200, (context, response.text)
    assert response.headers["content-type"].split(";")[0].strip() == "application/json", context
    assert response.headers.get("cache-control") == "no-store", (context, dict(response.headers))
    return response.json()


def metrics_text(server: HubServer) -> str:
    with server.client() as client:
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return response.text


def metric_value(text: str, name: str) -> float:
    """The value of the sample ``name`` (with its labels, as exposed) in a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no sample {name} in /metrics")


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# --- the machine API, raw ------------------------------------------------------------------------------------


class Machine:
    """Raw requests to ``/api/runner/v1/{runnerId}/{op}`` as one runner instance (section 4 headers)."""

    def __init__(self, server: HubServer, runner_id: str, token: str, instance: str | None = None) -> None:
        self.server = server
        self.runner_id = runner_id
        self.token = token
        self.instance = instance or str(uuid.uuid4())
        self.epoch: str | None = None
        self.client = httpx.Client(base_url=f"{server.url}{MACHINE}/{runner_id}", timeout=40.0)

    def close(self) -> None:
        self.client.close()

    def twin(self) -> Machine:
        """The same instance (and epoch) on its own connection, for a second request in flight."""
        other = Machine(self.server, self.runner_id, self.token, self.instance)
        other.epoch = self.epoch
        return other

    def headers(self, extra: dict[str, str | None] | None = None, *, epoch: Any = _KEEP) -> dict[str, str]:
        headers: dict[str, str | None] = {
            "Authorization": f"Bearer {self.token}",
            "X-Runner-Instance": self.instance,
            "X-Runner-Protocol": "1",
        }
        chosen = self.epoch if epoch is _KEEP else epoch
        if chosen is not None:
            headers["X-Runner-Epoch"] = chosen
        headers |= extra or {}
        return {k: v for k, v in headers.items() if v is not None}

    def poll(
        self, *, reset: bool = False, features: str | None = None, headers: dict[str, str | None] | None = None
    ) -> httpx.Response:
        """``GET poll``; a 200 answer's epoch is adopted."""
        extra: dict[str, str | None] = {"X-Runner-Epoch": None}
        if reset:
            extra["X-Runner-Reset"] = "1"
        if features is not None:
            extra["X-Runner-Features"] = features
        response = self.client.get("/poll", headers=self.headers(extra | (headers or {})))
        if response.status_code == 200:
            self.epoch = response.json()["epoch"]
        return response

    def connect(self) -> dict[str, Any]:
        """The first poll: a new state, answered at once."""
        body: dict[str, Any] = assert_machine_ok(self.poll(reset=True))
        return body

    def post(
        self,
        op: str,
        body: Any = None,
        *,
        content: bytes | None = None,
        epoch: Any = _KEEP,
        headers: dict[str, str | None] | None = None,
    ) -> httpx.Response:
        data = content if content is not None else json.dumps({} if body is None else body).encode()
        merged = self.headers({"Content-Type": "application/json"} | (headers or {}), epoch=epoch)
        return self.client.post(f"/{op}", content=data, headers=merged)


def connected_machine(server: HubServer) -> Machine:
    """A runner registered by the admin ``root`` and connected as one instance (its first poll answered)."""
    admin = admin_of(server)
    try:
        made = register(admin)
    finally:
        admin.close()
    machine = Machine(server, made["runner"]["id"], made["token"])
    machine.connect()
    return machine


# --- hub operations on the hub's event loop (HubServer.call) -----------------------------------------------------


def retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved: no "never retrieved" noise at teardown


def spawn(server: HubServer, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Start ``coro`` as a task on the hub loop without waiting for it."""

    async def start() -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(retrieve)
        await asyncio.sleep(0)  # let it run to its first suspension (an enqueue happens there)
        return task

    task: asyncio.Task[Any] = server.call(start())
    return task


def outcome(server: HubServer, task: asyncio.Task[Any], timeout: float = 10.0) -> Any:
    """The task's result, or the ``TalariaError`` it ended with."""

    async def wait() -> Any:
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout)
        except TalariaError as exc:
            return exc

    return server.call(wait(), timeout=timeout + 5)


def done(server: HubServer, task: asyncio.Task[Any]) -> bool:
    async def check() -> bool:
        return task.done()

    result: bool = server.call(check())
    return result


def send(
    server: HubServer, runner_id: str, payload: dict[str, Any] | None = None, kind: str = "http"
) -> asyncio.Task[Any]:
    """``RunnerHub.send`` of one command (no account, no profile: valid while the runner is enabled), returned once
    it is in the queue or refused (the shared transport inserts its row on a worker thread)."""
    body = payload or dict(OFF_LIST)

    async def start() -> asyncio.Task[Any]:
        runners = server.hub.runners
        before = sum(1 for w in runners.pending_wires(runner_id) if w["payload"] == body)
        task = asyncio.get_running_loop().create_task(runners.send(runner_id, kind, body, account=None, profile=None))
        task.add_done_callback(retrieve)
        while not task.done() and sum(1 for w in runners.pending_wires(runner_id) if w["payload"] == body) <= before:
            await asyncio.sleep(0.001)
        return task

    task: asyncio.Task[Any] = server.call(start())
    return task


def send_captured(
    server: HubServer, runner_id: str, payload: dict[str, Any] | None = None, kind: str = "http"
) -> tuple[asyncio.Task[Any], dict[str, Any]]:
    """``send`` and the command's wire form, read from the queue before any runner request can take it."""
    body = payload or dict(OFF_LIST)

    async def start() -> tuple[asyncio.Task[Any], dict[str, Any]]:
        runners = server.hub.runners
        task = asyncio.get_running_loop().create_task(runners.send(runner_id, kind, body, account=None, profile=None))
        task.add_done_callback(retrieve)
        wires: list[dict[str, Any]] = []
        while not task.done() and not (wires := [w for w in runners.pending_wires(runner_id) if w["payload"] == body]):
            await asyncio.sleep(0.001)  # the shared transport inserts the row on a worker thread
        [wire] = wires
        return task, wire

    captured: tuple[asyncio.Task[Any], dict[str, Any]] = server.call(start())
    return captured


def send_now(server: HubServer, runner_id: str, payload: dict[str, Any] | None = None, kind: str = "http") -> Any:
    """Enqueue: the TalariaError if the hub refuses at once, else the task waiting for the outcome."""
    task = send(server, runner_id, payload, kind)
    if done(server, task):
        return outcome(server, task)
    return task


def tick(server: HubServer) -> None:
    """One watchdog pass on the hub loop."""

    async def run() -> None:
        await server.hub.runners.tick()

    server.call(run())


def inject(server: HubServer, runner_id: str, wire: dict[str, Any]) -> asyncio.Task[Any]:
    """Queue a command with a chosen wire form (id, kind, payload, expiresAt), as a redelivery of an earlier
    hub's command would arrive; the task ends with the runner's ``result`` (or error)."""

    async def run() -> Any:
        runners = server.hub.runners
        assert isinstance(runners, RunnerHub), "a command put straight into the queue of the in-process hub"
        state = runners.state_of(runner_id)
        assert state is not None
        loop = asyncio.get_running_loop()
        command = Command(
            id=wire["id"],
            kind=wire["kind"],
            payload=wire["payload"],
            expires_at=wire["expiresAt"],
            runner_id=runner_id,
            account=None,
            profile=None,
            size=len(canonical_json(wire)),
            enqueued_at=runners.clock.now_ms(),
            future=loop.create_future(),
        )
        state.queue[command.id] = command
        state.pending_bytes += command.size
        if state.waiter is not None and not state.waiter.done():
            state.waiter.set_result("wake")
        return await command.future

    return spawn(server, run())


def pending_wire(server: HubServer, runner_id: str) -> list[dict[str, Any]]:
    """The wire form of the runner's queued commands, in enqueue order."""

    async def read() -> list[dict[str, Any]]:
        return server.hub.runners.pending_wires(runner_id)

    wires: list[dict[str, Any]] = server.call(read())
    return wires


def has_waiter(server: HubServer, runner_id: str) -> bool:
    return server.hub.runners.has_waiter(runner_id)


# --- an oversized POST over a raw socket ------------------------------------------------------------------------


def raw_post(url: str, path: str, headers: dict[str, str], size: int, timeout: float = 60.0) -> tuple[int, bytes]:
    """POST ``size`` bytes, reading while sending: the answer of a server that refuses the body early (and may
    close the connection after answering) is still read. Returns (status, body)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {size}\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    filler = b" " * 65536
    received = b""
    sent = 0
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1"))
        sock.setblocking(False)
        while time.monotonic() < deadline:
            writers = [sock] if sent < size and not received else []
            readable, writable, _ = select.select([sock], writers, [], 1.0)
            try:
                if readable:
                    data = sock.recv(65536)
                    if not data:
                        break
                    received += data
                    if _complete(received):
                        break
                elif writable:
                    sent += sock.send(filler[: min(len(filler), size - sent)])
            except BlockingIOError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                if received:
                    break
                raise
    head_part, _, body = received.partition(b"\r\n\r\n")
    status = int(head_part.split(b" ", 2)[1])
    return status, body[: _content_length(head_part) or len(body)]


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None


def _complete(received: bytes) -> bool:
    head, sep, body = received.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = _content_length(head)
    return length is not None and len(body) >= length


# --- runner daemons as processes ------------------------------------------------------------------------------


def write_config(directory: Path, config: dict[str, Any], mode: int = 0o600) -> Path:
    """runner.json in ``directory`` (created) with ``mode``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "runner.json"
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    path.chmod(mode)
    return path


def register_node(
    server: HubServer,
    directory: Path,
    *,
    hermes_url: str,
    session_token: str,
    tenant: str = "default",
    **fields: Any,
) -> Path:
    """Register a runner (``fields`` as in ``POST /api/admin/runners``; default name ``node``, profile
    ``default``) and write its runner.json in ``directory`` with ``hermesTokenFile`` naming a mode-600 file
    that holds Hermes' session token. Returns the runner.json path."""
    from talaria.hub.runners.registry import parse_registration

    body = {"name": "node", "allowedProfiles": ["default"], "hermesURL": hermes_url} | fields
    registration = server.hub.registry.register(tenant, parse_registration(body, default_server_url=server.url))
    directory.mkdir(parents=True, exist_ok=True)
    token_file = directory / "hermes-token"
    token_file.write_text(session_token)
    token_file.chmod(0o600)
    return write_config(directory, registration.config | {"hermesTokenFile": str(token_file)})


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}


class RunnerProcess:
    """``python -m talaria runner --config PATH``, its output in files (no pipe can fill up)."""

    def __init__(
        self, config_path: Path, logs: Path, name: str = "runner", *, argv: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        """``argv`` replaces the command line (a wrapper that still runs the runner with ``config_path``); ``env`` is
        added to the clean environment."""
        logs.mkdir(parents=True, exist_ok=True)
        self.out_path = logs / f"{name}.stdout"
        self.err_path = logs / f"{name}.stderr"
        self._out = self.out_path.open("wb")
        self._err = self.err_path.open("wb")
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-m", "talaria", "runner", "--config", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            cwd=logs,
            env=clean_env() | (env or {}),
        )

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(encoding="utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    @property
    def lines(self) -> list[str]:
        return self.stderr.splitlines()

    def wait_for(self, text: str, count: int = 1, timeout: float = 15.0) -> None:
        """Until ``count`` stderr lines equal ``text`` (or the process ends first: an AssertionError)."""
        deadline = time.monotonic() + timeout
        while sum(line == text for line in self.lines) < count:
            if self.proc.poll() is not None:
                raise AssertionError(f"the runner exited {self.proc.returncode} before {text!r}:\n{self.stderr}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {text!r}:\n{self.stderr}")
            time.sleep(0.02)

    def wait(self, timeout: float = 15.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the runner did not exit within {timeout} s:\n{self.stderr}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 12.0) -> int:
        self.proc.send_signal(sig)
        return self.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()
        self._err.close()

    def assert_silent_about(self, *secrets: str) -> None:
        output = self.stdout + self.stderr
        for secret in secrets:
            assert secret not in output, "a secret was printed"
