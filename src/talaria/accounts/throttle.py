"""Login throttling (web-api.md 2): 5 failures within 5 minutes, per account and per TCP peer.

Counted in memory per hub process (docs/adr/0004): a restart forgives recent failures, which the
argon2 cost and the per-peer limit keep cheap for an attacker to exploit only slowly. PostgreSQL replicas count
them in a table instead (``shared_throttle.py``), so every replica behind a balancer sees them.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Protocol

from talaria.clock import Clock
from talaria.limits import LOGIN_MAX_FAILURES, LOGIN_WINDOW_S

_PRUNE_ABOVE = 10_000


class Throttle(Protocol):
    """What sign-in asks: ``LoginThrottle`` in memory (one hub), ``SharedLoginThrottle`` in a table (replicas)."""

    def retry_after(self, *, username: str, peer: str) -> int | None: ...

    def failed(self, *, username: str, peer: str) -> None: ...

    def succeeded(self, *, username: str) -> None: ...


class LoginThrottle:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._failures: dict[str, deque[int]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, now: int) -> deque[int]:
        window = self._failures.setdefault(key, deque())
        while window and window[0] <= now - LOGIN_WINDOW_S * 1000:
            window.popleft()
        return window

    def retry_after(self, *, username: str, peer: str) -> int | None:
        """Seconds until an attempt is allowed again, or None when it is allowed now."""
        now = self._clock.now_ms()
        with self._lock:
            waits = []
            for key in (f"user:{username}", f"peer:{peer}"):
                window = self._recent(key, now)
                if len(window) >= LOGIN_MAX_FAILURES:
                    waits.append(window[-LOGIN_MAX_FAILURES] + LOGIN_WINDOW_S * 1000 - now)
            if not waits:
                return None
            return max(1, -(-max(waits) // 1000))

    def failed(self, *, username: str, peer: str) -> None:
        now = self._clock.now_ms()
        with self._lock:
            for key in (f"user:{username}", f"peer:{peer}"):
                self._recent(key, now).append(now)
            if len(self._failures) > _PRUNE_ABOVE:
                self._prune(now)

    def _prune(self, now: int) -> None:
        """Forget keys with no failure in the window (guessed usernames would otherwise pile up)."""
        for key in list(self._failures):
            if not self._recent(key, now):
                del self._failures[key]

    def succeeded(self, *, username: str) -> None:
        with self._lock:
            self._failures.pop(f"user:{username}", None)
