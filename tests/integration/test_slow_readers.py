"""Issue 17 part 5, the reading side (ADR 0066): a client that stops reading an answer cannot hold the hub's memory
and a connection for ever. A runner that never reads its poll answer (32 MiB of commands) and a stalled reader of a
chat event stream are cut off once the hub could not write to them for ``hub.response_write_timeout_s``; the
commands are delivered again to the runner's next poll, the stream's slot is free again, and a reader that is slow
but keeps reading gets every byte. Over a real hub on 127.0.0.1 with raw sockets whose receive buffers are small."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from talaria.clock import SystemClock
from talaria.limits import MAX_CHAT_STREAMS_PER_ACCOUNT
from talaria.testing.hub_server import HubServer
from tests.integration.chat_web_support import chat
from tests.integration.runner_support import Machine, connected_machine, inject, wait_until
from tests.integration.web_support import Web

pytestmark = pytest.mark.usefixtures("fast_argon2")

WRITE_S = 2
KEEP_ALIVE_S = 5  # uvicorn's keep-alive timer, which the hub leaves at its default
COMMANDS, COMMAND_BYTES = 8, 4 * 1024 * 1024
PATIENCE_S = 30.0  # how long a test waits for the event it means: far beyond the write deadline


def small_socket(url: str, receive_buffer: int = 4096) -> socket.socket:
    """A connection whose receive buffer is small (by default as small as the kernel allows, so the hub's writes
    back up at once)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(PATIENCE_S)
    sock.connect((host, int(port)))
    return sock


def request(sock: socket.socket, path: str, headers: dict[str, str]) -> None:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())


def drain(sock: socket.socket) -> int:
    """Read what the hub sent until it closed the connection; the byte count."""
    total = 0
    try:
        while chunk := sock.recv(1 << 20):
            total += len(chunk)
    except ConnectionResetError:
        pass
    return total


def cut_off(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == "response_write_timed_out"
    ]


@pytest.fixture(params=[WRITE_S])
def runner_hub(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[HubServer, Machine]]:
    server = HubServer(tmp_path / "data", SystemClock(), hub_response_write_timeout_s=request.param).start()
    try:
        machine = connected_machine(server)
        yield server, machine
        machine.close()
    finally:
        server.stop()


def queue_big_commands(server: HubServer, runner_id: str) -> set[str]:
    ids = set()
    expires = int(time.time() * 1000) + 120_000
    for _ in range(COMMANDS):
        search = "?pad=" + "x" * COMMAND_BYTES
        wire = {"id": str(uuid.uuid4()), "kind": "http", "expiresAt": expires,
                "payload": {"path": "/api/status", "method": "GET", "search": search}}  # fmt: skip
        inject(server, runner_id, wire)
        ids.add(wire["id"])
    return ids


