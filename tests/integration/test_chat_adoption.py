"""A chat turn taken over by another PostgreSQL replica (scale.md 4.4: "chat turns recover alike via turn_lease"):
two replicas, one runner process behind a round-robin TCP proxy, the Hermes fixture. The replica driving a turn
stops while the turn streams; the other takes the turn's lease, adopts its gateway channel (owner counter + 1)
instead of resuming the session on a second one, and goes on from the stored draft after the turn's frame cursor
(scale.md 4.1): the frames it replays from the store and those that follow make the same events the first owner would
have made, so a browser's stream gets each delta once and none is missing. Nothing is prompted or resumed again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from talaria.hub.timings import HubTimings
from talaria.settings import Settings
from talaria.testing.postgres_server import PostgresServer
from tests.backends import raw_sql
from tests.hermes.chat_support import Stream, messages, wait_turn
from tests.integration.replicas_support import HOLD, Cluster, chat_turn_channel, cluster, until

pytestmark = pytest.mark.usefixtures("fast_argon2")

LONG_REPLY = " ".join(f"Part {n} of a long answer." for n in range(1, 41))


@dataclass
class Streaming:
    """A turn that streamed some deltas through ``driver`` and holds before the next; ``stream`` follows the
    conversation on ``other``; ``before``: its channel's row then."""

    both: Cluster
    text: str
    turn_id: str
    driver: str
    other: str
    stream: Stream
    before: dict[str, Any]

    def adopted(self, by: str | None = None, counter: int = 2) -> dict[str, Any]:
        """The channel's row once replica ``by`` (default: ``other``) adopted it, at owner counter ``counter``."""

        def counted() -> dict[str, Any] | None:
            row = chat_turn_channel(self.both.url, self.turn_id)
            return row if row["owner_counter"] >= counter else None

        row = until(counted, timeout=60, what=f"a replica to adopt the turn's channel at counter {counter}")
        owner = self.both.replica_of(by or self.other)
        assert (row["owner_replica"], row["owner_counter"]) == (owner, counter), "adopted once, by that replica"
        assert row["connection_id"] == self.before["connection_id"], "the same channel"
        return row

    def events(self, last: str) -> list[tuple[int | None, str, dict[str, Any]]]:
        """The stream's events once ``last`` arrived; their ids are every id once, in order."""
        events = self.stream.wait_for(lambda got: any(kind == last for _, kind, _ in got))
        ids = [event_id for event_id, _, _ in events]
        assert ids == list(range(1, len(ids) + 1)), "every id once, in order, none missing"
        return events

    def reply(self) -> dict[str, Any]:
        [reply] = [m for m in messages(self.both.clients[self.other], self.both.conversation_id)
                   if m["role"] == "assistant"]  # fmt: skip
        return reply


@contextmanager
def streaming(
    server: PostgresServer, tmp_path: Path, text: str, timings: HubTimings | None = None
) -> Iterator[Streaming]:
    with cluster(server, tmp_path, timings=timings) as both:
        both.hermes.reply_for(text, LONG_REPLY)
        both.hermes.knobs.delta_count = 20
        turn_id = both.held_turn("a", text)
        driver, other = both.driver_and_other(turn_id)
        stream = Stream(both.clients[other], both.conversation_id, after=0)
        both.hermes.delta_delay_for(text, 0.2)
        stream.wait_for(lambda events: sum(kind == "message.delta" for _, kind, _ in events) >= 3)
        both.hermes.delta_delay_for(text, HOLD)  # the next delta waits while the driver stops
        before = chat_turn_channel(both.url, turn_id)
        assert (before["owner_replica"], before["owner_counter"]) == (both.replica_of(driver), 1)
        assert before["runtime_session_id"] and before["frame_seq"] >= before["first_seq"] + 2, "the cursor moved"
        try:
            yield Streaming(both, text, turn_id, driver, other, stream, before)
        finally:
            stream.close()


