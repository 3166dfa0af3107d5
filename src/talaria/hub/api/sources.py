"""Sources and their Hermes profiles (web-api.md 4)."""

from __future__ import annotations

import base64
import json
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from talaria.errors import TalariaError
from talaria.hub.api.deps import HubDep, UserDep
from talaria.hub.api.runner_admin import summary
from talaria.hub.api.websession import WebRoute
from talaria.hub.openapi import RUNNER_OUTCOMES, refusals
from talaria.hub.runners.connection_state import AccountRef

router = APIRouter(prefix="/api/sources", tags=["sources"], route_class=WebRoute)


@router.get("")
async def list_sources(user: UserDep, hub: HubDep) -> dict[str, Any]:
    tenant = user.account.tenant
    names = await run_in_threadpool(hub.registry.sources, tenant)
    sources = []
    for name in names:
        record = await run_in_threadpool(hub.registry.for_source, tenant, name)
        sources.append({"name": name, "runner": summary(hub, record) if record else None})
    return {"sources": sources}


@router.get("/{source}/profiles", openapi_extra=refusals("not_found", *RUNNER_OUTCOMES))
async def list_profiles(source: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    """The source's Hermes profiles read through its runner, filtered to the caller's allowed profiles
    intersected with the runner's."""
    record = await run_in_threadpool(hub.registry.for_source, user.account.tenant, source)
    if record is None:
        raise TalariaError("not_found", "no such source")
    allowed = set(await run_in_threadpool(hub.validity.intersection, user.account.username, record.id))
    account = AccountRef(user.account.username, user.account.tenant, user.account.auth_version)
    reply = await hub.channels.http(record.id, account, "/api/profiles")
    if reply.get("status") != 200:
        raise TalariaError("hermes_unavailable", f"Hermes answered {reply.get('status')} to /api/profiles")
    try:
        listed = json.loads(base64.b64decode(reply.get("body", "")))
    except ValueError:
        listed = None
    if not isinstance(listed, dict) or not isinstance(listed.get("profiles", []), list):
        raise TalariaError("hermes_unavailable", "Hermes answered /api/profiles with something other than its list")
    profiles = [
        {"name": p["name"], "isDefault": bool(p.get("is_default")), "model": p.get("model")}
        for p in listed.get("profiles", [])
        if isinstance(p, dict) and p.get("name") in allowed
    ]
    return {"profiles": profiles}
