"""Chat's kept channels (chat.md 5.3 step 4): after a completed turn the conversation's gateway channel, with its
live Hermes session, stays open for ``chat.channel_idle_s`` so that the next turn skips ``gateway.open`` and
``session.resume``. A kept channel is closed at once on archive, on an access change, on a node switch, when the
next turn cannot use it (another account version, the channel closed by the runner or Hermes, another stored
session; on PostgreSQL replicas also the session owned by another channel now, ADR 0067), when its runner has
``KEPT_PER_RUNNER`` others idle, when its runner starts to drain, and when the hub stops. It lives on the hub's loop;
the ``close_*`` entries may be called from any thread."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog

from talaria.errors import TalariaError
from talaria.hub.runners.channels import Channels
from talaria.hub.runners.connection_state import AccountRef, Gateway
from talaria.timeouts import within

log = structlog.get_logger("talaria.chat")

KEPT_PER_RUNNER: Final = 16  # idle channels per runner (runner-protocol.md 14 allows 64 open ones)
# how long a next turn waits for the previous turn's channel to be kept or closed: the end-of-turn session.info is
# read for at most 1 s after the end (chat.md 5.3 step 10), and closing asks the runner
SETTLE_WAIT_S: Final = 5.0


@dataclass
class Kept:
    """An idle channel and the live session of ``conversation_id`` in it."""

    conversation_id: str
    bot_id: str
    account: AccountRef
    gateway: Gateway
    runtime_id: str
    stored_id: str | None
    timer: asyncio.TimerHandle | None = None


class KeptChannels:
    def __init__(self, channels: Channels, idle_s: float) -> None:
        self.channels = channels
        self.idle_s = idle_s
        self._kept: dict[str, Kept] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._settling: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def settling(self, conversation_id: str) -> asyncio.Event:
        """A turn of ``conversation_id`` holds a channel until ``release``. On the loop."""
        event = asyncio.Event()
        self._settling[conversation_id] = event
        return event

    def release(self, conversation_id: str, event: asyncio.Event) -> None:
        """The turn's channel is kept or closed now."""
        event.set()
        if self._settling.get(conversation_id) is event:
            del self._settling[conversation_id]

    async def settled(self, conversation_id: str) -> None:
        """Wait (at most ``SETTLE_WAIT_S``) until the conversation's previous turn has kept or closed its channel:
        its end is stored before that, so the next turn may start while the channel still reads the end-of-turn
        ``session.info``, and a prompt Hermes got before it would find the session still busy."""
        event = self._settling.get(conversation_id)
        if event is None:
            return
        with contextlib.suppress(TimeoutError):
            await within(event.wait(), SETTLE_WAIT_S)

    def keep(self, kept: Kept) -> None:
        """On the loop, after the turn's end was stored: keep its channel for ``idle_s``."""
        self._loop = asyncio.get_running_loop()
        self._drop(self._kept.pop(kept.conversation_id, None))
        idle = [k for k in self._kept.values() if k.gateway.runner_id == kept.gateway.runner_id]
        for oldest in idle[: max(0, len(idle) - KEPT_PER_RUNNER + 1)]:
            self._drop(self._kept.pop(oldest.conversation_id))
        kept.timer = self._loop.call_later(self.idle_s, self._expire, kept)
        self._kept[kept.conversation_id] = kept

    def take(self, conversation_id: str, runner_id: str, account: AccountRef, stored_id: str | None) -> Kept | None:
        """The conversation's kept channel, if the next turn (as ``account`` on ``runner_id``, resuming
        ``stored_id``) may use it; any other kept channel of the conversation is closed. On the loop."""
        kept = self._kept.pop(conversation_id, None)
        if kept is None:
            return None
        if kept.timer is not None:
            kept.timer.cancel()
        usable = self._drain(kept) and kept.gateway.runner_id == runner_id and kept.account == account
        if not usable or kept.stored_id != stored_id:
            self._drop(kept)
            return None
        return kept

    def discard(self, kept: Kept) -> None:
        """Close a channel ``take`` gave out that the turn will not use after all. On the loop."""
        self._drop(kept)

    def close_conversation(self, conversation_id: str) -> None:
        self._close_where(lambda kept: kept.conversation_id == conversation_id)

    def close_bot(self, bot_id: str) -> None:
        self._close_where(lambda kept: kept.bot_id == bot_id)

    def close_runner(self, runner_id: str) -> None:
        """The runner drains (operations.md 3.2): its idle channels close, so that it can be drained."""
        self._close_where(lambda kept: kept.gateway.runner_id == runner_id)

    def close_account(self, tenant: str, username: str) -> None:
        self._close_where(lambda kept: (kept.account.tenant, kept.account.username) == (tenant, username))

    async def close_all(self) -> None:
        for kept in list(self._kept.values()):
            self._drop(kept)
        self._kept.clear()
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=5)

    def _close_where(self, chosen: Callable[[Kept], bool]) -> None:
        """Close the kept channels ``chosen`` picks; from any thread."""
        loop = self._loop
        if loop is None:
            return

        def close() -> None:
            for kept in [k for k in self._kept.values() if chosen(k)]:
                self._drop(self._kept.pop(kept.conversation_id))

        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing is kept any more
            loop.call_soon_threadsafe(close)

    def _expire(self, kept: Kept) -> None:
        if self._kept.get(kept.conversation_id) is kept:
            self._drop(self._kept.pop(kept.conversation_id))

    def _drain(self, kept: Kept) -> bool:
        """Read what the idle channel received: a late ``session.info`` moves the stored id; False if it closed."""
        events = kept.gateway.events
        while not events.empty():
            frame = events.get_nowait()
            if frame is None:
                return False
            payload = frame.get("payload")
            info = frame.get("type") == "session.info" and frame.get("session_id") in (None, kept.runtime_id)
            if info and isinstance(payload, dict) and isinstance(payload.get("stored_session_id"), str):
                kept.stored_id = payload["stored_session_id"]
        return kept.gateway.open

    def _drop(self, kept: Kept | None) -> None:
        if kept is None:
            return
        if kept.timer is not None:
            kept.timer.cancel()
        task = asyncio.get_running_loop().create_task(self._close(kept.gateway))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, gateway: Gateway) -> None:
        try:
            await self.channels.close_gateway(gateway)
        except TalariaError as exc:
            log.info("kept_channel_close_failed", code=exc.code)
