"""The in-process dispatcher (lifecycle.md 1; the dispatcher issue).

A worker of the lifecycle engine, principal ``lifecycle.dispatcher_principal``, role ``runtime``, one fresh
``worker_instance`` per hub process. It claims QUEUED jobs whose cell is the source of a connected, enabled
runner that allows the job's profile, starts them, heartbeats while the turn streams, and completes or fails
them, always through the engine calls the Runtime API uses (full bindings, idempotency keys); it never
writes job rows itself. At most ``dispatcher.per_runner`` jobs per runner and ``dispatcher.per_hub`` in all;
runners are visited in a rotating order, tenant by tenant, so one busy tenant cannot starve the others.

A job's runner commands are attributed to its task's author. Before ``prompt.submit`` the dispatcher records
the turn in ``job_turn`` (``JobTurns``); an attempt that finds a ``submitting``/``submitted`` row never
submits again. Before anything was submitted, a runner that is offline or busy is waited for within the
attempt; ``hermes_unavailable`` gives the attempt back (``holder.LeaseHolder.release``) and holds the node until
its Hermes answers (``hermes_hold``; ADR 0030). The engine calls and the heartbeat loop are ``holder``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter, defaultdict

import structlog

from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.dispatch import turn_recovery
from talaria.hub.dispatch.cancel_relay import CancelRelay
from talaria.hub.dispatch.hermes_hold import HermesHolds
from talaria.hub.dispatch.holder import TRANSIENT, JobFailed, Lease, LeaseHolder
from talaria.hub.dispatch.job_turns import JobTurn, JobTurns, NextStep, next_step
from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.runners.registry import RunnerRecord, RunnerRegistry
from talaria.hub.runners.slots import LocalSlots, RunnerSlots
from talaria.hub.runners.transport import RunnerTransport
from talaria.hub.timings import HubTimings
from talaria.hub.tracing import work
from talaria.hub.turns.driver import TURN_TIMEOUT, TurnDriver, TurnHooks, TurnResult
from talaria.lifecycle.actor import Actor, username_of
from talaria.lifecycle.answers import Discovered, Ended
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store.interface import Signals, Store
from talaria.teams import member_sessions
from talaria.timeouts import within

log = structlog.get_logger("talaria.dispatcher")

SUMMARY_CHARS = 200
# Codes a job fails with when it cannot finish; all are final (retryable false).
NOT_ADMITTED = "runner_command_not_admitted"
UNCERTAIN = "runner_command_uncertain"
TARGET_CHANGED = "runner_target_changed"
HERMES_ERROR = "hermes_error"
ACCESS_REVOKED = "access_revoked"
# Before prompt.submit nothing can have run the prompt: these wait for the runner and try again.
PRE_SUBMIT_RETRY = frozenset({"runner_offline", "runner_command_uncertain", "runner_connection_closed", "runner_busy"})
# Before prompt.submit, these give the lease back for the next attempt and hold the node until its Hermes
# answers (ADR 0030): the job's error is retryable, with the runner's code.
RELEASE_ON = frozenset({"hermes_unavailable"})


class Release(Exception):
    """The turn met a transient refusal before anything was submitted: give the attempt back."""

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
        runners: RunnerTransport,
        driver: TurnDriver,
        timings: HubTimings | None = None,
        slots: RunnerSlots | None = None,
        signals: Signals | None = None,
        fallback_ms: int = 1000,
    ) -> None:
        self.engine = engine
        self.slots = slots or LocalSlots()  # dispatcher.per_runner across replicas (scale.md 3.7)
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
        self.holder = LeaseHolder(engine, clock, settings, self.worker_instance)
        self.holds = HermesHolds(driver.channels, self.timings, self.wake, self._enabled)
        self.running: dict[str, asyncio.Task[None]] = {}  # job id -> its task
        self.draining = False  # the hub drains (operations.md 3.4): nothing more is claimed
        self.per_runner: defaultdict[str, int] = defaultdict(int)
        self.cancels: dict[str, asyncio.Event] = {}
        self.stopping = False
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._last_tenant = ""
        self._relay_task: asyncio.Task[None] | None = None
        # PostgreSQL: cancels accepted by another replica reach the jobs run here (scale.md 3.7)
        self.relay = None if signals is None else CancelRelay(
            store, signals, fallback_ms=fallback_ms, running=lambda: list(self.cancels),
            deliver=self._cancel_from_elsewhere,
        )  # fmt: skip

    # --- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.settings.dispatcher_enabled and self._loop_task is None:
            self._loop_ref = asyncio.get_running_loop()
            self._loop_task = self._loop_ref.create_task(self._loop())
            if self.relay is not None:
                self._relay_task = self._loop_ref.create_task(self.relay.watch())

    async def stop(self) -> None:
        self._loop_ref = None
        self.stopping = True  # running turns are left to finish in Hermes: the next attempt recovers them
        if self._relay_task is not None:
            self._relay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._relay_task
            self._relay_task = None
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for task in list(self.running.values()):
            task.cancel()
        if self.running:
            await asyncio.wait(list(self.running.values()), timeout=10)
        await self.holds.stop()

    def is_full(self, runner_id: str) -> bool:
        """Whether a job for this runner would wait for a free slot: the runner's (taken here, or on PostgreSQL by
        any replica: scale.md 3.7), or this hub's."""
        limit = self.settings.dispatcher_per_runner
        busy = self.per_runner.get(runner_id, 0) >= limit or self.slots.busy(runner_id, limit) >= limit
        return busy or len(self.running) >= self.settings.dispatcher_per_hub

    def wake(self) -> None:
        """Scan now (a job was queued, a runner connected, a slot freed)."""
        self._wake.set()

    def actor(self, tenant: str) -> Actor:
        return self.holder.actor(tenant)

    # --- scheduling ------------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await within(self._wake.wait(), self.timings.dispatcher_scan_s)
            self._wake.clear()
            try:
                await self.scan()
            except Exception:  # a bad scan must not end the dispatcher
                log.exception("dispatcher_scan_failed")
            self.scans += 1

    async def scan(self) -> int:
        """Claim what can run now; returns the number of jobs started."""
        free = self.settings.dispatcher_per_hub - len(self.running)
        if free <= 0 or self.draining:
            return 0
        records = [
            r for r in await asyncio.to_thread(self._connected_records) if r.enabled and not self.holds.is_held(r.id)
        ]
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
                    limit = self.settings.dispatcher_per_runner
                    slot = await asyncio.to_thread(self.slots.take, record.id, job.binding.job, limit)
                    if slot is None:  # the runner's slots are held by other replicas' jobs
                        continue
                    self._launch(record, job, slot)
                    self._last_tenant = tenant
                    started += 1
                    free -= 1
                    progress = True
                    break
        return started

    def _enabled(self, runner_id: str) -> bool:
        record = self.registry.get(runner_id)
        return record is not None and record.enabled

    def _connected_records(self) -> list[RunnerRecord]:
        out = []
        for runner_id in self.runners.connected_ids():
            record = self.registry.get(runner_id)
            if record is not None:
                out.append(record)
        return out

    def _next_job(self, record: RunnerRecord) -> Discovered | None:
        """The next job for the runner; while it drains only a job to recover there (its turn recorded on that
        runner, operations.md 3.2), never new work."""
        actor = self.actor(record.tenant)
        draining = not self.runners.accepts_work(record.id)
        for profile in record.allowed_profiles:
            found = self.engine.discover(actor, tenant=record.tenant, cell=record.source, profile=profile, limit=100)
            for job in found.jobs:
                if job.binding.job in self.running:
                    continue
                if draining and not self._to_recover_on(record.id, job.binding.job):
                    continue
                return job
        return None

    def _to_recover_on(self, runner_id: str, job_id: str) -> bool:
        turn = self.turns.get(job_id)
        return turn is not None and turn.runner_id == runner_id

    def _launch(self, record: RunnerRecord, job: Discovered, slot: int) -> None:
        job_id = job.binding.job
        self.per_runner[record.id] += 1
        task = asyncio.get_running_loop().create_task(self._slotted(record, job, slot))
        self.running[job_id] = task

        def done(_: asyncio.Task[None]) -> None:
            self.running.pop(job_id, None)
            self.per_runner[record.id] -= 1
            self.wake()

        task.add_done_callback(done)

    async def _slotted(self, record: RunnerRecord, job: Discovered, slot: int) -> None:
        """Run the job in its slot of the runner, then free the slot (a cancelled run leaves it to the lease: it is
        free once the lease it was taken under ends or expires). Every log line of the job's work, and every command
        it sends, carries its ids and trace (operations.md 5.3, 5.5)."""
        binding = job.binding
        with work(binding.trace, job_id=binding.job, task_id=binding.task, tenant=binding.tenant, runner_id=record.id):
            await self._run_job(record, job, slot)
            with contextlib.suppress(TalariaError):
                await asyncio.to_thread(self.slots.free, record.id, slot, job.binding.job)

    # --- one job ---------------------------------------------------------------------------------------------

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

    def _member(self, binding: Binding) -> member_sessions.Member | None:
        """An assignment job's goal and member (team-tools.md 4.3); None for any other job."""
        found = self.engine.task(binding.tenant, binding.task)
        return member_sessions.of_spec(found.task.spec) if found is not None else None

    async def _run_job(self, record: RunnerRecord, job: Discovered, slot: int) -> None:
        lease = await asyncio.to_thread(self.holder.claim, job)
        if lease is None:
            return
        log.info("dispatcher_job_claimed", attempt=lease.attempt)
        with contextlib.suppress(TalariaError):  # else the slot is taken back 30 s after it was taken
            await asyncio.to_thread(self.slots.leased, record.id, slot, lease.job_id, lease.ref.lease_id)
        cancel = self.cancels.setdefault(lease.job_id, asyncio.Event())
        revoked = asyncio.Event()
        heartbeat: asyncio.Task[None] | None = None
        member: member_sessions.Member | None = None
        replied: TurnResult | None = None  # the turn's result when the job completed with its reply
        try:
            member = await asyncio.to_thread(self._member, lease.binding)
            author = await asyncio.to_thread(self._author, lease.binding)
            await asyncio.to_thread(self.holder.start, lease)

            def still_allowed() -> bool:
                return self._still_allowed(author, record.id, lease.binding.profile)

            heartbeat = asyncio.get_running_loop().create_task(
                self.holder.keep(lease, cancel=cancel, revoked=revoked, still_allowed=still_allowed,
                                 timings=self.timings)
            )  # fmt: skip
            previous = await asyncio.to_thread(self.turns.get, lease.job_id)
            step = next_step(previous)
            if step is NextStep.FROM_RECORD:  # the turn ended before the last attempt could finish the job
                assert previous is not None
                result: TurnResult | None = turn_recovery.from_record(previous)
            elif step is NextStep.RECOVER:
                assert previous is not None
                if previous.runner_id != record.id:
                    raise JobFailed(TARGET_CHANGED, "the source's runner changed since the prompt was submitted")
                result = await self._recover(previous, author, cancel, lease)
            else:
                result = await self._turn_or_cancel(record, lease, author, cancel, revoked, member)
            if revoked.is_set():
                await self._stop_revoked(lease, author)
                raise JobFailed(ACCESS_REVOKED, "the author's access changed during the turn; it was interrupted")
            if result is None:
                if not lease.lost:
                    await asyncio.to_thread(self.holder.cancel, lease, "cancel requested by an admin")
                return
            await self._finish(lease, result)
            replied = result
            log.info("dispatcher_job_finished", status=result.status)
        except JobFailed as failed:
            await self._fail(lease, failed.code, failed.message)
        except Release as release:
            # held first: the job given back must not be taken straight back onto this node while its Hermes is away
            self.holds.hold(record.id, author)
            await self._release(lease, release)
        except TalariaError as exc:
            # nothing submitted: definitely not run; submitted: it may have run (recovery never resubmits)
            code = UNCERTAIN if await self._submitted(lease) else NOT_ADMITTED
            await self._fail(lease, code, exc.message)
        except Exception as exc:  # a bug must still end the job, never leave it running until its lease dies
            log.exception("dispatcher_job_failed", job_id=lease.job_id)
            code = UNCERTAIN if await self._submitted(lease) else NOT_ADMITTED
            await self._fail(lease, code, f"the dispatcher failed: {type(exc).__name__}")
        finally:
            self.cancels.pop(lease.job_id, None)
            self.pre_submit_waits.pop(lease.job_id, None)
            if heartbeat is not None:
                heartbeat.cancel()
            if member is not None:
                await self._member_session_after(member, record.id, replied)

    async def _member_session_after(
        self, member: member_sessions.Member, runner_id: str, replied: TurnResult | None
    ) -> None:
        """Keep the member's session after a reply taken from Hermes; retire it after any other end (4.3)."""
        now = self.clock.now_ms()
        try:
            if replied is not None and replied.stored_id:
                await asyncio.to_thread(member_sessions.keep, self.store, member, runner_id, replied.stored_id, now)
            else:
                await asyncio.to_thread(member_sessions.retire, self.store, member, now)
        except TalariaError as exc:  # the next attempt then opens a new session or resumes an older one
            log.warning("member_session_not_recorded", goal=member.goal_id, bot=member.bot_id, code=exc.code)

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
        await asyncio.to_thread(self.holder.complete, lease, reply)

    async def _turn_or_cancel(
        self, record: RunnerRecord, lease: Lease, author: AccountRef, cancel: asyncio.Event, revoked: asyncio.Event,
        member: member_sessions.Member | None = None,
    ) -> TurnResult | None:  # fmt: skip
        """The job's turn; None when a cancel request overtook it (the driver interrupts a submitted turn).
        While the runner is offline before anything was submitted, wait for it (the lease's maximum life
        bounds the wait: the reaper ends the lease)."""
        while True:
            turn = asyncio.get_running_loop().create_task(self._turn(record, lease, author, member))
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
                    return turn_recovery.from_record(recorded)
                if recorded is not None:  # submitted, or maybe: recover from Hermes, never submit again
                    log.info("dispatcher_recovering", job_id=lease.job_id, code=exc.code)
                    return await self._recover(recorded, author, cancel, lease)
                if exc.code in RELEASE_ON:
                    raise Release(exc.code, exc.message) from None
                if exc.code not in PRE_SUBMIT_RETRY:
                    raise
                # nothing was submitted, so nothing ran: keep the job (heartbeating) until the runner is back
                log.info("dispatcher_waiting_for_runner", job_id=lease.job_id, code=exc.code)
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
        if not await self._still_held(lease):
            return None
        try:
            result = await turn_recovery.recover(
                self.driver.channels,
                author,
                turn,
                clock=self.clock,
                deadline_ms=self.holder.deadline_ms(lease),
                lease=lease.ref,
            )
        except turn_recovery.Unrecoverable as exc:
            raise JobFailed(UNCERTAIN, str(exc)) from None
        except TalariaError as exc:
            if exc.code != TURN_TIMEOUT:
                raise
            result = TurnResult("timeout", "", "", turn.stored_session_id, turn.marker)
        await asyncio.to_thread(
            self.turns.finish,
            turn.job_id,
            result.status,
            turn_recovery.kept_reply(result),
            result.stored_id,
            lease.ref,
        )
        return result

    async def _still_held(self, lease: Lease) -> bool:
        """Renew the lease before recovering the turn from Hermes: a holder whose lease moved on must not take the
        session over (the next holder adopts or resumes it, scale.md 4.4); it stops here, writing nothing."""
        try:
            await asyncio.to_thread(self.holder.beat, lease)
        except TalariaError as exc:
            if exc.code in TRANSIENT:  # not known to be lost: no other holder can claim the job before it expires
                return True
            log.info("dispatcher_lease_lost_before_recovery", job_id=lease.job_id, code=exc.code)
            lease.lost = True
            return False
        return True

    async def _until_online(self, runner_id: str, cancel: asyncio.Event) -> None:
        while not self.runners.is_connected(runner_id) and not cancel.is_set():
            await asyncio.sleep(self.timings.runner_back_check_s)

    async def _submitted(self, lease: Lease) -> bool:
        """Whether a turn was recorded for the job (then the prompt may have reached Hermes)."""
        return await asyncio.to_thread(self.turns.get, lease.job_id) is not None

    def on_signal(self, signal: str, job_id: str) -> None:
        """Engine listener (any thread): wake on new work, and pass a cancel request to its job at once (on
        PostgreSQL also to the replica running it)."""
        if signal == "cancel_requested" and self.relay is not None:
            self.relay.requested(job_id)
        loop = self._loop_ref
        if loop is None or loop.is_closed():
            return
        if signal in ("enqueued", "requeued"):
            loop.call_soon_threadsafe(self._wake.set)
        elif signal == "cancel_requested":
            loop.call_soon_threadsafe(self._cancel_requested, job_id)

    def _cancel_from_elsewhere(self, job_id: str) -> None:
        """``talaria_job`` or its fallback (any thread): a cancel of a job this replica may run."""
        loop = self._loop_ref
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_requested, job_id)

    def _cancel_requested(self, job_id: str) -> None:
        event = self.cancels.get(job_id)
        if event is not None:
            event.set()

    async def _turn(
        self, record: RunnerRecord, lease: Lease, author: AccountRef, member: member_sessions.Member | None = None
    ) -> TurnResult:
        """The job's one turn, never with team tools (an assignment's member included, team-tools.md 4.3); an
        assignment's turn resumes the member's kept session when it may."""
        prompt = await asyncio.to_thread(self._prompt, lease.binding)
        resume_id = None
        if member is not None:
            resume_id = await asyncio.to_thread(member_sessions.resumable, self.store, member, record.id)

        async def before_submit(result: TurnResult) -> None:
            gateway = result.gateway
            turn = JobTurn(
                job_id=lease.job_id, tenant=lease.binding.tenant, attempt=lease.attempt, runner_id=record.id,
                profile=lease.binding.profile, stored_session_id=result.stored_id, marker=result.marker,
                state="submitting", connection_id=gateway.id if gateway else None,
                first_seq=gateway.last_seq + 1 if gateway else None, runtime_id=result.runtime_id,
            )  # fmt: skip
            await asyncio.to_thread(self.turns.begin, turn, lease.ref)

        async def after_submit(result: TurnResult) -> None:
            await asyncio.to_thread(self.turns.submitted, lease.job_id, result.stored_id, lease.ref)

        # a turn left by a stopping hub or a holder whose lease moved on runs on: the next holder adopts its channel
        hooks = TurnHooks(before_submit, after_submit, interrupt_abandoned=lambda: not (self.stopping or lease.lost))
        try:
            result = await self.driver.run(
                runner_id=record.id, account=author, profile=lease.binding.profile, work_id=lease.job_id,
                prompt=prompt, run_id=lease.binding.run, tools=False, hooks=hooks,
                deadline_ms=self.holder.deadline_ms(lease), resume_id=resume_id,
            )  # fmt: skip
        except TalariaError as exc:
            recorded = await asyncio.to_thread(self.turns.get, lease.job_id)
            if exc.code != TURN_TIMEOUT or recorded is None:
                raise
            result = TurnResult("timeout", "", "", recorded.stored_session_id, recorded.marker)
        await asyncio.to_thread(
            self.turns.finish,
            lease.job_id,
            result.status,
            turn_recovery.kept_reply(result),
            result.stored_id,
            lease.ref,
        )
        return result

    async def _stop_revoked(self, lease: Lease, author: AccountRef) -> None:
        """Interrupt the job's turn through a cleanup-only channel (admitted although the author lost access)."""
        turn = await asyncio.to_thread(self.turns.get, lease.job_id)
        if turn is not None:
            await turn_recovery.interrupt_for_cleanup(self.driver.channels, turn, author)

    def _still_allowed(self, author: AccountRef, runner_id: str, profile: str) -> bool:
        """Whether the author may still run the job's turn on the runner (the heartbeat loop's access check)."""
        return self.runners.validity.check(author, runner_id, profile)

    async def _fail(self, lease: Lease, code: str, message: str) -> None:
        error = {"code": code, "message": message[:1000], "retryable": False}
        try:
            await asyncio.to_thread(self.holder.fail, lease, error)
        except TalariaError as exc:
            log.info("dispatcher_fail_refused", job_id=lease.job_id, code=exc.code)

    async def _release(self, lease: Lease, release: Release) -> None:
        """Give the attempt back: nothing was submitted, so the next attempt may run the job."""
        error = {"code": release.code, "message": release.message, "retryable": True}
        try:
            answer = await asyncio.to_thread(self.holder.release, lease, error)
        except TalariaError as exc:
            log.info("dispatcher_release_refused", job_id=lease.job_id, code=exc.code)
            return
        ended = answer.state if isinstance(answer, Ended) else None
        log.info("dispatcher_released", job_id=lease.job_id, code=release.code, attempt=lease.attempt, ended=ended)
