"""Waiting with a time limit without losing a cancel.

``asyncio.wait_for`` on Python 3.11 (fixed in 3.12) returns the awaited result when a cancel of the waiting task
arrives in the same turn of the event loop as that result: the cancel is dropped, and a loop meant to stop (a
dispatcher, a turn, a runner stopping) runs on. ``within`` waits under ``asyncio.timeout``, which keeps both. The
standard library only: the runner imports it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """``awaitable``'s result, or ``TimeoutError`` once ``seconds`` passed (the awaitable is then cancelled)."""
    async with asyncio.timeout(seconds):
        return await awaitable
