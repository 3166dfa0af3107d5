"""Automatic turns (chat.md 5.10): an in-process interface for team tools' report-back; no route creates one.

In the caller's write transaction, ``system_message`` stores a message of role ``system`` by ``talaria`` (its
``turnId`` null) and ``enqueue`` stores one and a turn it triggers: ``trigger: "automatic"``, the ``prompt``
(1-32,000 characters), the owner's current ``auth_version`` and ``chat.turn.started``. The turn is ``pending`` at
once when the conversation has no live turn, else ``queued`` (never refused for being busy); queued turns start
oldest first as live ones end. Enqueueing refuses, rolling the caller back, for an archived conversation or bot
(409 ``conversation_archived``, ``bot_archived``) or with ``MAX_QUEUED_TURNS`` queued (409 ``turn_queue_full``).
Automatic turns count toward ``chat.per_account`` and ``chat.per_hub`` but are never refused by them.

After the commit the caller hands the ``Enqueued`` to ``ChatEngine.announce``: the trigger's ``message.complete``,
then the turn's ``turn.started`` once it is ``pending``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from talaria.chat.records import ChatMessage, ChatTurn
from talaria.chat.turn_writes import NewMessage, get_turn, store_message
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_key import AuditKey
from talaria.limits import MAX_CHAT_TEXT_CHARS, MAX_QUEUED_TURNS
from talaria.store.interface import Tx


@dataclass(frozen=True)
class Enqueued:
    conversation_id: str
    message: ChatMessage
    turn: ChatTurn | None  # None: a system message only


def _conversation(tx: Tx, conversation_id: str) -> Any:
    row = tx.one("chat_conversation_by_id", id=conversation_id)
    if row is None:
        raise TalariaError("not_found", "no such conversation")
    if row["archived"]:
        raise TalariaError("conversation_archived", "this conversation is archived")
    if row["bot_archived"]:
        raise TalariaError("bot_archived", "the bot is archived")
    return row


def system_message(
    tx: Tx, conversation_id: str, *, content: str, reference: dict[str, Any] | None, now_ms: int
) -> Enqueued:
    _conversation(tx, conversation_id)
    stored = store_message(
        tx, conversation_id, NewMessage(role="system", author="talaria", content=content, reference=reference), now_ms
    )
    return Enqueued(conversation_id, stored, None)


def enqueue(
    tx: Tx,
    conversation_id: str,
    *,
    content: str,
    prompt: str,
    reference: dict[str, Any] | None,
    actor: Actor,
    key: AuditKey,
    now_ms: int,
) -> Enqueued:
    if not 1 <= len(prompt) <= MAX_CHAT_TEXT_CHARS or not prompt.strip():
        raise TalariaError("invalid_request", f"an automatic turn's prompt is 1-{MAX_CHAT_TEXT_CHARS} characters")
    conversation = _conversation(tx, conversation_id)
    tx.run("chat_conversation_lock", id=conversation_id)  # its queue, one writer at a time (scale.md 3.7)
    unended = [ChatTurn.from_row(r) for r in tx.all("chat_turn_unended_conversation", conversation_id=conversation_id)]
    if sum(1 for t in unended if t.state == "queued") >= MAX_QUEUED_TURNS:
        raise TalariaError("turn_queue_full", f"this conversation already has {MAX_QUEUED_TURNS} queued turns")
    owner = tx.one("account_get", username=conversation["owner"])
    if owner is None:
        raise TalariaError("not_found", "no such account")
    state = "queued" if any(t.state != "queued" for t in unended) else "pending"
    turn_id = mint("trn", now_ms)
    stored = store_message(
        tx, conversation_id,
        NewMessage(role="system", author="talaria", content=content, reference=reference, turn_id=turn_id), now_ms,
    )  # fmt: skip
    tx.run(
        "chat_turn_insert", id=turn_id, conversation_id=conversation_id, tenant=conversation["tenant"],
        owner=conversation["owner"], state=state, trigger="automatic", trigger_message_id=stored.id,
        auth_version=int(owner["auth_version"]), prompt=prompt, idempotency_key_hash=None, request_digest=None,
        response_body=None, now=now_ms,
    )  # fmt: skip
    audit.append(
        tx, now_ms=now_ms, type="chat.turn.started", tenant=conversation["tenant"], actor=actor,
        subject=audit.Subject(conversation=conversation_id, turn=turn_id), from_state=None, to_state=state,
        evidence=audit.Evidence("chat_message", key.digest({"attachments": [], "text": prompt})),
    )  # fmt: skip
    return Enqueued(conversation_id, stored, get_turn(tx, turn_id))


__all__ = ["Enqueued", "enqueue", "system_message"]
