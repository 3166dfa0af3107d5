"""Team records' views (team-tools.md 6.1, 6.3): ids and states first, goal counts without zeros, and no needless
"failed" or "error" in what Hermes 0.19.0 reads first."""

from __future__ import annotations

import json
from typing import Any

from talaria.canonical import canonical_json
from talaria.teams.records import Assignment, Goal, Team

NOW = 1_800_000_000_000


def goal_row(**changes: Any) -> dict[str, Any]:
    return {"id": "gol_1", "tenant": "default", "owner": "alice", "team_id": "tm_1", "coordinator_id": "bot_lead",
            "title": "Report", "objective": "Write the report", "status": "running", "cause": None,
            "acceptance_criteria": json.dumps(["The delivery meets the original request, with evidence."]),
            "acceptance_revision": 1, "checks": "[]", "result": None, "activation": 1, "revision": 3,
            "automatic_wakes": 0, "origin_conversation_id": "cnv_1", "origin_turn_id": "trn_1", "team_revision": 1,
            "auth_version": 4, "last_turn_id": "trn_1", "finish_turn_id": None, "wake_turn_id": None,
            "last_signature": None, "stopped_by": None, "created_at": NOW, "updated_at": NOW,
            "finished_at": None} | changes  # fmt: skip


def assignment_row(**changes: Any) -> dict[str, Any]:
    return {"id": "asg_1", "goal_id": "gol_1", "bot_id": "bot_w", "title": "Draft", "brief": "mw-1",
            "status": "pending", "acceptance_criteria": "[]", "depends_on": "[]", "attempt": 0, "max_attempts": 3,
            "result": None, "review": None, "task_id": None, "job_id": None, "revision": 1, "created_at": NOW,
            "updated_at": NOW} | changes  # fmt: skip


def test_goal_counts_leave_out_zero_statuses_and_ids_and_states_come_first() -> None:
    goal = Goal.from_row(goal_row())
    assignments = [Assignment.from_row(assignment_row(id=f"asg_{i}", status=s))
                   for i, s in enumerate(["review", "pending", "review"])]  # fmt: skip
    view = goal.view(assignments)
    assert view["counts"] == {"pending": 1, "review": 2}
    keys = list(view)
    assert keys[:4] == ["id", "teamId", "coordinatorId", "status"] and keys.index("title") > keys.index("revision")
    assert view["origin"] == {"conversationId": "cnv_1", "turnId": "trn_1"}
    text = canonical_json({"goal": view}).decode()
    assert "failed" not in text[:500] and "error" not in text[:500]
    assert goal.view([])["counts"] == {}


def test_assignment_and_team_views_put_ids_and_states_before_texts() -> None:
    assignment = Assignment.from_row(assignment_row(depends_on='["asg_0"]', acceptance_criteria='["has a title"]'))
    view = assignment.view()
    assert list(view)[:6] == ["id", "goalId", "botId", "taskId", "jobId", "status"]
    assert (view["dependsOn"], view["acceptanceCriteria"]) == (["asg_0"], ["has a title"])
    team = Team.from_row({"id": "tm_1", "tenant": "default", "owner": "alice", "name": "Crew",
                          "administrator_id": "bot_lead", "instructions": "", "archived": 0, "revision": 1,
                          "created_in_turn_id": "trn_1", "created_at": NOW, "updated_at": NOW},
                         ["bot_lead", "bot_w"])  # fmt: skip
    assert team.view() == {"id": "tm_1", "administratorId": "bot_lead", "memberIds": ["bot_lead", "bot_w"],
                           "archived": False, "revision": 1, "name": "Crew", "instructions": "", "createdAt": NOW,
                           "updatedAt": NOW}  # fmt: skip
    assert list(team.view())[:3] == ["id", "administratorId", "memberIds"]
