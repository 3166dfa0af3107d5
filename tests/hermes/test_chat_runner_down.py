"""Chat turns while the runner process is down (chat.md 5.3 step 2, 5.8; scenarios 9 and 12), with a ``talaria hub``
process, real runner processes and a real Hermes:

- the runner SIGKILLed while a turn streams, then started again: the turn becomes ``recovering`` and ends from
  Hermes' history, ``completed`` (the stored reply, ``recovered: true``) or ``uncertain`` (Hermes stored none);
  either is correct (chat.md 5), and the state must match what Hermes stored. The next turn works;
- a message sent while the runner is stopped: 202 ``pending``, ``turn.waiting`` naming the node, nothing sent;
  the runner started again, the turn completes.

The model sees each prompt once."""

from __future__ import annotations

import time
from collections.abc import Callable

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
    turn_of,
    wait_turn,
)
from tests.hermes.site_support import Site, stored_reply, turn_rows

# 38 chunks a quarter of a second apart after a 1 s first byte: still streaming when the runner dies and while
# the new one connects
LONG_REPLY = "word " * 60
LONG_REPLY_S = 1.0 + 38 * 0.25


def test_a_runner_killed_while_the_turn_streams_ends_it_from_hermes_history_and_the_prompt_is_seen_once(
    site: Site, hermes: RealHermes, model: ModelServer
) -> None:
    model.script(when("killed runner", slow(LONG_REPLY, first_byte_delay_s=1.0, chunk_delay_s=0.25)),
                 when("after the runner", reply("Back at work.")))  # fmt: skip
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    stream = Stream(alice, conversation_id)
    turn = send(alice, conversation_id, "keep writing while the killed runner is gone").json()["turn"]
    turn_id, marker = turn["id"], f"[talaria-run:{turn['id']}:{turn['triggerMessageId']}]"
    stream.wait_for(lambda events: any(k == "message.delta" and d["turnId"] == turn_id for _, k, d in events),
                    timeout=60)  # fmt: skip
    site.kill_runner()  # SIGKILL mid-stream: no goodbye, nothing interrupted by the runner
    site.start_runner()
    done = wait_turn(alice, conversation_id, turn_id, timeout=120)
    stream.wait_for(ended(turn_id))
    kinds = [k for _, k, _ in stream.of_turn(turn_id)]
    assert kinds[0] == "turn.started" and "turn.recovering" in kinds, kinds
    assert kinds.index("turn.recovering") < len(kinds) - 1 and kinds[-1] == f"turn.{done['state']}", kinds
    assert done["state"] in ("completed", "uncertain"), done
    assert turn_rows(hermes, marker) is not None, "Hermes has no row of the prompt"
    final = [m for m in messages(alice, conversation_id) if m["role"] == "assistant" and m["final"]]
    if done["state"] == "completed":
        assert done["code"] is None, done
        assert len(final) == 1 and final[0]["recovered"] is True and final[0]["status"] == "complete"
        assert final[0]["content"] == stored_reply(hermes, marker) == LONG_REPLY.strip()
    else:
        assert done["code"] == "runner_command_uncertain", done
        assert [m for m in final if m["status"] == "complete"] == []
        # uncertain only if Hermes never finished the run: no reply until well after an uncut one would be stored
        started = next(r.at for r in model.chat_requests() if r.tools and marker in (r.last_user or ""))
        while True:
            assert stored_reply(hermes, marker) is None, "Hermes stored a reply the hub called uncertain"
            if time.time() > started + LONG_REPLY_S + 5:
                break
            time.sleep(0.5)
    assert model.turn_starts(marker) == 1
    nxt = send(alice, conversation_id, "after the runner came back").json()["turn"]
    assert wait_turn(alice, conversation_id, nxt["id"], timeout=90)["state"] == "completed"
    assert model.turn_starts(marker) == 1
    assert model.turn_starts(f"[talaria-run:{nxt['id']}:") == 1
    stream.close()
    assert audit_verifies(site.data)
    said = ["keep writing while the killed runner is gone", "after the runner came back", "Back at work.",
            LONG_REPLY.strip()]  # fmt: skip
    assert_text_kept_out(said, site.data, *site.logs())


