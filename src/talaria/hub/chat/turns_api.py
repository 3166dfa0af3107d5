"""Message and turn routes (chat.md 3.2-3.3, 5.6): ``/api/conversations/{id}/messages`` and ``…/turns``, for the
signed-in account's own conversations only (another account's, an admin's request included, is 404).

``POST …/turns`` checks, after the session and CSRF: the conversation visible (404), the ``Idempotency-Key``
syntax (400 ``idempotency_key_invalid``), the body (400), then the domain's checks (``ChatTurns.accept``). It
answers 202 before anything reaches the node; the turn engine is woken after the commit.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from talaria.accounts.service import Account
from talaria.canonical import canonical_json
from talaria.chat.attachments import attachment_json, of_messages
from talaria.chat.records import ChatTurn, approval_json, message_json, turn_json
from talaria.chat.turn_writes import Ended, pending
from talaria.chat.turns import Accepted
from talaria.errors import TalariaError
from talaria.hub.api.deps import HubDep, UserDep
from talaria.hub.api.views import LimitQuery, decode_cursor, encode_cursor, page_limit
from talaria.hub.api.websession import WebRoute
from talaria.hub.chat.conversations_api import conversation_json
from talaria.hub.chat.stream_events import Emits, Staged
from talaria.hub.openapi import refusals
from talaria.hub.resources import Hub
from talaria.limits import (
    MAX_ATTACHMENTS_PER_MESSAGE,
    MAX_CHAT_TEXT_CHARS,
    MAX_CLARIFY_ANSWER_CHARS,
    MAX_IDEMPOTENCY_KEY_CHARS,
)
from talaria.store.interface import Tx
from talaria.text_rules import MULTI_LINE_PATTERN, TextRefused, multi_line

router = APIRouter(prefix="/api/conversations", tags=["conversations"], route_class=WebRoute)

_KEY: Final = re.compile(rf"^[A-Za-z0-9_:-]{{1,{MAX_IDEMPOTENCY_KEY_CHARS}}}$")
TURN_BODY: Final = {
    "type": "object",
    "additionalProperties": False,
    "required": ["text"],
    "properties": {
        "text": {"type": "string", "minLength": 1, "maxLength": MAX_CHAT_TEXT_CHARS, "pattern": MULTI_LINE_PATTERN},
        "attachments": {"type": "array", "maxItems": MAX_ATTACHMENTS_PER_MESSAGE, "uniqueItems": True,
                        "items": {"type": "string"}},
    },
}  # fmt: skip
ConversationId = Annotated[str, Path()]
CursorQuery = Annotated[str | None, Query(description="from a previous page's nextCursor")]
_TURN_REFUSALS = ("not_found", "idempotency_key_invalid", "idempotency_key_reused", "conversation_archived",
                  "bot_archived", "bot_not_allowed", "attachment_used", "turn_in_progress", "chat_turn_limit",
                  "chat_busy", "hub_draining")  # fmt: skip


def _key(request: Request) -> str | None:
    keys = request.headers.getlist("idempotency-key")
    if not keys:
        return None
    if len(keys) != 1 or not _KEY.match(keys[0]):
        raise TalariaError("idempotency_key_invalid", "Idempotency-Key must be 1-255 of A-Z a-z 0-9 _ : -")
    return keys[0]


def turn_body(raw: bytes) -> tuple[str, list[str], dict[str, Any]]:
    """``(text, attachment ids, the body)``; 400 ``invalid_request`` naming what is wrong, never the text."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise TalariaError("invalid_request", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise TalariaError("invalid_request", "the body must be a JSON object")
    unknown = sorted(set(body) - {"text", "attachments"})
    if unknown:
        raise TalariaError("invalid_request", f"unknown field: {unknown[0]}")
    text, attachments = body.get("text"), body.get("attachments", [])
    if not isinstance(text, str):
        raise TalariaError("invalid_request", "text: a string of 1-32000 characters")
    if len(text) > MAX_CHAT_TEXT_CHARS:
        raise TalariaError("invalid_request", f"text must be at most {MAX_CHAT_TEXT_CHARS} characters")
    try:
        multi_line("text", text)
    except TextRefused as exc:
        raise TalariaError("invalid_request", str(exc)) from None
    if not isinstance(attachments, list) or not all(isinstance(a, str) for a in attachments):
        raise TalariaError("invalid_request", "attachments: a list of attachment ids")
    if len(attachments) > MAX_ATTACHMENTS_PER_MESSAGE:
        raise TalariaError("invalid_request", f"at most {MAX_ATTACHMENTS_PER_MESSAGE} attachments per message")
    if len(set(attachments)) != len(attachments):
        raise TalariaError("invalid_request", "attachments must be distinct")
    return text, attachments, body


