"""Operations routes (web-api.md 7): health, readiness, metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from talaria.errors import TalariaError
from talaria.hub.api.deps import HubDep
from talaria.hub.openapi import refusals, text_answer
from talaria.hub.resources import Hub
from talaria.hub.runtime.identity import is_loopback
from talaria.store import migrations

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, Any]:
    return {"ok": True}


def _schema_problem(hub: Hub) -> str | None:
    """None while the schema is this release's or a newer one with additive steps only (scale.md 2.5)."""
    found = migrations.schema(hub.store, read_only=True)
    if found.pending:
        return "the database's schema is older than this release's"
    if any(not additive for _, _, additive in found.newer_steps):
        return "a newer release changed the database's schema in a way this one cannot use"
    return None


@router.get("/readyz", openapi_extra=refusals("store_unavailable", "hub_draining", "clock_skew"))
async def readyz(hub: HubDep) -> dict[str, Any]:
    if not await run_in_threadpool(hub.store.ping):
        raise TalariaError("store_unavailable", "the store does not answer")
    schema = await run_in_threadpool(_schema_problem, hub)
    if schema is not None:  # another release changed the schema under this one (operations.md 5.4)
        raise TalariaError("store_unavailable", schema)
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
    page = await run_in_threadpool(hub.metrics.render)  # some gauges read the store
    return Response(page, media_type="text/plain; version=0.0.4; charset=utf-8")
