"""Lease expiry (rows 10-12 of lifecycle.md 4): the reaper sweep and the shared expiry step."""

from __future__ import annotations

import structlog

from talaria.canonical import digest
from talaria.errors import TalariaError
from talaria.lifecycle import journal
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.answers import Ended, encode
from talaria.lifecycle.context import Context, Signals
from talaria.lifecycle.machine import LEASED_STATES, JobOp, JobState, next_job_state
from talaria.lifecycle.records import Dispatch, Job
from talaria.limits import REAPER_BATCH
from talaria.store.interface import Tx

log = structlog.get_logger("talaria.lifecycle")

EXHAUSTED = "lease_expired_exhausted"
CANCEL_REQUESTED = "lease_expired_cancel_requested"


def expire(
    tx: Tx, now: int, job: Job, dispatch: Dispatch | None, *, actor: Actor, reason: str, signals: Signals
) -> Job:
    """Expire a due lease in ``tx``: requeue (row 10), or end FAILED (11) or CANCELLED (12).

    ``dispatch`` is the job's Dispatch when the caller has read it in ``tx`` (else it is read here)."""
    cancel = job.cancel_requested
    to_state = next_job_state(
        job.state, JobOp.EXPIRE, exhausted=job.attempt >= job.max_attempts, cancel_requested=cancel
    )
    epoch = job.lease_epoch + 1
    base = dict(journal.CLEARED_LEASE, lease_epoch=epoch, state=to_state)
    if to_state == JobState.QUEUED:
        after = journal.apply(
            tx,
            now,
            before=job,
            changes=base,
            actor=actor,
            audit_type="hermes.job.requeued",
            evidence_kind="requeue",
            evidence_payload={"reason_code": reason, "lease_epoch": epoch},
            binding=None,
            reason_code=reason,
            require_due=True,
            require_no_cancel=True,
        )
        signals.append(("requeued", job.id))
        return after
    code = CANCEL_REQUESTED if cancel else EXHAUSTED
    result_digest = digest({"reason_code": code})
    changes = base | {
        "finished_at": now,
        "terminal_kind": to_state,
        "terminal_reason": code,
        "terminal_lease_id": None,
        "terminal_epoch": epoch,
        "result_digest": result_digest,
        "terminal_response": encode(Ended(job.id, to_state, job.revision + 1, result_digest)),
    }
    after = journal.apply(
        tx,
        now,
        before=job,
        changes=changes,
        actor=actor,
        audit_type="hermes.job.cancelled" if cancel else "hermes.job.failed",
        evidence_kind="expire",
        evidence_payload={"reason_code": code, "lease_epoch": epoch},
        binding=None,
        reason_code=code,
        require_due=True,
    )
    if dispatch is None:
        row = tx.one("dispatch_get", id=job.dispatch_id)
        if row is None:
            raise TalariaError("reconcile_rejected", "the job's dispatch is missing")
        dispatch = Dispatch.from_row(row)
    journal.conclude(
        tx,
        now,
        ended=after,
        dispatch=dispatch,
        payload={"reason_code": code},
        actor=actor,
        binding=dispatch.binding(actor.principal),
        worker_instance=None,
        signals=signals,
    )
    return after


def expire_all_due(tx: Tx, now: int, *, actor: Actor, reason: str, limit: int, signals: Signals) -> int:
    rows = tx.all("job_due_lock", now=now, limit=limit)
    for row in rows:
        expire(tx, now, Job.from_row(row), None, actor=actor, reason=reason, signals=signals)
    return len(rows)


def expire_due(ctx: Context, actor: Actor, *, reason: str = "lease_expired_by_reaper") -> int:
    """One reaper sweep: expire due leases, at most ``REAPER_BATCH`` per transaction, oldest first.

    A batch that fails (a job whose dispatch was tampered with) is retried one job per transaction
    so that one broken row cannot stall every other expiry; the broken row is logged and skipped.
    """
    total = 0
    while True:
        try:
            count = ctx.write(
                lambda tx, now, signals: expire_all_due(
                    tx, now, actor=actor, reason=reason, limit=REAPER_BATCH, signals=signals
                )
            )
        except TalariaError as exc:
            if exc.code == "store_unavailable":
                raise
            return total + _expire_one_by_one(ctx, actor, reason)
        total += count
        if count < REAPER_BATCH:
            return total


def _expire_one_by_one(ctx: Context, actor: Actor, reason: str) -> int:
    with ctx.store.read() as tx:
        due = tx.all("job_due", now=ctx.clock.now_ms(), limit=REAPER_BATCH)
    done = 0
    for row in due:

        def one(tx: Tx, now: int, signals: Signals, job_id: str = row["id"], tenant: str = row["tenant"]) -> int:
            found = tx.one("job_get", tenant=tenant, id=job_id)
            job = Job.from_row(found) if found is not None else None
            if job is None or job.state not in LEASED_STATES or (job.lease_expires_at or 0) > now:
                return 0
            expire(tx, now, job, None, actor=actor, reason=reason, signals=signals)
            return 1

        try:
            done += ctx.write(one)
        except TalariaError as exc:
            log.error("expiry_failed", job_id=row["id"], code=exc.code, error=exc.message)
    return done
