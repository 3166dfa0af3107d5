"""Whether a goal's authority holds (team-tools.md 4.6), read inside the caller's transaction.

Authority holds while the owner account is enabled and keeps ``canManageTeam``; the coordinator exists, has
effective team permission at the ``teamRevision`` the goal captured, and administers the goal's non-archived team;
and every member with a ``running`` assignment keeps its (source, profile) in the owner's intersection. A bare
``auth_version`` change does not end it (``goal.authVersion`` is a record). The origin conversation archived or
gone ends a goal too, with its own cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from talaria.accounts.service import Account
from talaria.chat import bots
from talaria.store.interface import Tx
from talaria.teams import permission, reads
from talaria.teams.machine import AssignmentStatus
from talaria.teams.records import Assignment, Goal

AUTHORITY_LOST: Final = "authority_lost"
ORIGIN_GONE: Final = "origin_gone"

Allowed = Callable[[Account, str, str], bool]


def owner_of(tx: Tx, goal: Goal) -> Account | None:
    row = tx.one("account_get", username=goal.owner)
    account = Account.from_row(row) if row is not None else None
    return account if account is not None and account.tenant == goal.tenant else None


def holds(tx: Tx, goal: Goal, assignments: Iterable[Assignment], allowed: Allowed) -> bool:
    owner = owner_of(tx, goal)
    if owner is None or not owner.enabled or not owner.can_manage_team:
        return False
    coordinator = bots.get(tx, goal.tenant, goal.owner, goal.coordinator_id)
    if coordinator is None:
        return False
    team_row = permission.of(tx, coordinator.id)
    if not permission.effective(coordinator, team_row, owner) or team_row.revision != goal.team_revision:
        return False
    team = reads.team(tx, goal.tenant, goal.owner, goal.team_id)
    if team is None or team.archived or team.administrator_id != coordinator.id:
        return False
    for assignment in assignments:
        if assignment.status != AssignmentStatus.RUNNING:
            continue
        member = bots.get(tx, goal.tenant, goal.owner, assignment.bot_id)
        if member is None or not allowed(owner, member.source, member.profile):
            return False
    return True


def origin_present(tx: Tx, goal: Goal) -> bool:
    """The origin conversation exists and is not archived."""
    row = tx.one("chat_conversation_get", tenant=goal.tenant, owner=goal.owner, id=goal.origin_conversation_id)
    return row is not None and not row["archived"]


def lost_because(tx: Tx, goal: Goal, assignments: Iterable[Assignment], allowed: Allowed) -> str | None:
    """Why a goal must be cancelled now (G6), if it must: ``authority_lost`` or ``origin_gone``."""
    if not holds(tx, goal, assignments, allowed):
        return AUTHORITY_LOST
    if not origin_present(tx, goal):
        return ORIGIN_GONE
    return None
