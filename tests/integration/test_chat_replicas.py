"""Chat turns on two PostgreSQL hub replicas of one database (scale.md 4.3, 4.4): one runner process behind a
round-robin TCP proxy in front of both, the Hermes fixture, and alice signed in on each replica. A chat turn is
driven by the replica holding its ``turn_lease``: a replica starting up does not take over another's running turn;
a replica whose lease was taken writes and interrupts nothing (test_chat_adoption: a replica that stops leaves its
running turn to the other, which adopts its channel); a stop accepted by the replica not driving the turn reaches the
one that does.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from talaria.clock import SystemClock
from talaria.hub.timings import HubTimings
from talaria.hub.turns.turn_leases import LeaseLost, SharedTurnLeases
from talaria.settings import Settings
from talaria.store.open import open_store
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database, raw_sql
from tests.conftest import add_account, login
from tests.hermes.chat_support import Stream, make_bot, messages, send, start_chat, wait_turn
from tests.integration.replicas_support import HOLD, chat_turn_channel, cluster, until

pytestmark = pytest.mark.usefixtures("fast_argon2")


def test_a_replica_starting_up_leaves_the_running_turn_of_another_alone(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    with cluster(postgres_server, tmp_path, names=("a",)) as both:
        turn_id = both.held_turn("a", "hold while b starts")
        stream = Stream(both.clients["a"], both.conversation_id)
        b = both.start("b", tmp_path)
        until(lambda: b.hub.chat_engine.scans or None)  # its first scan: the one that recovers a restart's turns
        assert both.holder(turn_id) == "a"
        both.hermes.delta_delay_for("hold while b starts", 0)
        done = wait_turn(both.clients["b"], both.conversation_id, turn_id, timeout=30)
        assert done["state"] == "completed", done
        kinds = [kind for _, kind, data in stream.of_turn(turn_id)]
        assert "turn.recovering" not in kinds, kinds
        [reply] = [m for m in messages(both.clients["b"], both.conversation_id) if m["role"] == "assistant"]
        assert reply["recovered"] is False
        assert both.hermes.prompt_count("hold while b starts") == 1
        stream.close()


def test_a_stop_accepted_by_the_replica_not_driving_the_turn_interrupts_it(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    with cluster(postgres_server, tmp_path) as both:
        turn_id = both.held_turn("a", "hold until stopped elsewhere")
        _driver, other = both.driver_and_other(turn_id)
        answer = both.clients[other].post(f"/api/conversations/{both.conversation_id}/turns/{turn_id}/stop")
        assert answer.status_code == 202, answer.text
        done = wait_turn(both.clients[other], both.conversation_id, turn_id, timeout=15)
        assert (done["state"], done["code"]) == ("interrupted", "stopped"), done
        interrupts = both.hermes.rpc_requests("session.interrupt")
        assert interrupts, "the driving replica interrupted the Hermes session"
        both.hermes.delta_delay_for("hold until stopped elsewhere", 0)


def test_a_replica_whose_turn_lease_was_taken_stops_driving_the_turn_without_a_write_or_an_interrupt(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    timings = HubTimings(turn_lease_renew_s=0.2)
    with cluster(postgres_server, tmp_path, timings=timings) as both:
        turn_id = both.held_turn("a", "hold while its lease moves")
        driver = both.hubs[until(lambda: both.holder(turn_id))]
        settings = Settings(database_url=both.url)
        before = raw_sql(settings, "SELECT * FROM chat_turn WHERE id = ?", turn_id)
        # as if another live replica had taken the lease: its counter moved on
        now = SystemClock().now_ms()
        raw_sql(settings, "INSERT INTO hub_replica VALUES ('rep_other', 'test', 'digest', ?, ?)", now, now)
        raw_sql(settings, "UPDATE turn_lease SET holder = 'rep_other', counter = counter + 1, expires_at = ? "
                "WHERE turn_id = ?", now + 60_000, turn_id)  # fmt: skip
        until(lambda: turn_id not in driver.hub.chat_engine.running or None)
        after = raw_sql(settings, "SELECT * FROM chat_turn WHERE id = ?", turn_id)
        assert {k: v for k, v in after[0].items() if v != before[0][k]} == {}, "nothing written"
        assert both.hermes.rpc_requests("session.interrupt") == [], "the session left running for its new driver"
        raw_sql(settings, "DELETE FROM hub_replica WHERE id = 'rep_other'")  # it died: the turn is taken again
        both.hermes.delta_delay_for("hold while its lease moves", 0)
        done = wait_turn(both.clients["a"], both.conversation_id, turn_id, timeout=60)
        assert done["state"] == "completed", done
        [reply] = [m for m in messages(both.clients["a"], both.conversation_id) if m["role"] == "assistant"]
        assert reply["recovered"] is False, "its own channel adopted again: the reply streamed"
        assert chat_turn_channel(both.url, turn_id)["owner_counter"] == 2
        assert both.hermes.prompt_count("hold while its lease moves") == 1
        assert both.hermes.rpc_requests("session.resume") == []


def test_chat_per_runner_holds_across_replicas(postgres_server: PostgresServer, tmp_path: Path) -> None:
    # a scans only when woken (its own acceptances and ends): the second turn, accepted by b, is b's to drive
    quiet = HubTimings(dispatcher_scan_s=3600)
    with cluster(postgres_server, tmp_path, names=("a",), timings=quiet, chat_per_runner=1) as both:
        first = both.held_turn("a", "hold the only chat slot")
        both.start("b", tmp_path, timings=HubTimings(), chat_per_runner=1)
        other = start_chat(both.clients["b"], make_bot(both.clients["b"], name="Second"))
        sent = send(both.clients["b"], other, "wait for the slot")
        assert sent.status_code == 202, sent.text
        second = sent.json()["turn"]["id"]
        waiting = until(lambda: turn_waiting(both.clients["b"], other, second))
        assert waiting.endswith(": busy"), waiting
        assert both.holder(second) == "b" and both.holder(first) == "a"
        assert both.hermes.prompt_count("wait for the slot") == 0
        both.hermes.delta_delay_for("hold the only chat slot", 0)
        assert wait_turn(both.clients["a"], both.conversation_id, first, timeout=30)["state"] == "completed"
        assert wait_turn(both.clients["b"], other, second, timeout=30)["state"] == "completed"
        assert both.hermes.prompt_count("wait for the slot") == 1


def test_dispatcher_per_runner_holds_across_replicas(postgres_server: PostgresServer, tmp_path: Path) -> None:
    with cluster(postgres_server, tmp_path, dispatcher_per_runner=1) as both:
        add_account(both.hubs["a"], "bob", "admin", allowed_profiles={"local": ["default"]})
        alice, bob = both.clients["a"], login(both.hubs["b"], "bob")
        both.hermes.delta_delay_for("held job", HOLD)
        jobs = []
        for n in (1, 2):
            task = alice.post("/api/tasks", json={"title": f"job {n}", "prompt": f"held job {n}", "cell": "local",
                                                  "profile": "default"}).json()["task"]  # fmt: skip
            assert alice.post(f"/api/tasks/{task['id']}/submit").status_code == 200
            approved = bob.post(f"/api/tasks/{task['id']}/approve")
            assert approved.status_code == 200, approved.text
            jobs.append(approved.json()["job"]["id"])
        both.hermes.wait_for(lambda: both.hermes.prompt_count("held job") == 1, timeout=30)
        dispatchers = [hub.hub.dispatcher for hub in both.hubs.values()]
        seen = [d.scans for d in dispatchers]
        until(lambda: all(d.scans >= s + 3 for d, s in zip(dispatchers, seen, strict=True)) or None)
        assert both.hermes.prompt_count("held job") == 1, "each replica's dispatcher scanned: the runner's one slot"
        states = sorted(bob.get(f"/api/jobs/{job_id}").json()["job"]["state"] for job_id in jobs)
        assert states == ["QUEUED", "RUNNING"], states
        [queued] = [j for j in jobs if bob.get(f"/api/jobs/{j}").json()["job"]["state"] == "QUEUED"]
        for client in (alice, bob):  # through either replica, whichever runs the other job
            reason = client.get(f"/api/jobs/{queued}").json()["job"]["waitingReason"]
            assert "is busy" in reason, reason
        both.hermes.delta_delay_for("held job", 0)
        for job_id in jobs:
            until(lambda j=job_id: bob.get(f"/api/jobs/{j}").json()["job"]["state"] == "SUCCEEDED" or None, 60)
        assert both.hermes.prompt_count("held job") == 2
        bob.close()


def turn_waiting(client: httpx.Client, conversation_id: str, turn_id: str) -> str | None:
    turn = client.get(f"/api/conversations/{conversation_id}/turns/{turn_id}").json()["turn"]
    reason: str | None = turn["waitingReason"]
    return reason


def test_a_turn_lease_is_taken_once_fenced_and_taken_over_from_a_replica_no_longer_live(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    with postgres_database(postgres_server, migrated=True) as url:
        store = open_store(Settings(data_dir=tmp_path, database_url=url))
        try:
            now = SystemClock().now_ms()
            for replica in ("rep_one", "rep_two"):
                raw_sql(Settings(database_url=url), "INSERT INTO hub_replica VALUES (?, 'test', 'digest', ?, ?)",
                        replica, now, now)  # fmt: skip
            one, two = SharedTurnLeases(store, "rep_one"), SharedTurnLeases(store, "rep_two")
            token = one.take("turn_1", unstarted=True, first_scan=False)
            assert token == 1
            assert two.take("turn_1", unstarted=True, first_scan=False) is None, "held by a live replica"
            assert two.elsewhere() == {"turn_1"} and one.elsewhere() == set()
            with store.write() as tx:
                one.check(tx, "turn_1", token)
            assert one.renew({"turn_1": token}) == set()
            raw_sql(Settings(database_url=url), "UPDATE hub_replica SET renewed_at = ? WHERE id = 'rep_one'",
                    now - 20_001)  # fmt: skip
            assert two.take("turn_1", unstarted=False, first_scan=False) == 2, "rep_one is no longer live"
            with pytest.raises(LeaseLost), store.write() as tx:
                one.check(tx, "turn_1", token)
            assert one.renew({"turn_1": token}) == {"turn_1"}
            one.release("turn_1", token)  # not its own any more: nothing changes
            rows = raw_sql(Settings(database_url=url), "SELECT holder, counter FROM turn_lease")
            assert rows == [{"holder": "rep_two", "counter": 2}]
            two.release("turn_1", 2)  # the turn is unknown, so it has ended: the row goes
            assert raw_sql(Settings(database_url=url), "SELECT * FROM turn_lease") == []
        finally:
            store.close()


def test_a_browser_on_the_replica_not_driving_a_turn_follows_it_and_resumes_through_the_other(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Scale.md 4.2: the events of a turn driven by one replica reach a stream on the other with strictly
    increasing ids and every delta once; a snapshot read there holds the draft of exactly the events up to its
    ``lastEventId``; a reconnect through the driving replica resumes without loss or repetition."""
    text = "stream it through the other replica"
    with cluster(postgres_server, tmp_path) as both:
        cid = both.conversation_id
        turn_id = both.held_turn("a", text)
        driver, other = both.driver_and_other(turn_id)
        stream = Stream(both.clients[other], cid, after=0)
        both.hermes.delta_delay_for(text, 1.0)
        stream.wait_for(lambda events: any(kind == "message.delta" for _, kind, _ in events))
        both.hermes.delta_delay_for(text, HOLD)  # the next delta waits: the turn stays live while the snapshot is read
        snapshot = both.clients[other].get(f"/api/conversations/{cid}/messages").json()
        last = snapshot["lastEventId"]
        seen = stream.wait_for(lambda events: any(i is not None and i >= last for i, _, _ in events))
        streamed = "".join(d["text"] for i, kind, d in seen if kind == "message.delta" and i is not None and i <= last)
        assert streamed and snapshot["liveTurn"]["draft"]["content"] == streamed
        both.hermes.delta_delay_for(text, 0)
        done = wait_turn(both.clients[other], cid, turn_id, timeout=30)
        assert done["state"] == "completed", done
        events = stream.wait_for(lambda got: any(kind == "turn.completed" for _, kind, _ in got))
        ids = [event_id for event_id, _, _ in events]
        assert ids == list(range(1, len(ids) + 1)), "every id once, in order, none missing"
        [reply] = [m for m in messages(both.clients[other], cid) if m["role"] == "assistant"]
        assert "".join(d["text"] for _, kind, d in events if kind == "message.delta") == reply["content"]
        middle = ids[len(ids) // 2]
        again = Stream(both.clients[driver], cid, last_event_id=middle)
        rest = again.wait_for(lambda got: len(got) >= len(ids) - middle)
        assert rest[: len(ids) - middle] == events[middle:], "the rest, through the other replica"
        stream.close()
        again.close()


def test_open_event_streams_count_across_replicas(postgres_server: PostgresServer, tmp_path: Path) -> None:
    with cluster(postgres_server, tmp_path) as both:
        path = f"/api/conversations/{both.conversation_id}/events"
        streams = [Stream(both.clients["ab"[i % 2]], both.conversation_id) for i in range(8)]
        assert [s.status for s in streams] == [200] * 8
        for name in ("a", "b"):
            refused = both.clients[name].get(path)
            assert (refused.status_code, refused.json()["code"]) == (429, "chat_stream_limit")
        for s in streams:
            s.close()
