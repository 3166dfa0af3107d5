"""Chat's stored records (chat.md 2 and 3.1): a turn and a message, as read from their rows, and their JSON forms.

The JSON forms live here, not at the door, because a turn's acceptance stores its 202 answer with its
Idempotency-Key inside the accepting transaction, and a replay must send exactly those bytes (chat.md 3.3).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from talaria.chat.usage import public as public_usage
from talaria.store.interface import Row

LIVE: Final = frozenset({"pending", "running", "recovering"})
UNENDED: Final = LIVE | {"queued"}
TERMINAL: Final = frozenset({"completed", "failed", "interrupted", "uncertain"})
CHOICES: Final = ("once", "session", "deny")  # the approval answers a person may give (never "always")


@dataclass(frozen=True)
class ChatTurn:
    id: str
    conversation_id: str
    tenant: str
    owner: str
    state: str
    code: str | None
    error: str | None
    waiting_reason: str | None
    trigger: str
    trigger_message_id: str
    reply_message_id: str | None
    runner_id: str | None
    hermes_session_id: str | None
    carry: str
    team_tools: bool
    stop_requested: bool
    auth_version: int
    prompt: str | None
    marker: str | None
    submit_state: str
    usage: dict[str, Any] | None
    revision: int
    created_at: int
    updated_at: int
    submitted_at: int | None
    finished_at: int | None
    # the channel the submitted turn runs in, its first event number there, the session's runtime id, and the last of
    # its frames whose effect is stored (scale.md 4.1, 4.4: what a replica adopting the turn goes on from)
    connection_id: str | None = None
    first_seq: int | None = None
    runtime_session_id: str | None = None
    frame_seq: int | None = None

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL

    @classmethod
    def from_row(cls, row: Row) -> ChatTurn:
        return cls(
            id=row["id"],
            conversation_id=row["conversation_id"],
            tenant=row["tenant"],
            owner=row["owner"],
            state=row["state"],
            code=row["code"],
            error=row["error"],
            waiting_reason=row["waiting_reason"],
            trigger=row["trigger"],
            trigger_message_id=row["trigger_message_id"],
            reply_message_id=row["reply_message_id"],
            runner_id=row["runner_id"],
            hermes_session_id=row["hermes_session_id"],
            carry=row["carry"],
            team_tools=bool(row["team_tools"]),
            stop_requested=bool(row["stop_requested"]),
            auth_version=int(row["auth_version"]),
            prompt=row["prompt"],
            marker=row["marker"],
            submit_state=row["submit_state"],
            usage=json.loads(row["usage"]) if row["usage"] else None,
            revision=int(row["revision"]),
            created_at=int(row["created_at"]),
            updated_at=int(row["updated_at"]),
            submitted_at=row["submitted_at"],
            finished_at=row["finished_at"],
            connection_id=row["connection_id"],
            first_seq=int(row["first_seq"]) if row["first_seq"] is not None else None,
            runtime_session_id=row["runtime_session_id"],
            frame_seq=int(row["frame_seq"]) if row["frame_seq"] is not None else None,
        )


@dataclass(frozen=True)
class ToolInfo:
    tool_id: str
    name: str
    context: str | None
    summary: str | None
    duration_ms: int | None


@dataclass(frozen=True)
class ChatMessage:
    id: str
    conversation_id: str
    turn_id: str | None
    ordinal: int
    role: str
    author: str
    content: str
    reference: dict[str, Any] | None
    status: str | None
    final: bool
    recovered: bool
    tool: ToolInfo | None
    usage: dict[str, Any] | None
    created_at: int

    @classmethod
    def from_row(cls, row: Row) -> ChatMessage:
        tool = None
        if row["tool_id"] is not None:
            tool = ToolInfo(row["tool_id"], row["tool_name"], row["tool_context"], row["tool_summary"],
                            row["duration_ms"])  # fmt: skip
        return cls(
            id=row["id"],
            conversation_id=row["conversation_id"],
            turn_id=row["turn_id"],
            ordinal=int(row["ordinal"]),
            role=row["role"],
            author=row["author"],
            content=row["content"],
            reference=json.loads(row["reference"]) if row["reference"] else None,
            status=row["status"],
            final=bool(row["final"]),
            recovered=bool(row["recovered"]),
            tool=tool,
            usage=json.loads(row["usage"]) if row["usage"] else None,
            created_at=int(row["created_at"]),
        )


def turn_json(turn: ChatTurn) -> dict[str, Any]:
    return {
        "id": turn.id,
        "conversationId": turn.conversation_id,
        "state": turn.state,
        "code": turn.code,
        "error": turn.error,
        "waitingReason": turn.waiting_reason,
        "trigger": turn.trigger,
        "triggerMessageId": turn.trigger_message_id,
        "replyMessageId": turn.reply_message_id,
        "runnerId": turn.runner_id,
        "hermesSessionId": turn.hermes_session_id,
        "carry": turn.carry,
        "teamTools": turn.team_tools,
        "stopRequested": turn.stop_requested,
        "createdAt": turn.created_at,
        "submittedAt": turn.submitted_at,
        "finishedAt": turn.finished_at,
        "usage": public_usage(turn.usage),
    }


def tool_json(tool: ToolInfo | None) -> dict[str, Any] | None:
    if tool is None:
        return None
    return {"toolId": tool.tool_id, "name": tool.name, "context": tool.context, "summary": tool.summary,
            "durationMs": tool.duration_ms}  # fmt: skip


def message_json(message: ChatMessage, attachments: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The message's JSON; ``attachments``: the JSON of the attachments it holds (a user message's)."""
    return {
        "id": message.id,
        "conversationId": message.conversation_id,
        "turnId": message.turn_id,
        "ordinal": message.ordinal,
        "role": message.role,
        "author": message.author,
        "content": message.content,
        "reference": message.reference,
        "status": message.status,
        "final": message.final,
        "recovered": message.recovered,
        "createdAt": message.created_at,
        "attachments": list(attachments),
        "tool": tool_json(message.tool),
        "usage": public_usage(message.usage),
    }


@dataclass(frozen=True)
class Approval:
    id: str
    turn_id: str
    conversation_id: str
    kind: str
    state: str
    description: str | None
    command: str | None
    question: str | None
    choices: list[str]
    choice: str | None
    hermes_request_id: str | None
    created_at: int
    resolved_at: int | None

    @classmethod
    def from_row(cls, row: Row) -> Approval:
        return cls(
            id=row["id"], turn_id=row["turn_id"], conversation_id=row["conversation_id"], kind=row["kind"],
            state=row["state"], description=row["description"], command=row["command"], question=row["question"],
            choices=json.loads(row["choices"]) if row["choices"] else [], choice=row["choice"],
            hermes_request_id=row["hermes_request_id"], created_at=int(row["created_at"]),
            resolved_at=row["resolved_at"],
        )  # fmt: skip

    def offered(self) -> list[str]:
        """What the person may answer: an approval's offered choices without ``always``, a question's choices."""
        if self.kind == "approval":
            return [c for c in self.choices if c in CHOICES]
        return list(self.choices)


def approval_json(approval: Approval) -> dict[str, Any]:
    return {
        "id": approval.id, "turnId": approval.turn_id, "kind": approval.kind, "state": approval.state,
        "description": approval.description, "command": approval.command, "question": approval.question,
        "choices": approval.offered(), "choice": approval.choice, "createdAt": approval.created_at,
        "resolvedAt": approval.resolved_at,
    }  # fmt: skip
