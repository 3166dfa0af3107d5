"""The hub's app factory. Resources open in the ASGI lifespan; nothing is global.

``create_app(settings, clock=..., run_reaper=False)`` is what tests use: a ``ManualClock`` and
sweeps by ``hub.engine.expire_due()``. Start-up recovery always runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from talaria import __version__
from talaria.clock import Clock, SystemClock
from talaria.hub import errors, openapi, ops
from talaria.hub.api import accounts as api_accounts
from talaria.hub.api import auth as api_auth
from talaria.hub.api import jobs as api_jobs
from talaria.hub.api import runner_admin
from talaria.hub.api import sources as api_sources
from talaria.hub.api import tasks as api_tasks
from talaria.hub.chat import attachments_api, bots_api, conversations_api, stream_api, turns_api
from talaria.hub.middleware import AccessLog, BodyLimit, HeadAsGet, SafetyHeaders
from talaria.hub.resources import Hub, open_hub
from talaria.hub.runners import machine_api
from talaria.hub.runtime import routes as runtime_routes
from talaria.hub.teams import api as teams_api
from talaria.hub.timings import HubTimings
from talaria.hub.web import pages as web_pages
from talaria.hub.web.render import STATIC_DIR, Pages
from talaria.settings import Settings

log = structlog.get_logger("talaria.hub")


class HubApp:
    """The hub's ASGI app: the runner machine API's door (``machine_api.serve``) and, when enabled, the
    Runtime API's well-formed requests (``runtime_routes.serve``, behind the same access log, safety headers
    and error guard as the rest) in front of FastAPI, which serves everything else (web API, the Runtime API's
    odd requests, pages) and the lifespan."""

    def __init__(self, web: FastAPI, *, runtime_api: bool = False) -> None:
        self.web = web
        guarded = SafetyHeaders(errors.InternalErrorGuard(runtime_routes.serve))  # the stack FastAPI's answers get
        self.runtime = AccessLog(guarded) if runtime_api else None

    @property
    def state(self) -> State:
        return self.web.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if machine_api.is_machine_path(scope):
            hub: Hub = self.web.state.hub  # typed, so mypy checks it offers what the machine API needs
            await machine_api.serve(hub, scope, receive, send)
        elif self.runtime is not None and runtime_routes.match(scope) is not None:
            scope["app"] = self.web  # what the handlers and the access log read the hub from, as under FastAPI
            await self.runtime(scope, receive, send)
        else:
            await self.web(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    clock: Clock | None = None,
    run_reaper: bool = True,
    hub: Hub | None = None,
    timings: HubTimings | None = None,
) -> HubApp:
    """The hub app. With ``hub`` (already opened by ``talaria hub``, which reports start-up errors in
    one line) the lifespan adopts it; otherwise the lifespan opens one. Either way it closes it."""
    clock = clock or SystemClock()
    opened = hub

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        live = opened if opened is not None else await run_in_threadpool(open_hub, settings, clock, timings)
        app.state.hub = live
        if live.replica is not None:
            live.replica.start()
        if live.sealer is not None:
            live.sealer.start()
        live.runners.start()
        live.dispatcher.start()
        live.chat_engine.start()
        if live.team_reconciler is not None:  # after lifecycle and chat recovery, before the listener opens (4.1)
            await run_in_threadpool(live.team_reconciler.run_once)
            live.team_reconciler.start()
        if run_reaper:
            live.reaper.start()
        try:
            yield
        finally:
            live.chat_events.close_all()  # already done by HubUvicorn before it waits for open requests
            if live.team_reconciler is not None:
                await live.team_reconciler.stop()
            await live.dispatcher.stop()
            await live.chat_engine.stop()
            await live.runners.stop()
            live.reaper.stop()
            if live.sealer is not None:
                live.sealer.stop()  # seals what this hub committed last
            live.chat_streams.close()
            if live.replica is not None:
                live.replica.stop()  # releases its roles and leaves
            live.store.close()

    app = FastAPI(
        title="Talaria hub",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    errors.install(app, not_found_page=web_pages.not_found_page)
    app.state.pages = Pages(clock.now_ms)
    routers = (
        api_auth.router, api_accounts.router, api_tasks.router, api_jobs.router, bots_api.router,
        conversations_api.router, turns_api.router, attachments_api.router, stream_api.router, teams_api.router,
        ops.router,
    )  # fmt: skip
    documented = (*routers, runner_admin.router, api_sources.router)  # the document's routes (ADR 0029)
    for router in documented:
        app.include_router(router)
    openapi.install(app, documented)
    if settings.runtime_api_enabled:
        app.include_router(runtime_routes.router)
    app.include_router(web_pages.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_middleware(errors.InternalErrorGuard)
    app.add_middleware(BodyLimit)
    app.add_middleware(HeadAsGet)
    app.add_middleware(SafetyHeaders)
    app.add_middleware(AccessLog)
    return HubApp(app, runtime_api=settings.runtime_api_enabled)
