"""Admin routes for execution nodes (runner-protocol.md 2): list, register, disable, drain (operations.md 3), rotate
the token (operations.md 4).

The token appears only in the 201 answer (and its ``config``, the runner.json the browser offers as a
download); lists never hold it or its hash.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse
from starlette.routing import Match
from starlette.types import Scope

from talaria.canonical import canonical_json
from talaria.errors import TalariaError
from talaria.hub.api.deps import AdminDep, HubDep
from talaria.hub.api.websession import WebRoute
from talaria.hub.errors import NOT_JSON
from talaria.hub.openapi import RUNNER_OUTCOMES, refusals, text_answer
from talaria.hub.resources import Hub
from talaria.hub.runners import hermes_probe
from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.runners.machine_api import UUID
from talaria.hub.runners.registry import REGISTRATION_BODY, RunnerRecord, parse_registration
from talaria.hub.turns.driver import TurnDriver


class RunnerRoute(WebRoute):
    """A web route whose ``{runner_id}``, when not a lower-case UUID, names no runner and so no route: a
    wrong method there answers 404 ``not_found`` like an unknown path, not 405 (as on the machine API,
    runner-protocol.md 4). The route's own method still reaches the handler, which checks the session
    first and then answers 404 (``_known``)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        params = child.get("path_params", {})
        if match is Match.PARTIAL and "runner_id" in params and not UUID.match(str(params["runner_id"])):
            return Match.NONE, {}
        return match, child


router = APIRouter(prefix="/api/admin/runners", tags=["runners"], route_class=RunnerRoute)
RunnerId = Annotated[str, Path(description="a runner's id, a lower-case UUID", json_schema_extra={"format": "uuid"})]


def _known(runner_id: str) -> None:
    """404 for an id that cannot name a runner, before any store read or body check."""
    if not UUID.match(runner_id):
        raise TalariaError("not_found", "no such runner")


def summary(hub: Hub, record: RunnerRecord) -> dict[str, Any]:
    settings = hub.settings
    rotation = record.rotation_json(
        hub.clock.now_ms(),
        overlap_ms=settings.token_overlap_ms,
        rotate_after_ms=settings.token_rotate_after_ms,
    )
    return record.record_json() | rotation | hub.runners.summary(record.id)


def _no_store(value: Any, status: int = 200) -> Response:
    return Response(canonical_json(value), status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})  # fmt: skip


@router.get("")
async def list_runners(admin: AdminDep, hub: HubDep) -> Response:
    records = await run_in_threadpool(hub.registry.all, admin.account.tenant)
    return _no_store({"protocol": 1, "runners": [summary(hub, r) for r in records]})


@router.post(
    "",
    status_code=201,
    openapi_extra=refusals(
        "invalid_runner_config", "invalid_assigned_profiles", "runner_source_in_use", body=REGISTRATION_BODY
    ),
)
async def register_runner(request: Request, admin: AdminDep, hub: HubDep) -> Response:
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        raise TalariaError("invalid_request", NOT_JSON) from exc
    fields = parse_registration(body, default_server_url=hub.settings.public_url)
    registration = await run_in_threadpool(hub.registry.register, admin.account.tenant, fields)
    answer = {"runner": summary(hub, registration.runner), "token": registration.token, "config": registration.config}
    return _no_store(answer, 201)


@router.delete("/{runner_id}", openapi_extra=refusals("not_found"))
async def disable_runner(runner_id: RunnerId, admin: AdminDep, hub: HubDep) -> Response:
    _known(runner_id)
    if not await run_in_threadpool(hub.registry.disable, runner_id, admin.account.tenant):
        raise TalariaError("not_found", "no such runner")
    await hub.runners.disconnect(runner_id, "disabled")
    return _no_store({"ok": True})


@router.post("/{runner_id}/drain", openapi_extra=refusals("not_found", "runner_offline"))
async def drain_runner(runner_id: RunnerId, admin: AdminDep, hub: HubDep) -> Response:
    """Drain the node's runner (operations.md 3): it takes no new work, finishes what runs and stops. Repeating it
    changes nothing; a runner started again afterwards is not draining."""
    _known(runner_id)
    record = await run_in_threadpool(hub.registry.get, runner_id)
    if record is None or record.tenant != admin.account.tenant:
        raise TalariaError("not_found", "no such runner")
    if not await hub.runners.drain(runner_id):
        raise TalariaError("runner_offline", "the execution node is not connected")
    return _no_store({"ok": True})


@router.post("/{runner_id}/rotate-token", openapi_extra=refusals("not_found"))
async def rotate_runner_token(runner_id: RunnerId, admin: AdminDep, hub: HubDep) -> Response:
    """Ask the node's runner to rotate its token (operations.md 4.1): its next poll answer says so and it takes a
    new one. Repeating it changes nothing. Rotation retires old copies of the token; it does not lock out someone
    who holds the current one (disable the node and register it again for that)."""
    _known(runner_id)
    if not await run_in_threadpool(hub.registry.request_rotation, runner_id, admin.account.tenant):
        raise TalariaError("not_found", "no such runner")
    hub.runners.end_hold(runner_id)
    return _no_store({"ok": True})