@router.post("/{conversation_id}/turns", status_code=202, openapi_extra=refusals(*_TURN_REFUSALS, body=TURN_BODY))
async def send_message(conversation_id: ConversationId, request: Request, user: UserDep, hub: HubDep) -> Response:
    await run_in_threadpool(hub.conversations.get, user.account, conversation_id)
    hub.refuse_new_turn()
    key = _key(request)
    text, attachments, body = turn_body(await request.body())

    def accept() -> Accepted:
        # committed with its events, under the conversation's event lock: a snapshot is exactly the events up to its id
        staged: list[Staged] = []

        def announce(tx: Tx, made: Accepted) -> None:
            staged.append(hub.chat_events.stage(tx, conversation_id, _announced(hub, tx, user.account, made)))

        with hub.chat_events.locked(conversation_id):
            accepted = hub.chat_turns.accept(
                user.account, conversation_id, text=text, body=body, key=key, attachment_ids=attachments,
                accepted=announce,
            )  # fmt: skip
            for made in staged:
                hub.chat_events.send(made)
        return accepted

    accepted = await run_in_threadpool(accept)
    if not accepted.replayed:
        hub.chat_engine.wake()
    headers = {"Idempotent-Replayed": "true"} if accepted.replayed else {}
    return Response(accepted.body, status_code=202, media_type="application/json", headers=headers)


def _announced(hub: Hub, tx: Tx, account: Account, accepted: Accepted) -> Emits:
    conversation_id = accepted.turn.conversation_id
    data = {"turn": turn_json(accepted.turn), "message": message_json(accepted.message, accepted.attachments)}
    emits: list[tuple[str, dict[str, Any]]] = [("turn.started", data)]
    if accepted.retitled:
        conversation = hub.conversations.visible(tx, account, conversation_id)
        emits.append(("conversation.updated", {"conversation": conversation_json(conversation)}))
    return emits


@router.get("/{conversation_id}/messages", openapi_extra=refusals("not_found", "invalid_request"))
async def list_messages(
    conversation_id: ConversationId, user: UserDep, hub: HubDep, limit: LimitQuery = None, cursor: CursorQuery = None
) -> dict[str, Any]:
    size = page_limit(limit)
    after = decode_cursor(cursor, (int,))
    before = int(after[0]) if after else None

    def snapshot() -> dict[str, Any]:
        with hub.chat_events.locked(conversation_id), hub.store.read() as tx:
            hub.conversations.visible(tx, user.account, conversation_id)
            found = hub.chat_turns.messages(tx, conversation_id, before=before, limit=size + 1)
            held = of_messages(tx, conversation_id)
            live = hub.chat_turns.live(tx, conversation_id)
            draft = None
            if live is not None:
                draft = hub.chat_events.draft(tx, conversation_id, live.id, hub.chat_engine.draft)
            waiting = [approval_json(a) for a in pending(tx, live.id)] if live is not None else []
            last = hub.chat_events.last_event_id(conversation_id, tx)
        more, page = len(found) > size, found[:size]
        return {
            "messages": [message_json(m, [attachment_json(a) for a in held.get(m.id, [])]) for m in page],
            "nextCursor": encode_cursor(page[-1].ordinal) if more else None,
            "lastEventId": last,
            "liveTurn": None if live is None else {"turn": turn_json(live), "draft": draft, "approvals": waiting},
        }

    return await run_in_threadpool(snapshot)


APPROVAL_BODY: Final = {
    "type": "object",
    "additionalProperties": False,
    "required": ["approvalId"],
    "properties": {
        "approvalId": {"type": "string"},
        "choice": {"type": "string", "enum": ["once", "session", "deny"]},
        "answer": {"type": "string", "minLength": 1, "maxLength": MAX_CLARIFY_ANSWER_CHARS},
    },
}


@router.post(
    "/{conversation_id}/turns/{turn_id}/approvals",
    openapi_extra=refusals("not_found", "approval_expired", "approval_out_of_order", body=APPROVAL_BODY),
)
async def answer_approval(
    conversation_id: ConversationId, turn_id: str, request: Request, user: UserDep, hub: HubDep
) -> dict[str, Any]:
    """Answer the turn's oldest pending approval or question (chat.md 3.5)."""
    await run_in_threadpool(hub.chat_turns.get, user.account, conversation_id, turn_id)
    try:
        body = json.loads((await request.body()).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise TalariaError("invalid_request", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise TalariaError("invalid_request", "the body must be a JSON object")
    answered = await hub.chat_engine.answer(user.account, conversation_id, turn_id, body)
    return {"approval": approval_json(answered)}


@router.get("/{conversation_id}/turns/{turn_id}", openapi_extra=refusals("not_found"))
async def get_turn(conversation_id: ConversationId, turn_id: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    turn = await run_in_threadpool(hub.chat_turns.get, user.account, conversation_id, turn_id)
    return {"turn": turn_json(turn)}


@router.post(
    "/{conversation_id}/turns/{turn_id}/stop",
    status_code=202,
    openapi_extra=refusals("not_found", "turn_finished", "runner_target_changed"),
)
async def stop_turn(conversation_id: ConversationId, turn_id: str, user: UserDep, hub: HubDep) -> Response:

    def stop() -> ChatTurn:
        staged: list[Staged] = []

        def announce(tx: Tx, ended: Ended) -> None:
            staged.append(hub.chat_events.stage(tx, conversation_id, hub.chat_engine.ended_events(ended)))

        with hub.chat_events.locked(conversation_id):
            turn, _ = hub.chat_turns.stop(user.account, conversation_id, turn_id, ended=announce)
            for made in staged:
                hub.chat_events.send(made)
        hub.chat_engine.stop_recovering(turn)
        return turn

    turn = await run_in_threadpool(stop)
    hub.chat_engine.changed(turn.id)
    return Response(canonical_json({"turn": turn_json(turn)}), status_code=202, media_type="application/json")
