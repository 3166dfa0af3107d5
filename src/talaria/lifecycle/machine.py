"""The pure transition tables of tasks (lifecycle.md 3) and jobs (section 4). No I/O.

``next_job_state`` and ``next_task_state`` answer the state an operation leads to, or raise
``invalid_transition``; callers persist the answer with a conditional update.
"""

from __future__ import annotations

from enum import StrEnum

from talaria.errors import TalariaError


class JobState(StrEnum):
    QUEUED = "QUEUED"
    LEASED = "LEASED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class JobOp(StrEnum):
    CLAIM = "claim"
    START = "start"
    HEARTBEAT = "heartbeat"
    COMPLETE = "complete"
    FAIL = "fail"
    HOLDER_CANCEL = "holder_cancel"
    ADMIN_CANCEL = "admin_cancel"
    EXPIRE = "expire"
    RELEASE = "release"


JOB_INITIAL = JobState.QUEUED
"""Row 1: the state of a job the dispatch enqueues (``job_insert``)."""

TERMINAL: frozenset[str] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
LEASED_STATES: frozenset[str] = frozenset({JobState.LEASED, JobState.RUNNING})

# (from, op) -> to. Admin cancel of a leased job (row 9) and expiry (rows 10-12) are resolved below.
_JOB_TABLE: dict[tuple[str, str], str] = {
    (JobState.QUEUED, JobOp.CLAIM): JobState.LEASED,
    (JobState.LEASED, JobOp.START): JobState.RUNNING,
    (JobState.LEASED, JobOp.HEARTBEAT): JobState.LEASED,
    (JobState.RUNNING, JobOp.HEARTBEAT): JobState.RUNNING,
    (JobState.RUNNING, JobOp.COMPLETE): JobState.SUCCEEDED,
    (JobState.LEASED, JobOp.FAIL): JobState.FAILED,
    (JobState.RUNNING, JobOp.FAIL): JobState.FAILED,
    (JobState.LEASED, JobOp.HOLDER_CANCEL): JobState.CANCELLED,
    (JobState.RUNNING, JobOp.HOLDER_CANCEL): JobState.CANCELLED,
    (JobState.QUEUED, JobOp.ADMIN_CANCEL): JobState.CANCELLED,
    (JobState.LEASED, JobOp.ADMIN_CANCEL): JobState.LEASED,
    (JobState.RUNNING, JobOp.ADMIN_CANCEL): JobState.RUNNING,
}

# The audit type and evidence kind of each applied job transition.
AUDIT_TYPE = {
    JobOp.CLAIM: "hermes.job.claimed",
    JobOp.START: "hermes.job.started",
    JobOp.HEARTBEAT: "hermes.job.heartbeat",
    JobOp.COMPLETE: "hermes.job.completed",
    JobOp.FAIL: "hermes.job.failed",
    JobOp.HOLDER_CANCEL: "hermes.job.cancelled",
}
EVIDENCE_KIND = {
    JobOp.CLAIM: "claim",
    JobOp.START: "start",
    JobOp.HEARTBEAT: "heartbeat",
    JobOp.COMPLETE: "complete",
    JobOp.FAIL: "fail",
    JobOp.HOLDER_CANCEL: "cancel",
}
# Admin cancel: row 8 ends a queued job like a holder's cancel; row 9 leaves a leased job's state and
# sets ``cancel_requested``.
ADMIN_CANCEL_AUDIT_TYPE = "hermes.job.cancelled"
ADMIN_CANCEL_EVIDENCE_KIND = "cancel"
CANCEL_FLAG_AUDIT_TYPE = "hermes.job.cancel_requested"
CANCEL_FLAG_EVIDENCE_KIND = "cancel_request"
TERMINAL_OF_OP = {
    JobOp.COMPLETE: JobState.SUCCEEDED,
    JobOp.FAIL: JobState.FAILED,
    JobOp.HOLDER_CANCEL: JobState.CANCELLED,
}


# Expiry (rows 10-12) and the holder's release (rows 10h-12h, ADR 0030) end a lease the same way: back to
# QUEUED for the next attempt, FAILED when the attempts are used up, CANCELLED when a cancel was requested.
_REQUEUEING = frozenset({JobOp.EXPIRE, JobOp.RELEASE})


def allowed(state: str, op: JobOp) -> bool:
    if op in _REQUEUEING:
        return state in LEASED_STATES
    return (state, op) in _JOB_TABLE


def next_job_state(state: str, op: JobOp, *, exhausted: bool = False, cancel_requested: bool = False) -> str:
    """The state after ``op``. Expiry and release: cancel requested wins over exhausted over requeue."""
    if op in _REQUEUEING:
        if state not in LEASED_STATES:
            raise TalariaError("invalid_transition", f"{op.value} is not allowed from {state}")
        if cancel_requested:
            return JobState.CANCELLED
        return JobState.FAILED if exhausted else JobState.QUEUED
    to = _JOB_TABLE.get((state, op))
    if to is None:
        raise TalariaError("invalid_transition", f"{op.value} is not allowed from {state}")
    return to


class TaskState(StrEnum):
    DRAFT = "DRAFT"
    PENDING_APPROVAL = "PENDING_APPROVAL"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"
    CANCELLED = "CANCELLED"
    DISPATCHED = "DISPATCHED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class TaskOp(StrEnum):
    SUBMIT = "submit"
    APPROVE = "approve"
    REJECT = "reject"
    CANCEL = "cancel"
    DISPATCH = "dispatch"
    RECONCILE = "reconcile"


TASK_INITIAL = TaskState.DRAFT
"""The state of a created task (``task_insert``)."""

TASK_FINAL: frozenset[str] = frozenset({TaskState.REJECTED, TaskState.CANCELLED, TaskState.SUCCEEDED, TaskState.FAILED})
"""Task states nothing leaves."""

_TASK_TABLE: dict[tuple[str, str], str] = {
    (TaskState.DRAFT, TaskOp.SUBMIT): TaskState.PENDING_APPROVAL,
    (TaskState.PENDING_APPROVAL, TaskOp.APPROVE): TaskState.APPROVED,
    (TaskState.PENDING_APPROVAL, TaskOp.REJECT): TaskState.REJECTED,
    (TaskState.DRAFT, TaskOp.CANCEL): TaskState.CANCELLED,
    (TaskState.PENDING_APPROVAL, TaskOp.CANCEL): TaskState.CANCELLED,
    (TaskState.APPROVED, TaskOp.CANCEL): TaskState.CANCELLED,
    (TaskState.APPROVED, TaskOp.DISPATCH): TaskState.DISPATCHED,
}


def next_task_state(state: str, op: TaskOp, *, terminal_kind: str | None = None) -> str:
    """The task state after ``op``; reconcile takes the job's terminal kind."""
    if op is TaskOp.RECONCILE:
        if state != TaskState.DISPATCHED or terminal_kind not in TERMINAL:
            raise TalariaError("invalid_transition", f"reconcile is not allowed from {state}")
        return terminal_kind
    if op is TaskOp.DISPATCH and state != TaskState.APPROVED:
        raise TalariaError("not_approved", f"only APPROVED tasks are dispatched (task is {state})")
    to = _TASK_TABLE.get((state, op))
    if to is None:
        raise TalariaError("invalid_transition", f"{op.value} is not allowed from {state}")
    return to
