"""Conditional writes of goals and assignments, and the terminal delivery a goal's end creates (team-tools.md 3.3,
3.4, 7). Every write names the revision it read: a row that changed meanwhile fails the whole transaction with
``store_unavailable`` (the caller retries), so no two writers interleave on one goal or assignment.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Final

from talaria.canonical import sha256_hex
from talaria.errors import TalariaError
from talaria.store.interface import Tx
from talaria.teams.machine import (
    DELIVERED_ON_ENTRY,
    OPEN_ASSIGNMENT,
    TERMINAL_GOAL,
    AssignmentEvent,
    AssignmentStatus,
    assignment_after,
)
from talaria.teams.records import Assignment, Goal

REVIEW: Final = "review"
TERMINAL: Final = "terminal"


def _changed(kind: str) -> TalariaError:
    return TalariaError("store_unavailable", f"the {kind} changed meanwhile; try again")


def set_goal(tx: Tx, goal: Goal, now_ms: int, **changes: Any) -> Goal:
    """``goal`` (as read in this transaction) with ``changes``; revision +1. Entering a terminal status sets
    ``finished_at``; leaving one clears it."""
    after = replace(goal, **changes)
    finished = after.finished_at
    if after.status != goal.status:
        finished = now_ms if after.status in TERMINAL_GOAL else None
    written = tx.run(
        "goal_set", id=goal.id, expected_revision=goal.revision, status=after.status, cause=after.cause,
        acceptance_criteria=json.dumps(list(after.acceptance_criteria)),
        acceptance_revision=after.acceptance_revision, checks=json.dumps(list(after.checks)), result=after.result,
        activation=after.activation, automatic_wakes=after.automatic_wakes,
        origin_conversation_id=after.origin_conversation_id, origin_turn_id=after.origin_turn_id,
        team_revision=after.team_revision, auth_version=after.auth_version, last_turn_id=after.last_turn_id,
        finish_turn_id=after.finish_turn_id, wake_turn_id=after.wake_turn_id, last_signature=after.last_signature,
        stopped_by=after.stopped_by, finished_at=finished, now=now_ms,
    )  # fmt: skip
    if written != 1:
        raise _changed("goal")
    after = replace(after, revision=goal.revision + 1, updated_at=now_ms, finished_at=finished)
    if after.status != goal.status and after.status in DELIVERED_ON_ENTRY:
        add_delivery(tx, after, TERMINAL, str(after.revision), now_ms)
    return after


def set_assignment(tx: Tx, assignment: Assignment, now_ms: int, **changes: Any) -> Assignment:
    """``assignment`` (as read in this transaction) with ``changes``; revision +1."""
    after = replace(assignment, **changes)
    written = tx.run(
        "assignment_set", id=assignment.id, expected_revision=assignment.revision, status=after.status,
        attempt=after.attempt, max_attempts=after.max_attempts, result=after.result, review=after.review,
        task_id=after.task_id, job_id=after.job_id, now=now_ms,
    )  # fmt: skip
    if written != 1:
        raise _changed("assignment")
    return replace(after, revision=assignment.revision + 1, updated_at=now_ms)


def delivery_id(goal_id: str, activation: int, kind: str, signature: str) -> str:
    """``dlv_`` + 32 hex of sha256(``goal:activation:kind:signature``) (3.5): one id per delivery, so a restart
    can never post one twice."""
    return "dlv_" + sha256_hex(f"{goal_id}:{activation}:{kind}:{signature}")[:32]


def add_delivery(tx: Tx, goal: Goal, kind: str, signature: str, now_ms: int) -> str:
    """A pending delivery of ``kind`` for ``goal`` as it is now (a terminal one's signature is the goal's
    revision); the same one again is the one already there."""
    delivery = delivery_id(goal.id, goal.activation, kind, signature)
    tx.run("team_delivery_insert", id=delivery, goal_id=goal.id, activation=goal.activation, kind=kind,
           signature=signature, goal_status=goal.status, now=now_ms)  # fmt: skip
    return delivery


def cancel_open(tx: Tx, assignments: list[Assignment], now_ms: int, reason: str | None) -> list[Assignment]:
    """A9 for every open assignment of a goal ending or stopped (G5, G6): ``cancelled``, or ``cancelling`` while
    its job runs (the reconciler then cancels the job and settles it, 4.3); the ones it changed, as after."""
    changed = []
    for assignment in assignments:
        if assignment.status not in OPEN_ASSIGNMENT or assignment.status == AssignmentStatus.CANCELLING:
            continue
        status = assignment_after(assignment.status, AssignmentEvent.CANCEL)
        review = reason if reason is not None else assignment.review
        changed.append(set_assignment(tx, assignment, now_ms, status=status.value, review=review))
    return changed
