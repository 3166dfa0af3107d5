"""Team tools' pages (team-tools.md 12): ``/teams``, a team's page ``/teams/{id}`` with its goals, and a goal's page
``/goals/{id}`` whose ``Goal progress`` region polls ``/goals/{id}/progress`` every 2 s while the goal is live.
Like every page they read through the JSON API's route functions (ADR 0018); the goal's actions (``Stop goal``,
``Edit criteria``) are forms of ``/static/app.js`` calling ``/api/goals/{id}/stop`` and ``…/criteria``."""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter, Request
from starlette.responses import Response

from talaria.hub.api.websession import WebUser
from talaria.hub.teams import api as teams_api
from talaria.hub.web.frame import hub_of, page_of, pager, part_of
from talaria.teams.machine import STOPPABLE_GOAL, TERMINAL_GOAL

router = APIRouter(include_in_schema=False)

STATUS_NAMES: Final = {"running": "Running", "review": "Review", "waiting": "Waiting", "blocked": "Blocked",
                       "complete": "Complete", "cancelling": "Cancelling", "cancelled": "Cancelled"}  # fmt: skip
ASSIGNMENT_NAMES: Final = {"pending": "Pending", "running": "Running", "review": "Review", "failed": "Failed",
                           "blocked": "Blocked", "complete": "Complete", "cancelling": "Cancelling",
                           "cancelled": "Cancelled"}  # fmt: skip


async def _teams_view(request: Request, user: WebUser, cursor: str | None) -> dict[str, Any]:
    listed = await teams_api.list_teams(user=user, hub=hub_of(request), owner=None, limit=None, cursor=cursor)
    return {"teams": listed["teams"], **pager("/teams", cursor, listed["nextCursor"])}


@router.get("/teams")
async def teams_page(request: Request, cursor: str | None = None) -> Response:
    return await page_of(request, "teams.html", lambda user: _teams_view(request, user, cursor), title="Teams",
                         section="teams")  # fmt: skip


async def _team_view(request: Request, user: WebUser, team_id: str) -> dict[str, Any]:
    shown = await teams_api.get_team(team_id=team_id, user=user, hub=hub_of(request))
    return {"team": shown["team"], "goals": shown["goals"], "title": shown["team"]["name"],
            "status_names": STATUS_NAMES}  # fmt: skip


@router.get("/teams/{team_id}")
async def team_page(request: Request, team_id: str) -> Response:
    return await page_of(request, "team.html", lambda user: _team_view(request, user, team_id), section="teams")


def progress(shown: dict[str, Any], user: WebUser) -> dict[str, Any]:
    """What the ``Goal progress`` region shows of ``GET /api/goals/{id}``."""
    goal, assignments = shown["goal"], shown["assignments"]
    passed = {c["criterion"]: c for c in goal["checks"]}
    criteria = [{"text": text, "passed": bool(passed.get(n, {}).get("passed")),
                 "evidence": passed[n]["evidence"] if n in passed else None}
                for n, text in enumerate(goal["acceptanceCriteria"])]  # fmt: skip
    mine = goal["owner"] == user.account.username or user.is_admin
    return {
        "goal": goal,
        "team": shown["team"],
        "status_name": STATUS_NAMES[goal["status"]],
        "complete": sum(1 for a in assignments if a["status"] == "complete"),
        "total": len(assignments),
        "criteria": criteria,
        "assignments": [a | {"state": ASSIGNMENT_NAMES[a["status"]]} for a in assignments],
        "live": goal["status"] not in TERMINAL_GOAL,
        "can_stop": mine and goal["status"] in STOPPABLE_GOAL,
        "can_edit": mine and goal["status"] in STOPPABLE_GOAL,
        "title": goal["title"],
    }


async def _goal_view(request: Request, user: WebUser, goal_id: str) -> dict[str, Any]:
    return progress(await teams_api.get_goal(goal_id=goal_id, user=user, hub=hub_of(request)), user)


@router.get("/goals/{goal_id}")
async def goal_page(request: Request, goal_id: str) -> Response:
    return await page_of(request, "goal.html", lambda user: _goal_view(request, user, goal_id), section="teams")


@router.get("/goals/{goal_id}/progress")
async def goal_progress(request: Request, goal_id: str) -> Response:
    return await part_of(request, "parts/goal_progress.html", lambda user: _goal_view(request, user, goal_id))
