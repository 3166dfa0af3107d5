"""Issue 12 over a real ``talaria hub`` process: the client address (web-api.md 9, lifecycle.md 6.1)."""

from __future__ import annotations

import json
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
