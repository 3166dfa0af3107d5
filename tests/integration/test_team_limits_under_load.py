"""Team tools' limits (team-tools.md 8) at their edges under concurrent load (issue 17 part 5): two owners' lead bots,
each with two round grants on a runner of its own, call the team tools many at a time, through one SQLite hub or
alternately through two PostgreSQL replicas of one database (a call reaching the replica that does not own its grant
runs there, from the grant's description; scale.md 4.3). Every mutating call of one owner takes the owner's row
first, so the limits count one call after another across replicas:

- teams per administrator: 20, then 409 ``team_limit``; a ``requestId`` sent twice at once answers the same;
- open goals per team: 4, then 409 ``goal_limit``;
- assignments per goal: 32, then 409 ``assignment_limit``;
- goal turns (``running`` assignments): at most 4 per goal and 10 per account; the rest stay ``pending``.

The lead and member bots are on a source whose runner is registered but never connected: the user turn in the
lead's conversation that the round belongs to stays live (so its goals stay ``running`` and no wake starts), and a
dispatched assignment stays ``running``, for the whole test. Each round's two grants are opened on a connected runner
of its own (a raw instance), and give it twice a round's 128 calls. The limits one call at a time are
test_team_tool_calls.py's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria import limits
from talaria.hub.runners.connection_state import Grant
from talaria.teams.round import USER, Round
from tests.backends import BACKENDS, raw_sql
from tests.conftest import add_account, login
from tests.integration.front_back_support import front_and_back
from tests.integration.grant_support import call, round_grant
from tests.integration.machine_load_support import Fleet, Node, at_once, codes, fleet_of
from tests.integration.runner_support import admin_of, register, wait_until

pytestmark = pytest.mark.usefixtures("fast_argon2")

OWNERS = ("uma", "ulf")
WRITERS = limits.MAX_TEAM_MEMBERS - 1  # every member but the administrator
FAR = "far"  # the members' source: registered, never connected


@dataclass
class Lead:
    """An owner's lead bot with team permission, its writers, and two grants of its round."""

    owner: str
    node: Node
    writers: list[str]
    grants: list[Grant]


