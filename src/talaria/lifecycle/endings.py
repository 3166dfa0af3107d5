"""Ending a job (lifecycle.md 4 rows 5-9, 13; section 6.6): complete, fail, holder and admin cancel.

A terminal transition writes the Result and calls ``reconcile_hermes`` in its transaction, and keeps its
answer's bytes as the job's ``terminal_response`` for terminal replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from talaria.canonical import digest
from talaria.errors import TalariaError
from talaria.lifecycle import journal
from talaria.lifecycle.actor import PLATFORM_ADMIN, RUNTIME, Actor
from talaria.lifecycle.answers import Cancelled, CancelPending, Ended, Reply, encode
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import Context, IdemRequest, Refusal, Signals
from talaria.lifecycle.frame import Bound, caller_identity, expired_refusal, keyed, lease_rules, require_role
from talaria.lifecycle.machine import (
    ADMIN_CANCEL_AUDIT_TYPE,
    ADMIN_CANCEL_EVIDENCE_KIND,
    AUDIT_TYPE,
    CANCEL_FLAG_AUDIT_TYPE,
    CANCEL_FLAG_EVIDENCE_KIND,
    EVIDENCE_KIND,
    TERMINAL,
    TERMINAL_OF_OP,
    JobOp,
    next_job_state,
)
from talaria.lifecycle.records import Dispatch, Job, LeaseRef
from talaria.store.interface import Tx

# The idempotency operation of each holder's terminal call (holder and admin cancel share "cancel").
_OPERATION = {JobOp.COMPLETE: "complete", JobOp.FAIL: "fail", JobOp.HOLDER_CANCEL: "cancel"}


def terminal_in(
    tx: Tx,
    now: int,
    actor: Actor,
    job: Job,
    dispatch: Dispatch,
    *,
    audit_type: str,
    evidence_kind: str,
    binding: Binding,
    lease: LeaseRef | None,
    epoch: int,
    answer: Ended,
    payload: Any,
    evidence_payload: Any,
    reason_code: str | None,
    idem: IdemRequest | None,
    signals: Signals,
) -> Reply[Ended]:
    """Rows 5-8: the terminal job row, its Result, and reconcile, in ``tx``."""
    response = encode(answer)
    after = journal.apply(
        tx,
        now,
        before=job,
        changes=dict(journal.CLEARED_LEASE)
        | {
            "state": answer.state,
            "finished_at": now,
            "terminal_kind": answer.state,
            "terminal_reason": reason_code,
            "terminal_lease_id": lease.lease_id if lease is not None else None,
            "terminal_epoch": epoch,
            "result_digest": answer.result_digest,
            "terminal_response": response,
        },
        actor=actor,
        audit_type=audit_type,
        evidence_kind=evidence_kind,
        evidence_payload=evidence_payload,
        binding=binding,
        idem=idem,
        reason_code=reason_code,
        worker_instance=job.lease_owner_instance,
        statement="job_finish",
    )
    journal.conclude(
        tx,
        now,
        ended=after,
        dispatch=dispatch,
        payload=payload,
        actor=actor,
        binding=binding,
        worker_instance=job.lease_owner_instance,
        signals=signals,
    )
    return Reply(answer, response)


@dataclass(frozen=True, slots=True)
class HolderEnding:
    """What a holder ends its job with (rows 5-7): the operation, its lease, payloads and reason."""

    op: JobOp
    binding: Binding
    lease: LeaseRef
    payload: Any
    evidence_payload: Any
    reason_code: str | None
    idem: IdemRequest | None


def holder_end_in(
    tx: Tx, now: int, actor: Actor, job: Job, dispatch: Dispatch, ending: HolderEnding, answer: Ended, signals: Signals
) -> Reply[Ended]:
    """Rows 5-7 by the lease's holder (complete, fail, holder cancel, and a release that ends the job)."""
    return terminal_in(
        tx,
        now,
        actor,
        job,
        dispatch,
        audit_type=AUDIT_TYPE[ending.op],
        evidence_kind=EVIDENCE_KIND[ending.op],
        binding=ending.binding,
        lease=ending.lease,
        epoch=ending.lease.lease_epoch,
        answer=answer,
        payload=ending.payload,
        evidence_payload=ending.evidence_payload,
        reason_code=ending.reason_code,
        idem=ending.idem,
        signals=signals,
    )


