"""Conversations over a real hub and its SQLite file (chat.md 2, 3.1-3.2, 7, 8): each account's own chats with
its own bots; a conversation needs a bot that is its owner's, not archived and still allowed; titles and the
per-account limit hold at their edges; another account's conversation is 404 for everyone, admins included."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from talaria.limits import MAX_LIVE_CONVERSATIONS
from tests.integration.web_support import Web, assert_error

pytestmark = pytest.mark.usefixtures("fast_argon2")

CONVERSATION_KEYS = {"id", "tenant", "owner", "bot", "botIds", "title", "archived", "createdAt", "updatedAt",
                     "lastActivityAt", "runnerId", "hermesSessionId", "messageCount", "liveTurnId"}  # fmt: skip


@pytest.fixture
def bot(web: Web) -> dict[str, Any]:
    """Uma's bot ``Helper`` on ``default on local``, whose node is registered (offline)."""
    node = web.admin.post("/api/admin/runners", json={"name": "node-1", "source": "local",
                                                       "allowedProfiles": ["default"]})  # fmt: skip
    assert node.status_code == 201, node.text
    made = web.user.post("/api/bots", json={"name": "Helper", "source": "local", "profile": "default"})
    assert made.status_code == 201, made.text
    found: dict[str, Any] = made.json()["bot"]
    return found


def start(client: httpx.Client, bot_id: str, **fields: Any) -> httpx.Response:
    return client.post("/api/conversations", json={"botId": bot_id} | fields)


def started(client: httpx.Client, bot_id: str, **fields: Any) -> dict[str, Any]:
    response = start(client, bot_id, **fields)
    assert response.status_code == 201, response.text
    conversation: dict[str, Any] = response.json()["conversation"]
    return conversation


def test_a_conversation_is_started_read_listed_renamed_and_archived_by_its_owner(web: Web, bot: dict[str, Any]) -> None:
    first = started(web.user, bot["id"])
    assert set(first) == CONVERSATION_KEYS
    assert first["id"].startswith("cnv_")
    assert (first["title"], first["archived"], first["owner"], first["tenant"]) == ("Untitled chat", False, "uma",
                                                                                     "default")  # fmt: skip
    assert first["bot"] == {"id": bot["id"], "name": "Helper", "source": "local", "profile": "default"}
    assert first["botIds"] == [bot["id"]]
    nothing_yet = (first["messageCount"], first["liveTurnId"], first["runnerId"], first["hermesSessionId"])
    assert nothing_yet == (0, None, None, None)
    web.server.clock.advance(1)  # the list is by last activity, newest first
    second = started(web.user, bot["id"], title="  Release notes  ")
    assert second["title"] == "Release notes"
    assert web.user.get(f"/api/conversations/{first['id']}").json() == {"conversation": first}
    listed = web.user.get("/api/conversations").json()
    assert [c["id"] for c in listed["conversations"]] == [second["id"], first["id"]] and listed["nextCursor"] is None
    renamed = web.user.patch(f"/api/conversations/{first['id']}", json={"title": "Planning"}).json()["conversation"]
    assert renamed["title"] == "Planning"
    archived = web.user.patch(f"/api/conversations/{first['id']}", json={"archived": True}).json()["conversation"]
    assert archived["archived"] is True
    assert [c["id"] for c in web.user.get("/api/conversations").json()["conversations"]] == [second["id"]]
    assert [c["id"] for c in web.user.get("/api/conversations", params={"archived": "true"}).json()[
        "conversations"]] == [first["id"]]  # fmt: skip
    back = web.user.patch(f"/api/conversations/{first['id']}", json={"archived": False}).json()["conversation"]
    assert back["archived"] is False


def test_a_conversation_needs_the_owner_s_own_bot_not_archived_and_still_allowed(web: Web, bot: dict[str, Any]) -> None:
    assert_error(start(web.other, bot["id"]), 404, "not_found")  # another account's bot
    assert_error(start(web.admin, bot["id"]), 404, "not_found")
    assert_error(start(web.user, "bot_nosuch"), 404, "not_found")
    kept = started(web.user, bot["id"])
    assert web.user.patch(f"/api/bots/{bot['id']}", json={"archived": True}).status_code == 200
    assert_error(start(web.user, bot["id"]), 409, "bot_archived")
    assert web.user.patch(f"/api/conversations/{kept['id']}", json={"archived": True}).status_code == 200
    assert_error(web.user.patch(f"/api/conversations/{kept['id']}", json={"archived": False}), 409, "bot_archived")
    assert web.user.patch(f"/api/bots/{bot['id']}", json={"archived": False}).status_code == 200
    assert web.admin.patch("/api/admin/accounts/uma", json={"allowedProfiles": {"lab": ["default"]}}).status_code == 200
    uma = web.login("uma")
    assert_error(start(uma, bot["id"]), 403, "bot_not_allowed")
    assert_error(uma.patch(f"/api/conversations/{kept['id']}", json={"archived": False}), 403, "bot_not_allowed")
    assert uma.get(f"/api/conversations/{kept['id']}").status_code == 200  # still readable


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"title": ""}, "blank"),
        ({"title": "   "}, "blank"),
        ({"title": "t" * 201}, "too long"),
        ({"title": "a\u0007b"}, "control"),
        ({"title": None}, "null"),
        ({"botId": 7}, "type"),
        ({"extra": True}, "unknown field"),
    ],
)
def test_bad_conversation_bodies_are_400(web: Web, bot: dict[str, Any], fields: dict[str, Any], why: str) -> None:
    assert_error(start(web.user, bot["id"], **fields), 400, "invalid_request", why)