@dataclass
class Site:
    fleet: Fleet
    leads: dict[str, Lead]

    def tool(self, who: str, i: int, tool: str, **arguments: Any) -> Callable[[], httpx.Response]:
        """Call ``i`` of ``who``'s lead: through grant ``i % 2`` and hub ``i // 2 % 2``, with a callId of its own."""
        lead = self.leads[who]
        body = call(lead.grants[i % 2], f"{tool}-{i}", tool, **arguments)
        return lambda: self.fleet.post(i // 2, lead.node.machines[0], "tool", body)

    def rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return raw_sql(self.fleet.hubs.back.settings, sql, *args)


def result(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()["result"]
    return found


def lead_of(fleet: Fleet, owner: str, node: Node) -> Lead:
    """``owner``'s lead bot (team permission) and its writers on ``FAR``, a conversation with the lead and a user turn
    in it (live: ``FAR`` is never connected), and two grants of that turn's round on ``node``, opened by the front hub
    and answered through the back one."""
    hubs = fleet.hubs
    client = login(hubs.front, owner)
    try:
        made = client.post("/api/bots", json={"name": "Lead", "source": FAR, "profile": "default"})
        assert made.status_code == 201, made.text
        lead = made.json()["bot"]["id"]
        assert client.patch(f"/api/bots/{lead}", json={"teamPermission": True}).status_code == 200
        writers = []
        for n in range(WRITERS):
            answer = client.post("/api/bots", json={"name": f"Writer {n}", "source": FAR, "profile": "default"})
            assert answer.status_code == 201, answer.text
            writers.append(answer.json()["bot"]["id"])
        conversation = client.post("/api/conversations", json={"botId": lead})
        assert conversation.status_code == 201, conversation.text
        conversation_id = conversation.json()["conversation"]["id"]
        turn = client.post(f"/api/conversations/{conversation_id}/turns", json={"text": "make the crews"})
        assert turn.status_code == 202, turn.text
        revision = client.get(f"/api/bots/{lead}").json()["bot"]["revision"]
    finally:
        client.close()
    account = hubs.front.hub.accounts.get(owner)
    assert account is not None
    round = Round(tenant=account.tenant, owner=owner, auth_version=account.auth_version, bot_id=lead,
                  bot_revision=revision, conversation_id=conversation_id, turn_id=turn.json()["turn"]["id"],
                  trigger=USER, grant_id="", runner_id=node.id, source=FAR, profile="default")  # fmt: skip
    grants = [round_grant(hubs.front, node.machines[1], round) for _ in range(2)]
    return Lead(owner, node, writers, grants)


@pytest.fixture(params=BACKENDS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    with front_and_back(request, tmp_path) as hubs:
        sources = [f"s{n}" for n in range(len(OWNERS))]
        profiles = {source: ["default"] for source in [*sources, FAR]}
        admin = admin_of(hubs.front, allowed_profiles=profiles)
        try:
            for owner in OWNERS:
                add_account(hubs.front, owner, "user", can_manage_team=True, allowed_profiles=profiles)
            register(admin, name="far node", source=FAR)
            with fleet_of(hubs, admin, sources) as fleet:
                leads = {owner: lead_of(fleet, owner, node) for owner, node in zip(OWNERS, fleet.nodes, strict=True)}
                yield Site(fleet, leads)
        finally:
            admin.close()


def test_team_limits_hold_at_their_edges_with_two_owners_calling_at_once(site: Site) -> None:
    # teams: 24 names each sent twice (one requestId, both at once) by each owner; 20 are made
    names = [f"Crew {n:02}" for n in range(limits.MAX_LIVE_TEAMS_PER_ADMINISTRATOR + 4)]
    teams = at_once([
        site.tool(who, 2 * n + twice, "talaria_create_team", requestId=f"team-{n}", name=name,
                  memberIds=site.leads[who].writers)
        for who in OWNERS for n, name in enumerate(names) for twice in (0, 1)
    ])  # fmt: skip
    made: dict[str, list[str]] = {}
    for k, who in enumerate(OWNERS):
        mine = teams[k * 2 * len(names) : (k + 1) * 2 * len(names)]
        pairs = [mine[2 * n : 2 * n + 2] for n in range(len(names))]
        for one, other in pairs:  # a repeat of a request replays it, or is refused as it was
            assert (one.status_code, one.text) == (other.status_code, other.text), who
        assert codes([one for one, _ in pairs]) == Counter(
            {(200, ""): limits.MAX_LIVE_TEAMS_PER_ADMINISTRATOR, (409, "team_limit"): 4}
        ), who
        made[who] = [result(one)["team"]["id"] for one, _ in pairs if one.status_code == 200]
        stored = site.rows("SELECT id FROM team WHERE owner = ? AND archived = 0", who)
        assert sorted(row["id"] for row in stored) == sorted(made[who]), who

    # goals: 6 titles into each of 3 teams of each owner at once; 4 open goals per team
    wanted = [(who, team, f"Goal {g}") for who in OWNERS for team in made[who][:3] for g in range(6)]
    goals = at_once([site.tool(who, n, "talaria_start_goal", requestId=f"goal-{n}", teamId=team, title=title,
                               objective="write it") for n, (who, team, title) in enumerate(wanted)])  # fmt: skip
    opened: dict[str, list[str]] = {}
    for who in OWNERS:
        for team in made[who][:3]:
            mine = [a for a, (w, t, _) in zip(goals, wanted, strict=True) if (w, t) == (who, team)]
            assert codes(mine) == Counter({(200, ""): limits.MAX_OPEN_GOALS_PER_TEAM, (409, "goal_limit"): 2})
            assert len(site.rows("SELECT id FROM goal WHERE team_id = ?", team)) == limits.MAX_OPEN_GOALS_PER_TEAM
        first = made[who][0]
        opened[who] = [result(a)["goal"]["id"] for a, (w, t, _) in zip(goals, wanted, strict=True)
                       if (w, t) == (who, first) and a.status_code == 200]  # fmt: skip

    # assignments: 36 into one goal of each owner, and 4 into each of two more of uma's, at once; 32 per goal
    over = limits.MAX_ASSIGNMENTS_PER_GOAL + 4
    jobs = [(who, opened[who][0], n) for who in OWNERS for n in range(over)]
    jobs += [("uma", goal, n) for goal in opened["uma"][1:3] for n in range(4)]
    assigned = at_once([
        site.tool(who, k, "talaria_assign", requestId=f"assign-{k}", goalId=goal,
                  botId=site.leads[who].writers[n % WRITERS], title=f"Part {n}", brief="write part")
        for k, (who, goal, n) in enumerate(jobs)
    ])  # fmt: skip
    for who in OWNERS:
        big = [a for a, (w, g, _) in zip(assigned, jobs, strict=True) if (w, g) == (who, opened[who][0])]
        assert codes(big) == Counter({(200, ""): limits.MAX_ASSIGNMENTS_PER_GOAL, (409, "assignment_limit"): 4})
        for goal in opened[who][:3]:
            accepted = {result(a)["assignment"]["id"] for a, (w, g, _) in zip(assigned, jobs, strict=True)
                        if (w, g) == (who, goal) and a.status_code == 200}  # fmt: skip
            assert {row["id"] for row in site.rows("SELECT id FROM assignment WHERE goal_id = ?", goal)} == accepted

    # goal turns (running assignments), dispatched while the assignments were still being made: ulf's one goal
    # reaches 4 (per goal); uma's three reach 10 between them (per account), none more than 4; the rest stay pending
    top_goal, top_account = limits.MAX_RUNNING_PER_GOAL, limits.MAX_RUNNING_PER_ACCOUNT
    made_of = {"uma": limits.MAX_ASSIGNMENTS_PER_GOAL + 2 * 4, "ulf": limits.MAX_ASSIGNMENTS_PER_GOAL}
    edge = {"uma": top_account, "ulf": top_goal}

    def running() -> dict[str, list[int]]:  # each owner's running assignments, per goal (one query)
        rows = site.rows("SELECT owner, goal_id, count(*) AS n FROM assignment WHERE status = 'running'"
                         " GROUP BY owner, goal_id")  # fmt: skip
        return {who: [int(row["n"]) for row in rows if row["owner"] == who] for who in OWNERS}

    try:
        wait_until(lambda: {who: sum(n) for who, n in running().items()} == edge, timeout=30,
                   what="the goal turns to start")  # fmt: skip
    except AssertionError:
        query = "SELECT owner, goal_id, status, count(*) AS n FROM assignment GROUP BY owner, goal_id, status"
        raise AssertionError(f"the goal turns did not reach {edge}: {site.rows(query)}; goals {opened}") from None
    reconcilers = [hub.hub.team_reconciler for hub in (site.fleet.hubs.front, site.fleet.hubs.back)]
    passes = [r.reconcile.passes for r in reconcilers if r is not None]
    for reconciler in reconcilers:
        assert reconciler is not None
        reconciler.wake()
    wait_until(lambda: [r.reconcile.passes for r in reconcilers if r is not None] != passes, timeout=30,
               what="another reconciler pass")  # fmt: skip
    after = running()
    for who in OWNERS:
        assert sum(after[who]) == edge[who] and max(after[who]) <= top_goal, (who, after[who])
        statuses = Counter(row["status"] for row in site.rows("SELECT status FROM assignment WHERE owner = ?", who))
        assert statuses == Counter({"running": edge[who], "pending": made_of[who] - edge[who]}), (who, statuses)
    statuses = Counter(row["status"] for row in site.rows("SELECT status FROM goal"))
    assert statuses == Counter({"running": len(OWNERS) * 3 * limits.MAX_OPEN_GOALS_PER_TEAM}), "no goal went to review"
    turns = Counter((row["trigger"], row["state"]) for row in site.rows("SELECT trigger, state FROM chat_turn"))
    assert turns == Counter({("user", "pending"): len(OWNERS)}), "the rounds' own turns, live; no wake"
