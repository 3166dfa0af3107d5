"""Admin routes for execution nodes (runner-protocol.md 2): list, register, disable.

The token appears only in the 201 answer (and its ``config``, the runner.json the browser offers as a
download); lists never hold it or its hash.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from talaria.canonical import canonical_json
from talaria.errors import TalariaError
from talaria.hub.deps import AdminDep, HubDep
from talaria.hub.runners import hermes_probe
from talaria.hub.runners.registry import RunnerRecord, parse_registration
from talaria.hub.runners.state import AccountRef
from talaria.hub.state import Hub
from talaria.hub.websession import WebRoute

router = APIRouter(prefix="/api/admin/runners", tags=["runners"], route_class=WebRoute)


def summary(hub: Hub, record: RunnerRecord) -> dict[str, Any]:
    return record.record_json() | hub.runners.summary(record.id)


def _no_store(value: Any, status: int = 200) -> Response:
    return Response(canonical_json(value), status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})  # fmt: skip


@router.get("")
async def list_runners(admin: AdminDep, hub: HubDep) -> Response:
    records = await run_in_threadpool(hub.registry.all, admin.account.tenant)
    return _no_store({"protocol": 1, "runners": [summary(hub, r) for r in records]})


@router.post("", status_code=201)
async def register_runner(request: Request, admin: AdminDep, hub: HubDep) -> Response:
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        raise TalariaError("invalid_request", "the body must be a JSON object") from exc
    fields = parse_registration(body, default_server_url=hub.settings.public_url)
    registration = await run_in_threadpool(hub.registry.register, admin.account.tenant, fields)
    answer = {"runner": summary(hub, registration.runner), "token": registration.token, "config": registration.config}
    return _no_store(answer, 201)


@router.delete("/{runner_id}")
async def disable_runner(runner_id: str, admin: AdminDep, hub: HubDep) -> Response:
    if not await run_in_threadpool(hub.registry.disable, runner_id, admin.account.tenant):
        raise TalariaError("not_found", "no such runner")
    hub.runners.disconnect(runner_id, "disabled")
    return _no_store({"ok": True})


@router.get("/{runner_id}/hermes")
async def runner_hermes(runner_id: str, admin: AdminDep, hub: HubDep, profile: str = "default") -> Response:
    """The node's Hermes version and team-tool readiness, asked through the runner as this admin."""
    record = await run_in_threadpool(hub.registry.get, runner_id)
    if record is None or record.tenant != admin.account.tenant:
        raise TalariaError("not_found", "no such runner")
    account = AccountRef(admin.account.username, admin.account.tenant, admin.account.auth_version)
    return _no_store(await hermes_probe.describe(hub.channels, runner_id, account, profile))
