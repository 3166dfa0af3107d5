"""The runner's gateway channels (runner-protocol.md 10): one ``Channel`` per hub ``connectionId``, the session
ownership shared by all channels, and the id tombstones. Standard library only; everything runs on the runner's
event loop, so plain dictionaries suffice.

Ownership: a runtime session id is owned by at most one channel, with the profile it was created or resumed under
(runner-protocol.md 10.2). A ``session.resume`` that returns a runtime id owned by another channel moves it to the
resuming channel, with its marks (Hermes moves the session's events to the newest connection, and closing the old
channel must not touch it any more). Ownership ends when the owning channel closes; then every ``on_session_closed``
hook is called with the runtime id (the grants module disposes the session's grants).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from talaria.hermes.ws import HermesChannel

MAX_CHANNELS: Final = 64  # runner_busy
TOMBSTONE_S: Final = 60.0  # ids of closed channels are refused (runner_command_forbidden) at least this long
INTERRUPT_WAIT_S: Final = 3.0  # in total, when closing (10.5) or disconnecting locally (5.2)
MAX_EVENT_BODY_BYTES: Final = 16 * 1024 * 1024  # the hub's POST limit: a larger event closes its channel

_log = logging.getLogger("talaria.runner.gateway")


@dataclass(frozen=True)
class Frame:
    """One event to post: ``frame`` as the hub receives it, and a receipts write to finish first (session.info)."""

    frame: dict[str, Any]
    recorded: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class Lost:
    """Queued after the last frame when Hermes closed the WebSocket: post ``{connectionId, closed: true}``."""


LOST: Final = Lost()


@dataclass(eq=False)
class Channel:
    id: str
    cleanup_only: bool
    epoch: str  # the hub epoch under which gateway.open arrived; its events are posted under it
    ws: HermesChannel | None = None
    closed: bool = False  # no new RPCs; ownership released
    sessions: dict[str, str] = field(default_factory=dict)  # owned runtime id -> profile
    stored: dict[str, str] = field(default_factory=dict)  # owned runtime id -> stored id
    running: set[str] = field(default_factory=set)
    submitting: set[str] = field(default_factory=set)  # a prompt.submit is in flight
    clarify: dict[str, set[str]] = field(default_factory=dict)  # runtime id -> pending clarify request ids
    queue: asyncio.Queue[Frame | Lost] = field(default_factory=asyncio.Queue)
    forwarder: asyncio.Task[None] | None = None
    closing: asyncio.Task[None] | None = None
    numbered: bool = False  # opened while the hub echoed failover-v1: each event post carries its seq
    seq: int = 0  # the last event number posted

    def owns(self, runtime_id: Any) -> bool:
        return not self.closed and isinstance(runtime_id, str) and runtime_id in self.sessions

    def busy(self, runtime_id: str) -> bool:
        return runtime_id in self.running or runtime_id in self.submitting


class Ownership:
    """Which channel owns which runtime session id (one owner at most)."""

    def __init__(self) -> None:
        self.owners: dict[str, Channel] = {}
        self.on_session_closed: list[Callable[[str], None]] = []

    def owner(self, runtime_id: str) -> Channel | None:
        channel = self.owners.get(runtime_id)
        return channel if channel is not None and not channel.closed else None

    def take(self, channel: Channel, runtime_id: str, profile: str, stored: str | None, *, running: bool) -> None:
        """``runtime_id`` becomes owned by ``channel`` under ``profile`` (moved from another channel if needed)."""
        previous = self.owners.get(runtime_id)
        if previous is not None and previous is not channel:
            _forget(previous, runtime_id)
        self.owners[runtime_id] = channel
        channel.sessions[runtime_id] = profile
        if stored:
            channel.stored[runtime_id] = stored
        if running:
            channel.running.add(runtime_id)

    def release(self, channel: Channel) -> None:
        """The channel closed: it owns nothing any more, and each of its sessions' hooks run once."""
        channel.closed = True
        released = list(channel.sessions)
        for runtime_id in released:
            if self.owners.get(runtime_id) is channel:
                del self.owners[runtime_id]
        channel.sessions.clear()
        channel.stored.clear()
        channel.running.clear()
        channel.submitting.clear()
        channel.clarify.clear()
        for runtime_id in released:
            for hook in list(self.on_session_closed):
                try:
                    hook(runtime_id)
                except Exception as exc:  # one hook's bug must not keep the others from running
                    _log.warning("session_closed_hook_failed", extra={"error": type(exc).__name__})


def _forget(channel: Channel, runtime_id: str) -> None:
    channel.sessions.pop(runtime_id, None)
    channel.stored.pop(runtime_id, None)
    channel.running.discard(runtime_id)
    channel.submitting.discard(runtime_id)
    channel.clarify.pop(runtime_id, None)


class Tombstones:
    """Ids refused for at least ``TOMBSTONE_S`` seconds after they were closed (monotonic time)."""

    def __init__(self, seconds: float = TOMBSTONE_S) -> None:
        self.seconds = seconds
        self._until: collections.OrderedDict[str, float] = collections.OrderedDict()

    def add(self, key: str) -> None:
        self._prune()
        self._until.pop(key, None)
        self._until[key] = time.monotonic() + self.seconds

    def __contains__(self, key: object) -> bool:
        self._prune()
        return key in self._until

    def __len__(self) -> int:
        self._prune()
        return len(self._until)

    def _prune(self) -> None:
        now = time.monotonic()
        while self._until:
            key, until = next(iter(self._until.items()))
            if until > now:
                break
            del self._until[key]
