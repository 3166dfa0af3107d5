"""The goal tools of team-tools.md 6.3: start, read, re-criteria, finish and resume a goal (3.3, G1-G8).

Only the goal's coordinator (the administrator of its team, who started it) may touch it (403 ``goal_forbidden``);
starting and resuming need a user instruction (403 ``user_instruction_required``: the caller's turn was sent by its
owner, never an automatic one), so a wake can never start work on its own. Every mutating goal tool sets the goal's
``lastTurnId``; starting or resuming captures its origin (this conversation and turn) and its authority (the
coordinator's ``teamRevision``, the owner's ``auth_version``).
"""

from __future__ import annotations

import json
from typing import Any, Final

from talaria.chat.bots import name_key
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.limits import ATTEMPTS_PER_ACTIVATION, MAX_OPEN_GOALS_PER_TEAM
from talaria.store.interface import Tx
from talaria.teams import permission, reads, writes
from talaria.teams.calls import Applied, Context
from talaria.teams.evidence import Event
from talaria.teams.machine import (
    ACTIVE_GOAL,
    STOPPABLE_GOAL,
    AssignmentEvent,
    AssignmentStatus,
    GoalEvent,
    GoalStatus,
    assignment_after,
    goal_after,
)
from talaria.teams.records import Assignment, Goal, Team
from talaria.teams.round import USER
from talaria.teams.tools_teams import administered

DEFAULT_CRITERIA: Final = ("The delivery meets the original request, with evidence.",)
_FINISH: Final = {"complete": GoalEvent.FINISH_COMPLETE, "blocked": GoalEvent.FINISH_BLOCKED,
                  "waiting": GoalEvent.FINISH_WAITING}  # fmt: skip


def coordinated(context: Context, goal_id: str) -> tuple[Goal, Team]:
    """The owner's goal ``goal_id`` of a team not archived (else 404 ``not_found``), coordinated by the caller
    (else 403 ``goal_forbidden``), with its team."""
    round = context.round
    goal = reads.goal(context.tx, round.tenant, round.owner, goal_id)
    team = reads.team(context.tx, round.tenant, round.owner, goal.team_id) if goal is not None else None
    if goal is None or team is None or team.archived:
        raise TalariaError("not_found", "no such goal")
    if goal.coordinator_id != context.caller.id:
        raise TalariaError("goal_forbidden", "only the goal's coordinator may do this")
    return goal, team


def require_active(goal: Goal, allowed: frozenset[GoalStatus] = ACTIVE_GOAL) -> None:
    if goal.status not in allowed:
        raise TalariaError("goal_not_active", f"the goal is {goal.status}")


def status_after_activity(goal: Goal) -> GoalStatus:
    """G3: a goal in review goes back to running; a waiting goal stays waiting."""
    return goal_after(goal.status, GoalEvent.ACTIVITY) if goal.status in ACTIVE_GOAL else GoalStatus(goal.status)


def activity(context: Context, goal: Goal, **changes: Any) -> Goal:
    """G3 with ``changes``; ``lastTurnId`` is the caller's turn."""
    return writes.set_goal(context.tx, goal, context.now_ms, status=status_after_activity(goal).value,
                           last_turn_id=context.round.turn_id, **changes)  # fmt: skip


def replace_criteria(
    tx: Tx, goal: Goal, criteria: list[str], expected_revision: Any, now_ms: int, *, turn_id: str | None
) -> Goal:
    """The criteria change of the coordinator's tool and of a person (team-tools.md 6.3, 11): 409
    ``goal_not_active`` unless the goal is running, in review or waiting, 409 ``goal_criteria_changed`` for another
    revision; the checks are cleared. ``turn_id`` (the coordinator's turn; None for a person) becomes
    ``lastTurnId``."""
    require_active(goal, STOPPABLE_GOAL)
    if expected_revision != goal.acceptance_revision:
        raise TalariaError("goal_criteria_changed", f"the criteria are at revision {goal.acceptance_revision}")
    turn = {} if turn_id is None else {"last_turn_id": turn_id}
    return writes.set_goal(tx, goal, now_ms, status=status_after_activity(goal).value,
                           acceptance_criteria=tuple(criteria), acceptance_revision=goal.acceptance_revision + 1,
                           checks=(), **turn)  # fmt: skip