@pytest.mark.parametrize(
    ("runner_hub", "closing"),
    [(WRITE_S, True), (KEEP_ALIVE_S + 2, False)],
    indirect=["runner_hub"],
    ids=["connection-close", "longer-than-keep-alive"],
)
def test_a_runner_that_never_reads_its_poll_answer_is_cut_off_and_the_commands_come_again(
    runner_hub: tuple[HubServer, Machine], closing: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Once the answer is complete the hub may close the connection itself (the client asked for it, or uvicorn's
    keep-alive timer fired first): closing still waits for a client that does not read, so the deadline goes on."""
    server, machine = runner_hub
    caplog.set_level(logging.INFO, logger="talaria.hub")
    ids = queue_big_commands(server, machine.runner_id)
    sock = small_socket(server.url)
    try:
        headers = machine.headers() | ({"Connection": "close"} if closing else {})
        request(sock, f"/api/runner/v1/{machine.runner_id}/poll", headers)
        wait_until(lambda: bool(cut_off(caplog)), timeout=PATIENCE_S, what="the hub to give up writing")
        [line] = cut_off(caplog)
        assert line["seconds"] == server.settings.hub_response_write_timeout_s
        assert line["client"].startswith("127.0.0.1:")
        kept = {"event", "seconds", "client", "level", "logger", "timestamp", "runner_id", "instance"}
        assert set(line) <= kept, "nothing of the answer: the request's bound context only"
        received = drain(sock)
    finally:
        sock.close()
    assert received < COMMANDS * COMMAND_BYTES, "the answer was cut off"
    answer = machine.poll()  # a runner that reads: the unanswered commands are delivered again (section 6.2)
    assert answer.status_code == 200, answer.text
    assert {command["id"] for command in answer.json()["commands"]} == ids


def test_a_slow_reader_that_keeps_reading_gets_the_whole_answer(
    runner_hub: tuple[HubServer, Machine], caplog: pytest.LogCaptureFixture
) -> None:
    server, machine = runner_hub
    caplog.set_level(logging.INFO, logger="talaria.hub")
    ids = queue_big_commands(server, machine.runner_id)
    sock = small_socket(server.url, 256 * 1024)
    pause = threading.Event()
    data = bytearray()
    try:
        request(sock, f"/api/runner/v1/{machine.runner_id}/poll", machine.headers())
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            assert chunk, "the hub closed the connection before its answer's headers"
            data += chunk
        whole = data.index(b"\r\n\r\n") + 4 + length_of(bytes(data))
        while len(data) < whole:
            chunk = sock.recv(256 * 1024)
            assert chunk, (f"the hub closed the connection after {len(data)} bytes", cut_off(caplog))
            data += chunk
            pause.wait(0.05)  # a slow reader: at most 5 MiB/s, each pause far below the deadline
    finally:
        sock.close()
    body = json.loads(bytes(data[data.index(b"\r\n\r\n") + 4 :]))
    assert {command["id"] for command in body["commands"]} == ids
    assert cut_off(caplog) == []


def length_of(data: bytes) -> int:
    head = data[: data.index(b"\r\n\r\n")].decode("latin-1").lower()
    [value] = [line.split(":", 1)[1] for line in head.split("\r\n") if line.startswith("content-length:")]
    return int(value)


@pytest.fixture
def web(make_hub: Callable[..., HubServer]) -> Iterator[Web]:
    with ExitStack() as stack:
        yield Web(make_hub(hub_response_write_timeout_s=WRITE_S), stack)


def test_a_stalled_event_stream_reader_is_cut_off_and_its_slot_is_free_again(
    web: Web, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="talaria.hub")
    conversation_id = chat(web)
    cookies = "; ".join(f"{name}={value}" for name, value in web.user.cookies.items())
    path = f"/api/conversations/{conversation_id}/events"
    sock = small_socket(web.server.url)
    try:
        request(sock, path, {"Cookie": cookies, "Accept": "text/event-stream"})
        head = b""
        while len(head) < 13 and (chunk := sock.recv(13 - len(head))):
            head += chunk
        assert head == b"HTTP/1.1 200 ", head
        events = web.server.hub.chat_events
        pad = "y" * (64 * 1024)
        sent = 0
        while not cut_off(caplog) and sent < 600:  # at most about 38 MiB: far more than any buffer on the way
            events.emit(conversation_id, "message.delta", {"turnId": "trn_1", "delta": pad})
            sent += 1
        wait_until(lambda: bool(cut_off(caplog)), timeout=PATIENCE_S, what="the hub to give up writing")
        drain(sock)
    finally:
        sock.close()
    # every slot of the account can be taken again: the stalled stream let go of its own
    with ExitStack() as streams:
        for _ in range(MAX_CHAT_STREAMS_PER_ACCOUNT):
            wait_until(lambda: open_stream(web, path, streams), timeout=PATIENCE_S, what="a stream slot")


def open_stream(web: Web, path: str, streams: ExitStack) -> bool:
    response = streams.enter_context(web.user.stream("GET", path))
    if response.status_code == 429:
        response.read()
        return False
    assert response.status_code == 200
    return True
