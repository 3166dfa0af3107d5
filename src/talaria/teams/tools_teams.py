"""The team tools of team-tools.md 6.3: list, create and update the teams the caller administers (3.2).

A team is its administrator (the bot that made it, first) and 1-7 other bots of the owner, each usable when named:
it exists (404 ``not_found``), is not archived and its (source, profile) is in the owner's intersection (409
``bot_unavailable``). Creating a team starts nothing; archiving one is one-way.
"""

from __future__ import annotations

from typing import Any, Final

from talaria.chat.bots import name_key
from talaria.errors import TalariaError
from talaria.ids import mint
from talaria.limits import MAX_LIVE_TEAMS_PER_ADMINISTRATOR, MAX_TEAM_MEMBERS, MIN_TEAM_MEMBERS
from talaria.store.interface import Tx
from talaria.teams import reads
from talaria.teams.calls import Applied, Context
from talaria.teams.evidence import Event
from talaria.teams.records import Team
from talaria.teams.tools_bots import owned

GOALS_LISTED: Final = 20
OPEN: Final = "open"
ARCHIVED: Final = "archived"


def administered(context: Context, team_id: str) -> Team:
    """The owner's non-archived team ``team_id`` (else 404 ``not_found``), administered by the caller (else 403
    ``team_forbidden``)."""
    team = reads.team(context.tx, context.round.tenant, context.round.owner, team_id)
    if team is None or team.archived:
        raise TalariaError("not_found", "no such team")
    if team.administrator_id != context.caller.id:
        raise TalariaError("team_forbidden", "only the team's administrator may do this")
    return team


def _members(context: Context, member_ids: list[str]) -> list[str]:
    """The caller then ``member_ids`` without repeats, 2-8 of them, each usable."""
    members = list(dict.fromkeys([context.caller.id, *member_ids]))
    if not MIN_TEAM_MEMBERS <= len(members) <= MAX_TEAM_MEMBERS:
        raise TalariaError(
            "invalid_members",
            f"a team has {MIN_TEAM_MEMBERS}-{MAX_TEAM_MEMBERS} members, its administrator included",
        )
    found = [owned(context, bot_id) for bot_id in members[1:]]
    for bot in found:
        if not context.usable(bot):
            raise TalariaError("bot_unavailable", f"bot {bot.id} is archived or its profile is not allowed now")
    return members


def _name_free(tx: Tx, administrator_id: str, name: str, team_id: str) -> None:
    taken = tx.one("team_name_taken", administrator_id=administrator_id, name_key=name_key(name), id=team_id)
    if taken is not None:
        raise TalariaError("duplicate_team_name", "you already administer a team of this name")


def _write_members(tx: Tx, team_id: str, members: list[str]) -> None:
    tx.run("team_member_clear", team_id=team_id)
    for position, bot_id in enumerate(members):
        tx.run("team_member_insert", team_id=team_id, bot_id=bot_id, position=position)


def list_teams(context: Context, args: dict[str, Any]) -> dict[str, Any]:
    round = context.round
    teams = reads.administered(context.tx, round.tenant, round.owner, context.caller.id)
    out = []
    for team in teams:
        goals = reads.newest_goals(context.tx, team.id, GOALS_LISTED)
        shown = [{"id": g.id, "status": g.status, "title": g.title, "updatedAt": g.updated_at} for g in goals]
        out.append({**team.view(), "goals": shown})
    return {"teams": out}


def create_team(context: Context, args: dict[str, Any]) -> Applied:
    tx, round = context.tx, context.round
    members = _members(context, args["memberIds"])
    name = args["name"]
    team_id = mint("tm", context.now_ms)
    _name_free(tx, context.caller.id, name, team_id)
    if reads.count(tx, "team_live_count", administrator_id=context.caller.id) >= MAX_LIVE_TEAMS_PER_ADMINISTRATOR:
        raise TalariaError("team_limit", f"a bot administers at most {MAX_LIVE_TEAMS_PER_ADMINISTRATOR} teams")
    tx.run(
        "team_insert", id=team_id, tenant=round.tenant, owner=round.owner, name=name, name_key=name_key(name),
        administrator_id=context.caller.id, instructions=args.get("instructions", ""),
        created_in_turn_id=round.turn_id, now=context.now_ms,
    )  # fmt: skip
    _write_members(tx, team_id, members)
    team = reads.team(tx, round.tenant, round.owner, team_id)
    assert team is not None
    event = Event("team.team.created", to_state=OPEN, revision_after=team.revision, team_id=team.id)
    return Applied({"team": team.view()}, event)


def update_team(context: Context, args: dict[str, Any]) -> Applied:
    tx, round = context.tx, context.round
    team = administered(context, args["teamId"])
    members = list(team.member_ids)
    if "memberIds" in args:
        members = _members(context, args["memberIds"])
        for removed in set(team.member_ids) - set(members):
            if tx.one("assignment_open_of_bot", bot_id=removed, team_id=team.id) is not None:
                raise TalariaError("team_busy", f"bot {removed} has an open assignment in a goal of this team")
    name = args.get("name", team.name)
    if name_key(name) != name_key(team.name):
        _name_free(tx, team.administrator_id, name, team.id)
    archived = bool(args.get("archived", False))
    if archived and reads.count(tx, "goal_open_count", team_id=team.id) > 0:
        raise TalariaError("team_busy", "the team has a goal that has not ended; finish or stop it first")
    written = tx.run(
        "team_update", id=team.id, expected_revision=team.revision, name=name, name_key=name_key(name),
        instructions=args.get("instructions", team.instructions), archived=int(archived), now=context.now_ms,
    )  # fmt: skip
    if written != 1:
        raise TalariaError("store_unavailable", "the team changed meanwhile; try again")
    if members != list(team.member_ids):
        _write_members(tx, team.id, members)
    after = reads.team(tx, round.tenant, round.owner, team.id)
    assert after is not None
    event = Event("team.team.updated", from_state=OPEN, to_state=ARCHIVED if archived else OPEN,
                  revision_after=after.revision, team_id=team.id)  # fmt: skip
    return Applied({"team": after.view()}, event)
