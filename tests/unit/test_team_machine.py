"""The goal and assignment transition tables (team-tools.md 3.3 G1-G8, 3.4 A1-A10), every pair of state and event."""

from __future__ import annotations

import itertools

import pytest

from talaria.errors import TalariaError
from talaria.teams.machine import (
    DELIVERED_ON_ENTRY,
    OPEN_ASSIGNMENT,
    TERMINAL_ASSIGNMENT,
    TERMINAL_GOAL,
    AssignmentEvent,
    AssignmentStatus,
    GoalEvent,
    GoalStatus,
    assignment_after,
    goal_after,
)

G, GE = GoalStatus, GoalEvent
A, AE = AssignmentStatus, AssignmentEvent

# the spec's rows, written out once more by hand: (from, event, to)
GOAL_ROWS = {
    (None, GE.START, G.RUNNING),  # G1
    (G.RUNNING, GE.REVIEW, G.REVIEW),  # G2
    (G.REVIEW, GE.ACTIVITY, G.RUNNING),  # G3
    (G.RUNNING, GE.ACTIVITY, G.RUNNING),  # activity while running keeps it running
    (G.RUNNING, GE.FINISH_COMPLETE, G.COMPLETE),  # G4
    (G.REVIEW, GE.FINISH_COMPLETE, G.COMPLETE),
    (G.RUNNING, GE.FINISH_BLOCKED, G.BLOCKED),  # G5
    (G.REVIEW, GE.FINISH_BLOCKED, G.BLOCKED),
    (G.RUNNING, GE.FINISH_WAITING, G.WAITING),
    (G.REVIEW, GE.FINISH_WAITING, G.WAITING),
    (G.RUNNING, GE.CANCEL, G.CANCELLING),  # G6, an assignment still cancelling
    (G.REVIEW, GE.CANCEL, G.CANCELLING),
    (G.WAITING, GE.CANCEL, G.CANCELLING),
    (G.RUNNING, GE.CANCEL_SETTLED, G.CANCELLED),  # G6, nothing cancelling
    (G.REVIEW, GE.CANCEL_SETTLED, G.CANCELLED),
    (G.WAITING, GE.CANCEL_SETTLED, G.CANCELLED),
    (G.CANCELLING, GE.CANCEL_SETTLED, G.CANCELLED),  # G7
    (G.BLOCKED, GE.RESUME, G.RUNNING),  # G8
    (G.WAITING, GE.RESUME, G.RUNNING),
    (G.CANCELLED, GE.RESUME, G.RUNNING),
}

ASSIGNMENT_ROWS = {
    (None, AE.CREATE, A.PENDING),  # A1
    (A.PENDING, AE.DISPATCH, A.RUNNING),  # A2
    (A.PENDING, AE.MEMBER_UNUSABLE, A.BLOCKED),  # A3
    (A.RUNNING, AE.JOB_REPLIED, A.REVIEW),  # A4
    (A.RUNNING, AE.JOB_FAILED, A.FAILED),  # A5
    (A.RUNNING, AE.JOB_CANCELLED, A.CANCELLED),  # A6
    (A.CANCELLING, AE.JOB_CANCELLED, A.CANCELLED),
    (A.CANCELLING, AE.JOB_REPLIED, A.CANCELLED),
    (A.CANCELLING, AE.JOB_FAILED, A.CANCELLED),
    (A.REVIEW, AE.ACCEPT, A.COMPLETE),  # A7
    (A.REVIEW, AE.RETRY, A.PENDING),  # A8
    (A.FAILED, AE.RETRY, A.PENDING),
    (A.BLOCKED, AE.RETRY, A.PENDING),
    (A.REVIEW, AE.BLOCK, A.BLOCKED),  # A8b
    (A.FAILED, AE.BLOCK, A.BLOCKED),
    (A.PENDING, AE.CANCEL, A.CANCELLED),  # A9, open and not running
    (A.REVIEW, AE.CANCEL, A.CANCELLED),
    (A.FAILED, AE.CANCEL, A.CANCELLED),
    (A.BLOCKED, AE.CANCEL, A.CANCELLED),
    (A.RUNNING, AE.CANCEL, A.CANCELLING),  # A9, running
    (A.CANCELLED, AE.REOPEN, A.PENDING),  # A10
}

REFUSALS = {AE.ACCEPT: "assignment_not_reviewable", AE.RETRY: "assignment_not_reviewable",
            AE.BLOCK: "assignment_not_reviewable", AE.CANCEL: "assignment_not_cancellable"}  # fmt: skip


@pytest.mark.parametrize(("status", "event"), list(itertools.product([None, *G], list(GE))))
def test_every_goal_move_is_a_spec_row_or_refused_with_its_code(status: GoalStatus | None, event: GoalEvent) -> None:
    expected = {(f, e): t for f, e, t in GOAL_ROWS}.get((status, event))
    if expected is not None:
        assert goal_after(status, event) is expected
        return
    with pytest.raises(TalariaError) as refused:
        goal_after(status, event)
    assert refused.value.code == ("goal_not_resumable" if event is GE.RESUME else "goal_not_active")
    assert refused.value.status == 409


@pytest.mark.parametrize(("status", "event"), list(itertools.product([None, *A], list(AE))))
def test_every_assignment_move_is_a_spec_row_or_refused_with_its_code(
    status: AssignmentStatus | None, event: AssignmentEvent
) -> None:
    expected = {(f, e): t for f, e, t in ASSIGNMENT_ROWS}.get((status, event))
    if expected is not None:
        assert assignment_after(status, event) is expected
        return
    with pytest.raises(TalariaError) as refused:
        assignment_after(status, event)
    assert refused.value.code == REFUSALS.get(event, "invalid_transition")


def test_terminal_and_open_sets() -> None:
    terminal_goal, terminal_assignment = {G.COMPLETE, G.BLOCKED, G.CANCELLED}, {A.COMPLETE, A.CANCELLED}
    assert terminal_goal == TERMINAL_GOAL
    assert terminal_goal | {G.WAITING} == DELIVERED_ON_ENTRY
    assert terminal_assignment == TERMINAL_ASSIGNMENT
    assert set(A) - terminal_assignment == OPEN_ASSIGNMENT
    # a complete goal is final: no event leaves it
    for event in GE:
        with pytest.raises(TalariaError):
            goal_after(G.COMPLETE, event)
    # a complete assignment is final too
    for step in AE:
        with pytest.raises(TalariaError):
            assignment_after(A.COMPLETE, step)
