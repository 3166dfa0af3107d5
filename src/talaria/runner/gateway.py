"""Gateway channels on the runner (runner-protocol.md 7.2-7.4, 10, and the channel part of the local disconnect,
5.2): ``gateway.open``, ``gateway.rpc`` (rules in ``gateway_rpc``), ``gateway.close`` and event forwarding.

- Opening: the ``connectionId`` is a UUID neither tombstoned nor in use (``runner_command_forbidden``); at most 64
  channels (``runner_busy``); the Hermes WebSocket gets the session token (one more try after a refused upgrade)
  and 20 s for ``gateway.ready`` (``hermes_unavailable``). The reply is ``{ok: true}`` only if the agent's
  disconnect counter still has the value it had when the command arrived and the channel was not closed meanwhile;
  otherwise the WebSocket is closed and the reply is ``runner_connection_closed``.
- Events: decided synchronously as they arrive (so ownership and running marks follow Hermes' order exactly), then
  posted one at a time per channel, in arrival order, under the epoch of the channel's ``gateway.open``. Only a
  frame without ``session_id`` or of a session owned by the channel is forwarded, reduced to ``type``,
  ``session_id`` and ``payload``. ``gateway.ready`` is part of the handshake and is not forwarded.
- Closing (``gateway.close``, a 410 on an event post, an oversized event, a local disconnect): ownership ends at
  once (the ``on_session_closed`` hooks run), no further event is posted, running sessions get
  ``session.interrupt`` with at most 3 s in total to answer, then the WebSocket closes and the id is tombstoned.
  When Hermes closes the WebSocket, the frames already received are posted, then ``{connectionId, closed: true}``.
  After an oversized event the runner also posts ``{connectionId, closed: true}``, so that the hub's side of the
  connection ends too.
- Any event post failure other than 410 triggers the agent's full local disconnect (``on_hub_failure``).
- Opened while the hub echoes ``failover-v1``, a channel numbers its event posts (``seq`` 1, 2, …, the close marker
  included); the hub stores each once and answers 409 ``runner_event_gap`` for a gap, which closes it like a 410.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

from talaria.hermes.auth import HermesUnavailable
from talaria.hermes.rest import HermesRest
from talaria.hermes.ws import READY_TIMEOUT_S, AuthRefused, HermesChannel
from talaria.runner.errors import CommandError
from talaria.runner.gateway_channel import (
    INTERRUPT_WAIT_S,
    LOST,
    MAX_CHANNELS,
    MAX_EVENT_BODY_BYTES,
    Channel,
    Frame,
    Lost,
    Ownership,
    Tombstones,
)
from talaria.runner.gateway_rpc import ALLOWED, RpcRules, connection_closed, forbidden, record_session
from talaria.runner.hub_client import HubClient, HubError
from talaria.runner.receipts import Receipts

UUID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
RUN_ENDS: Final = frozenset({"message.complete", "run.completed", "run.failed"})
MAX_TYPE_CHARS: Final = 200

_log = logging.getLogger("talaria.runner.gateway")


class Gateways:
    def __init__(
        self,
        *,
        hub: HubClient,
        receipts: Receipts,
        allowed_profiles: tuple[str, ...],
        hermes_url: str,
        rest: Callable[[], HermesRest],
        disconnects: Callable[[], int],
        on_hub_failure: Callable[[HubError], Awaitable[None]],
    ) -> None:
        self.hub = hub
        self.receipts = receipts
        self.hermes_url = hermes_url
        self.rest = rest
        self.disconnects = disconnects
        self.on_hub_failure = on_hub_failure
        self.channels: dict[str, Channel] = {}
        self.tombstones = Tombstones()
        self.ownership = Ownership()
        self.rules = RpcRules(self.ownership, receipts, allowed_profiles, rest)
        self._background: set[asyncio.Task[None]] = set()

    # --- for the grants module --------------------------------------------------------------------------------

    @property
    def on_session_closed(self) -> list[Callable[[str], None]]:
        """Hooks called with a runtime session id when its owning channel closes (once per id and close)."""
        return self.ownership.on_session_closed

    def profile_of(self, runtime_id: str) -> str | None:
        """The profile of an owned runtime session id (the owning channel's record), else None."""
        channel = self.ownership.owner(runtime_id)
        return channel.sessions.get(runtime_id) if channel is not None else None

    def stored_of(self, runtime_id: str) -> str | None:
        """The latest stored session id known for an owned runtime session id, else None."""
        channel = self.ownership.owner(runtime_id)
        return channel.stored.get(runtime_id) if channel is not None else None

    # --- gateway.open (7.2, 10.1) -------------------------------------------------------------------------------

    async def open(self, payload: dict[str, Any], *, epoch: str, counter: int) -> dict[str, bool]:
        keys = {"connectionId", "cleanupOnly", "recovery"}  # recovery: drain-v1 (operations.md 3.2)
        if not set(payload) <= keys or not isinstance(payload.get("connectionId"), str):
            raise forbidden("malformed gateway.open payload")
        cleanup_only = payload.get("cleanupOnly", False)
        if not isinstance(cleanup_only, bool) or not isinstance(payload.get("recovery", False), bool):
            raise forbidden("malformed gateway.open payload")
        connection_id: str = payload["connectionId"]
        if not UUID.match(connection_id) or connection_id in self.channels or connection_id in self.tombstones:
            raise forbidden("this connection id is not a new UUID")
        if len(self.channels) >= MAX_CHANNELS:
            raise CommandError("runner_busy", "this node has 64 gateway connections open")
        channel = Channel(connection_id, cleanup_only, epoch, numbered=self.hub.failover)
        self.channels[connection_id] = channel
        if self.disconnects() != counter:
            self._drop(channel)
            raise connection_closed()
        try:
            ws = await self._connect(channel)
        except HermesUnavailable as exc:
            self._drop(channel)
            raise CommandError("hermes_unavailable", str(exc)) from None
        except BaseException:
            self._drop(channel)
            raise
        if channel.closed or self.disconnects() != counter:
            self._drop(channel)
            await ws.close()
            raise CommandError("runner_connection_closed", "the gateway connection was closed while it opened")
        channel.ws = ws
        channel.forwarder = asyncio.get_running_loop().create_task(self._forward(channel))
        return {"ok": True}

    async def _connect(self, channel: Channel) -> HermesChannel:
        rest = self.rest()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        for attempt in range(2):
            credential = await rest.auth.ws_credential()
            try:
                return await HermesChannel.connect(
                    self.hermes_url,
                    credential,
                    on_event=lambda params: self._on_event(channel, params),
                    on_lost=lambda: self._on_lost(channel),
                    ready_timeout=max(0.0, deadline - loop.time()),
                )
            except AuthRefused:
                if attempt == 1:
                    raise
                rest.auth.invalidate()  # Hermes may have restarted with a new token: authenticate again once
        raise HermesUnavailable("Hermes refused the runner's credential")  # pragma: no cover - loop returns

    def _drop(self, channel: Channel) -> None:
        """Forget a channel that never opened (ownership released, id tombstoned)."""
        self.ownership.release(channel)
        self._finish(channel)

    # --- gateway.rpc (7.3, 10.2, 10.3) -----------------------------------------------------------------------

    async def rpc(self, payload: dict[str, Any]) -> Any:
        if set(payload) != {"connectionId", "method", "params"}:
            raise forbidden("malformed gateway.rpc payload")
        connection_id, method, params = payload["connectionId"], payload["method"], payload["params"]
        if not isinstance(connection_id, str) or not isinstance(method, str) or not isinstance(params, dict):
            raise forbidden("malformed gateway.rpc payload")
        if method not in ALLOWED:
            raise forbidden(f"{method} is not on the runner's gateway allow-list")
        channel = self.channels.get(connection_id)
        if channel is None:
            raise connection_closed()
        return await self.rules.call(channel, method, params)

    # --- gateway.close (7.4, 10.5) and the local disconnect (5.2) ---------------------------------------------

    async def close(self, payload: dict[str, Any]) -> dict[str, bool]:
        if set(payload) != {"connectionId"} or not isinstance(payload["connectionId"], str):
            raise forbidden("malformed gateway.close payload")
        connection_id: str = payload["connectionId"]
        channel = self.channels.get(connection_id)
        if channel is None:
            if UUID.match(connection_id):
                self.tombstones.add(connection_id)  # a close that overtook its open: the open must not revive it
            return {"ok": True}
        await asyncio.shield(self._begin_close(channel, deadline=self._interrupt_deadline()))
        return {"ok": True}

    async def close_all(self) -> None:
        """Local disconnect: every channel closes (interrupts answered within 3 s in total), no further events."""
        deadline = self._interrupt_deadline()
        closing = [self._begin_close(channel, deadline=deadline) for channel in list(self.channels.values())]
        if closing:
            await asyncio.shield(asyncio.gather(*closing, return_exceptions=True))

    @staticmethod
    def _interrupt_deadline() -> float:
        return asyncio.get_running_loop().time() + INTERRUPT_WAIT_S

    def _begin_close(self, channel: Channel, *, deadline: float) -> asyncio.Task[None]:
        """Close once: release ownership, stop posting, forget the id; then interrupt and close the WebSocket."""
        if channel.closing is None:
            running = sorted(channel.running)
            self.ownership.release(channel)
            self._finish(channel)
            forwarder = channel.forwarder
            if forwarder is not None and forwarder is not asyncio.current_task() and not forwarder.done():
                forwarder.cancel()
            channel.closing = asyncio.get_running_loop().create_task(self._close_ws(channel, running, deadline))
        return channel.closing

    async def _close_ws(self, channel: Channel, running: list[str], deadline: float) -> None:
        ws = channel.ws
        if ws is None:
            return  # still opening: the open sees the channel closed and closes its WebSocket itself
        if running and not ws.closed:
            loop = asyncio.get_running_loop()
            await asyncio.gather(
                *(self._interrupt(ws, runtime_id, max(0.0, deadline - loop.time())) for runtime_id in running)
            )
        await ws.close()

    @staticmethod
    async def _interrupt(ws: HermesChannel, runtime_id: str, timeout: float) -> None:
        with contextlib.suppress(Exception):  # RpcError, RpcTimeout, ChannelClosed: the socket closes anyway
            await ws.request("session.interrupt", {"session_id": runtime_id}, timeout=timeout)

    def _finish(self, channel: Channel) -> None:
        if self.channels.get(channel.id) is channel:
            del self.channels[channel.id]
        self.tombstones.add(channel.id)

    # --- events (10.4) ------------------------------------------------------------------------------------------

    def _on_event(self, channel: Channel, params: dict[str, Any]) -> None:
        """A Hermes event, in arrival order: update the marks of an owned session and queue the frame."""
        if channel.closed:
            return
        kind = params.get("type")
        session_id = params.get("session_id")
        if not isinstance(kind, str) or not 1 <= len(kind) <= MAX_TYPE_CHARS:
            return
        frame: dict[str, Any] = {"type": kind}
        recorded: asyncio.Task[None] | None = None
        if session_id is not None:
            if not channel.owns(session_id):
                return
            assert isinstance(session_id, str)
            frame["session_id"] = session_id
            recorded = self._note(channel, session_id, kind, params.get("payload"))
        if "payload" in params:
            frame["payload"] = params["payload"]
        channel.queue.put_nowait(Frame(frame, recorded))

    def _note(self, channel: Channel, session_id: str, kind: str, payload: Any) -> asyncio.Task[None] | None:
        if kind in RUN_ENDS:
            channel.running.discard(session_id)
            channel.clarify.pop(session_id, None)
        elif kind == "clarify.request" and isinstance(payload, dict) and isinstance(payload.get("request_id"), str):
            channel.clarify.setdefault(session_id, set()).add(payload["request_id"])
        elif kind == "session.info" and isinstance(payload, dict):
            stored = payload.get("stored_session_id")
            if isinstance(stored, str) and stored and channel.stored.get(session_id) != stored:
                channel.stored[session_id] = stored
                task = asyncio.get_running_loop().create_task(
                    record_session(self.receipts, stored, channel.sessions[session_id])
                )
                self._background.add(task)
                task.add_done_callback(self._background.discard)
                return task
        return None

    def _on_lost(self, channel: Channel) -> None:
        """Hermes closed the WebSocket (or it failed): the channel ends; what was received is still posted."""
        if channel.closed:
            return
        self.ownership.release(channel)
        channel.queue.put_nowait(LOST)

    async def _forward(self, channel: Channel) -> None:
        try:
            await self._forward_all(channel)
        except Exception as exc:  # a bug must not leave the channel half alive: close it like a 410
            _log.error("gateway_forwarder_failed", extra={"connection": channel.id, "error": type(exc).__name__})
            await self._begin_close(channel, deadline=self._interrupt_deadline())

    async def _forward_all(self, channel: Channel) -> None:
        while True:
            item = await channel.queue.get()
            if isinstance(item, Lost):
                await self._post_closed(channel)
                self._finish(channel)
                return
            if item.recorded is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(item.recorded)
            body = {"connectionId": channel.id, "frame": item.frame}
            if len(json.dumps(body)) > MAX_EVENT_BODY_BYTES:
                _log.warning("gateway_event_too_large", extra={"connection": channel.id, "type": item.frame["type"]})
                await self._begin_close(channel, deadline=self._interrupt_deadline())
                await self._post_closed(channel)
                return
            if not await self._post(channel, body):
                return

    async def _post(self, channel: Channel, body: dict[str, Any]) -> bool:
        """Post one event body; False when the channel must stop (410 or ``runner_event_gap``: closed here too;
        else: full disconnect). A numbered channel's posts carry ``seq`` 1, 2, … (the close marker included)."""
        if channel.numbered:
            channel.seq += 1
            if self.hub.failover:  # a feature is used only while the last poll answer listed it
                body = {**body, "seq": channel.seq}
        try:
            await self.hub.post("event", channel.epoch, body)
        except HubError as exc:
            if exc.status == 410 or exc.code == "runner_event_gap":
                await self._begin_close(channel, deadline=self._interrupt_deadline())
            else:
                await self.on_hub_failure(exc)
            return False
        return True

    async def _post_closed(self, channel: Channel) -> None:
        await self._post(channel, {"connectionId": channel.id, "closed": True})
