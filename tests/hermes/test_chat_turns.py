"""Chat turns on a real Hermes (chat.md 9, scenarios 1, 3, 4, 7, 8 and 15's prompt blocks): a ``talaria hub``
process, a real runner process, real ``hermes serve`` and the scripted model. Each test ends with ``audit verify``
passing and no message text in the audit table or the processes' logs."""

from __future__ import annotations

import threading
import time

import httpx

from talaria.testing.model_server import ModelServer, reply, slow, when
from talaria.testing.real_hermes import RealHermes
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
from tests.hermes.site_support import Site, sign_in, stored_reply, turn_rows


def _requests_with(model: ModelServer, text: str) -> list[str]:
    """The turns' model requests (those offering tools; Hermes' own title requests offer none) holding ``text``."""
    return [r.last_user or "" for r in model.chat_requests() if r.tools and text in (r.last_user or "")]


def _marker(turn: dict[str, str]) -> str:
    return f"[talaria-run:{turn['id']}:{turn['triggerMessageId']}]"


def test_a_reply_streams_live_and_the_next_turn_resumes_the_session(site: Site, model: ModelServer) -> None:
    model.script(when("hello", slow("Hello there, I am Helper and I stream.", chunk_delay_s=0.02)),
                 when("again", reply("Second answer.")))  # fmt: skip
    alice = site.alice
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
    first = _requests_with(model, "hello")
    assert len(first) == 1
    lines = first[0].split("\n")
    assert lines[:3] == ["[talaria-bot-instructions]", "Answer briefly.", "[/talaria-bot-instructions]"]
    assert lines[3] == "hello" and lines[4] == _marker(turn)
    # the next turn resumes the stored session: no instructions block, the earlier exchange in its history
    again = send(alice, conversation_id, "again please")
    assert again.status_code == 202, again.text
    second = wait_turn(alice, conversation_id, again.json()["turn"]["id"])
    assert second["state"] == "completed", second
    resumed = [r for r in model.chat_requests() if r.tools and "again please" in (r.last_user or "")]
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
    assert conversation["runnerId"] == site.runner_id and conversation["hermesSessionId"]
    stream.close()
    assert audit_verifies(site.data)
    said = ["Hello there, I am Helper and I stream.", "again please", "Second answer.", "Answer briefly."]
    assert_text_kept_out(said, site.data, *site.logs())


def test_one_live_turn_per_conversation_and_a_key_replays_the_accepted_send(site: Site, model: ModelServer) -> None:
    model.script(when("long", slow("word " * 40, chunk_delay_s=0.05)))
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    answers: list[httpx.Response] = []
    barrier = threading.Barrier(2)

    def post() -> None:
        client = sign_in(site.url, "alice")
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
    assert model.turn_starts("long again") == 1
    assert audit_verifies(site.data)
    assert_text_kept_out(["a long one", "long again", "something else", ("word " * 40).strip()], site.data,
                         *site.logs())  # fmt: skip


def test_stop_ends_the_turn_within_five_seconds_and_keeps_the_partial_reply(site: Site, model: ModelServer) -> None:
    model.script(when("endless", slow("word " * 400, chunk_delay_s=0.1)))
    alice = site.alice
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
    assert model.turn_starts("endless essay") == 1
    again = alice.post(f"/api/conversations/{conversation_id}/turns/{turn_id}/stop")
    assert again.status_code == 409 and again.json()["code"] == "turn_finished"
    audit = alice.get("/api/audit", params={"conversation": conversation_id}).json()["events"]
    end = next(e for e in audit if e["type"] == "chat.turn.ended" and e["subject"].get("turn") == turn_id)
    assert (end["reasonCode"], end["actor"]["principal"], end["actor"]["via"]) == (
        "stopped",
        "acct:default/alice",
        "web",
    )  # chat.md 8: the owner's
    # the next prompt opens a new session, with the replaced session's notice
    model.script(when("after the stop", reply("Fresh start.")))
    nxt = send(alice, conversation_id, "after the stop")
    assert wait_turn(alice, conversation_id, nxt.json()["turn"]["id"])["state"] == "completed"
    prompt = _requests_with(model, "after the stop")[0]
    assert prompt.startswith("[talaria-notice:session-replaced]")
    assert "User: an endless essay" in prompt
    stream.close()
    assert audit_verifies(site.data)
    assert_text_kept_out(["an endless essay", "after the stop", "Fresh start.", partial[0]["content"]], site.data,
                         *site.logs())  # fmt: skip