def test_a_turn_sent_while_the_node_is_offline_waits_for_it_and_completes_when_it_returns(
    site: Site, model: ModelServer
) -> None:
    model.script(when("offline node", reply("Here I am.")))
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    name = next(r["name"] for r in site.root.get("/api/admin/runners").json()["runners"] if r["id"] == site.runner_id)
    site.stop_runner()
    stream = Stream(alice, conversation_id)
    sent = send(alice, conversation_id, "a question for the offline node")
    assert sent.status_code == 202, sent.text
    turn = sent.json()["turn"]
    turn_id, marker = turn["id"], f"[talaria-run:{turn['id']}:{turn['triggerMessageId']}]"
    assert turn["state"] == "pending"
    reason = f"waiting for node {name} to connect"
    stream.wait_for(lambda events: any(k == "turn.waiting" and d["turnId"] == turn_id for _, k, d in events))
    waiting = [d for _, k, d in stream.of_turn(turn_id) if k == "turn.waiting"]
    assert waiting[0]["waitingReason"] == reason
    now = turn_of(alice, conversation_id, turn_id)
    assert (now["state"], now["waitingReason"]) == ("pending", reason), now
    assert model.turn_starts(marker) == 0  # nothing was sent
    site.start_runner()
    done = wait_turn(alice, conversation_id, turn_id, timeout=90)
    assert done["state"] == "completed", done
    assert done["waitingReason"] is None
    stream.wait_for(ended(turn_id))
    kinds = [k for _, k, _ in stream.of_turn(turn_id)]
    assert kinds[:2] == ["turn.started", "turn.waiting"] and kinds.count("turn.waiting") == 1, kinds
    assert kinds[-1] == "turn.completed", kinds
    final = [m for m in messages(alice, conversation_id) if m["role"] == "assistant"]
    assert [(m["content"], m["final"], m["recovered"]) for m in final] == [("Here I am.", True, False)]
    assert model.turn_starts(marker) == 1
    stream.close()
    assert audit_verifies(site.data)
    assert_text_kept_out(["a question for the offline node", "Here I am."], site.data, *site.logs())


def _stop_within_five_seconds(site: Site, stream: Stream, conversation_id: str, turn_id: str) -> dict[str, object]:
    asked = time.monotonic()
    stopped = site.alice.post(f"/api/conversations/{conversation_id}/turns/{turn_id}/stop")
    assert stopped.status_code == 202, stopped.text
    stream.wait_for(ended(turn_id), timeout=5)
    assert time.monotonic() - asked < 5
    done = turn_of(site.alice, conversation_id, turn_id)
    assert (done["state"], done["code"]) == ("interrupted", "stopped"), done
    return done


def test_a_recovering_turn_stops_within_five_seconds_and_its_session_is_interrupted_when_the_node_is_back(
    site: Site, hermes: RealHermes, model: ModelServer
) -> None:
    model.script(when("recovering", slow(LONG_REPLY, first_byte_delay_s=1.0, chunk_delay_s=0.25)))
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    stream = Stream(alice, conversation_id)

    def recovering(text: str, take_the_runner_down: Callable[[], object]) -> tuple[str, str]:
        turn = send(alice, conversation_id, text).json()["turn"]
        stream.wait_for(lambda events: any(k == "message.delta" and d["turnId"] == turn["id"] for _, k, d in events),
                        timeout=60)  # fmt: skip
        take_the_runner_down()
        stream.wait_for(lambda _: "turn.recovering" in [k for _, k, _ in stream.of_turn(turn["id"])], timeout=60)
        return turn["id"], f"[talaria-run:{turn['id']}:{turn['triggerMessageId']}]"

    # its node away (stopped): the stop ends it at once; nothing can be interrupted, the session is never reused
    first, _ = recovering("recovering while the node is away", site.stop_runner)
    _stop_within_five_seconds(site, stream, conversation_id, first)
    site.start_runner()

    # SIGKILLed and back at once, the recovery following the session: a cleanup-only channel interrupts it
    def kill_and_restart() -> None:
        site.kill_runner()
        site.start_runner()

    second, marker = recovering("recovering once the node is back", kill_and_restart)
    _stop_within_five_seconds(site, stream, conversation_id, second)
    assert model.turn_starts(marker) == 1
    started = next(r.at for r in model.chat_requests() if r.tools and marker in (r.last_user or ""))
    while time.time() < started + LONG_REPLY_S + 5:  # an uninterrupted run would have stored its reply by then
        assert stored_reply(hermes, marker) is None, "the stopped turn's session was not interrupted"
        time.sleep(0.5)
    assert not [m for m in messages(alice, conversation_id) if m["role"] == "assistant" and m["final"]]
    stream.close()
    assert audit_verifies(site.data)
    assert_text_kept_out(["recovering while the node is away", "recovering once the node is back"], site.data,
                         *site.logs())  # fmt: skip
