"""Team tools in chat turns on real Hermes (chat.md 5.9): while the ``team`` set is not installed, a bot of an
owner with ``canManageTeam`` gets the catalog ``talaria_whoami`` alone, bound to the conversation's Hermes session
with the conversation as ``workId``; the identity it answers is the server-side turn's, whatever the model passes.
A bot of an owner without ``canManageTeam`` is offered no team tool and stores no notice."""

from __future__ import annotations

import json

import httpx

from talaria.testing.model_server import ToolSelector, reply, tool_call, when
from tests.conftest import login
from tests.hermes.chat_support import audit_verifies, make_bot, messages, send, start_chat, wait_turn
from tests.hermes.conftest import Node
from tests.hermes.team_support import TEAM, offered_team_tools, requests_with, tool_results


def _turn(client: httpx.Client, conversation_id: str, text: str) -> dict[str, object]:
    sent = send(client, conversation_id, text)
    assert sent.status_code == 202, sent.text
    return wait_turn(client, conversation_id, sent.json()["turn"]["id"], timeout=120)


def test_a_team_managing_owner_s_bot_calls_whoami_and_gets_the_turn_s_own_identity(node: Node) -> None:
    node.server.hub.accounts.update("alice", "default", {"canManageTeam": True})
    node.model.script(
        when("who runs this chat", tool_call(ToolSelector(TEAM, "talaria_whoami"), {"account": "mallory"}),
             reply("You are alice.")),
        when("plain question", reply("Plain answer.")),
    )  # fmt: skip
    alice, bob = login(node.server, "alice"), login(node.server, "bob")
    try:
        conversation_id = start_chat(alice, make_bot(alice))
        turn = _turn(alice, conversation_id, "who runs this chat")
        assert (turn["state"], turn["teamTools"]) == ("completed", True)
        asked = requests_with(node, "who runs this chat")
        assert offered_team_tools(asked[0]) != []
        identity = json.loads(tool_results(asked[-1])[-1])
        assert identity["account"] == "alice" and identity["tenant"] == "default"
        assert (identity["source"], identity["profile"], identity["workId"]) == ("local", "default", conversation_id)
        stored = messages(alice, conversation_id)
        assert [m["role"] for m in stored] == ["user", "tool", "assistant"]
        assert stored[-1]["content"] == "You are alice."
        assert not [m for m in stored if m["role"] == "system"]

        bob_chat = start_chat(bob, make_bot(bob))
        plain = _turn(bob, bob_chat, "plain question")
        assert (plain["state"], plain["teamTools"]) == ("completed", False)
        assert all(offered_team_tools(r) == [] for r in requests_with(node, "plain question"))
        assert [m["role"] for m in messages(bob, bob_chat)] == ["user", "assistant"]
    finally:
        alice.close()
        bob.close()
    assert audit_verifies(node.server.settings.data_dir)
