"""A conversation whose node is re-registered (chat.md 5.4, 5.8, scenario 10) on a real Hermes, through a ``talaria
hub`` process and runner processes: after two turns on the old node, the admin disables it and registers another
(the admin API); the next turn runs on the new one in a fresh session whose prompt starts with the node-changed
notice and carries both exchanges, a system message names the new node, and no node path or resume crosses over."""

from __future__ import annotations

from talaria.testing.model_server import ModelServer, reply, when
from tests.hermes.chat_support import (
    assert_text_kept_out,
    audit_verifies,
    make_bot,
    messages,
    send,
    start_chat,
    wait_turn,
)
from tests.hermes.site_support import Site


def test_the_next_turn_after_a_node_switch_carries_the_transcript_with_its_notice(
    site: Site, model: ModelServer
) -> None:
    model.script(when("first", reply("One.")), when("second", reply("Two.")), when("third", reply("Three.")))
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    for text in ("the first question", "the second question"):
        turn_id = send(alice, conversation_id, text).json()["turn"]["id"]
        assert wait_turn(alice, conversation_id, turn_id)["state"] == "completed"
    old_session = alice.get(f"/api/conversations/{conversation_id}").json()["conversation"]["hermesSessionId"]
    new_id = site.switch_node()
    turn_id = send(alice, conversation_id, "the third question").json()["turn"]["id"]
    done = wait_turn(alice, conversation_id, turn_id)
    assert done["state"] == "completed" and done["carry"] == "node-changed", done
    assert done["runnerId"] == new_id
    prompt = next(r.last_user or "" for r in model.chat_requests()
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
    assert conversation["runnerId"] == new_id and conversation["hermesSessionId"] != old_session
    assert model.turn_starts(f"[talaria-run:{turn_id}:") == 1
    assert audit_verifies(site.data)
    texts = ["the first question", "the second question", "the third question", "One.", "Two.", "Three."]
    assert_text_kept_out(texts, site.data, *site.logs())
