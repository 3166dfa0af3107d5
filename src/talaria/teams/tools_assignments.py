"""The assignment tools of team-tools.md 6.3: assign work to a member, review its result, cancel it (3.4).

An assignment names a member of the goal's team other than the coordinator (400 ``invalid_assignment_bot``), usable
now (409 ``bot_unavailable``), and may depend on earlier assignments of the same goal (400
``invalid_assignment_dependency``), so no cycle can form. It starts ``pending``: the reconciler dispatches it as a
job (4.2). Each of these tools is goal activity (G3: a goal in review goes back to running).
"""

from __future__ import annotations

import json
from typing import Any, Final

from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.limits import ATTEMPTS_PER_ACTIVATION, MAX_ASSIGNMENTS_PER_GOAL
from talaria.teams import reads, writes
from talaria.teams.calls import Applied, Context
from talaria.teams.evidence import Event
from talaria.teams.machine import STOPPABLE_GOAL, AssignmentEvent, assignment_after
from talaria.teams.records import Assignment, Goal
from talaria.teams.tools_bots import owned
from talaria.teams.tools_goals import activity, coordinated, goal_view, require_active

_DECISION: Final = {"accept": AssignmentEvent.ACCEPT, "retry": AssignmentEvent.RETRY,
                    "block": AssignmentEvent.BLOCK}  # fmt: skip


def _event(kind: str, goal: Goal, before: str | None, after: Assignment, reason: str | None = None) -> Event:
    return Event(kind, from_state=before, to_state=after.status, revision_after=after.revision, reason_code=reason,
                 team_id=goal.team_id, goal_id=goal.id, assignment_id=after.id, target_bot_id=after.bot_id)  # fmt: skip


def _of_caller(context: Context, assignment_id: str) -> tuple[Assignment, Goal]:
    """The owner's assignment (else 404 ``not_found``) and its goal, coordinated by the caller."""
    round = context.round
    assignment = reads.assignment(context.tx, round.tenant, round.owner, assignment_id)
    if assignment is None:
        raise TalariaError("not_found", "no such assignment")
    goal, _ = coordinated(context, assignment.goal_id)
    return assignment, goal


def assign(context: Context, args: dict[str, Any]) -> Applied:
    tx, round = context.tx, context.round
    goal, team = coordinated(context, args["goalId"])
    require_active(goal)
    if args["botId"] not in team.member_ids or args["botId"] == context.caller.id:
        raise TalariaError("invalid_assignment_bot", "botId must be a member of the team other than yourself")
    member = owned(context, args["botId"])
    if not context.usable(member):
        raise TalariaError("bot_unavailable", "the member is archived or its profile is not allowed now")
    earlier = {a.id for a in reads.assignments(tx, goal.id)}
    depends_on = list(dict.fromkeys(args.get("dependsOn", [])))
    unknown = [d for d in depends_on if d not in earlier]
    if unknown:
        raise TalariaError("invalid_assignment_dependency", "dependsOn must name earlier assignments of this goal")
    if len(earlier) >= MAX_ASSIGNMENTS_PER_GOAL:
        raise TalariaError("assignment_limit", f"a goal has at most {MAX_ASSIGNMENTS_PER_GOAL} assignments")
    assignment_id = mint("asg", context.now_ms)
    tx.run(
        "assignment_insert", id=assignment_id, tenant=round.tenant, owner=round.owner, goal_id=goal.id,
        bot_id=member.id, title=args["title"], brief=args["brief"],
        acceptance_criteria=json.dumps(args.get("acceptanceCriteria", [])), depends_on=json.dumps(depends_on),
        max_attempts=ATTEMPTS_PER_ACTIVATION, now=context.now_ms,
    )  # fmt: skip
    made = reads.assignment(tx, round.tenant, round.owner, assignment_id)
    assert made is not None
    activity(context, goal)
    return Applied({"assignment": made.view()}, _event("team.assignment.created", goal, None, made), goal_id=goal.id)


def review_assignment(context: Context, args: dict[str, Any]) -> Applied:
    assignment, goal = _of_caller(context, args["assignmentId"])
    require_active(goal)
    decision = args["decision"]
    status = assignment_after(assignment.status, _DECISION[decision])
    changes: dict[str, Any] = {"status": status.value, "review": args["note"]}
    if decision == "retry":
        if assignment.attempt >= assignment.max_attempts:
            raise TalariaError("assignment_retry_limit", f"the assignment used its {assignment.max_attempts} attempts")
        changes["result"] = None
    after = writes.set_assignment(context.tx, assignment, context.now_ms, **changes)
    goal_after = activity(context, goal)
    event = _event("team.assignment.reviewed", goal, assignment.status, after, decision)
    result = {"assignment": after.view(), "goal": goal_view(context.tx, goal_after)}
    return Applied(result, event, goal_id=goal.id)


def cancel_assignment(context: Context, args: dict[str, Any]) -> Applied:
    assignment, goal = _of_caller(context, args["assignmentId"])
    if goal.status not in STOPPABLE_GOAL:
        raise TalariaError("assignment_not_cancellable", f"the goal is {goal.status}")
    status = assignment_after(assignment.status, AssignmentEvent.CANCEL)
    after = writes.set_assignment(context.tx, assignment, context.now_ms, status=status.value, review=args["reason"])
    activity(context, goal)
    event = _event("team.assignment.cancelled", goal, assignment.status, after)
    return Applied({"assignment": after.view()}, event, goal_id=goal.id)
