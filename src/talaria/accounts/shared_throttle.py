"""Login throttling across PostgreSQL replicas (scale.md 3.7, web-api.md 2): the same rule as ``LoginThrottle`` (5
failures within 5 minutes, per account and per TCP peer), counted in the ``login_failure`` table so that a
replica behind a balancer sees the failures the others saw. One small write per failure; a success forgets the
account's failures. Keys are stored as SHA-256 digests, so the table holds no username or address.
"""

from __future__ import annotations

from talaria.canonical import sha256_hex
from talaria.clock import Clock
from talaria.limits import LOGIN_MAX_FAILURES, LOGIN_WINDOW_S
from talaria.store.interface import Store


def _key(kind: str, value: str) -> str:
    return sha256_hex(f"{kind}:{value}")


class SharedLoginThrottle:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    def retry_after(self, *, username: str, peer: str) -> int | None:
        """Seconds until an attempt is allowed again, or None when it is allowed now."""
        now = self._clock.now_ms()
        since = now - LOGIN_WINDOW_S * 1000
        waits = []
        with self._store.read() as tx:
            for key in (_key("user", username), _key("peer", peer)):
                rows = tx.all("login_failure_recent", key=key, since=since, limit=LOGIN_MAX_FAILURES)
                if len(rows) >= LOGIN_MAX_FAILURES:  # the oldest of the newest five leaves the window first
                    waits.append(int(rows[-1]["at"]) + LOGIN_WINDOW_S * 1000 - now)
        if not waits:
            return None
        return max(1, -(-max(waits) // 1000))

    def failed(self, *, username: str, peer: str) -> None:
        now = self._clock.now_ms()
        with self._store.write() as tx:
            tx.run("login_failure_prune", before=now - LOGIN_WINDOW_S * 1000)
            for key in (_key("user", username), _key("peer", peer)):
                tx.run("login_failure_insert", key=key, at=now)

    def succeeded(self, *, username: str) -> None:
        with self._store.write() as tx:
            tx.run("login_failure_forget", key=_key("user", username))
