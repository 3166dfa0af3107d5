"""Conversation routes (chat.md 3.1-3.2): ``/api/conversations``, each for the signed-in account's own
conversations only (another account's is 404 ``not_found``, an admin's request included)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import WithJsonSchema
from starlette.concurrency import run_in_threadpool

from talaria.chat.bots import owner_actor
from talaria.chat.conversations import Conversation
from talaria.errors import TalariaError
from talaria.hub.api.deps import HubDep, StrictBody, UserDep
from talaria.hub.api.views import CursorQuery, LimitQuery, decode_cursor, encode_cursor, page_limit
from talaria.hub.api.websession import WebRoute
from talaria.hub.chat.stream_events import Staged
from talaria.hub.openapi import refusals
from talaria.limits import MAX_CONVERSATION_TITLE_CHARS
from talaria.store.interface import Tx
from talaria.text_rules import ONE_LINE_PATTERN

router = APIRouter(prefix="/api/conversations", tags=["conversations"], route_class=WebRoute)

_TITLE = {"type": "string", "pattern": ONE_LINE_PATTERN, "maxLength": MAX_CONVERSATION_TITLE_CHARS,
          "description": "trimmed: 1-200 characters, no control character"}  # fmt: skip


class StartConversation(StrictBody):
    botId: str
    title: Annotated[str | None, WithJsonSchema(_TITLE)] = None


# Every field may be left out (at least one given), none may be null (400 invalid_request).
class PatchConversation(StrictBody):
    title: Annotated[str | None, WithJsonSchema(_TITLE)] = None
    archived: Annotated[bool | None, WithJsonSchema({"type": "boolean"})] = None


ArchivedQuery = Annotated[bool, Query(description="archived conversations instead of the others")]


def conversation_json(conversation: Conversation) -> dict[str, Any]:
    bot = conversation.bot
    return {
        "id": conversation.id,
        "tenant": conversation.tenant,
        "owner": conversation.owner,
        "bot": {"id": bot.id, "name": bot.name, "source": bot.source, "profile": bot.profile},
        "botIds": [bot.id],
        "title": conversation.title,
        "archived": conversation.archived,
        "createdAt": conversation.created_at,
        "updatedAt": conversation.updated_at,
        "lastActivityAt": conversation.last_activity_at,
        "runnerId": conversation.runner_id,
        "hermesSessionId": conversation.hermes_session_id,
        "messageCount": conversation.message_count,
        "liveTurnId": conversation.live_turn_id,
    }


@router.get("", openapi_extra=refusals("invalid_request"))
async def list_conversations(
    user: UserDep, hub: HubDep, archived: ArchivedQuery = False, limit: LimitQuery = None, cursor: CursorQuery = None
) -> dict[str, Any]:
    size = page_limit(limit)
    after = decode_cursor(cursor, (int, str))
    page = (after[0], after[1]) if after else None
    found = await run_in_threadpool(
        lambda: hub.conversations.list(user.account, archived=archived, after=page, limit=size + 1)
    )
    more, found = len(found) > size, found[:size]
    return {
        "conversations": [conversation_json(c) for c in found],
        "nextCursor": encode_cursor(found[-1].last_activity_at, found[-1].id) if more else None,
    }


@router.post(
    "", status_code=201, openapi_extra=refusals("not_found", "bot_archived", "bot_not_allowed", "conversation_limit")
)
async def start_conversation(body: StartConversation, user: UserDep, hub: HubDep) -> dict[str, Any]:
    if "title" in body.model_fields_set and body.title is None:
        raise TalariaError("invalid_request", "title must not be null")
    started = await run_in_threadpool(
        lambda: hub.conversations.start(user.account, bot_id=body.botId, title=body.title)
    )
    return {"conversation": conversation_json(started)}


@router.get("/{conversation_id}", openapi_extra=refusals("not_found"))
async def get_conversation(conversation_id: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    found = await run_in_threadpool(hub.conversations.get, user.account, conversation_id)
    return {"conversation": conversation_json(found)}


@router.patch(
    "/{conversation_id}", openapi_extra=refusals("not_found", "bot_archived", "bot_not_allowed", "conversation_limit")
)
async def update_conversation(
    conversation_id: str, body: PatchConversation, user: UserDep, hub: HubDep
) -> dict[str, Any]:
    changes = body.model_dump(exclude_unset=True)
    if not changes:
        raise TalariaError("invalid_request", "give at least one of title, archived")
    nulls = sorted(k for k, v in changes.items() if v is None)
    if nulls:
        raise TalariaError("invalid_request", f"{nulls[0]} must not be null")

    def update() -> Conversation:
        staged: list[Staged] = []

        def announce(tx: Tx, updated: Conversation) -> None:
            data = {"conversation": conversation_json(updated)}
            staged.append(hub.chat_events.stage(tx, conversation_id, [("conversation.updated", data)]))

        with hub.chat_events.locked(conversation_id):
            updated = hub.conversations.update(user.account, conversation_id, **changes, changed=announce)
            for made in staged:
                hub.chat_events.send(made)
        if updated.archived:  # its unended turns end (chat.md 5.7); none are left on a repeat
            hub.chat_engine.archive(owner_actor(user.account), conversation_id=conversation_id)
        return updated

    return {"conversation": conversation_json(await run_in_threadpool(update))}
