"""A replica SIGKILLed mid-turn (scale.md 6 scenario 7, the chat part; 4.4): replica ``a`` runs in the test
process, replica ``b`` is a real ``talaria hub`` process on the same PostgreSQL database, both behind a round-robin
TCP proxy, with a real ``talaria runner`` process and the Hermes fixture. ``b`` drives a chat turn that two
"browsers" follow, one through each replica; ``b`` is killed.

Then: the runner goes on through ``a`` without connecting again (same epoch, ``failover-v1``); ``a`` takes the turn
over once ``b``'s row is no longer live, adopts its channel and streams it on from the frame cursor without prompting
or resuming again; the browser that followed ``b`` resumes through ``a`` from the last id it got, and both browsers
end with the same events, ids strictly increasing with none missing, every delta once, the whole reply; the audit
chain verifies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from talaria.hub.timings import HubTimings
from talaria.testing.postgres_server import PostgresServer
from tests.hermes.chat_support import Stream, make_bot, messages, send, start_chat, wait_turn
from tests.integration.cli_support import clean_env
from tests.integration.replicas_support import HOLD, chat_turn_channel, cluster, replica_live, until

pytestmark = pytest.mark.usefixtures("fast_argon2")


def test_a_replica_killed_mid_turn_leaves_the_runner_the_turn_and_the_browsers_to_the_other(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    text = "hold while the driving replica is killed"
    # a scans only when woken (a message accepted there): the turn accepted by b is b's to drive
    quiet = HubTimings(dispatcher_scan_s=3600)
    with cluster(postgres_server, tmp_path, names=("a",), timings=quiet) as both:
        cid = both.conversation_id
        both.start_process("b", tmp_path)
        on_a = Stream(both.clients["a"], cid, after=0)
        turn_id = both.held_turn("b", text)
        assert both.holder(turn_id) == "b"
        on_b = Stream(both.clients["b"], cid, after=0)
        on_b.wait_for(lambda events: any(kind == "turn.started" for _, kind, _ in events))
        both.hermes.delta_delay_for(text, 1.0)
        on_b.wait_for(lambda events: any(kind == "message.delta" for _, kind, _ in events))
        both.hermes.delta_delay_for(text, HOLD)  # the turn stays in Hermes while its driver dies

        killed = both.kill("b")
        until(lambda: None if replica_live(both.url, killed) else True, timeout=40)
        seen_on_b = list(on_b.events)
        last_on_b = seen_on_b[-1][0]
        assert last_on_b is not None
        resumed = Stream(both.clients["a"], cid, last_event_id=last_on_b)  # the browser's reconnect, via a

        woken = send(both.clients["a"], start_chat(both.clients["a"], make_bot(both.clients["a"], name="W")), "wake")
        assert woken.status_code == 202, woken.text  # a's engine scans: b's turn is taken over
        until(lambda: both.holder(turn_id) == "a" or None)
        both.hermes.delta_delay_for(text, 0)
        done = wait_turn(both.clients["a"], cid, turn_id, timeout=60)
        assert done["state"] == "completed", done

        [reply] = [m for m in messages(both.clients["a"], cid) if m["role"] == "assistant" and m["turnId"] == turn_id]
        assert reply["recovered"] is False, "streamed to its end through the adopted channel"
        assert chat_turn_channel(both.url, turn_id)["owner_counter"] == 2, "b's channel adopted by a"
        assert both.hermes.rpc_requests("session.resume") == []
        assert both.hermes.prompt_count(text) == 1, "prompted once, by b"
        events = on_a.wait_for(lambda got: any(k == "turn.completed" and d["turn"]["id"] == turn_id
                                               for _, k, d in got))  # fmt: skip
        ids = [event_id for event_id, _, _ in events]
        assert ids == list(range(1, len(ids) + 1)), "every id once, in order, none missing"
        deltas = "".join(d["text"] for _, kind, d in events if kind == "message.delta" and d["turnId"] == turn_id)
        assert deltas == reply["content"], "no delta repeated, out of order or missing"
        rest = resumed.wait_for(lambda got: len(seen_on_b) + len(got) >= len(events))
        assert seen_on_b + rest[: len(events) - len(seen_on_b)] == events, "the reconnect lost and repeated nothing"

        assert both.runner.lines.count("runner connected") == 1, "the runner went on through a, same epoch"
        for stream in (on_a, on_b, resumed):
            stream.close()
        env = clean_env(TALARIA_DATABASE_URL=both.url)
        verified = subprocess.run([sys.executable, "-m", "talaria", "audit", "verify"], capture_output=True,
                                  text=True, env=env, timeout=60, check=False)  # fmt: skip
        assert verified.returncode == 0, verified.stdout + verified.stderr
