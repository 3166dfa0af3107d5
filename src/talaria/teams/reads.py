"""Reads of team tables inside a transaction, always keyed by (tenant, owner): another owner's team, goal or
assignment is not found, exactly like an unknown id (team-tools.md 6.1 Visibility)."""

from __future__ import annotations

from talaria.store.interface import Tx
from talaria.teams.records import Assignment, Goal, Team


def members(tx: Tx, team_id: str) -> tuple[str, ...]:
    """A team's member bot ids, the administrator first."""
    return tuple(str(row["bot_id"]) for row in tx.all("team_member_of", team_id=team_id))


def team(tx: Tx, tenant: str, owner: str, team_id: str) -> Team | None:
    row = tx.one("team_get", tenant=tenant, owner=owner, id=team_id)
    return Team.from_row(row, members(tx, team_id)) if row is not None else None


def administered(tx: Tx, tenant: str, owner: str, bot_id: str) -> list[Team]:
    """The non-archived teams ``bot_id`` administers, oldest first."""
    rows = tx.all("team_administered", tenant=tenant, owner=owner, administrator_id=bot_id)
    return [Team.from_row(row, members(tx, row["id"])) for row in rows]


def goal(tx: Tx, tenant: str, owner: str, goal_id: str) -> Goal | None:
    row = tx.one("goal_get", tenant=tenant, owner=owner, id=goal_id)
    return Goal.from_row(row) if row is not None else None


def goal_by_id(tx: Tx, goal_id: str) -> Goal | None:
    """Any goal by id, whoever owns it: for the reconciler, never for a caller's request."""
    row = tx.one("goal_by_id", id=goal_id)
    return Goal.from_row(row) if row is not None else None


def newest_goals(tx: Tx, team_id: str, limit: int) -> list[Goal]:
    return [Goal.from_row(row) for row in tx.all("goal_newest_of_team", team_id=team_id, limit=limit)]


def assignments(tx: Tx, goal_id: str) -> list[Assignment]:
    """A goal's assignments, oldest first."""
    return [Assignment.from_row(row) for row in tx.all("assignment_of_goal", goal_id=goal_id)]


def assignment(tx: Tx, tenant: str, owner: str, assignment_id: str) -> Assignment | None:
    row = tx.one("assignment_get", tenant=tenant, owner=owner, id=assignment_id)
    return Assignment.from_row(row) if row is not None else None


def count(tx: Tx, query: str, **params: object) -> int:
    """The ``n`` of a ``COUNT(*) AS n`` query."""
    row = tx.one(query, **params)
    return int(row["n"]) if row is not None else 0
