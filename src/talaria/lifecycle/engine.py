"""The engine: every entry point of lifecycle.md 1, bound to one store, clock and settings.

Callers differ only in the ``Actor`` they pass. Each mutating call is one write transaction and
returns a result or raises ``TalariaError`` with a code of lifecycle.md 6.7.
"""

from __future__ import annotations

from typing import Any

from talaria.clock import Clock
from talaria.lifecycle import audit, jobs, reads, recovery, tasks
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import Context, IdemRequest, Listener, OpResult
from talaria.lifecycle.orchestrator import Orchestrator
from talaria.settings import Settings
from talaria.store.interface import Row, Store


class Engine:
    orchestrator = Orchestrator

    def __init__(self, store: Store, clock: Clock, settings: Settings) -> None:
        self.ctx = Context(store, clock, settings)

    @property
    def store(self) -> Store:
        return self.ctx.store

    @property
    def clock(self) -> Clock:
        return self.ctx.clock

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(signal, job_id)`` after each COMMIT; see ``Context``."""
        self.ctx.listeners.append(listener)

    # Tasks (section 3)
    def create_task(
        self,
        actor: Actor,
        *,
        tenant: str,
        title: str,
        spec: dict[str, Any],
        cell: str,
        profile: str,
        trace: str,
    ) -> Row:
        return tasks.create_task(
            self.ctx, actor, tenant=tenant, title=title, spec=spec, cell=cell, profile=profile, trace=trace
        )

    def submit_task(self, actor: Actor, *, tenant: str, task_id: str) -> Row:
        return tasks.submit_task(self.ctx, actor, tenant=tenant, task_id=task_id)

    def approve_task(self, actor: Actor, *, tenant: str, task_id: str) -> Row:
        return tasks.approve_task(self.ctx, actor, tenant=tenant, task_id=task_id)

    def reject_task(self, actor: Actor, *, tenant: str, task_id: str, reason: str) -> Row:
        return tasks.reject_task(self.ctx, actor, tenant=tenant, task_id=task_id, reason=reason)

    def cancel_task(self, actor: Actor, *, tenant: str, task_id: str, reason: str) -> Row:
        return tasks.cancel_task(self.ctx, actor, tenant=tenant, task_id=task_id, reason=reason)

    def dispatch(self, actor: Actor, *, tenant: str, task_id: str) -> tuple[Row, Row, Row]:
        return tasks.dispatch(self.ctx, actor, tenant=tenant, task_id=task_id)

    def approve_and_dispatch(self, actor: Actor, *, tenant: str, task_id: str) -> tuple[Row, Row, Row]:
        return tasks.approve_and_dispatch(self.ctx, actor, tenant=tenant, task_id=task_id)

    # Jobs (sections 4-6)
    def discover(
        self,
        actor: Actor,
        *,
        tenant: str,
        cell: str,
        profile: str,
        state: str = "QUEUED",
        limit: int | None = None,
    ) -> OpResult:
        return reads.discover(self.ctx, actor, tenant=tenant, cell=cell, profile=profile, state=state, limit=limit)

    def claim(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        worker_instance: str,
        idem: IdemRequest | None = None,
    ) -> OpResult:
        return jobs.claim(self.ctx, actor, job_id=job_id, binding=binding, worker_instance=worker_instance, idem=idem)

    def start(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        lease_id: str,
        lease_epoch: int,
        idem: IdemRequest | None = None,
    ) -> OpResult:
        return jobs.start(
            self.ctx,
            actor,
            job_id=job_id,
            binding=binding,
            lease_id=lease_id,
            lease_epoch=lease_epoch,
            idem=idem,
        )

    def heartbeat(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        lease_id: str,
        lease_epoch: int,
        progress: dict[str, Any] | None = None,
        idem: IdemRequest | None = None,
    ) -> OpResult:
        return jobs.heartbeat(
            self.ctx,
            actor,
            job_id=job_id,
            binding=binding,
            lease_id=lease_id,
            lease_epoch=lease_epoch,
            progress=progress,
            idem=idem,
        )

    def complete(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        lease_id: str,
        lease_epoch: int,
        result: dict[str, Any],
        idem: IdemRequest | None = None,
    ) -> OpResult:
        return jobs.complete(
            self.ctx,
            actor,
            job_id=job_id,
            binding=binding,
            lease_id=lease_id,
            lease_epoch=lease_epoch,
            result=result,
            idem=idem,
        )

    def fail(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        lease_id: str,
        lease_epoch: int,
        error: dict[str, Any],
        idem: IdemRequest | None = None,
    ) -> OpResult:
        return jobs.fail(
            self.ctx,
            actor,
            job_id=job_id,
            binding=binding,
            lease_id=lease_id,
            lease_epoch=lease_epoch,
            error=error,
            idem=idem,
        )

    def cancel(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        reason: str,
        lease_id: str | None = None,
        lease_epoch: int | None = None,
        idem: IdemRequest | None = None,
    ) -> OpResult:
        """Holder cancel (row 7) with ``lease_id`` and ``lease_epoch``; admin cancel (rows 8, 9) without."""
        if lease_id is not None and lease_epoch is not None:
            return jobs.holder_cancel(
                self.ctx,
                actor,
                job_id=job_id,
                binding=binding,
                lease_id=lease_id,
                lease_epoch=lease_epoch,
                reason=reason,
                idem=idem,
            )
        return jobs.admin_cancel(self.ctx, actor, job_id=job_id, binding=binding, reason=reason, idem=idem)

    def status(self, actor: Actor, *, job_id: str, binding: Binding) -> OpResult:
        return reads.status(self.ctx, actor, job_id=job_id, binding=binding)

    def expire_due(self) -> int:
        """One reaper sweep (tests call this instead of running the periodic reaper)."""
        return recovery.sweep(self.ctx)

    def recover(self) -> recovery.RecoveryReport:
        return recovery.recover(self.ctx)

    def verify_audit(self) -> audit.ChainReport:
        return audit.verify(self.ctx.store)
