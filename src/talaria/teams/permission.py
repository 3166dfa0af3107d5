"""A bot's team permission (team-tools.md 2, 3.1, 11): the ``bot_team`` row beside chat's ``bot``.

``teamPermission`` is false without a row and for every bot a tool made; only the owner sets it, and turning it on
needs the owner account's ``canManageTeam`` (403 ``team_permission_forbidden``; turning it off never does, ADR
0037). A change is one of the bot's changes: the bot's ``revision`` +1 (not at creation), ``teamRevision`` +1, and
a grant records who and when, with the audit event ``team.bot.permission_changed`` in the same transaction. The
permission is *effective* while it is on, the owner has ``canManageTeam`` and the bot is not archived.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final

from talaria.accounts.service import Account
from talaria.chat.bots import ARCHIVED, OPEN, Bot, owner_actor
from talaria.errors import TalariaError
from talaria.lifecycle import audit
from talaria.store.interface import Row, Store, Tx

PERMISSION_CHANGED: Final = "team.bot.permission_changed"
GRANTED: Final = "granted"
REVOKED: Final = "revoked"
TEAM_IDS: Final = ("account", "botId", "conversationId", "turnId", "grantId", "runnerId", "tool", "teamId", "goalId",
                   "assignmentId", "targetBotId")  # fmt: skip


def team_body(**ids: str | None) -> dict[str, str | None]:
    """The ``team`` object of a team audit event (team-tools.md 10): every id key, null where it does not apply."""
    unknown = set(ids) - set(TEAM_IDS)
    if unknown:
        raise ValueError(f"not a team audit id: {sorted(unknown)}")
    return {key: ids.get(key) for key in TEAM_IDS}


@dataclass(frozen=True)
class BotTeam:
    """A bot's ``bot_team`` row; the defaults are a bot without one."""

    permission: bool = False
    revision: int = 0
    granted_by: str | None = None
    granted_at: int | None = None
    created_by_bot_id: str | None = None
    created_in_turn_id: str | None = None

    @classmethod
    def from_row(cls, row: Row | None) -> BotTeam:
        if row is None:
            return cls()
        return cls(
            permission=bool(row["team_permission"]),
            revision=int(row["team_revision"]),
            granted_by=row["team_granted_by"],
            granted_at=int(row["team_granted_at"]) if row["team_granted_at"] is not None else None,
            created_by_bot_id=row["created_by_bot_id"],
            created_in_turn_id=row["created_in_turn_id"],
        )


def of(tx: Tx, bot_id: str) -> BotTeam:
    return BotTeam.from_row(tx.one("bot_team_get", bot_id=bot_id))


def effective(bot: Bot, team: BotTeam, owner: Account) -> bool:
    """team-tools.md 2: on, the owner account may manage teams, and the bot is not archived."""
    return team.permission and owner.can_manage_team and owner.enabled and not bot.archived


def set_permission(tx: Tx, account: Account, bot: Bot, value: bool, now_ms: int, *, creating: bool = False) -> Bot:
    """In the caller's write transaction: set ``bot``'s permission to ``value`` for its owner ``account``; the bot
    as it is after (its revision +1 on a change, unless ``creating``). Unchanged: nothing written, no event."""
    if value and not account.can_manage_team:
        raise TalariaError("team_permission_forbidden", "your account may not manage team bots")
    current = of(tx, bot.id)
    if current.permission == value:
        return bot
    tx.run(
        "bot_team_set_permission", bot_id=bot.id, tenant=bot.tenant, owner=bot.owner, permission=int(value),
        granted_by=account.username if value else None, granted_at=now_ms if value else None, now=now_ms,
    )  # fmt: skip
    revision = bot.revision
    if not creating:
        if tx.run("bot_bump_revision", id=bot.id, expected_revision=bot.revision, now=now_ms) != 1:
            raise TalariaError("store_unavailable", "the bot changed meanwhile; try again")
        revision += 1
    state = ARCHIVED if bot.archived else OPEN
    audit.append(
        tx, now_ms=now_ms, type=PERMISSION_CHANGED, tenant=bot.tenant, actor=owner_actor(account),
        subject=audit.Subject(bot=bot.id), from_state=state, to_state=state, revision_after=revision,
        reason_code=GRANTED if value else REVOKED, team=team_body(account=account.username, botId=bot.id),
    )  # fmt: skip
    return replace(bot, revision=revision, updated_at=bot.updated_at if creating else now_ms)


def require_not_in_team(tx: Tx, bot: Bot) -> None:
    """Archiving a member of a non-archived team: 409 ``bot_in_use`` (team-tools.md 11)."""
    if tx.one("bot_team_live_team_of", bot_id=bot.id) is not None:
        raise TalariaError("bot_in_use", "the bot is a member of a team; change the team first")


class TeamBots:
    """Reads of bots' ``bot_team`` rows for views (the JSON API's Bot, the bots page)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def of(self, bot_ids: Iterable[str]) -> dict[str, BotTeam]:
        with self.store.read() as tx:
            return {bot_id: of(tx, bot_id) for bot_id in bot_ids}
