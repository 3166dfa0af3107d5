"""One live chat turn's Hermes frames made into stored messages and stream events (chat.md 4.3, 5.5).

A *draft* is the streamed, unstored assistant text of the live turn, under its own message id; ``message.delta``
appends to it (and is streamed at once: in one hub without a write, on PostgreSQL as one ``stream_event`` row).
``tool.start`` stores a non-empty draft (assistant, ``final: false``, ``complete``) and then the tool message
(``running``); ``tool.complete`` marks it ``done`` with its summary and duration. Hermes' ``error`` stores a system
message. Reasoning, thinking and the session's system prompt are never stored, streamed or logged.

Every stored change is committed with its events (staged in its transaction, sent after it) under the
conversation's event lock, so that a snapshot (the messages read plus the draft and ``lastEventId``) is exactly the
events up to its id.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from talaria.chat import approvals
from talaria.chat.records import ChatMessage, approval_json, message_json
from talaria.chat.turn_writes import NewMessage, cut_tool_text, store_message
from talaria.chat.usage import totals_of
from talaria.clock import Clock
from talaria.hub.chat.stream_events import StreamEvents
from talaria.hub.turns.driver import TurnResult
from talaria.ids import mint
from talaria.store.interface import Store, Tx

TEAM_TOOL: Final = re.compile(r"^team_[0-9a-f]{32}$")
WITHHELD_NOTICE: Final = (
    "The bot asked for a password or secret. Talaria does not pass those on; the request will time out."
)


@dataclass
class Draft:
    turn_id: str
    message_id: str
    text: str = ""


@dataclass
class TurnStream:
    """The frames of one turn of ``conversation_id`` (owned by ``bot_id``)."""

    store: Store
    clock: Clock
    events: StreamEvents
    conversation_id: str
    turn_id: str
    bot_id: str
    drafts: dict[str, Draft]  # the engine's, by conversation: what a snapshot shows
    fence: Callable[[Tx, str], None] = lambda tx, turn_id: None  # the owner's lease check (scale.md 4.3)
    stored_id: str | None = None
    bound_id: str | None = None  # the stored session the turn's end bound the conversation to
    ended_state: str | None = None  # the state this stream's turn ended in, when its own end stored it
    totals: dict[str, int] | None = None  # Hermes' session totals at its message.complete (chat/usage.py)
    model: str = ""
    closed: bool = False  # the turn ended: later frames are dropped
    replied: bool = False  # Hermes' message.complete arrived: only the end-of-turn session.info follows
    answers: set[asyncio.Task[Any]] = field(default_factory=set)  # answers to approvals in flight
    result: TurnResult | None = None  # the session the turn runs in (its runtime id and channel), once open
    _tool_ids: dict[str, str] = field(default_factory=dict)
    draft: Draft = field(init=False)

    def __post_init__(self) -> None:
        self.draft = Draft(self.turn_id, mint("msg", self.clock.now_ms()))
        self.drafts[self.conversation_id] = self.draft

    async def settle_answers(self) -> None:
        """Before the channel closes: let answers to approvals still in flight get theirs (at most 2 s)."""
        if self.answers:
            await asyncio.wait(set(self.answers), timeout=2)

    def close(self) -> None:
        self.closed = True
        draft = self.drafts.get(self.conversation_id)
        if draft is not None and draft.turn_id == self.turn_id:
            del self.drafts[self.conversation_id]

    async def on_frame(self, frame: dict[str, Any]) -> None:
        if self.closed or self.replied:
            if frame.get("type") == "session.info":  # the end-of-turn one still updates the binding
                self._session_info(frame)
            return
        raw = frame.get("payload")
        payload: dict[str, Any] = raw if isinstance(raw, dict) else {}
        kind = frame.get("type")
        if kind == "message.delta":
            await asyncio.to_thread(self.delta, str(payload.get("text", "")))
        elif kind == "tool.start":
            await asyncio.to_thread(self._tool_started, payload)
        elif kind == "tool.complete":
            await asyncio.to_thread(self._tool_completed, payload)
        elif kind == "error":
            text = f"Hermes reported an error: {payload.get('message', '')}"
            await asyncio.to_thread(self.system_message, text)
        elif kind in ("approval.request", "clarify.request"):
            await asyncio.to_thread(self._asked, "approval" if kind == "approval.request" else "clarify", payload)
        elif kind in ("sudo.request", "secret.request"):
            await asyncio.to_thread(self.system_message, WITHHELD_NOTICE)
        elif kind == "session.info":
            self._session_info(frame)
        elif kind == "message.complete":
            self.replied = True
            self.totals = totals_of(payload)
            usage = payload.get("usage")
            self.model = str(usage.get("model") or "") if isinstance(usage, dict) else ""

    def _session_info(self, frame: dict[str, Any]) -> None:
        raw = frame.get("payload")
        payload: dict[str, Any] = raw if isinstance(raw, dict) else {}
        stored = payload.get("stored_session_id")
        if isinstance(stored, str) and stored:
            self.stored_id = stored

    def delta(self, text: str) -> None:
        if not text:
            return
        with self.events.locked(self.conversation_id):
            if self.closed:
                return
            draft = self.draft
            draft.text += text
            data = {"turnId": self.turn_id, "messageId": draft.message_id, "text": text}
            self.events.emit(self.conversation_id, "message.delta", data, fence=self._fence)

    def store_and_emit(self, write: Callable[[Tx], list[tuple[str, dict[str, Any]]]]) -> None:
        """Commit ``write`` with the events it returns, under the conversation's event lock."""
        with self.events.locked(self.conversation_id):
            if self.closed:
                return
            with self.store.write() as tx:
                self.fence(tx, self.turn_id)
                staged = self.events.stage(tx, self.conversation_id, write(tx))
            self.events.send(staged)

    def _fence(self, tx: Tx) -> None:
        self.fence(tx, self.turn_id)

    def _flush_draft(self, tx: Tx, now: int) -> list[tuple[str, dict[str, Any]]]:
        draft = self.draft
        if not draft.text:
            return []
        stored = store_message(
            tx, self.conversation_id,
            NewMessage(role="assistant", author=self.bot_id, content=draft.text, turn_id=self.turn_id,
                       status="complete", final=False, id=draft.message_id),
            now,
        )  # fmt: skip
        self.draft = Draft(self.turn_id, mint("msg", now))
        self.drafts[self.conversation_id] = self.draft
        return [("message.complete", {"turnId": self.turn_id, "message": message_json(stored)})]

    def _tool_started(self, payload: dict[str, Any]) -> None:
        tool_id = str(payload.get("tool_id", ""))
        name = str(payload.get("name", ""))
        shown = "team tool" if TEAM_TOOL.match(name) else name
        context = payload.get("context")

        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            now = self.clock.now_ms()
            emits = self._flush_draft(tx, now)
            stored = store_message(
                tx, self.conversation_id,
                NewMessage(role="tool", author=self.bot_id, content="", turn_id=self.turn_id, status="running",
                           tool_id=tool_id, tool_name=shown, tool_context=str(context) if context else None),
                now,
            )  # fmt: skip
            self._tool_ids[tool_id] = stored.id
            return [*emits, ("tool.started", {"turnId": self.turn_id, "message": message_json(stored)})]

        self.store_and_emit(write)

    def _tool_completed(self, payload: dict[str, Any]) -> None:
        tool_id = str(payload.get("tool_id", ""))
        message_id = self._tool_ids.get(tool_id)
        if message_id is None:
            return
        summary = payload.get("summary")
        duration = payload.get("duration_s")
        duration_ms = int(float(duration) * 1000) if isinstance(duration, (int, float)) else None

        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            tx.run(
                "chat_message_finish_tool", conversation_id=self.conversation_id, turn_id=self.turn_id,
                tool_id=tool_id, summary=cut_tool_text(str(summary)) if summary else None, duration_ms=duration_ms,
            )  # fmt: skip
            row = tx.one("chat_message_get", conversation_id=self.conversation_id, id=message_id)
            assert row is not None
            done = ChatMessage.from_row(row)
            return [("tool.completed", {"turnId": self.turn_id, "message": message_json(done)})]

        self.store_and_emit(write)

    def _asked(self, kind: str, payload: dict[str, Any]) -> None:
        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            asked = approvals.record(tx, turn_id=self.turn_id, conversation_id=self.conversation_id, kind=kind,
                                     payload=payload, now_ms=self.clock.now_ms())  # fmt: skip
            return [("approval.requested", {"turnId": self.turn_id, "approval": approval_json(asked)})]

        self.store_and_emit(write)

    def system_message(self, text: str, *, turn_id: str | None = None) -> None:
        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            stored = store_message(
                tx, self.conversation_id,
                NewMessage(role="system", author="talaria", content=text, turn_id=turn_id or self.turn_id),
                self.clock.now_ms(),
            )  # fmt: skip
            return [("message.complete", {"turnId": stored.turn_id, "message": message_json(stored)})]

        self.store_and_emit(write)
