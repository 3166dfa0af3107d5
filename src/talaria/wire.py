"""A lean HTTP/1.1 client on asyncio streams (pure Python; the runner stays light).

The runner makes four short requests per command (the poll's answer, ``admit``, the Hermes call and
``result``) on loopback or a LAN. A general client's machinery (URL objects, header classes, cookie
jars, auth and redirect layers, a timer task per read) costs more CPU there than the request itself,
so the runner's hub and Hermes REST calls use this client instead: idle keep-alive connections per
client, the request written in one piece, the answer read by ``Content-Length``, chunked encoding or
end of connection, one deadline per request. No proxies, no redirects, no HTTP/2, no upgrades, no
compression (``Accept-Encoding: identity``).

A request that fails on a reused connection before any byte of the answer arrived is sent once more
on a new connection: the server closed the idle connection and never read the request. A request that times out
drops every idle connection: after a network fault they may all be half-open, and each would cost a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from talaria.release import user_agent

MAX_HEAD_BYTES = 64 * 1024
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class WireError(Exception):
    """A transport failure. ``kind``: ``connect``, ``timeout``, ``protocol``, ``closed`` or ``too_large``.
    The message names what failed, never a header value or a body."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Stale(Exception):
    """The reused connection was closed before the answer began."""


@dataclass(frozen=True, slots=True)
class WireReply:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header's values joined with ", "
    body: bytes
    set_cookies: tuple[str, ...] = ()  # each Set-Cookie line apart (their values may hold commas)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


def _check_header(name: str, value: str) -> None:
    if not name or any(c in name for c in ":\r\n ") or "\r" in value or "\n" in value:
        raise WireError("protocol", f"refusing to send a malformed header {name[:40]!r}")


