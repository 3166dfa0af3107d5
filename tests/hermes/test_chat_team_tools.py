"""Team tools in chat turns on real Hermes (chat.md 5.9, team-tools.md 5, 6.1): a bot with effective team
permission gets the catalog of team-tools.md 6.3, in its order, under opaque names, each described
``<name>: <text>``; its ``talaria_whoami`` answers the server-side round (account, bot, turn, conversation as
``workId``), whatever the model passes. A bot without the permission, or of an owner without ``canManageTeam``,
is offered no team tool and stores no notice."""

from __future__ import annotations

import json

import httpx

from talaria.teams.arguments import TOOLS
from talaria.testing.model_server import LoggedRequest, ToolSelector, reply, tool_call, when
from tests.conftest import login
from tests.hermes.chat_support import audit_verifies, make_bot, messages, send, start_chat, wait_turn
from tests.hermes.conftest import Node
from tests.hermes.team_support import TEAM, offered_team_tools, requests_with, tool_results


def _turn(client: httpx.Client, conversation_id: str, text: str) -> dict[str, object]:
    sent = send(client, conversation_id, text)
    assert sent.status_code == 202, sent.text
    return wait_turn(client, conversation_id, sent.json()["turn"]["id"], timeout=120)


def _descriptions(request: LoggedRequest) -> list[str]:
    body = request.body
    return [t["function"]["description"] for t in body.get("tools", []) if t["function"]["name"].startswith(TEAM)]


def test_a_permitted_bot_gets_the_catalog_and_whoami_names_its_own_round(node: Node) -> None:
    node.server.hub.accounts.update("alice", "default", {"canManageTeam": True})
    node.model.script(
        when("who runs this chat", tool_call(ToolSelector(TEAM, "talaria_whoami:"), {"account": "mallory"}),
             reply("You are alice.")),
        when("plain question", reply("Plain answer.")),
    )  # fmt: skip
    alice, bob = login(node.server, "alice"), login(node.server, "bob")
    try:
        lead = make_bot(alice, "Lead")
        granted = alice.patch(f"/api/bots/{lead}", json={"teamPermission": True})
        assert granted.status_code == 200 and granted.json()["bot"]["teamPermissionEffective"] is True
        conversation_id = start_chat(alice, lead)
        turn = _turn(alice, conversation_id, "who runs this chat")
        assert (turn["state"], turn["teamTools"]) == ("completed", True)
        asked = requests_with(node, "who runs this chat")
        assert len(offered_team_tools(asked[0])) == len(TOOLS)
        described = _descriptions(asked[0])
        assert sorted(d.split(":", 1)[0] for d in described) == sorted(TOOLS)  # `<name>: <text>`, Hermes' order
        assert not any("talaria_" in d.split(":", 1)[1] for d in described)
        identity = json.loads(tool_results(asked[-1])[-1])
        assert identity == {"account": "alice", "tenant": "default", "source": "local", "profile": "default",
                            "workId": conversation_id, "grantId": identity["grantId"], "botId": lead,
                            "turnId": turn["id"]}  # fmt: skip
        stored = messages(alice, conversation_id)
        assert [m["role"] for m in stored] == ["user", "tool", "assistant"]
        assert not [m for m in stored if m["role"] == "system"]

        helper_chat = start_chat(alice, make_bot(alice, "Helper"))  # no team permission of its own
        plain = _turn(alice, helper_chat, "plain question")
        assert (plain["state"], plain["teamTools"]) == ("completed", False)
        bob_chat = start_chat(bob, make_bot(bob))
        assert _turn(bob, bob_chat, "plain question")["teamTools"] is False
        assert all(offered_team_tools(r) == [] for r in requests_with(node, "plain question"))
        assert [m["role"] for m in messages(bob, bob_chat)] == ["user", "assistant"]
    finally:
        alice.close()
        bob.close()
    assert audit_verifies(node.server.settings.data_dir)
