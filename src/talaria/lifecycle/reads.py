"""Read-only views of the lifecycle: Runtime status and discovery, and what the web API and the
dispatcher show and use. Route handlers name no query; they call these.

Nothing here writes; status, discovery and listings never apply a due expiry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from talaria.errors import TalariaError
from talaria.lifecycle.actor import PLATFORM_ADMIN, RUNTIME, Actor
from talaria.lifecycle.answers import Discovered, Discovery, JobStatus, LeaseView, TerminalView
from talaria.lifecycle.binding import Binding, check_identity
from talaria.lifecycle.context import Context
from talaria.lifecycle.frame import load_bound
from talaria.lifecycle.machine import LEASED_STATES, JobState
from talaria.lifecycle.records import Dispatch, Job, Task
from talaria.limits import DEFAULT_DISCOVERY_LIMIT, MAX_DISCOVERY_LIMIT
from talaria.store.interface import Row


@dataclass(frozen=True, slots=True)
class JobWithResult:
    """A job and what it ended with (the stored result, error or reason; None until terminal)."""

    job: Job
    result: Any
    task_title: str | None = None  # the job's task's title, where the read joined it (the job list)


@dataclass(frozen=True, slots=True)
class TaskWithJob:
    task: Task
    job_id: str | None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit event as the web API lists it, with its evidence (job transitions' rows, chat events' bodies).
    ``seq``, ``prev_hash`` and ``hash`` are None while a PostgreSQL event waits for the sealer (scale.md 2.4)."""

    seq: int | None
    event_id: str
    occurred_at: int
    type: str
    body: dict[str, Any]
    from_state: str | None
    to_state: str | None
    revision_before: int | None
    revision_after: int | None
    lease_epoch: int | None
    reason_code: str | None
    prev_hash: str | None
    hash: str | None
    evidence_kind: str | None
    evidence_digest: str | None

    @classmethod
    def from_row(cls, row: Row) -> AuditEntry:
        body = json.loads(row["body"])
        kept = body.get("evidence") or {}  # a chat event keeps its evidence in its body (chat.md 8)
        return cls(
            row["seq"],
            row["event_id"],
            row["occurred_at"],
            row["type"],
            body,
            row["from_state"],
            row["to_state"],
            row["revision_before"],
            row["revision_after"],
            row["lease_epoch"],
            row["reason_code"],
            row["prev_hash"],
            row["hash"],
            row["evidence_kind"] or kept.get("kind"),
            row["evidence_digest"] or kept.get("contentDigest"),
        )


def _result(payload: str | None) -> Any:
    return json.loads(payload) if payload is not None else None


def _cursor(after: tuple[int, str] | None) -> dict[str, Any]:
    """A listing's keyset cursor: the (time, id) of the last row of the previous page."""
    return {"cursor_at": after[0] if after else None, "cursor_id": after[1] if after else None}


