"""The holder's release (ADR 0030): give the lease back before the work could start, so the next attempt runs.

Only the in-process dispatcher calls it, when its runner answered a transient refusal before anything was
submitted (``hermes_unavailable``): nothing ran, so running again is safe. It applies the holder rules of
lifecycle.md 5 and then ends the lease the way expiry does (rows 10-12): back to ``QUEUED`` with the lease
cleared and ``lease_epoch`` + 1 (audit ``hermes.job.requeued``, evidence ``requeue``, reason the error's
code); ``FAILED`` with the error when the job has used its ``max_attempts``; ``CANCELLED`` when a cancel was
requested. ``fail`` itself still never requeues (lifecycle.md 4).
"""

from __future__ import annotations

from typing import Any

from talaria.canonical import digest
from talaria.errors import TalariaError
from talaria.lifecycle import journal
from talaria.lifecycle.actor import RUNTIME, Actor
from talaria.lifecycle.answers import Ended, Released, Reply, Requeued
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import Context, IdemRequest, Refusal, Signals
from talaria.lifecycle.endings import HolderEnding, holder_end_in
from talaria.lifecycle.frame import Bound, caller_identity, expired_refusal, keyed, lease_rules, require_role
from talaria.lifecycle.machine import TERMINAL, JobOp, JobState, next_job_state
from talaria.lifecycle.records import LeaseRef
from talaria.store.interface import Tx

CANCEL_REASON = "released while a cancel was requested"


class ReleaseEntries(Context):
    def release(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        lease: LeaseRef,
        error: dict[str, Any],
        idem: IdemRequest | None = None,
    ) -> Reply[Released]:
        """Give the lease back with ``error`` (``code``, ``message``, ``retryable``): requeued, or ended."""
        require_role(actor, RUNTIME)
        caller_identity(actor, binding, job_id)

        def body(tx: Tx, now: int, signals: Signals, bound: Bound) -> Reply[Released] | Refusal:
            job, dispatch = bound.job, bound.dispatch
            if job.state in TERMINAL:
                raise TalariaError("terminal_conflict", "the job has already ended")
            if lease_rules(now, actor, job, JobOp.RELEASE, lease):
                return expired_refusal(tx, now, actor, job, dispatch, signals)
            to_state = next_job_state(
                job.state,
                JobOp.RELEASE,
                exhausted=job.attempt >= job.max_attempts,
                cancel_requested=job.cancel_requested,
            )
            epoch = job.lease_epoch + 1
            if to_state == JobState.QUEUED:
                after = journal.apply(
                    tx,
                    now,
                    before=job,
                    changes=dict(journal.CLEARED_LEASE, lease_epoch=epoch, state=to_state),
                    actor=actor,
                    audit_type="hermes.job.requeued",
                    evidence_kind="requeue",
                    evidence_payload={"reason_code": error["code"], "lease_epoch": epoch, "error": error},
                    binding=binding,
                    idem=idem,
                    reason_code=error["code"],
                    worker_instance=job.lease_owner_instance,
                )
                signals.append(("requeued", job.id))
                return Reply(Requeued(job.id, after.revision, job.attempt))
            if to_state == JobState.CANCELLED:
                ending = HolderEnding(JobOp.HOLDER_CANCEL, binding, lease, {"reason": CANCEL_REASON},
                                      {"reason": CANCEL_REASON}, "holder_cancel", idem)  # fmt: skip
            else:
                ending = HolderEnding(JobOp.FAIL, binding, lease, error, {"error": error}, str(error["code"]), idem)
            ended = Ended(job.id, to_state, job.revision + 1, digest(ending.payload))
            reply = holder_end_in(tx, now, actor, job, dispatch, ending, ended, signals)
            return Reply(reply.answer, reply.body)

        return keyed(self, actor, "release", job_id, binding, idem, body)
