"""The periodic reaper (lifecycle.md 5): expiry sweep, key and session pruning, the WAL guard."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from talaria.errors import TalariaError

log = structlog.get_logger("talaria.reaper")


class Reaper:
    """Runs ``tick`` every ``interval_s`` on a daemon thread. ``start``/``stop`` are idempotent;
    ``stop`` is safe before ``start``. ``ticks`` counts completed sweeps (tests wait on ``ticked``)."""

    def __init__(self, tick: Callable[[], None], interval_s: float) -> None:
        self._tick = tick
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticked = threading.Event()
        self.ticks = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="talaria-reaper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._tick()
            except TalariaError as exc:
                log.warning("reaper_tick_failed", code=exc.code, error=exc.message)
            except Exception:
                log.exception("reaper_tick_crashed")
            self.ticks += 1
            self.ticked.set()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)
