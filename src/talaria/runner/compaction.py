"""The receipts' compaction timer (runner-protocol.md 9; ADR 0019): a quiet runner compacts too.

Compaction also runs when the receipts file opens and after every 256 handled commands; on a runner that
handles few commands those alone would keep replies for days. The timer runs ``Receipts.compact`` every
``RECEIPT_COMPACT_INTERVAL_S`` (60 s). Every age is measured on the receipts' injected clock; the interval only
paces the loop, so a test injects a few milliseconds, advances a ``ManualClock`` and awaits ``next_pass()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable

from talaria.runner import limits
from talaria.runner.receipts import Compacted, Receipts, ReceiptsError


class Compactor:
    """Runs ``receipts.compact()`` every ``interval_s`` seconds on the running loop, each pass on a worker thread
    (a slow disk never stalls the poll loop).

    ``start()`` (on a running loop) and ``stop()`` are idempotent, ``stop()`` is safe before ``start()``, and a
    stopped timer may start again. A pass the file refuses is reported to ``on_failure`` (the runner stops) and
    ends the loop; no exception leaves the timer. ``passes`` counts completed passes.
    """

    def __init__(
        self,
        receipts: Receipts,
        *,
        interval_s: float = limits.RECEIPT_COMPACT_INTERVAL_S,
        on_failure: Callable[[ReceiptsError], None],
    ) -> None:
        self.receipts = receipts
        self.interval_s = interval_s
        self._on_failure = on_failure
        self._task: asyncio.Task[None] | None = None
        self._begun = 0
        self.passes = 0
        self._waiters: list[tuple[int, asyncio.Future[Compacted]]] = []

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self.running:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="receipts-compaction")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for _, future in self._waiters:
            future.cancel()
        self._waiters.clear()

    async def next_pass(self) -> Compacted:
        """What the first pass that begins after this call did (its clock reading is later than the call).

        Raises the ``ReceiptsError`` of a pass the file refused (the timer has then ended); cancelled by
        ``stop()``.
        """
        future: asyncio.Future[Compacted] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._begun + 1, future))
        return await future

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._begun += 1
            number = self._begun
            try:
                done = await asyncio.to_thread(self.receipts.compact)
            except ReceiptsError as exc:
                self._settle(sys.maxsize, exc)  # no pass follows: every waiter learns why
                self._on_failure(exc)
                return
            self.passes += 1
            self._settle(number, done)

    def _settle(self, number: int, outcome: Compacted | ReceiptsError) -> None:
        waiting = []
        for target, future in self._waiters:
            if target > number:
                waiting.append((target, future))
            elif not future.done():
                if isinstance(outcome, ReceiptsError):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        self._waiters = waiting
