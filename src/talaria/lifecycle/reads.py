"""Read-only views of the lifecycle: Runtime status and discovery, and the rows the web API shows.

Nothing here writes; status, discovery and listings never apply a due expiry.
"""

from __future__ import annotations

import json
from typing import Any

from talaria.clock import rfc3339
from talaria.errors import TalariaError
from talaria.lifecycle.actor import PLATFORM_ADMIN, RUNTIME, Actor
from talaria.lifecycle.binding import Binding, check_identity
from talaria.lifecycle.context import Context, OpResult
from talaria.lifecycle.jobs import load_bound
from talaria.lifecycle.machine import JobState
from talaria.limits import DEFAULT_DISCOVERY_LIMIT, MAX_DISCOVERY_LIMIT
from talaria.store.interface import Row


def _ts(ms: int | None) -> str | None:
    return rfc3339(ms) if ms is not None else None


def status(ctx: Context, actor: Actor, *, job_id: str, binding: Binding) -> OpResult:
    if not (actor.has(RUNTIME) or actor.has(PLATFORM_ADMIN)):
        raise TalariaError("role_forbidden", "status needs the role runtime or platform_admin")
    check_identity(binding, tenant=actor.tenant or "", principal=actor.principal, path_job=job_id)
    with ctx.store.read() as tx:
        job, dispatch = load_bound(tx, binding, job_id)
        task = tx.one("task_get", tenant=job["tenant"], id=job["task_id"])
    lease: dict[str, Any] | None = None
    if job["state"] in (JobState.LEASED, JobState.RUNNING):
        lease = {
            "lease_epoch": job["lease_epoch"],
            "owner": {
                "principal": job["lease_owner_principal"],
                "worker_instance": job["lease_owner_instance"],
            },
            "acquired_at": _ts(job["lease_acquired_at"]),
            "expires_at": _ts(job["lease_expires_at"]),
            "last_heartbeat_at": _ts(job["last_heartbeat_at"]),
        }
        if actor.principal == job["lease_owner_principal"]:
            lease["lease_id"] = job["lease_id"]
    terminal = None
    if job["terminal_kind"] is not None:
        terminal = {
            "kind": job["terminal_kind"],
            "reason_code": job["terminal_reason"],
            "result_digest": job["result_digest"],
            "finished_at": _ts(job["finished_at"]),
        }
    return OpResult.of(
        {
            "job": job["id"],
            "state": job["state"],
            "revision": job["revision"],
            "attempt": job["attempt"],
            "max_attempts": job["max_attempts"],
            "cancel_requested": bool(job["cancel_requested"]),
            "task_state": task["state"] if task else None,
            "dispatch_state": dispatch["status"],
            "lease": lease,
            "terminal": terminal,
        }
    )


def discover(
    ctx: Context, actor: Actor, *, tenant: str, cell: str, profile: str, state: str, limit: int | None
) -> OpResult:
    if not (actor.has(RUNTIME) or actor.has(PLATFORM_ADMIN)):
        raise TalariaError("role_forbidden", "discovery needs the role runtime or platform_admin")
    if tenant != actor.tenant:
        raise TalariaError("binding_mismatch", "tenant differs from the caller's tenant", status=403)
    if state not in (JobState.QUEUED, JobState.LEASED, JobState.RUNNING):
        raise TalariaError("invalid_request", "state must be QUEUED, LEASED or RUNNING")
    if state != JobState.QUEUED and not actor.has(PLATFORM_ADMIN):
        raise TalariaError("role_forbidden", "discovering leased jobs needs the role platform_admin")
    size = DEFAULT_DISCOVERY_LIMIT if limit is None else limit
    if not 1 <= size <= MAX_DISCOVERY_LIMIT:
        raise TalariaError("invalid_request", "limit must be between 1 and 100")
    with ctx.store.read() as tx:
        rows = tx.all("job_discover", tenant=tenant, cell=cell, profile=profile, state=state, limit=size)
    jobs = [
        {
            "binding": job_binding(row, actor.principal).as_dict(),
            "state": row["state"],
            "attempt": row["attempt"],
            "max_attempts": row["max_attempts"],
            "revision": row["revision"],
            "enqueued_at": rfc3339(row["enqueued_at"]),
        }
        for row in rows
    ]
    return OpResult.of({"jobs": jobs})


def job_binding(job: Row, principal: str) -> Binding:
    return Binding(
        tenant=job["tenant"],
        task=job["task_id"],
        trace=job["trace"],
        principal=principal,
        provenance=job["provenance"],
        run=job["run_id"],
        dispatch=job["dispatch_id"],
        job=job["id"],
        cell=job["cell"],
        profile=job["profile"],
    )


def get_job(ctx: Context, tenant: str, job_id: str) -> tuple[Row, Row | None] | None:
    """A job row of a tenant with its stored result row, or None."""
    with ctx.store.read() as tx:
        job = tx.one("job_get", tenant=tenant, id=job_id)
        if job is None:
            return None
        return job, tx.one("result_get", job_id=job_id)


def result_payload(result: Row | None) -> Any:
    return json.loads(result["payload"]) if result is not None else None
