"""Task operations and dispatch (lifecycle.md 3). Each is one write transaction with a task.* event."""

from __future__ import annotations

import json
from typing import Any

from talaria.canonical import canonical_json, digest
from talaria.clock import rfc3339
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.lifecycle.actor import PLATFORM_ADMIN, Actor
from talaria.lifecycle.binding import Binding, persisted_binding
from talaria.lifecycle.context import Context
from talaria.lifecycle.jobs import admin_cancel_in
from talaria.lifecycle.machine import TaskOp, TaskState, next_task_state
from talaria.store.interface import Row, Tx


def content_digest(task: Row) -> str:
    return digest(
        {
            "title": task["title"],
            "spec": json.loads(task["spec"]),
            "cell": task["cell"],
            "profile": task["profile"],
        }
    )


def provenance_record(task: Row, *, approved_by: str, approved_at: int) -> dict[str, Any]:
    return {
        "tenant": task["tenant"],
        "task": task["id"],
        "createdBy": task["created_by"],
        "approvedBy": approved_by,
        "approvedAt": rfc3339(approved_at),
        "contentDigest": content_digest(task),
    }


def _get(tx: Tx, tenant: str, task_id: str) -> Row:
    task = tx.one("task_get", tenant=tenant, id=task_id)
    if task is None:
        raise TalariaError("not_found", "no such task")
    return task


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
    task: Row,
    op: TaskOp,
    actor: Actor,
    *,
    subject: audit.Subject | None = None,
    binding: Binding | None = None,
    **changes: Any,
) -> Row:
    """Persist one task transition (conditional on state and revision) with its task.* event."""
    to_state = next_task_state(task["state"], op)
    after = dict(task) | changes | {"state": to_state, "revision": task["revision"] + 1}
    count = tx.run(
        "task_update",
        id=task["id"],
        expected_state=task["state"],
        expected_revision=task["revision"],
        **{
            k: after[k]
            for k in (
                "state",
                "revision",
                "provenance",
                "submitted_at",
                "approved_by",
                "approved_at",
                "rejected_by",
                "rejected_at",
                "rejection_reason",
                "finished_at",
            )
        },
    )
    if count != 1:
        raise TalariaError("invalid_transition", "the task changed; read it again")
    audit.append(
        tx,
        now_ms=now,
        type=_AUDIT_TYPE[op],
        tenant=task["tenant"],
        actor=actor,
        subject=subject or audit.Subject(task["id"]),
        binding=binding,
        from_state=task["state"],
        to_state=to_state,
        revision_before=task["revision"],
        revision_after=after["revision"],
    )
    return after


def create_task(
    ctx: Context,
    actor: Actor,
    *,
    tenant: str,
    title: str,
    spec: dict[str, Any],
    cell: str,
    profile: str,
    trace: str,
) -> Row:
    def run(tx: Tx, now: int, signals: list[tuple[str, str]]) -> Row:
        task_id = mint("tsk", now)
        tx.run(
            "task_insert",
            id=task_id,
            tenant=tenant,
            title=title,
            spec=canonical_json(spec).decode("utf-8"),
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
            subject=audit.Subject(task_id),
            to_state=TaskState.DRAFT,
            revision_after=1,
        )
        return _get(tx, tenant, task_id)

    return ctx.write(run)


def submit_task(ctx: Context, actor: Actor, *, tenant: str, task_id: str) -> Row:
    def run(tx: Tx, now: int, signals: list[tuple[str, str]]) -> Row:
        task = _get(tx, tenant, task_id)
        if task["created_by"] != actor.principal:
            raise TalariaError("not_author", "only the task's author may submit it")
        return _move(tx, now, task, TaskOp.SUBMIT, actor, submitted_at=now)

    return ctx.write(run)


def _check_approver(ctx: Context, actor: Actor, task: Row) -> None:
    if not actor.has(PLATFORM_ADMIN):
        raise TalariaError("role_forbidden", "approving and rejecting need an admin")
    if task["created_by"] == actor.principal and not ctx.settings.approval_allow_self_approval:
        raise TalariaError("self_approval_forbidden", "the author of a task may not approve or reject it")


def _approve(ctx: Context, tx: Tx, now: int, actor: Actor, tenant: str, task_id: str) -> Row:
    task = _get(tx, tenant, task_id)
    next_task_state(task["state"], TaskOp.APPROVE)
    _check_approver(ctx, actor, task)
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


def approve_task(ctx: Context, actor: Actor, *, tenant: str, task_id: str) -> Row:
    return ctx.write(lambda tx, now, signals: _approve(ctx, tx, now, actor, tenant, task_id))


def reject_task(ctx: Context, actor: Actor, *, tenant: str, task_id: str, reason: str) -> Row:
    def run(tx: Tx, now: int, signals: list[tuple[str, str]]) -> Row:
        task = _get(tx, tenant, task_id)
        next_task_state(task["state"], TaskOp.REJECT)
        _check_approver(ctx, actor, task)
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

    return ctx.write(run)


def cancel_undispatched(tx: Tx, now: int, actor: Actor, task: Row) -> Row:
    """``cancel_task`` before dispatch; the caller has checked who may cancel."""
    if tx.one("dispatch_get_by_task", task_id=task["id"]) is not None:
        raise TalariaError("invalid_transition", "the task has a dispatch")
    return _move(tx, now, task, TaskOp.CANCEL, actor, finished_at=now)