def deltas_of(events: list[tuple[int | None, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [data for _, kind, data in events if kind == "message.delta"]


def test_a_replica_that_stops_mid_stream_leaves_its_turn_to_the_other_which_streams_on_through_the_same_channel(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    with streaming(postgres_server, tmp_path, "stream while its driver stops") as turn:
        both = turn.both
        both.stop(turn.driver)  # its engine leaves the turn running in Hermes, its channel open
        turn.adopted()
        both.hermes.delta_delay_for(turn.text, 0)
        done = wait_turn(both.clients[turn.other], both.conversation_id, turn.turn_id, timeout=60)
        assert done["state"] == "completed", done

        events = turn.events("turn.completed")
        kinds = [kind for _, kind, _ in events]
        assert kinds.index("turn.recovering") < max(i for i, kind in enumerate(kinds) if kind == "message.delta")
        reply, deltas = turn.reply(), deltas_of(events)
        assert "".join(d["text"] for d in deltas) == reply["content"] == LONG_REPLY, "each delta once, none missing"
        assert {d["messageId"] for d in deltas} == {reply["id"]}, "the draft went on under its message id"
        assert reply["recovered"] is False, "it streamed to its end"
        assert both.hermes.prompt_count(turn.text) == 1
        assert both.hermes.rpc_requests("session.resume") == [], "adopted, not resumed on a second channel"
        assert both.hermes.rpc_requests("session.active_list"), "the new owner asked whether the turn runs"

        def closed_row() -> dict[str, Any] | None:
            row = chat_turn_channel(both.url, turn.turn_id)
            return row if row["closed_at"] else None

        closed = until(closed_row, what="the adopted channel to close")
        assert closed["owner_counter"] == 2, "closed by its new owner"
        lease = "SELECT * FROM turn_lease WHERE turn_id = ?"
        until(lambda: raw_sql(Settings(database_url=both.url), lease, turn.turn_id) == [] or None,
              what="the ended turn's lease row to go")  # fmt: skip


def test_a_turn_that_ended_while_no_replica_owned_it_is_completed_from_the_frames_stored_meanwhile(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    # the replicas scan only when woken: the other one takes the turn once its frames are all stored
    quiet = HubTimings(dispatcher_scan_s=3600)
    with streaming(postgres_server, tmp_path, "end while nobody owns it", quiet) as turn:
        both = turn.both
        settings = Settings(database_url=both.url)
        both.stop(turn.driver)
        both.hermes.delta_delay_for(turn.text, 0)
        connection = turn.before["connection_id"]
        ended = "SELECT seq FROM runner_event WHERE connection_id = ? AND frame LIKE '%\"message.complete\"%'"
        until(lambda: raw_sql(settings, ended, connection) or None, what="the turn's end stored")
        assert chat_turn_channel(both.url, turn.turn_id)["owner_counter"] == 1, "nobody owns it yet"
        raw_sql(settings, "SELECT pg_notify('talaria_turn', ?)", turn.turn_id)  # as a replica's change would
        turn.adopted()
        done = wait_turn(both.clients[turn.other], both.conversation_id, turn.turn_id, timeout=60)
        assert done["state"] == "completed", done
        reply, deltas = turn.reply(), deltas_of(turn.events("turn.completed"))
        assert "".join(d["text"] for d in deltas) == reply["content"] == LONG_REPLY
        assert reply["recovered"] is False, "completed from its frames, not from the history"
        assert both.hermes.rpc_requests("session.active_list") == [], "its end was among the frames replayed"
        assert both.hermes.rpc_requests("session.resume") == []
        assert both.hermes.prompt_count(turn.text) == 1


def test_a_turn_that_ends_while_its_new_owner_asks_whether_it_runs_is_completed_from_its_frames(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    with streaming(postgres_server, tmp_path, "end while asked") as turn:
        both = turn.both
        both.hermes.delay_method("session.active_list", 1.0)  # answered once the turn has ended: idle
        both.stop(turn.driver)
        turn.adopted()
        both.hermes.delta_delay_for(turn.text, 0)
        done = wait_turn(both.clients[turn.other], both.conversation_id, turn.turn_id, timeout=60)
        assert done["state"] == "completed", done
        assert len(both.hermes.rpc_requests("session.active_list")) == 1
        reply, deltas = turn.reply(), deltas_of(turn.events("turn.completed"))
        assert "".join(d["text"] for d in deltas) == reply["content"] == LONG_REPLY, "its end frames were awaited"
        assert reply["recovered"] is False
        assert both.hermes.prompt_count(turn.text) == 1


def test_a_stop_of_an_adopted_turn_interrupts_it_through_the_adopted_channel_and_keeps_its_partial_reply(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    with streaming(postgres_server, tmp_path, "stop it once adopted") as turn:
        both = turn.both
        both.stop(turn.driver)
        turn.adopted()
        path = f"/api/conversations/{both.conversation_id}/turns/{turn.turn_id}/stop"
        answer = both.clients[turn.other].post(path)
        assert answer.status_code == 202, answer.text
        done = wait_turn(both.clients[turn.other], both.conversation_id, turn.turn_id, timeout=15)
        assert (done["state"], done["code"]) == ("interrupted", "stopped"), done
        [interrupt] = both.hermes.rpc_requests("session.interrupt")
        assert interrupt.params["session_id"] == turn.before["runtime_session_id"], "the adopted session"
        reply, deltas = turn.reply(), deltas_of(turn.events("turn.interrupted"))
        assert reply["status"] == "interrupted"
        assert reply["content"] == "".join(d["text"] for d in deltas) != "", "the partial reply: what streamed"
        assert LONG_REPLY.startswith(reply["content"]) and reply["content"] != LONG_REPLY
        assert both.hermes.rpc_requests("session.resume") == []
        both.hermes.delta_delay_for(turn.text, 0)


def test_a_replica_that_stops_while_it_follows_an_adopted_turn_leaves_the_channel_to_a_third_which_adopts_it_again(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    with streaming(postgres_server, tmp_path, "adopted twice") as turn:
        both = turn.both
        both.stop(turn.driver)
        turn.adopted()
        both.start("c", tmp_path)
        both.stop(turn.other)  # as its first owner did: the turn left running in Hermes, its channel open
        turn.adopted(by="c", counter=3)
        both.hermes.delta_delay_for(turn.text, 0)
        done = wait_turn(both.clients["c"], both.conversation_id, turn.turn_id, timeout=60)
        assert done["state"] == "completed", done
        whole = Stream(both.clients["c"], both.conversation_id, after=0)
        try:
            events = whole.wait_for(lambda got: any(kind == "turn.completed" for _, kind, _ in got))
        finally:
            whole.close()
        [reply] = [m for m in messages(both.clients["c"], both.conversation_id) if m["role"] == "assistant"]
        assert "".join(d["text"] for d in deltas_of(events)) == reply["content"] == LONG_REPLY
        assert both.hermes.rpc_requests("session.interrupt") == [], "no owner that stopped interrupted the turn"
        assert both.hermes.rpc_requests("session.resume") == []
        assert both.hermes.prompt_count(turn.text) == 1
