"""Attachment routes (chat.md 3.4): ``POST /api/conversations/{id}/attachments?name=`` (the raw body is the file,
``Content-Type`` its media type; at most 10 MiB, declared or read: ``BodyLimit`` answers 413
``attachment_too_large``) and ``DELETE …/attachments/{attachmentId}`` while it is in no message."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from talaria.chat.attachments import attachment_json
from talaria.hub.api.deps import HubDep, UserDep
from talaria.hub.api.websession import WebRoute
from talaria.hub.openapi import refusals

router = APIRouter(prefix="/api/conversations", tags=["conversations"], route_class=WebRoute)

NameQuery = Annotated[str | None, Query(description="the file's name: 1-255 characters, no slash or control")]
UPLOAD_BODY = {"type": "string", "format": "binary", "description": "the file itself, at most 10 MiB"}


@router.post(
    "/{conversation_id}/attachments",
    status_code=201,
    openapi_extra=refusals("not_found", "conversation_archived", "bot_archived", "attachment_limit",
                           "attachment_too_large", "attachment_kind_unsupported"),
)  # fmt: skip
async def upload_attachment(
    conversation_id: str, request: Request, user: UserDep, hub: HubDep, name: NameQuery = None
) -> dict[str, Any]:
    data = await request.body()
    media_type = request.headers.get("content-type", "")
    stored = await run_in_threadpool(
        lambda: hub.chat_attachments.upload(user.account, conversation_id, name=name, media_type=media_type, data=data)
    )
    return {"attachment": attachment_json(stored)}


@router.delete("/{conversation_id}/attachments/{attachment_id}", openapi_extra=refusals("not_found", "attachment_used"))
async def remove_attachment(conversation_id: str, attachment_id: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    await run_in_threadpool(hub.chat_attachments.remove, user.account, conversation_id, attachment_id)
    return {"ok": True}
