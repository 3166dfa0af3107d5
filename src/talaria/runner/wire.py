"""A lean HTTP/1.1 transport for httpx on asyncio streams (pure Python; the runner stays light).

The runner makes four short requests per command on loopback or a LAN; httpcore's general machinery
(anyio, h11, connection-pool bookkeeping) cost about 1.2 ms of CPU per request there, more than the
request itself. This transport keeps idle keep-alive connections per origin, writes the request in
one piece, and reads the answer by ``Content-Length`` or chunked encoding. No proxies, no HTTP/2, no
upgrades. A request that fails on a reused connection before any byte of the answer arrived is sent
once more on a new connection (the server closed the idle connection; it never saw the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any

import httpx

MAX_HEAD_BYTES = 64 * 1024
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Stale(Exception):
    """The reused connection was closed before the answer began."""


def _timeout(request: httpx.Request, name: str) -> float | None:
    value = request.extensions.get("timeout", {}).get(name)
    return float(value) if value is not None else None


class LeanTransport(httpx.AsyncBaseTransport):
    def __init__(self, *, max_body: int, ssl_context: ssl.SSLContext | None = None, max_idle: int = 8) -> None:
        self.max_body = max_body
        self.ssl_context = ssl_context
        self.max_idle = max_idle
        self._idle: dict[tuple[str, str, int], list[Stream]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme}")
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        body = await request.aread()
        target = url.raw_path.decode("ascii")
        head = [f"{request.method} {target} HTTP/1.1"]
        head += [f"{name.decode('latin-1')}: {value.decode('latin-1')}" for name, value in request.headers.raw]
        payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        for attempt in range(2):
            stream, reused = await self._acquire(key, request)
            try:
                status, headers, content, keep = await self._exchange(stream, payload, request, reused)
            except _Stale:
                self._discard(stream)
                if attempt == 0:
                    continue
                raise httpx.ReadError("the connection was closed before the answer") from None
            except BaseException:
                self._discard(stream)
                raise
            if keep:
                self._release(key, stream)
            else:
                self._discard(stream)
            return httpx.Response(status, headers=headers, content=content, request=request)
        raise httpx.ReadError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _acquire(self, key: tuple[str, str, int], request: httpx.Request) -> tuple[Stream, bool]:
        idle = self._idle.get(key, [])
        while idle:
            reader, writer = idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return (reader, writer), True
            writer.close()
        scheme, host, port = key
        context = (self.ssl_context or ssl.create_default_context()) if scheme == "https" else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=context, server_hostname=host if context else None),
                _timeout(request, "connect"),
            )
        except (OSError, TimeoutError) as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port} ({type(exc).__name__})") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return (reader, writer), False

    async def _exchange(
        self, stream: Stream, payload: bytes, request: httpx.Request, reused: bool
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        reader, writer = stream
        read_timeout = _timeout(request, "read")
        try:
            writer.write(payload)
            await asyncio.wait_for(writer.drain(), _timeout(request, "write"))
            line = await asyncio.wait_for(reader.readline(), read_timeout)
        except (ConnectionError, OSError) as exc:
            if reused:
                raise _Stale from exc
            raise httpx.WriteError(type(exc).__name__) from exc
        except TimeoutError as exc:
            raise httpx.ReadTimeout("no answer in time") from exc
        if not line:
            if reused:
                raise _Stale
            raise httpx.RemoteProtocolError("the server closed the connection without an answer")
        try:
            version, code = line.split(b" ", 2)[:2]
            status = int(code)
        except ValueError as exc:
            raise httpx.RemoteProtocolError("malformed status line") from exc
        headers: list[tuple[bytes, bytes]] = []
        size = len(line)
        while True:
            try:
                raw = await asyncio.wait_for(reader.readline(), read_timeout)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("no answer in time") from exc
            size += len(raw)
            if size > MAX_HEAD_BYTES or not raw:
                raise httpx.RemoteProtocolError("malformed or oversized response head")
            if raw in (b"\r\n", b"\n"):
                break
            name, _, value = raw.partition(b":")
            headers.append((name.strip(), value.strip()))
        lowered = {name.lower(): value for name, value in headers}
        content = await self._body(reader, lowered, read_timeout, request.method == "HEAD" or status in (204, 304))
        keep = version == b"HTTP/1.1" and lowered.get(b"connection", b"").lower() != b"close"
        chunked = b"chunked" in lowered.get(b"transfer-encoding", b"").lower()
        keep = keep and (b"content-length" in lowered or chunked)
        headers = [(n, v) for n, v in headers if n.lower() not in (b"transfer-encoding",)]
        return status, headers, content, keep

    async def _body(self, reader: asyncio.StreamReader, headers: dict[bytes, bytes], timeout: float | None,
                    empty: bool) -> bytes:  # fmt: skip
        async def read(coro: Any) -> Any:
            try:
                return await asyncio.wait_for(coro, timeout)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("the answer stalled") from exc
            except asyncio.IncompleteReadError as exc:
                raise httpx.RemoteProtocolError("the answer was cut short") from exc

        if empty:
            return b""
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            parts: list[bytes] = []
            total = 0
            while True:
                size_line = await read(reader.readline())
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError as exc:
                    raise httpx.RemoteProtocolError("malformed chunk") from exc
                if size == 0:
                    while (await read(reader.readline())) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                total += size
                if total > self.max_body:
                    raise httpx.ReadError("the answer is too large")
                parts.append(await read(reader.readexactly(size)))
                await read(reader.readexactly(2))
        if b"content-length" in headers:
            try:
                length = int(headers[b"content-length"])
            except ValueError as exc:
                raise httpx.RemoteProtocolError("malformed Content-Length") from exc
            if length > self.max_body:
                raise httpx.ReadError("the answer is too large")
            data: bytes = await read(reader.readexactly(length))
            return data
        pieces: list[bytes] = []
        total = 0
        while piece := await read(reader.read(65536)):  # no length: the answer ends with the connection
            total += len(piece)
            if total > self.max_body:
                raise httpx.ReadError("the answer is too large")
            pieces.append(piece)
        return b"".join(pieces)

    def _release(self, key: tuple[str, str, int], stream: Stream) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self.max_idle:
            idle.append(stream)
        else:
            self._discard(stream)

    @staticmethod
    def _discard(stream: Stream) -> None:
        with contextlib.suppress(Exception):
            stream[1].close()

    async def aclose(self) -> None:
        for streams in self._idle.values():
            for stream in streams:
                self._discard(stream)
        self._idle.clear()
