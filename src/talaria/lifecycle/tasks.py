"""Task operations and dispatch (lifecycle.md 3). Each is one write transaction with a task.* event."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from talaria.canonical import canonical_json, digest, sha256_hex
from talaria.clock import rfc3339
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.lifecycle import audit, journal
from talaria.lifecycle.actor import PLATFORM_ADMIN, Actor
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import Context, RowChanged, Signals
from talaria.lifecycle.endings import admin_cancel_in
from talaria.lifecycle.machine import JOB_INITIAL, TASK_INITIAL, TaskOp, TaskState, next_task_state
from talaria.lifecycle.records import Dispatch, Job, Task
from talaria.settings import Settings
from talaria.store.interface import Tx


def content_digest(task: Task) -> str:
    return digest({"title": task.title, "spec": json.loads(task.spec), "cell": task.cell, "profile": task.profile})


def provenance_record(task: Task, *, approved_by: str, approved_at: int) -> dict[str, Any]:
    return {
        "tenant": task.tenant,
        "task": task.id,
        "createdBy": task.created_by,
        "approvedBy": approved_by,
        "approvedAt": rfc3339(approved_at),
        "contentDigest": content_digest(task),
    }


def _get(tx: Tx, tenant: str, task_id: str) -> Task:
    row = tx.one("task_get", tenant=tenant, id=task_id)
    if row is None:
        raise TalariaError("not_found", "no such task")
    return Task.from_row(row)


_AUDIT_TYPE = {
    TaskOp.SUBMIT: "task.submitted",
    TaskOp.APPROVE: "task.approved",
    TaskOp.REJECT: "task.rejected",
    TaskOp.CANCEL: "task.cancelled",
    TaskOp.DISPATCH: "task.dispatched",
}


def _move(
    tx: Tx,
    now: int,
    task: Task,
    op: TaskOp,
    actor: Actor,
    *,
    subject: audit.Subject | None = None,
    binding: Binding | None = None,
    reason_code: str | None = None,
    **changes: Any,
) -> Task:
    """Persist one task transition (conditional on state and revision) with its task.* event."""
    to_state = next_task_state(task.state, op)
    after = dataclasses.replace(task, state=to_state, revision=task.revision + 1, **changes)
    count = tx.run(
        "task_update",
        id=task.id,
        expected_state=task.state,
        expected_revision=task.revision,
        state=after.state,
        revision=after.revision,
        provenance=after.provenance,
        submitted_at=after.submitted_at,
        approved_by=after.approved_by,
        approved_at=after.approved_at,
        rejected_by=after.rejected_by,
        rejected_at=after.rejected_at,
        rejection_reason=after.rejection_reason,
        finished_at=after.finished_at,
    )
    if count != 1:
        raise TalariaError("invalid_transition", "the task changed; read it again")
    audit.append(
        tx,
        now_ms=now,
        type=_AUDIT_TYPE[op],
        tenant=task.tenant,
        actor=actor,
        subject=subject or audit.Subject(task.id),
        binding=binding,
        from_state=task.state,
        to_state=to_state,
        revision_before=task.revision,
        revision_after=after.revision,
        reason_code=reason_code,
    )
    return after


def _check_approver(settings: Settings, actor: Actor, task: Task) -> None:
    if not actor.has(PLATFORM_ADMIN):
        raise TalariaError("role_forbidden", "approving and rejecting need an admin")
    if task.created_by == actor.principal and not settings.approval_allow_self_approval:
        raise TalariaError("self_approval_forbidden", "the author of a task may not approve or reject it")


def _approve(settings: Settings, tx: Tx, now: int, actor: Actor, tenant: str, task_id: str) -> Task:
    task = _get(tx, tenant, task_id)
    next_task_state(task.state, TaskOp.APPROVE)
    _check_approver(settings, actor, task)
    provenance = digest(provenance_record(task, approved_by=actor.principal, approved_at=now))
    return _move(
        tx,
        now,
        task,
        TaskOp.APPROVE,
        actor,
        approved_by=actor.principal,
        approved_at=now,
        provenance=provenance,
    )


def cancel_undispatched(tx: Tx, now: int, actor: Actor, task: Task) -> Task:
    """``cancel_task`` before dispatch; the caller has checked who may cancel."""
    if tx.one("dispatch_get_by_task", task_id=task.id) is not None:
        raise TalariaError("invalid_transition", "the task has a dispatch")
    return _move(tx, now, task, TaskOp.CANCEL, actor, finished_at=now)


def dispatch_in(
    settings: Settings, tx: Tx, now: int, actor: Actor, task: Task, signals: Signals, *, in_process_only: bool = False
) -> tuple[Task, Dispatch, Job]:
    """Dispatch first (lifecycle.md 3): Dispatch row, then the QUEUED job, then the Task, in ``tx``.

    ``task`` is the Task as read (or just written) in ``tx``; ``in_process_only``: a job the Runtime API never
    sees (team-tools.md 4.3)."""
    next_task_state(task.state, TaskOp.DISPATCH)
    held = tx.one("task_lock", id=task.id)  # another replica's dispatch of it waits here, or went first
    if held is None or int(held["revision"]) != task.revision:
        raise RowChanged()
    if task.provenance is None or tx.one("dispatch_get_by_task", task_id=task.id) is not None:
        raise TalariaError("not_approved", "the task is already dispatched")
    dispatch_id, job_id, run_id = mint("dsp", now), mint("job", now), mint("run", now)
    dispatch = Dispatch(
        dispatch_id,
        task.tenant,
        task.id,
        job_id,
        run_id,
        task.trace,
        task.provenance,
        task.cell,
        task.profile,
        "OPEN",
        actor.principal,
        now,
        None,
        None,
    )
    tx.run(
        "dispatch_insert",
        id=dispatch.id,
        tenant=dispatch.tenant,
        task_id=dispatch.task_id,
        job_id=dispatch.job_id,
        run_id=dispatch.run_id,
        trace=dispatch.trace,
        provenance=dispatch.provenance,
        cell=dispatch.cell,
        profile=dispatch.profile,
        created_by=dispatch.created_by,
        now=now,
    )
    job = _queued_job(settings, dispatch, now)
    tx.run(
        "job_insert",
        id=job.id,
        tenant=job.tenant,
        task_id=job.task_id,
        dispatch_id=job.dispatch_id,
        run_id=job.run_id,
        trace=job.trace,
        provenance=job.provenance,
        cell=job.cell,
        profile=job.profile,
        max_attempts=job.max_attempts,
        max_life_s=job.max_life_s,
        now=now,
        in_process_only=int(in_process_only),
    )
    binding = dispatch.binding(actor.principal)
    subject = audit.Subject(task.id, dispatch_id, job_id)
    task_after = _move(tx, now, task, TaskOp.DISPATCH, actor, binding=binding, subject=subject)
    event_id = audit.append(
        tx,
        now_ms=now,
        type="hermes.job.enqueued",
        tenant=task.tenant,
        actor=actor,
        subject=subject,
        binding=binding,
        to_state=job.state,
        revision_after=job.revision,
        lease_epoch=job.lease_epoch,
    )
    _enqueue_evidence(tx, now, job, actor, event_id)
    signals.append(("enqueued", job_id))
    return task_after, dispatch, job


def _queued_job(settings: Settings, dispatch: Dispatch, now: int) -> Job:
    """Row 1 as ``job_insert`` writes it: revision 1, epoch 0, attempt 0, limits from the profile."""
    return Job(
        id=dispatch.job_id,
        tenant=dispatch.tenant,
        task_id=dispatch.task_id,
        dispatch_id=dispatch.id,
        run_id=dispatch.run_id,
        trace=dispatch.trace,
        provenance=dispatch.provenance,
        cell=dispatch.cell,
        profile=dispatch.profile,
        max_attempts=settings.max_attempts_for(dispatch.cell, dispatch.profile),
        max_life_s=settings.max_life_for(dispatch.cell, dispatch.profile),
        enqueued_at=now,
        state=JOB_INITIAL,
        revision=1,
        attempt=0,
        started_at=None,
        progress=None,
        cancel_requested=False,
        cancel_requested_at=None,
        cancel_requested_by=None,
        finished_at=None,
        terminal_kind=None,
        terminal_reason=None,
        terminal_lease_id=None,
        terminal_epoch=None,
        result_digest=None,
        terminal_response=None,
        lease_id=None,
        lease_epoch=0,
        lease_owner_principal=None,
        lease_owner_instance=None,
        lease_acquired_at=None,
        lease_expires_at=None,
        last_heartbeat_at=None,
    )


def _enqueue_evidence(tx: Tx, now: int, job: Job, actor: Actor, event_id: str) -> None:
    payload = {
        "task": job.task_id,
        "dispatch": job.dispatch_id,
        "run": job.run_id,
        "cell": job.cell,
        "profile": job.profile,
        "max_attempts": job.max_attempts,
        "max_life_s": job.max_life_s,
    }
    data = canonical_json(payload)
    tx.run(
        "evidence_insert",
        evidence_id=mint("evd", now),
        job_id=job.id,
        task_id=job.task_id,
        run_id=job.run_id,
        dispatch_id=job.dispatch_id,
        kind="enqueue",
        payload=data.decode("utf-8"),
        content_digest=sha256_hex(data),
        produced_by=journal.produced_by(actor.principal, None, job.lease_epoch),
        now=now,
        audit_event_id=event_id,
    )


def insert_task(
    tx: Tx, now: int, actor: Actor, tenant: str, title: str, spec: dict[str, Any], cell: str, profile: str, trace: str
) -> Task:
    """A DRAFT task by ``actor`` with its ``task.created`` event, in ``tx``."""
    task = Task(
        mint("tsk", now),
        tenant,
        title,
        canonical_json(spec).decode("utf-8"),
        cell,
        profile,
        None,
        trace,
        TASK_INITIAL,
        1,
        actor.principal,
        now,
        *(None,) * 7,
    )
    tx.run(
        "task_insert",
        id=task.id,
        tenant=tenant,
        title=title,
        spec=task.spec,
        cell=cell,
        profile=profile,
        trace=trace,
        created_by=actor.principal,
        now=now,
    )
    audit.append(
        tx,
        now_ms=now,
        type="task.created",
        tenant=tenant,
        actor=actor,
        subject=audit.Subject(task.id),
        to_state=task.state,
        revision_after=task.revision,
    )
    return task


def submit_in(tx: Tx, now: int, actor: Actor, task: Task) -> Task:
    """DRAFT to PENDING_APPROVAL in ``tx``; the caller checked that ``actor`` wrote it."""
    return _move(tx, now, task, TaskOp.SUBMIT, actor, submitted_at=now)


def approve_by_policy_in(tx: Tx, now: int, actor: Actor, task: Task, reason_code: str) -> Task:
    """PENDING_APPROVAL to APPROVED by a policy principal (team-tools.md 4.2): no person approves, so the
    approver rules of a person (``platform_admin``, self-approval) do not apply; the provenance names the policy."""
    provenance = digest(provenance_record(task, approved_by=actor.principal, approved_at=now))
    return _move(tx, now, task, TaskOp.APPROVE, actor, reason_code=reason_code, approved_by=actor.principal,
                 approved_at=now, provenance=provenance)  # fmt: skip


class TaskEntries(Context):
    """Task operations and dispatch (lifecycle.md 3)."""

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
    ) -> Task:
        """A DRAFT task with its ``task.created`` event."""

        return self.write(
            lambda tx, now, signals: insert_task(tx, now, actor, tenant, title, spec, cell, profile, trace)
        )

    def submit_task(self, actor: Actor, *, tenant: str, task_id: str) -> Task:
        """DRAFT to PENDING_APPROVAL, by the task's author only."""

        def run(tx: Tx, now: int, signals: Signals) -> Task:
            task = _get(tx, tenant, task_id)
            if task.created_by != actor.principal:
                raise TalariaError("not_author", "only the task's author may submit it")
            return submit_in(tx, now, actor, task)

        return self.write(run)

    def approve_task(self, actor: Actor, *, tenant: str, task_id: str) -> Task:
        return self.write(lambda tx, now, signals: _approve(self.settings, tx, now, actor, tenant, task_id))

    def reject_task(self, actor: Actor, *, tenant: str, task_id: str, reason: str) -> Task:
        def run(tx: Tx, now: int, signals: Signals) -> Task:
            task = _get(tx, tenant, task_id)
            next_task_state(task.state, TaskOp.REJECT)
            _check_approver(self.settings, actor, task)
            return _move(
                tx,
                now,
                task,
                TaskOp.REJECT,
                actor,
                rejected_by=actor.principal,
                rejected_at=now,
                rejection_reason=reason,
                finished_at=now,
            )

        return self.write(run)

    def dispatch(self, actor: Actor, *, tenant: str, task_id: str) -> tuple[Task, Dispatch, Job]:
        """An APPROVED task's Dispatch and QUEUED job; ``not_approved`` in any other state."""
        return self.write(
            lambda tx, now, signals: dispatch_in(self.settings, tx, now, actor, _get(tx, tenant, task_id), signals)
        )

    def approve_and_dispatch(self, actor: Actor, *, tenant: str, task_id: str) -> tuple[Task, Dispatch, Job]:
        """Approval and dispatch in ONE transaction: no approved task is left without its dispatch."""

        def run(tx: Tx, now: int, signals: Signals) -> tuple[Task, Dispatch, Job]:
            approved = _approve(self.settings, tx, now, actor, tenant, task_id)
            return dispatch_in(self.settings, tx, now, actor, approved, signals)

        return self.write(run)

    def cancel_task(self, actor: Actor, *, tenant: str, task_id: str, reason: str) -> Task:
        """Cancel before dispatch, or, on a DISPATCHED task, the admin cancel of its job (rows 8, 9)."""

        def run(tx: Tx, now: int, signals: Signals) -> Task:
            task = _get(tx, tenant, task_id)
            if task.created_by != actor.principal and not actor.has(PLATFORM_ADMIN):
                raise TalariaError("role_forbidden", "only the author or an admin may cancel a task")
            if task.state != TaskState.DISPATCHED:
                return cancel_undispatched(tx, now, actor, task)
            found = tx.one("dispatch_get_by_task", task_id=task_id)
            row = tx.one("job_get", tenant=tenant, id=found["job_id"]) if found else None
            if found is None or row is None:
                raise TalariaError("dispatch_missing", "the task's dispatch or job is missing")
            dispatch = Dispatch.from_row(found)
            binding = dispatch.binding(actor.principal)
            admin_cancel_in(tx, now, actor, Job.from_row(row), dispatch, binding, reason, None, signals)
            return _get(tx, tenant, task_id)

        return self.write(run)
