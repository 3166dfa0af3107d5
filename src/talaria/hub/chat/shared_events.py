"""The live stream's events on PostgreSQL replicas (scale.md 4.2): ``stream_event`` rows, ids from each stream's
``stream_counter`` row, and a follower thread that reads new rows for the streams open on this replica.

Issuing: ``stage`` writes each event in the caller's transaction, its id from ``UPDATE stream_counter … RETURNING``.
The counter row stays locked until that transaction ends, so ids strictly increase per conversation whichever replica
writes, and no id commits before every lower one: a reader taking the rows above its cursor never skips one. The
same transaction keeps the stream's latest ``retained`` events only, appends a delta to the live turn's
``stream_draft`` and clears a draft whose message it stores. After the commit ``send`` wakes this replica's
follower and notifies ``talaria_stream`` (coalesced) for the others.

Following: ``subscribe`` reads, in one snapshot, the newest id, the oldest retained one and the events above the
resume point (chat.md 4.2's rules), then registers the subscription with the newest id as its cursor. The follower
reads each stream's rows above its subscriptions' lowest cursor when woken by ``send``, by a notification, or by its
fallback: every ``fallback_ms`` one query reads the counters of every followed stream (scale.md 3.3). A subscription
whose next rows were dropped meanwhile (more than ``retained`` behind) is ended; its client resumes and gets
``events_expired``.

Idle: a stream whose last event is ``idle_ms`` old serves no replay (as a dropped buffer), and ``prune`` deletes its
rows. Events carry ids, types and data only; nothing here logs them.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import structlog

from talaria.canonical import canonical_json
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.chat.delivery import ChatEvent, Subscription
from talaria.hub.chat.stream_events import RESET, Draft, Emits, Fence, Staged, check_type, resume_refusal
from talaria.limits import CHAT_EVENT_BUFFER_IDLE_S, CHAT_EVENTS_RETAINED, CHAT_STREAM_MAX_BEHIND
from talaria.store.interface import Row, Signals, Store, Tx

log = structlog.get_logger("talaria.chat")

STREAM_CHANNEL: Final = "talaria_stream"  # a stream has new events (the id notified is the conversation's)


class SharedChatEvents:
    """Every conversation's stream events in PostgreSQL, followed from this replica (module docstring)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        signals: Signals,
        *,
        fallback_ms: int,
        retained: int = CHAT_EVENTS_RETAINED,
        idle_ms: int = CHAT_EVENT_BUFFER_IDLE_S * 1000,
        behind: int = CHAT_STREAM_MAX_BEHIND,
    ) -> None:
        if min(fallback_ms, retained, idle_ms, behind) < 1:
            raise ValueError("fallback_ms, retained, idle_ms and behind must be at least 1")
        self.store, self.clock, self.signals = store, clock, signals
        self.fallback_ms, self.retained, self.idle_ms, self.behind = fallback_ms, retained, idle_ms, behind
        self.listeners: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        self._locks: dict[str, threading.RLock] = {}
        self._followed: dict[str, dict[Subscription, int]] = {}  # by conversation: each subscription's cursor
        self._dirty: set[str] = set()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.reads = 0  # follower reads of event rows (a test counts them)
        signals.subscribe(STREAM_CHANNEL, self._notified)
        signals.on_reconnect(self._everything)

    # ------------------------------------------------------------------ issuing

    @contextlib.contextmanager
    def locked(self, conversation_id: str) -> Iterator[None]:
        """This replica's lock of the stream: writers here announce in commit order. Across replicas the counter
        row orders them."""
        with self._lock:
            lock = self._locks.setdefault(conversation_id, threading.RLock())
        with lock:
            yield

    def stage(self, tx: Tx, conversation_id: str, emits: Emits) -> Staged:
        now = self.clock.now_ms()
        events = tuple(self._insert(tx, conversation_id, type, data, now) for type, data in emits)
        return Staged(conversation_id, tuple(emits), events)

    def send(self, staged: Staged) -> list[int]:
        if staged.events:
            self._touch(staged.conversation_id)
            self.signals.notify(STREAM_CHANNEL, staged.conversation_id)
        for event in staged.events:
            for listener in self.listeners:
                listener(event.type)
        return [event.id for event in staged.events if event.id is not None]

    def emit(self, conversation_id: str, type: str, data: Mapping[str, Any], *, fence: Fence | None = None) -> int:
        with self.store.write() as tx:
            if fence is not None:
                fence(tx)
            staged = self.stage(tx, conversation_id, [(type, data)])
        return self.send(staged)[0]

    def _insert(self, tx: Tx, conversation_id: str, type: str, data: Mapping[str, Any], now: int) -> ChatEvent:
        check_type(type)
        row = tx.one("stream_counter_next", stream=conversation_id, now=now)
        if row is None:
            raise TalariaError("not_found", "no such conversation")
        event_id = int(row["last_id"])
        full = {**data, "conversationId": conversation_id}
        text = canonical_json(full).decode()
        tx.run("stream_event_insert", stream=conversation_id, id=event_id, type=type, data=text)
        if event_id > self.retained:
            tx.run("stream_event_trim", stream=conversation_id, below=event_id - self.retained)
        message = data.get("message")
        if isinstance(message, Mapping) and isinstance(message.get("id"), str):
            tx.run("stream_draft_stored", stream=conversation_id, message_id=message["id"])
        if type == "message.delta":
            tx.run("stream_draft_append", stream=conversation_id, turn_id=data["turnId"],
                   message_id=data["messageId"], text=data["text"])  # fmt: skip
        return ChatEvent(event_id, type, full)

    # ------------------------------------------------------------------ snapshots

    def last_event_id(self, conversation_id: str, tx: Tx | None = None) -> int:
        if tx is None:
            with self.store.read() as read:
                return self.last_event_id(conversation_id, read)
        row = tx.one("stream_counter_get", stream=conversation_id)
        if row is not None:
            return int(row["last_id"])
        stored = tx.one("chat_conversation_event_seq", id=conversation_id)
        return int(stored["event_seq_reserved"]) if stored is not None else 0

    def draft(self, tx: Tx, conversation_id: str, turn_id: str, local: Callable[[str], Draft | None]) -> Draft | None:
        """The draft as of the snapshot ``tx``, whichever replica drives the turn (``local`` is not used: this
        replica's engine may be ahead of the snapshot)."""
        row = tx.one("stream_draft_get", stream=conversation_id)
        if row is None or row["turn_id"] != turn_id:
            return None
        return {"messageId": row["message_id"], "content": row["content"]}

    # ------------------------------------------------------------------ following

    def subscribe(self, conversation_id: str, resume: int | None) -> Subscription:
        if resume is not None and resume < 0:
            raise ValueError("a resume point is at least 0")
        now = self.clock.now_ms()
        with self.store.read() as tx:
            last = self.last_event_id(conversation_id, tx)
            counter = tx.one("stream_counter_get", stream=conversation_id)
            idle = counter is None or now - int(counter["last_at"]) >= self.idle_ms
            oldest_row = None if idle else tx.one("stream_event_oldest", stream=conversation_id)
            oldest = None if oldest_row is None or oldest_row["id"] is None else int(oldest_row["id"])
            reason = None if resume is None else resume_refusal(resume, last, oldest)
            replay: list[ChatEvent] = []
            if reason is None and resume is not None and not idle and resume < last:
                rows = tx.all("stream_event_after", stream=conversation_id, after=resume, limit=self.retained)
                replay = [_event(row) for row in rows]
        if reason is not None:
            reset = ChatEvent(None, RESET, {"conversationId": conversation_id, "reason": reason})
            return Subscription(conversation_id, (reset,), behind=self.behind, final=True)
        subscription = Subscription(conversation_id, replay, behind=self.behind, detach=self._detach)
        with self._lock:
            if self._closed:  # the hub stops: born ended
                subscription.end()
                return subscription
            self._followed.setdefault(conversation_id, {})[subscription] = last
            self._start()
        self._touch(conversation_id)  # what committed between the snapshot and now
        return subscription

    def prune(self) -> int:
        """Delete the events of streams idle for ``idle_ms``; how many."""
        with self.store.write() as tx:
            return tx.run("stream_event_prune", before=self.clock.now_ms() - self.idle_ms)

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            followed, self._followed = self._followed, {}
        self._wake.set()
        for subscriptions in followed.values():
            for subscription in subscriptions:
                subscription.end()

    def _detach(self, subscription: Subscription) -> None:
        with self._lock:
            subscriptions = self._followed.get(subscription.conversation_id)
            if subscriptions is not None:
                subscriptions.pop(subscription, None)
                if not subscriptions:
                    del self._followed[subscription.conversation_id]

    def _notified(self, conversation_id: str) -> None:
        with self._lock:
            if conversation_id not in self._followed:
                return
        self._touch(conversation_id)

    def _everything(self) -> None:
        with self._lock:
            self._dirty.update(self._followed)
        self._wake.set()

    def _touch(self, conversation_id: str) -> None:
        with self._lock:
            self._dirty.add(conversation_id)
        self._wake.set()

    def _start(self) -> None:
        """Under ``_lock``: the follower runs once something is followed."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._follow, name="talaria-stream-follow", daemon=True)
            self._thread.start()

    def _follow(self) -> None:
        fallback_s = self.fallback_ms / 1000
        checked = time.monotonic()
        while True:
            self._wake.wait(max(0.0, checked + fallback_s - time.monotonic()))
            self._wake.clear()
            with self._lock:
                if self._closed:
                    return
                dirty, self._dirty = self._dirty & set(self._followed), set()
            try:
                if time.monotonic() - checked >= fallback_s:
                    checked = time.monotonic()
                    dirty |= self._behind_streams()
                for conversation_id in sorted(dirty):
                    self._deliver(conversation_id)
            except TalariaError as exc:  # the store did not answer: look at everything again soon
                log.warning("chat_stream_follow_failed", code=exc.code)
                with self._lock:
                    self._dirty.update(self._followed)
                self._wake.wait(fallback_s)
            except Exception:  # the follower must not die: every open stream would go silent
                log.exception("chat_stream_follow_failed")

    def _behind_streams(self) -> set[str]:
        """The fallback (scale.md 3.3): one read of every followed stream's counter."""
        with self._lock:
            lowest = {cid: min(subs.values()) for cid, subs in self._followed.items() if subs}
        if not lowest:
            return set()
        with self.store.read() as tx:
            rows = tx.all("stream_counter_of", streams=sorted(lowest))
        return {row["stream"] for row in rows if int(row["last_id"]) > lowest[row["stream"]]}

    def _deliver(self, conversation_id: str) -> None:
        with self._lock:
            cursors = dict(self._followed.get(conversation_id, {}))
        if not cursors:
            return
        low = min(cursors.values())
        with self.store.read() as tx:
            rows = tx.all("stream_event_after", stream=conversation_id, after=low, limit=self.retained)
        self.reads += 1
        events = [_event(row) for row in rows]
        if not events:
            return
        moved = {subscription: self._give(subscription, cursor, events) for subscription, cursor in cursors.items()}
        with self._lock:
            followed = self._followed.get(conversation_id, {})
            for subscription, cursor in moved.items():
                if subscription not in followed:
                    continue
                if cursor is None:
                    del followed[subscription]
                else:
                    followed[subscription] = cursor
            if len(rows) == self.retained:
                self._dirty.add(conversation_id)  # there may be more
                self._wake.set()

    @staticmethod
    def _give(subscription: Subscription, cursor: int, events: list[ChatEvent]) -> int | None:
        """Deliver the events above ``cursor``; the new cursor, or None once the subscription ended. One whose next
        events were dropped meanwhile is ended: its client resumes and is told so (``events_expired``)."""
        ids = [int(event.id or 0) for event in events]
        if cursor < ids[0] - 1:
            subscription.end()
            return None
        for event_id, event in zip(ids, events, strict=True):
            if event_id <= cursor:
                continue
            if not subscription.deliver(event):
                return None
            cursor = event_id
        return cursor


def _event(row: Row) -> ChatEvent:
    return ChatEvent(int(row["id"]), str(row["type"]), json.loads(row["data"]))
