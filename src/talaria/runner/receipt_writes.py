"""Where the runner's receipt writes run: on the event loop while the disk is fast, else on a thread.

A receipt write is a small SQLite transaction with an fsync (section 9): about 0.1-0.2 ms on a local
SSD. Two of them sit on every command's critical path, and a trip to a worker thread (executor
hand-off, GIL hand-over, the loop's self-pipe wake-up) cost more than the write itself. So writes
run inline while each takes at most ``RECEIPT_INLINE_MAX_S``; the first slower one (a busy or network
disk) moves them to a worker thread, where a slow fsync no longer stalls the poll loop, the gateway
channels or the tool listener. After ``RECEIPT_INLINE_RETURN_AFTER`` consecutive fast writes there
they come back. Either way the write has finished before the caller goes on: order and durability
are the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from talaria.runner import limits

T = TypeVar("T")


class ReceiptWrites:
    def __init__(
        self,
        *,
        inline_max_s: float = limits.RECEIPT_INLINE_MAX_S,
        return_after: int = limits.RECEIPT_INLINE_RETURN_AFTER,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.inline_max_s = inline_max_s
        self.timer = timer  # what a write's duration is measured with (tests pass their own)
        self.return_after = return_after
        self.inline = True
        self._fast_in_a_row = 0

    async def run(self, write: Callable[[], T]) -> T:
        if self.inline:
            started = self.timer()
            try:
                return write()
            finally:
                if self.timer() - started > self.inline_max_s:
                    self.inline, self._fast_in_a_row = False, 0
        started = self.timer()
        try:
            return await asyncio.to_thread(write)
        finally:
            if self.timer() - started > self.inline_max_s:
                self._fast_in_a_row = 0
            else:
                self._fast_in_a_row += 1
                if self._fast_in_a_row >= self.return_after:
                    self.inline = True
