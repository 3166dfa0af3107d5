"""``--metrics-listen [HOST:]PORT`` (operations.md 5.2): the runner's own small HTTP listener for ``GET /metrics``,
``/healthz`` and ``/readyz``; anything else is 404. No authentication: it binds 127.0.0.1 unless the operator names
another host. A request line and headers of at most 8 KiB, read within 5 s; one answer, then the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from talaria.runner.metrics import CONTENT_TYPE

MAX_HEAD_BYTES: Final = 8192
READ_TIMEOUT_S: Final = 5.0
_LISTEN = re.compile(r"^(?:(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):)?(?P<port>[0-9]{1,5})\Z")


class ListenError(ValueError):
    """``--metrics-listen`` is not ``[HOST:]PORT``."""


def parse_listen(text: str) -> tuple[str, int]:
    """``PORT`` (on 127.0.0.1), ``HOST:PORT`` or ``[IPv6]:PORT``; port 0 picks a free one."""
    match = _LISTEN.match(text)
    if match is None or int(match["port"]) > 65535:
        raise ListenError(f"--metrics-listen: {text!r} is not [HOST:]PORT")
    host = match["host"] or "127.0.0.1"
    return host.strip("[]"), int(match["port"])


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str = ""


class MetricsListener:
    def __init__(self, render: Callable[[], bytes], ready: Callable[[], Readiness]) -> None:
        self._render = render
        self._ready = ready
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> str:
        """Listen; returns the URL it serves (the port chosen for 0)."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        bound = self._server.sockets[0].getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        return f"http://{shown}:{bound[1]}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        method, path = (parts[0], parts[1].split("?", 1)[0]) if len(parts) == 3 else ("", "")
        try:
            status, content_type, body = self._answer(method, path)
        except Exception:  # a bug must not leave the connection open
            status, content_type, body = 500, "application/json", b'{"code":"internal_error","error":"internal error"}'
        reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}[status]
        headers = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError):
            writer.write(headers.encode("ascii") + body)
            await writer.drain()
        writer.close()

    def _answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method == "GET" and path == "/metrics":
            return 200, CONTENT_TYPE, self._render()
        if method == "GET" and path == "/healthz":
            return 200, "application/json", b'{"ok":true}'
        if method == "GET" and path == "/readyz":
            readiness = self._ready()
            if readiness.ready:
                return 200, "application/json", b'{"ok":true}'
            body = {"code": "runner_offline", "error": readiness.reason}
            return 503, "application/json", json.dumps(body).encode("utf-8")
        return 404, "application/json", b'{"code":"not_found","error":"not found"}'