class ReadEntries(Context):
    def status(self, actor: Actor, *, job_id: str, binding: Binding) -> JobStatus:
        """Runtime status (lifecycle.md 6.4): ``lease_id`` only for the lease's owner."""
        if not (actor.has(RUNTIME) or actor.has(PLATFORM_ADMIN)):
            raise TalariaError("role_forbidden", "status needs the role runtime or platform_admin")
        check_identity(binding, tenant=actor.tenant or "", principal=actor.principal, path_job=job_id)
        with self.store.read() as tx:
            bound = load_bound(tx, binding, job_id, actor)
        job = bound.job
        lease = None
        if job.state in LEASED_STATES:
            assert job.lease_owner_principal is not None and job.lease_owner_instance is not None
            assert job.lease_acquired_at is not None and job.lease_expires_at is not None
            lease = LeaseView(
                job.lease_epoch,
                job.lease_owner_principal,
                job.lease_owner_instance,
                job.lease_acquired_at,
                job.lease_expires_at,
                job.last_heartbeat_at,
                job.lease_id if actor.principal == job.lease_owner_principal else None,
            )
        terminal = None
        if job.terminal_kind is not None:
            terminal = TerminalView(job.terminal_kind, job.terminal_reason, job.result_digest, job.finished_at)
        return JobStatus(
            job.id,
            job.state,
            job.revision,
            job.attempt,
            job.max_attempts,
            job.cancel_requested,
            bound.task_state,
            bound.dispatch.status,
            lease,
            terminal,
        )

    def discover(
        self,
        actor: Actor,
        *,
        tenant: str,
        cell: str,
        profile: str,
        state: str = JobState.QUEUED,
        limit: int | None = None,
    ) -> Discovery:
        """Jobs of DISPATCHED tasks a worker may claim (or, for admins, leased ones), oldest first."""
        if not (actor.has(RUNTIME) or actor.has(PLATFORM_ADMIN)):
            raise TalariaError("role_forbidden", "discovery needs the role runtime or platform_admin")
        if tenant != actor.tenant:
            raise TalariaError("binding_mismatch", "tenant differs from the caller's tenant", status=403)
        if state != JobState.QUEUED and state not in LEASED_STATES:
            raise TalariaError("invalid_request", "state must be QUEUED, LEASED or RUNNING")
        if state != JobState.QUEUED and not actor.has(PLATFORM_ADMIN):
            raise TalariaError("role_forbidden", "discovering leased jobs needs the role platform_admin")
        size = DEFAULT_DISCOVERY_LIMIT if limit is None else limit
        if not 1 <= size <= MAX_DISCOVERY_LIMIT:
            raise TalariaError("invalid_request", "limit must be between 1 and 100")
        with self.store.read() as tx:
            rows = tx.all("job_discover", tenant=tenant, cell=cell, profile=profile, state=state, limit=size,
                          every_door=int(actor.sees_in_process_jobs))  # fmt: skip
        return Discovery(
            tuple(
                Discovered(
                    Job.from_row(row).binding(actor.principal),
                    row["state"],
                    row["attempt"],
                    row["max_attempts"],
                    row["revision"],
                    row["enqueued_at"],
                )
                for row in rows
            )
        )

    # --- what the web API and the dispatcher read ------------------------------------------------

    def task(self, tenant: str, task_id: str) -> TaskWithJob | None:
        """A task of a tenant with its job's id (once dispatched), or None."""
        with self.store.read() as tx:
            row = tx.one("task_get", tenant=tenant, id=task_id)
            dispatch = tx.one("dispatch_get_by_task", task_id=task_id) if row else None
        if row is None:
            return None
        return TaskWithJob(Task.from_row(row), dispatch["job_id"] if dispatch else None)

    def job(self, tenant: str, job_id: str) -> tuple[JobWithResult, Task] | None:
        """A job of a tenant with its stored result and its Task, or None."""
        with self.store.read() as tx:
            row = tx.one("job_get", tenant=tenant, id=job_id)
            task = tx.one("task_get", tenant=tenant, id=row["task_id"]) if row else None
            result = tx.one("result_get", job_id=job_id) if row else None
        if row is None or task is None:
            return None
        return JobWithResult(Job.from_row(row), _result(result["payload"] if result else None)), Task.from_row(task)

    def job_dispatch(self, job: Job) -> Dispatch | None:
        with self.store.read() as tx:
            row = tx.one("dispatch_get", id=job.dispatch_id)
        return Dispatch.from_row(row) if row is not None else None

    def list_jobs(
        self,
        tenant: str,
        *,
        state: str | None,
        cell: str | None,
        created_by: str | None,
        after: tuple[int, str] | None,
        limit: int,
    ) -> list[JobWithResult]:
        """A page of a tenant's jobs with their results, newest first: one query (a join)."""
        with self.store.read() as tx:
            rows = tx.all(
                "job_list", tenant=tenant, state=state, cell=cell, created_by=created_by, limit=limit, **_cursor(after)
            )
        return [JobWithResult(Job.from_row(row), _result(row["result_payload"]), row["task_title"]) for row in rows]

    def list_tasks(
        self, tenant: str, *, created_by: str | None, state: str | None, after: tuple[int, str] | None, limit: int
    ) -> list[TaskWithJob]:
        """A page of a tenant's tasks with their jobs' ids, newest first."""
        with self.store.read() as tx:
            rows = tx.all("task_list", tenant=tenant, created_by=created_by, state=state, limit=limit, **_cursor(after))
        return [TaskWithJob(Task.from_row(row), row["job_id"]) for row in rows]

    def list_audit(
        self,
        tenant: str,
        *,
        task_id: str | None,
        job_id: str | None,
        before_seq: int | None,
        limit: int,
        conversation_id: str | None = None,
        bot_id: str | None = None,
        team_id: str | None = None,
        goal_id: str | None = None,
    ) -> list[AuditEntry]:
        """A page of a tenant's audit events (optionally of one task, job, conversation, bot, team or goal), newest
        first."""
        with self.store.read() as tx:
            rows = tx.all(
                "audit_list", tenant=tenant, task_id=task_id, job_id=job_id, conversation_id=conversation_id,
                bot_id=bot_id, team_id=team_id, goal_id=goal_id, before_seq=before_seq, limit=limit,
            )  # fmt: skip
        return [AuditEntry.from_row(row) for row in rows]
