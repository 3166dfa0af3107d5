"""The writes a turn's life is made of (chat.md 5.2, 5.5, 8), each inside the caller's write transaction.

A turn's state moves by ``next_state`` (a pure table) and is persisted by a conditional update on its revision
(``set_turn``); reaching a terminal state (``end_turn``) stores the reply, writes ``chat.turn.ended`` with the
keyed digest of that reply (never its text) and makes the conversation's oldest ``queued`` turn ``pending``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Final

from talaria.canonical import canonical_json
from talaria.chat.records import LIVE, TERMINAL, Approval, ChatMessage, ChatTurn
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_key import AuditKey
from talaria.limits import MAX_ASSISTANT_MESSAGE_CHARS, MAX_TOOL_TEXT_CHARS
from talaria.store.interface import Tx

CUT_SUFFIX: Final = "[cut by Talaria]"

# (state, event) -> state; terminal events are checked by ``end_turn`` (any unended turn may end).
_MOVES: Final = {
    ("queued", "promote"): "pending",
    ("pending", "submit"): "running",
    ("running", "lose"): "recovering",
}
# Which terminal states an unended state may reach (chat.md 5.2).
_ENDS: Final = {
    "queued": {"failed", "interrupted", "uncertain"},
    "pending": {"failed", "interrupted", "uncertain"},
    "running": {"completed", "failed", "interrupted", "uncertain"},
    "recovering": {"completed", "failed", "interrupted", "uncertain"},
}


def next_state(state: str, event: str) -> str:
    """The state ``event`` moves a turn in ``state`` to; ``invalid_transition`` if it may not."""
    target = _MOVES.get((state, event))
    if target is None:
        raise TalariaError("invalid_transition", f"a {state} turn cannot {event}")
    return target


def may_end(state: str, target: str) -> bool:
    return target in _ENDS.get(state, set())


def cut_reply(text: str) -> str:
    if len(text) <= MAX_ASSISTANT_MESSAGE_CHARS:
        return text
    return text[:MAX_ASSISTANT_MESSAGE_CHARS] + CUT_SUFFIX


def cut_tool_text(text: str | None) -> str | None:
    return None if text is None else text[:MAX_TOOL_TEXT_CHARS]


def get_turn(tx: Tx, turn_id: str) -> ChatTurn:
    row = tx.one("chat_turn_by_id", id=turn_id)
    if row is None:
        raise TalariaError("not_found", "no such turn")
    return ChatTurn.from_row(row)


def lock_turn(tx: Tx, turn_id: str) -> ChatTurn:
    """The turn, read in a write transaction that will change it: its conversation's row and then its own are held
    until the transaction ends (another replica's writer of the turn waits, then reads what this one wrote)."""
    turn = get_turn(tx, turn_id)
    tx.run("chat_conversation_lock", id=turn.conversation_id)
    row = tx.one("chat_turn_lock", id=turn_id)
    assert row is not None  # turns are never deleted
    return ChatTurn.from_row(row)


def set_turn(tx: Tx, turn: ChatTurn, now_ms: int, **changes: Any) -> ChatTurn:
    """Write ``changes`` to ``turn`` if it is still at the revision read (else 503 ``store_unavailable``: it
    changed meanwhile, and the caller's transaction rolls back)."""
    after = replace(turn, **changes)
    done = tx.run(
        "chat_turn_set", id=turn.id, expected_revision=turn.revision, state=after.state, code=after.code,
        error=after.error, waiting_reason=after.waiting_reason, reply_message_id=after.reply_message_id,
        runner_id=after.runner_id, hermes_session_id=after.hermes_session_id, carry=after.carry,
        team_tools=int(after.team_tools), stop_requested=int(after.stop_requested), marker=after.marker,
        submit_state=after.submit_state, usage=json.dumps(after.usage, sort_keys=True) if after.usage else None,
        submitted_at=after.submitted_at, finished_at=after.finished_at, now=now_ms,
    )  # fmt: skip
    if done != 1:
        raise TalariaError("store_unavailable", "the turn changed meanwhile; try again")
    return get_turn(tx, turn.id)


@dataclass(frozen=True)
class NewMessage:
    role: str
    author: str
    content: str
    turn_id: str | None = None
    status: str | None = None
    final: bool = False
    recovered: bool = False
    reference: dict[str, Any] | None = None
    tool_id: str | None = None
    tool_name: str | None = None
    tool_context: str | None = None
    usage: dict[str, Any] | None = None
    id: str | None = None  # a draft keeps the id it streamed under


def store_message(tx: Tx, conversation_id: str, message: NewMessage, now_ms: int) -> ChatMessage:
    message_id = message.id or mint("msg", now_ms)
    # the conversation's row first: a concurrent writer (another replica) waits here until this one commits, so
    # the next ordinal below is read after its message is visible
    tx.run("chat_conversation_touch", id=conversation_id, now=now_ms)
    tx.run(
        "chat_message_insert", id=message_id, conversation_id=conversation_id, turn_id=message.turn_id,
        role=message.role, author=message.author, content=message.content,
        reference=canonical_json(message.reference).decode() if message.reference is not None else None,
        status=message.status, final=int(message.final), recovered=int(message.recovered), tool_id=message.tool_id,
        tool_name=message.tool_name, tool_context=cut_tool_text(message.tool_context), tool_summary=None,
        duration_ms=None, usage=json.dumps(message.usage, sort_keys=True) if message.usage else None, now=now_ms,
    )  # fmt: skip
    row = tx.one("chat_message_get", conversation_id=conversation_id, id=message_id)
    assert row is not None
    return ChatMessage.from_row(row)


def pending(tx: Tx, turn_id: str) -> list[Approval]:
    """A turn's pending approvals, oldest first."""
    return [Approval.from_row(r) for r in tx.all("chat_approval_pending", turn_id=turn_id)]


def expire(tx: Tx, approval: Approval, now_ms: int) -> Approval:
    tx.run("chat_approval_resolve", id=approval.id, state="expired", choice=None, now=now_ms)
    row = tx.one("chat_approval_get", turn_id=approval.turn_id, id=approval.id)
    assert row is not None
    return Approval.from_row(row)


@dataclass(frozen=True)
class Ended:
    turn: ChatTurn
    reply: ChatMessage | None
    promoted: ChatTurn | None  # the conversation's oldest queued turn, now pending
    promoted_trigger: ChatMessage | None = None  # its trigger message
    expired: tuple[Approval, ...] = ()  # the turn's approvals that were pending


def end_turn(
    tx: Tx,
    turn: ChatTurn,
    *,
    state: str,
    code: str | None,
    error: str | None,
    actor: Actor,
    key: AuditKey,
    now_ms: int,
    reply: NewMessage | None = None,
    usage: dict[str, Any] | None = None,
) -> Ended:
    """End ``turn`` in ``state`` (terminal) with ``code``: store ``reply`` (the assistant message at its end, if
    any), write ``chat.turn.ended``, and promote the conversation's oldest queued turn."""
    if state not in TERMINAL or not may_end(turn.state, state):
        raise TalariaError("invalid_transition", f"a {turn.state} turn cannot end {state}")
    stored = store_message(tx, turn.conversation_id, reply, now_ms) if reply is not None else None
    submit_state = "finished" if turn.submit_state in ("submitting", "submitted") else turn.submit_state
    ended = set_turn(
        tx, turn, now_ms, state=state, code=code, error=error, waiting_reason=None, finished_at=now_ms,
        reply_message_id=stored.id if stored is not None else turn.reply_message_id, submit_state=submit_state,
        usage=usage if usage is not None else turn.usage,
    )  # fmt: skip
    expired = tuple(expire(tx, a, now_ms) for a in pending(tx, turn.id))
    evidence = audit.Evidence("chat_reply", key.digest({"text": stored.content})) if stored is not None else None
    audit.append(
        tx, now_ms=now_ms, type="chat.turn.ended", tenant=turn.tenant, actor=actor,
        subject=audit.Subject(conversation=turn.conversation_id, turn=turn.id), from_state=turn.state,
        to_state=state, reason_code=code, evidence=evidence,
    )  # fmt: skip
    promoted = None
    for row in (
        [] if turn.state not in LIVE else tx.all("chat_turn_unended_conversation", conversation_id=turn.conversation_id)
    ):
        queued = ChatTurn.from_row(row)
        if queued.state == "queued":
            promoted = set_turn(tx, queued, now_ms, state=next_state("queued", "promote"))
            break
    trigger = None
    if promoted is not None:
        found = tx.one("chat_message_get", conversation_id=turn.conversation_id, id=promoted.trigger_message_id)
        trigger = ChatMessage.from_row(found) if found is not None else None
    return Ended(ended, stored, promoted, trigger, expired)
