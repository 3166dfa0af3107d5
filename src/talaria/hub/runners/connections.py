"""The in-process runner hub: connection states, the command queue and the long poll (runner-protocol.md
5.1, 6). Everything runs on the hub's event loop; nothing here blocks on the network.

One implementation of the ``RunnerTransport`` seam (``transport.py``), the one hub of a SQLite directory; the
PostgreSQL replicas share theirs in tables (``shared_connections.py``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from talaria.canonical import canonical_json
from talaria.clock import Clock
from talaria.errors import TalariaError, relayed
from talaria.hub.runners import limits
from talaria.hub.runners.connection_state import (
    AccountRef,
    ChannelRow,
    Command,
    CommandView,
    ConnState,
    Gateway,
    Grant,
)
from talaria.hub.runners.transport import (
    Holding,
    Observer,
    connection_gone,
    event_gap,
    gateway_closed,
    refused,
)
from talaria.hub.runners.validity import Validity
from talaria.hub.timings import HubTimings
from talaria.hub.tracing import TRACE_FEATURE, traceparent
from talaria.timeouts import within

log = structlog.get_logger("talaria.runners")


class RunnerHub:
    def __init__(
        self, clock: Clock, validity: Validity, *, observe: Observer | None = None, timings: HubTimings | None = None
    ) -> None:
        self.clock = clock
        self.timings = timings or HubTimings()
        self.validity = validity
        self.hub_epoch = uuid.uuid4().hex
        self.states: dict[str, ConnState] = {}
        self.retired: dict[str, set[str]] = {}
        self.last_seen: dict[str, int] = {}
        self.on_draining: list[Callable[[str], None]] = []
        self.shutting_down = False
        self._observe = observe or (lambda outcome, seconds: None)
        self._watchdog: asyncio.Task[None] | None = None

    # --- gate 3-8 (runner-protocol.md 4) -------------------------------------------------------------------

    async def enter(
        self, runner_id: str, instance: str, *, poll: bool, reset: bool, epoch: str | None, features: str | None,
        version: str | None = None, draining: bool = False,
    ) -> tuple[ConnState, bool]:  # fmt: skip
        """Apply gates 3-8 for one request; returns the state and whether this request created it."""
        state = self.states.get(runner_id)
        if poll and reset and state is not None and state.instance == instance:
            self._disconnect(runner_id, "reset")
            state = None
        if not poll and (state is None or state.instance != instance):
            raise refused("runner_instance_changed")
        retired = self.retired.setdefault(runner_id, set())
        if instance in retired:
            raise refused("runner_instance_retired")
        if poll and state is not None and state.instance != instance:
            if len(retired) >= limits.MAX_RETIRED_INSTANCES:
                raise refused("runner_instance_limit")
            retired.add(state.instance)
            self._disconnect(runner_id, "replaced")
            state = None
        if not poll and state is not None and epoch != state.epoch:
            raise refused("runner_epoch_changed")
        now = self.clock.now_ms()
        created = state is None
        if state is None:
            state = ConnState(runner_id, instance, f"{self.hub_epoch}:{uuid.uuid4()}", created=now, seen=now)
            self.states[runner_id] = state
            log.info("runner_connected", runner_id=runner_id)
        state.seen = now
        self.last_seen[runner_id] = now
        if features is not None:
            state.features = limits.accepted_features(features)
            state.version = version
        if draining and state.draining_since is None:
            self._start_drain(state)
        return state, created

    async def drain(self, runner_id: str) -> bool:
        state = self.states.get(runner_id)
        if state is None:
            return False
        if state.draining_since is None:
            self._start_drain(state)
        return True

    def _start_drain(self, state: ConnState) -> None:
        state.draining_since = self.clock.now_ms()
        log.info("runner_draining", runner_id=state.runner_id)
        if state.waiter is not None and not state.waiter.done():
            state.waiter.set_result("drain")
        for hook in self.on_draining:
            hook(state.runner_id)

    def end_hold(self, runner_id: str) -> None:
        state = self.states.get(runner_id)
        if state is not None and state.waiter is not None and not state.waiter.done():
            state.waiter.set_result("released")

    def draining_count(self) -> int:
        return sum(1 for state in tuple(self.states.values()) if state.draining_since is not None)

    def held_count(self) -> int:
        states = tuple(self.states.values())  # a scrape reads from a worker thread: a copy, taken atomically
        return sum(1 for state in states if state.waiter is not None and not state.waiter.done())

    def accepts_work(self, runner_id: str) -> bool:
        state = self.states.get(runner_id)
        return state is not None and state.draining_since is None

    # --- poll (6.2) ------------------------------------------------------------------------------------------

    async def poll(self, state: ConnState, created: bool) -> dict[str, Any]:
        answer = await self._poll(state, created)
        if state.draining_since is not None and "drain-v1" in state.features:
            answer["drain"] = True
        return answer

    async def _poll(self, state: ConnState, created: bool) -> dict[str, Any]:
        if created:
            return {"epoch": state.epoch, "commands": []}
        if state.waiter is not None and not state.waiter.done():
            state.waiter.set_result("superseded")
        batch = self._take_batch(state)
        if batch:
            return {"epoch": state.epoch, "commands": batch}
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        state.waiter = waiter
        try:
            reason = await within(asyncio.shield(waiter), self._hold_seconds(state))
        except TimeoutError:
            reason = "timeout"
        finally:
            if state.waiter is waiter:
                state.waiter = None
        if reason == "disabled":
            raise TalariaError("runner_unauthorized", "the runner was disabled; register it again")
        if reason == "shutdown":
            raise TalariaError("hub_shutting_down", "the hub is shutting down; retry")
        if self.states.get(state.runner_id) is not state:
            raise TalariaError("runner_instance_changed", "the connection state changed while the poll waited")
        if reason == "superseded":
            return {"epoch": state.epoch, "commands": []}
        state.seen = self.clock.now_ms()
        return {"epoch": state.epoch, "commands": self._take_batch(state)}

    def _hold_seconds(self, state: ConnState) -> float:
        now = self.clock.now_ms()
        hold = float(limits.POLL_HOLD_S)
        for command in state.queue.values():
            hold = min(hold, max(0.0, (command.next_delivery - now) / 1000))
        return hold

    def _take_batch(self, state: ConnState) -> list[dict[str, Any]]:
        now = self.clock.now_ms()
        batch: list[dict[str, Any]] = []
        size = 0
        for command in state.queue.values():
            if command.next_delivery > now:
                continue
            if batch and size + command.size > limits.MAX_BATCH_BYTES:
                break
            size += command.size
            command.delivered += 1
            command.next_delivery = now + limits.REDELIVERY_S * 1000
            batch.append(command.wire(TRACE_FEATURE in state.features))
        return batch

    # --- commands (6.1, 6.3) ---------------------------------------------------------------------------------

    async def send(
        self,
        runner_id: str,
        kind: str,
        payload: dict[str, Any],
        *,
        account: AccountRef | None,
        profile: str | None,
        connection_id: str | None = None,
        grant_id: str | None = None,
        valid: bool | None = None,
        owner_counter: int | None = None,  # one hub owns what it opened: nothing is adopted here
    ) -> Any:
        """Queue one command and wait for its one outcome: the reply, or a TalariaError (6.1)."""
        if not (self.validity.check(account, runner_id, profile) if valid is None else valid):
            raise TalariaError("runner_command_not_admitted", "the account may not do this through this runner")
        state = self.states.get(runner_id)
        if state is None:
            raise TalariaError("runner_offline", "the execution node is not connected")
        if len(state.queue) >= limits.MAX_PENDING_COMMANDS:
            raise TalariaError("runner_busy", "the execution node has 64 commands pending")
        now = self.clock.now_ms()
        deadline = self.timings.grant_bind_deadline_s if kind == "grant.bind" else self.timings.command_deadline_s
        loop = asyncio.get_running_loop()
        command = Command(
            id=str(uuid.uuid4()),
            kind=kind,
            payload=payload,
            expires_at=now + round(deadline * 1000),
            runner_id=runner_id,
            account=account,
            profile=profile,
            size=0,
            enqueued_at=now,
            future=loop.create_future(),
            connection_id=connection_id,
            grant_id=grant_id,
            traceparent=traceparent(),
        )
        command.size = len(canonical_json(command.wire()))
        if command.size > limits.MAX_COMMAND_BYTES:
            raise TalariaError("runner_payload_limit", "the command is larger than 36 MiB")
        if state.pending_bytes + command.size > limits.MAX_PENDING_BYTES:
            raise TalariaError("runner_busy", "the execution node has 64 MiB of commands pending")
        state.queue[command.id] = command
        state.pending_bytes += command.size
        command.timer = loop.call_later(deadline, self._expire, state, command)
        started = time.perf_counter()
        if state.waiter is not None and not state.waiter.done():
            state.waiter.set_result("wake")
        try:
            result = await asyncio.shield(command.future)
        except TalariaError as exc:
            self._observe(exc.code, None)
            raise
        self._observe("ok", time.perf_counter() - started)
        return result

    def _settle(
        self, state: ConnState, command: Command, *, result: Any = None, error: TalariaError | None = None
    ) -> None:
        if state.queue.pop(command.id, None) is None:
            return
        state.pending_bytes -= command.size
        if command.timer is not None:
            command.timer.cancel()
        if command.future.done():
            return
        if error is not None:
            command.future.set_exception(error)
        else:
            command.future.set_result(result)

    def _lost(self, command: Command) -> TalariaError:
        if command.delivered == 0:
            return TalariaError("runner_offline", "the execution node did not take the command; it did not run")
        return TalariaError("runner_command_uncertain", "the command was delivered but no result came; it may have run")

    def _expire(self, state: ConnState, command: Command) -> None:
        self._settle(state, command, error=self._lost(command))

    async def complete(self, state: ConnState, command_id: str, body: dict[str, Any]) -> None:
        """A ``result`` post: the command's one outcome; unknown or settled ids change nothing."""
        command = state.queue.get(command_id)
        if command is None:
            return
        if "error" in body:
            error = body["error"]
            self._settle(
                state, command, error=relayed(error["code"], error["message"][: limits.MAX_ERROR_MESSAGE_CHARS])
            )
        else:
            self._settle(state, command, result=body["result"])

    async def pending_command(self, state: ConnState, command_id: str) -> CommandView | None:
        return state.queue.get(command_id)

    # --- channels (runner-protocol.md 10, 12) -----------------------------------------------------------------

    async def add_channel(self, state: ConnState, channel: Gateway | Grant) -> None:
        if isinstance(channel, Gateway):
            state.gateways[channel.id] = channel
        else:
            state.grants[channel.id] = channel

    async def channel(self, state: ConnState, kind: str, channel_id: str) -> ChannelRow | None:
        if kind == "gateway":
            gateway = state.gateways.get(channel_id)
            if gateway is None or not gateway.open:
                return None
            return ChannelRow(gateway.id, gateway.account, cleanup_only=gateway.cleanup_only, here=gateway)
        grant = state.grants.get(channel_id)
        if grant is None or not grant.open:
            return None
        return ChannelRow(grant.id, grant.account, profile=grant.profile, here=grant)

    async def end_channel(
        self, state: ConnState, kind: str, channel_id: str, *, revoked: bool = False, owner_counter: int | None = None
    ) -> None:
        if kind == "grant":
            grant = state.grants.pop(channel_id, None)
            if grant is not None:
                grant.open = False
            return
        gateway = state.gateways.pop(channel_id, None)
        if gateway is not None and gateway.open:  # its reader hears the end once
            gateway.revoked = gateway.revoked or revoked
            gateway.open = False
            gateway.events.put_nowait(None)
        for command in [c for c in state.queue.values() if c.connection_id == channel_id]:
            if command.kind != "gateway.close":
                self._settle(state, command, error=gateway_closed())

    async def adopt_gateway(
        self, runner_id: str, connection_id: str, account: AccountRef, *, held: Holding, after_seq: int,
        runtime_id: str, profile: str,
    ) -> Gateway | None:  # fmt: skip
        """Never: a gateway of this hub dies with it (a restart makes new epochs), and its own turns keep theirs."""
        return None

    async def revoke_gateway(self, state: ConnState, connection_id: str) -> None:
        gateway = state.gateways.get(connection_id)
        if gateway is not None:
            gateway.revoked = True

    async def describe_grant(self, state: ConnState, grant_id: str, tools: dict[str, Any]) -> None:
        """Nothing: one hub process runs every call with the grant's own executor."""

    async def revoke_grant(self, state: ConnState, grant_id: str) -> None:
        grant = state.grants.get(grant_id)
        if grant is not None:
            grant.revoked.set()

    async def call_once(
        self, state: ConnState, grant_id: str, call_id: str, fingerprint: str, run: Callable[[], Awaitable[Any]]
    ) -> Any:
        grant = state.grants.get(grant_id)
        if grant is None:
            raise TalariaError("runner_grant_expired", "the grant is closed or its turn ended")
        known = grant.calls.get(call_id)
        if known is not None:
            if known[0] != fingerprint:
                raise TalariaError("idempotency_conflict", "this callId was used with other arguments")
            return await asyncio.shield(known[1])
        if len(grant.calls) >= limits.MAX_TOOL_CALLS_PER_GRANT:
            raise TalariaError("runner_call_limit", "this grant has used its 128 tool calls")
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        grant.calls[call_id] = (fingerprint, outcome)
        try:
            outcome.set_result(await run())
        except TalariaError as exc:
            outcome.set_exception(exc)
        return await outcome

    async def record_event(
        self, state: ConnState, connection_id: str, seq: int | None, frame: dict[str, Any] | None
    ) -> None:
        gateway = state.gateways.get(connection_id)
        if gateway is None or not gateway.open:
            raise connection_gone()
        if seq is not None and seq <= gateway.last_seq:
            return  # a retried post (failover-v1): stored already
        if seq is not None and seq != gateway.last_seq + 1:
            raise event_gap(gateway.last_seq + 1)
        gateway.last_seq = gateway.last_seq + 1 if seq is None else seq
        if frame is None:
            await self.end_channel(state, "gateway", connection_id)
        else:
            gateway.events.put_nowait(frame)

    # --- disconnect and liveness (6.3) -----------------------------------------------------------------------

    async def disconnect(self, runner_id: str, reason: str) -> None:
        self._disconnect(runner_id, reason)

    def _disconnect(self, runner_id: str, reason: str) -> None:
        """Full disconnect: end the waiting poll, forget the state, close its channels, fail its commands."""
        state = self.states.pop(runner_id, None)
        if state is None:
            return
        log.info("runner_disconnected", runner_id=runner_id, reason=reason)
        if state.waiter is not None and not state.waiter.done():
            state.waiter.set_result(reason)
        for command in list(state.queue.values()):
            self._settle(state, command, error=self._lost(command))
        for gateway in state.gateways.values():
            gateway.open = False
            gateway.events.put_nowait(None)
        for grant in state.grants.values():
            grant.open = False

    async def tick(self) -> None:
        """One watchdog pass: disconnect every state not seen for more than 35 s."""
        now = self.clock.now_ms()
        for runner_id, state in list(self.states.items()):
            if now - state.seen > limits.OFFLINE_AFTER_S * 1000:
                self._disconnect(runner_id, "watchdog")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(limits.WATCHDOG_PERIOD_S)
            await self.tick()

    def start(self) -> None:
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    def begin_shutdown(self) -> None:
        """Held polls answer ``hub_shutting_down`` at once; states are disconnected."""
        self.shutting_down = True
        for runner_id in list(self.states):
            self._disconnect(runner_id, "shutdown")

    async def stop(self) -> None:
        self.begin_shutdown()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    # --- views ----------------------------------------------------------------------------------------------

    def state_of(self, runner_id: str) -> ConnState | None:
        """The runner's connection state, or None while it is not connected."""
        return self.states.get(runner_id)

    def is_connected(self, runner_id: str) -> bool:
        return runner_id in self.states

    def connected_ids(self) -> list[str]:
        """The ids of the runners with a connection state now."""
        return list(self.states)

    def connected_count(self) -> int:
        return len(self.states)

    def summary(self, runner_id: str) -> dict[str, Any]:
        state = self.states.get(runner_id)
        now = self.clock.now_ms()
        return {
            "online": state is not None and now - state.seen <= limits.ONLINE_WITHIN_S * 1000,
            "lastSeenAt": self.last_seen.get(runner_id),
            "connectedAt": state.created if state else None,
            "features": sorted(state.features) if state else [],
            "runnerVersion": state.version if state else None,
            "draining": state is not None and state.draining_since is not None,
            "drainingSince": state.draining_since if state else None,
        }

    def pending_count(self) -> int:
        return sum(len(state.queue) for state in tuple(self.states.values()))

    def pending_wires(self, runner_id: str) -> list[dict[str, Any]]:
        state = self.states.get(runner_id)
        return [c.wire() for c in state.queue.values()] if state else []

    def has_waiter(self, runner_id: str) -> bool:
        state = self.states.get(runner_id)
        return state is not None and state.waiter is not None and not state.waiter.done()
