"""Attachments of a conversation (chat.md 3.4): uploaded raw, put in a user message, sent to the node once.

``state``: ``uploaded`` (stored, in no message; removable), ``attached`` (in an accepted user message, not sent
yet), ``sent`` (its RPC went to the runner: bytes dropped, ``runner_id`` and ``node_path`` kept), ``expired`` (an
upload unused for an hour: bytes dropped, then 404). Bytes are never served back. Checks of an upload, in order:
the conversation (404), archived (409 ``conversation_archived``, ``bot_archived``), the name (400), the kind (415
``attachment_kind_unsupported``; an image's leading bytes must match its type), ``MAX_UNSENT_ATTACHMENTS`` (409
``attachment_limit``). The size limit is the door's (413 ``attachment_too_large``). Names and bytes never enter
logs, audit or errors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

from talaria.accounts.service import Account
from talaria.chat.conversations import Conversations
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.limits import ATTACHMENT_UNUSED_S, MAX_ATTACHMENT_NAME_CHARS, MAX_UNSENT_ATTACHMENTS
from talaria.store.interface import Row, Store, Tx
from talaria.text_rules import is_control

IMAGE_MAGIC: Final = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
}
FILE_TYPES: Final = frozenset({"text/plain", "text/markdown", "text/csv", "application/json", "application/pdf"})


@dataclass(frozen=True)
class Attachment:
    id: str
    conversation_id: str
    name: str
    media_type: str
    kind: str
    bytes: int
    sha256: str
    state: str
    message_id: str | None
    runner_id: str | None
    node_path: str | None
    created_at: int

    @classmethod
    def from_row(cls, row: Row) -> Attachment:
        return cls(
            id=row["id"], conversation_id=row["conversation_id"], name=row["name"], media_type=row["media_type"],
            kind=row["kind"], bytes=int(row["bytes"]), sha256=row["sha256"], state=row["state"],
            message_id=row["message_id"], runner_id=row["runner_id"], node_path=row["node_path"],
            created_at=int(row["created_at"]),
        )  # fmt: skip


def attachment_json(attachment: Attachment) -> dict[str, Any]:
    return {
        "id": attachment.id, "conversationId": attachment.conversation_id, "name": attachment.name,
        "mediaType": attachment.media_type, "kind": attachment.kind, "bytes": attachment.bytes,
        "sha256": attachment.sha256, "state": attachment.state, "messageId": attachment.message_id,
        "createdAt": attachment.created_at,
    }  # fmt: skip


def check_name(name: str | None) -> str:
    if name is None or not 1 <= len(name) <= MAX_ATTACHMENT_NAME_CHARS or not name.strip():
        raise TalariaError("invalid_request", f"name: 1-{MAX_ATTACHMENT_NAME_CHARS} characters")
    if any(ch in "/\\" or is_control(ch) for ch in name):
        raise TalariaError("invalid_request", "name must not contain a slash, a backslash or a control character")
    return name


def kind_of(media_type: str, data: bytes) -> str:
    """``image`` or ``file``; 415 ``attachment_kind_unsupported`` for anything else or an image whose bytes do not
    start as its type's do."""
    base = media_type.split(";", maxsplit=1)[0].strip().lower()
    if base == "image/webp":
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return "image"
    elif base in IMAGE_MAGIC:
        if data.startswith(IMAGE_MAGIC[base]):
            return "image"
    elif base in FILE_TYPES:
        return "file"
    raise TalariaError("attachment_kind_unsupported", "this kind of file cannot be attached")


