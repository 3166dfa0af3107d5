"""Issue 12 over a real ``talaria hub`` process: the client address (web-api.md 9, lifecycle.md 6.1), a declared
oversize body, and the modes of the data directory (and of the runner's state directory)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.cli_support import HubProcess, clean_env, talaria
from tests.integration.runner_support import wait_until

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


def _request_lines(hub: HubProcess, path: str, count: int) -> list[dict[str, Any]]:
    """The hub's access-log lines for ``path``, once there are ``count`` (a line is written after its answer)."""

    def read() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in hub.stderr().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("event") == "request" and line.get("path") == path]

    wait_until(lambda: len(read()) >= count, what=f"{count} request lines for {path}")
    return read()


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
    assert {line["client"] for line in _request_lines(hub, "/api/auth/login", 7)} == {"127.0.0.1"}


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
    clients = [line["client"] for line in _request_lines(hub, "/api/auth/login", 9)]
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


# --- item 8: modes of the data directory --------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _modes(data: Path) -> dict[str, int]:
    return {p.name: _mode(p) for p in sorted(data.iterdir())}


def test_the_hub_makes_its_data_directory_0700_and_every_file_0600_whatever_the_umask(
    tmp_path: Path, start_hub: Callable[..., HubProcess]
) -> None:
    hub = start_hub(umask=LOOSE)
    _, url = hub.ready()
    with httpx.Client(base_url=url, timeout=10) as client:
        assert _login(client, "nobody", "wrong password!").status_code == 401  # a read and a failed sign-in
    data = tmp_path / "D"
    assert _mode(data) == 0o700
    modes = _modes(data)
    assert {"talaria.sqlite3", "talaria.sqlite3-wal", "talaria.sqlite3-shm", "secret.key"} <= set(modes), modes
    assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}


def test_the_hub_tightens_an_existing_data_directory_and_logs_each_change(
    tmp_path: Path, start_hub: Callable[..., HubProcess]
) -> None:
    first = start_hub()
    first.ready()
    first.close()
    data = tmp_path / "D"
    data.chmod(0o755)
    for path in data.iterdir():
        path.chmod(0o644)
    (data / "notes.txt").write_text("an operator's file\n")
    (data / "notes.txt").chmod(0o664)
    hub = start_hub()
    hub.ready()
    assert _mode(data) == 0o700
    assert set(_modes(data).values()) == {0o600}
    lines = [json.loads(line) for line in hub.stderr().splitlines() if line.startswith("{")]
    changes = {line["path"]: (line["before"], line["after"]) for line in lines if line["event"] == "mode_tightened"}
    assert changes[str(data)] == ("0755", "0700")
    assert changes[str(data / "notes.txt")] == ("0664", "0600")
    assert changes[str(data / "secret.key")] == ("0644", "0600")


def test_the_hub_refuses_to_start_naming_the_path_when_it_cannot_tighten_it(
    tmp_path: Path, start_hub: Callable[..., HubProcess]
) -> None:
    # even root may not change the mode of a /proc directory
    refused = talaria("hub", "--data-dir", "/proc/1", "--port", "0", cwd=tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("talaria hub: ") and "/proc/1" in refused.stderr, refused.stderr


def test_talaria_db_makes_the_data_directory_private_too(tmp_path: Path) -> None:
    data = tmp_path / "D"
    done = talaria("db", "upgrade", "--data-dir", str(data), cwd=tmp_path, umask=LOOSE)
    assert done.returncode == 0, done.stderr
    assert _mode(data) == 0o700
    assert set(_modes(data).values()) == {0o600}, _modes(data)
    data.chmod(0o750)
    (data / "talaria.sqlite3").chmod(0o640)
    status = talaria("db", "status", "--data-dir", str(data), cwd=tmp_path, umask=LOOSE)
    assert status.returncode == 0, status.stderr
    assert _mode(data) == 0o700 and _mode(data / "talaria.sqlite3") == 0o600
    assert "mode_tightened" in status.stderr
    created = talaria("admin", "create-user", "--data-dir", str(tmp_path / "F"), "--username", "ada", "--role",
                      "admin", cwd=tmp_path, stdin=PASSWORD + "\n", umask=LOOSE)  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert _mode(tmp_path / "F") == 0o700 and set(_modes(tmp_path / "F").values()) == {0o600}


RUNNER_STATE = """
import sys
from pathlib import Path
from talaria.clock import SystemClock
from talaria.runner.receipts import Receipts
from talaria.runner.state_dir import StateDir

with StateDir.open(Path(sys.argv[1]), sys.argv[2]) as state, Receipts(state.receipts_path, SystemClock()):
    print(state.path)
"""


def test_the_runner_state_directory_is_0700_with_files_0600_whatever_the_umask(tmp_path: Path) -> None:
    config, runner_id = tmp_path / "runner.json", str(uuid.uuid4())

    def open_state() -> Path:
        done = subprocess.run([sys.executable, "-c", RUNNER_STATE, str(config), runner_id], capture_output=True,
                              text=True, umask=LOOSE, env=clean_env(), timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return Path(done.stdout.strip())

    state = open_state()
    assert _mode(state) == 0o700 and _mode(state.parent) == 0o700
    assert set(_modes(state).values()) == {0o600}, _modes(state)
    # a receipts file left looser (an older release, a restore from backup) is made private at the next start
    (state / "runner-commands.sqlite3").chmod(0o644)
    assert open_state() == state
    assert set(_modes(state).values()) == {0o600}, _modes(state)
    assert os.stat(state).st_uid == os.geteuid()