@router.get("/{runner_id}/hermes", openapi_extra=refusals("not_found", *RUNNER_OUTCOMES))
async def runner_hermes(runner_id: RunnerId, admin: AdminDep, hub: HubDep, profile: str = "default") -> Response:
    """The node's Hermes version and team-tool readiness, asked through the runner as this admin."""
    _known(runner_id)
    record = await run_in_threadpool(hub.registry.get, runner_id)
    if record is None or record.tenant != admin.account.tenant:
        raise TalariaError("not_found", "no such runner")
    account = AccountRef(admin.account.username, admin.account.tenant, admin.account.auth_version)
    usable = await run_in_threadpool(hub.validity.intersection, admin.account.username, runner_id)
    described = await hermes_probe.describe(
        hub.channels, runner_id, account, profile, may_use_profile=profile in usable
    )
    return _no_store(described)


MAX_TEST_PROMPT_CHARS = 4000
TEST_TURN_BODY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["prompt"],
    "properties": {
        "prompt": {"type": "string", "minLength": 1, "maxLength": MAX_TEST_PROMPT_CHARS, "pattern": r"\S"},
        "profile": {"type": "string", "minLength": 1, "default": "default"},
        "tools": {"type": "boolean", "default": True, "description": "offer the team tools to the turn"},
    },
}
_STREAM = text_answer("text/event-stream", "server-sent events: `event` for each Hermes event, then `done` or `error`")


def _test_turn_body(raw: bytes) -> tuple[str, str, bool]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise TalariaError("invalid_request", NOT_JSON) from exc
    if not isinstance(body, dict):
        raise TalariaError("invalid_request", "the body must be a JSON object")
    unknown = set(body) - {"prompt", "profile", "tools"}
    if unknown:
        raise TalariaError("invalid_request", f"{sorted(unknown)[0]}: not an accepted field")
    prompt, profile, tools = body.get("prompt"), body.get("profile", "default"), body.get("tools", True)
    if not isinstance(prompt, str) or not 1 <= len(prompt.strip()) <= MAX_TEST_PROMPT_CHARS:
        raise TalariaError("invalid_request", f"prompt: a string of 1-{MAX_TEST_PROMPT_CHARS} characters")
    if not isinstance(profile, str) or not profile:
        raise TalariaError("invalid_request", "profile: a profile name")
    if not isinstance(tools, bool):
        raise TalariaError("invalid_request", "tools: true or false")
    return prompt, profile, tools


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {canonical_json(data).decode()}\n\n".encode()


@router.post(
    "/{runner_id}/test-turn",
    openapi_extra=refusals(
        "not_found",
        "profile_not_allowed",
        "runner_offline",
        "runner_draining",
        "hub_draining",
        body=TEST_TURN_BODY,
        answers=_STREAM,
    ),
)
async def runner_test_turn(runner_id: RunnerId, request: Request, admin: AdminDep, hub: HubDep) -> Response:
    """One diagnostic Hermes turn on the node as this admin, streamed as server-sent events: ``event``
    for each Hermes event of the session, then ``done`` with ``{status, text, marker}`` or ``error`` with
    the canonical error body. The work id is ``test-turn:<uuid>``."""
    _known(runner_id)
    prompt, profile, tools = _test_turn_body(await request.body())
    record = await run_in_threadpool(hub.registry.get, runner_id)
    if record is None or record.tenant != admin.account.tenant:
        raise TalariaError("not_found", "no such runner")
    # refused before anything streams: a profile the admin may not use there, then a node that is not connected
    if profile not in await run_in_threadpool(hub.validity.intersection, admin.account.username, runner_id):
        raise TalariaError("profile_not_allowed", f"you may not use profile {profile} on this node")
    if not hub.runners.is_connected(runner_id):
        raise TalariaError("runner_offline", "the execution node is not connected")
    hub.refuse_new_turn()
    if not hub.runners.accepts_work(runner_id):
        raise TalariaError("runner_draining", "the execution node is draining; it takes no new work")
    account = AccountRef(admin.account.username, admin.account.tenant, admin.account.auth_version)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    driver = TurnDriver(hub.channels, hub.registry, hub.clock)
    deadline_ms = hub.clock.now_ms() + hub.settings.max_turn_for(record.source, profile) * 1000

    async def run() -> None:
        try:
            result = await driver.run(
                runner_id=runner_id, account=account, profile=profile, work_id=f"test-turn:{uuid.uuid4()}",
                prompt=prompt, tools=tools, on_event=lambda frame: queue.put_nowait(_sse("event", frame)),
                deadline_ms=deadline_ms,
            )  # fmt: skip
            queue.put_nowait(_sse("done", {"status": result.status, "text": result.text, "marker": result.marker}))
        except TalariaError as exc:
            queue.put_nowait(_sse("error", exc.body()))
        finally:
            queue.put_nowait(None)

    task = asyncio.get_running_loop().create_task(run())

    async def stream() -> AsyncIterator[bytes]:
        try:
            while (chunk := await queue.get()) is not None:
                yield chunk
        finally:
            if not task.done():
                task.cancel()

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})
