"""The live stream's events in one hub's memory (chat.md 4.2; SQLite): ids, each conversation's retained buffer,
replay and live delivery. PostgreSQL replicas keep them in tables instead (hub/chat/shared_events.py); both answer
``StreamEvents`` (hub/chat/stream_events.py). Here ``stage`` writes nothing: ``send``, after the commit, issues the
staged events through ``emit``, under the conversation's lock the writer holds around both.

``ChatEvents.emit`` gives an event the conversation's next id, keeps it in the conversation's buffer (the latest
``retained``) and hands it to every open ``Subscription`` of that conversation. Ids are positive and strictly
increasing per conversation across hub restarts: a process reserves blocks of ``block`` ids in
``chat_conversation.event_seq_reserved`` (its first block with its first id) and issues them one by one, so ids are
consecutive within a process and a restarted hub starts above everything the previous one may have issued.

A buffer is dropped ``idle_ms`` after its last event (checked on the injected clock when the conversation is next
touched, and by ``prune``, which the reaper calls); the process keeps the last id it issued, so ``last_event_id``
stays the newest id issued (chat.md 3.2). Resume points follow 4.2 exactly (``subscribe``).

Locking: each conversation has one ``threading.RLock`` (``locked``), taken by ``emit`` too, so "commit, then emit"
and "read the snapshot, then ``last_event_id``" are atomic with respect to each other. ``emit`` opens its own store
write (the reservation) while holding it, so the lock order is conversation lock, then store: never take the lock
or call ``emit`` inside a store transaction (that would deadlock against a reservation).

Events carry ids, types and data only; nothing here logs them.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.chat.delivery import ChatEvent, Subscription
from talaria.hub.chat.stream_events import (
    EVENTS_EXPIRED,
    RESET,
    UNKNOWN_EVENT_ID,
    Draft,
    Emits,
    Fence,
    Staged,
    check_type,
    resume_refusal,
)
from talaria.limits import (
    CHAT_EVENT_BUFFER_IDLE_S,
    CHAT_EVENT_ID_BLOCK,
    CHAT_EVENTS_RETAINED,
    CHAT_STREAM_MAX_BEHIND,
)
from talaria.store.interface import Store, Tx

__all__ = ["EVENTS_EXPIRED", "RESET", "UNKNOWN_EVENT_ID", "ChatEvents"]


@dataclass(eq=False)
class _Conversation:
    """What this process knows of one conversation's stream. ``next_id`` > ``reserved_to`` means: reserve."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    next_id: int = 1
    reserved_to: int = 0
    issued: int | None = None
    buffer: deque[ChatEvent] | None = None
    last_event_ms: int = 0
    subscriptions: set[Subscription] = field(default_factory=set)


