"""The texts team tools hand to models and people (team-tools.md 4.4, 7): an assignment's prompt, a delivery's
system message, and the wake prompt of a coordinator's automatic turn. Their first lines are pinned: a scripted
model may match them (at a line start: a wake prompt quotes results)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from talaria.limits import (
    DEPENDENCY_EXCERPT_CHARS,
    GOAL_OBJECTIVE_EXCERPT_CHARS,
    WAKE_ASSIGNMENTS_SHOWN,
    WAKE_RESULT_EXCERPT_CHARS,
)
from talaria.teams.records import Assignment, Goal, Team

ASSIGNMENT_MARK: Final = "[talaria-assignment]"
REVIEW_MARK: Final = "[talaria-goal-review]"
RESULT_MARK: Final = "[talaria-goal-result]"
NO_CRITERIA: Final = "Give the actual result and the evidence for it."
LAST_LINE: Final = (
    "Do this work yourself and answer with the result and its evidence. Do not form teams or hand the work on."
)
REVIEW_ASK: Final = (
    "Review the results, assign or retry work if needed, and finish the goal with one check per criterion."
)
RESULT_ASK: Final = "Tell the user the outcome. Do not start the goal again."

ENDINGS: Final = {
    "review": "has results awaiting review.",
    "complete": "is complete.",
    "blocked": "is blocked.",
    "waiting": "needs more information.",
    "cancelled": "was stopped.",
}


def _section(heading: str, text: str) -> list[str]:
    return [heading, text] if text.strip() else []


def assignment_prompt(
    *, assignment: Assignment, goal: Goal, team: Team, member_instructions: str, done: Sequence[Assignment]
) -> str:
    """4.4: the header lines, then each non-empty section, then the last line. ``done``: the assignments this
    one depends on (each complete)."""
    lines = [
        ASSIGNMENT_MARK,
        f"assignmentId: {assignment.id}",
        f"goalId: {goal.id}",
        f"attempt: {assignment.attempt + 1}",
        f"team: {team.name}",
        f"goal: {goal.title}",
        f"title: {assignment.title}",
    ]
    lines += _section("Your instructions:", member_instructions)
    lines += _section("Team rules:", team.instructions)
    lines += _section("Brief:", assignment.brief)
    criteria = assignment.acceptance_criteria
    listed = "\n".join(f"{n}. {c}" for n, c in enumerate(criteria, start=1)) if criteria else NO_CRITERIA
    lines += _section("Acceptance criteria:", listed)
    lines += _section("Previous review:", assignment.review or "")
    results = "\n".join(f"- {d.title} ({d.id}): {(d.result or '')[:DEPENDENCY_EXCERPT_CHARS]}" for d in done)
    lines += _section("Results of the work this depends on:", results)
    lines.append(LAST_LINE)
    return "\n".join(lines)


def delivery_message(goal: Goal, team: Team, kind: str) -> str:
    """7: ``Goal "<title>" of team "<team>" `` and the ending; a terminal one adds the result's first 4,000
    characters after a blank line."""
    ending = ENDINGS["review" if kind == "review" else goal.status]
    text = f'Goal "{goal.title}" of team "{team.name}" {ending}'
    if kind != "review" and goal.result:
        text += "\n\n" + goal.result[:GOAL_OBJECTIVE_EXCERPT_CHARS]
    return text


def _flat(text: str, limit: int) -> str:
    return text[:limit].replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def wake_prompt(goal: Goal, assignments: Sequence[Assignment], kind: str) -> str:
    """7: the marker, the goal's lines, the 12 latest assignments oldest first, then the ask."""
    lines = [
        REVIEW_MARK if kind == "review" else RESULT_MARK,
        f"goalId: {goal.id}",
        f"teamId: {goal.team_id}",
        f"status: {goal.status}",
        f"acceptanceRevision: {goal.acceptance_revision}",
        f"objective: {_flat(goal.objective, GOAL_OBJECTIVE_EXCERPT_CHARS)}",
    ]
    for a in list(assignments)[-WAKE_ASSIGNMENTS_SHOWN:]:
        lines.append(f"assignment {a.id} {a.status} attempt {a.attempt}/{a.max_attempts} bot {a.bot_id}: {a.title}")
        if a.result:
            lines.append(f"  result: {_flat(a.result, WAKE_RESULT_EXCERPT_CHARS)}")
    lines.append(REVIEW_ASK if kind == "review" else RESULT_ASK)
    return "\n".join(lines)
