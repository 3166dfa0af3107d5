"""What one stream receives (chat.md 4.2): the event record with its SSE text, and ``Subscription``, one stream's
queue of a conversation's events, filled by ``ChatEvents`` (hub/chat/events.py) from any thread and read on the
stream's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from talaria.canonical import canonical_json


@dataclass(frozen=True)
class ChatEvent:
    """One event of a conversation's stream; ``id`` is None only for ``stream.reset``. ``data`` is not copied
    again: whoever made the event must not change it afterwards."""

    id: int | None
    type: str
    data: Mapping[str, Any]

    def sse(self) -> str:
        """The event as server-sent-events text: ``id:`` (not for a reset), ``event:``, ``data:`` with the
        canonical JSON of ``data`` on one line (JSON escapes every line break), then a blank line."""
        return self._text

    @cached_property
    def _text(self) -> str:
        head = "" if self.id is None else f"id: {self.id}\n"
        return f"{head}event: {self.type}\ndata: {canonical_json(self.data).decode()}\n\n"


Waiter = tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wake(waiter: Waiter | None) -> None:
    """Wake a ``Subscription.next`` waiting on its loop, from that loop or from any other thread."""
    if waiter is None:
        return
    loop, future = waiter
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _resolve(future)
    else:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_resolve, future)


class Subscription:
    """One stream's view of a conversation: its replay, then live events, in id order, each once.

    It ends, and ``next`` then answers None at once, after ``close()``, ``ChatEvents.close_all()``, the
    ``stream.reset`` it was opened with, or when more than ``behind`` live events wait unread (what waited is
    dropped: the client resumes from the last id it got). ``ended`` is true once nothing more will come."""

    def __init__(
        self, conversation_id: str, first: Iterable[ChatEvent], *, behind: int, final: bool = False,
        detach: Callable[[Subscription], None] = lambda _: None,
    ) -> None:  # fmt: skip
        self.conversation_id = conversation_id
        self._lock = threading.Lock()
        self._pending: deque[ChatEvent] = deque(first)
        self._replay_left = len(self._pending)  # the replay does not count as being behind
        self._behind = behind
        self._final = final
        self._waiter: Waiter | None = None
        self._detach = detach

    @property
    def ended(self) -> bool:
        with self._lock:
            return self._final and not self._pending

    async def next(self, timeout: float) -> ChatEvent | None:
        """The next event, waiting at most ``timeout`` seconds; None on timeout or once ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with self._lock:
                if self._pending:
                    self._replay_left = max(0, self._replay_left - 1)
                    return self._pending.popleft()
                remaining = deadline - loop.time()
                if self._final or remaining <= 0:
                    return None
                future: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, future)
            try:
                await asyncio.wait((future,), timeout=remaining)
            finally:
                with self._lock:
                    if self._waiter is not None and self._waiter[1] is future:
                        self._waiter = None
                future.cancel()

    def close(self) -> None:
        """End the subscription and leave its conversation. Idempotent; safe from any thread."""
        self.end()
        self._detach(self)

    def deliver(self, event: ChatEvent) -> bool:
        """For ``ChatEvents`` (under the conversation's lock): queue a live event; False once ended."""
        with self._lock:
            if self._final:
                return False
            if len(self._pending) - self._replay_left >= self._behind:
                self._final = True
                self._pending.clear()
                self._replay_left = 0
            else:
                self._pending.append(event)
            waiter, self._waiter = self._waiter, None
            kept = not self._final
        _wake(waiter)
        return kept

    def end(self) -> None:
        """End now, dropping what waits unread (``ChatEvents.close_all``); ``close`` also leaves the conversation."""
        with self._lock:
            self._final = True
            self._pending.clear()
            waiter, self._waiter = self._waiter, None
        _wake(waiter)
