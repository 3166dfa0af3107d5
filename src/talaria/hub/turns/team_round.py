"""A chat turn's team catalog (team-tools.md 5; chat.md 5.9): which turns get it, and the round its grant serves.

A turn is entitled while its bot has effective team permission (the bot's ``teamPermission``, its owner's
``canManageTeam``, the bot not archived). When the grant exists, the round is captured: the turn, conversation,
bot and its ``revision``, the owner and the turn's ``auth_version``, the grant and the runner. Every call then runs
in ``talaria.teams.calls`` on a worker thread; its answer goes back as the ledger's exact text.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from talaria.chat.bots import Bot
from talaria.chat.records import ChatTurn
from talaria.errors import TalariaError
from talaria.hub.runners.connection_state import EncodedResult, ToolExecutor
from talaria.store.interface import Row, Store
from talaria.teams import catalog, permission
from talaria.teams import round as rounds
from talaria.teams.calls import TeamToolCalls
from talaria.teams.round import Round


def entitled(store: Store, turn: ChatTurn, owner_can_manage: bool, bot_id: str) -> bool:
    """Whether ``turn``'s bot has effective team permission now."""
    if not owner_can_manage:
        return False
    with store.read() as tx:
        row = tx.one("bot_get", tenant=turn.tenant, owner=turn.owner, id=bot_id)
        if row is None:
            return False
        bot = Bot.from_row(row)
        return not bot.archived and permission.of(tx, bot.id).permission


ROUND_KIND = "round"


def round_executor(calls: TeamToolCalls, round: Round) -> Callable[[str, dict[str, Any]], Awaitable[EncodedResult]]:
    """The calls of ``round``'s grant, on a worker thread, answered as the ledger's exact text."""

    async def execute(tool_id: str, arguments: dict[str, Any]) -> EncodedResult:
        return EncodedResult(await asyncio.to_thread(calls.call, round, tool_id, arguments))

    return execute


def from_descriptor(calls: TeamToolCalls, grant_id: str, tools: dict[str, Any]) -> ToolExecutor:
    """The executor of a round's grant made from its ``tools`` on a replica other than its owner."""
    return round_executor(calls, Round(**tools["round"]))


class RoundTools:
    """The ``ToolSet`` of one chat turn's grant."""

    def __init__(self, calls: TeamToolCalls, turn: ChatTurn, conversation: Row, runner_id: str) -> None:
        self.calls = calls
        self.turn = turn
        self.conversation = conversation
        self.runner_id = runner_id
        self.round: Round | None = None

    @property
    def catalog(self) -> list[dict[str, Any]]:
        return catalog.catalog()

    async def opened(self, grant_id: str) -> None:
        self.round = await asyncio.to_thread(self._capture, grant_id)

    def _capture(self, grant_id: str) -> Round:
        turn, conversation = self.turn, self.conversation
        with self.calls.store.read() as tx:
            row = tx.one("bot_get", tenant=turn.tenant, owner=turn.owner, id=conversation["bot_id"])
        revision = int(row["revision"]) if row is not None else -1  # a bot gone: every call is refused
        return Round(
            tenant=turn.tenant, owner=turn.owner, auth_version=turn.auth_version, bot_id=conversation["bot_id"],
            bot_revision=revision, conversation_id=conversation["id"], turn_id=turn.id, trigger=turn.trigger,
            grant_id=grant_id, runner_id=self.runner_id, source=conversation["bot_source"],
            profile=conversation["bot_profile"],
        )  # fmt: skip

    async def call(self, tool_id: str, arguments: dict[str, Any]) -> EncodedResult:
        assert self.round is not None
        return await round_executor(self.calls, self.round)(tool_id, arguments)

    def descriptor(self) -> dict[str, Any]:
        """The grant's ``tools``: the captured round, from which any replica runs its calls (scale.md 4.3)."""
        assert self.round is not None
        return {"kind": ROUND_KIND, "round": dataclasses.asdict(self.round)}

    async def valid(self) -> bool:
        assert self.round is not None
        return await asyncio.to_thread(self._valid, self.round)

    def _valid(self, round: Round) -> bool:
        try:
            with self.calls.store.read() as tx:
                rounds.check(tx, round, self.calls.access.allowed)
        except TalariaError as exc:
            if exc.code != "team_tools_forbidden":
                raise
            return False
        return True
