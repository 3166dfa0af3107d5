"""The team catalog a round's grant offers (team-tools.md 5, 6.1, 6.3), in 6.3's order, and each tool's handler.

Each entry is ``{id, name, description, inputSchema}`` with ``id`` = ``name``; the plugin shows the model
``<name>: <description>``, and no description says ``talaria_``, so a scripted model can pick a tool by its
``<name>:``. The descriptions carry the rules a model most needs: forming a team is not starting a goal, goals start
only on an explicit delivery request, a retry reuses its ``requestId``, and a goal is finished with the current
``acceptanceRevision`` and evidence for each criterion.
"""

from __future__ import annotations

from typing import Any, Final

from talaria.teams import tools_assignments, tools_bots, tools_goals, tools_teams
from talaria.teams.arguments import TOOLS, WHOAMI
from talaria.teams.calls import Handlers

_RETRY: Final = "Give a new requestId for each new change; on a retry of the same change, reuse its requestId."

DESCRIPTIONS: Final = {
    WHOAMI: "Tells who this conversation acts for: account, tenant, source, profile, work, grant, bot and turn. "
    "Takes no arguments.",
    "talaria_list_bots": "Lists your owner's bots you may put in a team, and the (source, profile) pairs a new bot "
    "may use.",
    "talaria_create_bot": "Creates a bot of your owner (a name, instructions, and a source and profile, by default "
    f"yours); it gets no team permission. {_RETRY}",
    "talaria_update_bot": f"Renames or re-instructs a bot you created. {_RETRY}",
    "talaria_archive_bot": "Archives a bot you created that is in no team and has no work; confirmName repeats its "
    f"name. {_RETRY}",
    "talaria_list_teams": "Lists the teams you administer, each with its newest goals.",
    "talaria_create_team": "Forms a team of you and other bots (memberIds). Forming a team starts no work: start a "
    f"goal only when the user asks for a delivery. {_RETRY}",
    "talaria_update_team": f"Renames, re-instructs, re-members or archives a team you administer. {_RETRY}",
    "talaria_start_goal": "Starts a goal of a team you administer, with acceptance criteria. Only when the user "
    f"explicitly asks for a delivery; never on your own. {_RETRY}",
    "talaria_get_goal": "Shows a goal you coordinate, its team and its assignments.",
    "talaria_update_goal_criteria": "Replaces a goal's acceptance criteria; expectedRevision is its current "
    f"acceptanceRevision. {_RETRY}",
    "talaria_assign": "Assigns work of a goal to a member of its team (not yourself); it runs as a job on the "
    f"member's computer. dependsOn names earlier assignments it waits for. {_RETRY}",
    "talaria_review_assignment": f"Accepts, retries or blocks an assignment's result, with a note. {_RETRY}",
    "talaria_cancel_assignment": f"Cancels an assignment that has not ended, with a reason. {_RETRY}",
    "talaria_finish_goal": "Finishes a goal: complete (give the current acceptanceRevision and one passed check "
    "with evidence per criterion), blocked, or waiting for more information from the user. "
    f"{_RETRY}",
    "talaria_resume_goal": f"Resumes a blocked, waiting or stopped goal, when the user asks for it. {_RETRY}",
}

HANDLERS: Final = Handlers(
    reads={
        "talaria_list_bots": tools_bots.list_bots,
        "talaria_list_teams": tools_teams.list_teams,
        "talaria_get_goal": tools_goals.get_goal,
    },
    writes={
        "talaria_create_bot": tools_bots.create_bot,
        "talaria_update_bot": tools_bots.update_bot,
        "talaria_archive_bot": tools_bots.archive_bot,
        "talaria_create_team": tools_teams.create_team,
        "talaria_update_team": tools_teams.update_team,
        "talaria_start_goal": tools_goals.start_goal,
        "talaria_update_goal_criteria": tools_goals.update_goal_criteria,
        "talaria_assign": tools_assignments.assign,
        "talaria_review_assignment": tools_assignments.review_assignment,
        "talaria_cancel_assignment": tools_assignments.cancel_assignment,
        "talaria_finish_goal": tools_goals.finish_goal,
        "talaria_resume_goal": tools_goals.resume_goal,
    },
)


def catalog() -> list[dict[str, Any]]:
    """The round's catalog, in 6.3's order."""
    return [
        {"id": name, "name": name, "description": DESCRIPTIONS[name], "inputSchema": tool.input_schema()}
        for name, tool in TOOLS.items()
    ]
