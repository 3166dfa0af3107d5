"""Teams and goals for people (team-tools.md 11) over a real hub: users see their own, admins the tenant's (with
``owner=``), another account's team or goal is 404 like an unknown id; the criteria PATCH and the stop follow their
codes (``goal_criteria_changed``, ``goal_not_active``), refuse bad bodies with ``invalid_request`` and change
nothing then. The goals are made through the hub's own tool frame, as a round of the owner's bot would."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.clock import SystemClock
from talaria.teams.round import USER, Round
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, db_rows, login
from tests.hermes.chat_support import make_bot, start_chat
from tests.integration.runner_support import wait_until

TABLES = ("goal", "assignment", "team_delivery", "audit_event")


@dataclass
class Site:
    server: HubServer
    alice: httpx.Client
    bob: httpx.Client
    root: httpx.Client
    team_id: str
    goal_id: str

    def rows(self, sql: str) -> list[dict[str, Any]]:
        return db_rows(self.server.settings.sqlite_path, sql)

    def snapshot(self) -> tuple[Any, ...]:
        conn = sqlite3.connect(self.server.settings.sqlite_path)
        try:
            return tuple(conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in TABLES)
        finally:
            conn.close()


def _goal_of(server: HubServer, client: httpx.Client, owner: str, title: str) -> tuple[str, str]:
    """A team and a running goal of ``owner``, made by its bot's round through the hub's tool frame."""
    lead = make_bot(client, f"Lead {owner}")
    assert client.patch(f"/api/bots/{lead}", json={"teamPermission": True}).status_code == 200
    writer = make_bot(client, f"Writer {owner}")
    conversation = start_chat(client, lead)
    account = server.hub.accounts.get(owner)
    bot = client.get(f"/api/bots/{lead}").json()["bot"]
    assert account is not None
    round = Round(tenant="default", owner=owner, auth_version=account.auth_version, bot_id=lead,
                  bot_revision=bot["revision"], conversation_id=conversation, turn_id=f"trn_{owner}", trigger=USER,
                  grant_id="grt", runner_id="run", source="local", profile="default")  # fmt: skip
    calls = server.hub.chat_engine.team_calls
    assert calls is not None
    made = json.loads(calls.call(round, "talaria_create_team", {"requestId": f"T{owner}", "name": "Crew",
                                                                 "memberIds": [writer]}))  # fmt: skip
    goal = json.loads(calls.call(round, "talaria_start_goal", {"requestId": f"G{owner}", "teamId": made["team"]["id"],
                                                                "title": title, "objective": "write it"}))  # fmt: skip
    return made["team"]["id"], goal["goal"]["id"]


@pytest.fixture
def site(tmp_path: Path, fast_argon2: None) -> Iterator[Site]:
    server = HubServer(tmp_path / "data", SystemClock()).start()
    clients: list[httpx.Client] = []
    try:
        from talaria.hub.runners.registry import parse_registration

        body = {"name": "node", "allowedProfiles": ["default"], "hermesURL": "http://127.0.0.1:9"}
        server.hub.registry.register("default", parse_registration(body, default_server_url=server.url))
        for name, role in (("alice", "user"), ("bob", "user"), ("root", "admin")):
            add_account(server, name, role, allowed_profiles={"local": ["default"]}, can_manage_team=True)
            clients.append(login(server, name))
        alice, bob, root = clients
        team_id, goal_id = _goal_of(server, alice, "alice", "Report")
        _goal_of(server, bob, "bob", "Other")
        made = Site(server, alice, bob, root, team_id, goal_id)
        # nothing was assigned, so once each starting turn counts as ended the goal enters review and its
        # coordinator is woken (team-tools.md 4.5, ADR 0040): wait for that, so that snapshots stand still
        wait_until(lambda: made.rows("SELECT status FROM team_delivery") == [{"status": "delivered"}] * 2,
                   what="the review deliveries", timeout=30)  # fmt: skip
        yield made
    finally:
        for client in clients:
            client.close()
        server.stop()


def test_a_user_sees_her_own_teams_and_goals_and_another_s_are_not_found(site: Site) -> None:
    teams = site.alice.get("/api/teams").json()
    assert [t["id"] for t in teams["teams"]] == [site.team_id] and teams["nextCursor"] is None
    assert site.alice.get("/api/teams", params={"owner": "bob"}).json()["teams"] == []
    one = site.alice.get(f"/api/teams/{site.team_id}").json()
    assert [g["id"] for g in one["goals"]] == [site.goal_id] and one["team"]["name"] == "Crew"
    shown = site.alice.get(f"/api/goals/{site.goal_id}").json()
    assert set(shown) == {"goal", "team", "assignments"} and shown["goal"]["title"] == "Report"
    status = shown["goal"]["status"]
    goals = site.alice.get("/api/goals", params={"teamId": site.team_id, "status": status}).json()["goals"]
    assert [(g["id"], g["owner"]) for g in goals] == [(site.goal_id, "alice")]
    other = "blocked" if status != "blocked" else "complete"
    assert site.alice.get("/api/goals", params={"status": other}).json()["goals"] == []
    for path in (f"/api/teams/{site.team_id}", f"/api/goals/{site.goal_id}"):
        refused = site.bob.get(path)
        assert (refused.status_code, refused.json()["code"]) == (404, "not_found")
    assert site.bob.post(f"/api/goals/{site.goal_id}/stop", json={}).status_code == 404
    assert site.alice.get("/api/goals/gol_nosuch").status_code == 404


def test_an_admin_sees_the_tenant_s_and_narrows_by_owner(site: Site) -> None:
    every = site.root.get("/api/teams").json()["teams"]
    assert sorted(t["owner"] for t in every) == ["alice", "bob"]
    assert [t["owner"] for t in site.root.get("/api/teams", params={"owner": "bob"}).json()["teams"]] == ["bob"]
    assert site.root.get(f"/api/goals/{site.goal_id}").status_code == 200
    paged = site.root.get("/api/goals", params={"limit": 1}).json()
    assert len(paged["goals"]) == 1 and paged["nextCursor"] is not None
    rest = site.root.get("/api/goals", params={"limit": 1, "cursor": paged["nextCursor"]}).json()
    assert len(rest["goals"]) == 1 and rest["goals"][0]["id"] != paged["goals"][0]["id"]


def test_criteria_change_with_the_expected_revision_and_a_stale_one_is_a_conflict(site: Site) -> None:
    path = f"/api/goals/{site.goal_id}/criteria"
    changed = site.alice.patch(path, json={"expectedRevision": 1, "acceptanceCriteria": ["one", "two"]})
    assert changed.status_code == 200, changed.text
    goal = changed.json()["goal"]
    assert (goal["acceptanceRevision"], goal["acceptanceCriteria"]) == (2, ["one", "two"])
    before = site.snapshot()
    stale = site.alice.patch(path, json={"expectedRevision": 1, "acceptanceCriteria": ["three"]})
    assert (stale.status_code, stale.json()["code"]) == (409, "goal_criteria_changed")
    assert site.snapshot() == before


@pytest.mark.parametrize("body", [
    {"expectedRevision": 1, "acceptanceCriteria": []},
    {"expectedRevision": 1, "acceptanceCriteria": ["x" * 1001]},
    {"expectedRevision": 1, "acceptanceCriteria": ["x"] * 13},
    {"expectedRevision": 1, "acceptanceCriteria": ["ok"], "owner": "bob"},
    {"acceptanceCriteria": ["ok"]},
    {"expectedRevision": "1", "acceptanceCriteria": ["ok"]},
])  # fmt: skip
def test_bad_criteria_bodies_are_invalid_request_and_change_nothing(site: Site, body: dict[str, Any]) -> None:
    before = site.snapshot()
    refused = site.alice.patch(f"/api/goals/{site.goal_id}/criteria", json=body)
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_request"), refused.text
    assert site.snapshot() == before


def test_criteria_at_their_limits_are_accepted(site: Site) -> None:
    body = {"expectedRevision": 1, "acceptanceCriteria": ["x" * 1000] * 12}
    assert site.alice.patch(f"/api/goals/{site.goal_id}/criteria", json=body).status_code == 200


def test_stop_cancels_a_goal_once_and_a_second_stop_is_goal_not_active(site: Site) -> None:
    path = f"/api/goals/{site.goal_id}/stop"
    for body in ({"reason": ""}, {"reason": "x" * 2001}, {"why": "x"}):
        before = site.snapshot()
        assert site.alice.post(path, json=body).status_code == 400
        assert site.snapshot() == before
    stopped = site.alice.post(path, json={"reason": "x" * 2000})
    assert stopped.status_code == 200, stopped.text
    assert (stopped.json()["goal"]["status"], stopped.json()["goal"]["cause"]) == ("cancelled", "stopped")
    again = site.alice.post(path, json={})
    assert (again.status_code, again.json()["code"]) == (409, "goal_not_active")
    conn = sqlite3.connect(site.server.settings.sqlite_path)
    try:
        bodies = [
            json.loads(b) for (b,) in conn.execute("SELECT body FROM audit_event WHERE type = 'team.goal.cancelled'")
        ]
    finally:
        conn.close()
    assert [(b["actor"]["principal"], b["actor"]["via"], b["reason_code"]) for b in bodies] == [
        ("acct:default/alice", "web", "stopped")
    ]
    assert "x" * 50 not in json.dumps(bodies)


def test_an_admin_may_stop_another_s_goal(site: Site) -> None:
    assert site.root.post(f"/api/goals/{site.goal_id}/stop", json={}).status_code == 200


def test_a_status_filter_outside_the_goal_states_is_invalid_request(site: Site) -> None:
    refused = site.alice.get("/api/goals", params={"status": "done"})
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_request")


def test_the_audit_log_filters_by_team_and_goal_for_whom_may_see_them(site: Site) -> None:
    events = site.alice.get("/api/audit", params={"goal": site.goal_id}).json()["events"]
    assert events and all(e["team"]["goalId"] == site.goal_id for e in events)
    assert "team.goal.started" in {e["type"] for e in events}
    by_team = site.alice.get("/api/audit", params={"team": site.team_id}).json()["events"]
    assert {"team.team.created", "team.goal.started"} <= {e["type"] for e in by_team}
    assert all(e["team"]["teamId"] == site.team_id for e in by_team)
    for params in ({"goal": site.goal_id}, {"team": site.team_id}):
        refused = site.bob.get("/api/audit", params=params)
        assert (refused.status_code, refused.json()["code"]) == (404, "not_found")
        assert site.root.get("/api/audit", params=params).status_code == 200


def test_tool_calls_are_counted_by_tool_and_outcome(site: Site) -> None:
    with site.server.client() as client:
        metrics = client.get("/metrics").text
    applied = re.search(r'talaria_team_tool_calls_total\{outcome="applied",tool="talaria_create_team"\} (\S+)', metrics)
    assert applied is not None and float(applied.group(1)) == 2.0  # alice's and bob's teams
