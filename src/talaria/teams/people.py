"""What people read and do with teams and goals through the JSON API and the pages (team-tools.md 11, 12).

Users see what they own; admins see their tenant's (an ``owner`` filter narrows it); anything else is
``not_found``, exactly like an unknown id. The goal owner or an admin may stop a goal (G6, cause ``stopped``) and
replace its criteria (``expectedRevision`` as the tool's); each change is one transaction audited by the person
(``acct:<tenant>/<username>`` via ``web``). Views are the tools' (6.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from talaria.accounts.service import Account
from talaria.chat import bots
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.lifecycle.actor import Actor
from talaria.store.interface import Store, Tx
from talaria.teams import reads
from talaria.teams.arguments import check_value
from talaria.teams.machine import STOPPABLE_GOAL, GoalStatus
from talaria.teams.records import Goal, Team
from talaria.teams.steps import cancel_goal, record
from talaria.teams.tools_goals import replace_criteria

STOPPED: Final = "stopped"
TEAM_GOALS_SHOWN: Final = 50


def person(account: Account) -> Actor:
    return Actor(account.principal, frozenset(), "web", account.tenant)


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    more: bool


class TeamsForPeople:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    @staticmethod
    def _owner_filter(account: Account, owner: str | None) -> str | None:
        """Whose objects ``account`` may list: its own, or as an admin the tenant's (``owner`` narrows it)."""
        if account.role == "admin":
            return owner
        return account.username

    @staticmethod
    def _visible(account: Account, owner: str) -> bool:
        return account.role == "admin" or owner == account.username

    def _team(self, tx: Tx, account: Account, team_id: str) -> Team:
        row = tx.one("team_get_tenant", tenant=account.tenant, id=team_id)
        if row is None or not self._visible(account, row["owner"]):
            raise TalariaError("not_found", "no such team")
        return Team.from_row(row, reads.members(tx, team_id))

    def _goal(self, tx: Tx, account: Account, goal_id: str) -> Goal:
        row = tx.one("goal_get_tenant", tenant=account.tenant, id=goal_id)
        if row is None or not self._visible(account, row["owner"]):
            raise TalariaError("not_found", "no such goal")
        return Goal.from_row(row)

    # --- reads -------------------------------------------------------------------------------------------------

    def teams(self, account: Account, *, owner: str | None, after: tuple[int, str] | None, limit: int) -> Page:
        with self.store.read() as tx:
            rows = tx.all(
                "team_page", tenant=account.tenant, owner=self._owner_filter(account, owner), limit=limit + 1,
                cursor_at=after[0] if after else None, cursor_id=after[1] if after else None,
            )  # fmt: skip
            if account.role != "admin" and owner not in (None, account.username):
                rows = []
            teams = [self._team_json(Team.from_row(row, reads.members(tx, row["id"]))) for row in rows]
        return Page(teams[:limit], len(teams) > limit)

    def team(self, account: Account, team_id: str) -> dict[str, Any]:
        with self.store.read() as tx:
            team = self._team(tx, account, team_id)
            goals = [self._goal_json(tx, g) for g in reads.newest_goals(tx, team.id, TEAM_GOALS_SHOWN)]
            return {"team": self._team_json(team), "goals": goals}

    def goals(
        self, account: Account, *, team_id: str | None, status: str | None, after: tuple[int, str] | None, limit: int
    ) -> Page:
        if status is not None and status not in set(GoalStatus):
            raise TalariaError("invalid_request", f"status must be one of {', '.join(GoalStatus)}")
        with self.store.read() as tx:
            rows = tx.all(
                "goal_page", tenant=account.tenant, owner=self._owner_filter(account, None), team_id=team_id,
                status=status, limit=limit + 1, cursor_at=after[0] if after else None,
                cursor_id=after[1] if after else None,
            )  # fmt: skip
            goals = [self._goal_json(tx, Goal.from_row(row)) for row in rows]
        return Page(goals[:limit], len(goals) > limit)

    def goal(self, account: Account, goal_id: str) -> dict[str, Any]:
        with self.store.read() as tx:
            return self._goal_full(tx, self._goal(tx, account, goal_id))

    def _goal_full(self, tx: Tx, goal: Goal) -> dict[str, Any]:
        row = tx.one("team_get_tenant", tenant=goal.tenant, id=goal.team_id)
        assert row is not None
        team = Team.from_row(row, reads.members(tx, goal.team_id))
        assignments = reads.assignments(tx, goal.id)
        shown = []
        for a in assignments:
            member = bots.get(tx, goal.tenant, goal.owner, a.bot_id)
            shown.append({**a.view(), "memberName": member.name if member is not None else None})
        return {"goal": self._goal_json(tx, goal, assignments), "team": self._team_json(team),
                "assignments": shown}  # fmt: skip

    @staticmethod
    def _team_json(team: Team) -> dict[str, Any]:
        return {**team.view(), "owner": team.owner}

    @staticmethod
    def _goal_json(tx: Tx, goal: Goal, assignments: Any = None) -> dict[str, Any]:
        listed = reads.assignments(tx, goal.id) if assignments is None else assignments
        return {**goal.view(listed), "owner": goal.owner}

    def bot_name(self, tenant: str, owner: str, bot_id: str) -> str | None:
        with self.store.read() as tx:
            bot = bots.get(tx, tenant, owner, bot_id)
        return bot.name if bot is not None else None

    def goal_titles(self, account: Account, goal_ids: set[str]) -> dict[str, str]:
        """The titles of the goals ``account`` may see among ``goal_ids`` (chat's ``Open goal:`` links)."""
        out = {}
        with self.store.read() as tx:
            for goal_id in goal_ids:
                row = tx.one("goal_get_tenant", tenant=account.tenant, id=goal_id)
                if row is not None and self._visible(account, row["owner"]):
                    out[goal_id] = str(row["title"])
        return out

    # --- changes -----------------------------------------------------------------------------------------------

    def stop(self, account: Account, goal_id: str, reason: str | None) -> dict[str, Any]:
        """G6 with cause ``stopped``: 409 ``goal_not_active`` unless running, review or waiting."""
        if reason is not None:
            check_value("talaria_cancel_assignment", "reason", reason)
        now = self.clock.now_ms()
        with self.store.write() as tx:
            goal = self._goal(tx, account, goal_id)
            if goal.status not in STOPPABLE_GOAL:
                raise TalariaError("goal_not_active", f"the goal is {goal.status}")
            after = cancel_goal(tx, goal, STOPPED, person(account), now, stopped_by=account.username)
            return self._goal_full(tx, after)

    def update_criteria(
        self, account: Account, goal_id: str, *, expected_revision: int, criteria: Any
    ) -> dict[str, Any]:
        checked = check_value("talaria_update_goal_criteria", "acceptanceCriteria", criteria)
        now = self.clock.now_ms()
        with self.store.write() as tx:
            goal = self._goal(tx, account, goal_id)
            after = replace_criteria(tx, goal, checked, expected_revision, now, turn_id=None)
            record(tx, person(account), after, "team.goal.criteria_updated", now, from_state=goal.status,
                   to_state=after.status, revision_after=after.revision)  # fmt: skip
            return self._goal_full(tx, after)