class WireClient:
    """Requests to one origin (``base_url``: scheme, host, port and an optional path prefix)."""

    def __init__(
        self,
        base_url: str,
        *,
        max_body: int,
        timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        max_idle: int = 8,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an http or https URL with a host")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host_text = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host_text if default_port else f"{host_text}:{self.port}"
        self.max_body = max_body
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.max_idle = max_idle
        self._idle: list[Stream] = []
        self._closed = False

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout: float | None = None,
        max_body: int | None = None,
    ) -> WireReply:
        """Send one request; ``target`` is a path with an optional query, below the base path.
        Raises ``WireError``; an answer over ``max_body`` bytes is ``too_large``."""
        if self._closed:
            raise WireError("closed", "the client is closed")
        if not target.startswith("/") or any(c in target for c in " \r\n"):
            raise WireError("protocol", "the request target must be a path without spaces")
        lines = [f"{method} {self.prefix}{target} HTTP/1.1", f"Host: {self.host_header}"]
        lines.append(f"User-Agent: {user_agent()}")
        lines.append("Accept-Encoding: identity")
        for name, value in (headers or {}).items():
            _check_header(name, value)
            lines.append(f"{name}: {value}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        payload = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        limit = self.max_body if max_body is None else max_body
        try:
            async with asyncio.timeout(self.timeout if timeout is None else timeout):
                for attempt in range(2):
                    stream, reused = await self._acquire()
                    try:
                        reply, keep = await self._exchange(stream, payload, method, limit, reused)
                    except _Stale:
                        self._discard(stream)
                        if attempt == 0:
                            continue
                        raise WireError("protocol", "the connection was closed before the answer") from None
                    except BaseException:
                        self._discard(stream)
                        raise
                    if keep:
                        self._release(stream)
                    else:
                        self._discard(stream)
                    return reply
        except TimeoutError as exc:
            # A connection that timed out says the path may be dead (a half-open connection after a network fault):
            # its idle siblings are suspect too, and reusing each would cost another whole timeout.
            self._drop_idle()
            raise WireError("timeout", f"no answer within {self.timeout if timeout is None else timeout:g} s") from exc
        raise WireError("protocol", "unreachable")  # pragma: no cover - the loop returns or raises

    async def _acquire(self) -> tuple[Stream, bool]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return (reader, writer), True
            writer.close()
        context = (self.ssl_context or ssl.create_default_context()) if self.scheme == "https" else None
        try:
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=context, server_hostname=self.host if context else None,
                limit=MAX_HEAD_BYTES,
            )  # fmt: skip
        except OSError as exc:
            raise WireError("connect", f"cannot connect to {self.host}:{self.port} ({type(exc).__name__})") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return (reader, writer), False

    async def _exchange(
        self, stream: Stream, payload: bytes, method: str, limit: int, reused: bool
    ) -> tuple[WireReply, bool]:
        reader, writer = stream
        try:
            writer.write(payload)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if reused and not exc.partial:
                raise _Stale from exc
            raise WireError("protocol", "the server closed the connection without an answer") from exc
        except asyncio.LimitOverrunError as exc:
            raise WireError("protocol", "the answer's head is larger than 64 KiB") from exc
        except (ConnectionError, OSError) as exc:
            if reused:
                raise _Stale from exc
            raise WireError("protocol", f"the connection failed ({type(exc).__name__})") from exc
        status_line, *header_lines = head[:-4].split(b"\r\n")
        try:
            version, code = status_line.split(b" ", 2)[:2]
            status = int(code)
        except ValueError as exc:
            raise WireError("protocol", "malformed status line") from exc
        headers: dict[str, str] = {}
        cookies: list[str] = []
        for raw in header_lines:
            name, sep, value = raw.partition(b":")
            if not sep:
                raise WireError("protocol", "malformed header line")
            key = name.strip().lower().decode("latin-1")
            text = value.strip().decode("latin-1")
            if key == "set-cookie":
                cookies.append(text)
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            content = b""
        else:
            content = await self._body(reader, headers, chunked, limit)
        keep = version == b"HTTP/1.1" and headers.get("connection", "").lower() != "close"
        keep = keep and ("content-length" in headers or chunked)
        headers.pop("transfer-encoding", None)
        return WireReply(status, headers, content, tuple(cookies)), keep

    @staticmethod
    async def _body(reader: asyncio.StreamReader, headers: dict[str, str], chunked: bool, limit: int) -> bytes:
        try:
            if chunked:
                parts: list[bytes] = []
                total = 0
                while True:
                    size_line = await reader.readline()
                    try:
                        size = int(size_line.split(b";")[0].strip(), 16)
                    except ValueError as exc:
                        raise WireError("protocol", "malformed chunk") from exc
                    if size == 0:
                        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(parts)
                    total += size
                    if total > limit:
                        raise WireError("too_large", f"the answer is larger than {limit} bytes")
                    parts.append(await reader.readexactly(size))
                    await reader.readexactly(2)
            if "content-length" in headers:
                try:
                    length = int(headers["content-length"])
                except ValueError as exc:
                    raise WireError("protocol", "malformed Content-Length") from exc
                if length > limit:
                    raise WireError("too_large", f"the answer is larger than {limit} bytes")
                return await reader.readexactly(length)
            pieces: list[bytes] = []
            total = 0
            while piece := await reader.read(65536):  # no length: the answer ends with the connection
                total += len(piece)
                if total > limit:
                    raise WireError("too_large", f"the answer is larger than {limit} bytes")
                pieces.append(piece)
            return b"".join(pieces)
        except asyncio.IncompleteReadError as exc:
            raise WireError("protocol", "the answer was cut short") from exc
        except asyncio.LimitOverrunError as exc:
            raise WireError("protocol", "malformed chunk") from exc
        except (ConnectionError, OSError) as exc:
            raise WireError("protocol", f"the connection failed ({type(exc).__name__})") from exc

    def _release(self, stream: Stream) -> None:
        if len(self._idle) < self.max_idle and not self._closed:
            self._idle.append(stream)
        else:
            self._discard(stream)

    @staticmethod
    def _discard(stream: Stream) -> None:
        with contextlib.suppress(Exception):
            stream[1].close()

    def _drop_idle(self) -> None:
        for stream in self._idle:
            self._discard(stream)
        self._idle.clear()

    async def aclose(self) -> None:
        self._closed = True
        self._drop_idle()