def test_titles_hold_at_their_edge_and_a_patch_needs_a_field(web: Web, bot: dict[str, Any]) -> None:
    conversation = started(web.user, bot["id"], title="t" * 200)
    assert len(conversation["title"]) == 200
    path = f"/api/conversations/{conversation['id']}"
    assert_error(web.user.patch(path, json={}), 400, "invalid_request")
    assert_error(web.user.patch(path, json={"title": "u" * 201}), 400, "invalid_request")
    assert_error(web.user.patch(path, json={"archived": None}), 400, "invalid_request")


def test_an_account_keeps_at_most_five_hundred_conversations_that_are_not_archived(
    web: Web, bot: dict[str, Any]
) -> None:
    conversations = [started(web.user, bot["id"]) for _ in range(MAX_LIVE_CONVERSATIONS)]
    assert_error(start(web.user, bot["id"]), 409, "conversation_limit")
    path = f"/api/conversations/{conversations[0]['id']}"
    assert web.user.patch(path, json={"archived": True}).status_code == 200
    started(web.user, bot["id"])
    assert_error(web.user.patch(path, json={"archived": False}), 409, "conversation_limit")
    pages, cursor = [], None
    while True:
        answer = web.user.get("/api/conversations", params={"limit": 100} | ({"cursor": cursor} if cursor else {}))
        pages.append(answer.json()["conversations"])
        cursor = answer.json()["nextCursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [100] * 5
    assert len({c["id"] for page in pages for c in page}) == MAX_LIVE_CONVERSATIONS


def test_another_account_s_conversation_is_404_for_every_one_admins_included(web: Web, bot: dict[str, Any]) -> None:
    conversation = started(web.user, bot["id"])
    path = f"/api/conversations/{conversation['id']}"
    for client in (web.other, web.admin):
        assert_error(client.get(path), 404, "not_found")
        assert_error(client.patch(path, json={"title": "mine"}), 404, "not_found")
        assert_error(client.patch(path, json={"archived": True}), 404, "not_found")
        assert client.get("/api/conversations").json()["conversations"] == []
    assert web.user.get(path).json()["conversation"] == conversation  # nothing changed
    assert_error(web.anon().get(path), 401, "unauthenticated")


def test_conversation_events_are_audited_without_the_title_and_read_by_the_owner_and_admins(
    web: Web, bot: dict[str, Any]
) -> None:
    conversation = started(web.user, bot["id"], title="Secret plans 4711")
    path = f"/api/conversations/{conversation['id']}"
    web.user.patch(path, json={"title": "Other secret 0815"})
    web.user.patch(path, json={"archived": True})
    web.user.patch(path, json={"archived": False})
    mine = web.user.get("/api/audit", params={"conversation": conversation["id"]})
    assert mine.status_code == 200, mine.text
    events = list(reversed(mine.json()["events"]))
    assert [(e["type"], e["fromState"], e["toState"]) for e in events] == [
        ("chat.conversation.created", None, "open"), ("chat.conversation.archived", "open", "archived"),
        ("chat.conversation.unarchived", "archived", "open")]  # fmt: skip
    assert all(e["subject"] == {"conversation": conversation["id"], "turn": None} for e in events)
    assert all(e["evidence"] is None for e in events)
    assert web.admin.get("/api/audit", params={"conversation": conversation["id"]}).json() == mine.json()
    assert_error(web.other.get("/api/audit", params={"conversation": conversation["id"]}), 404, "not_found")
    assert_error(web.admin.get("/api/audit", params={"conversation": "cnv_nosuch"}), 404, "not_found")
    whole = web.admin.get("/api/audit", params={"limit": 100}).text
    assert "Secret plans" not in whole and "Other secret" not in whole
    assert web.admin.get("/api/audit/verify").json()["ok"] is True
