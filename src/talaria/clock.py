"""The injectable clock (standard library only; shared with the runner).

Domain code never reads the system time directly: it takes a ``Clock``. Production passes
``SystemClock``; tests pass ``ManualClock`` and advance it. Times are integer milliseconds since
the Unix epoch (UTC), which is what the store keeps and what the web API shows.
"""

from __future__ import annotations

import functools
import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch, UTC."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to. Thread-safe; never goes backwards."""

    def __init__(self, start_ms: int = 1_784_628_000_000) -> None:  # 2026-07-21T10:00:00Z
        self._now = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a ManualClock never goes backwards")
        with self._lock:
            self._now += round(seconds * 1000)

    def set_ms(self, value: int) -> None:
        with self._lock:
            if value < self._now:
                raise ValueError("a ManualClock never goes backwards")
            self._now = value


@functools.lru_cache(maxsize=256)  # a transaction formats the same few instants several times
def rfc3339(ms: int) -> str:
    """``2026-07-21T10:00:30.000Z`` for a millisecond timestamp."""
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
