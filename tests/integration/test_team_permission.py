"""A bot's team permission over a real hub and its SQLite file (team-tools.md 2, 3.1, 11): only the owner sets it;
turning it on needs the account's canManageTeam (403 team_permission_forbidden, nothing written); each change is a
change of the bot (revision +1), teamRevision +1, who granted it and when, one audit event; effective only while
the account keeps canManageTeam and the bot is not archived; a member of a live team cannot be archived."""

from __future__ import annotations

import sqlite3
from typing import Any

import httpx
import pytest

from tests.integration.web_support import Web, assert_error

pytestmark = pytest.mark.usefixtures("fast_argon2")


@pytest.fixture
def node(web: Web) -> None:
    answer = web.admin.post("/api/admin/runners", json={"name": "node-1", "source": "local",
                                                         "allowedProfiles": ["default"]})  # fmt: skip
    assert answer.status_code == 201, answer.text


def made(client: httpx.Client, name: str = "Lead", **fields: Any) -> dict[str, Any]:
    response = client.post("/api/bots", json={"name": name, "source": "local", "profile": "default"} | fields)
    assert response.status_code == 201, response.text
    bot: dict[str, Any] = response.json()["bot"]
    return bot


def may_manage_team(web: Web, username: str, value: bool) -> None:
    answer = web.admin.patch(f"/api/admin/accounts/{username}", json={"canManageTeam": value})
    assert answer.status_code == 200, answer.text


def permission_events(web: Web, bot_id: str) -> list[dict[str, Any]]:
    events = web.admin.get("/api/audit", params={"bot": bot_id}).json()["events"]
    return [e for e in reversed(events) if e["type"] == "team.bot.permission_changed"]


def test_without_can_manage_team_turning_it_on_is_403_and_writes_nothing(web: Web, node: None) -> None:
    on = {"name": "Lead", "source": "local", "profile": "default", "teamPermission": True}
    assert_error(web.user.post("/api/bots", json=on), 403, "team_permission_forbidden")
    assert web.user.get("/api/bots").json()["bots"] == []
    bot = made(web.user)
    assert (bot["teamPermission"], bot["teamPermissionEffective"], bot["teamRevision"]) == (False, False, 0)
    assert (bot["teamGrantedBy"], bot["teamGrantedAt"], bot["createdByBotId"], bot["createdInTurnId"]) == (
        None, None, None, None)  # fmt: skip
    refused = web.user.patch(f"/api/bots/{bot['id']}", json={"teamPermission": True, "name": "Renamed"})
    assert_error(refused, 403, "team_permission_forbidden")
    assert web.user.get(f"/api/bots/{bot['id']}").json()["bot"] == bot, "the rename in the same body is kept out"
    off = web.user.patch(f"/api/bots/{bot['id']}", json={"teamPermission": False})
    assert off.status_code == 200 and off.json()["bot"] == bot, "turning off what is off changes nothing"
    assert permission_events(web, bot["id"]) == []


def test_the_owner_grants_and_revokes_and_each_change_is_a_revision_with_its_event(web: Web, node: None) -> None:
    may_manage_team(web, "uma", True)
    bot = made(web.user)
    granted = web.user.patch(f"/api/bots/{bot['id']}", json={"teamPermission": True}).json()["bot"]
    assert (granted["teamPermission"], granted["teamPermissionEffective"]) == (True, True)
    assert (granted["revision"], granted["teamRevision"], granted["teamGrantedBy"]) == (2, 1, "uma")
    assert isinstance(granted["teamGrantedAt"], int) and granted["teamGrantedAt"] >= bot["createdAt"]
    again = web.user.patch(f"/api/bots/{bot['id']}", json={"teamPermission": True}).json()["bot"]
    assert again == granted, "the same value again is no change"
    revoked = web.user.patch(f"/api/bots/{bot['id']}", json={"teamPermission": False}).json()["bot"]
    assert (revoked["teamPermission"], revoked["teamPermissionEffective"]) == (False, False)
    assert (revoked["revision"], revoked["teamRevision"]) == (3, 2)
    assert (revoked["teamGrantedBy"], revoked["teamGrantedAt"]) == ("uma", granted["teamGrantedAt"]), "last grant"
    events = permission_events(web, bot["id"])
    assert [(e["reasonCode"], e["revisionAfter"], e["actor"]["principal"], e["actor"]["via"]) for e in events] == [
        ("granted", 2, "acct:default/uma", "web"), ("revoked", 3, "acct:default/uma", "web")]  # fmt: skip
    assert all(e["subject"] == {"bot": bot["id"]} and e["team"]["account"] == "uma" for e in events)
    assert all(e["team"]["botId"] == bot["id"] and e["team"]["tool"] is None for e in events)
    assert web.admin.get("/api/audit/verify").json()["ok"] is True


