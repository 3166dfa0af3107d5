"""The runner hub of PostgreSQL replicas: connection states and the command queue in tables, so that any replica
serves any runner request (scale.md 3.1-3.4; ADR 0045). The other ``RunnerTransport``, beside ``RunnerHub``.

- **States.** ``runner_conn`` holds one state per runner; gates 3-8 run in one transaction holding its row, and a
  poll first holds the runner's advisory lock (one runner's polls replace and make states one at a time, ADR 0068). An
  epoch is a new UUID and belongs to its row: it changes exactly when the row is replaced (reset, goodbye,
  watchdog, another instance, disable), never because a replica stopped, restarted or crashed.
- **Queue.** ``runner_command`` rows, one outcome each (``result``, ``error``, ``offline``, ``uncertain``,
  ``closed``), settled by a conditional update on id and epoch, so a late or repeated settle changes nothing. The
  sender waits on its replica for the row to be settled (woken in process or by notification) and settles it
  itself at the deadline.
- **Polls.** Each poll writes a new token and its replica on the state row; only the current token's poll takes a
  batch, in the transaction that checks the token. A poll held here whose token went stale answers 200 with no
  commands (or 409 when the state is gone). A hold ends at 15 s minus a random 0-1 s.
- **Wake-ups.** In process when the other side is here; else by notification after commit (``talaria_runner``
  names a runner whose poll should look again, ``talaria_command`` a settled command); and every
  ``database.wake_fallback_ms`` one query per channel over everything this replica waits on.
- **Roles.** The watchdog runs under the ``runner_watchdog`` lease, the queue's upkeep (commands of dead senders,
  pruning) under ``maintenance``; both act conditionally, so a second holder would change nothing.

- **Channels.** A gateway or grant is an object of the replica that opened it (its owner, where the turn runs) and
  a ``runner_gateway`` / ``runner_grant`` row, so ``admit`` and ``event`` posts are served by any replica (scale.md
  3.1, 4.1; ADR 0047). An accepted ``event`` is one ``runner_event`` row at its ``seq``, written in the transaction
  that checks the gateway and the number; the owner moves frames after its cursor (``Gateway.last_seq``) into the
  gateway's queue: at once when it stored them itself, else when ``talaria_event`` names the gateway, and in the
  fallback. A close marker (the runner's, the hub's, or the state's end) is the gateway's last row.
- **Adoption** (scale.md 4.3, 4.4; ADR 0055). A job's next holder takes over the gateway its dead (or fenced-out)
  previous owner left open: owner counter + 1, frames replayed from the turn's first event. Commands on a gateway
  carry the owner counter they were sent under: enqueue and ``admit`` refuse them once it moved on, and a hub-side
  close under an old counter closes nothing; a previous owner still alive finds the counter moved (its next read of
  the gateway's frames, or the fallback) and drops its object. Maintenance closes a gateway whose owner is no longer
  live and that nothing adopted within 60 s (a job turn's stays until its job is terminal).
- **Tool calls** run on the replica they reach, with an executor made from the grant's ``tools`` when the grant is
  owned elsewhere, once per ``callId`` in the cluster (``runner_tool_call``: a duplicate waits for the running call
  or gets its outcome; a call of a replica no longer live is taken over at the next attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog
from starlette.concurrency import run_in_threadpool

from talaria.canonical import canonical_json
from talaria.clock import Clock
from talaria.errors import TalariaError, relayed
from talaria.hub.runners import limits
from talaria.hub.runners.connection_state import (
    AccountRef,
    ChannelRow,
    CommandView,
    ConnState,
    EncodedResult,
    Gateway,
    Grant,
)
from talaria.hub.runners.transport import (
    Holding,
    JobHeld,
    Observer,
    adopted_elsewhere,
    connection_gone,
    event_gap,
    gateway_closed,
    refused,
)
from talaria.hub.runners.validity import Validity
from talaria.hub.timings import HubTimings
from talaria.hub.tracing import TRACE_FEATURE, traceparent
from talaria.store.interface import Row, Signals, Store, Tx
from talaria.timeouts import within

log = structlog.get_logger("talaria.runners")

RUNNER_CHANNEL = "talaria_runner"
COMMAND_CHANNEL = "talaria_command"
EVENT_CHANNEL = "talaria_event"
TOOL_CHANNEL = "talaria_tool"  # "<grant id>": the grant closed or was revoked; "<grant id>/<call id>": a call moved
REPLICA_LIVE_MS = 20_000  # as hub.replica.LIVE_MS: a running call of a replica not renewed since is taken over
FRAMES_KEPT_MS = 3_600_000  # frames (and their gateway and grant rows) 1 h after they closed (scale.md 3.1)
FRAMES_PER_READ = 500  # as runner_event_after's LIMIT
SETTLED_KEPT_MS = 600_000  # settled commands, 10 min (scale.md 3.1)
RETIRED_KEPT_MS = 86_400_000  # replaced instances, 24 h
ABANDONED_AFTER_MS = 60_000  # a pending command past its deadline by this much has no sender waiting any more
SEEN_EVERY_MS = 1000  # as runner_conn_touch: a state's seen time is written at most once a second
NOTIFIED_WITHIN_MS = 100  # a notification arrives well within this; a fallback wake sooner is not counted
SENDERS_SETTLE_S = 5.0  # a stopping replica gives its senders this long to read the outcomes it settled
ORPHAN_CLOSE_MS = 60_000  # a dead owner's gateway nothing adopted this long after it was found is closed (4.4 step 5)


@dataclass(frozen=True)
class StoredCommand:
    id: str
    kind: str
    payload: dict[str, Any]
    expires_at: int
    account: AccountRef | None
    profile: str | None
    connection_id: str | None
    grant_id: str | None
    stale_owner: bool = False


@dataclass
class _Waiter:
    """A poll held on this replica."""

    epoch: str
    token: str
    reason: str = "wake"
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self, reason: str = "wake") -> None:
        if reason != "wake":
            self.reason = reason
        self.event.set()


@dataclass
class _Local:
    """The gateways and grants this replica opened on one state (one epoch)."""

    epoch: str
    gateways: dict[str, Gateway] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)

    def close(self) -> None:
        for gateway in self.gateways.values():
            gateway.open = False
            gateway.events.put_nowait(None)
        for grant in self.grants.values():
            grant.open = False
        self.gateways.clear()
        self.grants.clear()


@dataclass(frozen=True)
class _Ended:
    runner_id: str
    epoch: str
    reason: str
    settled: list[Row]  # id, sender_replica


@dataclass(frozen=True)
class _Begun:
    status: str  # run (here, at attempt), done (outcome, body), wait (running on a live replica)
    attempt: int
    outcome: str | None = None
    body: str | None = None


@dataclass(frozen=True)
class _Taken:
    status: str  # ok, stale (a newer poll), gone (no state of this epoch)
    commands: list[dict[str, Any]] = field(default_factory=list)
    next_due: int | None = None
    draining: bool = False


class SharedRunnerHub:
    def __init__(
        self, store: Store, signals: Signals, clock: Clock, validity: Validity, *, replica_id: str,
        may_act: Callable[[str], bool], fallback_ms: int = 1000, observe: Observer | None = None,
        on_fallback_wake: Callable[[str], None] | None = None, timings: HubTimings | None = None,
    ) -> None:  # fmt: skip
        self.store = store
        self.signals = signals
        self.clock = clock
        self.validity = validity
        self.replica_id = replica_id
        self.timings = timings or HubTimings()
        self.shutting_down = False
        self._may_act = may_act
        self._fallback_s = fallback_ms / 1000
        self._observe = observe or (lambda outcome, seconds: None)
        self._fallback_woke = on_fallback_wake or (lambda channel: None)
        self._waiters: dict[str, _Waiter] = {}
        self._senders: dict[str, asyncio.Event] = {}
        self._no_senders = asyncio.Event()
        self._local: dict[str, _Local] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._rechecks: set[asyncio.Task[None]] = set()
        self._pulling: set[str] = set()  # gateways whose frames are being read here
        self._pull_again: set[str] = set()  # ... and whose frames moved on meanwhile
        self._tool_waiters: dict[str, set[asyncio.Event]] = {}  # "<grant>/<call>": woken when that call moves
        self.on_draining: list[Callable[[str], None]] = []

    # --- gates 3-8 (runner-protocol.md 4, scale.md 3.3) --------------------------------------------------------

    async def enter(
        self, runner_id: str, instance: str, *, poll: bool, reset: bool, epoch: str | None, features: str | None,
        version: str | None = None, draining: bool = False,
    ) -> tuple[ConnState, bool]:  # fmt: skip
        if poll and self.shutting_down:
            raise TalariaError("hub_shutting_down", "this hub replica is shutting down; retry")
        token = uuid.uuid4().hex if poll else None
        if features is not None:
            features = ",".join(sorted(limits.accepted_features(features)))
        version = None if features is None else version
        ended, row, created, held_by = await run_in_threadpool(
            self._enter, runner_id, instance, poll, reset, epoch, features, version, token, draining
        )
        for end in ended:
            self._after_end(end)
        if row.get("drain_started"):
            self._drain_started(runner_id)
        if created:
            log.info("runner_connected", runner_id=runner_id)
        elif poll and held_by not in (None, self.replica_id):
            self.signals.notify(RUNNER_CHANNEL, runner_id)  # its held poll there answers: superseded
        return self._state(row), created

    def _enter(
        self, runner_id: str, instance: str, poll: bool, reset: bool, epoch: str | None, features: str | None,
        version: str | None, token: str | None, draining: bool = False,
    ) -> tuple[list[_Ended], Row, bool, str | None]:  # fmt: skip
        now = self.clock.now_ms()
        if not poll and features is None:
            current = self._current(runner_id, instance, epoch, now)
            if current is not None:
                return [], current, False, None
        ended: list[_Ended] = []
        with self.store.write() as tx:
            if poll:  # polls replace and make states: one at a time per runner, across replicas
                tx.one("runner_conn_poll_lock", runner_id=runner_id)
            for _ in range(3):  # an insert lost to another transaction's: look again (not while polls hold the lock)
                row = tx.one("runner_conn_lock", runner_id=runner_id)
                if poll and reset and row is not None and row["instance"] == instance:
                    ended.append(self._end(tx, row, "reset", now))
                    row = None
                if not poll and (row is None or row["instance"] != instance):
                    raise refused("runner_instance_changed")
                same = row is not None and row["instance"] == instance  # the current instance is never retired
                retired = {} if same else tx.one("runner_conn_retired", runner_id=runner_id, instance=instance) or {}
                if retired.get("retired"):
                    raise refused("runner_instance_retired")
                if poll and row is not None and row["instance"] != instance:
                    if int(retired.get("n", 0)) >= limits.MAX_RETIRED_INSTANCES:
                        raise refused("runner_instance_limit")
                    tx.run("runner_conn_retire", runner_id=runner_id, instance=row["instance"], now=now)
                    ended.append(self._end(tx, row, "replaced", now))
                    row = None
                if not poll and row is not None and epoch != row["epoch"]:
                    raise refused("runner_epoch_changed")
                if row is not None:
                    break
                made = {"runner_id": runner_id, "instance": instance, "epoch": str(uuid.uuid4()), "now": now,
                        "features": features or "", "runner_version": version, "poll_token": token,
                        "poll_replica": self.replica_id}  # fmt: skip
                if tx.one("runner_conn_insert", **made) is not None:
                    tx.run("runner_conn_seen", runner_id=runner_id, now=now)
                    state = {**made, "created_at": now, "seen_at": now}
                    if draining:  # a draining runner that reconnected: its new state drains too
                        tx.run("runner_conn_drain", runner_id=runner_id, epoch=made["epoch"], now=now)
                        state |= {"draining_since": now, "drain_started": True}
                    return ended, state, True, None
            else:  # pragma: no cover - only polls insert, and they hold runner_conn_poll_lock: a bound, not a path
                raise TalariaError("store_unavailable", "the runner's connection state kept changing; retry")
            held_by = row["poll_replica"]
            tx.run("runner_conn_touch", runner_id=runner_id, now=now, features=features, runner_version=version,
                   poll_token=token, poll_replica=self.replica_id if poll else None)  # fmt: skip
            if now - int(row["seen_at"]) >= SEEN_EVERY_MS:
                tx.run("runner_conn_seen", runner_id=runner_id, now=now)
            starts = draining and row["draining_since"] is None
            if starts:
                tx.run("runner_conn_drain", runner_id=runner_id, epoch=row["epoch"], now=now)
        state = dict(row)
        state["seen_at"] = now
        if starts:
            state |= {"draining_since": now, "drain_started": True}
        if features is not None:
            state["features"] = features
            state["runner_version"] = version
        if token is not None:
            state["poll_token"] = token
        return ended, state, False, held_by

    def _current(self, runner_id: str, instance: str, epoch: str | None, now: int) -> Row | None:
        """The gates of a request that is not a poll, by one read without a lock, while its state was seen within
        the last second; None when the seen time is due (the locked path then writes it). The lock would order
        nothing here: whatever the request then does is conditional on the epoch (a settle, a frame, a call), so a
        state replaced just after this read refuses it there. The current instance is never a retired one (its
        poll would have been refused), so only the instance and the epoch are checked."""
        with self.store.read() as tx:
            row = tx.one("runner_conn_get", runner_id=runner_id)
        if row is None or row["instance"] != instance:
            raise refused("runner_instance_changed")
        if epoch != row["epoch"]:
            raise refused("runner_epoch_changed")
        return row if now - int(row["seen_at"]) < SEEN_EVERY_MS else None

    async def drain(self, runner_id: str) -> bool:
        now = self.clock.now_ms()

        def mark() -> Row | None:
            with self.store.write() as tx:
                return tx.one("runner_conn_drain_current", runner_id=runner_id, now=now)

        row = await run_in_threadpool(mark)
        if row is None:
            return False
        if int(row["draining_since"]) == now:
            self._wake_poll(runner_id, row["poll_replica"])
            self._drain_started(runner_id)
        return True

    def _drain_started(self, runner_id: str) -> None:
        log.info("runner_draining", runner_id=runner_id)
        for hook in self.on_draining:
            hook(runner_id)

    def end_hold(self, runner_id: str) -> None:
        waiter = self._waiters.get(runner_id)
        if waiter is not None:
            waiter.wake("released")

    def draining_count(self) -> int:
        with self.store.read() as tx:
            row = tx.one("runner_conn_draining_count")
        return int(row["n"]) if row else 0

    def held_count(self) -> int:
        return len(self._waiters)

    def accepts_work(self, runner_id: str) -> bool:
        row = self._row(runner_id)
        return row is not None and row["draining_since"] is None

    def _state(self, row: Row) -> ConnState:
        local = self._channels(row["runner_id"], row["epoch"])
        features = frozenset(name for name in str(row["features"] or "").split(",") if name)
        return ConnState(
            runner_id=row["runner_id"], instance=row["instance"], epoch=row["epoch"], created=int(row["created_at"]),
            seen=int(row["seen_at"]), features=features, version=row.get("runner_version"), gateways=local.gateways,
            grants=local.grants, draining_since=row.get("draining_since"),
            poll_token=row.get("poll_token"),
        )  # fmt: skip

    def _channels(self, runner_id: str, epoch: str) -> _Local:
        local = self._local.get(runner_id)
        if local is None or local.epoch != epoch:
            if local is not None:
                local.close()
            local = self._local[runner_id] = _Local(epoch)
        return local

    # --- poll (6.2, 3.3, 3.4) ----------------------------------------------------------------------------------

    async def poll(self, state: ConnState, created: bool) -> dict[str, Any]:
        answer = await self._poll(state, created)
        draining = answer.pop("draining", False) or state.draining_since is not None
        if draining and "drain-v1" in state.features:
            answer["drain"] = True
        return answer

    async def _poll(self, state: ConnState, created: bool) -> dict[str, Any]:
        """The answer, with ``draining`` when the state was seen draining while the poll was held (a drain begun
        meanwhile ends the hold)."""
        empty: dict[str, Any] = {"epoch": state.epoch, "commands": []}
        if created:
            return empty
        runner_id, token = state.runner_id, state.poll_token or ""
        older = self._waiters.get(runner_id)
        if older is not None:
            older.wake("superseded")
        waiter = self._waiters[runner_id] = _Waiter(state.epoch, token)
        loop = asyncio.get_running_loop()
        ends = loop.time() + limits.POLL_HOLD_S - random.random()  # noqa: S311 - spreading holds, not secrecy
        try:
            while True:
                waiter.event.clear()
                taken = await run_in_threadpool(self._take, runner_id, state.epoch, token)
                if taken.status == "gone":
                    raise self._gone(runner_id, waiter.reason)
                if taken.status == "stale" or waiter.reason == "superseded":
                    return empty
                if taken.commands or (taken.draining and state.draining_since is None):
                    return {"epoch": state.epoch, "commands": taken.commands, "draining": taken.draining}
                if taken.next_due is not None:  # the hold ends when a delivered command is due again
                    ends = min(ends, loop.time() + max(0.0, (taken.next_due - self.clock.now_ms()) / 1000))
                wait = ends - loop.time()
                if wait <= 0:
                    return empty
                with contextlib.suppress(TimeoutError):
                    await within(waiter.event.wait(), wait)
                if waiter.reason == "shutdown":
                    raise TalariaError("hub_shutting_down", "the hub is shutting down; retry")
                if waiter.reason in ("superseded", "released"):
                    return empty
                if waiter.reason == "disabled":
                    raise self._gone(runner_id, "disabled")
        finally:
            if self._waiters.get(runner_id) is waiter:
                del self._waiters[runner_id]

    def _gone(self, runner_id: str, reason: str) -> TalariaError:
        if reason == "disabled" or not self.validity.runner_enabled(runner_id):
            return TalariaError("runner_unauthorized", "the runner was disabled; register it again")
        return TalariaError("runner_instance_changed", "the connection state changed while the poll waited")

    def _take(self, runner_id: str, epoch: str, token: str) -> _Taken:
        now = self.clock.now_ms()
        with self.store.write() as tx:
            row = tx.one("runner_conn_lock", runner_id=runner_id)
            if row is None or row["epoch"] != epoch:
                return _Taken("gone")
            if row["poll_token"] != token:
                return _Taken("stale")
            batch: list[dict[str, Any]] = []
            ids: list[str] = []
            size = 0
            traced = TRACE_FEATURE in str(row["features"] or "").split(",")
            for command in tx.all("runner_command_due", epoch=epoch, now=now):
                if batch and size + int(command["size"]) > limits.MAX_BATCH_BYTES:
                    break
                size += int(command["size"])
                wire = json.loads(command["wire"])
                if not traced:
                    wire.pop("traceparent", None)
                batch.append(wire)
                ids.append(command["id"])
            if ids:
                tx.run("runner_command_deliver", ids=ids, again=now + limits.REDELIVERY_S * 1000)
            due = tx.one("runner_command_next_due", epoch=epoch, now=now)
            if now - int(row["seen_at"]) >= SEEN_EVERY_MS:  # else both writes would change nothing
                tx.run("runner_conn_touch", runner_id=runner_id, now=now, features=None, runner_version=None,
                       poll_token=None, poll_replica=None)  # fmt: skip
                tx.run("runner_conn_seen", runner_id=runner_id, now=now)
        next_due = due["at"] if due else None
        return _Taken("ok", batch, int(next_due) if next_due is not None else None, row["draining_since"] is not None)

    # --- commands (6.1, 3.3) -----------------------------------------------------------------------------------

    async def send(
        self, runner_id: str, kind: str, payload: dict[str, Any], *, account: AccountRef | None,
        profile: str | None, connection_id: str | None = None, grant_id: str | None = None,
        valid: bool | None = None, owner_counter: int | None = None,
    ) -> Any:  # fmt: skip
        if not (self.validity.check(account, runner_id, profile) if valid is None else valid):
            raise TalariaError("runner_command_not_admitted", "the account may not do this through this runner")
        deadline = self.timings.grant_bind_deadline_s if kind == "grant.bind" else self.timings.command_deadline_s
        now = self.clock.now_ms()
        command_id = str(uuid.uuid4())
        wire = {"id": command_id, "kind": kind, "payload": payload, "expiresAt": now + round(deadline * 1000)}
        if (parent := traceparent()) is not None:  # delivered to trace-v1 runners only
            wire["traceparent"] = parent
        text = canonical_json(wire)
        row = {
            "id": command_id, "runner_id": runner_id, "kind": kind, "wire": text.decode("utf-8"), "size": len(text),
            "now": now, "expires_at": wire["expiresAt"], "account_username": account.username if account else None,
            "account_tenant": account.tenant if account else None,
            "auth_version": account.auth_version if account else None, "profile": profile,
            "connection_id": connection_id, "grant_id": grant_id, "sender_replica": self.replica_id,
            "owner_counter": owner_counter if connection_id is not None else None,
        }  # fmt: skip
        woken = self._senders[command_id] = asyncio.Event()
        started = time.perf_counter()
        try:
            held_by = await run_in_threadpool(self._enqueue, row)
            self._wake_poll(runner_id, held_by)
            loop = asyncio.get_running_loop()
            ends = loop.time() + deadline
            while True:
                wait = ends - loop.time()
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await within(woken.wait(), wait)
                woken.clear()
                settled = await run_in_threadpool(self._outcome, command_id, loop.time() >= ends)
                if settled is not None:
                    break
        except TalariaError as exc:
            self._observe(exc.code, None)
            raise
        finally:
            self._senders.pop(command_id, None)
            if not self._senders:
                self._no_senders.set()
        try:
            result = _decode(settled)
        except TalariaError as exc:
            self._observe(exc.code, None)
            raise
        self._observe("ok", time.perf_counter() - started)
        return result

    def _enqueue(self, row: dict[str, Any]) -> str | None:
        """Insert the command under its state's row lock (the 64 / 64 MiB limits); the replica holding its poll."""
        with self.store.write() as tx:
            state = tx.one("runner_conn_lock", runner_id=row["runner_id"])
            if state is None:
                raise TalariaError("runner_offline", "the execution node is not connected")
            load = tx.one("runner_command_load", epoch=state["epoch"], now=row["now"]) or {"n": 0, "bytes": 0}
            if int(load["n"]) >= limits.MAX_PENDING_COMMANDS:
                raise TalariaError("runner_busy", "the execution node has 64 commands pending")
            if row["size"] > limits.MAX_COMMAND_BYTES:
                raise TalariaError("runner_payload_limit", "the command is larger than 36 MiB")
            if int(load["bytes"]) + row["size"] > limits.MAX_PENDING_BYTES:
                raise TalariaError("runner_busy", "the execution node has 64 MiB of commands pending")
            if row["owner_counter"] is not None:  # sent by the gateway's owner: refused once another adopted it
                gateway = tx.one("runner_gateway_counter", id=row["connection_id"])
                if gateway is not None and int(gateway["owner_counter"]) != row["owner_counter"]:
                    raise adopted_elsewhere()
            tx.run("runner_command_insert", epoch=state["epoch"], **row)
        held_by: str | None = state["poll_replica"]
        return held_by

    def _outcome(self, command_id: str, expired: bool) -> Row | None:
        """The command's outcome row once settled (settling it lost first when its deadline passed), else None."""
        with self.store.write() if expired else self.store.read() as tx:
            if expired:
                tx.one("runner_command_lost", id=command_id, now=self.clock.now_ms())
            row = tx.one("runner_command_outcome", id=command_id)
        return row if row is not None and row["outcome"] is not None else None

    async def complete(self, state: ConnState, command_id: str, body: dict[str, Any]) -> None:
        if "error" in body:
            error = body["error"]
            outcome = "error"
            message = error["message"][: limits.MAX_ERROR_MESSAGE_CHARS]
            text = canonical_json({"code": error["code"], "message": message})
        else:
            outcome, text = "result", canonical_json(body["result"])
        settled = await run_in_threadpool(self._settle, command_id, state.epoch, outcome, text.decode("utf-8"))
        self._woke_senders(settled)

    def _settle(self, command_id: str, epoch: str, outcome: str, body: str) -> list[Row]:
        with self.store.write() as tx:
            row = tx.one("runner_command_settle", id=command_id, epoch=epoch, outcome=outcome, body=body,
                         now=self.clock.now_ms())  # fmt: skip
        return [row] if row is not None else []

    async def pending_command(self, state: ConnState, command_id: str) -> CommandView | None:
        row = await run_in_threadpool(self._pending, command_id, state.epoch)
        if row is None:
            return None
        account = None
        if row["account_username"] is not None:
            account = AccountRef(row["account_username"], row["account_tenant"], int(row["auth_version"]))
        return StoredCommand(
            id=row["id"], kind=row["kind"], payload=json.loads(row["wire"])["payload"],
            expires_at=int(row["expires_at"]), account=account, profile=row["profile"],
            connection_id=row["connection_id"], grant_id=row["grant_id"], stale_owner=bool(row["stale_owner"]),
        )  # fmt: skip

    def _pending(self, command_id: str, epoch: str) -> Row | None:
        with self.store.read() as tx:
            return tx.one("runner_command_pending", id=command_id, epoch=epoch)

    # --- channels (runner-protocol.md 10, 12; scale.md 3.1, 4.1) ----------------------------------------------

    async def add_channel(self, state: ConnState, channel: Gateway | Grant) -> None:
        local = self._channels(state.runner_id, state.epoch)
        account = channel.account
        row = {"id": channel.id, "runner_id": state.runner_id, "epoch": state.epoch,
               "account_username": account.username, "account_tenant": account.tenant,
               "auth_version": account.auth_version, "owner_replica": self.replica_id}  # fmt: skip
        if isinstance(channel, Gateway):
            local.gateways[channel.id] = channel
            added = await run_in_threadpool(self._insert, "runner_gateway_insert", cleanup_only=channel.cleanup_only,
                                            **row)  # fmt: skip
        else:
            local.grants[channel.id] = channel
            added = await run_in_threadpool(self._insert, "runner_grant_insert", profile=channel.profile,
                                            work_id=channel.work_id, **row)  # fmt: skip
        if not added:
            channel.open = False
            local.gateways.pop(channel.id, None)
            local.grants.pop(channel.id, None)
            raise TalariaError("runner_offline", "the execution node is not connected")

    def _insert(self, query: str, **row: Any) -> bool:
        with self.store.write() as tx:
            return tx.one(query, now=self.clock.now_ms(), **row) is not None

    async def channel(self, state: ConnState, kind: str, channel_id: str) -> ChannelRow | None:
        local = self._local.get(state.runner_id)
        here: Gateway | Grant | None = None
        if local is not None and local.epoch == state.epoch:
            here = local.gateways.get(channel_id) if kind == "gateway" else local.grants.get(channel_id)
        if here is not None:  # the owner's object: closed here as soon as its row closes (or the fallback's round)
            if not here.open:
                return None
            if isinstance(here, Gateway):
                return ChannelRow(here.id, here.account, cleanup_only=here.cleanup_only, here=here)
            return ChannelRow(here.id, here.account, profile=here.profile, here=here)
        row = await run_in_threadpool(self._channel_row, f"runner_{kind}_get", channel_id, state.epoch)
        if row is None:
            return None
        account = AccountRef(row["account_username"], row["account_tenant"], int(row["auth_version"]))
        if kind == "gateway":
            return ChannelRow(row["id"], account, cleanup_only=bool(row["cleanup_only"]))
        tools = json.loads(row["tools"]) if row["tools"] is not None else None
        return ChannelRow(row["id"], account, profile=row["profile"], revoked=bool(row["revoked"]), tools=tools)

    def _channel_row(self, query: str, channel_id: str, epoch: str) -> Row | None:
        with self.store.read() as tx:
            return tx.one(query, id=channel_id, epoch=epoch)

    async def end_channel(
        self, state: ConnState, kind: str, channel_id: str, *, revoked: bool = False, owner_counter: int | None = None
    ) -> None:
        local = self._local.get(state.runner_id)
        if kind == "grant":
            grant = local.grants.pop(channel_id, None) if local is not None else None
            if grant is not None:
                grant.open = False
            owner = await run_in_threadpool(self._close_grant, channel_id)
            if owner not in (None, self.replica_id):
                self.signals.notify(TOOL_CHANNEL, channel_id)
            return
        gateway = local.gateways.get(channel_id) if local is not None else None
        if gateway is not None and owner_counter is not None and gateway.owner_counter != owner_counter:
            gateway = None  # the object of the owner that adopted it here since: not the caller's to close
        if gateway is not None and local is not None:
            del local.gateways[channel_id]
        if gateway is not None and gateway.open:  # its reader hears the end once
            gateway.revoked = gateway.revoked or revoked
            gateway.open = False
            gateway.events.put_nowait(None)
        owner, settled = await run_in_threadpool(self._close_gateway, channel_id, revoked, False, owner_counter)
        self._woke_senders(settled)
        if owner not in (None, self.replica_id):
            self.signals.notify(EVENT_CHANNEL, channel_id)

    def _close_grant(self, grant_id: str) -> str | None:
        with self.store.write() as tx:
            row = tx.one("runner_grant_close", id=grant_id, now=self.clock.now_ms())
        return row["owner_replica"] if row is not None else None

    def _close_gateway(
        self, connection_id: str, revoked: bool, marked: bool, counter: int | None = None
    ) -> tuple[str | None, list[Row]]:
        """Close a gateway's row (with a close marker unless ``marked``) and fail its pending commands (but its own
        close) in one transaction: its owner replica, if it was open, and the commands settled. With ``counter``,
        nothing happens once the gateway's owner counter moved on (adopted by another owner)."""
        with self.store.write() as tx:
            return self._close_gateway_in(tx, connection_id, revoked, marked, counter)

    def _close_gateway_in(
        self, tx: Tx, connection_id: str, revoked: bool, marked: bool, counter: int | None = None
    ) -> tuple[str | None, list[Row]]:
        now = self.clock.now_ms()
        closed = tx.one("runner_gateway_close", id=connection_id, now=now, revoked=revoked, marked=marked,
                        counter=counter)  # fmt: skip
        if closed is None and counter is not None:
            return None, []  # adopted since (or closed already): the new owner's commands stay
        settled = tx.all("runner_command_close_gateway", connection_id=connection_id, now=now)
        return (closed["owner_replica"] if closed is not None else None), settled

    async def adopt_gateway(
        self, runner_id: str, connection_id: str, account: AccountRef, *, held: Holding, after_seq: int,
        runtime_id: str, profile: str,
    ) -> Gateway | None:  # fmt: skip
        row = await run_in_threadpool(self._adopt, runner_id, connection_id, held)
        if row is None:
            return None
        local = self._channels(runner_id, row["epoch"])
        previous = local.gateways.get(connection_id)
        if previous is not None:  # this replica owned it before under an older counter (its lease lost meanwhile)
            self._drop(previous)
        gateway = Gateway(connection_id, runner_id, account, cleanup_only=False)
        gateway.owner_counter = int(row["owner_counter"])
        gateway.last_seq = gateway.read_seq = after_seq
        gateway.replay_to = int(row["last_seq"])
        gateway.profiles[runtime_id] = profile
        local.gateways[connection_id] = gateway
        log.info("runner_gateway_adopted", runner_id=runner_id, connection=connection_id, counter=gateway.owner_counter)
        self.signals.notify(EVENT_CHANNEL, connection_id)  # a previous owner still alive drops its object
        self._pull_soon(connection_id)  # the turn's frames from its first one
        loop = asyncio.get_running_loop()
        ends = loop.time() + self.timings.command_deadline_s
        while loop.time() < ends and gateway.open:  # scale.md 4.4 step 3: the previous owner's commands settle first
            if not await run_in_threadpool(self._previous_owner_pending, connection_id, gateway.owner_counter):
                break
            await asyncio.sleep(min(self._fallback_s, 0.2))
        return gateway

    def _adopt(self, runner_id: str, connection_id: str, held: Holding) -> Row | None:
        with self.store.write() as tx:
            if isinstance(held, JobHeld):
                return tx.one("runner_gateway_adopt", id=connection_id, runner_id=runner_id, replica=self.replica_id,
                              job_id=held.job_id, lease_id=held.lease.lease_id,
                              lease_epoch=held.lease.lease_epoch)  # fmt: skip
            return tx.one("runner_gateway_adopt_turn", id=connection_id, runner_id=runner_id, replica=self.replica_id,
                          turn_id=held.turn_id, holder=held.holder, counter=held.counter)  # fmt: skip

    def _previous_owner_pending(self, connection_id: str, counter: int) -> bool:
        with self.store.read() as tx:
            row = tx.one("runner_command_of_previous_owner", connection_id=connection_id, counter=counter,
                         now=self.clock.now_ms())  # fmt: skip
        return row is not None

    def _drop(self, gateway: Gateway) -> None:
        """This replica's object of a gateway closed (its close marker) or adopted by another owner: it closes (its
        reader hears the end once) and goes; the row is not touched."""
        if gateway.open:
            gateway.open = False
            gateway.events.put_nowait(None)
        for local in self._local.values():
            if local.gateways.get(gateway.id) is gateway:
                del local.gateways[gateway.id]

    async def revoke_gateway(self, state: ConnState, connection_id: str) -> None:
        local = self._local.get(state.runner_id)
        gateway = local.gateways.get(connection_id) if local is not None else None
        if gateway is not None:
            gateway.revoked = True
        await run_in_threadpool(self._write, "runner_gateway_revoke", id=connection_id, epoch=state.epoch)

    async def describe_grant(self, state: ConnState, grant_id: str, tools: dict[str, Any]) -> None:
        await run_in_threadpool(self._write, "runner_grant_describe", id=grant_id, tools=canonical_json(tools).decode())

    def _write(self, query: str, **params: Any) -> None:
        with self.store.write() as tx:
            tx.run(query, **params)

    async def revoke_grant(self, state: ConnState, grant_id: str) -> None:
        grant = self._owned_grant(grant_id)
        if grant is not None:
            grant.revoked.set()
            return  # the owner stops the turn, which closes the grant
        await run_in_threadpool(self._write, "runner_grant_revoke", id=grant_id)
        self.signals.notify(TOOL_CHANNEL, grant_id)

    def _owned_grant(self, grant_id: str) -> Grant | None:
        for local in self._local.values():
            grant = local.grants.get(grant_id)
            if grant is not None:
                return grant
        return None

    async def call_once(
        self, state: ConnState, grant_id: str, call_id: str, fingerprint: str, run: Callable[[], Awaitable[Any]]
    ) -> Any:
        key = f"{grant_id}/{call_id}"
        woken = asyncio.Event()
        self._tool_waiters.setdefault(key, set()).add(woken)
        try:
            while True:
                woken.clear()
                begun = await run_in_threadpool(self._begin_call, grant_id, call_id, fingerprint)
                if begun.status == "done":
                    return _tool_outcome(begun.outcome, begun.body)
                if begun.status == "run":
                    break
                await woken.wait()  # running on a live replica: its outcome, or its replica's end, wakes this
        finally:
            waiting = self._tool_waiters.get(key, set())
            waiting.discard(woken)
            if not waiting:
                self._tool_waiters.pop(key, None)
        try:
            value = await run()
        except TalariaError as exc:
            await self._end_call(key, begun.attempt, "error", _error_text(exc))
            raise
        except BaseException:  # cancelled: a duplicate must not wait for an outcome that never comes
            interrupted = TalariaError("internal_error", "the tool call was interrupted")
            self._recheck_task(self._end_call(key, begun.attempt, "error", _error_text(interrupted)))
            raise
        if isinstance(value, EncodedResult):
            await self._end_call(key, begun.attempt, "encoded", value.text)
        else:
            await self._end_call(key, begun.attempt, "result", canonical_json(value).decode("utf-8"))
        return value

    async def _end_call(self, key: str, attempt: int, outcome: str, body: str) -> None:
        grant_id, call_id = key.split("/", 1)
        try:
            await run_in_threadpool(self._finish_call, grant_id, call_id, attempt, outcome, body)
        except TalariaError as exc:  # a duplicate's takeover runs it again; the request ledger answers it
            log.warning("runner_tool_outcome_lost", code=exc.code)
        self._tool_moved(key)
        self.signals.notify(TOOL_CHANNEL, key)

    def _begin_call(self, grant_id: str, call_id: str, fingerprint: str) -> _Begun:
        """Under the grant's row lock: run it here (new, or taken over from a replica no longer live), its outcome,
        or wait; a refusal raises."""
        now = self.clock.now_ms()
        with self.store.write() as tx:
            if tx.one("runner_grant_lock", id=grant_id) is None:
                raise TalariaError("runner_grant_expired", "the grant is closed or its turn ended")
            known = tx.one("runner_tool_call_get", grant_id=grant_id, call_id=call_id, since=now - REPLICA_LIVE_MS)
            if known is not None:
                if known["fingerprint"] != fingerprint:
                    raise TalariaError("idempotency_conflict", "this callId was used with other arguments")
                if known["status"] == "done":
                    return _Begun("done", int(known["attempt"]), known["outcome"], known["outcome_body"])
                if known["live"]:
                    return _Begun("wait", int(known["attempt"]))
                taken = tx.one("runner_tool_call_take_over", grant_id=grant_id, call_id=call_id,
                               attempt=known["attempt"], replica=self.replica_id, now=now)  # fmt: skip
                return _Begun("run", int(taken["attempt"])) if taken else _Begun("wait", int(known["attempt"]))
            counted = tx.one("runner_tool_call_count", grant_id=grant_id) or {"n": 0}
            if int(counted["n"]) >= limits.MAX_TOOL_CALLS_PER_GRANT:
                raise TalariaError("runner_call_limit", "this grant has used its 128 tool calls")
            tx.run("runner_tool_call_insert", grant_id=grant_id, call_id=call_id, fingerprint=fingerprint,
                   replica=self.replica_id, now=now)  # fmt: skip
        return _Begun("run", 1)

    def _finish_call(self, grant_id: str, call_id: str, attempt: int, outcome: str, body: str) -> None:
        with self.store.write() as tx:
            tx.run("runner_tool_call_finish", grant_id=grant_id, call_id=call_id, attempt=attempt, outcome=outcome,
                   body=body)  # fmt: skip

    def _tool_moved(self, key: str) -> None:
        for waiter in self._tool_waiters.get(key, ()):
            waiter.set()

    def _tool_notified(self, ident: str) -> None:
        if "/" in ident:
            self._tool_moved(ident)
            return
        if self._owned_grant(ident) is not None:
            self._grants_soon([ident])

    def _grants_soon(self, grant_ids: list[str]) -> None:
        if not self.shutting_down:
            self._recheck_task(self._grants_changed(grant_ids))

    def _recheck_task(self, step: Coroutine[Any, Any, None]) -> None:
        if self._loop is None:
            step.close()
            return
        task = self._loop.create_task(step)
        self._rechecks.add(task)  # a reference until it is done
        task.add_done_callback(self._rechecks.discard)

    async def _grants_changed(self, grant_ids: list[str]) -> None:
        """Grants this replica owns, closed or revoked through another replica: closed here; a revoked one's turn
        stops (its ``revoked`` event)."""
        try:
            rows = await run_in_threadpool(self._grant_rows, grant_ids)
        except TalariaError as exc:
            log.warning("runner_grants_read_failed", code=exc.code)
            return
        for row in rows:
            grant = self._owned_grant(row["id"])
            if grant is None:
                continue
            if row["revoked"]:
                grant.revoked.set()
            if row["closed_at"] is not None:
                grant.open = False
                for local in self._local.values():
                    if local.grants.get(grant.id) is grant:
                        del local.grants[grant.id]

    def _grant_rows(self, grant_ids: list[str]) -> list[Row]:
        with self.store.read() as tx:
            return tx.all("runner_grant_state", ids=grant_ids)

    async def record_event(
        self, state: ConnState, connection_id: str, seq: int | None, frame: dict[str, Any] | None
    ) -> None:
        text = canonical_json(frame).decode("utf-8") if frame is not None else None
        stored, owner, settled = await run_in_threadpool(self._record, connection_id, state.epoch, seq, text)
        self._woke_senders(settled)
        if stored is None:
            return  # a retried post: stored already
        if owner != self.replica_id:
            self.signals.notify(EVENT_CHANNEL, connection_id)
            return
        gateway = self._owned(connection_id)
        if gateway is None:
            return
        if connection_id not in self._pulling and gateway.last_seq == stored - 1:
            self._deliver(gateway, stored, frame, revoked=False)  # the next frame, stored here: no read
        else:
            self._pull_soon(connection_id)

    def _record(
        self, connection_id: str, epoch: str, seq: int | None, text: str | None
    ) -> tuple[int | None, str, list[Row]]:
        """Store one event post under the gateway's row lock: its seq (None for a repeat), the owner, and the
        commands a close marker settled."""
        with self.store.write() as tx:
            row = tx.one("runner_gateway_lock", id=connection_id, epoch=epoch)
            if row is None or row["closed_at"] is not None:
                raise connection_gone()
            last = int(row["last_seq"])
            if seq is not None and seq <= last:
                return None, row["owner_replica"], []
            if seq is not None and seq != last + 1:
                raise event_gap(last + 1)
            number = last + 1
            tx.run("runner_event_insert", connection_id=connection_id, seq=number, frame=text, closed=text is None)
            tx.run("runner_gateway_advance", id=connection_id, seq=number)
            settled: list[Row] = []
            if text is None:
                settled = self._close_gateway_in(tx, connection_id, False, True)[1]
        return number, row["owner_replica"], settled

    def _owned(self, connection_id: str) -> Gateway | None:
        """The gateway of that id this replica owns, if open here."""
        for local in self._local.values():
            gateway = local.gateways.get(connection_id)
            if gateway is not None:
                return gateway if gateway.open else None
        return None

    def _deliver(self, gateway: Gateway, seq: int, frame: dict[str, Any] | None, *, revoked: bool) -> None:
        """One stored row into the owner's queue, in seq order; a close marker ends the gateway here."""
        gateway.last_seq = seq
        if frame is not None:
            gateway.events.put_nowait(frame)
            return
        gateway.revoked = gateway.revoked or revoked
        self._drop(gateway)

    def _pull_soon(self, connection_id: str) -> None:
        """Read a gateway's frames after its cursor into its queue: one reader per gateway at a time."""
        if connection_id in self._pulling:
            self._pull_again.add(connection_id)
            return
        if self._loop is None or self.shutting_down:
            return
        self._pulling.add(connection_id)
        self._recheck_task(self._pull(connection_id))

    async def _pull(self, connection_id: str) -> None:
        try:
            while True:
                self._pull_again.discard(connection_id)
                gateway = self._owned(connection_id)
                if gateway is None:
                    return
                rows = await run_in_threadpool(self._frames_after, connection_id, gateway.last_seq)
                if rows and int(rows[0]["owner_counter"]) != gateway.owner_counter:
                    self._drop(gateway)  # adopted by another owner
                    return
                for row in rows:
                    if not gateway.open or int(row["seq"]) != gateway.last_seq + 1:
                        break
                    frame = json.loads(row["frame"]) if row["frame"] is not None else None
                    self._deliver(gateway, int(row["seq"]), frame, revoked=bool(row["revoked"]))
                if len(rows) < FRAMES_PER_READ and connection_id not in self._pull_again:
                    return
        except TalariaError as exc:  # the fallback's next round looks again
            log.warning("runner_frames_read_failed", code=exc.code)
        finally:
            self._pulling.discard(connection_id)
            self._pull_again.discard(connection_id)

    def _frames_after(self, connection_id: str, after: int) -> list[Row]:
        with self.store.read() as tx:
            return tx.all("runner_event_after", connection_id=connection_id, after=after)

    # --- disconnect, watchdog, upkeep (6.3, 3.6) ---------------------------------------------------------------

    async def disconnect(self, runner_id: str, reason: str) -> None:
        ended = await run_in_threadpool(self._disconnect, runner_id, reason)
        if ended is not None:
            self._after_end(ended)

    def _disconnect(self, runner_id: str, reason: str) -> _Ended | None:
        with self.store.write() as tx:
            row = tx.one("runner_conn_lock", runner_id=runner_id)
            return self._end(tx, row, reason, self.clock.now_ms()) if row is not None else None

    def _end(self, tx: Tx, row: Row, reason: str, now: int) -> _Ended:
        """End a state in ``tx``: its row goes, its pending commands are settled by whether they were delivered."""
        tx.run("runner_conn_delete", runner_id=row["runner_id"], epoch=row["epoch"])
        # gateways before commands, the order an event post and a hub-side close lock them in (no deadlock)
        tx.run("runner_gateway_close_epoch", epoch=row["epoch"], now=now)
        tx.run("runner_grant_close_epoch", epoch=row["epoch"], now=now)
        settled = tx.all("runner_command_end_state", epoch=row["epoch"], now=now)
        return _Ended(row["runner_id"], row["epoch"], reason, settled)

    def _after_end(self, ended: _Ended) -> None:
        """After the commit that ended a state: tell its waiters here and elsewhere, close its channels here."""
        log.info("runner_disconnected", runner_id=ended.runner_id, reason=ended.reason)
        waiter = self._waiters.get(ended.runner_id)
        if waiter is not None and waiter.epoch == ended.epoch:
            waiter.wake(ended.reason if ended.reason in ("disabled",) else "wake")
        local = self._local.get(ended.runner_id)
        if local is not None and local.epoch == ended.epoch:
            local.close()
            del self._local[ended.runner_id]
        self._woke_senders(ended.settled)
        self.signals.notify(RUNNER_CHANNEL, ended.runner_id)

    async def tick(self) -> None:
        """One watchdog pass (under ``runner_watchdog``) and the queue's upkeep (under ``maintenance``)."""
        if self._may_act("runner_watchdog"):
            before = self.clock.now_ms() - limits.OFFLINE_AFTER_S * 1000
            for ended in await run_in_threadpool(self._unseen, before):
                self._after_end(ended)
        if self._may_act("maintenance"):
            self._woke_senders(await run_in_threadpool(self._upkeep))
            for orphan in await run_in_threadpool(self._orphans):
                self._recheck_task(self._close_orphan(orphan))

    def _unseen(self, before: int) -> list[_Ended]:
        with self.store.read() as tx:
            candidates = tx.all("runner_conn_unseen", before=before)
        ended: list[_Ended] = []
        for candidate in candidates:  # one state per transaction; one a request holds is skipped (seen again)
            with self.store.write() as tx:
                row = tx.one("runner_conn_lock_unseen", before=before, **candidate)
                if row is not None:
                    ended.append(self._end(tx, row, "watchdog", self.clock.now_ms()))
        return ended

    def _upkeep(self) -> list[Row]:
        now = self.clock.now_ms()
        with self.store.write() as tx:
            settled = tx.all("runner_command_expire", before=now - ABANDONED_AFTER_MS, now=now)
            tx.run("runner_command_prune", before=now - SETTLED_KEPT_MS)
            tx.run("runner_conn_prune_retired", before=now - RETIRED_KEPT_MS)
            tx.run("runner_gateway_prune", before=now - FRAMES_KEPT_MS)
            tx.run("runner_grant_prune", before=now - FRAMES_KEPT_MS)
        return settled

    def _orphans(self) -> list[Row]:
        """Gateways of owners no longer live: marked when first found, returned once nothing adopted them within
        60 s, closed on the hub side (under the counter read, so an adoption in between wins)."""
        now = self.clock.now_ms()
        with self.store.write() as tx:
            tx.run("runner_gateway_mark_orphans", now=now, live_since=now - REPLICA_LIVE_MS)
        with self.store.read() as tx:
            found = tx.all("runner_gateway_orphans", before=now - ORPHAN_CLOSE_MS)
        closed = []
        for row in found:
            owner, settled = self._close_gateway(row["id"], False, False, int(row["owner_counter"]))
            self._woke_senders(settled)
            if owner is not None:
                closed.append(row)
        return closed

    async def _close_orphan(self, row: Row) -> None:
        """Tell the runner to close a dead owner's gateway (closed here already): its sessions stop being owned."""
        log.info("runner_gateway_orphan_closed", runner_id=row["runner_id"], connection=row["id"])
        account = AccountRef(row["account_username"], row["account_tenant"], int(row["auth_version"]))
        try:
            await self.send(row["runner_id"], "gateway.close", {"connectionId": row["id"]}, account=account,
                            profile=None, valid=True, connection_id=row["id"],
                            owner_counter=int(row["owner_counter"]))  # fmt: skip
        except TalariaError as exc:  # offline or gone: its channels died with its connection
            log.info("runner_gateway_orphan_close_failed", connection=row["id"], code=exc.code)

    # --- wake-ups ------------------------------------------------------------------------------------------------

    def _wake_poll(self, runner_id: str, held_by: str | None) -> None:
        waiter = self._waiters.get(runner_id)
        if waiter is not None:
            waiter.wake()
        if held_by != self.replica_id:
            self.signals.notify(RUNNER_CHANNEL, runner_id)

    def _woke_senders(self, settled: list[Row]) -> None:
        for row in settled:
            if row["sender_replica"] == self.replica_id:
                event = self._senders.get(row["id"])
                if event is not None:
                    event.set()
            else:
                self.signals.notify(COMMAND_CHANNEL, row["id"])

    def _from_listener(self, wake: Callable[[str], None]) -> Callable[[str], None]:
        def deliver(ident: str) -> None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(wake, ident)

        return deliver

    def _runner_notified(self, runner_id: str) -> None:
        waiter = self._waiters.get(runner_id)
        if waiter is not None:
            waiter.wake()
        if runner_id in self._local:
            self._recheck_soon()

    def _event_notified(self, connection_id: str) -> None:
        if self._owned(connection_id) is not None:
            self._pull_soon(connection_id)

    def _command_notified(self, command_id: str) -> None:
        event = self._senders.get(command_id)
        if event is not None:
            event.set()

    def _reconnected(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for waiter in self._waiters.values():
            waiter.wake()
        for event in self._senders.values():
            event.set()
        self._recheck_soon()

    def _recheck_soon(self) -> None:
        if self._loop is not None and not self.shutting_down:
            self._recheck_task(self._recheck_quietly())

    async def _recheck_quietly(self) -> None:
        try:
            await self._recheck(count=False)
        except TalariaError as exc:  # the fallback's next round looks again
            log.warning("runner_hub_recheck_failed", code=exc.code)

    async def _recheck(self, *, count: bool = True) -> None:
        """The fallback (scale.md 3.3): one query per channel over every runner and command waited on here."""
        runners = sorted(set(self._waiters) | set(self._local))
        if runners:
            for row in await run_in_threadpool(self._watch_runners, runners):
                waiter = self._waiters.get(row["runner_id"])
                due = row["due_since"]
                if waiter is not None and (row["epoch"] != waiter.epoch or row["poll_token"] != waiter.token
                                           or due is not None):  # fmt: skip
                    waiter.wake()
                    if count and self._missed(due):
                        self._fallback_woke(RUNNER_CHANNEL)
                local = self._local.get(row["runner_id"])
                if local is not None and row["epoch"] != local.epoch:
                    local.close()
                    del self._local[row["runner_id"]]
        owned = sorted(gid for local in self._local.values() for gid, g in local.gateways.items() if g.open)
        if owned:
            for row in await run_in_threadpool(self._watch_gateways, owned):
                gateway = self._owned(row["id"])
                if gateway is not None and int(row["owner_counter"]) != gateway.owner_counter:
                    self._drop(gateway)  # adopted by another owner
                    continue
                if gateway is not None and (int(row["last_seq"]) > gateway.last_seq or row["closed_at"] is not None):
                    if count and row["id"] not in self._pulling:
                        self._fallback_woke(EVENT_CHANNEL)
                    self._pull_soon(row["id"])
        grants = sorted(gid for local in self._local.values() for gid in local.grants)
        if grants:
            self._grants_soon(grants)
        waiting = sorted({key.split("/", 1)[0] for key in self._tool_waiters})
        if waiting:
            for row in await run_in_threadpool(self._watch_calls, waiting):
                key = f"{row['grant_id']}/{row['call_id']}"
                if any(not waiter.is_set() for waiter in self._tool_waiters.get(key, ())):
                    self._tool_moved(key)
                    if count:
                        self._fallback_woke(TOOL_CHANNEL)
        commands = sorted(self._senders)
        if commands:
            for row in await run_in_threadpool(self._watch_commands, commands):
                event = self._senders.get(row["id"])
                if event is not None and not event.is_set():
                    event.set()
                    if count and self._missed(row["settled_at"]):
                        self._fallback_woke(COMMAND_CHANNEL)

    def _missed(self, since: int | None) -> bool:
        """Whether a fallback wake of something that happened at ``since`` stood in for a lost notification: not
        when notifications reach this replica and it happened under ``NOTIFIED_WITHIN_MS`` ago (the query only
        met the notification on its way)."""
        if not self.signals.listening or since is None:
            return True
        return self.clock.now_ms() - int(since) >= NOTIFIED_WITHIN_MS

    def _watch_runners(self, runner_ids: list[str]) -> list[Row]:
        with self.store.read() as tx:
            return tx.all("runner_conn_watch", runner_ids=runner_ids, now=self.clock.now_ms())

    def _watch_gateways(self, connection_ids: list[str]) -> list[Row]:
        with self.store.read() as tx:
            return tx.all("runner_gateway_progress", ids=connection_ids)

    def _watch_calls(self, grant_ids: list[str]) -> list[Row]:
        with self.store.read() as tx:
            since = self.clock.now_ms() - REPLICA_LIVE_MS
            return tx.all("runner_tool_call_watch", grant_ids=grant_ids, since=since)

    def _watch_commands(self, command_ids: list[str]) -> list[Row]:
        with self.store.read() as tx:
            return tx.all("runner_command_outcomes", ids=command_ids)

    # --- start and stop ------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.signals.subscribe(RUNNER_CHANNEL, self._from_listener(self._runner_notified))
        self.signals.subscribe(COMMAND_CHANNEL, self._from_listener(self._command_notified))
        self.signals.subscribe(EVENT_CHANNEL, self._from_listener(self._event_notified))
        self.signals.subscribe(TOOL_CHANNEL, self._from_listener(self._tool_notified))
        self.signals.on_reconnect(self._reconnected)
        self.signals.start()
        self._tasks.append(self._loop.create_task(self._every(limits.WATCHDOG_PERIOD_S, self.tick)))
        self._tasks.append(self._loop.create_task(self._every(self._fallback_s, self._recheck)))

    async def _every(self, seconds: float, step: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await step()
            except TalariaError as exc:  # the store is away: the next round tries again
                log.warning("runner_hub_round_failed", code=exc.code)

    def begin_shutdown(self) -> None:
        """Held polls answer ``hub_shutting_down`` at once, so runners poll another replica; states stay."""
        self.shutting_down = True
        for waiter in self._waiters.values():
            waiter.wake("shutdown")

    async def stop(self) -> None:
        self.begin_shutdown()
        for task in [*self._tasks, *self._rechecks]:
            task.cancel()
        self._tasks.clear()
        try:
            await run_in_threadpool(self._abandon)
        except TalariaError as exc:
            log.warning("runner_hub_stop_failed", code=exc.code)
        if self._senders:  # each reads the outcome settled above (uncertain or offline) before the store closes
            self._no_senders.clear()
            for event in self._senders.values():
                event.set()
            with contextlib.suppress(TimeoutError):
                await within(self._no_senders.wait(), SENDERS_SETTLE_S)
        for local in self._local.values():
            local.close()
        self._local.clear()

    def _abandon(self) -> None:
        with self.store.write() as tx:
            tx.run("runner_command_abandon", replica=self.replica_id, now=self.clock.now_ms())

    # --- views ---------------------------------------------------------------------------------------------------

    def _row(self, runner_id: str) -> Row | None:
        with self.store.read() as tx:
            return tx.one("runner_conn_get", runner_id=runner_id)

    def state_of(self, runner_id: str) -> ConnState | None:
        row = self._row(runner_id)
        return self._state(row) if row is not None else None

    def is_connected(self, runner_id: str) -> bool:
        return self._row(runner_id) is not None

    def connected_ids(self) -> list[str]:
        with self.store.read() as tx:
            return [row["runner_id"] for row in tx.all("runner_conn_ids")]

    def connected_count(self) -> int:
        with self.store.read() as tx:
            row = tx.one("runner_conn_count")
        return int(row["n"]) if row else 0

    def pending_count(self) -> int:
        with self.store.read() as tx:
            row = tx.one("runner_command_pending_count")
        return int(row["n"]) if row else 0

    def summary(self, runner_id: str) -> dict[str, Any]:
        with self.store.read() as tx:
            row = tx.one("runner_conn_summary", runner_id=runner_id) or {}
        created, seen = row.get("created_at"), row.get("seen_at")
        last = max((int(v) for v in (seen, row.get("last_seen_at")) if v is not None), default=None)
        return {
            "online": created is not None
            and seen is not None
            and self.clock.now_ms() - int(seen) <= limits.ONLINE_WITHIN_S * 1000,
            "lastSeenAt": last,
            "connectedAt": int(created) if created is not None else None,
            "features": sorted(name for name in str(row.get("features") or "").split(",") if name),
            "runnerVersion": row.get("runner_version") if created is not None else None,
            "draining": created is not None and row.get("draining_since") is not None,
            "drainingSince": row.get("draining_since") if created is not None else None,
        }

    def pending_wires(self, runner_id: str) -> list[dict[str, Any]]:
        row = self._row(runner_id)
        if row is None:
            return []
        with self.store.read() as tx:
            return [json.loads(r["wire"]) for r in tx.all("runner_command_wires", epoch=row["epoch"])]

    def has_waiter(self, runner_id: str) -> bool:
        return runner_id in self._waiters

    def waiting_calls(self) -> int:
        """Tool calls here waiting for a duplicate running on another replica."""
        return sum(len(waiting) for waiting in self._tool_waiters.values())


def _decode(row: Row) -> Any:
    """A settled command's outcome: the runner's result, or the ``TalariaError`` it ended with."""
    outcome = row["outcome"]
    if outcome == "result":
        return json.loads(row["outcome_body"])
    if outcome == "error":
        error = json.loads(row["outcome_body"])
        raise relayed(error["code"], error["message"])
    if outcome == "closed":
        raise gateway_closed()
    if outcome == "offline":
        raise TalariaError("runner_offline", "the execution node did not take the command; it did not run")
    raise TalariaError("runner_command_uncertain", "the command was delivered but no result came; it may have run")


def _error_text(exc: TalariaError) -> str:
    return canonical_json({"code": exc.code, "message": exc.message, "status": exc.status}).decode("utf-8")


def _tool_outcome(outcome: str | None, body: str | None) -> Any:
    """A call's first outcome, as its first run answered it."""
    assert body is not None
    if outcome == "encoded":
        return EncodedResult(body)
    if outcome == "result":
        return json.loads(body)
    error = json.loads(body)
    raise TalariaError(error["code"], error["message"], status=int(error["status"]))