def goal_view(tx: Tx, goal: Goal) -> dict[str, Any]:
    return goal.view(reads.assignments(tx, goal.id))


def _goal_event(kind: str, before: Goal | None, after: Goal, reason: str | None = None) -> Event:
    return Event(
        kind, from_state=before.status if before is not None else None, to_state=after.status,
        revision_after=after.revision, reason_code=reason, team_id=after.team_id, goal_id=after.id,
    )  # fmt: skip


def cancelled_events(goal: Goal, cancelled: list[Assignment]) -> tuple[Event, ...]:
    """One ``team.assignment.cancelled`` per assignment a cascade cancelled (10)."""
    return tuple(
        Event("team.assignment.cancelled", from_state=AssignmentStatus.RUNNING.value
              if a.status == AssignmentStatus.CANCELLING else None, to_state=a.status, revision_after=a.revision,
              team_id=goal.team_id, goal_id=goal.id, assignment_id=a.id, target_bot_id=a.bot_id)
        for a in cancelled
    )  # fmt: skip


def _require_user_instruction(context: Context) -> None:
    if context.round.trigger != USER:
        raise TalariaError("user_instruction_required", "only a message from the user may start or resume a goal")


def _room_for(tx: Tx, team_id: str, title: str, goal_id: str, *, counted: bool) -> None:
    """409 ``goal_exists`` for another open goal of this title, ``goal_limit`` for a fifth open goal
    (``counted``: the goal is one of the open ones already)."""
    if tx.one("goal_title_taken", team_id=team_id, title_key=name_key(title), id=goal_id) is not None:
        raise TalariaError("goal_exists", "the team has an open goal of this title")
    open_goals = reads.count(tx, "goal_open_count", team_id=team_id) - int(counted)
    if open_goals >= MAX_OPEN_GOALS_PER_TEAM:
        raise TalariaError("goal_limit", f"a team has at most {MAX_OPEN_GOALS_PER_TEAM} open goals")


def start_goal(context: Context, args: dict[str, Any]) -> Applied:
    tx, round = context.tx, context.round
    team = administered(context, args["teamId"])
    _require_user_instruction(context)
    goal_id = mint("gol", context.now_ms)
    _room_for(tx, team.id, args["title"], goal_id, counted=False)
    criteria = args.get("acceptanceCriteria") or list(DEFAULT_CRITERIA)
    tx.run(
        "goal_insert", id=goal_id, tenant=round.tenant, owner=round.owner, team_id=team.id,
        coordinator_id=context.caller.id, title=args["title"], title_key=name_key(args["title"]),
        objective=args["objective"], acceptance_criteria=json.dumps(criteria),
        origin_conversation_id=round.conversation_id, origin_turn_id=round.turn_id,
        team_revision=permission.of(tx, context.caller.id).revision, auth_version=context.owner.auth_version,
        now=context.now_ms,
    )  # fmt: skip
    goal = reads.goal(tx, round.tenant, round.owner, goal_id)
    assert goal is not None
    return Applied({"goal": goal.view(())}, _goal_event("team.goal.started", None, goal), goal_id=goal.id)


def get_goal(context: Context, args: dict[str, Any]) -> dict[str, Any]:
    goal, team = coordinated(context, args["goalId"])
    assignments = reads.assignments(context.tx, goal.id)
    return {"goal": goal.view(assignments), "team": team.view(), "assignments": [a.view() for a in assignments]}


def update_goal_criteria(context: Context, args: dict[str, Any]) -> Applied:
    goal, _ = coordinated(context, args["goalId"])
    after = replace_criteria(context.tx, goal, args["acceptanceCriteria"], args["expectedRevision"],
                             context.now_ms, turn_id=context.round.turn_id)  # fmt: skip
    event = _goal_event("team.goal.criteria_updated", goal, after)
    return Applied({"goal": goal_view(context.tx, after)}, event, goal_id=goal.id)


