"""Issue 17 part 5 over a real ``talaria hub`` process: a client that trickles a request's headers (slowloris) or
its body is answered 408 ``request_timeout`` and cut off at the read deadlines of ADR 0063; a silent connection is
closed; a request read in time is served, and a held answer (a runner's poll) is not cut by the deadlines."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.cli_support import HubProcess, clean_env, talaria

HEADER_S = 2
BODY_S = 3
PATIENCE_S = 20.0  # how long a test socket waits for the hub's answer or close: far beyond either deadline


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[HubProcess, str]]:
    env = clean_env(TALARIA_HUB_REQUEST_HEADER_TIMEOUT_S=str(HEADER_S), TALARIA_HUB_REQUEST_BODY_TIMEOUT_S=str(BODY_S))
    process = HubProcess(tmp_path, ["--data-dir", str(tmp_path / "D"), "--port", "0"], env)
    try:
        _, url = process.ready()
        yield process, url
    finally:
        process.close()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=PATIENCE_S)
    return sock


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the hub sends until it closes the connection, and when it closed (monotonic). A reset is a close
    too: a byte the client still trickles after the hub closed makes the hub's kernel answer with a reset, which
    ends the read after what had arrived (failed once in CI)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data, time.monotonic()


class Trickle:
    """Send ``data`` a byte every ``every`` seconds in a thread until it is all sent or the hub closes."""

    def __init__(self, sock: socket.socket, data: bytes, every: float) -> None:
        self.sent = 0
        self._thread = threading.Thread(target=self._run, args=(sock, data, every), daemon=True)
        self._thread.start()

    def _run(self, sock: socket.socket, data: bytes, every: float) -> None:
        stop = threading.Event()
        for byte in data:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return
            self.sent += 1
            if stop.wait(every):
                return


def _answer(data: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, json.loads(body)


def _timed_out_lines(process: HubProcess) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in process.stderr().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "request_timed_out"]


def _host(url: str) -> str:
    return url.removeprefix("http://")


def test_headers_trickled_a_byte_at_a_time_are_cut_off_at_the_header_deadline_with_a_408(
    hub: tuple[HubProcess, str],
) -> None:
    process, url = hub
    request = f"GET /api/auth/me HTTP/1.1\r\nHost: {_host(url)}\r\nX-Pad: {'a' * 400}\r\n\r\n".encode()
    with _connect(url) as sock:
        started = time.monotonic()
        trickle = Trickle(sock, request, every=0.1)  # each byte well within any per-byte timeout
        data, closed = _read_until_closed(sock)
    status, headers, body = _answer(data)
    assert status == 408
    assert headers["connection"] == "close"
    assert body == {"code": "request_timeout", "error": f"the request's headers did not arrive within {HEADER_S} s"}
    # the deadline runs from the first byte, not from the last one: the hub closed long before the request was sent
    assert trickle.sent < len(request)
    assert HEADER_S - 0.5 <= closed - started < PATIENCE_S
    line = _timed_out_lines(process)[0]
    assert line["phase"] == "headers"
    assert line["client"].startswith("127.0.0.1:")


def test_a_silent_connection_is_closed_at_the_header_deadline_without_an_answer(hub: tuple[HubProcess, str]) -> None:
    process, url = hub
    with _connect(url) as sock:
        started = time.monotonic()
        data, closed = _read_until_closed(sock)
    assert data == b""
    assert HEADER_S - 0.5 <= closed - started < PATIENCE_S
    assert _timed_out_lines(process) == []  # like a keep-alive timeout, not worth a line


def test_headers_sent_slowly_but_within_the_deadline_are_served(hub: tuple[HubProcess, str]) -> None:
    process, url = hub
    request = f"GET /api/auth/me HTTP/1.1\r\nHost: {_host(url)}\r\nConnection: close\r\n\r\n".encode()
    with _connect(url) as sock:
        for piece in (request[:5], request[5:20], request[20:-2], request[-2:]):  # in four parts, 0.1 s apart
            sock.sendall(piece)
            time.sleep(0.1)
        data, _ = _read_until_closed(sock)
    status, _, body = _answer(data)
    assert (status, body["code"]) == (401, "unauthenticated")
    assert _timed_out_lines(process) == []


def test_partial_headers_after_a_kept_alive_request_meet_the_header_deadline(hub: tuple[HubProcess, str]) -> None:
    """uvicorn's keep-alive timer is cancelled by the next request's first byte; the header deadline takes over."""
    _, url = hub
    first = f"GET /healthz HTTP/1.1\r\nHost: {_host(url)}\r\n\r\n".encode()
    with _connect(url) as sock:
        sock.sendall(first)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: ")
        started = time.monotonic()
        data, closed = _read_until_closed(sock)
    second = data[data.index(b"HTTP/1.1 408 ") :]
    status, _, body = _answer(second)
    assert (status, body["code"]) == (408, "request_timeout")
    assert HEADER_S - 0.5 <= closed - started < PATIENCE_S


def test_a_trickled_body_is_cut_off_at_the_body_deadline_and_the_request_has_no_effect(
    tmp_path: Path, hub: tuple[HubProcess, str]
) -> None:
    process, url = hub
    done = talaria("admin", "create-user", "--data-dir", str(tmp_path / "D"), "--username", "ann", "--role", "user",
                   cwd=tmp_path, stdin="correct horse battery staple\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    body = json.dumps({"username": "ann", "password": "correct horse battery staple"}).encode()
    head = (f"POST /api/auth/login HTTP/1.1\r\nHost: {_host(url)}\r\nContent-Type: application/json\r\n"
            f"Origin: {url}\r\nContent-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    with _connect(url) as sock:
        sock.sendall(head)
        started = time.monotonic()
        trickle = Trickle(sock, body, every=0.2)
        data, closed = _read_until_closed(sock)
    logs = process.stderr()[-3000:]  # shown when an assertion below fails
    status, headers, answer = _answer(data)
    assert (status, headers["connection"]) == (408, "close"), logs
    assert answer == {"code": "request_timeout", "error": f"the request's body did not arrive within {BODY_S} s"}
    assert trickle.sent < len(body), logs
    assert BODY_S - 0.5 <= closed - started < PATIENCE_S, (closed - started, logs)
    assert [line["phase"] for line in _timed_out_lines(process)] == ["body"], logs
    assert "Traceback" not in process.stderr(), logs
    assert _sessions(tmp_path / "D") == 0, logs
    # the same body sent at once signs in: the refusal was the deadline's, not the request's
    with httpx.Client(base_url=url, timeout=10) as client:
        response = client.post("/api/auth/login", content=body,
                               headers={"Content-Type": "application/json", "Origin": url})  # fmt: skip
    assert response.status_code == 200, (response.text, process.stderr()[-3000:])
    assert _sessions(tmp_path / "D") == 1


def _sessions(data: Path) -> int:
    with sqlite3.connect(f"file:{data / 'talaria.sqlite3'}?mode=ro", uri=True) as db:
        count: int = db.execute("SELECT count(*) FROM web_session").fetchone()[0]
    return count


def test_a_held_runner_poll_outlives_both_deadlines(tmp_path: Path, hub: tuple[HubProcess, str]) -> None:
    process, url = hub
    out = tmp_path / "runner.json"
    done = talaria("admin", "runners", "register", "--data-dir", str(tmp_path / "D"), "--name", "n1", "--profile",
                   "default", "--server-url", url, "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = json.loads(out.read_text())
    headers = {"Authorization": f"Bearer {config['token']}", "X-Runner-Instance": str(uuid.uuid4()),
               "X-Runner-Protocol": "1"}  # fmt: skip
    poll = f"/api/runner/v1/{config['runnerId']}/poll"
    with httpx.Client(base_url=url, timeout=PATIENCE_S + 10, headers=headers) as client:
        first = client.get(poll)
        assert first.status_code == 200, first.text
        headers["X-Runner-Epoch"] = str(first.json()["epoch"])
        started = time.monotonic()
        held = client.get(poll, headers={"X-Runner-Epoch": headers["X-Runner-Epoch"]})
        lasted = time.monotonic() - started
    assert held.status_code == 200, held.text
    assert held.json()["commands"] == []
    assert lasted > HEADER_S + BODY_S
    assert _timed_out_lines(process) == []


@pytest.mark.parametrize("key", ["request_header_timeout_s", "request_body_timeout_s", "response_write_timeout_s"])
def test_a_deadline_outside_1_to_3600_seconds_stops_the_hub_naming_the_key(tmp_path: Path, key: str) -> None:
    variable = f"TALARIA_HUB_{key.upper()}"
    for bad in ("0", "3601"):
        done = talaria("hub", "--data-dir", str(tmp_path / "D"), "--port", "0", cwd=tmp_path,
                       env=clean_env(**{variable: bad}))  # fmt: skip
        assert done.returncode == 1
        assert done.stderr.strip() == f"talaria hub: hub.{key} must be between 1 and 3600"


def test_deadlines_at_their_edges_are_accepted(tmp_path: Path) -> None:
    for value in ("1", "3600"):
        env = clean_env(TALARIA_HUB_REQUEST_HEADER_TIMEOUT_S=value, TALARIA_HUB_REQUEST_BODY_TIMEOUT_S=value,
                        TALARIA_HUB_RESPONSE_WRITE_TIMEOUT_S=value)  # fmt: skip
        process = HubProcess(tmp_path, ["--data-dir", str(tmp_path / "D"), "--port", "0"], env)
        try:
            process.ready()
        finally:
            process.close()
