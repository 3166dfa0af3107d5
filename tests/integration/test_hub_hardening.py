"""Issue 12 over a real ``talaria hub`` process: the client address (web-api.md 9, lifecycle.md 6.1), a declared
oversize body."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.cli_support import HubProcess, clean_env, talaria

PASSWORD = "correct horse battery staple"
SECRET = "s" * 40
LOOSE = 0o022


@pytest.fixture
def start_hub(tmp_path: Path) -> Iterator[Callable[..., HubProcess]]:
    made: list[HubProcess] = []

    def factory(*args: str, umask: int = -1, **env: str) -> HubProcess:
        hub = HubProcess(tmp_path, ["--data-dir", str(tmp_path / "D"), "--port", "0", *args], clean_env(**env),
                         umask=umask)  # fmt: skip
        made.append(hub)
        return hub

    yield factory
    for hub in made:
        hub.close()


def _create_user(tmp_path: Path, username: str) -> None:
    done = talaria("admin", "create-user", "--data-dir", str(tmp_path / "D"), "--username", username, "--role", "user",
                   cwd=tmp_path, stdin=PASSWORD + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr


def _login(client: httpx.Client, username: str, password: str, forwarded: str | None = None) -> httpx.Response:
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    return client.post("/api/auth/login", json={"username": username, "password": password}, headers=headers)


def _request_lines(hub: HubProcess, path: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in hub.stderr().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "request" and line.get("path") == path]


# --- item 1: the client address ---------------------------------------------------------------------------------


def test_x_forwarded_for_from_a_loopback_peer_does_not_escape_the_sign_in_limit(
    tmp_path: Path, start_hub: Callable[..., HubProcess]
) -> None:
    hub = start_hub()
    _, url = hub.ready()
    _create_user(tmp_path, "uma")
    with httpx.Client(base_url=url, timeout=10) as client:
        for n in range(5):  # five failures from 127.0.0.1, each for another name: only the address counts
            assert _login(client, f"nobody{n}", "wrong password!").status_code == 401
        assert _login(client, "uma", PASSWORD).status_code == 429
        spoofed = _login(client, "uma", PASSWORD, forwarded="198.51.100.9")
        assert spoofed.status_code == 429, spoofed.text
    assert {line["client"] for line in _request_lines(hub, "/api/auth/login")} == {"127.0.0.1"}


def test_the_runtime_api_peer_rule_uses_the_tcp_peer_whatever_x_forwarded_for_says(
    tmp_path: Path, start_hub: Callable[..., HubProcess]
) -> None:
    hub = start_hub(
        TALARIA_RUNTIME_API_ENABLED="true",
        TALARIA_RUNTIME_API_PROXY_SECRET=SECRET,
        TALARIA_HUB_TRUSTED_PROXIES="127.0.0.1",
    )
    _, url = hub.ready()
    query = {"tenant": "default", "cell": "local", "profile": "default", "state": "QUEUED"}
    with httpx.Client(base_url=url, timeout=10) as client:
        for forwarded in ("203.0.113.5", "203.0.113.5, 127.0.0.1", "127.0.0.1"):
            response = client.get("/internal/runtime/v1/hermes/jobs", params=query,
                                  headers={"X-Forwarded-For": forwarded})  # fmt: skip
            assert response.status_code == 401, (forwarded, response.text)
            assert response.json()["code"] == "proxy_identity_missing"


def test_behind_a_trusted_proxy_the_client_is_the_right_most_untrusted_forwarded_address(
    tmp_path: Path, start_hub: Callable[..., HubProcess]
) -> None:
    hub = start_hub(TALARIA_HUB_TRUSTED_PROXIES="127.0.0.1, 10.0.0.0/8")
    _, url = hub.ready()
    _create_user(tmp_path, "uma")
    with httpx.Client(base_url=url, timeout=10) as client:
        for n in range(5):
            failed = _login(client, f"nobody{n}", "wrong password!", forwarded="198.51.100.1, 10.1.2.3")
            assert failed.status_code == 401
        # the left-most entry is what the client wrote: it does not change who is throttled
        assert _login(client, "uma", PASSWORD, forwarded="203.0.113.9, 198.51.100.1, 10.1.2.3").status_code == 429
        assert _login(client, "uma", PASSWORD, forwarded="198.51.100.1").status_code == 429
        assert _login(client, "uma", PASSWORD, forwarded="198.51.100.2").status_code == 200
        assert _login(client, "uma", PASSWORD).status_code == 200  # no header: the proxy itself, 127.0.0.1
    clients = [line["client"] for line in _request_lines(hub, "/api/auth/login")]
    assert clients == ["198.51.100.1"] * 7 + ["198.51.100.2", "127.0.0.1"]


def test_trusted_proxies_come_from_a_toml_array_and_a_bad_entry_is_refused_naming_the_key(
    tmp_path: Path, start_hub: Callable[..., HubProcess]
) -> None:
    config = tmp_path / "hub.toml"
    config.write_text('[hub]\ntrusted_proxies = ["127.0.0.1", "::1", "192.168.0.0/16"]\n')
    hub = start_hub("--config", str(config))
    hub.ready()
    for bad in ("10.0.0.0/33", "proxy.example", "10.0.0.1/8"):
        refused = talaria("hub", "--data-dir", str(tmp_path / "E"), "--port", "0", cwd=tmp_path,
                          env=clean_env(TALARIA_HUB_TRUSTED_PROXIES=f"127.0.0.1,{bad}"))  # fmt: skip
        assert refused.returncode == 1, bad
        assert refused.stderr.startswith("talaria hub: hub.trusted_proxies"), refused.stderr
        assert bad in refused.stderr
    config.write_text('[hub]\ntrusted_proxies = "127.0.0.1"\n')
    refused = talaria("hub", "--data-dir", str(tmp_path / "E"), "--config", str(config), cwd=tmp_path)
    assert refused.returncode == 1 and "hub.trusted_proxies" in refused.stderr


# --- item 7: a declared oversize body ---------------------------------------------------------------------------


def _send_raw(url: str, head: str, body: bytes = b"{}", wait: float = 5) -> tuple[bytes, bool]:
    """Send a request head and ``body`` (shorter than declared); return what came back within ``wait`` seconds
    and whether the server closed the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n" + body)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except TimeoutError:
            return data, False
        except ConnectionResetError:
            pass
        return data, True