def admin_cancel_in(
    tx: Tx,
    now: int,
    actor: Actor,
    job: Job,
    dispatch: Dispatch,
    binding: Binding,
    reason: str,
    idem: IdemRequest | None,
    signals: Signals,
) -> Reply[Cancelled]:
    """Rows 8 and 9 inside a transaction; a repeated request while the flag is set is a no-op 200."""
    if job.state in TERMINAL:
        raise TalariaError("terminal_conflict", "the job has ended")
    to_state = next_job_state(job.state, JobOp.ADMIN_CANCEL)
    if to_state in TERMINAL:
        ended = Ended(job.id, to_state, job.revision + 1, digest({"reason": reason}), cancel_requested=False)
        reply = terminal_in(
            tx,
            now,
            actor,
            job,
            dispatch,
            audit_type=ADMIN_CANCEL_AUDIT_TYPE,
            evidence_kind=ADMIN_CANCEL_EVIDENCE_KIND,
            binding=binding,
            lease=None,
            epoch=job.lease_epoch,
            answer=ended,
            payload={"reason": reason},
            evidence_payload={"reason": reason},
            reason_code="admin_cancel",
            idem=idem,
            signals=signals,
        )
        return Reply(reply.answer, reply.body)
    if job.cancel_requested:
        return Reply(CancelPending(job.id, job.state, job.revision), applied=False)
    after = journal.apply(
        tx,
        now,
        before=job,
        actor=actor,
        audit_type=CANCEL_FLAG_AUDIT_TYPE,
        changes={"cancel_requested": True, "cancel_requested_at": now, "cancel_requested_by": actor.principal},
        evidence_kind=CANCEL_FLAG_EVIDENCE_KIND,
        evidence_payload={"reason": reason},
        binding=binding,
        idem=idem,
    )
    signals.append(("cancel_requested", job.id))
    return Reply(CancelPending(after.id, after.state, after.revision))


class EndEntries(Context):
    def _finish(
        self,
        actor: Actor,
        op: JobOp,
        *,
        job_id: str,
        binding: Binding,
        lease: LeaseRef,
        payload: dict[str, Any],
        evidence_payload: dict[str, Any],
        reason_code: str | None,
        idem: IdemRequest | None,
    ) -> Reply[Ended]:
        """Complete, fail and holder cancel: rows 5-7 with Result and reconcile, or terminal replay."""
        require_role(actor, RUNTIME)
        caller_identity(actor, binding, job_id)
        result_digest = digest(payload)

        def body(tx: Tx, now: int, signals: Signals, bound: Bound) -> Reply[Ended] | Refusal:
            job, dispatch = bound.job, bound.dispatch
            if job.state in TERMINAL:
                if (
                    job.terminal_kind == TERMINAL_OF_OP[op]
                    and job.terminal_lease_id == lease.lease_id
                    and job.terminal_epoch == lease.lease_epoch
                    and job.result_digest == result_digest
                    and job.terminal_response is not None
                ):  # row 13: the exact terminal replay
                    cancel = job.cancel_requested if op is JobOp.HOLDER_CANCEL else None
                    shown = Ended(job.id, job.state, job.revision, result_digest, cancel)
                    return Reply(shown, job.terminal_response, applied=False)
                raise TalariaError("terminal_conflict", "the job has already ended with another outcome")
            if lease_rules(now, actor, job, op, lease):
                return expired_refusal(tx, now, actor, job, dispatch, signals)
            cancel = job.cancel_requested if op is JobOp.HOLDER_CANCEL else None
            ended = Ended(job.id, next_job_state(job.state, op), job.revision + 1, result_digest, cancel)
            ending = HolderEnding(op, binding, lease, payload, evidence_payload, reason_code, idem)
            return holder_end_in(tx, now, actor, job, dispatch, ending, ended, signals)

        return keyed(self, actor, _OPERATION[op], job_id, binding, idem, body)

    def complete(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        lease: LeaseRef,
        result: dict[str, Any],
        idem: IdemRequest | None = None,
    ) -> Reply[Ended]:
        """Row 5: RUNNING to SUCCEEDED with the result."""
        return self._finish(
            actor,
            JobOp.COMPLETE,
            job_id=job_id,
            binding=binding,
            lease=lease,
            payload=result,
            evidence_payload={"result": result},
            reason_code=None,
            idem=idem,
        )

    def fail(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        lease: LeaseRef,
        error: dict[str, Any],
        idem: IdemRequest | None = None,
    ) -> Reply[Ended]:
        """Row 6: to FAILED with the error (``error.retryable`` is only stored)."""
        return self._finish(
            actor,
            JobOp.FAIL,
            job_id=job_id,
            binding=binding,
            lease=lease,
            payload=error,
            evidence_payload={"error": error},
            reason_code=error["code"],
            idem=idem,
        )

    def cancel(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        reason: str,
        lease: LeaseRef | None = None,
        idem: IdemRequest | None = None,
    ) -> Reply[Cancelled]:
        """Holder cancel (row 7) with ``lease``; admin cancel (rows 8, 9) without."""
        if lease is not None:
            ended = self._finish(
                actor,
                JobOp.HOLDER_CANCEL,
                job_id=job_id,
                binding=binding,
                lease=lease,
                payload={"reason": reason},
                evidence_payload={"reason": reason},
                reason_code="holder_cancel",
                idem=idem,
            )
            return Reply(ended.answer, ended.body, ended.replayed)
        require_role(actor, PLATFORM_ADMIN)
        caller_identity(actor, binding, job_id)

        def body(tx: Tx, now: int, signals: Signals, bound: Bound) -> Reply[Cancelled]:
            return admin_cancel_in(tx, now, actor, bound.job, bound.dispatch, binding, reason, idem, signals)

        return keyed(self, actor, "cancel", job_id, binding, idem, body)
