"""Bots over a real hub and its SQLite file (chat.md 2, 3.1-3.2, 7, 8): each account's own records, bound at
creation to an allowed (source, profile); names unique per owner case-insensitively; every limit at its edge;
another account's bot is 404 for everyone, admins included; audit events carry keyed digests, never the text."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import Any

import httpx
import pytest

from talaria.canonical import canonical_json
from talaria.limits import MAX_LIVE_BOTS
from tests.integration.web_support import Web, assert_error

pytestmark = pytest.mark.usefixtures("fast_argon2")

BOT_KEYS = {"id", "name", "source", "profile", "instructions", "archived", "online", "runner", "teamPermission",
            "teamPermissionEffective", "teamRevision", "teamGrantedBy", "teamGrantedAt", "createdByBotId",
            "createdInTurnId", "createdAt", "updatedAt", "revision"}  # fmt: skip
SECRET_NAME = "Helper-7f3a"
SECRET_INSTRUCTIONS = "Answer briefly. The launch code is 9121."


@pytest.fixture
def node(web: Web) -> dict[str, Any]:
    """A registered (offline) node for source ``local`` allowing ``default`` and ``work``."""
    answer = web.admin.post("/api/admin/runners", json={"name": "node-1", "source": "local",
                                                         "allowedProfiles": ["default", "work"]})  # fmt: skip
    assert answer.status_code == 201, answer.text
    runner: dict[str, Any] = answer.json()["runner"]
    return runner


def create(client: httpx.Client, **fields: Any) -> httpx.Response:
    return client.post("/api/bots", json={"name": SECRET_NAME, "source": "local", "profile": "default"} | fields)


def made(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    response = create(client, **fields)
    assert response.status_code == 201, response.text
    bot: dict[str, Any] = response.json()["bot"]
    return bot


def test_a_bot_is_created_read_listed_and_changed_by_its_owner(web: Web, node: dict[str, Any]) -> None:
    bot = made(web.user, instructions=SECRET_INSTRUCTIONS, name=f"  {SECRET_NAME}  ")
    assert set(bot) == BOT_KEYS
    assert (bot["name"], bot["source"], bot["profile"], bot["instructions"]) == (
        SECRET_NAME, "local", "default", SECRET_INSTRUCTIONS)  # fmt: skip
    assert (bot["archived"], bot["online"], bot["teamPermission"], bot["revision"]) == (False, False, False, 1)
    assert bot["runner"] == {"id": node["id"], "name": "node-1"}
    assert bot["id"].startswith("bot_")
    assert web.user.get(f"/api/bots/{bot['id']}").json() == {"bot": bot}
    listed = web.user.get("/api/bots").json()
    assert listed == {"bots": [bot], "nextCursor": None}
    renamed = web.user.patch(f"/api/bots/{bot['id']}", json={"name": "Writer", "instructions": ""})
    assert renamed.status_code == 200, renamed.text
    assert (renamed.json()["bot"]["name"], renamed.json()["bot"]["instructions"]) == ("Writer", "")
    assert renamed.json()["bot"]["revision"] == 2
    same = web.user.patch(f"/api/bots/{bot['id']}", json={"name": "Writer"})  # nothing changes: no new revision
    assert same.json()["bot"]["revision"] == 2
    archived = web.user.patch(f"/api/bots/{bot['id']}", json={"archived": True}).json()["bot"]
    assert (archived["archived"], archived["revision"]) == (True, 3)
    assert web.user.get("/api/bots").json()["bots"] == []
    assert [b["id"] for b in web.user.get("/api/bots", params={"archived": "true"}).json()["bots"]] == [bot["id"]]
    back = web.user.patch(f"/api/bots/{bot['id']}", json={"archived": False}).json()["bot"]
    assert (back["archived"], back["revision"]) == (False, 4)


def test_bot_profiles_are_the_account_s_pairs_that_an_enabled_node_allows(web: Web, node: dict[str, Any]) -> None:
    assert web.user.get("/api/bot-profiles").json() == {
        "profiles": [{"source": "local", "profile": "default", "online": False}]}  # fmt: skip
    assert web.admin.patch("/api/admin/accounts/uma", json={
        "allowedProfiles": {"local": ["work", "default", "other"], "lab": ["default"]}}).status_code == 200  # fmt: skip
    uma = web.login("uma")
    assert [(p["source"], p["profile"]) for p in uma.get("/api/bot-profiles").json()["profiles"]] == [
        ("local", "default"), ("local", "work")]  # fmt: skip
    assert web.admin.delete(f"/api/admin/runners/{node['id']}").status_code == 200
    assert uma.get("/api/bot-profiles").json() == {"profiles": []}


def test_a_bot_for_a_pair_outside_the_owner_s_intersection_is_403_bot_not_allowed(
    web: Web, node: dict[str, Any]
) -> None:
    assert_error(create(web.user, profile="work"), 403, "bot_not_allowed")  # the node allows it, uma may not
    assert_error(create(web.user, source="lab"), 403, "bot_not_allowed")  # uma may, no node serves lab
    assert_error(create(web.user, source="nowhere", profile="x"), 403, "bot_not_allowed")
    assert web.user.get("/api/bots").json()["bots"] == []


def test_names_are_unique_per_owner_case_insensitively_among_bots_not_archived(web: Web, node: dict[str, Any]) -> None:
    first = made(web.user, name="Writer")
    assert_error(create(web.user, name="wRITER"), 409, "duplicate_bot_name")
    assert made(web.other, name="writer")["name"] == "writer"  # another owner's names are theirs
    second = made(web.user, name="Editor")
    assert_error(web.user.patch(f"/api/bots/{second['id']}", json={"name": "WRITER"}), 409, "duplicate_bot_name")
    assert web.user.patch(f"/api/bots/{first['id']}", json={"archived": True}).status_code == 200
    third = made(web.user, name="writer")  # the archived one no longer holds the name
    assert_error(web.user.patch(f"/api/bots/{first['id']}", json={"archived": False}), 409, "duplicate_bot_name")
    assert web.user.patch(f"/api/bots/{third['id']}", json={"archived": True}).status_code == 200
    assert web.user.patch(f"/api/bots/{first['id']}", json={"archived": False}).status_code == 200


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"name": ""}, "blank"),
        ({"name": "   "}, "blank"),
        ({"name": "a@b"}, "@"),
        ({"name": "a\u0000b"}, "control"),
        ({"name": "\u202etxt"}, "bidi"),
        ({"name": "n" * 101}, "too long"),
        ({"instructions": "i" * 24_001}, "too long"),
        ({"instructions": "a\rb"}, "control"),
        ({"instructions": None}, "null"),
        ({"extra": 1}, "unknown field"),
        ({"profile": 3}, "type"),
    ],
)
def test_bad_bot_bodies_are_400_invalid_request(
    web: Web, node: dict[str, Any], fields: dict[str, Any], why: str
) -> None:
    assert_error(create(web.user, **fields), 400, "invalid_request", why)


def test_the_name_and_instruction_limits_hold_at_their_edges(web: Web, node: dict[str, Any]) -> None:
    bot = made(web.user, name="n" * 100, instructions="i\n\t" * 8000)
    assert len(bot["name"]) == 100 and len(bot["instructions"]) == 24_000
    assert made(web.user, name=" " * 5 + "m" * 100 + " " * 5)["name"] == "m" * 100  # trimmed, then counted
    assert_error(web.user.patch(f"/api/bots/{bot['id']}", json={}), 400, "invalid_request")
    assert_error(web.user.patch(f"/api/bots/{bot['id']}", json={"name": None}), 400, "invalid_request")
    assert_error(web.user.patch(f"/api/bots/{bot['id']}", json={"instructions": "x" * 24_001}), 400, "invalid_request")


def test_an_account_keeps_at_most_a_hundred_bots_that_are_not_archived(web: Web, node: dict[str, Any]) -> None:
    bots = [made(web.user, name=f"bot {n}") for n in range(MAX_LIVE_BOTS)]
    assert_error(create(web.user, name="one too many"), 409, "bot_limit")
    assert web.user.patch(f"/api/bots/{bots[0]['id']}", json={"archived": True}).status_code == 200
    made(web.user, name="one too many")  # the archived one left room
    assert_error(web.user.patch(f"/api/bots/{bots[0]['id']}", json={"archived": False}), 409, "bot_limit")
    assert made(web.other, name="bot 0")  # the limit is per account
    first = web.user.get("/api/bots", params={"limit": 60}).json()
    second = web.user.get("/api/bots", params={"limit": 60, "cursor": first["nextCursor"]}).json()
    assert (len(first["bots"]), len(second["bots"]), second["nextCursor"]) == (60, 40, None)
    listed = first["bots"] + second["bots"]
    assert len({b["id"] for b in listed}) == MAX_LIVE_BOTS
    assert [b["createdAt"] for b in listed] == sorted((b["createdAt"] for b in listed), reverse=True)


def test_unarchiving_a_bot_whose_profile_its_owner_lost_is_403(web: Web, node: dict[str, Any]) -> None:
    bot = made(web.user)
    assert web.user.patch(f"/api/bots/{bot['id']}", json={"archived": True}).status_code == 200
    assert web.admin.patch("/api/admin/accounts/uma", json={"allowedProfiles": {"lab": ["default"]}}).status_code == 200
    uma = web.login("uma")
    assert_error(uma.patch(f"/api/bots/{bot['id']}", json={"archived": False}), 403, "bot_not_allowed")
    assert uma.get(f"/api/bots/{bot['id']}").json()["bot"]["archived"] is True


def test_another_account_s_bot_is_404_for_every_one_admins_included(
    web: Web, node: dict[str, Any], make_hub: Any
) -> None:
    bot = made(web.user)
    path = f"/api/bots/{bot['id']}"
    for client in (web.other, web.admin):
        assert_error(client.get(path), 404, "not_found")
        assert_error(client.patch(path, json={"name": "mine now"}), 404, "not_found")
        assert_error(client.patch(path, json={"archived": True}), 404, "not_found")
        assert client.get("/api/bots").json()["bots"] == []
    assert_error(web.user.get("/api/bots/bot_01NOSUCHBOT0000000000000000"), 404, "not_found")
    assert web.user.get(path).json()["bot"]["revision"] == 1  # nothing changed
    assert_error(web.anon().get(path), 401, "unauthenticated")
    csrf_less = web.anon(headers={"Origin": web.server.url}, cookies=web.user.cookies)
    assert_error(csrf_less.post("/api/bots", json={"name": "x", "source": "local", "profile": "default"}), 403,
                 "csrf_failed")  # fmt: skip


def test_bot_events_hold_keyed_digests_and_only_the_owner_and_admins_read_them(
    web: Web, node: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bot = made(web.user, instructions=SECRET_INSTRUCTIONS)
    web.user.patch(f"/api/bots/{bot['id']}", json={"instructions": "Be kind."})
    web.user.patch(f"/api/bots/{bot['id']}", json={"archived": True})
    mine = web.user.get("/api/audit", params={"bot": bot["id"]})
    assert mine.status_code == 200, mine.text
    events = list(reversed(mine.json()["events"]))
    assert [(e["type"], e["fromState"], e["toState"]) for e in events] == [
        ("chat.bot.created", None, "open"), ("chat.bot.updated", "open", "open"),
        ("chat.bot.archived", "open", "archived")]  # fmt: skip
    assert all(e["subject"] == {"bot": bot["id"]} for e in events)
    key = (web.server.data_dir / "audit.key").read_bytes()
    assert len(key) == 32 and (web.server.data_dir / "audit.key").stat().st_mode & 0o777 == 0o600

    def keyed(value: Any) -> str:
        return hmac.new(key, canonical_json(value), hashlib.sha256).hexdigest()

    assert events[0]["evidence"] == {
        "kind": "chat_bot",
        "contentDigest": keyed({"instructions": SECRET_INSTRUCTIONS, "name": SECRET_NAME}),
    }
    assert events[1]["evidence"]["contentDigest"] == keyed({"instructions": "Be kind.", "name": SECRET_NAME})
    assert events[2]["evidence"] is None
    plain = hashlib.sha256(canonical_json({"instructions": SECRET_INSTRUCTIONS, "name": SECRET_NAME})).hexdigest()
    assert plain not in json.dumps(events)
    assert web.admin.get("/api/audit", params={"bot": bot["id"]}).json()["events"] == mine.json()["events"]
    assert_error(web.other.get("/api/audit", params={"bot": bot["id"]}), 404, "not_found")
    assert_error(web.admin.get("/api/audit", params={"bot": "bot_nosuch"}), 404, "not_found")
    assert web.admin.get("/api/audit/verify").json()["ok"] is True
    whole = json.dumps(web.admin.get("/api/audit", params={"limit": 100}).json())
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for secret in (SECRET_NAME, SECRET_INSTRUCTIONS, "Be kind."):
        assert secret not in whole and secret not in logged
