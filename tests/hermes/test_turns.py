"""Turns through hub → runner → real Hermes → scripted model (hermes.md 4, 5, 11)."""

from __future__ import annotations

import base64
import json
from typing import Any

from talaria.hub.turns.driver import TurnResult
from talaria.testing.model_server import reply, when
from tests.hermes.conftest import Node


def history(node: Node, stored_id: str, profile: str = "default") -> list[dict[str, Any]]:
    """The transcript read back through the runner's read-only http kind."""
    search = f"?profile={profile}&limit=500&offset=0"
    answer = node.call(
        node.server.hub.channels.http(
            node.runner_id, node.account(), f"/api/sessions/{stored_id}/messages", search=search, profile=profile
        )
    )
    assert answer["status"] == 200, answer
    messages: list[dict[str, Any]] = json.loads(base64.b64decode(answer["body"]))["messages"]
    return messages


def test_a_turn_streams_deltas_to_message_complete_and_the_history_holds_it(node: Node) -> None:
    node.model.script(when("tell me a story", reply("Once upon a time, a scripted model told a story.")))
    result = node.turn("tell me a story", tools=False)
    assert isinstance(result, TurnResult), result
    assert result.status == "complete"
    assert result.text == "Once upon a time, a scripted model told a story."
    assert [e["type"] for e in result.events].count("message.delta") >= 1
    assert "".join(result.deltas()) == result.text
    assert result.events[-1]["type"] == "message.complete"
    assert node.model.turn_starts(result.marker) == 1
    assert result.stored_id
    rows = history(node, result.stored_id)
    users = [r for r in rows if r["role"] == "user"]
    assert users and users[-1]["content"] == f"tell me a story\n{result.marker}"
    assert rows[-1]["role"] == "assistant" and rows[-1]["content"] == result.text


def test_team_tools_whoami_returns_the_server_bound_identity(node: Node) -> None:
    from talaria.testing.model_server import ToolSelector, tool_call

    spoof = {"account": "mallory", "tenant": "evil", "workId": "other"}
    node.model.script(when("who am i", tool_call(ToolSelector("team_", "talaria_whoami"), spoof), reply("done")))
    result = node.turn("who am i", work_id="job-7")
    assert isinstance(result, TurnResult), result
    assert result.status == "complete" and result.text == "done"
    chats = node.model.chat_requests()
    tool_messages = [m for r in chats for m in r.body["messages"] if m.get("role") == "tool"]
    assert tool_messages, [r.tools for r in chats]
    identity = json.loads(tool_messages[-1]["content"])
    assert identity["account"] == "alice" and identity["workId"] == "job-7"
    assert identity["source"] == "local" and identity["profile"] == "default"


def test_team_tools_bind_in_a_named_profile(node: Node) -> None:
    from talaria.testing.model_server import ToolSelector, tool_call

    node.model.script(when("work identity", tool_call(ToolSelector("team_", "talaria_whoami"), {}), reply("ok")))
    result = node.turn("work identity", profile="work", work_id="job-w")
    assert isinstance(result, TurnResult), result
    assert result.text == "ok"
    tool_messages = [m for r in node.model.chat_requests() for m in r.body["messages"] if m.get("role") == "tool"]
    identity = json.loads(tool_messages[-1]["content"])
    assert (identity["profile"], identity["workId"]) == ("work", "job-w")


def test_admins_see_the_hermes_version_and_plugin_readiness(node: Node) -> None:
    from tests.conftest import add_account, login

    add_account(node.server, "root", "admin", allowed_profiles={"local": ["default"]})
    admin = login(node.server, "root")
    try:
        body = admin.get(f"/api/admin/runners/{node.runner_id}/hermes").json()
    finally:
        admin.close()
    assert body["hermes"] == {"version": "0.19.0", "authRequired": False}
    assert body["teamTools"]["ready"] is True, body
    assert body["teamTools"]["toolSearch"] == "off" and body["teamTools"]["inProcess"] is True
