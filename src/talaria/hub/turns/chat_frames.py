"""One live chat turn's Hermes frames made into stored messages and stream events (chat.md 4.3, 5.5).

A *draft* is the streamed, unstored assistant text of the live turn, under its own message id; ``message.delta``
appends to it (and is streamed at once: in one hub without a write, on PostgreSQL as one ``stream_event`` row).
``tool.start`` stores a non-empty draft (assistant, ``final: false``, ``complete``) and then the tool message
(``running``); ``tool.complete`` marks it ``done`` with its summary and duration. Hermes' ``error`` stores a system
message. Reasoning, thinking and the session's system prompt are never stored, streamed or logged.

Every stored change is committed with its events (staged in its transaction, sent after it) under the
conversation's event lock, so that a snapshot (the messages read plus the draft and ``lastEventId``) is exactly the
events up to its id.

A frame's change also advances the turn's frame cursor (``chat_turn.frame_seq``, the frame's event number on its
channel) in its transaction (scale.md 4.1). A replica adopting the turn's channel from a dead owner (``adopt``) goes
on from the owner's stored draft and tool messages and skips the frames up to the cursor: each delta reaches the
stream once.
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

TEAM_TOOL: Final = re.compile(r"^team_[0-9a-f]{32}\Z")
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
    skip_through: int = 0  # adopted: the frames up to this event number had their effect stored by the owner before
    _tool_ids: dict[str, str] = field(default_factory=dict)
    draft: Draft = field(init=False)

    def __post_init__(self) -> None:
        self.draft = Draft(self.turn_id, mint("msg", self.clock.now_ms()))
        self.drafts[self.conversation_id] = self.draft

    async def settle_answers(self) -> None:
        """Before the channel closes: let answers to approvals still in flight get theirs (at most 2 s)."""
        if self.answers:
            await asyncio.wait(set(self.answers), timeout=2)

    def adopt(self, tx: Tx, frame_seq: int | None) -> None:
        """Go on from what the turn's previous owner stored (scale.md 4.4): its draft (the deltas streamed since its
        last stored message, ``stream_draft``), its tool messages, and its frame cursor."""
        stored = self.events.draft(tx, self.conversation_id, self.turn_id, lambda _conversation_id: None)
        if stored is not None:
            self.draft = Draft(self.turn_id, str(stored["messageId"]), str(stored["content"]))
            self.drafts[self.conversation_id] = self.draft
        for row in tx.all("chat_message_tools_of_turn", turn_id=self.turn_id):
            self._tool_ids[str(row["tool_id"])] = str(row["id"])
        self.skip_through = frame_seq or 0

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
        seq = self._seq()
        if seq is not None and seq <= self.skip_through and kind != "session.info":
            return  # its effect was stored by the owner this turn was adopted from
        if kind == "message.delta":
            await asyncio.to_thread(self.delta, str(payload.get("text", "")), seq=seq)
        elif kind == "tool.start":
            await asyncio.to_thread(self._tool_started, payload, seq)
        elif kind == "tool.complete":
            await asyncio.to_thread(self._tool_completed, payload, seq)
        elif kind == "error":
            text = f"Hermes reported an error: {payload.get('message', '')}"
            await asyncio.to_thread(self.system_message, text, seq=seq)
        elif kind in ("approval.request", "clarify.request"):
            await asyncio.to_thread(self._asked, "approval" if kind == "approval.request" else "clarify", payload, seq)
        elif kind in ("sudo.request", "secret.request"):
            await asyncio.to_thread(self.system_message, WITHHELD_NOTICE, seq=seq)
        elif kind == "session.info":
            self._session_info(frame)
        elif kind == "message.complete":
            self.replied = True
            self.totals = totals_of(payload)
            usage = payload.get("usage")
            self.model = str(usage.get("model") or "") if isinstance(usage, dict) else ""

    def _seq(self) -> int | None:
        """The event number of the frame being handled: the last one read from the turn's channel."""
        gateway = self.result.gateway if self.result is not None else None
        return gateway.read_seq if gateway is not None else None

    def _session_info(self, frame: dict[str, Any]) -> None:
        raw = frame.get("payload")
        payload: dict[str, Any] = raw if isinstance(raw, dict) else {}
        stored = payload.get("stored_session_id")
        if isinstance(stored, str) and stored:
            self.stored_id = stored

    def delta(self, text: str, *, seq: int | None = None) -> None:
        if not text:
            return
        with self.events.locked(self.conversation_id):
            if self.closed:
                return
            draft = self.draft
            data = {"turnId": self.turn_id, "messageId": draft.message_id, "text": text}
            self.events.emit(self.conversation_id, "message.delta", data, fence=lambda tx: self._fence(tx, seq))
            draft.text += text

    def store_and_emit(self, write: Callable[[Tx], list[tuple[str, dict[str, Any]]]], seq: int | None = None) -> None:
        """Commit ``write`` with the events it returns, under the conversation's event lock; ``seq``: the frame
        whose effect it stores (the frame cursor moves to it in the same transaction)."""
        with self.events.locked(self.conversation_id):
            if self.closed:
                return
            with self.store.write() as tx:
                self.fence(tx, self.turn_id)
                emits = write(tx)
                self._advance(tx, seq)
                staged = self.events.stage(tx, self.conversation_id, emits)
            self.events.send(staged)

    def _fence(self, tx: Tx, seq: int | None) -> None:
        """In a delta's write: the owner's lease check (scale.md 4.3), and the frame cursor moved to ``seq`` (4.1)."""
        self.fence(tx, self.turn_id)
        self._advance(tx, seq)

    def _advance(self, tx: Tx, seq: int | None) -> None:
        """The frame cursor moved to ``seq``. The turn's row is locked after the conversation's (which a stored
        message updates) and before the stream's counter (which staging takes), in the order every writer of a turn
        takes them."""
        if seq is not None:
            tx.run("chat_turn_frame_seq", id=self.turn_id, seq=seq)

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

    def _tool_started(self, payload: dict[str, Any], seq: int | None = None) -> None:
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

        self.store_and_emit(write, seq)

    def _tool_completed(self, payload: dict[str, Any], seq: int | None = None) -> None:
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

        self.store_and_emit(write, seq)

    def _asked(self, kind: str, payload: dict[str, Any], seq: int | None = None) -> None:
        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            asked = approvals.record(tx, turn_id=self.turn_id, conversation_id=self.conversation_id, kind=kind,
                                     payload=payload, now_ms=self.clock.now_ms())  # fmt: skip
            return [("approval.requested", {"turnId": self.turn_id, "approval": approval_json(asked)})]

        self.store_and_emit(write, seq)

    def system_message(self, text: str, *, turn_id: str | None = None, seq: int | None = None) -> None:
        def write(tx: Tx) -> list[tuple[str, dict[str, Any]]]:
            stored = store_message(
                tx, self.conversation_id,
                NewMessage(role="system", author="talaria", content=text, turn_id=turn_id or self.turn_id),
                self.clock.now_ms(),
            )  # fmt: skip
            return [("message.complete", {"turnId": stored.turn_id, "message": message_json(stored)})]

        self.store_and_emit(write, seq)
