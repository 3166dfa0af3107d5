"""The hub's pure ASGI middleware: ``AccessLog`` (one structured log line and one metric sample per request),
``BodyLimit``, which refuses request bodies over the limit with 413 ``payload_too_large``, ``SafetyHeaders``
(``Cache-Control: no-store`` on API and JSON answers, ``nosniff`` on every answer) and ``HeadAsGet`` (HEAD on
pages, ``/healthz`` and ``/readyz`` answered as GET without a body; web-api.md 9).

``BodyLimit`` runs before routing for the web API. The Runtime API checks its own body size after the peer check
(lifecycle.md 6.5), so its prefix is exempt here; the runner machine API never reaches this layer
(``machine_api.serve`` answers it in front of FastAPI and checks its 16 MiB limit after the gate).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Final

import structlog
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from talaria.canonical import canonical_json
from talaria.hub.client_address import tcp_peer
from talaria.limits import MAX_ATTACHMENT_BYTES, MAX_BODY_BYTES
from talaria.timeouts import within

if TYPE_CHECKING:
    from talaria.hub.resources import Hub

log = structlog.get_logger("talaria.hub")

# How much of an oversized body is read and thrown away before answering 413: a server that closes
# while the client is still sending makes the client's TCP stack reset the connection, and the 413
# is lost. Past this much, losing the answer is the lesser evil.
DRAIN_LIMIT = 8 * MAX_BODY_BYTES


# After answering a declared oversize body, how long the hub keeps reading what the client may still send
# before it closes (a client that stops sending is not waited for longer than this).
DRAIN_IDLE_S = 1.0


async def drain(receive: Receive, already: int = 0, limit: int = DRAIN_LIMIT) -> None:
    """Read and discard the rest of a request body, up to ``limit`` bytes in all."""
    seen = already
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


_TOO_LARGE = canonical_json({"code": "payload_too_large", "error": "the request body is larger than 1 MiB"})
_TOO_LARGE_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(_TOO_LARGE)).encode()),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"connection", b"close"),
]


def too_large(code: str, message: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """A 413 answer's headers and canonical body."""
    body = canonical_json({"code": code, "error": message})
    return [(b"content-length", str(len(body)).encode()) if k == b"content-length" else (k, v)
            for k, v in _TOO_LARGE_HEADERS], body  # fmt: skip


# Routes whose bodies may be larger than MAX_BODY_BYTES: (path pattern, limit, the 413 answer).
ATTACHMENT_UPLOAD = re.compile(r"^/api/conversations/[^/]+/attachments\Z")
LARGER_BODIES: Final = (
    (ATTACHMENT_UPLOAD, MAX_ATTACHMENT_BYTES, too_large("attachment_too_large", "an attachment is at most 10 MiB")),
)


async def send_too_large(send: Send, answer: tuple[list[tuple[bytes, bytes]], bytes] | None = None) -> None:
    headers, body = answer if answer is not None else (_TOO_LARGE_HEADERS, _TOO_LARGE)
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``, or None when absent or not a number."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def answer_and_close(
    scope: Scope, receive: Receive, send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    """Answer at once, without reading the body first, and close the connection (web-api.md 9: a declared
    ``Content-Length`` over the limit).

    The whole answer (its ``Content-Length`` included) goes out before anything is read. Then, before the
    connection closes, what the client is still sending is read and discarded while it keeps coming (at most
    ``DRAIN_IDLE_S`` between reads, ``DRAIN_LIMIT`` bytes in all): closing on unread bytes makes the client's
    TCP stack reset the connection, which may destroy the answer before the client reads it. A client that
    asked for ``100-continue`` sends nothing more and is not waited for."""
    if (b"connection", b"close") not in headers:
        headers = [*headers, (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    expects_continue = any(name == b"expect" for name, _ in scope.get("headers", []))
    seen = 0
    while not expects_continue and seen <= DRAIN_LIMIT:
        try:
            message = await within(receive(), DRAIN_IDLE_S)
        except TimeoutError:
            break
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
        seen += len(message.get("body", b""))
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int = MAX_BODY_BYTES,
        exempt_prefixes: tuple[str, ...] = ("/internal/runtime/",),
    ):
        self.app = app
        self.limit = limit
        self.exempt_prefixes = exempt_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.exempt_prefixes):
            await self.app(scope, receive, send)
            return
        limit, answer = self.limit, (_TOO_LARGE_HEADERS, _TOO_LARGE)
        for pattern, larger, refusal in LARGER_BODIES:
            if scope["method"] == "POST" and pattern.match(scope["path"]):
                limit, answer = larger, refusal
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await answer_and_close(scope, receive, send, 413, *answer)
            return
        # Buffer the whole body (at most the limit) before the app sees any of it, so that an
        # oversized body is refused without the route having acted on its first part.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                if message.get("more_body", False):
                    await drain(receive, seen, max(DRAIN_LIMIT, 2 * limit))
                await send_too_large(send, answer)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for a disconnect, as the server would

        await self.app(scope, replay, send)


class HttpOnly:
    """Pure ASGI middleware that acts on HTTP requests only (``http``); lifespan and other scopes pass through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class AccessLog(HttpOnly):
    """One structured log line and one metric sample per request (no query strings, no bodies); the line
    names the client address (``hub/client_address.py``)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            elapsed = time.perf_counter() - started
            hub: Hub | None = getattr(scope["app"].state, "hub", None) if "app" in scope else None
            client = tcp_peer(scope)
            if hub is not None:
                hub.metrics.observe_request(scope["path"], status, elapsed)
                client = hub.clients.of(scope)
            log.info("request", method=scope["method"], path=scope["path"], status=status,
                     ms=round(elapsed * 1000, 1), client=client)  # fmt: skip


# Paths whose routes keep their own method rules: the JSON API (a HEAD there stays 405) and the Runtime API,
# whose signature covers the method.
_OWN_METHODS = ("/api/", "/internal/")


class SafetyHeaders(HttpOnly):
    """Every answer carries ``X-Content-Type-Options: nosniff``; every ``/api/`` answer and every JSON answer
    also ``Cache-Control: no-store`` (both replace what a route set)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        api = str(scope["path"]).startswith("/api/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["X-Content-Type-Options"] = "nosniff"
                if api or headers.get("content-type", "").split(";")[0].strip() == "application/json":
                    headers["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, with_headers)


class HeadAsGet:
    """``HEAD`` outside ``/api/`` and ``/internal/`` runs the ``GET`` route and sends its status and headers
    (``Content-Length`` included) without the body. The server still sees a HEAD request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or str(scope["path"]).startswith(_OWN_METHODS):
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app(dict(scope, method="GET"), receive, without_body)
