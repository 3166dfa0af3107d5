"""Receipt writes run on the loop while fast, on a worker thread after a slow one, and come back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from talaria.runner.receipt_writes import ReceiptWrites


def where(delay: float = 0.0) -> int:
    time.sleep(delay)
    return threading.get_ident()


def test_fast_writes_run_on_the_loop_thread() -> None:
    async def go() -> list[int]:
        writes = ReceiptWrites(inline_max_s=0.05, timer=lambda: 0.0)  # every write measures as instant
        return [await writes.run(where) for _ in range(5)]

    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    assert asyncio.run(go()) == [loop_thread] * 5


def test_a_slow_write_moves_the_next_ones_to_a_thread_until_enough_are_fast_again() -> None:
    now = [0.0]  # the writes' durations are measured on this clock, whatever the machine's load

    def write_taking(seconds: float) -> int:
        now[0] += seconds
        return threading.get_ident()

    async def go() -> tuple[list[bool], list[bool]]:
        writes = ReceiptWrites(inline_max_s=0.01, return_after=3, timer=lambda: now[0])
        me = threading.get_ident()
        inline_flags = []
        on_loop = []
        for seconds in (0.0, 0.03, 0.0, 0.03, 0.0, 0.0, 0.0, 0.0):
            inline_flags.append(writes.inline)
            on_loop.append(await writes.run(lambda s=seconds: write_taking(s)) == me)
        return inline_flags, on_loop

    inline_flags, on_loop = asyncio.run(go())
    # the slow 2nd write ran inline, then moved writes off; the slow 4th reset the count of fast ones;
    # three fast ones in a row (5th-7th) brought the 8th back onto the loop
    assert inline_flags == [True, True, False, False, False, False, False, True]
    assert on_loop == inline_flags


@pytest.mark.parametrize("inline", [True, False])
def test_a_failing_write_raises_to_the_caller_in_either_mode(inline: bool) -> None:
    def fail() -> None:
        raise OSError("disk full")

    async def go() -> None:
        writes = ReceiptWrites()
        writes.inline = inline
        await writes.run(fail)

    with pytest.raises(OSError, match="disk full"):
        asyncio.run(go())
