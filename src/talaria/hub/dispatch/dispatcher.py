"""The in-process dispatcher (lifecycle.md 1; the dispatcher issue).

A worker of the lifecycle engine, principal ``lifecycle.dispatcher_principal``, role ``runtime``, one fresh
``worker_instance`` per hub process. It claims QUEUED jobs whose cell is the source of a connected, enabled
runner that allows the job's profile, starts them, heartbeats while the turn streams, and completes or fails
them, always through the engine calls the Runtime API uses (full bindings, idempotency keys); it never
writes job rows itself. At most ``dispatcher.per_runner`` jobs per runner and ``dispatcher.per_hub`` in all;
runners are visited in a rotating order, tenant by tenant, so one busy tenant cannot starve the others.

A job's runner commands are attributed to its task's author. Before ``prompt.submit`` the dispatcher records
the turn in ``job_turn`` (``JobTurns``); an attempt that finds a ``submitting``/``submitted`` row never
submits again.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import structlog

from talaria.canonical import digest, sha256_hex
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.dispatch import turn_recovery
from talaria.hub.dispatch.job_turns import JobTurn, JobTurns, NextStep, next_step
from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.runners.connections import RunnerHub
from talaria.hub.runners.registry import RunnerRecord, RunnerRegistry
from talaria.hub.timings import HubTimings
from talaria.hub.turns.driver import TURN_TIMEOUT, TurnDriver, TurnHooks, TurnResult
from talaria.lifecycle.actor import RUNTIME, Actor, username_of
from talaria.lifecycle.answers import Discovered
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import IdemRequest
from talaria.lifecycle.engine import Engine
from talaria.lifecycle.records import LeaseRef
from talaria.settings import Settings
from talaria.store.interface import Store

log = structlog.get_logger("talaria.dispatcher")

SUMMARY_CHARS = 200
# Codes a job fails with when it cannot finish; all are final (retryable false).
NOT_ADMITTED = "runner_command_not_admitted"
UNCERTAIN = "runner_command_uncertain"
TARGET_CHANGED = "runner_target_changed"
HERMES_ERROR = "hermes_error"
ACCESS_REVOKED = "access_revoked"
# A heartbeat or access check failing with one of these is retried (the lease may still be renewed); any other
# refusal (stale_lease, lease_expired, lease_mismatch, terminal_conflict, ...) is a definite loss.
TRANSIENT = frozenset({"store_unavailable"})
# Before prompt.submit nothing can have run the prompt: these wait for the runner and try again.
PRE_SUBMIT_RETRY = frozenset({"runner_offline", "runner_command_uncertain", "runner_connection_closed"})


@dataclass
class Lease:
    job_id: str
    binding: Binding
    ref: LeaseRef
    attempt: int
    life_end_ms: int  # acquired + max_life_s: the lease cannot be renewed past this
    expires_ms: int  # when the lease runs out unless renewed (a conservative reading of the hub's clock)
    lost: bool = False


class JobFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message[:1000]


class Dispatcher:
    def __init__(
        self,
        *,
        engine: Engine,
        store: Store,
        clock: Clock,
        settings: Settings,
        registry: RunnerRegistry,
        runners: RunnerHub,
        driver: TurnDriver,
        timings: HubTimings | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.clock = clock
        self.settings = settings
        self.registry = registry
        self.runners = runners
        self.driver = driver
        self.timings = timings or HubTimings()
        self.scans = 0  # completed scans (tests await a number of them)
        # job id -> how often its turn waited for its runner before anything was submitted
        self.pre_submit_waits: Counter[str] = Counter()
        self.turns = JobTurns(store, clock)
        self.worker_instance = f"hub-{uuid.uuid4()}"
        self.running: dict[str, asyncio.Task[None]] = {}  # job id -> its task
        self.per_runner: defaultdict[str, int] = defaultdict(int)
        self.cancels: dict[str, asyncio.Event] = {}
        self.stopping = False
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._last_tenant = ""

    # --- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.settings.dispatcher_enabled and self._loop_task is None:
            self._loop_ref = asyncio.get_running_loop()
            self._loop_task = self._loop_ref.create_task(self._loop())

    async def stop(self) -> None:
        self._loop_ref = None
        self.stopping = True  # running turns are left to finish in Hermes: the next attempt recovers them
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for task in list(self.running.values()):
            task.cancel()
        if self.running:
            await asyncio.wait(list(self.running.values()), timeout=10)

    def is_full(self, runner_id: str) -> bool:
        """Whether a job for this runner would wait for a free slot (its own, or the hub's)."""
        busy = self.per_runner.get(runner_id, 0) >= self.settings.dispatcher_per_runner
        return busy or len(self.running) >= self.settings.dispatcher_per_hub

    def wake(self) -> None:
        """Scan now (a job was queued, a runner connected, a slot freed)."""
        self._wake.set()

    def actor(self, tenant: str) -> Actor:
        return Actor(self.settings.lifecycle_dispatcher_principal, frozenset({RUNTIME}), "in_process", tenant)

    # --- scheduling ------------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.timings.dispatcher_scan_s)
            self._wake.clear()
            try:
                await self.scan()
            except Exception:  # a bad scan must not end the dispatcher
                log.exception("dispatcher_scan_failed")
            self.scans += 1

    async def scan(self) -> int:
        """Claim what can run now; returns the number of jobs started."""
        free = self.settings.dispatcher_per_hub - len(self.running)
        if free <= 0:
            return 0
        records = [r for r in await asyncio.to_thread(self._connected_records) if r.enabled]
        by_tenant: defaultdict[str, list[RunnerRecord]] = defaultdict(list)
        for record in records:
            by_tenant[record.tenant].append(record)
        tenants = sorted(by_tenant)
        if not tenants:
            return 0
        after = next((i for i, t in enumerate(tenants) if t > self._last_tenant), 0)
        order = tenants[after:] + tenants[:after]  # the tenant after the one served last goes first
        started = 0
        progress = True
        while free > 0 and progress:  # one job per tenant per round: fair across tenants
            progress = False
            for tenant in order:
                for record in by_tenant[tenant]:
                    if free <= 0 or self.per_runner[record.id] >= self.settings.dispatcher_per_runner:
                        continue
                    job = await asyncio.to_thread(self._next_job, record)
                    if job is None:
                        continue
                    self._launch(record, job)
                    self._last_tenant = tenant
                    started += 1
                    free -= 1
                    progress = True
                    break
        return started

    def _connected_records(self) -> list[RunnerRecord]:
        out = []
        for runner_id in self.runners.connected_ids():
            record = self.registry.get(runner_id)
            if record is not None:
                out.append(record)
        return out

    def _next_job(self, record: RunnerRecord) -> Discovered | None:
        actor = self.actor(record.tenant)
        for profile in record.allowed_profiles:
            found = self.engine.discover(actor, tenant=record.tenant, cell=record.source, profile=profile, limit=100)
            for job in found.jobs:
                if job.binding.job not in self.running:
                    return job
        return None

    def _launch(self, record: RunnerRecord, job: Discovered) -> None:
        job_id = job.binding.job
        self.per_runner[record.id] += 1
        task = asyncio.get_running_loop().create_task(self._run_job(record, job))
        self.running[job_id] = task

        def done(_: asyncio.Task[None]) -> None:
            self.running.pop(job_id, None)
            self.per_runner[record.id] -= 1
            self.wake()

        task.add_done_callback(done)

    # --- one job ---------------------------------------------------------------------------------------------

    def _idem(self, job_id: str, attempt: int, op: str, body: dict[str, Any]) -> IdemRequest:
        key = f"{self.worker_instance}:{job_id}:{attempt}:{op}"
        return IdemRequest(sha256_hex(key), digest(body))

    def _claim(self, record: RunnerRecord, job: Discovered) -> Lease | None:
        actor = self.actor(record.tenant)
        binding = job.binding
        body = {"binding": binding.as_dict(), "worker_instance": self.worker_instance}
        asked = self.clock.now_ms()  # the lease was acquired no earlier than this
        try:
            claimed = self.engine.claim(
                actor, job_id=binding.job, binding=binding, worker_instance=self.worker_instance,
                idem=self._idem(binding.job, job.attempt + 1, "claim", body),
            ).answer  # fmt: skip
        except TalariaError as exc:
            log.info("dispatcher_claim_refused", job=binding.job, code=exc.code)
            return None
        grant = claimed.lease
        return Lease(
            binding.job, binding, grant.ref, claimed.attempt,
            life_end_ms=asked + grant.max_life_s * 1000, expires_ms=asked + grant.ttl_s * 1000,
        )  # fmt: skip

    def _held(self, lease: Lease, op: str, extra: dict[str, Any]) -> tuple[Actor, IdemRequest]:
        """The actor and idempotency key of a holder call (the body digest is what the Runtime API would see)."""
        body = {
            "binding": lease.binding.as_dict(),
            "lease_id": lease.ref.lease_id,
            "lease_epoch": lease.ref.lease_epoch,
        }
        body |= extra
        key = f"{op}:{self.clock.now_ms()}" if op == "heartbeat" else op
        return self.actor(lease.binding.tenant), self._idem(lease.job_id, lease.attempt, key, body)

    def _start(self, lease: Lease) -> None:
        actor, idem = self._held(lease, "start", {})
        self.engine.start(actor, job_id=lease.job_id, binding=lease.binding, lease=lease.ref, idem=idem)

    def _beat(self, lease: Lease) -> bool:
        """Renew the lease; whether a cancel was requested."""
        actor, idem = self._held(lease, "heartbeat", {"progress": None})
        beat = self.engine.heartbeat(
            actor, job_id=lease.job_id, binding=lease.binding, lease=lease.ref, progress=None, idem=idem
        )
        return beat.answer.cancel_requested

    def _complete(self, lease: Lease, result: dict[str, Any]) -> None:
        actor, idem = self._held(lease, "complete", {"result": result})
        self.engine.complete(
            actor, job_id=lease.job_id, binding=lease.binding, lease=lease.ref, result=result, idem=idem
        )

    def _fail_call(self, lease: Lease, error: dict[str, Any]) -> None:
        actor, idem = self._held(lease, "fail", {"error": error})
        self.engine.fail(actor, job_id=lease.job_id, binding=lease.binding, lease=lease.ref, error=error, idem=idem)

    def _cancel(self, lease: Lease, reason: str) -> None:
        actor, idem = self._held(lease, "cancel", {"reason": reason})
        self.engine.cancel(actor, job_id=lease.job_id, binding=lease.binding, reason=reason, lease=lease.ref, idem=idem)

    def _author(self, binding: Binding) -> AccountRef:
        found = self.engine.task(binding.tenant, binding.task)
        with self.store.read() as tx:
            account = tx.one("account_get", username=username_of(found.task.created_by) if found else "")
        if found is None or account is None:
            raise JobFailed(NOT_ADMITTED, "the task's author no longer exists")
        return AccountRef(str(account["username"]), str(account["tenant"]), int(account["auth_version"]))

    def _prompt(self, binding: Binding) -> str:
        found = self.engine.task(binding.tenant, binding.task)
        prompt = found.task.prompt if found else None
        if prompt is None:
            raise JobFailed(NOT_ADMITTED, "the task has no prompt")
        return prompt

    async def _run_job(self, record: RunnerRecord, job: Discovered) -> None:
        lease = await asyncio.to_thread(self._claim, record, job)
        if lease is None:
            return
        cancel = self.cancels.setdefault(lease.job_id, asyncio.Event())
        revoked = asyncio.Event()
        heartbeat: asyncio.Task[None] | None = None
        try:
            author = await asyncio.to_thread(self._author, lease.binding)
            await asyncio.to_thread(self._start, lease)
            heartbeat = asyncio.get_running_loop().create_task(
                self._heartbeat(lease, cancel, revoked, author, record.id)
            )
            previous = await asyncio.to_thread(self.turns.get, lease.job_id)
            step = next_step(previous)
            if step is NextStep.FROM_RECORD:  # the turn ended before the last attempt could finish the job
                assert previous is not None
                result: TurnResult | None = self._from_record(previous)
            elif step is NextStep.RECOVER:
                assert previous is not None
                if previous.runner_id != record.id:
                    raise JobFailed(TARGET_CHANGED, "the source's runner changed since the prompt was submitted")
                result = await self._recover(previous, author, cancel, lease)
            else:
                result = await self._turn_or_cancel(record, lease, author, cancel, revoked)
            if revoked.is_set():
                await self._stop_revoked(lease, author)
                raise JobFailed(ACCESS_REVOKED, "the author's access changed during the turn; it was interrupted")
            if result is None:
                if not lease.lost:
                    await asyncio.to_thread(self._cancel, lease, "cancel requested by an admin")
                return
            await self._finish(lease, result)
        except JobFailed as failed:
            await self._fail(lease, failed.code, failed.message)
        except TalariaError as exc:
            # nothing submitted: definitely not run; submitted: it may have run (recovery never resubmits)
            code = UNCERTAIN if await self._submitted(lease) else NOT_ADMITTED
            await self._fail(lease, code, exc.message)
        except Exception as exc:  # a bug must still end the job, never leave it running until its lease dies
            log.exception("dispatcher_job_failed", job=lease.job_id)
            code = UNCERTAIN if await self._submitted(lease) else NOT_ADMITTED
            await self._fail(lease, code, f"the dispatcher failed: {type(exc).__name__}")
        finally:
            self.cancels.pop(lease.job_id, None)
            self.pre_submit_waits.pop(lease.job_id, None)
            if heartbeat is not None:
                heartbeat.cancel()

    async def _finish(self, lease: Lease, result: TurnResult) -> None:
        """End the job with the turn's outcome: complete with the reply, or fail with the outcome's code."""
        if result.status == "error":
            raise JobFailed(HERMES_ERROR, result.text or "Hermes ended the turn with an error")
        if result.status == "timeout":
            raise JobFailed(TURN_TIMEOUT, "the turn reached its time limit (turns.max_turn_s) and was stopped")
        if result.status != "complete":
            raise JobFailed(UNCERTAIN, f"the turn ended {result.status}")
        reply = {
            "outputs": {"reply": result.text, "storedSessionId": result.stored_id},
            "artifacts": [],
            "summary": result.text[:SUMMARY_CHARS],
        }
        await asyncio.to_thread(self._complete, lease, reply)

    def _deadline_ms(self, lease: Lease) -> int:
        """When the job's turn must end: ``turns.max_turn_s`` from now, and never later than the lease can be
        renewed, less one heartbeat interval left for stopping the turn and failing the job."""
        limit = self.settings.max_turn_for(lease.binding.cell, lease.binding.profile)
        margin = self.settings.lifecycle_heartbeat_interval_s * 1000
        return min(self.clock.now_ms() + limit * 1000, lease.life_end_ms - margin)

    async def _turn_or_cancel(
        self, record: RunnerRecord, lease: Lease, author: AccountRef, cancel: asyncio.Event, revoked: asyncio.Event
    ) -> TurnResult | None:
        """The job's turn; None when a cancel request overtook it (the driver interrupts a submitted turn).
        While the runner is offline before anything was submitted, wait for it (the lease's maximum life
        bounds the wait: the reaper ends the lease)."""
        while True:
            turn = asyncio.get_running_loop().create_task(self._turn(record, lease, author))
            cancelled = asyncio.get_running_loop().create_task(cancel.wait())
            lost = asyncio.get_running_loop().create_task(revoked.wait())
            try:
                await asyncio.wait({turn, cancelled, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                cancelled.cancel()
                lost.cancel()
            if not turn.done():
                turn.cancel()
                with contextlib.suppress(asyncio.CancelledError, TalariaError):
                    await turn
                return None
            try:
                return turn.result()
            except TalariaError as exc:
                recorded = await asyncio.to_thread(self.turns.get, lease.job_id)
                still = await asyncio.to_thread(self.runners.validity.check, author, record.id, lease.binding.profile)
                if recorded is not None and not still:  # the channel closed because the author lost access
                    revoked.set()
                    return None
                if recorded is not None and next_step(recorded) is NextStep.FROM_RECORD:
                    return self._from_record(recorded)
                if recorded is not None:  # submitted, or maybe: recover from Hermes, never submit again
                    log.info("dispatcher_recovering", job=lease.job_id, code=exc.code)
                    return await self._recover(recorded, author, cancel, lease)
                if exc.code not in PRE_SUBMIT_RETRY:
                    raise
                # nothing was submitted, so nothing ran: keep the job (heartbeating) until the runner is back
                log.info("dispatcher_waiting_for_runner", job=lease.job_id, code=exc.code)
                self.pre_submit_waits[lease.job_id] += 1
            await asyncio.sleep(self.timings.pre_submit_retry_s)
            await self._until_online(record.id, cancel)
            if cancel.is_set():
                return None

    async def _recover(
        self, turn: JobTurn, author: AccountRef, cancel: asyncio.Event, lease: Lease
    ) -> TurnResult | None:
        """The recorded turn's result from Hermes (waiting for its runner if needed); never submits. The
        outcome is recorded before the job's terminal call."""
        await self._until_online(turn.runner_id, cancel)
        if cancel.is_set():
            return None
        try:
            result = await turn_recovery.recover(
                self.driver.channels, author, turn, clock=self.clock, deadline_ms=self._deadline_ms(lease)
            )
        except turn_recovery.Unrecoverable as exc:
            raise JobFailed(UNCERTAIN, str(exc)) from None
        except TalariaError as exc:
            if exc.code != TURN_TIMEOUT:
                raise
            result = TurnResult("timeout", "", "", turn.stored_session_id, turn.marker)
        await asyncio.to_thread(
            self.turns.finish, turn.job_id, result.status, self._kept_reply(result), result.stored_id
        )
        return result

    @staticmethod
    def _from_record(turn: JobTurn) -> TurnResult:
        """The result a finished turn's record keeps (nothing is asked of Hermes)."""
        return TurnResult(turn.outcome or "interrupted", turn.reply or "", "", turn.stored_session_id, turn.marker)

    @staticmethod
    def _kept_reply(result: TurnResult) -> str | None:
        """What the record keeps of a finished turn: the reply, or Hermes' error text."""
        return result.text if result.status in ("complete", "error") else None

    async def _until_online(self, runner_id: str, cancel: asyncio.Event) -> None:
        while not self.runners.is_connected(runner_id) and not cancel.is_set():
            await asyncio.sleep(self.timings.runner_back_check_s)

    async def _submitted(self, lease: Lease) -> bool:
        """Whether a turn was recorded for the job (then the prompt may have reached Hermes)."""
        return await asyncio.to_thread(self.turns.get, lease.job_id) is not None

    def on_signal(self, signal: str, job_id: str) -> None:
        """Engine listener (any thread): wake on new work, and pass a cancel request to its job at once."""
        loop = self._loop_ref
        if loop is None or loop.is_closed():
            return
        if signal in ("enqueued", "requeued"):
            loop.call_soon_threadsafe(self._wake.set)
        elif signal == "cancel_requested":
            loop.call_soon_threadsafe(self._cancel_requested, job_id)

    def _cancel_requested(self, job_id: str) -> None:
        event = self.cancels.get(job_id)
        if event is not None:
            event.set()

    async def _turn(self, record: RunnerRecord, lease: Lease, author: AccountRef) -> TurnResult:
        prompt = await asyncio.to_thread(self._prompt, lease.binding)

        async def before_submit(result: TurnResult) -> None:
            turn = JobTurn(
                job_id=lease.job_id, tenant=lease.binding.tenant, attempt=lease.attempt, runner_id=record.id,
                profile=lease.binding.profile, stored_session_id=result.stored_id, marker=result.marker,
                state="submitting",
            )  # fmt: skip
            await asyncio.to_thread(self.turns.begin, turn)

        async def after_submit(result: TurnResult) -> None:
            await asyncio.to_thread(self.turns.submitted, lease.job_id, result.stored_id)

        hooks = TurnHooks(before_submit, after_submit, interrupt_abandoned=lambda: not self.stopping)
        try:
            result = await self.driver.run(
                runner_id=record.id, account=author, profile=lease.binding.profile, work_id=lease.job_id,
                prompt=prompt, run_id=lease.binding.run, tools=False, hooks=hooks,
                deadline_ms=self._deadline_ms(lease),
            )  # fmt: skip
        except TalariaError as exc:
            recorded = await asyncio.to_thread(self.turns.get, lease.job_id)
            if exc.code != TURN_TIMEOUT or recorded is None:
                raise
            result = TurnResult("timeout", "", "", recorded.stored_session_id, recorded.marker)
        await asyncio.to_thread(
            self.turns.finish, lease.job_id, result.status, self._kept_reply(result), result.stored_id
        )
        return result

    async def _stop_revoked(self, lease: Lease, author: AccountRef) -> None:
        """Interrupt the job's turn through a cleanup-only channel (admitted although the author lost access)."""
        turn = await asyncio.to_thread(self.turns.get, lease.job_id)
        if turn is None or not turn.stored_session_id:
            return
        channels = self.driver.channels
        try:
            gateway = await channels.open_gateway(
                turn.runner_id, author, cleanup_only=True,
                bound_stored_id=turn.stored_session_id,
            )  # fmt: skip
        except TalariaError as exc:
            log.info("dispatcher_cleanup_refused", job=lease.job_id, code=exc.code)
            return
        try:
            resumed = await channels.rpc(gateway, "session.resume", {"session_id": turn.stored_session_id})
            await channels.rpc(gateway, "session.interrupt", {"session_id": resumed["session_id"]})
        except TalariaError as exc:
            log.info("dispatcher_cleanup_failed", job=lease.job_id, code=exc.code)
        finally:
            with contextlib.suppress(TalariaError):
                await channels.close_gateway(gateway)

    async def _heartbeat(
        self, lease: Lease, cancel: asyncio.Event, revoked: asyncio.Event, author: AccountRef, runner_id: str
    ) -> None:
        """Renew the lease and re-check the author's access every heartbeat interval. A transient failure of
        either is retried after ``timings.heartbeat_retry_s`` while the lease can still be renewed; a definite loss
        (any other refusal, or the lease running out) stops the turn."""
        interval = float(self.settings.lifecycle_heartbeat_interval_s)
        ttl_ms = self.settings.lifecycle_lease_ttl_s * 1000
        wait = interval
        while True:
            await asyncio.sleep(wait)
            wait = interval
            try:
                if not await asyncio.to_thread(self._still_allowed, author, runner_id, lease.binding.profile):
                    revoked.set()
            except Exception as exc:  # a read error: the next pass checks again
                log.warning("dispatcher_access_check_failed", job=lease.job_id, error=type(exc).__name__)
                wait = self.timings.heartbeat_retry_s
            sent = self.clock.now_ms()
            try:
                cancel_requested = await asyncio.to_thread(self._beat, lease)
            except Exception as exc:
                code = exc.code if isinstance(exc, TalariaError) else type(exc).__name__
                transient = not isinstance(exc, TalariaError) or exc.code in TRANSIENT
                retry_s = self.timings.heartbeat_retry_s
                if transient and self.clock.now_ms() + retry_s * 1000 < lease.expires_ms:
                    log.warning("dispatcher_heartbeat_retry", job=lease.job_id, code=code)
                    wait = retry_s
                    continue
                log.info("dispatcher_heartbeat_refused", job=lease.job_id, code=code)
                lease.lost = True  # the lease ended (maximum life, expiry): stop; the reaper decides what follows
                cancel.set()
                return
            lease.expires_ms = min(sent + ttl_ms, lease.life_end_ms)
            if cancel_requested:
                cancel.set()

    def _still_allowed(self, author: AccountRef, runner_id: str, profile: str) -> bool:
        """Whether the author may still run the job's turn on the runner (the heartbeat loop's access check)."""
        return self.runners.validity.check(author, runner_id, profile)

    async def _fail(self, lease: Lease, code: str, message: str) -> None:
        error = {"code": code, "message": message[:1000], "retryable": False}
        try:
            await asyncio.to_thread(self._fail_call, lease, error)
        except TalariaError as exc:
            log.info("dispatcher_fail_refused", job=lease.job_id, code=exc.code)
