"""The pure transition tables of goals (team-tools.md 3.3, G1-G8) and assignments (3.4, A1-A10). No I/O.

``goal_after`` and ``assignment_after`` answer the status an event leads to, or raise the event's pinned code;
callers persist the answer with an UPDATE conditional on id, status and revision, audited in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from talaria.errors import TalariaError


class GoalStatus(StrEnum):
    RUNNING = "running"
    REVIEW = "review"
    WAITING = "waiting"
    BLOCKED = "blocked"
    COMPLETE = "complete"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class GoalEvent(StrEnum):
    START = "start"  # G1: talaria_start_goal
    REVIEW = "review"  # G2: the review evaluation (4.5)
    ACTIVITY = "activity"  # G3: assign, review or cancel an assignment, change criteria
    FINISH_COMPLETE = "finish_complete"  # G4
    FINISH_BLOCKED = "finish_blocked"  # G5
    FINISH_WAITING = "finish_waiting"  # G5
    CANCEL = "cancel"  # G6: a person stops it, authority lost, origin gone, a restore; assignments still cancelling
    CANCEL_SETTLED = "cancel_settled"  # G6 with nothing cancelling, and G7: the last cancelling one settled
    RESUME = "resume"  # G8: talaria_resume_goal


G = GoalStatus
# a coordinator's activity (G3) and finish (G4, G5) need one of these
ACTIVE_GOAL: Final = frozenset({G.RUNNING, G.REVIEW})
# a stop (G6), a criteria change and a new assignment need one of these
STOPPABLE_GOAL: Final = frozenset({G.RUNNING, G.REVIEW, G.WAITING})

# (from, event) -> to; None as "from" is a goal that does not exist yet
GOAL_MOVES: Final[Mapping[tuple[GoalStatus | None, GoalEvent], GoalStatus]] = {
    (None, GoalEvent.START): G.RUNNING,
    (G.RUNNING, GoalEvent.REVIEW): G.REVIEW,
    (G.RUNNING, GoalEvent.ACTIVITY): G.RUNNING,
    (G.REVIEW, GoalEvent.ACTIVITY): G.RUNNING,
    **{(s, GoalEvent.FINISH_COMPLETE): G.COMPLETE for s in ACTIVE_GOAL},
    **{(s, GoalEvent.FINISH_BLOCKED): G.BLOCKED for s in ACTIVE_GOAL},
    **{(s, GoalEvent.FINISH_WAITING): G.WAITING for s in ACTIVE_GOAL},
    **{(s, GoalEvent.CANCEL): G.CANCELLING for s in STOPPABLE_GOAL},
    **{(s, GoalEvent.CANCEL_SETTLED): G.CANCELLED for s in (*STOPPABLE_GOAL, G.CANCELLING)},
    **{(s, GoalEvent.RESUME): G.RUNNING for s in (G.BLOCKED, G.WAITING, G.CANCELLED)},
}  # fmt: skip

TERMINAL_GOAL: Final = frozenset({G.COMPLETE, G.BLOCKED, G.CANCELLED})
# entering one of these creates a terminal delivery (3.3)
DELIVERED_ON_ENTRY: Final = frozenset({G.COMPLETE, G.BLOCKED, G.WAITING, G.CANCELLED})


def goal_after(status: GoalStatus | str | None, event: GoalEvent) -> GoalStatus:
    """The goal's status after ``event``; 409 ``goal_not_active`` for any other move (3.3), ``goal_not_resumable``
    for a resume of a goal that is not blocked, waiting or cancelled."""
    current = GoalStatus(status) if status is not None else None
    target = GOAL_MOVES.get((current, event))
    if target is None:
        if event is GoalEvent.RESUME:
            raise TalariaError("goal_not_resumable", f"a {current} goal cannot be resumed")
        raise TalariaError("goal_not_active", f"the goal is {current}")
    return target


class AssignmentStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    REVIEW = "review"
    FAILED = "failed"
    BLOCKED = "blocked"
    COMPLETE = "complete"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class AssignmentEvent(StrEnum):
    CREATE = "create"  # A1: talaria_assign
    DISPATCH = "dispatch"  # A2
    MEMBER_UNUSABLE = "member_unusable"  # A3
    JOB_REPLIED = "job_replied"  # A4: SUCCEEDED with a non-blank reply
    JOB_FAILED = "job_failed"  # A5: SUCCEEDED blank, or FAILED
    JOB_CANCELLED = "job_cancelled"  # A6: CANCELLED; for a cancelling one, any end of its job
    ACCEPT = "accept"  # A7
    RETRY = "retry"  # A8 (the caller checks attempt < maxAttempts)
    BLOCK = "block"  # A8b
    CANCEL = "cancel"  # A9: tool, G5, G6
    REOPEN = "reopen"  # A10: G8


A = AssignmentStatus
OPEN_ASSIGNMENT: Final = frozenset({A.PENDING, A.RUNNING, A.REVIEW, A.FAILED, A.BLOCKED, A.CANCELLING})
TERMINAL_ASSIGNMENT: Final = frozenset({A.COMPLETE, A.CANCELLED})

ASSIGNMENT_MOVES: Final[Mapping[tuple[AssignmentStatus | None, AssignmentEvent], AssignmentStatus]] = {
    (None, AssignmentEvent.CREATE): A.PENDING,
    (A.PENDING, AssignmentEvent.DISPATCH): A.RUNNING,
    (A.PENDING, AssignmentEvent.MEMBER_UNUSABLE): A.BLOCKED,
    (A.RUNNING, AssignmentEvent.JOB_REPLIED): A.REVIEW,
    (A.RUNNING, AssignmentEvent.JOB_FAILED): A.FAILED,
    (A.RUNNING, AssignmentEvent.JOB_CANCELLED): A.CANCELLED,
    **{(A.CANCELLING, e): A.CANCELLED
       for e in (AssignmentEvent.JOB_REPLIED, AssignmentEvent.JOB_FAILED, AssignmentEvent.JOB_CANCELLED)},
    (A.REVIEW, AssignmentEvent.ACCEPT): A.COMPLETE,
    **{(s, AssignmentEvent.RETRY): A.PENDING for s in (A.REVIEW, A.FAILED, A.BLOCKED)},
    **{(s, AssignmentEvent.BLOCK): A.BLOCKED for s in (A.REVIEW, A.FAILED)},
    **{(s, AssignmentEvent.CANCEL): A.CANCELLED for s in (A.PENDING, A.REVIEW, A.FAILED, A.BLOCKED)},
    (A.RUNNING, AssignmentEvent.CANCEL): A.CANCELLING,
    (A.CANCELLED, AssignmentEvent.REOPEN): A.PENDING,
}  # fmt: skip

_REFUSAL: Final[Mapping[AssignmentEvent, str]] = {
    AssignmentEvent.ACCEPT: "assignment_not_reviewable",
    AssignmentEvent.RETRY: "assignment_not_reviewable",
    AssignmentEvent.BLOCK: "assignment_not_reviewable",
    AssignmentEvent.CANCEL: "assignment_not_cancellable",
}


def assignment_after(status: AssignmentStatus | str | None, event: AssignmentEvent) -> AssignmentStatus:
    """The assignment's status after ``event``. A review decision that does not apply is 409
    ``assignment_not_reviewable``, a cancel 409 ``assignment_not_cancellable``; any other impossible move is
    ``invalid_transition`` (a reconciler bug, never a caller's)."""
    current = AssignmentStatus(status) if status is not None else None
    target = ASSIGNMENT_MOVES.get((current, event))
    if target is None:
        code = _REFUSAL.get(event, "invalid_transition")
        raise TalariaError(code, f"a {current} assignment cannot take {event.value}")
    return target