def _assert_refused_at_once(answer: tuple[bytes, bool], status: int, code: str) -> None:
    data, closed = answer
    assert data, "no answer within 5 s"
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), lines[0]
    assert "connection: close" in [line.lower() for line in lines[1:]], lines
    assert json.loads(body)["code"] == code
    assert closed, "the server kept the connection open"


def test_a_declared_oversize_body_is_413_at_once_and_the_connection_closes_on_the_web_api(
    start_hub: Callable[..., HubProcess],
) -> None:
    hub = start_hub()
    _, url = hub.ready()
    host = url.removeprefix("http://")
    for path in ("/api/tasks", "/api/auth/login"):
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 5000000\r\n"
        _assert_refused_at_once(_send_raw(url, head), 413, "payload_too_large")


def _registered_runner(tmp_path: Path, url: str) -> dict[str, Any]:
    out = tmp_path / "runner.json"
    done = talaria("admin", "runners", "register", "--data-dir", str(tmp_path / "D"), "--name", "n1", "--profile",
                   "default", "--server-url", url, "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads(out.read_text())
    return config


def test_a_declared_oversize_body_is_refused_at_once_and_the_connection_closes_on_the_runner_api(
    tmp_path: Path, start_hub: Callable[..., HubProcess]
) -> None:
    hub = start_hub()
    _, url = hub.ready()
    host = url.removeprefix("http://")
    config = _registered_runner(tmp_path, url)
    instance = str(uuid.uuid4())
    runner_headers = {"Authorization": f"Bearer {config['token']}", "X-Runner-Instance": instance,
                      "X-Runner-Protocol": "1"}  # fmt: skip
    base = f"/api/runner/v1/{config['runnerId']}"
    with httpx.Client(base_url=url, timeout=10, headers=runner_headers) as client:
        poll = client.get(f"{base}/poll")
        assert poll.status_code == 200, poll.text
        epoch = poll.json()["epoch"]
    lines = "".join(f"{k}: {v}\r\n" for k, v in runner_headers.items())
    too_big = 16 * 1024 * 1024 + 1
    head = (f"POST {base}/result HTTP/1.1\r\nHost: {host}\r\n{lines}X-Runner-Epoch: {epoch}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {too_big}\r\n")  # fmt: skip
    _assert_refused_at_once(_send_raw(url, head), 413, "runner_payload_limit")
    # refused before the body (a wrong token): answered at once too, not after waiting for 16 MiB
    stranger = (f"POST /api/runner/v1/{uuid.uuid4()}/result HTTP/1.1\r\nHost: {host}\r\n{lines}"
                f"Content-Length: {too_big}\r\n")  # fmt: skip
    _assert_refused_at_once(_send_raw(url, stranger), 403, "runner_unauthorized")


def test_a_body_that_grows_over_the_limit_is_still_413(start_hub: Callable[..., HubProcess]) -> None:
    hub = start_hub()
    _, url = hub.ready()

    def chunks() -> Iterator[bytes]:
        for _ in range(17):
            yield b" " * 65536

    with httpx.Client(base_url=url, timeout=10) as client:
        response = client.post("/api/tasks", content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
