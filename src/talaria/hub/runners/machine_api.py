"""The runner machine API, protocol v1 (runner-protocol.md 4): ``/api/runner/v1/{runnerId}/{op}``.

Gate order: route (404 for an unknown op or a runner id that is not a lower-case UUID), then method (405);
then 1 Origin/record/bearer, 2 instance and protocol headers, 3-8 the connection state (``RunnerTransport.enter``),
9 body size and shape. Every answer carries ``Cache-Control: no-store``; a poll's also ``X-Hub-Features``, the
offered features this hub accepts (scale.md 3.5). Browser rules (session, CSRF) do not apply here: the bearer
token does.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from starlette.concurrency import run_in_threadpool
from starlette.types import Message, Receive, Scope, Send

from talaria.canonical import canonical_json
from talaria.errors import TalariaError
from talaria.hub.client_address import ClientAddresses
from talaria.hub.errors import error_response
from talaria.hub.middleware import answer_and_close, declared_length, drain
from talaria.hub.runners import limits
from talaria.hub.runners.channels import Channels
from talaria.hub.runners.connection_state import ConnState, EncodedResult
from talaria.hub.runners.registry import RunnerRecord, RunnerRegistry
from talaria.hub.runners.transport import RunnerTransport
from talaria.settings import Settings


class RequestObserver(Protocol):
    def observe_request(self, path: str, status: int, elapsed_s: float) -> object: ...


class Hub(Protocol):
    """What the machine API needs of the hub: the runner records, the connection states, the hub operations
    that answer ``admit``/``event``/``tool``, and the request metrics (the hub's resources satisfy it)."""

    @property
    def registry(self) -> RunnerRegistry: ...
    @property
    def runners(self) -> RunnerTransport: ...
    @property
    def channels(self) -> Channels: ...
    @property
    def metrics(self) -> RequestObserver: ...
    @property
    def clients(self) -> ClientAddresses: ...
    @property
    def settings(self) -> Settings: ...


@dataclass(frozen=True)
class Encoded:
    """An answer already encoded (the ``tool`` op's team results keep their key order)."""

    body: bytes


@dataclass(frozen=True)
class Polled:
    """A poll's answer and the offered features this hub accepts, echoed in ``X-Hub-Features`` (scale.md 3.5)."""

    body: dict[str, Any]
    features: str


UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
USER_AGENT = re.compile(r"talaria-runner/([0-9A-Za-z.+-]{1,64})")
log = structlog.get_logger("talaria.hub")
ROTATE = "rotate-v1"


def _headers(scope: Scope) -> dict[str, str]:
    """Request headers by lower-case name; the first of repeated headers wins."""
    seen: dict[str, str] = {}
    for name, value in scope["headers"]:
        seen.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return seen


def _malformed(op: str) -> TalariaError:
    return TalariaError("invalid_json", f"the body is not a valid {op} request")


def _text(value: Any, low: int, high: int) -> bool:
    return isinstance(value, str) and low <= len(value) <= high


def _admit_body(body: dict[str, Any]) -> bool:
    return set(body) == {"id"} and _text(body["id"], 1, 64)


def _result_body(body: dict[str, Any]) -> bool:
    keys = set(body)
    if keys == {"id", "result"}:
        return _text(body["id"], 1, 64)
    if keys != {"id", "error"} or not isinstance(body["error"], dict):
        return False
    error = body["error"]
    return (
        _text(body["id"], 1, 64)
        and set(error) == {"message", "code"}
        and isinstance(error["message"], str)
        and _text(error["code"], 1, 64)
    )


def _event_body(body: dict[str, Any]) -> bool:
    keys = set(body) - {"seq"}  # failover-v1 numbers every event of a connection (scale.md 3.5)
    if "seq" in body and not (type(body["seq"]) is int and 1 <= body["seq"] <= limits.MAX_EVENT_SEQ):
        return False
    if keys == {"connectionId", "closed"}:
        return _text(body["connectionId"], 1, 64) and body["closed"] is True
    if keys != {"connectionId", "frame"} or not isinstance(body["frame"], dict):
        return False
    frame = body["frame"]
    return (
        _text(body["connectionId"], 1, 64)
        and set(frame) <= {"type", "session_id", "payload"}
        and _text(frame.get("type"), 1, 200)
        and ("session_id" not in frame or isinstance(frame["session_id"], str))
    )


def _tool_body(body: dict[str, Any]) -> bool:
    return (
        set(body) == {"grantId", "toolId", "callId", "arguments"}
        and bool(UUID.match(str(body["grantId"])))
        and _text(body["toolId"], 1, 100)
        and _text(body["callId"], 1, 200)
        and isinstance(body["arguments"], dict)
    )


def _empty_body(body: dict[str, Any]) -> bool:
    return not body


async def _admit(hub: Hub, state: ConnState, body: dict[str, Any]) -> Any:
    return {"allowed": await hub.channels.admit(state, body["id"])}


async def _result(hub: Hub, state: ConnState, body: dict[str, Any]) -> Any:
    await hub.runners.complete(state, body["id"], body)
    return {"ok": True}


async def _event(hub: Hub, state: ConnState, body: dict[str, Any]) -> Any:
    await hub.channels.event(state, body)
    return {"ok": True}


async def _tool(hub: Hub, state: ConnState, body: dict[str, Any]) -> Any:
    result = await hub.channels.tool(state, body)
    if isinstance(result, EncodedResult):
        return Encoded(b'{"result":' + result.text.encode("utf-8") + b"}")
    return {"result": result}


async def _rotate(hub: Hub, state: ConnState, body: dict[str, Any]) -> Any:
    """Operations.md 4.1: a fresh token, returned once; its hash becomes the next one (an unused next is replaced,
    logged and shown on the node's row). Only for a ``rotate-v1`` runner whose rotation is due."""
    if ROTATE not in state.features:
        raise TalariaError("runner_feature_required", "token rotation needs a runner that offers rotate-v1")
    record = await run_in_threadpool(hub.registry.get, state.runner_id)
    settings = hub.settings
    now = hub.runners.clock.now_ms()
    if record is None or not record.rotation_due(now, settings.token_rotate_after_ms):
        raise TalariaError("runner_rotation_not_due", "no rotation of this runner's token is due")
    issued = await run_in_threadpool(hub.registry.issue_next, state.runner_id, settings.token_overlap_ms)
    if issued is None:
        raise TalariaError("runner_unauthorized", "the runner was disabled or its token is invalid; register it again")
    token, issued_at, replaced = issued
    if replaced:
        log.warning("runner_token_next_replaced", runner_id=state.runner_id)
    return {"token": token, "issuedAt": issued_at}


async def _goodbye(hub: Hub, state: ConnState, body: dict[str, Any]) -> Any:
    await hub.runners.disconnect(state.runner_id, "goodbye")
    return {"ok": True}


@dataclass(frozen=True)
class Op:
    """One op of section 4: its method, its strict body shape (None: no body, the poll) and its handler."""

    method: str
    shape: Callable[[dict[str, Any]], bool] | None
    handler: Callable[[Hub, ConnState, dict[str, Any]], Awaitable[Any]] | None


OPS: dict[str, Op] = {
    "poll": Op("GET", None, None),
    "admit": Op("POST", _admit_body, _admit),
    "result": Op("POST", _result_body, _result),
    "event": Op("POST", _event_body, _event),
    "tool": Op("POST", _tool_body, _tool),
    "goodbye": Op("POST", _empty_body, _goodbye),
    "rotate": Op("POST", _empty_body, _rotate),
}


def _shape(op: str, raw: bytes) -> dict[str, Any]:
    """The op's strict body (section 4); anything else is 400 ``invalid_json``."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise _malformed(op) from exc
    shape = OPS[op].shape
    if not isinstance(body, dict) or shape is None or not shape(body):
        raise _malformed(op)
    return body


async def _read_body(headers: dict[str, str], receive: Receive) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.MAX_POST_BYTES:
        raise TalariaError("runner_payload_limit", "the request body is larger than 16 MiB")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise TalariaError("invalid_json", "the request body ended early")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limits.MAX_POST_BYTES:
            raise TalariaError("runner_payload_limit", "the request body is larger than 16 MiB")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def runner_version_of(user_agent: str | None) -> str | None:
    """The release a runner names in its ``User-Agent`` (``talaria-runner/<version>``, operations.md 1.2), or None
    for another agent or a malformed one."""
    match = USER_AGENT.fullmatch(user_agent or "")
    return match.group(1) if match else None


async def _gate_record(hub: Hub, runner_id: str, headers: dict[str, str]) -> tuple[RunnerRecord, bool]:
    """Gate 1: no Origin, an enabled record, the bearer matching the current or the unused next token (compared as
    SHA-256, constant time). The first request with the next token promotes it (operations.md 4.1): the record, and
    whether this request presented the next token."""
    record = hub.registry.get(runner_id)
    auth = headers.get("authorization", "")
    token = auth[7:] if auth.startswith("Bearer ") else None
    if record is not None and not record.enabled:
        await hub.runners.disconnect(runner_id, "disabled")
    if "origin" in headers or record is None or not record.enabled or not token:
        raise _unauthorized()
    overlap_ms = hub.settings.token_overlap_ms
    presented = record.presented(token, now=hub.runners.clock.now_ms(), overlap_ms=overlap_ms)
    if presented == "next":
        promoted = await run_in_threadpool(hub.registry.promote, runner_id, token)
        if promoted is None:
            raise _unauthorized()
        return promoted, True
    if presented is None:
        raise _unauthorized()
    return record, False


def _unauthorized() -> TalariaError:
    return TalariaError("runner_unauthorized", "the runner was disabled or its token is invalid; register it again")


def _rotation_asked(hub: Hub, runner_id: str, gated: RunnerRecord, answer: dict[str, Any]) -> bool:
    """A poll answer's ``rotate: true`` (operations.md 4.1). An empty answer may end a held poll, so the record is
    read again: a rotation asked for meanwhile is said at once (an answer with commands left at once)."""
    record = hub.registry.get(runner_id) if not answer["commands"] else gated
    rotate_after_ms = hub.settings.token_rotate_after_ms
    return record is not None and record.rotation_due(hub.runners.clock.now_ms(), rotate_after_ms)


async def _drain_request(hub: Hub, record: RunnerRecord, state: ConnState) -> None:
    """The command line's drain request (operations.md 3.1): applied to a state older than the request, dropped
    for a newer one (the runner restarted since)."""
    requested = record.drain_requested_at
    assert requested is not None
    if state.created <= requested:
        await hub.runners.drain(record.id)
    await asyncio.to_thread(hub.registry.clear_drain_request, record.id, requested)


async def _handle(hub: Hub, headers: dict[str, str], receive: Receive, runner_id: str, op: str) -> Any:
    """The answer's value for one request (route and method already matched); refusals raise ``TalariaError``."""
    # The record read is a primary-key lookup done on the loop; the transport does its own store work (in memory
    # on the loop for SQLite, on worker threads for PostgreSQL).
    record, promoted = await _gate_record(hub, runner_id, headers)
    instance = headers.get("x-runner-instance", "")
    if not UUID.match(instance) or headers.get("x-runner-protocol") != "1":
        raise TalariaError("runner_protocol_mismatch", "this hub speaks runner protocol 1")
    state, created = await hub.runners.enter(
        runner_id,
        instance,
        poll=op == "poll",
        reset=headers.get("x-runner-reset") == "1",
        epoch=headers.get("x-runner-epoch"),
        features=headers.get("x-runner-features"),
        version=runner_version_of(headers.get("user-agent")),
        draining=headers.get("x-runner-draining") == "1",
    )
    if record.drain_requested_at is not None:
        await _drain_request(hub, record, state)
    if op == "poll":
        echo = ",".join(sorted(limits.accepted_features(headers.get("x-runner-features"))))
        # a poll that promoted a token is answered at once, not held, so the runner learns its new token works
        answer = await hub.runners.poll(state, created or promoted)
        if ROTATE in state.features and _rotation_asked(hub, runner_id, record, answer):
            answer["rotate"] = True
        return Polled(answer, echo)
    body = _shape(op, await _read_body(headers, receive))
    handler = OPS[op].handler
    assert handler is not None
    return await handler(hub, state, body)


PREFIX = "/api/runner/v1/"


def is_machine_path(scope: Scope) -> bool:
    return scope["type"] == "http" and str(scope["path"]).startswith(PREFIX)


async def serve(hub: Hub, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one machine API request, its log lines carrying the runner's id and instance (operations.md 5.3)."""
    parts = scope["path"][len(PREFIX) :].split("/")
    runner_id = parts[0] if UUID.match(parts[0]) else None
    instance = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-runner-instance"), "")
    shown = instance if UUID.match(instance) else None  # never an arbitrary header value in the log
    with structlog.contextvars.bound_contextvars(runner_id=runner_id, instance=shown):
        await _serve(hub, scope, receive, send)


async def _serve(hub: Hub, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one machine API request; the hub's ASGI app sends ``PREFIX`` paths here, before FastAPI.

    The machine API is the hot path of every runner command, so this door is the outermost layer: route
    matching is a split and a dict lookup, the answer is two ASGI messages, and the access log line,
    the request metrics and the guard against unexpected exceptions are done here once instead of by a
    stack of middleware. Unknown paths and methods answer the same canonical 404/405 as the rest of the
    hub.
    """
    started = time.perf_counter()
    parts = scope["path"][len(PREFIX) :].split("/")
    headers = _headers(scope)
    body_done = False
    status = 500

    async def tracked() -> Message:
        nonlocal body_done
        message = await receive()
        body_done = body_done or message["type"] != "http.request" or not message.get("more_body", False)
        return message

    try:
        try:
            # A path whose runner id is not a UUID names no route, so it is 404 whatever the method.
            if len(parts) != 2 or parts[1] not in OPS or not UUID.match(parts[0]):
                raise TalariaError("not_found", "not found")
            method = OPS[parts[1]].method
            if scope["method"] != method:
                raise TalariaError("method_not_allowed", "method not allowed", headers={"Allow": method})
            answer = await _handle(hub, headers, tracked, parts[0], parts[1])
            extra: list[tuple[bytes, bytes]] = []
            if isinstance(answer, Polled):
                extra.append((b"x-hub-features", answer.features.encode("ascii")))
                answer = answer.body
            payload = answer.body if isinstance(answer, Encoded) else canonical_json(answer)
        except TalariaError as exc:
            response = error_response(exc)
            status = response.status_code
            declared = declared_length(scope)
            if not body_done and declared is not None and declared > limits.MAX_POST_BYTES:
                # a body over the limit is not waited for, whatever the refusal: answer now and close
                await answer_and_close(scope, tracked, send, status, response.raw_headers, bytes(response.body))
                return
            if not body_done:  # refused before reading: take the body, or the client may see a reset, not the answer
                await drain(tracked, limit=2 * limits.MAX_POST_BYTES)
            await response(scope, receive, send)
            return
        except Exception:
            log.exception("unhandled_error", path=scope.get("path"))
            response = error_response(TalariaError("internal_error", "internal error; the transaction was rolled back"))
            await response(scope, receive, send)
            return
        status = 200
        length = (b"content-length", str(len(payload)).encode("ascii"))
        await send({"type": "http.response.start", "status": 200, "headers": [*_OK_HEADERS, *extra, length]})
        await send({"type": "http.response.body", "body": payload})
    finally:
        elapsed = time.perf_counter() - started
        hub.metrics.observe_request(scope["path"], status, elapsed)
        log.info("request", method=scope["method"], path=scope["path"], status=status,
                 ms=round(elapsed * 1000, 1), client=hub.clients.of(scope))  # fmt: skip


_OK_HEADERS = [
    (b"content-type", b"application/json"),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
]
