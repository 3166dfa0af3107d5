"""The pure transition tables: jobs (lifecycle.md 4) and tasks (section 3)."""

from __future__ import annotations

import itertools

import pytest

from talaria.errors import TalariaError
from talaria.lifecycle.machine import (
    AUDIT_TYPE,
    EVIDENCE_KIND,
    LEASED_STATES,
    TERMINAL,
    TERMINAL_OF_OP,
    JobOp,
    JobState,
    TaskOp,
    TaskState,
    allowed,
    next_job_state,
    next_task_state,
)

Q, L, R = JobState.QUEUED, JobState.LEASED, JobState.RUNNING
S, F, C = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

# lifecycle.md section 4, rows 2-9: (from, op) -> to. Every other pair except expiry is invalid_transition.
JOB_TABLE: dict[tuple[str, JobOp], str] = {
    (Q, JobOp.CLAIM): L,  # row 2
    (L, JobOp.START): R,  # row 3
    (L, JobOp.HEARTBEAT): L,  # row 4
    (R, JobOp.HEARTBEAT): R,
    (R, JobOp.COMPLETE): S,  # row 5
    (L, JobOp.FAIL): F,  # row 6
    (R, JobOp.FAIL): F,
    (L, JobOp.HOLDER_CANCEL): C,  # row 7
    (R, JobOp.HOLDER_CANCEL): C,
    (Q, JobOp.ADMIN_CANCEL): C,  # row 8
    (L, JobOp.ADMIN_CANCEL): L,  # row 9: unchanged state, flag set
    (R, JobOp.ADMIN_CANCEL): R,
}
# expiry and the holder's release (ADR 0030) end a lease alike: rows 10-12
REQUEUEING = [JobOp.EXPIRE, JobOp.RELEASE]
NON_EXPIRY_OPS = [op for op in JobOp if op not in REQUEUEING]
ALL_JOB_STATES = list(JobState)