def dispatch_in(
    ctx: Context, tx: Tx, now: int, actor: Actor, tenant: str, task_id: str, signals: list[tuple[str, str]]
) -> tuple[Row, Row, Row]:
    """Dispatch first (lifecycle.md 3): Dispatch row, then the QUEUED job, then the Task, in ``tx``."""
    task = _get(tx, tenant, task_id)
    next_task_state(task["state"], TaskOp.DISPATCH)
    if tx.one("dispatch_get_by_task", task_id=task_id) is not None:
        raise TalariaError("not_approved", "the task is already dispatched")
    dispatch_id, job_id, run_id = mint("dsp", now), mint("job", now), mint("run", now)
    tx.run(
        "dispatch_insert",
        id=dispatch_id,
        tenant=tenant,
        task_id=task_id,
        job_id=job_id,
        run_id=run_id,
        trace=task["trace"],
        provenance=task["provenance"],
        cell=task["cell"],
        profile=task["profile"],
        created_by=actor.principal,
        now=now,
    )
    max_attempts = ctx.settings.max_attempts_for(task["cell"], task["profile"])
    max_life_s = ctx.settings.max_life_for(task["cell"], task["profile"])
    tx.run(
        "job_insert",
        id=job_id,
        tenant=tenant,
        task_id=task_id,
        dispatch_id=dispatch_id,
        run_id=run_id,
        trace=task["trace"],
        provenance=task["provenance"],
        cell=task["cell"],
        profile=task["profile"],
        max_attempts=max_attempts,
        max_life_s=max_life_s,
        now=now,
    )
    binding = Binding(
        tenant,
        task_id,
        task["trace"],
        actor.principal,
        task["provenance"],
        run_id,
        dispatch_id,
        job_id,
        task["cell"],
        task["profile"],
    )
    task_after = _move(
        tx,
        now,
        task,
        TaskOp.DISPATCH,
        actor,
        binding=binding,
        subject=audit.Subject(task_id, dispatch_id, job_id),
    )
    job = tx.one("job_get", tenant=tenant, id=job_id)
    dispatch = tx.one("dispatch_get", id=dispatch_id)
    assert job is not None and dispatch is not None
    event_id = audit.append(
        tx,
        now_ms=now,
        type="hermes.job.enqueued",
        tenant=tenant,
        actor=actor,
        subject=audit.Subject(task_id, dispatch_id, job_id),
        binding=binding,
        to_state="QUEUED",
        revision_after=1,
        lease_epoch=0,
    )
    _enqueue_evidence(tx, now, job, actor, event_id)
    signals.append(("enqueued", job_id))
    return task_after, dispatch, job


def _enqueue_evidence(tx: Tx, now: int, job: Row, actor: Actor, event_id: str) -> None:
    payload = {
        "task": job["task_id"],
        "dispatch": job["dispatch_id"],
        "run": job["run_id"],
        "cell": job["cell"],
        "profile": job["profile"],
        "max_attempts": job["max_attempts"],
        "max_life_s": job["max_life_s"],
    }
    data = canonical_json(payload)
    tx.run(
        "evidence_insert",
        evidence_id=mint("evd", now),
        job_id=job["id"],
        task_id=job["task_id"],
        run_id=job["run_id"],
        dispatch_id=job["dispatch_id"],
        kind="enqueue",
        payload=data.decode("utf-8"),
        content_digest=digest(payload),
        produced_by=canonical_json({"principal": actor.principal, "worker_instance": None, "lease_epoch": 0}).decode(
            "utf-8"
        ),
        now=now,
        audit_event_id=event_id,
    )


def dispatch(ctx: Context, actor: Actor, *, tenant: str, task_id: str) -> tuple[Row, Row, Row]:
    return ctx.write(lambda tx, now, signals: dispatch_in(ctx, tx, now, actor, tenant, task_id, signals))


def approve_and_dispatch(ctx: Context, actor: Actor, *, tenant: str, task_id: str) -> tuple[Row, Row, Row]:
    """Approval and dispatch in ONE transaction: no approved task is left without its dispatch."""

    def run(tx: Tx, now: int, signals: list[tuple[str, str]]) -> tuple[Row, Row, Row]:
        _approve(ctx, tx, now, actor, tenant, task_id)
        return dispatch_in(ctx, tx, now, actor, tenant, task_id, signals)

    return ctx.write(run)


def cancel_task(ctx: Context, actor: Actor, *, tenant: str, task_id: str, reason: str) -> Row:
    """Cancel before dispatch, or, on a DISPATCHED task, the admin cancel of its job (rows 8, 9)."""

    def run(tx: Tx, now: int, signals: list[tuple[str, str]]) -> Row:
        task = _get(tx, tenant, task_id)
        if task["created_by"] != actor.principal and not actor.has(PLATFORM_ADMIN):
            raise TalariaError("role_forbidden", "only the author or an admin may cancel a task")
        if task["state"] != TaskState.DISPATCHED:
            return cancel_undispatched(tx, now, actor, task)
        dispatch = tx.one("dispatch_get_by_task", task_id=task_id)
        job = tx.one("job_get", tenant=tenant, id=dispatch["job_id"]) if dispatch else None
        if dispatch is None or job is None:
            raise TalariaError("dispatch_missing", "the task's dispatch or job is missing")
        admin_cancel_in(tx, now, actor, job, persisted_binding(dispatch, actor.principal), reason, None, signals)
        return _get(tx, tenant, task_id)

    return ctx.write(run)
