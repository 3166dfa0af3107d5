"""What every entry point shares: the store, the clock, the settings, and the write helper."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from talaria.clock import Clock
from talaria.errors import RETRIED_CONFLICTS, StoreConflict, TalariaError
from talaria.settings import Settings
from talaria.store.interface import Store, Tx

T = TypeVar("T")
# Called after COMMIT with (signal, job_id): "enqueued", "cancel_requested", "terminal", "requeued".
Listener = Callable[[str, str], None]
Signals = list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class IdemRequest:
    """An ``Idempotency-Key`` as the engine sees it: the key's hash and the parsed body's digest."""

    key_hash: str
    request_digest: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """Returned from inside a write transaction: commit what was done (an expiry), then raise."""

    error: TalariaError


class RowChanged(Exception):
    """A conditional update matched no row: re-read and decide again."""


class Context:
    """The store, clock and settings the entry points are bound to (``Engine`` is one)."""

    def __init__(self, store: Store, clock: Clock, settings: Settings) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings
        self.listeners: list[Listener] = []

    def write(self, fn: Callable[[Tx, int, Signals], T | Refusal]) -> T:
        """Run ``fn(tx, now_ms, signals)`` in one write transaction; raise a Refusal after COMMIT. A row that
        changed under a conditional update, or a transaction PostgreSQL gave up for a concurrent one (40001, 40P01),
        runs ``fn`` again, at most 3 times in all (then 500, or 503 ``store_unavailable``)."""
        for attempt in range(1, RETRIED_CONFLICTS + 1):
            signals: Signals = []
            try:
                with self.store.write() as tx:
                    out = fn(tx, self.clock.now_ms(), signals)
            except RowChanged:
                continue
            except StoreConflict:
                if attempt == RETRIED_CONFLICTS:
                    raise
                continue
            if signals:
                self._emit(signals)
            if isinstance(out, Refusal):
                raise out.error
            return out
        raise TalariaError("internal_error", "the job kept changing under the transaction")

    def _emit(self, signals: Signals) -> None:
        for signal, job_id in signals:
            for listener in list(self.listeners):
                listener(signal, job_id)
