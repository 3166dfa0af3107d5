"""Automatic turns (chat.md 5.10, scenario 16) on a real Hermes: enqueued in-process while a user turn is live,
they wait ``queued`` and then run oldest first, each trigger's ``message.complete`` (by ``talaria``) before its
``turn.started``; a fifth with four queued rolls its transaction back; stopping a queued turn ends it at once."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from talaria.chat import automatic
from talaria.chat.automatic import Enqueued
from talaria.errors import TalariaError
from talaria.testing.model_server import reply, slow, when
from tests.conftest import login
from tests.hermes.chat_support import Stream, audit_verifies, ended, make_bot, messages, send, start_chat, wait_turn
from tests.hermes.conftest import Node


@pytest.fixture
def alice(node: Node) -> Iterator[httpx.Client]:
    client = login(node.server, "alice")
    try:
        yield client
    finally:
        client.close()


def enqueue(node: Node, conversation_id: str, name: str) -> Enqueued:
    hub = node.server.hub
    with hub.store.write() as tx:
        made = automatic.enqueue(
            tx, conversation_id, content=f"Report {name} arrived.", prompt=f"report {name}: summarise it",
            reference=None, actor=hub.chat_engine.actor("default"), key=hub.chat_engine.key, now_ms=hub.clock.now_ms(),
        )  # fmt: skip
        staged = hub.chat_engine.stage_enqueued(tx, made)
    hub.chat_engine.announce(staged)
    return made


def test_automatic_turns_wait_queued_then_run_in_order(node: Node, alice: httpx.Client) -> None:
    node.model.script(when("long question", slow("word " * 60, chunk_delay_s=0.05)),
                      when("report first", reply("First report summarised.")),
                      when("report second", reply("Second report summarised.")))  # fmt: skip
    conversation_id = start_chat(alice, make_bot(alice))
    stream = Stream(alice, conversation_id)
    user_turn = send(alice, conversation_id, "a long question").json()["turn"]["id"]
    node.model.wait_for(lambda log: any("long question" in (r.last_user or "") for r in log))
    first, second = enqueue(node, conversation_id, "first"), enqueue(node, conversation_id, "second")
    assert first.turn is not None and second.turn is not None
    assert (first.turn.state, second.turn.state) == ("queued", "queued")
    stream.wait_for(ended(second.turn.id))
    events = stream.events
    position = {(k, d.get("turn", {}).get("id") or d.get("message", {}).get("id")): i
                for i, (_, k, d) in enumerate(events)}  # fmt: skip
    for made in (first, second):
        assert made.turn is not None
        trigger = position[("message.complete", made.message.id)]
        started = position[("turn.started", made.turn.id)]
        assert trigger < started
        data = events[started][2]
        assert data["turn"]["trigger"] == "automatic" and data["message"]["author"] == "talaria"
    assert position[("turn.completed", user_turn)] < position[("turn.started", first.turn.id)]
    assert position[("turn.completed", first.turn.id)] < position[("turn.started", second.turn.id)]
    for made, text in ((first, "report first"), (second, "report second")):
        assert made.turn is not None
        assert wait_turn(alice, conversation_id, made.turn.id)["state"] == "completed"
        # one turn started on it: Hermes' own title request for the session (no tools) may quote the latest user
        # message too, when it runs after the next turn began
        assert node.model.turn_starts(text) == 1
    contents = [m["content"] for m in messages(alice, conversation_id)]
    # the triggers are stored when enqueued (during the user turn); the replies as each turn ends
    assert contents[:3] == ["a long question", "Report first arrived.", "Report second arrived."]
    assert contents[4:] == ["First report summarised.", "Second report summarised."]
    stream.close()
    assert audit_verifies(node.server.settings.data_dir)


def test_a_fifth_queued_turn_rolls_back_and_a_queued_turn_stops_at_once(node: Node, alice: httpx.Client) -> None:
    node.model.script(when("endless", slow("word " * 400, chunk_delay_s=0.1)))
    conversation_id = start_chat(alice, make_bot(alice))
    user_turn = send(alice, conversation_id, "an endless essay").json()["turn"]["id"]
    node.model.wait_for(lambda log: any("endless" in (r.last_user or "") for r in log))
    queued = [enqueue(node, conversation_id, f"n{i}") for i in range(4)]
    before = len(messages(alice, conversation_id))
    with pytest.raises(TalariaError) as refused:
        enqueue(node, conversation_id, "fifth")
    assert refused.value.code == "turn_queue_full"
    assert len(messages(alice, conversation_id)) == before  # the caller's transaction rolled back
    target = queued[1].turn
    assert target is not None
    stopped = alice.post(f"/api/conversations/{conversation_id}/turns/{target.id}/stop")
    assert stopped.status_code == 202
    assert (stopped.json()["turn"]["state"], stopped.json()["turn"]["code"]) == ("interrupted", "stopped")
    alice.post(f"/api/conversations/{conversation_id}/turns/{user_turn}/stop")
    assert wait_turn(alice, conversation_id, user_turn, timeout=5)["code"] == "stopped"
    for made in (queued[0], queued[2], queued[3]):
        assert made.turn is not None
        assert wait_turn(alice, conversation_id, made.turn.id)["state"] == "completed"
    assert sum(1 for r in node.model.chat_requests() if "report n1" in (r.last_user or "")) == 0
    assert audit_verifies(node.server.settings.data_dir)
