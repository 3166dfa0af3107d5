"""Bot routes (chat.md 3.1-3.2): ``/api/bots`` and ``/api/bot-profiles``, each for the signed-in account's own
bots only (another account's bot is 404 ``not_found``, an admin's request included). Team tools add the bot's team
permission (team-tools.md 11): ``teamPermission`` in both bodies, set in the bot's own write transaction, and the
permission's fields on the Bot."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import Field, WithJsonSchema
from starlette.concurrency import run_in_threadpool

from talaria.accounts.rules import PROFILE, SOURCE
from talaria.accounts.service import Account
from talaria.chat.bots import Also, Bot, owner_actor
from talaria.errors import TalariaError
from talaria.hub.api.deps import HubDep, StrictBody, UserDep
from talaria.hub.api.views import CursorQuery, LimitQuery, decode_cursor, encode_cursor, page_limit
from talaria.hub.api.websession import WebRoute
from talaria.hub.openapi import refusals
from talaria.hub.resources import Hub
from talaria.hub.runners.registry import RunnerRecord
from talaria.limits import MAX_BOT_INSTRUCTIONS_CHARS, MAX_BOT_NAME_CHARS
from talaria.store.interface import Tx
from talaria.teams import permission
from talaria.teams.permission import BotTeam
from talaria.text_rules import MULTI_LINE_CONTROLS, ONE_LINE_PATTERN

router = APIRouter(tags=["bots"], route_class=WebRoute)

_NAME = {
    "type": "string",
    "pattern": ONE_LINE_PATTERN,
    "maxLength": MAX_BOT_NAME_CHARS,
    "description": "trimmed: 1-100 characters, no control character and no @; unique among your bots "
    "(case-insensitively)",
}
_INSTRUCTIONS = {
    "type": "string",
    "maxLength": MAX_BOT_INSTRUCTIONS_CHARS,
    "description": "0-24,000 characters; of the control characters only "
    + " and ".join(repr(c) for c in sorted(MULTI_LINE_CONTROLS)),
}

_TEAM_PERMISSION = {
    "type": "boolean",
    "description": "team tools for this bot's chat turns (team-tools.md 2); turning it on needs your account's "
    "canManageTeam (else 403 team_permission_forbidden)",
}


class CreateBot(StrictBody):
    name: Annotated[str, WithJsonSchema(_NAME)]
    source: str = Field(json_schema_extra={"pattern": SOURCE.pattern, "description": "a source name"})
    profile: str = Field(json_schema_extra={"pattern": PROFILE.pattern, "description": "a Hermes profile name"})
    instructions: Annotated[str, WithJsonSchema(_INSTRUCTIONS)] = ""
    teamPermission: Annotated[bool, WithJsonSchema(_TEAM_PERMISSION)] = False


# Every field may be left out (at least one given), none may be null (400 invalid_request).
class PatchBot(StrictBody):
    name: Annotated[str | None, WithJsonSchema(_NAME)] = None
    instructions: Annotated[str | None, WithJsonSchema(_INSTRUCTIONS)] = None
    archived: Annotated[bool | None, WithJsonSchema({"type": "boolean"})] = None
    teamPermission: Annotated[bool | None, WithJsonSchema(_TEAM_PERMISSION)] = None


ArchivedQuery = Annotated[bool, Query(description="archived bots instead of the others")]


def bot_json(hub: Hub, bot: Bot, record: RunnerRecord | None, team: BotTeam, owner: Account) -> dict[str, Any]:
    """``record``: the enabled runner of the bot's source, if any (``hub.bot_access.runner_of``); ``team``: its
    ``bot_team`` row; ``owner``: the account owning it (the caller: the routes are owner-only)."""
    return {
        "id": bot.id,
        "name": bot.name,
        "source": bot.source,
        "profile": bot.profile,
        "instructions": bot.instructions,
        "archived": bot.archived,
        "online": hub.bot_access.online(record),
        "runner": {"id": record.id, "name": record.name} if record is not None else None,
        "teamPermission": team.permission,
        "teamPermissionEffective": permission.effective(bot, team, owner),
        "teamRevision": team.revision,
        "teamGrantedBy": team.granted_by,
        "teamGrantedAt": team.granted_at,
        "createdByBotId": team.created_by_bot_id,
        "createdInTurnId": team.created_in_turn_id,
        "createdAt": bot.created_at,
        "updatedAt": bot.updated_at,
        "revision": bot.revision,
    }


def _shown(hub: Hub, bot: Bot, owner: Account) -> dict[str, Any]:
    team = hub.team_bots.of([bot.id])[bot.id]
    return bot_json(hub, bot, hub.bot_access.runner_of(bot.tenant, bot.source), team, owner)


def _team_permission(account: Account, value: bool | None, *, creating: bool) -> Also | None:
    """The bot write's ``also``: set the team permission in its transaction (None: not asked for)."""
    if value is None or (creating and not value):
        return None

    def also(tx: Tx, bot: Bot, now: int) -> Bot:
        return permission.set_permission(tx, account, bot, value, now, creating=creating)

    return also


