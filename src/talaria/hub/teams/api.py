"""Teams and goals for people (team-tools.md 11): ``/api/teams`` and ``/api/goals``. Users see what they own,
admins their tenant's (``owner=`` narrows a team list); another account's team or goal is 404 ``not_found``.
The goal's owner or an admin may replace its criteria and stop it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import WithJsonSchema
from starlette.concurrency import run_in_threadpool

from talaria.hub.api.deps import HubDep, StrictBody, UserDep
from talaria.hub.api.views import CursorQuery, LimitQuery, decode_cursor, encode_cursor, page_limit
from talaria.hub.api.websession import WebRoute
from talaria.hub.openapi import refusals
from talaria.hub.resources import Hub
from talaria.limits import MAX_CRITERIA, MAX_CRITERION_CHARS, MAX_REASON_CHARS
from talaria.teams.people import Page

router = APIRouter(tags=["teams"], route_class=WebRoute)

_CRITERIA = {"type": "array", "minItems": 1, "maxItems": MAX_CRITERIA,
             "items": {"type": "string", "minLength": 1, "maxLength": MAX_CRITERION_CHARS}}  # fmt: skip


class Criteria(StrictBody):
    expectedRevision: Annotated[int, WithJsonSchema({"type": "integer", "minimum": 1})]
    acceptanceCriteria: Annotated[list[str], WithJsonSchema(_CRITERIA)]


_REASON = {"type": "string", "minLength": 1, "maxLength": MAX_REASON_CHARS}


class Stop(StrictBody):
    reason: Annotated[str | None, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_REASON_CHARS})] = (
        None
    )


OwnerQuery = Annotated[str | None, Query(description="an admin's filter: this account's teams only")]
TeamQuery = Annotated[str | None, Query(alias="teamId", description="this team's goals only")]
StatusQuery = Annotated[str | None, Query(description="goals in this status only")]


def _page(page: Page, key: str) -> dict[str, Any]:
    last = page.items[-1] if page.items else None
    cursor = encode_cursor(last["createdAt"], last["id"]) if page.more and last is not None else None
    return {key: page.items, "nextCursor": cursor}


@router.get("/api/teams", openapi_extra=refusals("invalid_request"))
async def list_teams(
    user: UserDep, hub: HubDep, owner: OwnerQuery = None, limit: LimitQuery = None, cursor: CursorQuery = None
) -> dict[str, Any]:
    size, after = page_limit(limit), decode_cursor(cursor, (int, str))
    at = (after[0], after[1]) if after else None
    page = await run_in_threadpool(hub.team_people.teams, user.account, owner=owner, after=at, limit=size)
    return _page(page, "teams")


@router.get("/api/teams/{team_id}", openapi_extra=refusals("not_found"))
async def get_team(team_id: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    return await run_in_threadpool(hub.team_people.team, user.account, team_id)


@router.get("/api/goals", openapi_extra=refusals("invalid_request"))
async def list_goals(
    user: UserDep, hub: HubDep, team_id: TeamQuery = None, status: StatusQuery = None, limit: LimitQuery = None,
    cursor: CursorQuery = None,
) -> dict[str, Any]:  # fmt: skip
    size, after = page_limit(limit), decode_cursor(cursor, (int, str))
    at = (after[0], after[1]) if after else None
    page = await run_in_threadpool(
        lambda: hub.team_people.goals(user.account, team_id=team_id, status=status, after=at, limit=size)
    )
    return _page(page, "goals")


@router.get("/api/goals/{goal_id}", openapi_extra=refusals("not_found"))
async def get_goal(goal_id: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    return await run_in_threadpool(hub.team_people.goal, user.account, goal_id)


@router.patch(
    "/api/goals/{goal_id}/criteria", openapi_extra=refusals("not_found", "goal_criteria_changed", "goal_not_active")
)
async def update_criteria(goal_id: str, body: Criteria, user: UserDep, hub: HubDep) -> dict[str, Any]:
    def update() -> dict[str, Any]:
        return hub.team_people.update_criteria(
            user.account, goal_id, expected_revision=body.expectedRevision, criteria=body.acceptanceCriteria
        )

    shown = await run_in_threadpool(update)
    _after_change(hub, goal_id)
    return {"goal": shown["goal"]}


@router.post("/api/goals/{goal_id}/stop", openapi_extra=refusals("not_found", "goal_not_active"))
async def stop_goal(goal_id: str, body: Stop, user: UserDep, hub: HubDep) -> dict[str, Any]:
    shown = await run_in_threadpool(hub.team_people.stop, user.account, goal_id, body.reason)
    _after_change(hub, goal_id)
    return {"goal": shown["goal"]}


def _after_change(hub: Hub, goal_id: str) -> None:
    if hub.team_reconciler is not None:
        hub.team_reconciler.applied(goal_id)
