"""Rate-limited ``security_event`` rows for Runtime API rejections (lifecycle.md 8).

At most ``security.event_rate_per_minute`` rows per (peer, code) per minute, counted in memory per
hub process; the excess is carried in the next row's ``suppressed_count``. A failed insert is
logged; the rejection is sent anyway. Security events never enter the audit chain.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import structlog

from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.store.interface import Store

log = structlog.get_logger("talaria.security")


@dataclass(frozen=True)
class Rejection:
    peer: str
    method: str
    route: str
    status: int
    code: str
    claimed_principal: str | None = None
    claimed_tenant: str | None = None
    job: str | None = None
    detail: str | None = None


class SecurityEvents:
    def __init__(self, store: Store, clock: Clock, rate_per_minute: int) -> None:
        self._store = store
        self._clock = clock
        self._rate = rate_per_minute
        self._lock = threading.Lock()
        # (peer, code) -> [minute, rows written this minute, suppressed since the last row]
        self._windows: dict[tuple[str, str], list[int]] = {}

    def record(self, rejection: Rejection) -> bool:
        """Write a row unless the (peer, code) budget of this minute is spent; True when written."""
        now = self._clock.now_ms()
        minute = now // 60_000
        with self._lock:
            window = self._windows.get((rejection.peer, rejection.code))
            if window is None or window[0] != minute:
                suppressed = window[2] if window else 0
                window = [minute, 0, suppressed]
                self._windows[(rejection.peer, rejection.code)] = window
            if window[1] >= self._rate:
                window[2] += 1
                return False
            window[1] += 1
            suppressed, window[2] = window[2], 0
        try:
            with self._store.write() as tx:
                tx.run(
                    "security_event_insert",
                    id=mint("sec", now),
                    now=now,
                    peer=rejection.peer,
                    method=rejection.method,
                    route=rejection.route,
                    status=rejection.status,
                    code=rejection.code,
                    claimed_principal=_clip(rejection.claimed_principal),
                    claimed_tenant=_clip(rejection.claimed_tenant),
                    job=_clip(rejection.job),
                    detail=_clip(rejection.detail),
                    suppressed_count=suppressed,
                )
        except TalariaError as exc:
            log.error("security_event_insert_failed", code=exc.code, rejected_code=rejection.code)
            return False
        return True


def _clip(value: str | None, limit: int = 256) -> str | None:
    return value[:limit] if value is not None else None
