"""The loopback tool listener of one grant (runner-protocol.md 12.3): HTTP/1.1 on asyncio streams.

It listens on ``127.0.0.1`` with a port the system chooses and answers one request per connection
(``Connection: close``). Checks, in order; the first failure answers ``{"code":"…","error":"…"}``:

1. the peer is ``127.0.0.1`` (403 ``peer_not_allowed``);
2. exactly one ``Host`` header, equal to ``127.0.0.1:<port>`` (403 ``host_not_allowed``);
3. no ``Origin`` header (403 ``origin_not_allowed``);
4. exactly one ``Authorization: Bearer <grant bearer>``, compared in constant time (401 ``unauthenticated``);
5. method ``POST`` (405 ``method_not_allowed``);
6. exactly one ``Content-Type`` whose media type is ``application/json`` (415 ``unsupported_media_type``);
7. ``Content-Length`` at most 256 KiB (413 ``runner_payload_limit``).

A request head that is not HTTP/1.x, larger than 16 KiB or incomplete within 10 s, a ``Transfer-Encoding``
header, or a malformed ``Content-Length`` gives 400 ``invalid_request`` (a request without ``Content-Length``
has an empty body, as HTTP/1.1 says). The grant's bearer never appears in an answer or a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final

from talaria.canonical import canonical_json
from talaria.timeouts import within

HOST: Final = "127.0.0.1"
MAX_BODY_BYTES: Final = 256 * 1024  # larger -> 413 runner_payload_limit
MAX_HEAD_BYTES: Final = 16 * 1024  # larger -> 400 invalid_request
MAX_CONNECTIONS: Final = 64  # more at once -> closed without an answer
HEAD_TIMEOUT_S: Final = 10.0
BODY_TIMEOUT_S: Final = 30.0
WRITE_TIMEOUT_S: Final = 10.0
DRAIN_LIMIT_BYTES: Final = 1024 * 1024  # a refused body is read (and dropped) up to this size, so the
DRAIN_TIMEOUT_S: Final = 2.0  # client sees the answer instead of a connection reset

Serve = Callable[[str, bytes], Awaitable[tuple[int, dict[str, Any]]]]  # (path, body) -> (status, JSON body)


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    headers: list[tuple[str, str]]  # names lower-cased, in arrival order

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str


def parse_head(raw: bytes) -> RequestHead | None:
    """The request line and headers of ``raw`` (ending in an empty line), or None if malformed."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        return None
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or " " in name or "\t" in name:
            return None
        headers.append((name.lower(), value.strip(" \t")))
    return RequestHead(parts[0], parts[1], headers)


def precheck(head: RequestHead, *, peer: str, port: int, bearer: str) -> Refusal | int:
    """Apply the listener's checks in order: the first refusal, or the body length to read."""
    if peer != HOST:
        return Refusal(403, "peer_not_allowed", "only 127.0.0.1 may call this listener")
    if head.values("host") != [f"{HOST}:{port}"]:
        return Refusal(403, "host_not_allowed", f"the Host header must be {HOST}:{port}")
    if head.values("origin"):
        return Refusal(403, "origin_not_allowed", "requests with an Origin header are refused")
    authorization = head.values("authorization")
    scheme, _, presented = authorization[0].partition(" ") if len(authorization) == 1 else ("", "", "")
    expected = bearer.encode("latin-1")
    # compare_digest runs in constant time for the expected bearer's length whatever is presented
    if not (hmac.compare_digest(presented.encode("latin-1"), expected) and scheme.lower() == "bearer"):
        return Refusal(401, "unauthenticated", "a valid grant bearer is required")
    if head.method != "POST":
        return Refusal(405, "method_not_allowed", "only POST is allowed")
    content_type = head.values("content-type")
    if len(content_type) != 1 or content_type[0].split(";")[0].strip().lower() != "application/json":
        return Refusal(415, "unsupported_media_type", "the body must be application/json")
    if head.values("transfer-encoding"):
        return Refusal(400, "invalid_request", "send the body with Content-Length, not Transfer-Encoding")
    lengths = head.values("content-length")
    if not lengths:
        return 0
    if len(set(lengths)) != 1 or not lengths[0].isdigit() or not lengths[0].isascii():
        return Refusal(400, "invalid_request", "malformed Content-Length")
    length = int(lengths[0])
    if length > MAX_BODY_BYTES:
        return Refusal(413, "runner_payload_limit", "the body is larger than 256 KiB")
    return length


