"""Persisting one applied job transition: the conditional UPDATE, its audit event and its evidence.

Invariant I4: every applied job transition has exactly one ``hermes.job.*`` audit event and one
evidence row, in the same transaction, with ``revision_after = revision_before + 1``.
"""

from __future__ import annotations

import functools
from typing import Any

from talaria.canonical import canonical_json, sha256_hex
from talaria.ids import mint
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import IdemRequest, RowChanged, Signals
from talaria.lifecycle.orchestrator import Orchestrator
from talaria.lifecycle.records import JOB_COLUMNS, Dispatch, Job
from talaria.store.interface import Tx

__all__ = ["CLEARED_LEASE", "JOB_COLUMNS", "SETS", "apply", "conclude", "produced_by", "record_result", "store_key"]

# The columns each transition statement sets (besides the conditions). ``job_update`` sets every mutable
# column and serves the rare transitions (expiry, the cancel flag); the hot ones set only what they change,
# so SQLite leaves the indexes over the other columns alone.
_LEASE = ("lease_id", "lease_owner_principal", "lease_owner_instance", "lease_acquired_at", "lease_expires_at")
_TERMINAL = ("finished_at", "terminal_kind", "terminal_reason", "terminal_lease_id", "terminal_epoch")
SETS: dict[str, tuple[str, ...]] = {
    "job_update": JOB_COLUMNS,
    "job_claim": ("state", "revision", "attempt", "lease_epoch", "last_heartbeat_at", *_LEASE),
    "job_start": ("state", "revision", "started_at", "lease_expires_at"),
    "job_heartbeat": ("revision", "progress", "lease_expires_at", "last_heartbeat_at"),
    "job_finish": ("state", "revision", *_TERMINAL, "result_digest", "terminal_response", *_LEASE),
}

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
    before: Job,
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
    statement: str = "job_update",
) -> Job:
    """Write the transition ``before`` -> ``before | changes`` (revision + 1) with ``statement`` (one of
    ``SETS``, which must set every changed column); returns the new record.

    Raises ``RowChanged`` when the conditional update matched no row."""
    columns = SETS[statement]
    assert columns is JOB_COLUMNS or set(changes) <= set(columns), (statement, sorted(changes))
    after = before.changed(changes)
    params = {name: getattr(after, name) for name in columns}
    if statement == "job_update":
        params |= {"require_due": int(require_due), "require_no_cancel": int(require_no_cancel), "now": now}
    else:
        assert not (require_due or require_no_cancel), statement
    count = tx.run(
        statement,
        id=before.id,
        expected_state=before.state,
        expected_revision=before.revision,
        **params,
    )
    if count != 1:
        raise RowChanged(before.id)
    lease_for_audit = before.lease_id if before.lease_id is not None else after.lease_id
    event_id = audit.append(
        tx,
        now_ms=now,
        type=audit_type,
        tenant=before.tenant,
        actor=actor,
        subject=audit.Subject(before.task_id, before.dispatch_id, before.id),
        binding=binding,
        from_state=before.state,
        to_state=after.state,
        revision_before=before.revision,
        revision_after=after.revision,
        lease_id=lease_for_audit,
        lease_epoch=after.lease_epoch,
        idempotency_key_hash=idem.key_hash if idem else None,
        request_digest=idem.request_digest if idem else None,
        reason_code=reason_code,
    )
    payload = canonical_json(evidence_payload)
    tx.run(
        "evidence_insert",
        evidence_id=mint("evd", now),
        job_id=before.id,
        task_id=before.task_id,
        run_id=before.run_id,
        dispatch_id=before.dispatch_id,
        kind=evidence_kind,
        payload=payload.decode("utf-8"),
        content_digest=sha256_hex(payload),
        produced_by=produced_by(actor.principal, worker_instance, after.lease_epoch),
        now=now,
        audit_event_id=event_id,
    )
    return after


@functools.lru_cache(maxsize=1024)  # a worker's transitions repeat the same few values
def produced_by(principal: str, worker_instance: str | None, lease_epoch: int) -> str:
    """An evidence row's ``produced_by``: canonical JSON of who produced it under which epoch."""
    return canonical_json(
        {"principal": principal, "worker_instance": worker_instance, "lease_epoch": lease_epoch}
    ).decode("utf-8")


def record_result(
    tx: Tx,
    now: int,
    *,
    job: Job,
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
        job_id=job.id,
        kind=kind,
        result_digest=result_digest,
        payload=canonical_json(payload).decode("utf-8"),
        lease_id=lease_id,
        lease_epoch=lease_epoch,
        principal=actor.principal,
        worker_instance=worker_instance,
        now=now,
    )


def conclude(
    tx: Tx,
    now: int,
    *,
    ended: Job,
    dispatch: Dispatch,
    payload: Any,
    actor: Actor,
    binding: Binding,
    worker_instance: str | None,
    signals: Signals,
) -> None:
    """After a terminal transition (``ended`` as written): its Result row, then ``reconcile_hermes``, in
    ``tx``; the ``terminal`` signal goes out after COMMIT."""
    assert ended.terminal_kind is not None and ended.result_digest is not None and ended.terminal_epoch is not None
    record_result(
        tx,
        now,
        job=ended,
        kind=ended.terminal_kind,
        result_digest=ended.result_digest,
        payload=payload,
        lease_id=ended.terminal_lease_id,
        lease_epoch=ended.terminal_epoch,
        actor=actor,
        worker_instance=worker_instance,
    )
    Orchestrator.reconcile_hermes(
        tx,
        now=now,
        actor=actor,
        job=ended,
        dispatch=dispatch,
        terminal_kind=ended.terminal_kind,
        result_digest=ended.result_digest,
        binding=binding,
        lease_epoch=ended.terminal_epoch,
    )
    signals.append(("terminal", ended.id))


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
