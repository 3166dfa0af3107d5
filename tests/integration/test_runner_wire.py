"""The runner's lean HTTP/1.1 client against a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from talaria.testing.fault_proxy import FaultProxy
from talaria.wire import WireClient, WireError


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
    if path.endswith("/headers"):
        seen = {k.decode(): v.decode() for k, v in scope["headers"]}
        payload = f"{scope['method']} {scope['raw_path'].decode()}?{scope['query_string'].decode()} {seen}".encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-twice", b"a"), (b"x-twice", b"b")]})
        await send({"type": "http.response.body", "body": payload})
        return
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


@contextlib.contextmanager
def serving(keep_alive_s: int) -> Iterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_config=None, access_log=False, timeout_keep_alive=keep_alive_s)
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(uv.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not uv.started:
        thread.join(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        uv.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def server() -> Iterator[str]:
    with serving(keep_alive_s=1) as url:
        yield url


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_requests_reuse_one_keep_alive_connection(server: str) -> None:
    async def go() -> list[str]:
        client = WireClient(server, max_body=1024, timeout=5)
        texts = [(await client.request("POST", "/echo", body=f"n{i}".encode())).text for i in range(5)]
        assert len(client._idle) == 1
        await client.aclose()
        return texts

    assert run(go()) == [f"echo:n{i}" for i in range(5)]


def test_the_request_carries_host_prefix_query_and_headers(server: str) -> None:
    async def go() -> tuple[int, str, dict[str, str]]:
        client = WireClient(server + "/base/", max_body=4096, timeout=5)
        reply = await client.request("GET", "/headers?a=1&b=2", headers={"X-Thing": "v"})
        await client.aclose()
        return reply.status, reply.text, reply.headers

    status, text, headers = run(go())
    port = server.rsplit(":", 1)[1]
    assert status == 200
    assert text.startswith("GET /base/headers?a=1&b=2 ")
    assert f"'host': '127.0.0.1:{port}'" in text and "'x-thing': 'v'" in text
    assert "'accept-encoding': 'identity'" in text
    assert headers["x-twice"] == "a, b"


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(server: str) -> None:
    async def go() -> None:
        client = WireClient(server, max_body=1024, timeout=5)
        try:
            await client.request("GET", "/echo", headers={"X-Bad": "a\r\nX-Injected: 1"})
        finally:
            assert client._idle == []
            await client.aclose()

    with pytest.raises(WireError, match="malformed header") as caught:
        run(go())
    assert caught.value.kind == "protocol"


def test_a_connection_the_server_closed_while_idle_is_replaced_transparently(server: str) -> None:
    async def go() -> str:
        client = WireClient(server, max_body=1024, timeout=5)
        assert (await client.request("POST", "/echo", body=b"a")).status == 201
        reader, _ = client._idle[0]
        deadline = asyncio.get_running_loop().time() + 10
        while not reader.at_eof():  # the server's keep-alive timeout (1 s) closes the idle connection
            assert asyncio.get_running_loop().time() < deadline, "the server never closed the idle connection"
            await asyncio.sleep(0.02)
        text = (await client.request("POST", "/echo", body=b"b")).text
        await client.aclose()
        return text

    assert run(go()) == "echo:b"


def test_chunked_answers_and_connection_close(server: str) -> None:
    async def go() -> tuple[str, str, str]:
        client = WireClient(server, max_body=1024, timeout=5)
        chunked = (await client.request("GET", "/chunked")).text
        closed = (await client.request("GET", "/close")).text
        assert client._idle == []  # "Connection: close" is not kept
        after = (await client.request("POST", "/echo", body=b"z")).text
        await client.aclose()
        return chunked, closed, after

    assert run(go()) == ("one-two-three", "bye", "echo:z")


@pytest.mark.parametrize(("limit", "ok"), [(5000, True), (4999, False)])
def test_an_answer_over_the_limit_is_refused_at_its_edge(server: str, limit: int, ok: bool) -> None:
    async def go() -> int:
        client = WireClient(server, max_body=limit, timeout=5)
        try:
            return len((await client.request("GET", "/big")).body)
        finally:
            await client.aclose()

    if ok:
        assert run(go()) == 5000
    else:
        with pytest.raises(WireError, match="larger than 4999") as caught:
            run(go())
        assert caught.value.kind == "too_large"


def test_a_per_request_limit_overrides_the_client_limit(server: str) -> None:
    async def go() -> None:
        client = WireClient(server, max_body=10_000, timeout=5)
        try:
            await client.request("GET", "/chunked", max_body=5)
        finally:
            await client.aclose()

    with pytest.raises(WireError) as caught:
        run(go())
    assert caught.value.kind == "too_large"


def test_nothing_listening_is_a_connect_error() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()

    async def go() -> None:
        await WireClient(f"http://127.0.0.1:{port}", max_body=10, timeout=5).request("GET", "/")

    with pytest.raises(WireError) as caught:
        run(go())
    assert caught.value.kind == "connect"


def test_a_server_that_never_answers_times_out() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    async def go() -> None:
        await WireClient(f"http://127.0.0.1:{port}", max_body=10, timeout=0.3).request("GET", "/")

    try:
        with pytest.raises(WireError, match=r"no answer within 0\.3 s") as caught:
            run(go())
        assert caught.value.kind == "timeout"
    finally:
        listener.close()


def test_after_a_timeout_no_idle_connection_is_reused() -> None:
    """Chaos finding (issue 17): after a half-open network fault every idle keep-alive connection is as dead as the
    one that timed out; reusing them one by one cost the runner a full request timeout each before it reconnected.
    A timeout drops them all, so the next request goes out on a new connection."""

    async def go(proxy: FaultProxy) -> tuple[str, int]:
        client = WireClient(proxy.url, max_body=1024, timeout=10)
        await asyncio.gather(*(client.request("POST", "/echo", body=b"warm") for _ in range(3)))
        assert len(client._idle) == 3
        proxy.half_open()  # the three idle connections go silent; neither end is told
        with pytest.raises(WireError) as caught:
            await client.request("POST", "/echo", body=b"lost", timeout=1)
        assert caught.value.kind == "timeout"
        assert client._idle == []
        text = (await client.request("POST", "/echo", body=b"after")).text
        idle = len(client._idle)
        await client.aclose()
        return text, idle

    # the server keeps idle connections long enough that none of its closes could pass before the fault
    with serving(keep_alive_s=60) as server:
        proxy = FaultProxy(("127.0.0.1", int(server.rsplit(":", 1)[1])), silent_limit_s=30).start()
        try:
            assert run(go(proxy)) == ("echo:after", 1)
        finally:
            proxy.stop()
