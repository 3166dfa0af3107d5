"""Runtime API routes (lifecycle.md 6.4), mounted only when ``runtime_api.enabled``.

Processing order (6.5): route match; peer; body size; proxy identity; an accepted role;
``Idempotency-Key``; body and query syntax; the operation's role; binding step 1; then the engine's
transaction. Rejections with 401, 403, 422 and the listed 409 codes write a security event.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from talaria.canonical import digest, sha256_hex
from talaria.errors import TalariaError
from talaria.hub.errors import error_response
from talaria.hub.middleware import DRAIN_LIMIT
from talaria.hub.resources import Hub
from talaria.hub.runtime import bodies
from talaria.hub.runtime.identity import ProxyIdentity, is_loopback, verify
from talaria.hub.runtime.security_events import Rejection
from talaria.lifecycle import answers
from talaria.lifecycle.actor import PLATFORM_ADMIN, RUNTIME, Actor
from talaria.lifecycle.answers import Reply
from talaria.lifecycle.binding import FIELDS, check_identity
from talaria.lifecycle.context import IdemRequest
from talaria.lifecycle.records import LeaseRef
from talaria.limits import MAX_BODY_BYTES

PREFIX = "/internal/runtime/v1/hermes"
_KEY = re.compile(r"^[A-Za-z0-9_:-]{1,255}\Z")
_RECORDED_409 = frozenset(
    {
        "binding_mismatch",
        "dispatch_missing",
        "not_approved",
        "lease_mismatch",
        "stale_lease",
        "terminal_conflict",
    }
)

router = APIRouter(prefix=PREFIX, include_in_schema=False)


@dataclass
class Call:
    """What the gate learned about one request, for the handler and for the security event."""

    hub: Hub
    request: Request
    route: str
    body: bytes = b""
    identity: ProxyIdentity | None = None
    job: str | None = None

    def actor(self) -> Actor:
        assert self.identity is not None
        return Actor(self.identity.principal, self.identity.roles, "trusted_proxy", self.identity.tenant)


def _peer(request: Request) -> str:
    return request.client.host if request.client else ""


async def _read_body(request: Request) -> bytes:
    """The whole body, or 413 after reading (and discarding) what a client may still be sending."""
    declared = request.headers.get("content-length")
    too_large = declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > DRAIN_LIMIT:
            break
        if not too_large and size > MAX_BODY_BYTES:
            too_large = True
            chunks.clear()
        if not too_large:
            chunks.append(chunk)
    if too_large:
        raise TalariaError("payload_too_large", "the request body is larger than 1 MiB")
    return b"".join(chunks)


def _target(request: Request) -> str:
    raw_path: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    query: bytes = request.scope.get("query_string", b"")
    target = raw_path.decode("latin-1")
    return f"{target}?{query.decode('latin-1')}" if query else target


async def _gate(call: Call, *, post: bool) -> IdemRequest | None:
    """Peer, body size, identity, accepted role and Idempotency-Key checks; returns the key."""
    hub, request = call.hub, call.request
    if not hub.settings.runtime_api_allow_remote_proxy and not is_loopback(_peer(request)):
        raise TalariaError("peer_not_allowed", "the Runtime API accepts loopback peers only")
    call.body = await _read_body(request)
    call.identity = verify(
        request.scope["headers"],
        method=request.method,
        target=_target(request),
        body=call.body,
        secret=hub.settings.runtime_api_proxy_secret,
        now_s=hub.clock.now_ms() / 1000,
    )
    if not call.identity.roles:
        raise TalariaError("role_forbidden", "no accepted role (runtime or platform_admin)")
    if not post:
        return None
    keys = request.headers.getlist("idempotency-key")
    if not keys:
        raise TalariaError("idempotency_key_required", "POST needs an Idempotency-Key header")
    if len(keys) != 1 or not _KEY.match(keys[0]):
        raise TalariaError("idempotency_key_invalid", "Idempotency-Key must be 1-255 of A-Z a-z 0-9 _ : -")
    return IdemRequest(sha256_hex(keys[0]), "")


def _answer(reply: Reply[Any]) -> Response:
    """The door's one shaping step: the answer's canonical JSON (the stored bytes on a replay)."""
    headers = {"Cache-Control": "no-store"}
    if reply.replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(answers.body_of(reply), status_code=200, media_type="application/json", headers=headers)


def _record(call: Call, error: TalariaError) -> None:
    if not (error.status in (401, 403, 422) or (error.status == 409 and error.code in _RECORDED_409)):
        return
    hub = call.hub
    hub.metrics.security_events.labels(error.code).inc()
    principal = call.identity.principal if call.identity else call.request.headers.get("x-talaria-principal")
    tenant = call.identity.tenant if call.identity else call.request.headers.get("x-talaria-tenant")
    hub.security_events.record(
        Rejection(
            peer=_peer(call.request),
            method=call.request.method,
            route=call.route,
            status=error.status,
            code=error.code,
            claimed_principal=principal,
            claimed_tenant=tenant,
            job=call.job,
            detail=error.message,
        )
    )


async def _run(call: Call, work: Callable[[], Any]) -> Response:
    try:
        result = await work()
    except TalariaError as exc:
        await run_in_threadpool(_record, call, exc)
        return error_response(exc)
    return _answer(result)


def _hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


@router.get("/jobs")
async def discover(request: Request) -> Response:
    call = Call(_hub(request), request, PREFIX + "/jobs")

    async def work() -> Reply[answers.Discovery]:
        await _gate(call, post=False)
        params = bodies.query(
            request.scope.get("query_string", b""),
            required=("tenant", "cell", "profile", "state"),
            optional=("limit",),
        )
        limit = None
        if "limit" in params:
            if not params["limit"].isdigit():
                raise bodies.bad("limit must be an integer between 1 and 100")
            limit = int(params["limit"])
        actor = call.actor()
        found = await run_in_threadpool(
            call.hub.engine.discover,
            actor,
            tenant=params["tenant"],
            cell=params["cell"],
            profile=params["profile"],
            state=params["state"],
            limit=limit,
        )
        return Reply(found)

    return await _run(call, work)


@router.get("/jobs/{job}")
async def status(request: Request, job: str) -> Response:
    call = Call(_hub(request), request, PREFIX + "/jobs/{job}", job=job)

    async def work() -> Reply[answers.JobStatus]:
        await _gate(call, post=False)
        params = bodies.query(request.scope.get("query_string", b""), required=FIELDS)
        binding = bodies.binding_from_query(params)
        return Reply(await run_in_threadpool(call.hub.engine.status, call.actor(), job_id=job, binding=binding))

    return await _run(call, work)


def _post(op: str) -> Callable[[Request, str], Any]:
    route = PREFIX + "/jobs/{job}/" + op

    async def handler(request: Request, job: str) -> Response:
        call = Call(_hub(request), request, route, job=job)

        async def work() -> Reply[Any]:
            idem = await _gate(call, post=True)
            assert idem is not None
            body = bodies.json_object(call.body, request.headers.get("content-type"))
            run = _parse(op, body, call.actor(), job)
            idem = IdemRequest(idem.key_hash, digest(body))
            return await run_in_threadpool(run, call.hub, idem)

        return await _run(call, work)

    handler.__name__ = op
    return handler


def _parse(op: str, body: dict[str, Any], actor: Actor, job: str) -> Callable[[Hub, IdemRequest], Reply[Any]]:
    """Body syntax, the operation's role and binding step 1; returns the engine call to make."""
    holder = {"lease_id", "lease_epoch"}
    if op == "claim":
        bodies.only_keys(body, {"binding", "worker_instance"})
    elif op == "heartbeat":
        bodies.only_keys(body, {"binding"} | holder, {"progress"})
    elif op == "complete":
        bodies.only_keys(body, {"binding", "result"} | holder)
    elif op == "fail":
        bodies.only_keys(body, {"binding", "error"} | holder)
    elif op == "cancel":
        if holder & set(body):
            bodies.only_keys(body, {"binding", "reason"} | holder)
        else:
            bodies.only_keys(body, {"binding", "reason"})
    else:
        bodies.only_keys(body, {"binding"} | holder)
    binding = bodies.binding(body)
    is_admin_cancel = op == "cancel" and "lease_id" not in body
    lease = None if op == "claim" or is_admin_cancel else bodies.lease(body)
    payload: Any = None
    if op == "claim":
        payload = bodies.worker_instance(body["worker_instance"])
    elif op == "heartbeat":
        payload = bodies.progress(body["progress"]) if "progress" in body else None
    elif op == "complete":
        payload = bodies.result(body["result"])
    elif op == "fail":
        payload = bodies.error(body["error"])
    elif op == "cancel":
        payload = bodies.reason(body["reason"])
    needed = PLATFORM_ADMIN if is_admin_cancel else RUNTIME
    if not actor.has(needed):
        raise TalariaError("role_forbidden", f"this operation needs the role {needed}")
    check_identity(binding, tenant=actor.tenant or "", principal=actor.principal, path_job=job)

    held = LeaseRef(lease[0], lease[1]) if lease is not None else None

    def run(hub: Hub, idem: IdemRequest) -> Reply[Any]:
        engine = hub.engine
        if op == "claim":
            return engine.claim(actor, job_id=job, binding=binding, worker_instance=payload, idem=idem)
        if op == "cancel":
            return engine.cancel(actor, job_id=job, binding=binding, reason=payload, lease=held, idem=idem)
        assert held is not None
        if op == "start":
            return engine.start(actor, job_id=job, binding=binding, lease=held, idem=idem)
        if op == "heartbeat":
            return engine.heartbeat(actor, job_id=job, binding=binding, lease=held, progress=payload, idem=idem)
        if op == "complete":
            return engine.complete(actor, job_id=job, binding=binding, lease=held, result=payload, idem=idem)
        return engine.fail(actor, job_id=job, binding=binding, lease=held, error=payload, idem=idem)

    return run


