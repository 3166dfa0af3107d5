"""Chat turns on a real Hermes (chat.md 9, scenarios 1, 3, 4 and 15's prompt blocks): a hub, a real runner, real
``hermes serve`` and the scripted model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from talaria.testing.model_server import reply, slow, when
from tests.conftest import add_account, login
from tests.hermes.chat_support import (
    Stream,
    assert_text_kept_out,
    audit_verifies,
    ended,
    make_bot,
    messages,
    send,
    start_chat,
    wait_turn,
)
from tests.hermes.conftest import Node


@pytest.fixture
def alice(node: Node) -> Iterator[httpx.Client]:
    client = login(node.server, "alice")
    try:
        yield client
    finally:
        client.close()


def _requests_with(node: Node, text: str) -> list[str]:
    """The turns' model requests (those offering tools; Hermes' own title requests offer none) holding ``text``."""
    return [r.last_user or "" for r in node.model.chat_requests() if r.tools and text in (r.last_user or "")]


def test_a_reply_streams_live_and_the_next_turn_resumes_the_session(
    node: Node, alice: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    node.model.script(when("hello", slow("Hello there, I am Helper and I stream.", chunk_delay_s=0.02)),
                      when("again", reply("Second answer.")))  # fmt: skip
    bot_id = make_bot(alice, instructions="Answer briefly.")
    conversation_id = start_chat(alice, bot_id)
    stream = Stream(alice, conversation_id)
    stream.wait_for(lambda _: stream.status is not None, timeout=10)
    assert stream.status == 200
    sent = send(alice, conversation_id, "hello")
    assert sent.status_code == 202, sent.text
    turn = sent.json()["turn"]
    assert turn["state"] == "pending" and turn["trigger"] == "user"
    assert sent.json()["message"]["content"] == "hello"
    stream.wait_for(ended(turn["id"]))
    kinds = [k for _, k, _ in stream.of_turn(turn["id"])]
    assert kinds[0] == "turn.started"
    assert kinds[-1] == "turn.completed"
    deltas = [i for i, k in enumerate(kinds) if k == "message.delta"]
    assert len(deltas) >= 2 and deltas == list(range(deltas[0], deltas[0] + len(deltas)))  # consecutive
    finals = [d for _, k, d in stream.of_turn(turn["id"]) if k == "message.complete" and d["message"]["final"]]
    assert len(finals) == 1 and finals[0]["message"]["content"] == "Hello there, I am Helper and I stream."
    ids = [i for i, _, _ in stream.events if i is not None]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    streamed = "".join(d["text"] for _, k, d in stream.of_turn(turn["id"]) if k == "message.delta")
    assert streamed == finals[0]["message"]["content"]
    # the first request of the session carries the instructions block, then the text and the marker
    first = _requests_with(node, "hello")
    assert len(first) == 1
    lines = first[0].split("\n")
    assert lines[:3] == ["[talaria-bot-instructions]", "Answer briefly.", "[/talaria-bot-instructions]"]
    assert lines[3] == "hello" and lines[4] == f"[talaria-run:{turn['id']}:{turn['triggerMessageId']}]"
    # the next turn resumes the stored session: no instructions block, the earlier exchange in its history
    again = send(alice, conversation_id, "again please")
    assert again.status_code == 202, again.text
    second = wait_turn(alice, conversation_id, again.json()["turn"]["id"])
    assert second["state"] == "completed", second
    resumed = [r for r in node.model.chat_requests() if r.tools and "again please" in (r.last_user or "")]
    assert len(resumed) == 1
    assert "[talaria-bot-instructions]" not in (resumed[0].last_user or "")
    history = str(resumed[0].body.get("messages"))
    assert "Hello there, I am Helper and I stream." in history
    stored = messages(alice, conversation_id)
    assert [(m["role"], m["content"]) for m in stored] == [
        ("user", "hello"), ("assistant", "Hello there, I am Helper and I stream."),
        ("user", "again please"), ("assistant", "Second answer."),
    ]  # fmt: skip
    conversation = alice.get(f"/api/conversations/{conversation_id}").json()["conversation"]
    assert conversation["title"] == "hello" and conversation["messageCount"] == 4
    assert conversation["runnerId"] == node.runner_id and conversation["hermesSessionId"]
    stream.close()
    assert audit_verifies(node.server.settings.data_dir)
    said = ["Hello there, I am Helper and I stream.", "again please", "Second answer.", "Answer briefly."]
    assert_text_kept_out(said, node.server.settings.data_dir, caplog.text, node.runner.stderr, node.runner.stdout)


def test_one_live_turn_per_conversation_and_a_key_replays_the_accepted_send(node: Node, alice: httpx.Client) -> None:
    node.model.script(when("long", slow("word " * 40, chunk_delay_s=0.05)))
    conversation_id = start_chat(alice, make_bot(alice))
    answers: list[httpx.Response] = []
    barrier = threading.Barrier(2)

    def post() -> None:
        client = login(node.server, "alice")
        barrier.wait()
        answers.append(send(client, conversation_id, "a long one"))
        client.close()

    posts = [threading.Thread(target=post) for _ in range(2)]
    for t in posts:
        t.start()
    for t in posts:
        t.join()
    assert sorted(a.status_code for a in answers) == [202, 409]
    refused = next(a for a in answers if a.status_code == 409)
    assert refused.json()["code"] == "turn_in_progress"
    turn_id = next(a for a in answers if a.status_code == 202).json()["turn"]["id"]
    wait_turn(alice, conversation_id, turn_id)
    first = send(alice, conversation_id, "long again", **{"Idempotency-Key": "send-1"})
    assert first.status_code == 202
    replay = send(alice, conversation_id, "long again", **{"Idempotency-Key": "send-1"})
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    other = send(alice, conversation_id, "something else", **{"Idempotency-Key": "send-1"})
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    bad = send(alice, conversation_id, "x", **{"Idempotency-Key": "no spaces"})
    assert bad.status_code == 400 and bad.json()["code"] == "idempotency_key_invalid"
    wait_turn(alice, conversation_id, first.json()["turn"]["id"])
    assert node.model.turn_starts("long again") == 1


def test_stop_ends_the_turn_within_five_seconds_and_keeps_the_partial_reply(node: Node, alice: httpx.Client) -> None:
    node.model.script(when("endless", slow("word " * 400, chunk_delay_s=0.1)))
    conversation_id = start_chat(alice, make_bot(alice))
    stream = Stream(alice, conversation_id)
    sent = send(alice, conversation_id, "an endless essay")
    turn_id = sent.json()["turn"]["id"]
    stream.wait_for(lambda events: sum(1 for _, k, _ in events if k == "message.delta") >= 3)
    asked = time.monotonic()
    stopped = alice.post(f"/api/conversations/{conversation_id}/turns/{turn_id}/stop")
    assert stopped.status_code == 202 and stopped.json()["turn"]["stopRequested"] is True
    done = wait_turn(alice, conversation_id, turn_id, timeout=5)
    assert time.monotonic() - asked < 5
    assert (done["state"], done["code"]) == ("interrupted", "stopped"), done
    partial = [m for m in messages(alice, conversation_id) if m["role"] == "assistant"]
    assert len(partial) == 1 and partial[0]["status"] == "interrupted" and partial[0]["content"].startswith("word")
    assert node.model.turn_starts("endless essay") == 1
    again = alice.post(f"/api/conversations/{conversation_id}/turns/{turn_id}/stop")
    assert again.status_code == 409 and again.json()["code"] == "turn_finished"
    # the next prompt opens a new session, with the replaced session's notice
    node.model.script(when("after the stop", reply("Fresh start.")))
    nxt = send(alice, conversation_id, "after the stop")
    assert wait_turn(alice, conversation_id, nxt.json()["turn"]["id"])["state"] == "completed"
    prompt = _requests_with(node, "after the stop")[0]
    assert prompt.startswith("[talaria-notice:session-replaced]")
    assert "User: an endless essay" in prompt
    stream.close()
    assert audit_verifies(node.server.settings.data_dir)


def test_archiving_ends_only_that_conversation_s_turn_and_archiving_the_bot_ends_the_others(
    node: Node, alice: httpx.Client
) -> None:
    node.model.script(when("essay", slow("word " * 400, chunk_delay_s=0.1)))
    bob = login(node.server, "bob")
    helper = make_bot(alice)
    a, b = start_chat(alice, helper), start_chat(alice, helper)
    c = start_chat(bob, make_bot(bob, name="Other"))
    turns = {cid: send(client, cid, f"essay {cid}").json()["turn"]["id"] for client, cid in
             ((alice, a), (alice, b), (bob, c))}  # fmt: skip
    node.model.wait_for(lambda log: all(sum(1 for r in log if f"essay {cid}" in (r.last_user or "")) for cid in turns))
    assert alice.patch(f"/api/conversations/{a}", json={"archived": True}).status_code == 200
    done_a = wait_turn(alice, a, turns[a], timeout=5)
    assert (done_a["state"], done_a["code"]) == ("interrupted", "archived")
    assert alice.get(f"/api/conversations/{b}/turns/{turns[b]}").json()["turn"]["state"] == "running"
    assert alice.patch(f"/api/bots/{helper}", json={"archived": True}).status_code == 200
    done_b = wait_turn(alice, b, turns[b], timeout=5)
    assert (done_b["state"], done_b["code"]) == ("interrupted", "archived")
    assert bob.get(f"/api/conversations/{c}/turns/{turns[c]}").json()["turn"]["state"] == "running"
    refused = send(alice, b, "more")
    assert refused.status_code == 409 and refused.json()["code"] == "bot_archived"
    bob.post(f"/api/conversations/{c}/turns/{turns[c]}/stop")
    assert wait_turn(bob, c, turns[c], timeout=5)["code"] == "stopped"
    events = alice.get("/api/audit", params={"conversation": a}).json()["events"]
    ended_a = [e for e in events if e["type"] == "chat.turn.ended"]
    assert len(ended_a) == 1 and ended_a[0]["reasonCode"] == "archived" and ended_a[0]["actor"]["via"] == "web"
    bob.close()
    assert audit_verifies(node.server.settings.data_dir)


def test_a_profile_removed_mid_turn_fails_her_turns_access_revoked_and_bob_s_completes(
    node: Node, alice: httpx.Client
) -> None:
    node.model.script(when("alice essay", slow("word " * 400, chunk_delay_s=0.1)),
                      when("bob question", slow("Bob's answer, in a few words.", chunk_delay_s=0.3)))  # fmt: skip
    add_account(node.server, "root", "admin", allowed_profiles={"local": ["default"]})
    root, bob = login(node.server, "root"), login(node.server, "bob")
    mine = start_chat(alice, make_bot(alice))
    theirs = start_chat(bob, make_bot(bob, name="Bobs"))
    my_turn = send(alice, mine, "alice essay").json()["turn"]["id"]
    node.model.wait_for(lambda log: any("alice essay" in (r.last_user or "") for r in log))
    their_turn = send(bob, theirs, "bob question").json()["turn"]["id"]
    asked = time.monotonic()
    changed = root.patch("/api/admin/accounts/alice", json={"allowedProfiles": {"local": ["work"]}})
    assert changed.status_code == 200, changed.text
    done = wait_turn(alice, mine, my_turn, timeout=5)
    assert time.monotonic() - asked < 5
    assert (done["state"], done["code"]) == ("failed", "access_revoked")
    assert wait_turn(bob, theirs, their_turn)["state"] == "completed"
    profiles = alice.get("/api/bot-profiles").json()["profiles"]
    assert {"source": "local", "profile": "default"} not in [{k: p[k] for k in ("source", "profile")} for p in profiles]
    refused = send(alice, mine, "again")
    assert refused.status_code == 403 and refused.json()["code"] == "bot_not_allowed"
    events = root.get("/api/audit", params={"conversation": mine}).json()["events"]
    ended_events = [e for e in events if e["type"] == "chat.turn.ended"]
    assert len(ended_events) == 1 and ended_events[0]["actor"]["principal"].endswith("/root")
    root.close()
    bob.close()
    assert audit_verifies(node.server.settings.data_dir)
