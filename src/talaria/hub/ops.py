"""Operations routes (web-api.md 7): health, readiness, metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from talaria.errors import TalariaError
from talaria.hub.api.deps import HubDep
from talaria.hub.openapi import refusals, text_answer
from talaria.hub.runtime.identity import is_loopback

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, Any]:
    return {"ok": True}


@router.get("/readyz", openapi_extra=refusals("store_unavailable", "hub_draining", "clock_skew"))
async def readyz(hub: HubDep) -> dict[str, Any]:
    if not await run_in_threadpool(hub.store.ping):
        raise TalariaError("store_unavailable", "the store does not answer")
    if hub.draining:  # a planned restart: balancers move traffic away (operations.md 3.4)
        raise TalariaError("hub_draining", "this hub is draining for a restart")
    problem = hub.replica.unready() if hub.replica is not None else None
    if problem is not None:  # a PostgreSQL replica that cannot renew its row, or whose clock strays (scale.md 1)
        raise problem
    return {"ok": True}


@router.get("/metrics", openapi_extra=refusals("not_found", answers=text_answer("text/plain", "Prometheus text")))
async def metrics(request: Request, hub: HubDep) -> Response:
    peer = request.client.host if request.client else None
    if not hub.settings.metrics_public and not is_loopback(peer):
        raise TalariaError("not_found", "not found")
    return Response(hub.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
