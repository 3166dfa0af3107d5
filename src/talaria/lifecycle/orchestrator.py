"""The orchestrator: the only code that moves a dispatched Task and its Dispatch to a terminal state.

``reconcile_hermes`` runs inside the terminal job transition's transaction (lifecycle.md 7); any
error it raises rolls the whole transition back.
"""

from __future__ import annotations

from talaria.errors import TalariaError
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.binding import Binding, check_dispatch
from talaria.lifecycle.machine import TaskOp, TaskState, next_task_state
from talaria.lifecycle.records import Dispatch, Job, Task
from talaria.store.interface import Tx


class Orchestrator:
    @staticmethod
    def reconcile_hermes(
        tx: Tx,
        *,
        now: int,
        actor: Actor,
        job: Job,
        dispatch: Dispatch,
        terminal_kind: str,
        result_digest: str,
        binding: Binding,
        lease_epoch: int,
    ) -> str:
        """Returns ``reconciled`` or ``already_reconciled``; raises ``terminal_conflict`` or
        ``reconcile_rejected`` (both 409).

        ``job`` is the job as the terminal transition just wrote it and ``dispatch`` its Dispatch as read
        in the same transaction (nothing else writes between), so neither is read again."""
        if dispatch.id != binding.dispatch:
            raise TalariaError("reconcile_rejected", "the job's dispatch is missing")
        try:
            check_dispatch(binding, dispatch)
        except TalariaError as exc:
            raise TalariaError("reconcile_rejected", "the dispatch does not match the binding") from exc
        if job.tenant != binding.tenant or job.terminal_kind != terminal_kind or job.terminal_epoch != lease_epoch:
            raise TalariaError("reconcile_rejected", "the job row does not hold this terminal outcome")
        existing = tx.one("reconciliation_get", job_id=job.id)
        if existing is not None:
            if (existing["terminal_kind"], existing["result_digest"]) == (terminal_kind, result_digest):
                return "already_reconciled"
            raise TalariaError("terminal_conflict", "the job was reconciled with another outcome")
        row = tx.one("task_get", tenant=binding.tenant, id=binding.task)
        task = Task.from_row(row) if row is not None else None
        if task is None or task.state != TaskState.DISPATCHED or dispatch.status != "OPEN":
            raise TalariaError("reconcile_rejected", "the task is not DISPATCHED or its dispatch not OPEN")
        to_state = next_task_state(task.state, TaskOp.RECONCILE, terminal_kind=terminal_kind)
        changed = tx.run(
            "task_update",
            id=task.id,
            expected_state=task.state,
            expected_revision=task.revision,
            state=to_state,
            revision=task.revision + 1,
            provenance=task.provenance,
            submitted_at=task.submitted_at,
            approved_by=task.approved_by,
            approved_at=task.approved_at,
            rejected_by=task.rejected_by,
            rejected_at=task.rejected_at,
            rejection_reason=task.rejection_reason,
            finished_at=now,
        )
        if (
            changed != 1
            or tx.run("dispatch_finish", id=dispatch.id, status=terminal_kind, now=now, result_digest=result_digest)
            != 1
        ):
            raise TalariaError("reconcile_rejected", "the task or dispatch changed during reconcile")
        tx.run(
            "reconciliation_insert",
            job_id=job.id,
            terminal_kind=terminal_kind,
            result_digest=result_digest,
            lease_epoch=lease_epoch,
            now=now,
        )
        audit.append(
            tx,
            now_ms=now,
            type="task.reconciled",
            tenant=task.tenant,
            actor=actor,
            subject=audit.Subject(task.id, dispatch.id, job.id),
            binding=binding,
            from_state=task.state,
            to_state=to_state,
            revision_before=task.revision,
            revision_after=task.revision + 1,
            lease_epoch=lease_epoch,
        )
        return "reconciled"
