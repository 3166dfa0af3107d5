"""The runner's lean HTTP/1.1 transport against a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from talaria.runner.wire import LeanTransport


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path == "/chunked":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for piece in (b"one-", b"two-", b"three"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/big":
        payload = b"x" * 5000
    elif path == "/close":
        payload = b"bye"
        headers = [(b"content-length", b"3"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        return
    else:
        payload = b"echo:" + body
    await send(
        {"type": "http.response.start", "status": 201, "headers": [(b"content-length", str(len(payload)).encode())]}
    )
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture
def server() -> Iterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_config=None, access_log=False, timeout_keep_alive=1)
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(uv.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not uv.started:
        thread.join(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    uv.should_exit = True
    thread.join(10)
    sock.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_requests_reuse_one_keep_alive_connection(server: str) -> None:
    async def go() -> list[str]:
        transport = LeanTransport(max_body=1024)
        async with httpx.AsyncClient(base_url=server, transport=transport) as client:
            texts = [(await client.post("/echo", content=f"n{i}".encode())).text for i in range(5)]
            idle = sum(len(v) for v in transport._idle.values())
        assert idle == 1
        return texts

    assert run(go()) == [f"echo:n{i}" for i in range(5)]


def test_a_connection_the_server_closed_while_idle_is_replaced_transparently(server: str) -> None:
    async def go() -> str:
        async with httpx.AsyncClient(base_url=server, transport=LeanTransport(max_body=1024)) as client:
            assert (await client.post("/echo", content=b"a")).status_code == 201
            await asyncio.sleep(1.6)  # the server's keep-alive timeout (1 s) closes the idle connection
            return (await client.post("/echo", content=b"b")).text

    assert run(go()) == "echo:b"


def test_chunked_answers_and_connection_close(server: str) -> None:
    async def go() -> tuple[str, str, str]:
        transport = LeanTransport(max_body=1024)
        async with httpx.AsyncClient(base_url=server, transport=transport) as client:
            chunked = (await client.get("/chunked")).text
            closed = (await client.get("/close")).text
            after = (await client.post("/echo", content=b"z")).text
        return chunked, closed, after

    assert run(go()) == ("one-two-three", "bye", "echo:z")


def test_an_answer_over_the_limit_is_refused(server: str) -> None:
    async def go() -> None:
        async with httpx.AsyncClient(base_url=server, transport=LeanTransport(max_body=4999)) as client:
            await client.get("/big")

    with pytest.raises(httpx.ReadError, match="too large"):
        run(go())


def test_nothing_listening_is_a_connect_error() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()

    async def go() -> None:
        async with httpx.AsyncClient(transport=LeanTransport(max_body=10)) as client:
            await client.get(f"http://127.0.0.1:{port}/")

    with pytest.raises(httpx.ConnectError):
        run(go())
