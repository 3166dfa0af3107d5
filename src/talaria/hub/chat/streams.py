"""The hub's open chat event streams (chat.md 4.1, 7): how many each account holds open (at most ``limit``; the
next one is 429 ``chat_stream_limit``) and how long a stream stays silent before its keepalive.

In-process counts: one hub process serves every stream on SQLite. PostgreSQL replicas count them cluster-wide in
``stream_open`` rows (hub/chat/shared_streams.py, scale.md 3.7).
"""

from __future__ import annotations

import threading

from talaria.ids import lease_id
from talaria.limits import MAX_CHAT_STREAMS_PER_ACCOUNT


class ChatStreams:
    """Open streams per account. Thread-safe; ``wait_open`` lets a test await a count instead of sleeping."""

    def __init__(self, *, keepalive_s: float, limit: int = MAX_CHAT_STREAMS_PER_ACCOUNT) -> None:
        if keepalive_s <= 0 or limit < 1:
            raise ValueError("keepalive_s must be positive and limit at least 1")
        self.keepalive_s = keepalive_s
        self.limit = limit
        self._open: dict[str, int] = {}
        self._changed = threading.Condition()

    def take(self, account: str) -> str | None:
        """Count one more open stream for ``account``: its id, or None (nothing counted) when it already has
        ``limit``. Call it off the event loop (a replica's count is a store write)."""
        with self._changed:
            held = self._open.get(account, 0)
            if held >= self.limit:
                return None
            self._count(account)
            return lease_id()

    def give_back(self, account: str, stream_id: str) -> None:
        """One of ``account``'s streams (``stream_id`` from ``take``) ended. Call it once per successful ``take``;
        quick, from any thread or the event loop."""
        self._uncount(account)

    def sweep(self) -> int:
        """Forget the streams of replicas no longer live (none in one hub)."""
        return 0

    def close(self) -> None:
        """The hub stops (its streams were ended)."""

    def _count(self, account: str) -> None:
        with self._changed:
            self._open[account] = self._open.get(account, 0) + 1
            self._changed.notify_all()

    def _uncount(self, account: str) -> None:
        with self._changed:
            held = self._open.get(account, 0) - 1
            if held > 0:
                self._open[account] = held
            else:
                self._open.pop(account, None)
            self._changed.notify_all()

    def open(self, account: str) -> int:
        with self._changed:
            return self._open.get(account, 0)

    def wait_open(self, account: str, count: int, timeout: float) -> bool:
        """Wait until ``account`` holds exactly ``count`` open streams on this hub; False after ``timeout``
        seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self._open.get(account, 0) == count, timeout)
