"""Team tools' pages in chromium (team-tools.md 12) with the pinned names: the team permission checkbox on
``/bots`` saves at once and is disabled, described, for an account without ``canManageTeam``; ``Teams`` in the
main navigation, a team's ``Goals``; a goal's ``Goal progress`` with its criteria and assignments, a stale
criteria save that keeps the draft, ``Stop goal`` with its confirmation; and the report-back message's
``Open goal: <title>`` link. The goal is made through the hub's own tool frame, as its coordinator's round would;
its assignment's job waits for a node that never connects."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from playwright.sync_api import expect

from talaria.teams.round import USER, Round
from talaria.testing.hub_server import HubServer
from tests.browser.chat_support import open_as
from tests.browser.conftest import DESKTOP, PHONE, Browsers, screenshot_dir, sign_in
from tests.conftest import login
from tests.hermes.chat_support import make_bot, start_chat
from tests.integration.runner_support import wait_until


@dataclass
class Goal:
    hub: HubServer
    alice: httpx.Client
    conversation_id: str
    team_id: str
    goal_id: str
    assignment_id: str


def _round(hub: HubServer, alice: httpx.Client, lead: str, conversation: str) -> Round:
    account = hub.hub.accounts.get("alice")
    assert account is not None
    revision = alice.get(f"/api/bots/{lead}").json()["bot"]["revision"]
    return Round(tenant="default", owner="alice", auth_version=account.auth_version, bot_id=lead, bot_revision=revision,
                 conversation_id=conversation, turn_id="trn_page", trigger=USER, grant_id="grt", runner_id="run",
                 source="local", profile="default")  # fmt: skip


@pytest.fixture
def goal(chat_hub: HubServer) -> Iterator[Goal]:
    chat_hub.hub.accounts.update("alice", "default", {"canManageTeam": True})
    root = login(chat_hub, "root")
    assert (
        root.post("/api/admin/runners", json={"name": "node", "allowedProfiles": ["default", "work"]}).status_code
        == 201
    )
    root.close()
    alice = login(chat_hub, "alice")
    try:
        lead = make_bot(alice, "Lead")
        assert alice.patch(f"/api/bots/{lead}", json={"teamPermission": True}).status_code == 200
        conversation = start_chat(alice, lead)
        calls = chat_hub.hub.chat_engine.team_calls
        assert calls is not None
        round = _round(chat_hub, alice, lead, conversation)

        def call(tool: str, **arguments: object) -> dict[str, object]:
            return dict(json.loads(calls.call(round, f"talaria_{tool}", arguments)))

        writer = call("create_bot", requestId="R1", name="Writer")["bot"]["id"]  # type: ignore[index]
        team = call("create_team", requestId="R2", name="Crew", memberIds=[writer])["team"]["id"]  # type: ignore[index]
        made = call("start_goal", requestId="R3", teamId=team, title="Report", objective="write it",
                    acceptanceCriteria=["A draft exists.", "It cites its sources."])  # fmt: skip
        goal_id = made["goal"]["id"]  # type: ignore[index]
        assigned = call("assign", requestId="R4", goalId=goal_id, botId=writer, title="Draft", brief="mw-1")
        yield Goal(chat_hub, alice, conversation, str(team), str(goal_id), assigned["assignment"]["id"])  # type: ignore[index]
    finally:
        alice.close()


def test_the_team_checkbox_is_disabled_and_described_without_the_account_s_permission(
    chat_hub: HubServer, browsers: Browsers
) -> None:
    root = login(chat_hub, "root")
    assert root.post("/api/admin/runners", json={"name": "node", "allowedProfiles": ["default"]}).status_code == 201
    root.close()
    alice = login(chat_hub, "alice")
    make_bot(alice, "Helper")
    alice.close()
    page = open_as(browsers, chat_hub, "/bots")
    box = page.get_by_role("checkbox", name="Allow team management for Helper")
    expect(box).to_be_disabled()
    expect(box).to_have_accessible_description("Not effective: your account may not manage team bots.")


def test_the_team_checkbox_saves_at_once(chat_hub: HubServer, browsers: Browsers) -> None:
    chat_hub.hub.accounts.update("alice", "default", {"canManageTeam": True})
    root = login(chat_hub, "root")
    assert root.post("/api/admin/runners", json={"name": "node", "allowedProfiles": ["default"]}).status_code == 201
    root.close()
    alice = login(chat_hub, "alice")
    try:
        helper = make_bot(alice, "Helper")
        page = open_as(browsers, chat_hub, "/bots")
        box = page.get_by_role("checkbox", name="Allow team management for Helper")
        expect(box).to_be_enabled()
        box.check()
        expect(page.get_by_role("status").filter(has_text="Saved.")).to_be_visible()
        assert alice.get(f"/api/bots/{helper}").json()["bot"]["teamPermission"] is True
        page.reload()
        expect(page.get_by_role("checkbox", name="Allow team management for Helper")).to_be_checked()
    finally:
        alice.close()


def test_teams_lead_to_a_goal_s_progress_and_a_stale_criteria_save_keeps_the_draft(
    goal: Goal, browsers: Browsers
) -> None:
    context = browsers.context()
    context.expect_refusal(f"/api/goals/{goal.goal_id}/criteria")  # the stale save, on purpose
    wait_until(lambda: goal.alice.get(f"/api/goals/{goal.goal_id}").json()["assignments"][0]["status"] == "running",
               what="the assignment's job", timeout=30)  # fmt: skip
    page = context.page()
    sign_in(page, goal.hub, "alice")
    page.goto(f"{goal.hub.url}/chats")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Teams").click()
    expect(page.get_by_role("heading", name="Teams", exact=True)).to_be_visible()
    page.get_by_role("link", name="Crew").click()
    expect(page.get_by_role("heading", name="Crew")).to_be_visible()
    goals = page.get_by_role("table", name="Goals")
    expect(goals.get_by_role("columnheader")).to_have_text(["Goal", "Status", "Updated"])
    goals.get_by_role("link", name="Report").click()
    progress = page.get_by_role("region", name="Goal progress")
    expect(progress.get_by_test_id("goal-status")).to_have_text("Running")
    expect(progress.get_by_text("0 of 1 assignments complete")).to_be_visible()
    criteria = progress.get_by_role("list", name="Acceptance criteria").get_by_role("listitem")
    expect(criteria).to_have_count(2)
    expect(criteria.first).to_contain_text("Not passed")
    table = progress.get_by_role("table", name="Assignments")
    expect(table.get_by_role("columnheader")).to_have_text(["Assignment", "Member", "State", "Attempt"])
    expect(table.get_by_test_id("assignment-status")).to_have_text("Running")
    expect(table.get_by_role("row").nth(1)).to_contain_text("Writer")
    for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(viewport)
        page.screenshot(path=screenshot_dir() / f"team-goal-{name}.png", full_page=True)
    page.set_viewport_size(DESKTOP)
    page.get_by_role("button", name="Edit criteria").click()
    draft = page.get_by_label("Acceptance criteria, one per line")
    draft.fill("A draft exists.\nIt is short.")
    changed = goal.alice.patch(f"/api/goals/{goal.goal_id}/criteria",
                               json={"expectedRevision": 1, "acceptanceCriteria": ["Changed elsewhere."]})  # fmt: skip
    assert changed.status_code == 200
    page.get_by_role("button", name="Save criteria").click()
    expect(
        page.get_by_role("alert").filter(has_text="The criteria changed meanwhile; your draft is kept.")
    ).to_be_visible()
    expect(draft).to_have_value("A draft exists.\nIt is short.")
    task_id = goal.alice.get(f"/api/goals/{goal.goal_id}").json()["assignments"][0]["taskId"]
    page.goto(f"{goal.hub.url}/tasks/{task_id}")
    expect(page.get_by_text("team permission of Lead, granted by alice")).to_be_visible()


def test_stop_goal_asks_first_then_the_report_back_links_the_goal(goal: Goal, browsers: Browsers) -> None:
    page = open_as(browsers, goal.hub, f"/goals/{goal.goal_id}")
    asked: list[str] = []
    page.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name="Stop goal").click()
    status = page.get_by_role("region", name="Goal progress").get_by_test_id("goal-status")
    expect(status).to_have_text("Cancelled", timeout=30_000)
    assert asked == ["Stop this goal? Running assignments are cancelled."]
    expect(page.get_by_role("button", name="Stop goal")).to_have_count(0)
    page.goto(f"{goal.hub.url}/chats/{goal.conversation_id}")
    # every report-back message of the goal links it (an earlier one may be in the transcript already)
    link = page.get_by_role("link", name="Open goal: Report").last
    expect(link).to_be_visible(timeout=30_000)
    link.click()
    page.wait_for_url(f"{goal.hub.url}/goals/{goal.goal_id}")
    expect(page.get_by_role("heading", name="Report")).to_be_visible()
