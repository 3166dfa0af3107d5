"""Chat turns through a hub process that is killed and restarted (chat.md 5.8, scenario 9), with a real ``talaria
hub`` process, a real runner process and a real Hermes: a turn whose reply Hermes stored while the hub hung ends
``completed`` from the history (``recovered: true``); a turn killed while it streamed (and the hub away past the
runner's 20 s of riding out, ``failover-v1``) ends ``uncertain`` and the
next turn starts a new session with the replaced session's notice; a reconnecting stream gets ``stream.reset``.
The model sees each prompt once; no message text reaches the audit table or the processes' logs."""

from __future__ import annotations

import os
import signal
import time

from talaria.testing.model_server import ModelServer, reply, slow, when
from talaria.testing.real_hermes import RealHermes
from tests.hermes.chat_support import (
    Stream,
    assert_text_kept_out,
    audit_verifies,
    make_bot,
    messages,
    send,
    start_chat,
    wait_turn,
)
from tests.hermes.site_support import Site, sign_in, stored_reply


def seen(model: ModelServer, text: str) -> int:
    return sum(1 for r in model.chat_requests() if r.tools and text in (r.last_user or ""))


def test_a_hub_that_hung_and_was_killed_mid_turn_completes_the_turn_from_the_history(
    site: Site, hermes: RealHermes, model: ModelServer
) -> None:
    text = "the answer " * 8
    model.script(when("hung hub", slow(text, first_byte_delay_s=1.0, chunk_delay_s=0.25)))
    conversation_id = start_chat(site.alice, make_bot(site.alice))
    stream = Stream(site.alice, conversation_id)
    sent = send(site.alice, conversation_id, "finish this while the hung hub waits").json()
    turn_id, marker = sent["turn"]["id"], f"[talaria-run:{sent['turn']['id']}:"
    model.wait_for(lambda log: any("hung hub" in (r.last_user or "") for r in log), timeout=60)
    stream.wait_for(lambda events: any(k == "turn.started" for _, k, _ in events))
    last_seen = max(i for i, _, _ in stream.events if i is not None)
    os.kill(site.hub.proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 60
    while stored_reply(hermes, marker) is None:
        assert time.monotonic() < deadline, "Hermes never stored the reply"
        time.sleep(0.2)
    site.kill_hub()
    stream.close()
    site.restart_hub()
    site.runner.wait_for("runner connected", count=2, timeout=60)
    alice = sign_in(site.url, "alice")
    resumed = Stream(alice, conversation_id, last_event_id=last_seen)
    resumed.wait_for(bool)
    assert resumed.events[0][1] == "stream.reset" and resumed.events[0][0] is None
    done = wait_turn(alice, conversation_id, turn_id, timeout=90)
    assert done["state"] == "completed", done
    final = [m for m in messages(alice, conversation_id) if m["role"] == "assistant"]
    assert len(final) == 1 and final[0]["recovered"] is True and final[0]["content"] == text.strip()
    assert seen(model, "hung hub") == 1
    resumed.close()
    alice.close()
    assert audit_verifies(site.tmp / "data")
    assert_text_kept_out(["finish this while the hung hub waits", text.strip()], site.data, *site.logs())


def test_a_hub_killed_while_the_turn_streams_ends_it_uncertain_and_the_next_turn_replaces_the_session(
    site: Site, hermes: RealHermes, model: ModelServer
) -> None:
    # 40 s of streaming: the turn still runs when the runner's 20 s of riding out the hub's absence end
    model.script(when("killed hub", slow("word " * 160, first_byte_delay_s=1.0, chunk_delay_s=0.25)),
                 when("after the crash", reply("A fresh session.")))  # fmt: skip
    conversation_id = start_chat(site.alice, make_bot(site.alice))
    turn_id = send(site.alice, conversation_id, "keep writing when the killed hub is gone").json()["turn"]["id"]
    model.wait_for(lambda log: any("killed hub" in (r.last_user or "") for r in log), timeout=60)
    site.kill_hub()
    site.runner.wait_for("runner disconnected: transport", timeout=45)
    site.restart_hub()
    alice = sign_in(site.url, "alice")
    done = wait_turn(alice, conversation_id, turn_id, timeout=90)
    assert (done["state"], done["code"]) == ("uncertain", "runner_command_uncertain"), done
    marker = f"[talaria-run:{turn_id}:"
    assert seen(model, marker) == 1
    nxt = send(alice, conversation_id, "after the crash").json()["turn"]["id"]
    assert wait_turn(alice, conversation_id, nxt, timeout=90)["state"] == "completed"
    prompt = next(r.last_user or "" for r in model.chat_requests() if "after the crash" in (r.last_user or ""))
    assert prompt.startswith("[talaria-notice:session-replaced]")
    assert seen(model, marker) == 1
    alice.close()
    assert audit_verifies(site.tmp / "data")
    said = ["keep writing when the killed hub is gone", "after the crash", "A fresh session.", ("word " * 160).strip()]
    assert_text_kept_out(said, site.data, *site.logs())
