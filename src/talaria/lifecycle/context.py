"""What every engine function shares: the store, the clock, the settings, and the write helper."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from talaria.canonical import canonical_json
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.settings import Settings
from talaria.store.interface import Store, Tx

T = TypeVar("T")
# Called after COMMIT with (signal, job_id): "enqueued", "cancel_requested", "terminal", "requeued".
Listener = Callable[[str, str], None]


@dataclass(frozen=True)
class IdemRequest:
    """An ``Idempotency-Key`` as the engine sees it: the key's hash and the parsed body's digest."""

    key_hash: str
    request_digest: str


@dataclass(frozen=True)
class OpResult:
    """A Runtime-shaped answer: status, canonical JSON body bytes, and whether it was a replay."""

    status: int
    body: bytes
    replayed: bool = False

    @property
    def data(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value

    @classmethod
    def of(cls, data: dict[str, Any]) -> OpResult:
        return cls(200, canonical_json(data))


@dataclass(frozen=True)
class Refusal:
    """Returned from inside a write transaction: commit what was done (an expiry), then raise."""

    error: TalariaError


class RowChanged(Exception):
    """A conditional update matched no row: re-read and decide again."""


@dataclass
class Context:
    store: Store
    clock: Clock
    settings: Settings
    listeners: list[Listener] = field(default_factory=list)

    def write(self, fn: Callable[[Tx, int, list[tuple[str, str]]], T | Refusal]) -> T:
        """Run ``fn(tx, now_ms, signals)`` in one write transaction; raise a Refusal after COMMIT."""
        for _ in range(3):
            signals: list[tuple[str, str]] = []
            try:
                with self.store.write() as tx:
                    out = fn(tx, self.clock.now_ms(), signals)
            except RowChanged:
                continue
            self._emit(signals)
            if isinstance(out, Refusal):
                raise out.error
            return out
        raise TalariaError("internal_error", "the job kept changing under the transaction")

    def _emit(self, signals: list[tuple[str, str]]) -> None:
        for signal, job_id in signals:
            for listener in list(self.listeners):
                listener(signal, job_id)
