"""The bot tools (team-tools.md 6.3): list, create, update and archive the owner's bots, under chat's rules.

A tool-made bot is a chat bot like any other (chat.md 3), with no team permission and its provenance beside it
(``createdByBotId``, ``createdInTurnId``); nothing in Hermes is created or contacted. Only the bot that made a bot
may change or archive it (403 ``bot_creator_required``), and never itself.
"""

from __future__ import annotations

from typing import Any

from talaria.chat import bots
from talaria.chat.bots import ARCHIVED, OPEN, Bot
from talaria.errors import TalariaError
from talaria.lifecycle import audit
from talaria.limits import LIST_BOT_INSTRUCTIONS_CHARS
from talaria.teams import permission
from talaria.teams.calls import Applied, Context
from talaria.teams.evidence import Event


def view(context: Context, bot: Bot, *, cut: int | None = None) -> dict[str, Any]:
    """The bot view of 6.3, ids and states first."""
    team = permission.of(context.tx, bot.id)
    instructions = bot.instructions if cut is None else bot.instructions[:cut]
    return {
        "id": bot.id, "createdByBotId": team.created_by_bot_id, "archived": bot.archived,
        "teamPermission": team.permission, "revision": bot.revision, "name": bot.name, "source": bot.source,
        "profile": bot.profile, "instructions": instructions,
    }  # fmt: skip


def owned(context: Context, bot_id: str) -> Bot:
    """The owner's bot ``bot_id``; 404 ``not_found`` for an unknown id or another owner's."""
    bot = bots.get(context.tx, context.round.tenant, context.round.owner, bot_id)
    if bot is None:
        raise TalariaError("not_found", "no such bot")
    return bot


def _made_by_caller(context: Context, bot: Bot) -> None:
    if bot.id == context.caller.id or permission.of(context.tx, bot.id).created_by_bot_id != context.caller.id:
        raise TalariaError("bot_creator_required", "only the bot that made this bot may change it")


def _event(kind: str, bot: Bot, before: str | None, after: str) -> Event:
    return Event(kind, from_state=before, to_state=after, revision_after=bot.revision, target_bot_id=bot.id,
                 subject=audit.Subject(bot=bot.id))  # fmt: skip


def list_bots(context: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The owner's non-archived bots still in the intersection, by name; the intersection itself."""
    rows = context.tx.all("bot_live_by_name", tenant=context.round.tenant, owner=context.round.owner)
    usable = [bot for bot in map(Bot.from_row, rows) if context.usable(bot)]
    pairs = context.access.pairs(context.owner)
    return {
        "bots": [view(context, bot, cut=LIST_BOT_INSTRUCTIONS_CHARS) for bot in usable],
        "profiles": [{"source": source, "profile": profile} for source, profile in pairs],
    }


def create_bot(context: Context, args: dict[str, Any]) -> Applied:
    name = bots.check_name(args["name"])
    source = args.get("source", context.caller.source)
    profile = args.get("profile", context.caller.profile)
    instructions = bots.check_instructions(args.get("instructions", ""))
    bots.require_allowed(context.access.allowed, context.owner, source, profile)
    round = context.round
    bot = bots.insert(context.tx, tenant=round.tenant, owner=round.owner, name=name, source=source, profile=profile,
                      instructions=instructions, now_ms=context.now_ms)  # fmt: skip
    context.tx.run(
        "bot_team_made_by_tool", bot_id=bot.id, tenant=round.tenant, owner=round.owner,
        created_by_bot_id=context.caller.id, created_in_turn_id=round.turn_id, now=context.now_ms,
    )  # fmt: skip
    return Applied({"bot": view(context, bot)}, _event("chat.bot.created", bot, None, OPEN))


def update_bot(context: Context, args: dict[str, Any]) -> Applied:
    bot = owned(context, args["botId"])
    _made_by_caller(context, bot)
    if bot.archived:
        raise TalariaError("bot_unavailable", "the bot is archived")
    name = bots.check_name(args["name"]) if "name" in args else bot.name
    instructions = bots.check_instructions(args["instructions"]) if "instructions" in args else bot.instructions
    after = bots.rewrite(context.tx, bot, name=name, instructions=instructions, archived=False, now_ms=context.now_ms)
    return Applied({"bot": view(context, after)}, _event("chat.bot.updated", after, OPEN, OPEN))


def archive_bot(context: Context, args: dict[str, Any]) -> Applied:
    bot = owned(context, args["botId"])
    _made_by_caller(context, bot)
    if args["confirmName"] != bot.name:
        raise TalariaError("bot_name_mismatch", "confirmName is not the bot's name")
    if bot.archived:
        raise TalariaError("bot_unavailable", "the bot is archived already")
    tx = context.tx
    permission.require_not_in_team(tx, bot)
    if tx.all("chat_turn_unended_bot", bot_id=bot.id):
        raise TalariaError("bot_in_use", "the bot has a chat turn that has not ended")
    if tx.one("assignment_open_of_bot", bot_id=bot.id, team_id=None) is not None:
        raise TalariaError("bot_in_use", "the bot has an open assignment")
    after = bots.rewrite(tx, bot, name=bot.name, instructions=bot.instructions, archived=True, now_ms=context.now_ms)
    return Applied({"bot": view(context, after)}, _event("chat.bot.archived", after, OPEN, ARCHIVED))