def _not_in_team(tx: Tx, bot: Bot, now: int) -> Bot:
    permission.require_not_in_team(tx, bot)
    return bot


def _chain(*steps: Also) -> Also | None:
    """One ``also`` running ``steps`` in order, each given the bot the previous one answered."""
    if not steps:
        return None

    def also(tx: Tx, bot: Bot, now: int) -> Bot:
        for step in steps:
            bot = step(tx, bot, now)
        return bot

    return also


@router.get("/api/bots", openapi_extra=refusals("invalid_request"))
async def list_bots(
    user: UserDep, hub: HubDep, archived: ArchivedQuery = False, limit: LimitQuery = None, cursor: CursorQuery = None
) -> dict[str, Any]:
    size = page_limit(limit)
    after = decode_cursor(cursor, (int, str))

    def read() -> list[dict[str, Any]]:
        found = hub.bots.list(user.account, archived=archived, after=(after[0], after[1]) if after else None,
                              limit=size + 1)  # fmt: skip
        runners = {
            source: hub.bot_access.runner_of(user.account.tenant, source) for source in {b.source for b in found}
        }
        teams = hub.team_bots.of(bot.id for bot in found)
        return [bot_json(hub, bot, runners[bot.source], teams[bot.id], user.account) for bot in found]

    bots = await run_in_threadpool(read)
    more, bots = len(bots) > size, bots[:size]
    return {"bots": bots, "nextCursor": encode_cursor(bots[-1]["createdAt"], bots[-1]["id"]) if more else None}


@router.post(
    "/api/bots",
    status_code=201,
    openapi_extra=refusals("bot_not_allowed", "duplicate_bot_name", "bot_limit", "team_permission_forbidden"),
)
async def create_bot(body: CreateBot, user: UserDep, hub: HubDep) -> dict[str, Any]:
    if body.teamPermission and not user.account.can_manage_team:  # before anything is written
        raise TalariaError("team_permission_forbidden", "your account may not manage team bots")

    def create() -> dict[str, Any]:
        bot = hub.bots.create(
            user.account, name=body.name, source=body.source, profile=body.profile, instructions=body.instructions,
            also=_team_permission(user.account, body.teamPermission, creating=True),
        )  # fmt: skip
        return _shown(hub, bot, user.account)

    return {"bot": await run_in_threadpool(create)}


@router.get("/api/bots/{bot_id}", openapi_extra=refusals("not_found"))
async def get_bot(bot_id: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    return {"bot": await run_in_threadpool(lambda: _shown(hub, hub.bots.get(user.account, bot_id), user.account))}


@router.patch(
    "/api/bots/{bot_id}",
    openapi_extra=refusals(
        "not_found", "bot_not_allowed", "duplicate_bot_name", "bot_limit", "bot_in_use", "team_permission_forbidden"
    ),
)
async def update_bot(bot_id: str, body: PatchBot, user: UserDep, hub: HubDep) -> dict[str, Any]:
    changes = body.model_dump(exclude_unset=True)
    if not changes:
        raise TalariaError("invalid_request", "give at least one of name, instructions, archived, teamPermission")
    nulls = sorted(k for k, v in changes.items() if v is None)
    if nulls:
        raise TalariaError("invalid_request", f"{nulls[0]} must not be null")
    steps = [_not_in_team] if changes.get("archived") is True else []
    set_permission = _team_permission(user.account, changes.pop("teamPermission", None), creating=False)
    also = _chain(*steps, *([set_permission] if set_permission is not None else []))

    def update() -> dict[str, Any]:
        updated = hub.bots.update(user.account, bot_id, also=also, **changes)
        if updated.archived:  # its conversations' unended turns end (chat.md 5.7); none are left on a repeat
            hub.chat_engine.archive(owner_actor(user.account), bot_id=updated.id)
        return _shown(hub, updated, user.account)

    return {"bot": await run_in_threadpool(update)}


@router.get("/api/bot-profiles")
async def bot_profiles(user: UserDep, hub: HubDep) -> dict[str, Any]:
    """The (source, profile) pairs a bot may be bound to now, by source and profile."""
    pairs = await run_in_threadpool(hub.bot_access.profiles, user.account)
    return {"profiles": [{"source": p.source, "profile": p.profile, "online": p.online} for p in pairs]}
