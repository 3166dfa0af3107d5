"""Persisting one applied job transition: the conditional UPDATE, its audit event and its evidence.

Invariant I4: every applied job transition has exactly one ``hermes.job.*`` audit event and one
evidence row, in the same transaction, with ``revision_after = revision_before + 1``.
"""

from __future__ import annotations

from typing import Any

from talaria.canonical import canonical_json, sha256_hex
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import IdemRequest, RowChanged
from talaria.store.interface import Row, Tx

JOB_COLUMNS = (
    "state",
    "revision",
    "attempt",
    "started_at",
    "progress",
    "cancel_requested",
    "cancel_requested_at",
    "cancel_requested_by",
    "finished_at",
    "terminal_kind",
    "terminal_reason",
    "terminal_lease_id",
    "terminal_epoch",
    "result_digest",
    "terminal_response",
    "lease_id",
    "lease_epoch",
    "lease_owner_principal",
    "lease_owner_instance",
    "lease_acquired_at",
    "lease_expires_at",
    "last_heartbeat_at",
)

CLEARED_LEASE = {
    "lease_id": None,
    "lease_owner_principal": None,
    "lease_owner_instance": None,
    "lease_acquired_at": None,
    "lease_expires_at": None,
}


def apply(
    tx: Tx,
    now: int,
    *,
    before: Row,
    changes: dict[str, Any],
    actor: Actor,
    audit_type: str,
    evidence_kind: str,
    evidence_payload: Any,
    binding: Binding | None,
    idem: IdemRequest | None = None,
    reason_code: str | None = None,
    worker_instance: str | None = None,
    require_due: bool = False,
    require_no_cancel: bool = False,
) -> Row:
    """Write the transition ``before`` -> ``before | changes`` (revision + 1); returns the new row."""
    after = dict(before)
    after.update(changes)
    after["revision"] = int(before["revision"]) + 1
    params = {col: after[col] for col in JOB_COLUMNS}
    count = tx.run(
        "job_update",
        id=before["id"],
        expected_state=before["state"],
        expected_revision=before["revision"],
        require_due=int(require_due),
        require_no_cancel=int(require_no_cancel),
        now=now,
        **params,
    )
    if count != 1:
        raise RowChanged(before["id"])
    lease_for_audit = before["lease_id"] if before["lease_id"] is not None else after["lease_id"]
    event_id = audit.append(
        tx,
        now_ms=now,
        type=audit_type,
        tenant=before["tenant"],
        actor=actor,
        subject=audit.Subject(before["task_id"], before["dispatch_id"], before["id"]),
        binding=binding,
        from_state=before["state"],
        to_state=after["state"],
        revision_before=before["revision"],
        revision_after=after["revision"],
        lease_id=lease_for_audit,
        lease_epoch=after["lease_epoch"],
        idempotency_key_hash=idem.key_hash if idem else None,
        request_digest=idem.request_digest if idem else None,
        reason_code=reason_code,
    )
    payload = canonical_json(evidence_payload)
    tx.run(
        "evidence_insert",
        evidence_id=mint("evd", now),
        job_id=before["id"],
        task_id=before["task_id"],
        run_id=before["run_id"],
        dispatch_id=before["dispatch_id"],
        kind=evidence_kind,
        payload=payload.decode("utf-8"),
        content_digest=sha256_hex(payload),
        produced_by=canonical_json(
            {
                "principal": actor.principal,
                "worker_instance": worker_instance,
                "lease_epoch": after["lease_epoch"],
            }
        ).decode("utf-8"),
        now=now,
        audit_event_id=event_id,
    )
    return after


def record_result(
    tx: Tx,
    now: int,
    *,
    job: Row,
    kind: str,
    result_digest: str,
    payload: Any,
    lease_id: str | None,
    lease_epoch: int,
    actor: Actor,
    worker_instance: str | None,
) -> None:
    tx.run(
        "result_insert",
        job_id=job["id"],
        kind=kind,
        result_digest=result_digest,
        payload=canonical_json(payload).decode("utf-8"),
        lease_id=lease_id,
        lease_epoch=lease_epoch,
        principal=actor.principal,
        worker_instance=worker_instance,
        now=now,
    )


def store_key(
    tx: Tx,
    now: int,
    *,
    idem: IdemRequest | None,
    principal: str,
    operation: str,
    job_id: str,
    body: bytes,
    revision_after: int,
    retention_s: int,
) -> None:
    """Insert the idempotency key in the effect's transaction (a key exists iff its effect does)."""
    if idem is None:
        return
    tx.run(
        "idempotency_put",
        principal=principal,
        operation=operation,
        job_id=job_id,
        key_hash=idem.key_hash,
        request_digest=idem.request_digest,
        response_status=200,
        response_body=body,
        revision_after=revision_after,
        now=now,
        expires_at=now + retention_s * 1000,
    )
