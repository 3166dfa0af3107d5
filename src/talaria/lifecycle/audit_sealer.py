"""The PostgreSQL audit sealer's loop (scale.md 2.4): ``audit.seal_all`` every ``audit.seal_interval_ms`` and
soon after each audited commit of this process (``poke``, wired to the store's commit of
``audit_pending_insert``), while ``may_seal`` says so: a hub replica's rounds run only while it holds the
``audit_sealer`` role lease (scale.md 3.6). Any process sealing would be correct (the head's row lock orders them);
the lease only saves work, so the last round at stop seals whatever the lease says.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import structlog

from talaria.clock import Clock, SystemClock
from talaria.errors import TalariaError
from talaria.lifecycle.audit import seal_all
from talaria.store.interface import Store

log = structlog.get_logger("talaria.audit")

STOP_ATTEMPTS = 3


class AuditSealer:
    """``start``/``stop`` are idempotent; ``stop`` seals once more (up to ``STOP_ATTEMPTS`` rounds while the store
    fails), so a clean stop leaves nothing this process committed unsealed. ``sealed`` counts the events this
    sealer chained; ``sealed_some`` is set after a round that chained any (tests wait on it). Each sealed event's
    lag, from its ``occurred_at`` to its seal's commit, goes to ``observe_lag`` (the hub's
    ``talaria_audit_seal_lag_seconds``) and the latest ``lags_kept`` of them to ``lags_ms`` (``(occurred_at, lag)``
    pairs, for the benchmarks' percentiles)."""

    def __init__(
        self, store: Store, interval_ms: int, *, may_seal: Callable[[], bool] = lambda: True,
        clock: Clock | None = None, observe_lag: Callable[[float], None] = lambda seconds: None, lags_kept: int = 0,
    ) -> None:  # fmt: skip
        self._store = store
        self._may_seal = may_seal
        self._clock = clock or SystemClock()
        self._observe_lag = observe_lag
        self.lags_ms: deque[tuple[int, int]] = deque(maxlen=lags_kept)  # (occurred_at, lag), ms; a hub keeps none
        self._interval_s = interval_ms / 1000
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.sealed = 0
        self.sealed_some = threading.Event()

    def watch(self) -> None:
        """Seal soon after every audited commit through this store."""
        self._store.on_commit_of("audit_pending_insert", self.poke)

    def poke(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="talaria-audit-sealer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            if self._may_seal():
                self.seal_once(wait=False)  # another sealer holding the head is sealing: no queue behind it

    def seal_once(self, *, wait: bool = True) -> int | None:
        """One round; returns how many events it chained, or None when the store failed part-way (the batches
        committed before the failure are counted; the next round tries again, nothing is lost). ``wait=False``:
        a head another sealer holds ends the round."""
        try:
            return seal_all(self._store, committed=self._count, wait=wait)
        except TalariaError as exc:  # the store is away or a statement timed out behind another sealer
            log.warning("audit_seal_failed", code=exc.code, error=exc.message)
            return None

    def _count(self, occurred: list[int]) -> None:
        now = self._clock.now_ms()
        for at in occurred:
            lag = max(0, now - at)  # the replicas' clocks agree to within a second (scale.md 1)
            self.lags_ms.append((at, lag))
            self._observe_lag(lag / 1000)
        self.sealed += len(occurred)
        if occurred:
            self.sealed_some.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)
            for _ in range(STOP_ATTEMPTS):  # a round that failed (a timeout behind busy sealers) is tried again
                if self.seal_once() is not None:
                    return