def _require_complete(goal: Goal, assignments: list[Assignment], args: dict[str, Any]) -> None:
    if args["acceptanceRevision"] != goal.acceptance_revision:
        raise TalariaError("goal_criteria_changed", f"the criteria are at revision {goal.acceptance_revision}")
    statuses = [a.status for a in assignments]
    unfinished = [s for s in statuses if s not in (AssignmentStatus.COMPLETE, AssignmentStatus.CANCELLED)]
    if unfinished or (statuses and AssignmentStatus.COMPLETE not in statuses):
        raise TalariaError("goal_incomplete", "every assignment must be complete or cancelled, and one complete")
    passed = {check["criterion"] for check in args.get("checks", []) if check["passed"]}
    missing = [n for n in range(len(goal.acceptance_criteria)) if n not in passed]
    if missing:
        raise TalariaError("goal_checks_missing", f"criterion {missing[0]} has no passed check")


def finish_goal(context: Context, args: dict[str, Any]) -> Applied:
    tx = context.tx
    goal, _ = coordinated(context, args["goalId"])
    require_active(goal)
    checks = args.get("checks", [])
    beyond = [c["criterion"] for c in checks if c["criterion"] >= len(goal.acceptance_criteria)]
    if beyond:
        raise TalariaError("invalid_request", f"checks: criterion {beyond[0]} is beyond the goal's criteria")
    assignments = reads.assignments(tx, goal.id)
    if args["status"] == GoalStatus.COMPLETE:
        _require_complete(goal, assignments, args)
    status = goal_after(goal.status, _FINISH[args["status"]])
    cancelled = writes.cancel_open(tx, assignments, context.now_ms, None) if status != GoalStatus.COMPLETE else []
    turn = context.round.turn_id
    after = writes.set_goal(tx, goal, context.now_ms, status=status.value, checks=tuple(checks),
                            result=args["result"], last_turn_id=turn, finish_turn_id=turn)  # fmt: skip
    event = _goal_event("team.goal.finished", goal, after, args["status"])
    return Applied({"goal": goal_view(tx, after)}, event, cancelled_events(after, cancelled), goal_id=goal.id)


def resume_goal(context: Context, args: dict[str, Any]) -> Applied:
    tx, round = context.tx, context.round
    goal, _ = coordinated(context, args["goalId"])
    _require_user_instruction(context)
    status = goal_after(goal.status, GoalEvent.RESUME)
    assignments = reads.assignments(tx, goal.id)
    if any(a.status == AssignmentStatus.CANCELLING for a in assignments):
        raise TalariaError("goal_still_running", "an assignment of the goal is still being cancelled")
    _room_for(tx, goal.team_id, goal.title, goal.id, counted=goal.status == GoalStatus.WAITING)
    for a in assignments:
        if a.status == AssignmentStatus.COMPLETE:
            continue
        reopened = a.status == AssignmentStatus.CANCELLED
        writes.set_assignment(
            tx, a, context.now_ms, max_attempts=a.max_attempts + ATTEMPTS_PER_ACTIVATION,
            status=assignment_after(a.status, AssignmentEvent.REOPEN).value if reopened else a.status,
        )  # fmt: skip
    after = writes.set_goal(
        tx, goal, context.now_ms, status=status.value, cause=None, activation=goal.activation + 1, checks=(),
        result=None, automatic_wakes=0, origin_conversation_id=round.conversation_id, origin_turn_id=round.turn_id,
        team_revision=permission.of(tx, context.caller.id).revision, auth_version=context.owner.auth_version,
        last_turn_id=round.turn_id, finish_turn_id=None, stopped_by=None,
    )  # fmt: skip
    return Applied({"goal": goal_view(tx, after)}, _goal_event("team.goal.resumed", goal, after), goal_id=goal.id)