def test_job_states_and_ops_are_the_spec_names() -> None:
    assert {s.value for s in JobState} == {"QUEUED", "LEASED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}
    assert set(TERMINAL) == {"SUCCEEDED", "FAILED", "CANCELLED"}
    assert set(LEASED_STATES) == {"LEASED", "RUNNING"}


@pytest.mark.parametrize(("state", "op"), list(itertools.product(ALL_JOB_STATES, NON_EXPIRY_OPS)))
def test_every_job_state_and_operation(state: JobState, op: JobOp) -> None:
    expected = JOB_TABLE.get((state, op))
    if expected is not None:
        assert next_job_state(state, op) == expected
        assert allowed(state, op)
    else:
        assert not allowed(state, op)
        with pytest.raises(TalariaError) as info:
            next_job_state(state, op)
        assert info.value.code == "invalid_transition"
        assert info.value.status == 409


@pytest.mark.parametrize(
    ("state", "op"),
    [(R, JobOp.START), (L, JobOp.COMPLETE), (Q, JobOp.START), (Q, JobOp.HEARTBEAT)],
)
def test_the_named_invalid_examples(state: JobState, op: JobOp) -> None:
    """Section 4: start twice, complete from LEASED, start or heartbeat on QUEUED."""
    with pytest.raises(TalariaError) as info:
        next_job_state(state, op)
    assert info.value.code == "invalid_transition"


@pytest.mark.parametrize("state", [S, F, C])
@pytest.mark.parametrize("op", list(JobOp))
def test_terminal_rows_never_change(state: JobState, op: JobOp) -> None:
    with pytest.raises(TalariaError) as info:
        next_job_state(state, op, exhausted=True, cancel_requested=True)
    assert info.value.code == "invalid_transition"


@pytest.mark.parametrize("op", REQUEUEING)
@pytest.mark.parametrize("state", [L, R])
@pytest.mark.parametrize(
    ("exhausted", "cancel_requested", "expected"),
    [
        (False, False, Q),  # row 10: requeue
        (True, False, F),  # row 11: attempts exhausted
        (False, True, C),  # row 12: cancel requested
        (True, True, C),  # row 12 takes precedence over row 11
    ],
)
def test_expiry_rows_10_11_12(
    state: JobState, exhausted: bool, cancel_requested: bool, expected: JobState, op: JobOp
) -> None:
    assert allowed(state, op)
    assert next_job_state(state, op, exhausted=exhausted, cancel_requested=cancel_requested) == expected


@pytest.mark.parametrize("op", REQUEUEING)
def test_expiry_default_is_a_requeue(op: JobOp) -> None:
    assert next_job_state(R, op) == Q


@pytest.mark.parametrize("op", REQUEUEING)
@pytest.mark.parametrize("state", [Q, S, F, C])
def test_expiry_only_from_leased_states(state: JobState, op: JobOp) -> None:
    assert not allowed(state, op)
    with pytest.raises(TalariaError) as info:
        next_job_state(state, op)
    assert info.value.code == "invalid_transition"


def test_flags_do_not_change_non_expiry_transitions() -> None:
    for (state, op), expected in JOB_TABLE.items():
        for exhausted, flag in itertools.product([False, True], repeat=2):
            assert next_job_state(state, op, exhausted=exhausted, cancel_requested=flag) == expected


def test_audit_types_and_evidence_kinds_of_holder_operations() -> None:
    assert AUDIT_TYPE == {
        JobOp.CLAIM: "hermes.job.claimed",
        JobOp.START: "hermes.job.started",
        JobOp.HEARTBEAT: "hermes.job.heartbeat",
        JobOp.COMPLETE: "hermes.job.completed",
        JobOp.FAIL: "hermes.job.failed",
        JobOp.HOLDER_CANCEL: "hermes.job.cancelled",
    }
    assert EVIDENCE_KIND == {
        JobOp.CLAIM: "claim",
        JobOp.START: "start",
        JobOp.HEARTBEAT: "heartbeat",
        JobOp.COMPLETE: "complete",
        JobOp.FAIL: "fail",
        JobOp.HOLDER_CANCEL: "cancel",
    }
    for op, terminal in TERMINAL_OF_OP.items():
        assert next_job_state(R, op) == terminal


# ---------------------------------------------------------------- tasks (section 3)

D, P, A = TaskState.DRAFT, TaskState.PENDING_APPROVAL, TaskState.APPROVED
TASK_TABLE: dict[tuple[str, TaskOp], str] = {
    (D, TaskOp.SUBMIT): P,
    (P, TaskOp.APPROVE): A,
    (P, TaskOp.REJECT): TaskState.REJECTED,
    (D, TaskOp.CANCEL): TaskState.CANCELLED,
    (P, TaskOp.CANCEL): TaskState.CANCELLED,
    (A, TaskOp.CANCEL): TaskState.CANCELLED,
    (A, TaskOp.DISPATCH): TaskState.DISPATCHED,
}
ALL_TASK_STATES = list(TaskState)


def test_task_states_are_the_spec_names() -> None:
    assert {s.value for s in TaskState} == {
        "DRAFT",
        "PENDING_APPROVAL",
        "APPROVED",
        "REJECTED",
        "CANCELLED",
        "DISPATCHED",
        "SUCCEEDED",
        "FAILED",
    }


@pytest.mark.parametrize(
    ("state", "op"),
    [(s, op) for s, op in itertools.product(ALL_TASK_STATES, TaskOp) if op not in (TaskOp.RECONCILE, TaskOp.DISPATCH)],
)
def test_every_task_state_and_operation(state: TaskState, op: TaskOp) -> None:
    expected = TASK_TABLE.get((state, op))
    if expected is not None:
        assert next_task_state(state, op) == expected
    else:
        with pytest.raises(TalariaError) as info:
            next_task_state(state, op)
        assert info.value.code == "invalid_transition"
        assert info.value.status == 409


def test_dispatch_from_approved() -> None:
    assert next_task_state(A, TaskOp.DISPATCH) == TaskState.DISPATCHED


@pytest.mark.parametrize("state", [s for s in ALL_TASK_STATES if s is not TaskState.APPROVED])
def test_dispatch_from_anything_else_is_not_approved(state: TaskState) -> None:
    with pytest.raises(TalariaError) as info:
        next_task_state(state, TaskOp.DISPATCH)
    assert info.value.code == "not_approved"
    assert info.value.status == 409


@pytest.mark.parametrize("kind", ["SUCCEEDED", "FAILED", "CANCELLED"])
def test_reconcile_moves_a_dispatched_task_to_the_terminal_kind(kind: str) -> None:
    assert next_task_state(TaskState.DISPATCHED, TaskOp.RECONCILE, terminal_kind=kind) == kind


@pytest.mark.parametrize("kind", [None, "QUEUED", "LEASED", "RUNNING", "REJECTED", "succeeded"])
def test_reconcile_needs_a_terminal_job_kind(kind: str | None) -> None:
    with pytest.raises(TalariaError) as info:
        next_task_state(TaskState.DISPATCHED, TaskOp.RECONCILE, terminal_kind=kind)
    assert info.value.code == "invalid_transition"


@pytest.mark.parametrize("state", [s for s in ALL_TASK_STATES if s is not TaskState.DISPATCHED])
def test_reconcile_only_from_dispatched(state: TaskState) -> None:
    with pytest.raises(TalariaError) as info:
        next_task_state(state, TaskOp.RECONCILE, terminal_kind="SUCCEEDED")
    assert info.value.code == "invalid_transition"


@pytest.mark.parametrize("state", [TaskState.REJECTED, TaskState.CANCELLED, TaskState.SUCCEEDED, TaskState.FAILED])
def test_terminal_tasks_accept_nothing(state: TaskState) -> None:
    for op in TaskOp:
        with pytest.raises(TalariaError):
            next_task_state(state, op, terminal_kind="SUCCEEDED")