_POSTS = {op: _post(op) for op in ("claim", "start", "heartbeat", "complete", "fail", "cancel")}
for _op, _handler in _POSTS.items():
    router.add_api_route("/jobs/{job}/" + _op, _handler, methods=["POST"])

Handler = Callable[[Request], Awaitable[Response]]
_JOBS = PREFIX + "/jobs"


def match(scope: Scope) -> Handler | None:
    """The handler FastAPI's router picks for a well-formed Runtime API request (the same path patterns:
    ``{job}`` is one or more characters other than ``/``), or None: then FastAPI answers as before
    (unknown paths, wrong methods, trailing slashes, HEAD)."""
    if scope["type"] != "http" or scope.get("root_path") or not scope["path"].startswith(_JOBS):
        return None
    rest, method = scope["path"][len(_JOBS) :], scope["method"]
    if not rest:
        return discover if method == "GET" else None
    parts = rest.split("/")
    if parts[0] or not parts[1]:
        return None
    job = parts[1]
    if len(parts) == 2 and method == "GET":
        return lambda request: status(request, job)
    if len(parts) == 3 and method == "POST" and parts[2] in _POSTS:
        handler = _POSTS[parts[2]]
        return lambda request: handler(request, job)
    return None


async def serve(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer a request ``match`` accepted, without the framework's router: the Runtime API is a hot path
    (every worker step), and routing through the whole web app's route list and dependency solver cost
    more than the rest of the door. The hub's ASGI app wraps this in the same access log and error guard
    as FastAPI's stack; the handlers, and so every answer, are the ones FastAPI would call."""
    handler = match(scope)
    assert handler is not None
    response = await handler(Request(scope, receive))
    await response(scope, receive, send)
