"""The frame every keyed job call runs in (lifecycle.md 6.5): role and binding step 1 before the
transaction; inside it, the idempotency lookup, binding steps 2-4, the operation, and the key.
Also the holder rules of section 5 that start, heartbeat and the terminal calls share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from talaria.errors import TalariaError
from talaria.lifecycle import answers, journal
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.answers import JobAnswer, Reply
from talaria.lifecycle.binding import Binding, check_dispatch, check_identity, check_job
from talaria.lifecycle.context import Context, IdemRequest, Refusal, Signals
from talaria.lifecycle.expiry import expire
from talaria.lifecycle.machine import JobOp, allowed
from talaria.lifecycle.records import Dispatch, Job, LeaseRef
from talaria.store.interface import Tx

A = TypeVar("A", bound=JobAnswer)


def require_role(actor: Actor, role: str) -> None:
    if not actor.has(role):
        raise TalariaError("role_forbidden", f"this operation needs the role {role}")


def caller_identity(actor: Actor, binding: Binding, job_id: str) -> None:
    """Binding step 1 against the caller; the tenant is required."""
    if actor.tenant is None:
        raise TalariaError("role_forbidden", "the caller has no tenant")
    check_identity(binding, tenant=actor.tenant, principal=actor.principal, path_job=job_id)


@dataclass(frozen=True, slots=True)
class Bound:
    """A job that passed binding steps 2-4, with its Dispatch and its Task's state and approver."""

    job: Job
    dispatch: Dispatch
    task_state: str | None  # None: the Task row is missing
    task_approved_by: str | None


def load_bound(tx: Tx, binding: Binding, job_id: str, actor: Actor) -> Bound:
    """Binding steps 2-4 (one read): the job of the tenant, its Dispatch, and every persisted field. A job only
    the in-process dispatcher may run is, through the Runtime API, exactly an unknown job."""
    row = tx.one("job_get_bound", tenant=binding.tenant, id=job_id)
    if row is None or (row["in_process_only"] and not actor.sees_in_process_jobs):
        raise TalariaError("job_not_found", "no such job")
    job = Job.from_row(row)
    if row["d_id"] is None:
        raise TalariaError("dispatch_missing", "the job's dispatch is missing")
    dispatch = Dispatch.from_row(row, "d_")
    check_dispatch(binding, dispatch)
    check_job(binding, job)
    return Bound(job, dispatch, row["t_state"], row["t_approved_by"])


def _replay(tx: Tx, now: int, actor: Actor, operation: str, job_id: str, idem: IdemRequest) -> Reply[A] | None:
    row = tx.one(
        "idempotency_get",
        principal=actor.principal,
        operation=operation,
        job_id=job_id,
        key_hash=idem.key_hash,
        now=now,
    )
    if row is None:
        return None
    if row["request_digest"] != idem.request_digest:
        raise TalariaError("idempotency_key_reused", "this Idempotency-Key was used with another request")
    body = bytes(row["response_body"])
    return Reply(answers.decode(operation, body), body, replayed=True)


def keyed(
    ctx: Context,
    actor: Actor,
    operation: str,
    job_id: str,
    binding: Binding,
    idem: IdemRequest | None,
    body: Callable[[Tx, int, Signals, Bound], Reply[A] | Refusal],
) -> Reply[A]:
    """Idempotency lookup, binding steps 2-4, then ``body``; an applied answer stores the key."""

    def run(tx: Tx, now: int, signals: Signals) -> Reply[A] | Refusal:
        if idem is not None:
            replay: Reply[A] | None = _replay(tx, now, actor, operation, job_id, idem)
            if replay is not None:
                return replay
        out = body(tx, now, signals, load_bound(tx, binding, job_id, actor))
        if idem is None or isinstance(out, Refusal) or not out.applied:
            return out
        made = answers.body_of(out)
        journal.store_key(
            tx,
            now,
            idem=idem,
            principal=actor.principal,
            operation=operation,
            job_id=job_id,
            body=made,
            revision_after=out.answer.revision,
            retention_s=ctx.settings.lifecycle_idempotency_retention_s,
        )
        return Reply(out.answer, made)

    return ctx.write(run)


def lease_rules(now: int, actor: Actor, job: Job, op: JobOp, lease: LeaseRef) -> bool:
    """Holder rules 1-3 (raise) and rule 4 (returns True when the lease is past its expiry)."""
    if lease.lease_epoch < job.lease_epoch:
        raise TalariaError("stale_lease", "a newer lease of this job exists")
    if not allowed(job.state, op):
        raise TalariaError("invalid_transition", f"{op.value} is not allowed from {job.state}")
    if (
        lease.lease_epoch > job.lease_epoch
        or lease.lease_id != job.lease_id
        or actor.principal != job.lease_owner_principal
    ):
        raise TalariaError("lease_mismatch", "the lease is held by someone else")
    return job.lease_expires_at is not None and now >= job.lease_expires_at


def expired_refusal(tx: Tx, now: int, actor: Actor, job: Job, dispatch: Dispatch, signals: Signals) -> Refusal:
    """Rule 4: commit the expiry found by the holder's call, then refuse the call."""
    expire(tx, now, job, dispatch, actor=actor, reason="lease_expired", signals=signals)
    return Refusal(TalariaError("lease_expired", "the lease expired; stop work"))