def test_archiving_ends_only_that_conversation_s_turn_and_archiving_the_bot_ends_the_others(
    site: Site, model: ModelServer
) -> None:
    model.script(when("essay", slow("word " * 400, chunk_delay_s=0.1)))
    alice, bob = site.alice, site.bob
    helper = make_bot(alice)
    a, b = start_chat(alice, helper), start_chat(alice, helper)
    c = start_chat(bob, make_bot(bob, name="Other"))
    turns = {cid: send(client, cid, f"essay {cid}").json()["turn"]["id"] for client, cid in
             ((alice, a), (alice, b), (bob, c))}  # fmt: skip
    model.wait_for(lambda log: all(sum(1 for r in log if f"essay {cid}" in (r.last_user or "")) for cid in turns),
                   timeout=60)  # fmt: skip
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
    assert len(ended_a) == 1 and ended_a[0]["actor"]["via"] == "web"
    assert ended_a[0]["reasonCode"] == "archived" and ended_a[0]["actor"]["principal"].endswith("/alice")
    for cid in turns:
        assert model.turn_starts(f"essay {cid}") == 1
    assert audit_verifies(site.data)
    assert_text_kept_out([f"essay {cid}" for cid in turns] + [("word " * 400).strip()], site.data, *site.logs())


def test_a_profile_removed_mid_turn_fails_her_turns_access_revoked_and_bob_s_completes(
    site: Site, hermes: RealHermes, model: ModelServer
) -> None:
    essay = "word " * 96  # 60 chunks, 6 s: cut by the revocation, short enough to wait out below
    model.script(when("alice essay", slow(essay, chunk_delay_s=0.1)),
                 when("alice work essay", slow(essay, chunk_delay_s=0.1)),
                 when("bob question", slow("Bob's answer, in a few words.", chunk_delay_s=0.3)))  # fmt: skip
    alice, bob, root = site.alice, site.bob, site.root
    mine = start_chat(alice, make_bot(alice))
    elsewhere = start_chat(alice, make_bot(alice, name="Worker", profile="work"))
    theirs = start_chat(bob, make_bot(bob, name="Bobs"))
    my_turn = send(alice, mine, "alice essay").json()["turn"]
    work_turn = send(alice, elsewhere, "an alice work essay").json()["turn"]
    model.wait_for(lambda log: all(any(text in (r.last_user or "") for r in log if r.tools)
                                   for text in ("alice essay", "alice work essay")), timeout=60)  # fmt: skip
    their_turn = send(bob, theirs, "bob question").json()["turn"]["id"]
    asked = time.monotonic()
    changed = root.patch("/api/admin/accounts/alice", json={"allowedProfiles": {"local": ["work"]}})
    assert changed.status_code == 200, changed.text
    done = wait_turn(alice, mine, my_turn["id"], timeout=5)
    # every unended turn of hers ends, also the one on a profile she keeps (chat.md 5.7)
    done_elsewhere = wait_turn(alice, elsewhere, work_turn["id"], timeout=5)
    assert time.monotonic() - asked < 5
    assert (done["state"], done["code"]) == ("failed", "access_revoked")
    assert (done_elsewhere["state"], done_elsewhere["code"]) == ("failed", "access_revoked")
    assert wait_turn(bob, theirs, their_turn)["state"] == "completed"
    profiles = alice.get("/api/bot-profiles").json()["profiles"]
    pairs = [{k: p[k] for k in ("source", "profile")} for p in profiles]
    assert {"source": "local", "profile": "default"} not in pairs
    assert {"source": "local", "profile": "work"} in pairs
    refused = send(alice, mine, "again")
    assert refused.status_code == 403 and refused.json()["code"] == "bot_not_allowed"
    events = root.get("/api/audit", params={"conversation": mine}).json()["events"]
    ended_events = [e for e in events if e["type"] == "chat.turn.ended"]
    assert len(ended_events) == 1 and ended_events[0]["actor"]["principal"].endswith("/root")
    assert ended_events[0]["reasonCode"] == "access_revoked"
    # no reply in Hermes' history: her prompts are stored there, and until well after the uncut replies would
    # have ended (hermes.md 11: an interrupted run leaves a bare user row), no reply follows them
    started = max(r.at for r in model.chat_requests() if r.tools and "alice" in (r.last_user or ""))
    uncut_end = started + 60 * 0.1 + 5
    while True:
        for turn, profile in ((my_turn, None), (work_turn, "work")):
            rows = turn_rows(hermes, _marker(turn), profile)
            assert rows is not None, "Hermes has no row of her prompt"
            assert stored_reply(hermes, _marker(turn), profile) is None, "a reply was stored after the revocation"
        if time.time() > uncut_end:
            break
        time.sleep(0.5)
    assert model.turn_starts(_marker(my_turn)) == 1 and model.turn_starts(_marker(work_turn)) == 1
    assert audit_verifies(site.data)
    said = ["alice essay", "an alice work essay", "bob question", "Bob's answer, in a few words.", essay.strip()]
    assert_text_kept_out(said, site.data, *site.logs())
