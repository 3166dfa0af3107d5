"""Sign-in, sign-out and ``me`` (web-api.md 2)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from talaria.accounts.passwords import verify_password
from talaria.errors import TalariaError
from talaria.hub.api.deps import HubDep, StrictBody, UserDep
from talaria.hub.api.websession import COOKIE, WebRoute
from talaria.hub.openapi import refusals
from talaria.hub.resources import Hub
from talaria.limits import LOGIN_MAX_FAILURES, MAX_PASSWORD_CHARS, MIN_PASSWORD_CHARS, SESSION_MAX_S

router = APIRouter(prefix="/api/auth", tags=["auth"], route_class=WebRoute)


class LoginBody(StrictBody):
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=MAX_PASSWORD_CHARS)


def _refuse_if_throttled(hub: Hub, username: str, peer: str) -> None:
    wait = hub.throttle.retry_after(username=username, peer=peer)
    if wait is not None:
        raise TalariaError(
            "login_throttled",
            f"more than {LOGIN_MAX_FAILURES - 1} failed sign-ins; try again later",
            headers={"Retry-After": str(wait)},
        )


def _me(username: str, role: str, tenant: str, csrf: str) -> dict[str, Any]:
    return {"username": username, "role": role, "tenant": tenant, "csrfToken": csrf}


@router.post(
    "/login", openapi_extra=refusals("csrf_failed", "invalid_credentials", "login_throttled", "store_unavailable")
)
async def login(body: LoginBody, request: Request, response: Response, hub: HubDep) -> dict[str, Any]:
    origin = request.headers.get("origin")
    if origin is not None and origin != hub.settings.public_origin:
        raise TalariaError("csrf_failed", "the Origin of this request is not the hub's")
    peer = hub.clients.of(request.scope)  # the client address: behind a trusted proxy, not the proxy
    await run_in_threadpool(_refuse_if_throttled, hub, body.username, peer)  # a table read on PostgreSQL
    found = await run_in_threadpool(hub.accounts.credentials, body.username)
    ok = await run_in_threadpool(verify_password, found[1] if found else None, body.password)
    account = found[0] if ok and found else None
    if account is None or not account.enabled:
        await run_in_threadpool(lambda: hub.throttle.failed(username=body.username, peer=peer))
        raise TalariaError("invalid_credentials", "wrong username or password")
    await run_in_threadpool(lambda: hub.throttle.succeeded(username=body.username))
    cookie, csrf = await run_in_threadpool(hub.sessions.create, account)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=SESSION_MAX_S,
        httponly=True,
        samesite="lax",
        secure=hub.sessions.secure,
        path="/",
    )
    return _me(account.username, account.role, account.tenant, csrf)


class PasswordBody(StrictBody):
    currentPassword: str = Field(min_length=1, max_length=MAX_PASSWORD_CHARS)
    # documented, not validated here: the password rule answers 400 weak_password
    newPassword: str = Field(json_schema_extra={"minLength": MIN_PASSWORD_CHARS, "maxLength": MAX_PASSWORD_CHARS})


@router.post(
    "/password", openapi_extra=refusals("weak_password", "invalid_credentials", "login_throttled", "invalid_transition")
)
async def change_password(body: PasswordBody, request: Request, user: UserDep, hub: HubDep) -> dict[str, Any]:
    """The signed-in person's own password (web-api.md 9): the current one is checked and throttled like a
    sign-in; the new one follows the password rule; ``authVersion`` + 1 and every other session ends."""
    username = user.account.username
    peer = hub.clients.of(request.scope)
    await run_in_threadpool(_refuse_if_throttled, hub, username, peer)
    stored = await run_in_threadpool(hub.accounts.password_hash, username)
    if not await run_in_threadpool(verify_password, stored, body.currentPassword):
        await run_in_threadpool(lambda: hub.throttle.failed(username=username, peer=peer))
        raise TalariaError("invalid_credentials", "the current password is wrong")
    await run_in_threadpool(lambda: hub.throttle.succeeded(username=username))
    changes = {"password": body.newPassword}
    update = hub.accounts.update
    await run_in_threadpool(lambda: update(username, user.account.tenant, changes, keep_session_hash=user.session_hash))
    return {"ok": True}


@router.get("/me")
async def me(user: UserDep) -> dict[str, Any]:
    return _me(user.account.username, user.account.role, user.account.tenant, user.csrf_token)


@router.post("/logout")
async def logout(user: UserDep, response: Response, hub: HubDep) -> dict[str, Any]:
    await run_in_threadpool(hub.sessions.end_hash, user.session_hash)
    response.delete_cookie(COOKIE, path="/")
    return {"ok": True}
