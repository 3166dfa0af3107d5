"""The chaos benchmark's fault proxy (``talaria.testing.fault_proxy``) over real loopback sockets: it forwards, and
each fault does what it says — a reset is a reset, a silenced connection passes nothing either way and tells
neither end, a partition also swallows new connections, latency delays."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from talaria.testing.fault_proxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    made = FaultProxy(("127.0.0.1", server.server_address[1]), silent_limit_s=30).start()
    try:
        yield made
    finally:
        made.stop()
        server.shutdown()
        server.server_close()


def _connect(proxy: FaultProxy, timeout: float = 5) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def _echo(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_it_forwards_both_ways(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        assert _echo(sock, b"hello") == b"hello"


def test_a_reset_resets_every_open_connection_and_new_ones_forward(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        assert _echo(sock, b"a") == b"a"
        assert proxy.reset_all() == 1
        with pytest.raises(ConnectionResetError):
            sock.sendall(b"b")
            sock.recv(1)
    with _connect(proxy) as sock:
        assert _echo(sock, b"c") == b"c"
    assert proxy.counts["reset"] == 1


def test_a_half_open_connection_passes_nothing_and_closes_nothing(proxy: FaultProxy) -> None:
    with _connect(proxy, timeout=1.0) as sock:
        assert _echo(sock, b"a") == b"a"
        assert proxy.half_open() == 1
        sock.sendall(b"lost")
        with pytest.raises(TimeoutError):  # neither an echo nor a close (b"") nor a reset
            sock.recv(1)
    with _connect(proxy) as sock:  # new connections are not affected
        assert _echo(sock, b"c") == b"c"


def test_a_partition_swallows_new_connections_too_until_it_heals(proxy: FaultProxy) -> None:
    with _connect(proxy, timeout=1.0) as before:
        assert _echo(before, b"a") == b"a"
        proxy.partition(True)
        with _connect(proxy, timeout=1.0) as during:  # the TCP connect succeeds; nothing comes back
            during.sendall(b"x")
            with pytest.raises(TimeoutError):
                during.recv(1)
        before.sendall(b"y")
        with pytest.raises(TimeoutError):
            before.recv(1)
        proxy.partition(False)
        with _connect(proxy) as after:
            assert _echo(after, b"z") == b"z"
    assert proxy.counts["partition"] == 1


def test_latency_delays_each_forwarded_chunk(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        proxy.set_latency(0.3)
        started = time.monotonic()
        assert _echo(sock, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.6  # a chunk each way; a busy machine only adds to it
        proxy.set_latency(0)
        assert _echo(sock, b"fast") == b"fast"
    assert proxy.counts["latency"] == 1


class _Named(socketserver.BaseRequestHandler):
    """Says its server's name once, then echoes."""

    def handle(self) -> None:
        self.request.sendall(self.server.name)  # type: ignore[attr-defined]
        while data := self.request.recv(65536):
            self.request.sendall(data)


def _named_server(name: bytes) -> socketserver.ThreadingTCPServer:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Named)
    server.daemon_threads = True
    server.name = name  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _greeting(proxy: FaultProxy) -> bytes:
    with _connect(proxy) as sock:
        return sock.recv(1)


def test_with_several_backends_it_balances_and_skips_one_that_refuses() -> None:
    a, b = _named_server(b"a"), _named_server(b"b")
    proxy = FaultProxy(("127.0.0.1", a.server_address[1]), ("127.0.0.1", b.server_address[1])).start()
    try:
        assert [_greeting(proxy) for _ in range(4)] == [b"a", b"b", b"a", b"b"]
        b.shutdown()
        b.server_close()  # b now refuses connections, as a killed replica's port does
        assert [_greeting(proxy) for _ in range(3)] == [b"a", b"a", b"a"]
        a.shutdown()
        a.server_close()
        with _connect(proxy) as sock, pytest.raises(ConnectionResetError):  # none accepts: reset, not held
            sock.recv(1)
    finally:
        proxy.stop()
        for server in (a, b):
            server.server_close()


def test_a_proxy_needs_a_backend() -> None:
    with pytest.raises(ValueError, match="at least one backend"):
        FaultProxy()
