"""The runner machine API, protocol v1 (runner-protocol.md 4): ``/api/runner/v1/{runnerId}/{op}``.

Gate order: route and method (framework 404/405); then 1 Origin/record/bearer, 2 instance and protocol
headers, 3-8 the connection state (``RunnerHub.enter``), 9 body size and shape. Every answer carries
``Cache-Control: no-store``. Browser rules (session, CSRF) do not apply here: the bearer token does.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from talaria.canonical import canonical_json
from talaria.errors import TalariaError
from talaria.hub.body_limit import drain
from talaria.hub.errors import error_response
from talaria.hub.runners import limits
from talaria.hub.state import Hub

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _answer(value: Any) -> Response:
    return Response(canonical_json(value), media_type="application/json", headers={"Cache-Control": "no-store"})


def _malformed(op: str) -> TalariaError:
    return TalariaError("invalid_json", f"the body is not a valid {op} request")


def _text(value: Any, low: int, high: int) -> bool:
    return isinstance(value, str) and low <= len(value) <= high


def _shape(op: str, body: Any) -> dict[str, Any]:
    """The op's strict body shape (section 4); anything else is 400 ``invalid_json``."""
    if not isinstance(body, dict):
        raise _malformed(op)
    keys = set(body)
    ok = False
    if op == "admit":
        ok = keys == {"id"} and _text(body["id"], 1, 64)
    elif op == "result":
        if keys == {"id", "result"}:
            ok = _text(body["id"], 1, 64)
        elif keys == {"id", "error"} and isinstance(body["error"], dict):
            error = body["error"]
            ok = _text(body["id"], 1, 64) and set(error) == {"message", "code"}
            ok = ok and isinstance(error["message"], str) and _text(error["code"], 1, 64)
    elif op == "event":
        if keys == {"connectionId", "closed"}:
            ok = _text(body["connectionId"], 1, 64) and body["closed"] is True
        elif keys == {"connectionId", "frame"} and isinstance(body["frame"], dict):
            frame = body["frame"]
            ok = _text(body["connectionId"], 1, 64) and set(frame) <= {"type", "session_id", "payload"}
            ok = (
                ok
                and _text(frame.get("type"), 1, 200)
                and ("session_id" not in frame or isinstance(frame["session_id"], str))
            )
    elif op == "tool":
        ok = keys == {"grantId", "toolId", "callId", "arguments"} and bool(UUID.match(str(body["grantId"])))
        ok = (
            ok
            and _text(body["toolId"], 1, 100)
            and _text(body["callId"], 1, 200)
            and isinstance(body["arguments"], dict)
        )
    elif op == "goodbye":
        ok = keys == set()
    if not ok:
        raise _malformed(op)
    return body


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.MAX_POST_BYTES:
        raise TalariaError("runner_payload_limit", "the request body is larger than 16 MiB")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.MAX_POST_BYTES:
            raise TalariaError("runner_payload_limit", "the request body is larger than 16 MiB")
        chunks.append(chunk)
    return b"".join(chunks)


def _gate_record(hub: Hub, runner_id: str, request: Request) -> None:
    """Gate 1: no Origin, an enabled record, the matching bearer (compared as SHA-256, constant time)."""
    record = hub.registry.get(runner_id)
    auth = request.headers.get("authorization", "")
    token = auth[7:] if auth.startswith("Bearer ") else None
    if record is not None and not record.enabled:
        hub.runners.disconnect(runner_id, "disabled")
    if (
        "origin" in request.headers
        or record is None
        or not record.enabled
        or not token
        or not record.token_matches(token)
    ):
        raise TalariaError("runner_unauthorized", "the runner was disabled or its token is invalid; register it again")


async def _handle(request: Request, runner_id: str, op: str) -> Response:
    hub: Hub = request.app.state.hub
    if not UUID.match(runner_id):
        raise TalariaError("not_found", "not found")
    # Store reads here are primary-key lookups done on the loop: the connection state and its futures
    # belong to the event loop and must not be touched from worker threads.
    _gate_record(hub, runner_id, request)
    instance = request.headers.get("x-runner-instance", "")
    if not UUID.match(instance) or request.headers.get("x-runner-protocol") != "1":
        raise TalariaError("runner_protocol_mismatch", "this hub speaks runner protocol 1")
    state, created = hub.runners.enter(
        runner_id,
        instance,
        poll=op == "poll",
        reset=request.headers.get("x-runner-reset") == "1",
        epoch=request.headers.get("x-runner-epoch"),
        features=request.headers.get("x-runner-features"),
    )
    if op == "poll":
        return _answer(await hub.runners.poll(state, created))
    raw = await _read_body(request)
    try:
        body = _shape(op, json.loads(raw))
    except ValueError as exc:
        raise _malformed(op) from exc
    if op == "admit":
        return _answer({"allowed": hub.channels.admit(state, body["id"])})
    if op == "result":
        hub.runners.complete(state, body["id"], body)
        return _answer({"ok": True})
    if op == "event":
        hub.channels.event(state, body)
        return _answer({"ok": True})
    if op == "tool":
        return _answer({"result": await hub.channels.tool(state, body)})
    hub.runners.disconnect(runner_id, "goodbye")
    return _answer({"ok": True})


_METHOD = {"poll": "GET", "admit": "POST", "result": "POST", "event": "POST", "tool": "POST", "goodbye": "POST"}
PREFIX = "/api/runner/v1/"


class MachineDoor:
    """A pure ASGI door for ``/api/runner/v1/{runnerId}/{op}`` in front of the FastAPI router.

    The machine API is the hot path of every runner command; FastAPI's router, which tries every web
    route first, cost more than the work itself. Route matching here is a split and a dict lookup;
    unknown paths and methods answer the same canonical 404/405 as the rest of the hub.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        parts = scope["path"][len(PREFIX) :].split("/")
        body_done = False

        async def tracked() -> Message:
            nonlocal body_done
            message = await receive()
            body_done = body_done or message["type"] != "http.request" or not message.get("more_body", False)
            return message

        request = Request(scope, tracked)
        try:
            if len(parts) != 2 or parts[1] not in _METHOD or not parts[0]:
                raise TalariaError("not_found", "not found")
            if scope["method"] != _METHOD[parts[1]]:
                raise TalariaError("method_not_allowed", "method not allowed", headers={"Allow": _METHOD[parts[1]]})
            response = await _handle(request, parts[0], parts[1])
        except TalariaError as exc:
            if not body_done:  # refused before reading: take the body, or the client may see a reset, not the answer
                await drain(tracked, limit=2 * limits.MAX_POST_BYTES)
            response = error_response(exc)
        await response(scope, receive, send)
