"""JSON shapes of the web API (web-api.md 3-6): camelCase keys, times as integer milliseconds."""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from fastapi import Query

from talaria.errors import TalariaError
from talaria.lifecycle.actor import username_of
from talaria.lifecycle.binding import FIELDS
from talaria.lifecycle.reads import AuditEntry
from talaria.lifecycle.records import Dispatch, Job, Task
from talaria.limits import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT


def task_json(task: Task, job_id: str | None = None) -> dict[str, Any]:
    spec = json.loads(task.spec)
    return {
        "id": task.id,
        "tenant": task.tenant,
        "title": task.title,
        "prompt": spec.get("prompt"),
        "team": spec.get("team"),  # an assignment's attempt (team-tools.md 4.2, 11); null otherwise
        "approval": spec.get("approval"),  # its approval by policy; null otherwise
        "cell": task.cell,
        "profile": task.profile,
        "state": task.state,
        "revision": task.revision,
        "createdBy": username_of(task.created_by),
        "createdAt": task.created_at,
        "submittedAt": task.submitted_at,
        "approvedBy": username_of(task.approved_by),
        "approvedAt": task.approved_at,
        "rejectedBy": username_of(task.rejected_by),
        "rejectedAt": task.rejected_at,
        "rejectionReason": task.rejection_reason,
        "finishedAt": task.finished_at,
        "jobId": job_id,
    }


def dispatch_json(dispatch: Dispatch) -> dict[str, Any]:
    binding = {
        "tenant": dispatch.tenant,
        "task": dispatch.task_id,
        "trace": dispatch.trace,
        "provenance": dispatch.provenance,
        "run": dispatch.run_id,
        "dispatch": dispatch.id,
        "job": dispatch.job_id,
        "cell": dispatch.cell,
        "profile": dispatch.profile,
    }
    assert set(binding) == set(FIELDS) - {"principal"}
    return {
        "id": dispatch.id,
        "runId": dispatch.run_id,
        "trace": dispatch.trace,
        "provenance": dispatch.provenance,
        "cell": dispatch.cell,
        "profile": dispatch.profile,
        "status": dispatch.status,
        "binding": binding,
    }


def job_json(job: Job, result: Any, waiting_reason: str | None) -> dict[str, Any]:
    lease = None
    if job.lease_id is not None:
        lease = {
            "epoch": job.lease_epoch,
            "ownerPrincipal": job.lease_owner_principal,
            "ownerInstance": job.lease_owner_instance,
            "acquiredAt": job.lease_acquired_at,
            "expiresAt": job.lease_expires_at,
            "lastHeartbeatAt": job.last_heartbeat_at,
        }
    terminal = None
    if job.terminal_kind is not None:
        terminal = {
            "kind": job.terminal_kind,
            "reasonCode": job.terminal_reason,
            "resultDigest": job.result_digest,
            "finishedAt": job.finished_at,
        }
    return {
        "id": job.id,
        "taskId": job.task_id,
        "cell": job.cell,
        "profile": job.profile,
        "state": job.state,
        "attempt": job.attempt,
        "maxAttempts": job.max_attempts,
        "revision": job.revision,
        "cancelRequested": job.cancel_requested,
        "enqueuedAt": job.enqueued_at,
        "startedAt": job.started_at,
        "lease": lease,
        "terminal": terminal,
        "result": result,
        "waitingReason": waiting_reason if job.state == "QUEUED" else None,
    }


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    evidence = None
    if entry.evidence_kind is not None:
        evidence = {"kind": entry.evidence_kind, "contentDigest": entry.evidence_digest}
    return {
        "seq": entry.seq,
        "eventId": entry.event_id,
        "occurredAt": entry.occurred_at,
        "type": entry.type,
        "actor": entry.body["actor"],
        "subject": entry.body["subject"],
        "fromState": entry.from_state,
        "toState": entry.to_state,
        "revisionBefore": entry.revision_before,
        "revisionAfter": entry.revision_after,
        "leaseEpoch": entry.lease_epoch,
        "reasonCode": entry.reason_code,
        "prevHash": entry.prev_hash,
        "hash": entry.hash,
        "evidence": evidence,
        "team": entry.body.get("team"),  # team-tools.md 10-11: the ids of a team event, else null
    }


# The list parameters (web-api.md 1), as the document shows them; ``page_limit`` and ``decode_cursor`` judge them.
LimitQuery = Annotated[
    int | None,
    Query(
        description=f"page size, 1-{MAX_LIST_LIMIT}, default {DEFAULT_LIST_LIMIT}",
        json_schema_extra={"minimum": 1, "maximum": MAX_LIST_LIMIT},
    ),
]
CursorQuery = Annotated[str | None, Query(description="the nextCursor of the previous page")]


def page_limit(limit: int | None) -> int:
    value = DEFAULT_LIST_LIMIT if limit is None else limit
    if not 1 <= value <= MAX_LIST_LIMIT:
        raise TalariaError("invalid_request", "limit must be between 1 and 100")
    return value


def encode_cursor(*parts: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, kinds: tuple[type, ...]) -> list[Any] | None:
    """Decode an opaque cursor made by ``encode_cursor``; 400 ``invalid_request`` when malformed."""
    if cursor is None:
        return None
    try:
        parts = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except ValueError as exc:
        raise TalariaError("invalid_request", "cursor is not valid") from exc
    if (
        not isinstance(parts, list)
        or len(parts) != len(kinds)
        or not all(isinstance(p, k) and not isinstance(p, bool) for p, k in zip(parts, kinds, strict=True))
    ):
        raise TalariaError("invalid_request", "cursor is not valid")
    return parts