def test_created_on_is_revision_one_and_team_revision_one(web: Web, node: None) -> None:
    may_manage_team(web, "uma", True)
    bot = made(web.user, teamPermission=True)
    assert (bot["revision"], bot["teamRevision"], bot["teamPermission"], bot["teamGrantedBy"]) == (1, 1, True, "uma")
    assert [e["type"] for e in reversed(web.user.get("/api/audit", params={"bot": bot["id"]}).json()["events"])] == [
        "chat.bot.created", "team.bot.permission_changed"]  # fmt: skip


def test_the_permission_is_effective_only_with_the_account_s_flag_and_while_not_archived(web: Web, node: None) -> None:
    may_manage_team(web, "uma", True)
    bot = made(web.user, teamPermission=True)
    may_manage_team(web, "uma", False)
    kept = web.user.get(f"/api/bots/{bot['id']}").json()["bot"]
    assert (kept["teamPermission"], kept["teamPermissionEffective"]) == (True, False)
    assert web.user.get("/api/bots").json()["bots"][0]["teamPermissionEffective"] is False
    may_manage_team(web, "uma", True)
    archived = web.user.patch(f"/api/bots/{bot['id']}", json={"archived": True}).json()["bot"]
    assert (archived["teamPermission"], archived["teamPermissionEffective"]) == (True, False)


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_a_team_permission_that_is_not_a_boolean_is_400(web: Web, node: None, value: Any) -> None:
    may_manage_team(web, "uma", True)
    bot = made(web.user)
    assert_error(web.user.patch(f"/api/bots/{bot['id']}", json={"teamPermission": value}), 400, "invalid_request")
    assert_error(web.user.post("/api/bots", json={"name": "Other", "source": "local", "profile": "default",
                                                  "teamPermission": value}), 400, "invalid_request")  # fmt: skip
    assert web.user.get(f"/api/bots/{bot['id']}").json()["bot"] == bot


def test_another_account_s_bot_is_404_for_a_permission_change(web: Web, node: None) -> None:
    may_manage_team(web, "uma", True)
    may_manage_team(web, "ulf", True)
    bot = made(web.user)
    assert_error(web.other.patch(f"/api/bots/{bot['id']}", json={"teamPermission": True}), 404, "not_found")
    assert_error(web.admin.patch(f"/api/bots/{bot['id']}", json={"teamPermission": True}), 404, "not_found")
    assert web.user.get(f"/api/bots/{bot['id']}").json()["bot"] == bot


def test_a_member_of_a_team_that_is_not_archived_cannot_be_archived(web: Web, node: None) -> None:
    lead, writer = made(web.user), made(web.user, "Writer")
    # the team tools that form teams come later in this set; the rows are the ones they write
    conn = sqlite3.connect(web.server.data_dir / "talaria.sqlite3")
    try:
        conn.execute("INSERT INTO team (id, tenant, owner, name, name_key, administrator_id, created_at, updated_at)"
                     " VALUES ('tm_1', 'default', 'uma', 'Crew', 'crew', ?, 0, 0)", (lead["id"],))  # fmt: skip
        conn.executemany("INSERT INTO team_member (team_id, bot_id, position) VALUES ('tm_1', ?, ?)",
                         [(lead["id"], 0), (writer["id"], 1)])  # fmt: skip
        conn.commit()
        assert_error(web.user.patch(f"/api/bots/{writer['id']}", json={"archived": True}), 409, "bot_in_use")
        assert web.user.get(f"/api/bots/{writer['id']}").json()["bot"] == writer
        conn.execute("UPDATE team SET archived = 1 WHERE id = 'tm_1'")
        conn.commit()
    finally:
        conn.close()
    archived = web.user.patch(f"/api/bots/{writer['id']}", json={"archived": True})
    assert archived.status_code == 200 and archived.json()["bot"]["archived"] is True
