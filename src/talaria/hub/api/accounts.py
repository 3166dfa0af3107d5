"""Admin account routes (web-api.md 3)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import Field, WithJsonSchema
from starlette.concurrency import run_in_threadpool

from talaria.accounts.rules import PROFILE, ROLES, SOURCE, USERNAME
from talaria.accounts.service import Account
from talaria.errors import TalariaError
from talaria.hub.api.deps import AdminDep, HubDep, StrictBody
from talaria.hub.api.views import CursorQuery, LimitQuery, decode_cursor, encode_cursor, page_limit
from talaria.hub.api.websession import WebRoute
from talaria.hub.openapi import refusals
from talaria.lifecycle.actor import Actor
from talaria.limits import MAX_PASSWORD_CHARS, MAX_USERNAME_CHARS, MIN_PASSWORD_CHARS

router = APIRouter(prefix="/api/admin/accounts", tags=["accounts"], route_class=WebRoute)


# What the account rules accept (accounts/rules.py), as the document shows it; the rules themselves still judge
# (a weak password is 400 weak_password, not a validation error).
_USERNAME = {
    "type": "string",
    "pattern": USERNAME.pattern,
    "maxLength": MAX_USERNAME_CHARS,
    "not": {"enum": [".", ".."]},
}
_PASSWORD = {"type": "string", "minLength": MIN_PASSWORD_CHARS, "maxLength": MAX_PASSWORD_CHARS}
_ROLE = {"type": "string", "enum": list(ROLES)}
_PROFILES = {
    "type": "object",
    "description": "source name -> the Hermes profiles the account may use there",
    "propertyNames": {"pattern": SOURCE.pattern},
    "additionalProperties": {"type": "array", "maxItems": 256, "items": {"type": "string", "pattern": PROFILE.pattern}},
}


class CreateAccount(StrictBody):
    username: Annotated[str, WithJsonSchema(_USERNAME)] = Field(max_length=MAX_USERNAME_CHARS)
    password: Annotated[str, WithJsonSchema(_PASSWORD)]
    role: Annotated[str, WithJsonSchema(_ROLE)]
    allowedProfiles: Annotated[dict[str, list[str]], WithJsonSchema(_PROFILES)] = Field(default_factory=dict)
    canManageTeam: bool = False


# Every field may be left out, none may be null (400 invalid_request).
class PatchAccount(StrictBody):
    password: Annotated[str | None, WithJsonSchema(_PASSWORD)] = None
    role: Annotated[str | None, WithJsonSchema(_ROLE)] = None
    enabled: Annotated[bool | None, WithJsonSchema({"type": "boolean"})] = None
    allowedProfiles: Annotated[dict[str, list[str]] | None, WithJsonSchema(_PROFILES)] = None
    canManageTeam: Annotated[bool | None, WithJsonSchema({"type": "boolean"})] = None


@router.get("", openapi_extra=refusals("invalid_request"))
async def list_accounts(
    admin: AdminDep, hub: HubDep, limit: LimitQuery = None, cursor: CursorQuery = None
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


@router.post("", status_code=201, openapi_extra=refusals("weak_password", "account_exists"))
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


@router.patch("/{username}", openapi_extra=refusals("weak_password", "not_found", "last_admin", "invalid_transition"))
async def update_account(username: str, body: PatchAccount, admin: AdminDep, hub: HubDep) -> dict[str, Any]:
    changes = body.model_dump(exclude_unset=True)
    nulls = sorted(k for k, v in changes.items() if v is None)
    if nulls:
        raise TalariaError("invalid_request", f"{nulls[0]} must not be null")

    def update() -> Account:
        updated = hub.accounts.update(username, admin.account.tenant, changes)
        # chat turns accepted under an older auth_version end now (chat.md 5.7), by this admin
        actor = Actor(admin.account.principal, frozenset(), "web", admin.account.tenant)
        hub.chat_engine.revoke(updated.tenant, updated.username, actor)
        return updated

    account = await run_in_threadpool(update)
    return {"account": account.as_json()}
