"""Approvals and clarify questions of a running turn (chat.md 3.5).

Hermes' ``approval.request`` has no id and ``approval.respond {session_id, choice}`` resolves the session's oldest
pending approval, so the hub mints ``apr_`` ids and forwards only an answer to the turn's oldest pending one
(else 409 ``approval_out_of_order``). ``clarify.request``'s ``request_id`` goes back in ``clarify.respond``.
``approval`` answers take ``choice`` (``once``, ``session`` or ``deny``, and offered; never ``always``), ``clarify``
ones ``answer`` (1-4,000 characters). A resolution stores a system message, and ``chat.approval.answered`` (the
choice, or ``answer`` with the keyed digest of the answer, never its text). Pending approvals expire with their
turn.
"""

from __future__ import annotations

import json
from typing import Any, Final

from talaria.chat.records import CHOICES, Approval, ChatMessage, approval_json
from talaria.chat.turn_writes import NewMessage, expire, pending, store_message
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_key import AuditKey
from talaria.limits import MAX_CLARIFY_ANSWER_CHARS
from talaria.store.interface import Tx

SHOWN: Final = {"once": "Approved once: {}", "session": "Approved for this session: {}", "deny": "Denied: {}"}
STATE_OF: Final = {"once": "approved", "session": "approved", "deny": "denied"}


def _text(value: Any) -> str | None:
    return str(value) if value is not None else None


def record(tx: Tx, *, turn_id: str, conversation_id: str, kind: str, payload: dict[str, Any], now_ms: int) -> Approval:
    """Store what Hermes asked (``approval.request`` or ``clarify.request``) as a pending approval."""
    approval_id = mint("apr", now_ms)
    raw = payload.get("choices")
    choices = [str(c) for c in raw] if isinstance(raw, list) else (list(CHOICES) if kind == "approval" else [])
    tx.run(
        "chat_approval_insert", id=approval_id, turn_id=turn_id, conversation_id=conversation_id, kind=kind,
        description=_text(payload.get("description")), command=_text(payload.get("command")),
        question=_text(payload.get("question")), choices=json.dumps(choices),
        hermes_request_id=_text(payload.get("request_id")), now=now_ms,
    )  # fmt: skip
    return get(tx, turn_id, approval_id)


def get(tx: Tx, turn_id: str, approval_id: str) -> Approval:
    row = tx.one("chat_approval_get", turn_id=turn_id, id=approval_id)
    if row is None:
        raise TalariaError("not_found", "no such approval")
    return Approval.from_row(row)


def check_answer(approval: Approval, body: dict[str, Any]) -> tuple[str, str]:
    """``(choice or answer, what Hermes gets)`` from the body; 400 ``invalid_request`` for the wrong field or value."""
    if approval.kind == "approval":
        if set(body) != {"approvalId", "choice"}:
            raise TalariaError("invalid_request", "an approval takes approvalId and choice")
        choice = body["choice"]
        if not isinstance(choice, str) or choice not in approval.offered():
            raise TalariaError("invalid_request", f"choice must be one of {', '.join(approval.offered())}")
        return choice, choice
    if set(body) != {"approvalId", "answer"}:
        raise TalariaError("invalid_request", "a question takes approvalId and answer")
    answer = body["answer"]
    if not isinstance(answer, str) or not answer.strip() or len(answer) > MAX_CLARIFY_ANSWER_CHARS:
        raise TalariaError("invalid_request", f"answer: 1-{MAX_CLARIFY_ANSWER_CHARS} characters")
    return answer, answer


def resolve(
    tx: Tx, approval: Approval, value: str, *, tenant: str, actor: Actor, key: AuditKey, now_ms: int
) -> tuple[Approval, ChatMessage]:
    """The answer accepted by Hermes: the approval resolved, its system message, ``chat.approval.answered``."""
    if approval.kind == "approval":
        state, shown = STATE_OF[value], SHOWN[value].format(approval.command or approval.description or "")
    else:
        state, shown = "answered", f"Answered: {value}"
    if tx.run("chat_approval_resolve", id=approval.id, state=state, choice=value, now=now_ms) != 1:
        raise TalariaError("approval_expired", "this approval is no longer pending")
    message = store_message(
        tx, approval.conversation_id,
        NewMessage(role="system", author="talaria", content=shown, turn_id=approval.turn_id), now_ms,
    )  # fmt: skip
    clarify = approval.kind == "clarify"
    audit.append(
        tx, now_ms=now_ms, type="chat.approval.answered", tenant=tenant, actor=actor,
        subject=audit.Subject(conversation=approval.conversation_id, turn=approval.turn_id),
        reason_code="answer" if clarify else value,
        evidence=audit.Evidence("chat_answer", key.digest({"answer": value})) if clarify else None,
    )  # fmt: skip
    return get(tx, approval.turn_id, approval.id), message


__all__ = ["Approval", "approval_json", "check_answer", "expire", "get", "pending", "record", "resolve"]
