"""The runner hub of PostgreSQL replicas: connection states and the command queue in tables, so that any replica
serves any runner request (scale.md 3.1-3.4; ADR 0045). The other ``RunnerTransport``, beside ``RunnerHub``.

- **States.** ``runner_conn`` holds one state per runner; gates 3-8 run in one transaction holding its row. An
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

Gateways and grants stay objects of the replica that opened them (their rows come with scale.md 4), kept per
epoch: when a state ends, the channels of its epoch close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from starlette.concurrency import run_in_threadpool

from talaria.canonical import canonical_json
from talaria.clock import Clock
from talaria.errors import TalariaError, relayed
from talaria.hub.runners import limits
from talaria.hub.runners.connection_state import AccountRef, CommandView, ConnState, Gateway, Grant
from talaria.hub.runners.connections import Observer, gateway_closed, refused
from talaria.hub.runners.validity import Validity
from talaria.hub.timings import HubTimings
from talaria.store.interface import Row, Signals, Store, Tx

log = structlog.get_logger("talaria.runners")

RUNNER_CHANNEL = "talaria_runner"
COMMAND_CHANNEL = "talaria_command"
SETTLED_KEPT_MS = 600_000  # settled commands, 10 min (scale.md 3.1)
RETIRED_KEPT_MS = 86_400_000  # replaced instances, 24 h
ABANDONED_AFTER_MS = 60_000  # a pending command past its deadline by this much has no sender waiting any more
SENDERS_SETTLE_S = 5.0  # a stopping replica gives its senders this long to read the outcomes it settled


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
class _Taken:
    status: str  # ok, stale (a newer poll), gone (no state of this epoch)
    commands: list[dict[str, Any]] = field(default_factory=list)
    next_due: int | None = None


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

    # --- gates 3-8 (runner-protocol.md 4, scale.md 3.3) --------------------------------------------------------

    async def enter(
        self, runner_id: str, instance: str, *, poll: bool, reset: bool, epoch: str | None, features: str | None
    ) -> tuple[ConnState, bool]:
        if poll and self.shutting_down:
            raise TalariaError("hub_shutting_down", "this hub replica is shutting down; retry")
        token = uuid.uuid4().hex if poll else None
        if features is not None:
            features = ",".join(sorted(limits.accepted_features(features)))
        ended, row, created, held_by = await run_in_threadpool(
            self._enter, runner_id, instance, poll, reset, epoch, features, token
        )
        for end in ended:
            self._after_end(end)
        if created:
            log.info("runner_connected", runner=runner_id)
        elif poll and held_by not in (None, self.replica_id):
            self.signals.notify(RUNNER_CHANNEL, runner_id)  # its held poll there answers: superseded
        return self._state(row), created

    def _enter(
        self, runner_id: str, instance: str, poll: bool, reset: bool, epoch: str | None, features: str | None,
        token: str | None,
    ) -> tuple[list[_Ended], Row, bool, str | None]:  # fmt: skip
        now = self.clock.now_ms()
        ended: list[_Ended] = []
        with self.store.write() as tx:
            for _ in range(3):  # a conflicting insert means another replica's first poll won: look again
                row = tx.one("runner_conn_lock", runner_id=runner_id)
                if poll and reset and row is not None and row["instance"] == instance:
                    ended.append(self._end(tx, row, "reset", now))
                    row = None
                if not poll and (row is None or row["instance"] != instance):
                    raise refused("runner_instance_changed")
                retired = tx.one("runner_conn_retired", runner_id=runner_id, instance=instance) or {}
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
                        "features": features or "", "poll_token": token, "poll_replica": self.replica_id}  # fmt: skip
                if tx.one("runner_conn_insert", **made) is not None:
                    tx.run("runner_conn_seen", runner_id=runner_id, now=now)
                    state = {**made, "created_at": now, "seen_at": now}
                    return ended, state, True, None
            else:  # pragma: no cover - a row inserted and deleted twice while this transaction waited
                raise TalariaError("store_unavailable", "the runner's connection state kept changing; retry")
            held_by = row["poll_replica"]
            tx.run("runner_conn_touch", runner_id=runner_id, now=now, features=features, poll_token=token,
                   poll_replica=self.replica_id if poll else None)  # fmt: skip
            tx.run("runner_conn_seen", runner_id=runner_id, now=now)
        state = dict(row)
        state["seen_at"] = now
        if features is not None:
            state["features"] = features
        if token is not None:
            state["poll_token"] = token
        return ended, state, False, held_by

    def _state(self, row: Row) -> ConnState:
        local = self._channels(row["runner_id"], row["epoch"])
        features = frozenset(name for name in str(row["features"] or "").split(",") if name)
        return ConnState(
            runner_id=row["runner_id"], instance=row["instance"], epoch=row["epoch"], created=int(row["created_at"]),
            seen=int(row["seen_at"]), features=features, gateways=local.gateways, grants=local.grants,
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
        empty = {"epoch": state.epoch, "commands": []}
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
                if taken.commands:
                    return {"epoch": state.epoch, "commands": taken.commands}
                if taken.next_due is not None:  # the hold ends when a delivered command is due again
                    ends = min(ends, loop.time() + max(0.0, (taken.next_due - self.clock.now_ms()) / 1000))
                wait = ends - loop.time()
                if wait <= 0:
                    return empty
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.event.wait(), wait)
                if waiter.reason == "shutdown":
                    raise TalariaError("hub_shutting_down", "the hub is shutting down; retry")
                if waiter.reason == "superseded":
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
            for command in tx.all("runner_command_due", epoch=epoch, now=now):
                if batch and size + int(command["size"]) > limits.MAX_BATCH_BYTES:
                    break
                size += int(command["size"])
                batch.append(json.loads(command["wire"]))
                ids.append(command["id"])
            if ids:
                tx.run("runner_command_deliver", ids=ids, again=now + limits.REDELIVERY_S * 1000)
            due = tx.one("runner_command_next_due", epoch=epoch, now=now)
            tx.run("runner_conn_touch", runner_id=runner_id, now=now, features=None, poll_token=None,
                   poll_replica=None)  # fmt: skip
            tx.run("runner_conn_seen", runner_id=runner_id, now=now)
        next_due = due["at"] if due else None
        return _Taken("ok", batch, int(next_due) if next_due is not None else None)

    # --- commands (6.1, 3.3) -----------------------------------------------------------------------------------

    async def send(
        self, runner_id: str, kind: str, payload: dict[str, Any], *, account: AccountRef | None,
        profile: str | None, connection_id: str | None = None, grant_id: str | None = None,
        valid: bool | None = None,
    ) -> Any:  # fmt: skip
        if not (self.validity.check(account, runner_id, profile) if valid is None else valid):
            raise TalariaError("runner_command_not_admitted", "the account may not do this through this runner")
        deadline = self.timings.grant_bind_deadline_s if kind == "grant.bind" else self.timings.command_deadline_s
        now = self.clock.now_ms()
        command_id = str(uuid.uuid4())
        wire = {"id": command_id, "kind": kind, "payload": payload, "expiresAt": now + round(deadline * 1000)}
        text = canonical_json(wire)
        row = {
            "id": command_id, "runner_id": runner_id, "kind": kind, "wire": text.decode("utf-8"), "size": len(text),
            "now": now, "expires_at": wire["expiresAt"], "account_username": account.username if account else None,
            "account_tenant": account.tenant if account else None,
            "auth_version": account.auth_version if account else None, "profile": profile,
            "connection_id": connection_id, "grant_id": grant_id, "sender_replica": self.replica_id,
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
                        await asyncio.wait_for(woken.wait(), wait)
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
            tx.run("runner_command_insert", epoch=state["epoch"], **row)
        held_by: str | None = state["poll_replica"]
        return held_by

    def _outcome(self, command_id: str, expired: bool) -> Row | None:
        """The command's outcome row once settled (settling it lost first when its deadline passed), else None."""
        with self.store.write() as tx:
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
            connection_id=row["connection_id"], grant_id=row["grant_id"],
        )  # fmt: skip

    def _pending(self, command_id: str, epoch: str) -> Row | None:
        with self.store.read() as tx:
            return tx.one("runner_command_pending", id=command_id, epoch=epoch)

    async def fail_gateway(self, state: ConnState, connection_id: str) -> None:
        settled = await run_in_threadpool(self._close_gateway, connection_id)
        self._woke_senders(settled)

    def _close_gateway(self, connection_id: str) -> list[Row]:
        with self.store.write() as tx:
            return tx.all("runner_command_close_gateway", connection_id=connection_id, now=self.clock.now_ms())

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
        settled = tx.all("runner_command_end_state", epoch=row["epoch"], now=now)
        return _Ended(row["runner_id"], row["epoch"], reason, settled)

    def _after_end(self, ended: _Ended) -> None:
        """After the commit that ended a state: tell its waiters here and elsewhere, close its channels here."""
        log.info("runner_disconnected", runner=ended.runner_id, reason=ended.reason)
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
        return settled

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
            task = self._loop.create_task(self._recheck_quietly())
            self._rechecks.add(task)  # a reference until it is done
            task.add_done_callback(self._rechecks.discard)

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
                if waiter is not None and (row["epoch"] != waiter.epoch or row["poll_token"] != waiter.token
                                           or row["due"]):  # fmt: skip
                    waiter.wake()
                    if count:
                        self._fallback_woke(RUNNER_CHANNEL)
                local = self._local.get(row["runner_id"])
                if local is not None and row["epoch"] != local.epoch:
                    local.close()
                    del self._local[row["runner_id"]]
        commands = sorted(self._senders)
        if commands:
            for row in await run_in_threadpool(self._watch_commands, commands):
                event = self._senders.get(row["id"])
                if event is not None:
                    event.set()
                    if count:
                        self._fallback_woke(COMMAND_CHANNEL)

    def _watch_runners(self, runner_ids: list[str]) -> list[Row]:
        with self.store.read() as tx:
            return tx.all("runner_conn_watch", runner_ids=runner_ids, now=self.clock.now_ms())

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
                await asyncio.wait_for(self._no_senders.wait(), SENDERS_SETTLE_S)
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
        }

    def pending_wires(self, runner_id: str) -> list[dict[str, Any]]:
        row = self._row(runner_id)
        if row is None:
            return []
        with self.store.read() as tx:
            return [json.loads(r["wire"]) for r in tx.all("runner_command_wires", epoch=row["epoch"])]

    def has_waiter(self, runner_id: str) -> bool:
        return runner_id in self._waiters


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
