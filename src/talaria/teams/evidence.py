"""The audit event and evidence row of an applied mutating tool call (team-tools.md 10).

``record_call`` writes, in the call's transaction, one ``audit_event`` (actor ``bot:<tenant>/<botId>`` via
``team_tool``; the body's ``team`` ids; ``idempotency_key_hash`` and ``request_digest`` the audit-keyed digests of
the ``requestId`` and the arguments; ``evidence {kind: "team_tool", contentDigest}``) and one ``team_evidence`` row
holding the canonical payload ``{tool, ids, fromState, toState, argumentsDigest, resultDigest, fieldDigests}``, its
SHA-256 as ``contentDigest``, and the event's id. Every digest of the model's words is keyed with the hub's audit
key; no text of an argument or a result is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from talaria.canonical import canonical_json, sha256_hex
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_key import AuditKey
from talaria.store.interface import Tx
from talaria.teams.arguments import free_text
from talaria.teams.permission import team_body

KIND: Final = "team_tool"


def caller_actor(tenant: str, bot_id: str) -> Actor:
    """Who a tool call is by (team-tools.md 10): the calling bot, through its round's tools."""
    return Actor(f"bot:{tenant}/{bot_id}", frozenset(), "team_tool", tenant)


@dataclass(frozen=True)
class Call:
    """An applied call as its round knows it: who, where, and the call's ids."""

    tenant: str
    account: str
    bot_id: str
    conversation_id: str
    turn_id: str
    grant_id: str
    runner_id: str
    tool: str


def payload(
    key: AuditKey, call: Call, *, ids: Mapping[str, str | None], from_state: str | None, to_state: str | None,
    arguments: Mapping[str, Any], result: str,
) -> dict[str, Any]:  # fmt: skip
    """The evidence payload (10): ids and states in clear, every text as its keyed digest."""
    texts = free_text(call.tool, arguments)
    return {
        "tool": call.tool,
        "ids": dict(ids),
        "fromState": from_state,
        "toState": to_state,
        "argumentsDigest": key.digest(dict(arguments)),
        "resultDigest": key.digest(result),
        "fieldDigests": {name: key.digest(value) for name, value in texts.items()},
    }


def record_call(
    tx: Tx, key: AuditKey, call: Call, *, event_type: str, now_ms: int, ids: Mapping[str, str | None],
    from_state: str | None, to_state: str | None, arguments: Mapping[str, Any], result: str,
    revision_after: int | None = None, reason_code: str | None = None, subject: audit.Subject | None = None,
) -> str:  # fmt: skip
    """Append the call's audit event and its evidence row; the event's id. ``ids``: the main object's and the
    call's other ids by the ``team`` body's keys (``teamId``, ``goalId``, ``assignmentId``, ``targetBotId``)."""
    body = payload(key, call, ids=ids, from_state=from_state, to_state=to_state, arguments=arguments, result=result)
    content = sha256_hex(canonical_json(body))
    request_id = str(arguments.get("requestId", ""))
    event_id = audit.append(
        tx, now_ms=now_ms, type=event_type, tenant=call.tenant, actor=caller_actor(call.tenant, call.bot_id),
        subject=subject or audit.Subject(), from_state=from_state, to_state=to_state, revision_after=revision_after,
        idempotency_key_hash=key.digest(request_id), request_digest=key.digest(dict(arguments)),
        reason_code=reason_code, evidence=audit.Evidence(KIND, content),
        team=team_body(account=call.account, botId=call.bot_id, conversationId=call.conversation_id,
                       turnId=call.turn_id, grantId=call.grant_id, runnerId=call.runner_id, tool=call.tool, **ids),
    )  # fmt: skip
    tx.run(
        "team_evidence_insert", id=mint("tev", now_ms), audit_event_id=event_id, tool=call.tool, bot_id=call.bot_id,
        turn_id=call.turn_id, payload=canonical_json(body).decode("utf-8"), content_digest=content, recorded_at=now_ms,
    )  # fmt: skip
    return event_id


@dataclass(frozen=True)
class Event:
    """One audit event an applied call writes: its type, the main object's states and revision, and the call's
    other ids by the ``team`` body's keys."""

    type: str
    from_state: str | None = None
    to_state: str | None = None
    revision_after: int | None = None
    reason_code: str | None = None
    team_id: str | None = None
    goal_id: str | None = None
    assignment_id: str | None = None
    target_bot_id: str | None = None
    subject: audit.Subject | None = None

    def ids(self) -> dict[str, str | None]:
        return {"teamId": self.team_id, "goalId": self.goal_id, "assignmentId": self.assignment_id,
                "targetBotId": self.target_bot_id}  # fmt: skip


def record_more(tx: Tx, call: Call, event: Event, now_ms: int) -> str:
    """A further event of an applied call (a cancel cascade's ``team.assignment.cancelled``, 10): the caller's
    actor and ``team`` ids, no evidence of its own (the call's main event has it)."""
    return audit.append(
        tx, now_ms=now_ms, type=event.type, tenant=call.tenant, actor=caller_actor(call.tenant, call.bot_id),
        subject=event.subject or audit.Subject(), from_state=event.from_state, to_state=event.to_state,
        revision_after=event.revision_after, reason_code=event.reason_code,
        team=team_body(account=call.account, botId=call.bot_id, conversationId=call.conversation_id,
                       turnId=call.turn_id, grantId=call.grant_id, runnerId=call.runner_id, tool=call.tool,
                       **event.ids()),
    )  # fmt: skip
