"""Admin account routes (web-api.md 3)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from talaria.errors import TalariaError
from talaria.hub.api.deps import AdminDep, HubDep, StrictBody
from talaria.hub.api.views import decode_cursor, encode_cursor, page_limit
from talaria.hub.api.websession import WebRoute

router = APIRouter(prefix="/api/admin/accounts", tags=["accounts"], route_class=WebRoute)


class CreateAccount(StrictBody):
    username: str = Field(max_length=64)
    password: str
    role: str
    allowedProfiles: dict[str, list[str]] = Field(default_factory=dict)
    canManageTeam: bool = False


class PatchAccount(StrictBody):
    password: str | None = None
    role: str | None = None
    enabled: bool | None = None
    allowedProfiles: dict[str, list[str]] | None = None
    canManageTeam: bool | None = None


@router.get("")
async def list_accounts(
    admin: AdminDep, hub: HubDep, limit: int | None = None, cursor: str | None = None
) -> dict[str, Any]:
    size = page_limit(limit)
    after = decode_cursor(cursor, (int, str))
    rows = await run_in_threadpool(
        hub.accounts.list,
        admin.account.tenant,
        limit=size + 1,
        cursor=(after[0], after[1]) if after else None,
    )
    more = len(rows) > size
    rows = rows[:size]
    return {
        "accounts": [a.as_json() for a in rows],
        "nextCursor": encode_cursor(rows[-1].created_at, rows[-1].username) if more else None,
    }


@router.post("", status_code=201)
async def create_account(body: CreateAccount, admin: AdminDep, hub: HubDep) -> dict[str, Any]:
    account = await run_in_threadpool(
        lambda: hub.accounts.create(
            username=body.username,
            password=body.password,
            role=body.role,
            tenant=admin.account.tenant,
            allowed_profiles=body.allowedProfiles,
            can_manage_team=body.canManageTeam,
        )
    )
    return {"account": account.as_json()}


@router.patch("/{username}")
async def update_account(username: str, body: PatchAccount, admin: AdminDep, hub: HubDep) -> dict[str, Any]:
    changes = body.model_dump(exclude_unset=True)
    nulls = sorted(k for k, v in changes.items() if v is None)
    if nulls:
        raise TalariaError("invalid_request", f"{nulls[0]} must not be null")
    account = await run_in_threadpool(hub.accounts.update, username, admin.account.tenant, changes)
    return {"account": account.as_json()}
