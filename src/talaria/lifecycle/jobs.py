"""Job operations of workers and admins (lifecycle.md 4-6): claim, start, heartbeat, complete, fail,
cancel. Each runs in one write transaction in the order of section 6.5 and answers a Runtime-shaped
``OpResult``; refusals raise ``TalariaError`` with the codes of section 6.7.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from talaria.canonical import canonical_json, digest
from talaria.clock import rfc3339
from talaria.errors import TalariaError
from talaria.ids import lease_id as new_lease_id
from talaria.lifecycle import journal
from talaria.lifecycle.actor import PLATFORM_ADMIN, RUNTIME, Actor
from talaria.lifecycle.binding import Binding, check_dispatch, check_identity, check_job
from talaria.lifecycle.context import Context, IdemRequest, OpResult, Refusal
from talaria.lifecycle.expiry import expire, terminal_body
from talaria.lifecycle.machine import (
    AUDIT_TYPE,
    EVIDENCE_KIND,
    LEASED_STATES,
    TERMINAL,
    TERMINAL_OF_OP,
    JobOp,
    JobState,
    TaskState,
    allowed,
)
from talaria.lifecycle.orchestrator import Orchestrator
from talaria.store.interface import Row, Tx

Signals = list[tuple[str, str]]


def require_role(actor: Actor, role: str) -> None:
    if not actor.has(role):
        raise TalariaError("role_forbidden", f"this operation needs the role {role}")


def _caller_identity(actor: Actor, binding: Binding, job_id: str) -> None:
    if actor.tenant is None:
        raise TalariaError("role_forbidden", "the caller has no tenant")
    check_identity(binding, tenant=actor.tenant, principal=actor.principal, path_job=job_id)


def load_bound(tx: Tx, binding: Binding, job_id: str) -> tuple[Row, Row]:
    """Binding steps 2-4: the job of the tenant, its Dispatch, and every persisted field."""
    job = tx.one("job_get", tenant=binding.tenant, id=job_id)
    if job is None:
        raise TalariaError("job_not_found", "no such job")
    dispatch = tx.one("dispatch_get", id=job["dispatch_id"])
    if dispatch is None:
        raise TalariaError("dispatch_missing", "the job's dispatch is missing")
    check_dispatch(binding, dispatch)
    check_job(binding, job)
    return job, dispatch


def _replay(tx: Tx, now: int, actor: Actor, operation: str, job_id: str, idem: IdemRequest | None) -> OpResult | None:
    if idem is None:
        return None
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
    return OpResult(int(row["response_status"]), bytes(row["response_body"]), replayed=True)


def _keyed(
    ctx: Context,
    actor: Actor,
    operation: str,
    job_id: str,
    binding: Binding,
    idem: IdemRequest | None,
    body: Callable[[Tx, int, Signals, Row, Row], OpResult | Refusal],
) -> OpResult:
    """The common frame: idempotency lookup, binding, then the operation; stores the key on success."""

    def run(tx: Tx, now: int, signals: Signals) -> OpResult | Refusal:
        replay = _replay(tx, now, actor, operation, job_id, idem)
        if replay is not None:
            return replay
        job, dispatch = load_bound(tx, binding, job_id)
        out = body(tx, now, signals, job, dispatch)
        if isinstance(out, OpResult) and out.status == 200 and out.replayed is False and _applied(out):
            journal.store_key(
                tx,
                now,
                idem=idem,
                principal=actor.principal,
                operation=operation,
                job_id=job_id,
                body=out.body,
                revision_after=out.data["revision"],
                retention_s=ctx.settings.lifecycle_idempotency_retention_s,
            )
        return out

    return ctx.write(run)


class _NoOp(OpResult):
    """A 200 that applied nothing (terminal replay, repeated admin cancel): it stores no key."""


def _applied(out: OpResult) -> bool:
    return not isinstance(out, _NoOp)


def _lease_rules(now: int, actor: Actor, job: Row, op: JobOp, lease_id: str, lease_epoch: int) -> bool:
    """Holder rules 1-3 (raise) and rule 4 (returns True when the lease is past its expiry)."""
    if lease_epoch < job["lease_epoch"]:
        raise TalariaError("stale_lease", "a newer lease of this job exists")
    if not allowed(job["state"], op):
        raise TalariaError("invalid_transition", f"{op.value} is not allowed from {job['state']}")
    if (
        lease_epoch > job["lease_epoch"]
        or lease_id != job["lease_id"]
        or actor.principal != job["lease_owner_principal"]
    ):
        raise TalariaError("lease_mismatch", "the lease is held by someone else")
    return bool(now >= job["lease_expires_at"])


def _expired_refusal(tx: Tx, now: int, actor: Actor, job: Row, signals: Signals) -> Refusal:
    expire(tx, now, job, actor=actor, reason="lease_expired", signals=signals)
    return Refusal(TalariaError("lease_expired", "the lease expired; stop work"))


def _extended(ctx: Context, now: int, job: Row) -> int:
    """The new expiry of start and heartbeat: one TTL from now, capped at the maximum lease life."""
    cap = int(job["lease_acquired_at"]) + int(job["max_life_s"]) * 1000
    return min(now + ctx.settings.lifecycle_lease_ttl_s * 1000, cap)


def claim(
    ctx: Context,
    actor: Actor,
    *,
    job_id: str,
    binding: Binding,
    worker_instance: str,
    idem: IdemRequest | None,
) -> OpResult:
    require_role(actor, RUNTIME)
    _caller_identity(actor, binding, job_id)
    ttl = ctx.settings.lifecycle_lease_ttl_s

    def body(tx: Tx, now: int, signals: Signals, job: Row, dispatch: Row) -> OpResult | Refusal:
        if job["state"] in TERMINAL:
            raise TalariaError("terminal_conflict", "the job has ended")
        if job["state"] in LEASED_STATES and job["lease_expires_at"] <= now:
            job = expire(tx, now, job, actor=actor, reason="lease_expired", signals=signals)
            if job["state"] in TERMINAL:
                return Refusal(TalariaError("terminal_conflict", "the job has ended"))
        task = tx.one("task_get", tenant=job["tenant"], id=job["task_id"])
        if task is None or task["state"] != TaskState.DISPATCHED or task["approved_by"] is None:
            return Refusal(TalariaError("not_approved", "the job's task is not dispatched with an approval"))
        if job["state"] != JobState.QUEUED:
            return Refusal(TalariaError("already_leased", "the job is leased by another worker"))
        lease, epoch = new_lease_id(), job["lease_epoch"] + 1
        changes = {
            "state": JobState.LEASED,
            "attempt": job["attempt"] + 1,
            "lease_id": lease,
            "lease_epoch": epoch,
            "lease_owner_principal": actor.principal,
            "lease_owner_instance": worker_instance,
            "lease_acquired_at": now,
            "lease_expires_at": now + ttl * 1000,
            "last_heartbeat_at": None,
        }
        after = journal.apply(
            tx,
            now,
            before=job,
            changes=changes,
            actor=actor,
            audit_type=AUDIT_TYPE[JobOp.CLAIM],
            evidence_kind=EVIDENCE_KIND[JobOp.CLAIM],
            binding=binding,
            idem=idem,
            worker_instance=worker_instance,
            evidence_payload={
                "worker_instance": worker_instance,
                "lease_epoch": epoch,
                "attempt": job["attempt"] + 1,
            },
        )
        return OpResult.of(
            {
                "job": job["id"],
                "state": after["state"],
                "attempt": after["attempt"],
                "revision": after["revision"],
                "cancel_requested": bool(after["cancel_requested"]),
                "lease": {
                    "lease_id": lease,
                    "lease_epoch": epoch,
                    "acquired_at": rfc3339(now),
                    "expires_at": rfc3339(after["lease_expires_at"]),
                    "ttl_s": ttl,
                    "heartbeat_interval_s": ctx.settings.lifecycle_heartbeat_interval_s,
                    "max_life_s": job["max_life_s"],
                },
            }
        )

    return _keyed(ctx, actor, "claim", job_id, binding, idem, body)


def start(
    ctx: Context,
    actor: Actor,
    *,
    job_id: str,
    binding: Binding,
    lease_id: str,
    lease_epoch: int,
    idem: IdemRequest | None,
) -> OpResult:
    require_role(actor, RUNTIME)
    _caller_identity(actor, binding, job_id)

    def body(tx: Tx, now: int, signals: Signals, job: Row, dispatch: Row) -> OpResult | Refusal:
        if job["state"] in TERMINAL:
            raise TalariaError("terminal_conflict", "the job has ended")
        if _lease_rules(now, actor, job, JobOp.START, lease_id, lease_epoch):
            return _expired_refusal(tx, now, actor, job, signals)
        changes = {"state": JobState.RUNNING, "started_at": now, "lease_expires_at": _extended(ctx, now, job)}
        after = journal.apply(
            tx,
            now,
            before=job,
            changes=changes,
            actor=actor,
            audit_type=AUDIT_TYPE[JobOp.START],
            evidence_kind=EVIDENCE_KIND[JobOp.START],
            evidence_payload={"lease_epoch": lease_epoch},
            binding=binding,
            idem=idem,
            worker_instance=job["lease_owner_instance"],
        )
        return OpResult.of(
            {
                "job": job["id"],
                "state": after["state"],
                "revision": after["revision"],
                "cancel_requested": bool(after["cancel_requested"]),
                "lease": {"lease_epoch": lease_epoch, "expires_at": rfc3339(after["lease_expires_at"])},
            }
        )

    return _keyed(ctx, actor, "start", job_id, binding, idem, body)


def heartbeat(
    ctx: Context,
    actor: Actor,
    *,
    job_id: str,
    binding: Binding,
    lease_id: str,
    lease_epoch: int,
    progress: dict[str, Any] | None,
    idem: IdemRequest | None,
) -> OpResult:
    require_role(actor, RUNTIME)
    _caller_identity(actor, binding, job_id)

    def body(tx: Tx, now: int, signals: Signals, job: Row, dispatch: Row) -> OpResult | Refusal:
        if job["state"] in TERMINAL:
            raise TalariaError("terminal_conflict", "the job has ended")
        if _lease_rules(now, actor, job, JobOp.HEARTBEAT, lease_id, lease_epoch):
            return _expired_refusal(tx, now, actor, job, signals)
        changes: dict[str, Any] = {"lease_expires_at": _extended(ctx, now, job), "last_heartbeat_at": now}
        if progress is not None:
            changes["progress"] = canonical_json(progress).decode("utf-8")
        after = journal.apply(
            tx,
            now,
            before=job,
            changes=changes,
            actor=actor,
            audit_type=AUDIT_TYPE[JobOp.HEARTBEAT],
            evidence_kind=EVIDENCE_KIND[JobOp.HEARTBEAT],
            binding=binding,
            idem=idem,
            evidence_payload={"lease_epoch": lease_epoch, "progress": progress},
            worker_instance=job["lease_owner_instance"],
        )
        return OpResult.of(
            {
                "job": job["id"],
                "state": after["state"],
                "revision": after["revision"],
                "expires_at": rfc3339(after["lease_expires_at"]),
                "heartbeat_interval_s": ctx.settings.lifecycle_heartbeat_interval_s,
                "cancel_requested": bool(after["cancel_requested"]),
            }
        )

    return _keyed(ctx, actor, "heartbeat", job_id, binding, idem, body)


def _finish(
    ctx: Context,
    actor: Actor,
    op: JobOp,
    operation: str,
    *,
    job_id: str,
    binding: Binding,
    lease_id: str,
    lease_epoch: int,
    payload: dict[str, Any],
    digest_of: Any,
    reason_code: str | None,
    idem: IdemRequest | None,
) -> OpResult:
    """Complete, fail and holder cancel: rows 5-7 with Result, reconcile, and terminal replay."""
    require_role(actor, RUNTIME)
    _caller_identity(actor, binding, job_id)
    kind = TERMINAL_OF_OP[op]
    result_digest = digest(digest_of)

    def body(tx: Tx, now: int, signals: Signals, job: Row, dispatch: Row) -> OpResult | Refusal:
        if job["state"] in TERMINAL:
            if (
                job["terminal_kind"],
                job["terminal_lease_id"],
                job["terminal_epoch"],
                job["result_digest"],
            ) == (
                kind,
                lease_id,
                lease_epoch,
                result_digest,
            ):
                return _NoOp(200, bytes(job["terminal_response"]))
            raise TalariaError("terminal_conflict", "the job has already ended with another outcome")
        if _lease_rules(now, actor, job, op, lease_id, lease_epoch):
            return _expired_refusal(tx, now, actor, job, signals)
        shown = terminal_body(job, job["revision"] + 1, kind, result_digest)
        if op is JobOp.HOLDER_CANCEL:
            shown["cancel_requested"] = bool(job["cancel_requested"])
        response = canonical_json(shown)
        changes = dict(journal.CLEARED_LEASE) | {
            "state": kind,
            "finished_at": now,
            "terminal_kind": kind,
            "terminal_reason": reason_code,
            "terminal_lease_id": lease_id,
            "terminal_epoch": lease_epoch,
            "result_digest": result_digest,
            "terminal_response": response,
        }
        journal.apply(
            tx,
            now,
            before=job,
            changes=changes,
            actor=actor,
            audit_type=AUDIT_TYPE[op],
            evidence_kind=EVIDENCE_KIND[op],
            evidence_payload=payload,
            binding=binding,
            idem=idem,
            reason_code=reason_code,
            worker_instance=job["lease_owner_instance"],
        )
        journal.record_result(
            tx,
            now,
            job=job,
            kind=kind,
            result_digest=result_digest,
            payload=digest_of,
            lease_id=lease_id,
            lease_epoch=lease_epoch,
            actor=actor,
            worker_instance=job["lease_owner_instance"],
        )
        Orchestrator.reconcile_hermes(
            tx,
            now=now,
            actor=actor,
            job_id=job["id"],
            terminal_kind=kind,
            result_digest=result_digest,
            binding=binding,
            lease_epoch=lease_epoch,
        )
        signals.append(("terminal", job["id"]))
        return OpResult(200, response)

    return _keyed(ctx, actor, operation, job_id, binding, idem, body)


def complete(
    ctx: Context,
    actor: Actor,
    *,
    job_id: str,
    binding: Binding,
    lease_id: str,
    lease_epoch: int,
    result: dict[str, Any],
    idem: IdemRequest | None,
) -> OpResult:
    return _finish(
        ctx,
        actor,
        JobOp.COMPLETE,
        "complete",
        job_id=job_id,
        binding=binding,
        lease_id=lease_id,
        lease_epoch=lease_epoch,
        payload={"result": result},
        digest_of=result,
        reason_code=None,
        idem=idem,
    )


def fail(
    ctx: Context,
    actor: Actor,
    *,
    job_id: str,
    binding: Binding,
    lease_id: str,
    lease_epoch: int,
    error: dict[str, Any],
    idem: IdemRequest | None,
) -> OpResult:
    return _finish(
        ctx,
        actor,
        JobOp.FAIL,
        "fail",
        job_id=job_id,
        binding=binding,
        lease_id=lease_id,
        lease_epoch=lease_epoch,
        payload={"error": error},
        digest_of=error,
        reason_code=error["code"],
        idem=idem,
    )


def holder_cancel(
    ctx: Context,
    actor: Actor,
    *,
    job_id: str,
    binding: Binding,
    lease_id: str,
    lease_epoch: int,
    reason: str,
    idem: IdemRequest | None,
) -> OpResult:
    return _finish(
        ctx,
        actor,
        JobOp.HOLDER_CANCEL,
        "cancel",
        job_id=job_id,
        binding=binding,
        lease_id=lease_id,
        lease_epoch=lease_epoch,
        payload={"reason": reason},
        digest_of={"reason": reason},
        reason_code="holder_cancel",
        idem=idem,
    )


def admin_cancel_in(
    tx: Tx,
    now: int,
    actor: Actor,
    job: Row,
    binding: Binding,
    reason: str,
    idem: IdemRequest | None,
    signals: Signals,
) -> OpResult:
    """Rows 8 and 9 inside a transaction; a repeated request while the flag is set is a no-op 200."""
    if job["state"] in TERMINAL:
        raise TalariaError("terminal_conflict", "the job has ended")
    if job["state"] == JobState.QUEUED:
        result_digest = digest({"reason": reason})
        response = canonical_json(
            terminal_body(job, job["revision"] + 1, JobState.CANCELLED, result_digest) | {"cancel_requested": False}
        )
        changes = {
            "state": JobState.CANCELLED,
            "finished_at": now,
            "terminal_kind": JobState.CANCELLED,
            "terminal_reason": "admin_cancel",
            "terminal_lease_id": None,
            "terminal_epoch": job["lease_epoch"],
            "result_digest": result_digest,
            "terminal_response": response,
        }
        journal.apply(
            tx,
            now,
            before=job,
            changes=changes,
            actor=actor,
            audit_type="hermes.job.cancelled",
            evidence_kind="cancel",
            evidence_payload={"reason": reason},
            binding=binding,
            idem=idem,
            reason_code="admin_cancel",
        )
        journal.record_result(
            tx,
            now,
            job=job,
            kind=JobState.CANCELLED,
            result_digest=result_digest,
            payload={"reason": reason},
            lease_id=None,
            lease_epoch=job["lease_epoch"],
            actor=actor,
            worker_instance=None,
        )
        Orchestrator.reconcile_hermes(
            tx,
            now=now,
            actor=actor,
            job_id=job["id"],
            terminal_kind=JobState.CANCELLED,
            result_digest=result_digest,
            binding=binding,
            lease_epoch=job["lease_epoch"],
        )
        signals.append(("terminal", job["id"]))
        return OpResult(200, response)
    if job["cancel_requested"]:
        return _NoOp(200, canonical_json(_pending_cancel_body(job)))
    after = journal.apply(
        tx,
        now,
        before=job,
        actor=actor,
        audit_type="hermes.job.cancel_requested",
        changes={"cancel_requested": 1, "cancel_requested_at": now, "cancel_requested_by": actor.principal},
        evidence_kind="cancel_request",
        evidence_payload={"reason": reason},
        binding=binding,
        idem=idem,
    )
    signals.append(("cancel_requested", job["id"]))
    return OpResult.of(_pending_cancel_body(after))


def _pending_cancel_body(job: Row) -> dict[str, Any]:
    return {
        "job": job["id"],
        "state": job["state"],
        "revision": job["revision"],
        "cancel_requested": True,
        "result_digest": None,
        "task_state": TaskState.DISPATCHED,
        "dispatch_state": "OPEN",
    }


def admin_cancel(
    ctx: Context, actor: Actor, *, job_id: str, binding: Binding, reason: str, idem: IdemRequest | None
) -> OpResult:
    require_role(actor, PLATFORM_ADMIN)
    _caller_identity(actor, binding, job_id)

    def body(tx: Tx, now: int, signals: Signals, job: Row, dispatch: Row) -> OpResult:
        return admin_cancel_in(tx, now, actor, job, binding, reason, idem, signals)

    return _keyed(ctx, actor, "cancel", job_id, binding, idem, body)
