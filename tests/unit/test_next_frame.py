"""A turn waiting for its channel's next frame is cancelled even when the cancel arrives with a frame (the dispatcher
cancels a job's turn so, and ``asyncio.wait_for`` on Python 3.11 returned the frame and dropped the cancel: the turn
ran on and the job was not cancelled, ``test_an_admin_cancels_a_running_job_from_its_page`` failing in CI)."""

from __future__ import annotations

import asyncio

import pytest

from talaria.hub.runners.connection_state import AccountRef, Gateway
from talaria.hub.turns.driver import next_frame


def gateway() -> Gateway:
    return Gateway("c1", "r1", AccountRef("alice", "default", 1), cleanup_only=False)


def test_a_cancel_arriving_with_a_frame_cancels_the_wait_and_keeps_the_frame() -> None:
    async def main() -> int:
        channel = gateway()
        waiting = asyncio.create_task(next_frame(channel, 5))
        await asyncio.sleep(0)  # waiting on the queue
        channel.events.put_nowait({"type": "message.delta"})  # wakes it ...
        waiting.cancel()  # ... and the cancel comes in the same turn of the loop
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return channel.events.qsize()

    assert asyncio.run(main()) == 1, "the frame stays for the next reader"


def test_the_next_frame_or_a_timeout() -> None:
    async def main() -> tuple[object, bool]:
        channel = gateway()
        channel.events.put_nowait({"type": "message.complete"})
        first = await next_frame(channel, 5)
        try:
            await next_frame(channel, 0.01)
        except TimeoutError:
            return first, True
        return first, False

    assert asyncio.run(main()) == ({"type": "message.complete"}, True)
