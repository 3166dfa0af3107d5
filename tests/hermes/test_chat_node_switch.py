"""A conversation whose node is re-registered (chat.md 5.4, 5.8, scenario 10) on a real Hermes: after two turns on
the old node, the next turn runs on the new one in a fresh session whose prompt starts with the node-changed notice
and carries both exchanges, a system message names the new node, and no node path or resume crosses over."""

from __future__ import annotations

from pathlib import Path

from talaria.hub.runners.registry import parse_registration
from talaria.testing.model_server import reply, when
from tests.conftest import login
from tests.hermes.chat_support import audit_verifies, make_bot, messages, send, start_chat, wait_turn
from tests.hermes.conftest import PROFILES, Node
from tests.integration.runner_support import RunnerProcess, wait_until, write_config


def test_the_next_turn_after_a_node_switch_carries_the_transcript_with_its_notice(node: Node, tmp_path: Path) -> None:
    node.model.script(when("first", reply("One.")), when("second", reply("Two.")), when("third", reply("Three.")))
    alice = login(node.server, "alice")
    conversation_id = start_chat(alice, make_bot(alice))
    for text in ("the first question", "the second question"):
        turn_id = send(alice, conversation_id, text).json()["turn"]["id"]
        assert wait_turn(alice, conversation_id, turn_id)["state"] == "completed"
    hub = node.server.hub
    old_session = alice.get(f"/api/conversations/{conversation_id}").json()["conversation"]["hermesSessionId"]
    node.runner.stop()
    assert hub.registry.disable(node.runner_id)
    fields = parse_registration(
        {"name": "node-2", "allowedProfiles": list(PROFILES), "hermesURL": node.hermes.url},
        default_server_url=node.server.url,
    )
    registration = hub.registry.register("default", fields)
    token_file = node.config_path.parent / "hermes-token"
    path = write_config(tmp_path / "node-2", registration.config | {"hermesTokenFile": str(token_file)})
    second = RunnerProcess(path, tmp_path / "logs", name="runner-2")
    try:
        second.wait_for("runner connected")
        wait_until(lambda: hub.runners.is_connected(registration.runner.id), what="the new runner's state")
        turn_id = send(alice, conversation_id, "the third question").json()["turn"]["id"]
        done = wait_turn(alice, conversation_id, turn_id)
        assert done["state"] == "completed" and done["carry"] == "node-changed", done
        assert done["runnerId"] == registration.runner.id
        prompt = next(r.last_user or "" for r in node.model.chat_requests()
                      if r.tools and "the third question" in (r.last_user or ""))  # fmt: skip
        lines = prompt.split("\n")
        assert lines[0].startswith("[talaria-notice:node-changed] ")
        assert lines[1] == "[talaria-transcript]"
        transcript = prompt[prompt.index("[talaria-transcript]") : prompt.index("[/talaria-transcript]")]
        for said in ("User: the first question", "Assistant: One.", "User: the second question", "Assistant: Two."):
            assert said in transcript
        assert lines[-2] == "the third question" and lines[-1].startswith(f"[talaria-run:{turn_id}:")
        system = [m["content"] for m in messages(alice, conversation_id) if m["role"] == "system"]
        assert system == ["This chat now runs on node node-2. The bot received the recent transcript; files from the "
                          "previous node were not carried over."]  # fmt: skip
        conversation = alice.get(f"/api/conversations/{conversation_id}").json()["conversation"]
        assert conversation["runnerId"] == registration.runner.id and conversation["hermesSessionId"] != old_session
    finally:
        second.stop()
        second.close()
        alice.close()
    assert audit_verifies(node.server.settings.data_dir)