class Attachments:
    def __init__(self, store: Store, clock: Clock, conversations: Conversations) -> None:
        self.store = store
        self.clock = clock
        self.conversations = conversations

    def upload(self, account: Account, conversation_id: str, *, name: str | None, media_type: str,
               data: bytes) -> Attachment:  # fmt: skip
        now = self.clock.now_ms()
        with self.store.read() as tx:
            conversation = self.conversations.visible(tx, account, conversation_id)
        if conversation.archived:
            raise TalariaError("conversation_archived", "this conversation is archived")
        if conversation.bot.archived:
            raise TalariaError("bot_archived", "the bot is archived")
        checked = check_name(name)
        kind = kind_of(media_type, data)
        attachment_id = mint("att", now)
        with self.store.write() as tx:
            tx.run("account_lock", username=account.username)  # uploads, removals and sends one at a time
            self.conversations.visible(tx, account, conversation_id)
            expire_of(tx, conversation_id, now)
            unsent = tx.one("chat_attachment_unsent_count", conversation_id=conversation_id)
            if unsent is not None and int(unsent["n"]) >= MAX_UNSENT_ATTACHMENTS:
                raise TalariaError("attachment_limit", f"at most {MAX_UNSENT_ATTACHMENTS} unsent attachments; send or "
                                   "remove some first")  # fmt: skip
            tx.run(
                "chat_attachment_insert", id=attachment_id, conversation_id=conversation_id, name=checked,
                media_type=media_type.split(";", maxsplit=1)[0].strip().lower(), kind=kind, bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(), data=data, now=now,
            )  # fmt: skip
            return get(tx, conversation_id, attachment_id)

    def remove(self, account: Account, conversation_id: str, attachment_id: str) -> None:
        with self.store.write() as tx:
            tx.run("account_lock", username=account.username)
            self.conversations.visible(tx, account, conversation_id)
            expire_of(tx, conversation_id, self.clock.now_ms())
            found = get(tx, conversation_id, attachment_id)
            if found.state != "uploaded":
                raise TalariaError("attachment_used", "this attachment is already in a message")
            tx.run("chat_attachment_delete", id=attachment_id)

    def sweep(self) -> None:
        """Uploads unused for ``ATTACHMENT_UNUSED_S`` expire, in every conversation (the reaper's tick; on
        PostgreSQL only the replica holding ``maintenance`` runs it)."""
        now = self.clock.now_ms()
        with self.store.write() as tx:
            tx.run("chat_attachment_expire", before=now - ATTACHMENT_UNUSED_S * 1000, now=now)


def expire_of(tx: Tx, conversation_id: str, now_ms: int) -> None:
    """The conversation's uploads unused for ``ATTACHMENT_UNUSED_S`` expire (its rows only: no lock on others')."""
    tx.run("chat_attachment_expire_of", conversation_id=conversation_id, before=now_ms - ATTACHMENT_UNUSED_S * 1000,
           now=now_ms)  # fmt: skip


def get(tx: Tx, conversation_id: str, attachment_id: str) -> Attachment:
    """A conversation's attachment; anyone else's, an unknown or an expired one is 404 ``not_found``."""
    row = tx.one("chat_attachment_get", conversation_id=conversation_id, id=attachment_id)
    if row is None or row["state"] == "expired":
        raise TalariaError("not_found", "no such attachment")
    return Attachment.from_row(row)


def attach(tx: Tx, conversation_id: str, ids: list[str], message_id: str, now_ms: int) -> list[Attachment]:
    """Put uploaded attachments in the accepted user message (404 unknown, 409 ``attachment_used``)."""
    expire_of(tx, conversation_id, now_ms)
    found = [get(tx, conversation_id, attachment_id) for attachment_id in ids]
    for attachment in found:
        if attachment.state != "uploaded":
            raise TalariaError("attachment_used", "an attachment is already in a message")
    for attachment in found:
        tx.run("chat_attachment_attach", id=attachment.id, message_id=message_id, now=now_ms)
    return [get(tx, conversation_id, a.id) for a in found]


def of_messages(tx: Tx, conversation_id: str) -> dict[str, list[Attachment]]:
    out: dict[str, list[Attachment]] = {}
    for row in tx.all("chat_attachment_of_messages", conversation_id=conversation_id):
        attachment = Attachment.from_row(row)
        out.setdefault(attachment.message_id or "", []).append(attachment)
    return out