def _response(status: int, body: dict[str, Any], extra: dict[str, str] | None = None) -> bytes:
    payload = canonical_json(body)
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        "Cache-Control: no-store",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (extra or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


def _refusal(refusal: Refusal) -> bytes:
    extra = {"Allow": "POST"} if refusal.status == 405 else None
    return _response(refusal.status, {"code": refusal.code, "error": refusal.message}, extra)


class ToolListener:
    """One grant's listener. ``start()`` binds; ``close()`` stops accepting and drops connections still
    reading a request; ``wait_closed(grace)`` lets answers being written finish, then cancels the rest."""

    def __init__(self, bearer: str, serve: Serve) -> None:
        self._bearer = bearer
        self._serve = serve
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._reading: set[asyncio.Task[Any]] = set()
        self.port = 0
        self.closed = False

    def __repr__(self) -> str:
        return f"ToolListener(port={self.port}, closed={self.closed})"

    async def start(self) -> None:
        """Listen on 127.0.0.1 with a system-chosen port; raises OSError if it cannot."""
        self._server = await asyncio.start_server(self._client, HOST, 0, limit=MAX_HEAD_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def close(self) -> None:
        """Stop accepting; connections still reading their request are dropped. Idempotent."""
        self.closed = True
        if self._server is not None:
            self._server.close()
        for task in list(self._reading):
            task.cancel()

    async def wait_closed(self, grace: float) -> None:
        """After ``close()``: wait up to ``grace`` seconds for answers in progress, then cancel them."""
        self.close()
        pending = set(self._handlers)
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await within(self._server.wait_closed(), grace)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            if self.closed or len(self._handlers) > MAX_CONNECTIONS:
                return
            self._reading.add(task)
            answer = await self._answer(reader, writer)
            writer.write(answer)
            await within(writer.drain(), WRITE_TIMEOUT_S)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away or misbehaved: nothing to answer
        except asyncio.CancelledError:
            pass  # dropped while closing; a connection task must not end cancelled (asyncio would log it)
        finally:
            self._reading.discard(task)
            self._handlers.discard(task)
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        try:
            raw = await within(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            return _refusal(Refusal(400, "invalid_request", "the request head is larger than 16 KiB"))
        head = parse_head(raw)
        if head is None:
            return _refusal(Refusal(400, "invalid_request", "malformed HTTP request"))
        peername = writer.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        checked = precheck(head, peer=peer, port=self.port, bearer=self._bearer)
        if isinstance(checked, Refusal):
            await self._drain(reader, head)
            return _refusal(checked)
        body = await within(reader.readexactly(checked), BODY_TIMEOUT_S) if checked else b""
        current = asyncio.current_task()
        if current is not None:
            self._reading.discard(current)  # from here on, an answer is owed even while closing
        status, payload = await self._serve(head.target, body)
        return _response(status, payload)

    async def _drain(self, reader: asyncio.StreamReader, head: RequestHead) -> None:
        lengths = head.values("content-length")
        if len(lengths) != 1 or not lengths[0].isdigit() or not lengths[0].isascii():
            return
        left = min(int(lengths[0]), DRAIN_LIMIT_BYTES)
        with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
            while left > 0:
                chunk = await within(reader.read(min(left, 65536)), DRAIN_TIMEOUT_S)
                if not chunk:
                    return
                left -= len(chunk)