class ChatEvents:
    """Every conversation's live-stream events in this hub process (module docstring). Thread-safe."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        block: int = CHAT_EVENT_ID_BLOCK,
        retained: int = CHAT_EVENTS_RETAINED,
        idle_ms: int = CHAT_EVENT_BUFFER_IDLE_S * 1000,
        behind: int = CHAT_STREAM_MAX_BEHIND,
    ) -> None:
        if min(block, retained, idle_ms, behind) < 1:
            raise ValueError("block, retained, idle_ms and behind must be at least 1")
        self.store = store
        self.clock = clock
        self.block = block
        self.retained = retained
        self.idle_ms = idle_ms
        self.behind = behind
        self._lock = threading.Lock()
        self._conversations: dict[str, _Conversation] = {}
        self._closed = False
        # called with each event's type after it was issued (team tools' reconciler wakes on a turn's end)
        self.listeners: list[Callable[[str], None]] = []

    def _of(self, conversation_id: str) -> _Conversation:
        with self._lock:
            return self._conversations.setdefault(conversation_id, _Conversation())

    @contextlib.contextmanager
    def locked(self, conversation_id: str) -> Iterator[None]:
        """Hold the conversation's (reentrant) lock, which ``emit`` also takes: a writer commits then emits, a
        snapshot reader reads its rows then ``last_event_id``, each inside it. Never take it inside a store
        transaction (``emit``'s reservation opens a write while holding it)."""
        with self._of(conversation_id).lock:
            yield

    def stage(self, tx: Tx, conversation_id: str, emits: Emits) -> Staged:
        """In memory nothing is written with the change: ``send`` issues the events after its commit (under the
        conversation's lock, which the writer holds around both)."""
        for type, _ in emits:
            check_type(type)
        return Staged(conversation_id, tuple(emits))

    def send(self, staged: Staged) -> list[int]:
        return [self.emit(staged.conversation_id, type, data) for type, data in staged.emits]

    def draft(self, tx: Tx, conversation_id: str, turn_id: str, local: Callable[[str], Draft | None]) -> Draft | None:
        return local(conversation_id)  # this hub drives every turn: its engine holds the draft

    def emit(self, conversation_id: str, type: str, data: Mapping[str, Any], *, fence: Fence | None = None) -> int:
        """Give the event the conversation's next id, retain it and deliver it to the conversation's open
        subscriptions; return the id. ``data`` gets ``conversationId``.

        MUST NOT be called inside a store transaction: reserving the next block of ids opens its own write (one in
        every ``block`` calls). Safe from the event loop and from worker threads. Raises ``StoreUnavailable`` when
        the reservation fails and ``TalariaError("not_found")`` for a conversation the store does not hold; no id is
        issued then."""
        check_type(type)  # ``fence``: one hub drives every turn, there is no other owner to fence out
        state = self._of(conversation_id)
        with state.lock:
            if state.next_id > state.reserved_to:
                high = self._reserve(conversation_id)
                state.next_id, state.reserved_to = max(state.next_id, high - self.block + 1), high
            event = ChatEvent(state.next_id, type, {**data, "conversationId": conversation_id})
            state.issued = state.next_id
            state.next_id += 1
            now = self.clock.now_ms()
            self._expire(state, now)
            if state.buffer is None:
                state.buffer = deque(maxlen=self.retained)
            state.buffer.append(event)
            state.last_event_ms = now
            for subscription in list(state.subscriptions):
                if not subscription.deliver(event):
                    state.subscriptions.discard(subscription)
            assert event.id is not None
        for listener in self.listeners:
            listener(type)
        return event.id

    def last_event_id(self, conversation_id: str, tx: Tx | None = None) -> int:
        """The newest id this process issued for the conversation or, before it issued one, the stored
        ``event_seq_reserved`` (0 before any, and for a conversation the store does not hold); read in ``tx``
        where given."""
        state = self._of(conversation_id)
        with state.lock:
            return state.issued if state.issued is not None else self._stored(conversation_id, tx)

    def subscribe(self, conversation_id: str, resume: int | None) -> Subscription:
        """A subscription to the conversation's events (chat.md 4.2). ``resume`` None follows live from now. N from
        the oldest retained id minus 1 to the last issued replays every retained event with id > N, then follows
        live (no duplicate, no gap); with nothing retained, N = ``last_event_id`` follows live. Any other N gets
        only ``stream.reset`` (no id): ``unknown_event_id`` above the last issued (nothing retained: above the
        stored high-water), else ``events_expired``. After ``close_all`` the subscription is born ended. Reads the
        store when this process issued no id yet: call it off the event loop."""
        if resume is not None and resume < 0:
            raise ValueError("a resume point is at least 0")
        state = self._of(conversation_id)
        with state.lock:
            if self._closed:
                return Subscription(conversation_id, (), behind=self.behind, final=True)
            self._expire(state, self.clock.now_ms())
            retained = list(state.buffer or ())
            reason = None if resume is None else self._check(conversation_id, state, retained, resume)
            if reason is not None:
                reset = ChatEvent(None, RESET, {"conversationId": conversation_id, "reason": reason})
                return Subscription(conversation_id, (reset,), behind=self.behind, final=True)
            replay = [event for event in retained if resume is not None and event.id is not None and event.id > resume]
            subscription = Subscription(conversation_id, replay, behind=self.behind, detach=self._detach)
            state.subscriptions.add(subscription)
            return subscription

    def prune(self) -> int:
        """Drop every buffer idle for ``idle_ms``; how many were dropped (the reaper's sweep)."""
        with self._lock:
            states = list(self._conversations.values())
        now = self.clock.now_ms()
        dropped = 0
        for state in states:
            with state.lock:
                dropped += self._expire(state, now)
        return dropped

    def close_all(self) -> None:
        """End every subscription, and every later one at birth (hub shutdown). Idempotent."""
        with self._lock:
            self._closed = True
            states = list(self._conversations.values())
        for state in states:
            with state.lock:
                ending, state.subscriptions = state.subscriptions, set()
            for subscription in ending:
                subscription.end()

    def _check(self, conversation_id: str, state: _Conversation, retained: list[ChatEvent], resume: int) -> str | None:
        """Why ``resume`` cannot be served (a ``stream.reset`` reason), or None."""
        last = state.issued if state.issued is not None else self._stored(conversation_id)
        return resume_refusal(resume, last, retained[0].id if retained else None)

    def _expire(self, state: _Conversation, now: int) -> int:
        if state.buffer is not None and now - state.last_event_ms >= self.idle_ms:
            state.buffer = None
            return 1
        return 0

    def _detach(self, subscription: Subscription) -> None:
        state = self._of(subscription.conversation_id)
        with state.lock:
            state.subscriptions.discard(subscription)

    def _reserve(self, conversation_id: str) -> int:
        with self.store.write() as tx:
            row = tx.one("chat_conversation_reserve_events", id=conversation_id, block=self.block)
        if row is None:
            raise TalariaError("not_found", "no such conversation")
        return int(row["event_seq_reserved"])

    def _stored(self, conversation_id: str, tx: Tx | None = None) -> int:
        if tx is None:
            with self.store.read() as read:
                return self._stored(conversation_id, read)
        row = tx.one("chat_conversation_event_seq", id=conversation_id)
        return int(row["event_seq_reserved"]) if row is not None else 0
