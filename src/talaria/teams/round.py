"""A round (team-tools.md 2, 5): a chat turn that got the team catalog, as the hub captured it at grant creation,
and the per-call checks 3-6 that every tool but ``talaria_whoami`` passes before it reads or writes anything.

Identity comes only from here: the owner, the calling bot, its conversation and turn, the grant and the runner.
No argument can name any of them. A failed check answers 403 ``team_tools_forbidden`` (the caller then closes the
grant, 5 "Revocation"); the check reads inside the call's own transaction, so a change committed before it is seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from talaria.accounts.service import Account
from talaria.chat.bots import Bot
from talaria.errors import TalariaError
from talaria.store.interface import Tx
from talaria.teams import permission
from talaria.teams.evidence import Call

USER: Final = "user"
AUTOMATIC: Final = "automatic"

# Whether ``account`` may use ``profile`` on ``source`` now (the hub-side intersection, runner-protocol.md 8).
Allowed = Callable[[Account, str, str], bool]


@dataclass(frozen=True)
class Round:
    """What the hub captured when it created the round's grant (5, "At round start")."""

    tenant: str
    owner: str
    auth_version: int
    bot_id: str
    bot_revision: int
    conversation_id: str
    turn_id: str
    trigger: str  # the turn's: "user" or "automatic" (a user instruction is a "user" turn, 2)
    grant_id: str
    runner_id: str
    source: str
    profile: str

    def call(self, tool: str) -> Call:
        return Call(tenant=self.tenant, account=self.owner, bot_id=self.bot_id, conversation_id=self.conversation_id,
                    turn_id=self.turn_id, grant_id=self.grant_id, runner_id=self.runner_id, tool=tool)  # fmt: skip

    def whoami(self) -> dict[str, str]:
        """``talaria_whoami``'s answer (6.3): who the round acts for, whatever the arguments said."""
        return {"account": self.owner, "tenant": self.tenant, "source": self.source, "profile": self.profile,
                "workId": self.conversation_id, "grantId": self.grant_id, "botId": self.bot_id,
                "turnId": self.turn_id}  # fmt: skip


@dataclass(frozen=True)
class Checked:
    """What checks 3-6 read: the owner account and the calling bot, as they are in this transaction."""

    owner: Account
    bot: Bot


def _forbidden(why: str) -> TalariaError:
    return TalariaError("team_tools_forbidden", f"team tools are no longer available to this turn: {why}")


def check(tx: Tx, round: Round, allowed: Allowed) -> Checked:
    """Checks 3-6 of team-tools.md 5, in order; the first failure is 403 ``team_tools_forbidden``."""
    row = tx.one("account_get", username=round.owner)
    owner = Account.from_row(row) if row is not None else None
    if owner is None or owner.tenant != round.tenant or not owner.enabled or owner.auth_version != round.auth_version:
        raise _forbidden("the account changed")  # 3
    bot_row = tx.one("bot_get", tenant=round.tenant, owner=round.owner, id=round.bot_id)
    bot = Bot.from_row(bot_row) if bot_row is not None else None
    if bot is None or bot.revision != round.bot_revision:
        raise _forbidden("the bot changed")  # 4
    if not permission.effective(bot, permission.of(tx, bot.id), owner):
        raise _forbidden("the bot has no team permission")  # 4
    if not allowed(owner, bot.source, bot.profile):
        raise _forbidden("the bot's profile is no longer allowed")  # 5
    conversation = tx.one("chat_conversation_get", tenant=round.tenant, owner=round.owner, id=round.conversation_id)
    if conversation is None or conversation["archived"] or conversation["bot_id"] != bot.id:
        raise _forbidden("the conversation is archived or gone")  # 6
    return Checked(owner, bot)
