"""Chat stream events of PostgreSQL replicas (scale.md 4.2, 3.7) on a real database: two ``SharedChatEvents`` on
two stores of one database stand for two replicas. Ids strictly increase per conversation whichever replica
writes, starting above the conversation's reserved ids; a subscription on one replica gets what the other issues,
in order, woken by a notification or by the fallback; a resume through the other replica loses and repeats
nothing; chat.md 4.2's resume rules hold at their edges (retained count, idle time); a snapshot's draft and last id
are those of its transaction; a rolled-back change issues nothing; and open streams count across replicas."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from talaria.clock import ManualClock
from talaria.hub.chat.delivery import ChatEvent, Subscription
from talaria.hub.chat.shared_events import SharedChatEvents
from talaria.hub.chat.shared_streams import SharedChatStreams
from talaria.hub.chat.stream_events import EVENTS_EXPIRED, RESET, UNKNOWN_EVENT_ID
from talaria.hub.replica import LIVE_MS
from talaria.store.postgres.store import PostgresStore
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database
from tests.integration.writers_support import seed_conversations

CID = "cnv_01STREAM"
START = 1_700_000_000_000


@dataclass
class Pair:
    url: str
    clock: ManualClock
    stores: list[PostgresStore]
    replicas: list[SharedChatEvents]

    def replica(self, *, listen: bool = True, fallback_ms: int = 100, **limits: Any) -> SharedChatEvents:
        store = PostgresStore(self.url)
        self.stores.append(store)
        signals = store.signals(listen=listen)
        events = SharedChatEvents(store, self.clock, signals, fallback_ms=fallback_ms, **limits)
        signals.start()
        self.replicas.append(events)
        return events


@pytest.fixture
def pair(postgres_server: PostgresServer) -> Iterator[Pair]:
    with postgres_database(postgres_server, migrated=True) as url:
        made = Pair(url, ManualClock(START), [], [])
        seed = PostgresStore(url)
        made.stores.append(seed)
        seed_conversations(seed, CID, "cnv_01OTHER")
        try:
            yield made
        finally:
            for events in made.replicas:
                events.close_all()  # its follower ends before its store closes
            for store in made.stores:
                store.close()


def read(subscription: Subscription, count: int, timeout: float = 10) -> list[ChatEvent]:
    """The next ``count`` events of the subscription (fewer if it ends or ``timeout`` passes)."""

    async def take() -> list[ChatEvent]:
        got: list[ChatEvent] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(got) < count and (left := deadline - loop.time()) > 0:
            event = await subscription.next(left)
            if event is None:
                break
            got.append(event)
        return got

    return asyncio.run(take())


def until(done: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def ids(events: list[ChatEvent]) -> list[int | None]:
    return [event.id for event in events]


def emit(events: SharedChatEvents, n: int, conversation_id: str = CID) -> list[int]:
    return [events.emit(conversation_id, "turn.waiting", {"n": i}) for i in range(n)]


def test_ids_strictly_increase_across_replicas_from_above_the_reserved_ones(pair: Pair) -> None:
    a, b = pair.replica(), pair.replica()
    with a.store.write() as tx:  # a SQLite hub's reserved block, as db copy brings it
        tx.one("chat_conversation_reserve_events", id=CID, block=1000)
    assert a.last_event_id(CID) == 1000
    issued: list[int] = []
    lock = threading.Lock()

    def writer(events: SharedChatEvents) -> None:
        for made in emit(events, 40):
            with lock:
                issued.append(made)

    threads = [threading.Thread(target=writer, args=(events,)) for events in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(issued) == list(range(1001, 1081)), "every id once, none skipped"
    assert a.last_event_id(CID) == b.last_event_id(CID) == 1080
    assert b.last_event_id("cnv_01OTHER") == 0, "per conversation"
    assert emit(b, 1, "cnv_01OTHER") == [1]


def test_a_subscription_on_one_replica_gets_what_the_other_issues_in_order(pair: Pair) -> None:
    a, b = pair.replica(), pair.replica()
    following = b.subscribe(CID, None)
    with a.store.write() as tx:
        staged = a.stage(tx, CID, [("turn.started", {"turn": {"id": "trn_1"}}), ("turn.waiting", {"n": 0})])
    assert a.send(staged) == [1, 2]
    emit(a, 3)
    got = read(following, 5)
    assert ids(got) == [1, 2, 3, 4, 5]
    assert (got[0].type, got[0].data) == ("turn.started", {"turn": {"id": "trn_1"}, "conversationId": CID})
    assert (
        got[0].sse() == 'id: 1\nevent: turn.started\ndata: {"conversationId":"cnv_01STREAM","turn":{"id":"trn_1"}}\n\n'
    )


def test_without_listen_the_fallback_delivers(pair: Pair) -> None:
    a, b = pair.replica(), pair.replica(listen=False, fallback_ms=100)
    following = b.subscribe(CID, None)
    emit(a, 2)
    assert ids(read(following, 2)) == [1, 2]


def test_a_resume_through_the_other_replica_loses_and_repeats_nothing(pair: Pair) -> None:
    a, b = pair.replica(), pair.replica()
    first = a.subscribe(CID, 0)
    emit(a, 10)
    assert ids(read(first, 6)) == [1, 2, 3, 4, 5, 6]
    first.close()
    again = b.subscribe(CID, 6)  # the browser reconnects through the other replica with Last-Event-ID 6
    emit(a, 2)
    assert ids(read(again, 6)) == [7, 8, 9, 10, 11, 12]
    assert read(again, 1, timeout=0.3) == [], "nothing repeated"


def reset_reason(events: SharedChatEvents, resume: int) -> str | None:
    got = read(events.subscribe(CID, resume), 1, timeout=0.5)
    if got and got[0].type == RESET:
        assert got[0].id is None
        return str(got[0].data["reason"])
    return None


def test_resume_points_at_the_edges_of_the_retained_events_and_the_idle_time(pair: Pair) -> None:
    a = pair.replica(retained=5, idle_ms=60_000)
    assert reset_reason(a, 0) is None, "nothing issued yet: 0 is the last id"
    assert reset_reason(a, 1) == UNKNOWN_EVENT_ID
    emit(a, 12)  # 8..12 retained
    assert ids(read(a.subscribe(CID, 7), 5)) == [8, 9, 10, 11, 12], "the oldest retained id minus 1"
    assert reset_reason(a, 6) == EVENTS_EXPIRED
    assert reset_reason(a, 12) is None
    assert reset_reason(a, 13) == UNKNOWN_EVENT_ID
    pair.clock.advance(59.999)
    assert ids(read(a.subscribe(CID, 7), 5)) == [8, 9, 10, 11, 12]
    pair.clock.advance(0.001)  # idle for 60 s: nothing is served from the stream any more
    assert reset_reason(a, 7) == EVENTS_EXPIRED
    assert reset_reason(a, 12) is None, "the last id still resumes (nothing missed)"
    assert a.prune() == 5
    emit(a, 1)
    assert ids(read(a.subscribe(CID, 12), 1)) == [13], "active again"


def test_a_follower_whose_next_events_were_dropped_is_ended(pair: Pair) -> None:
    a = pair.replica(retained=3)
    b = pair.replica(listen=False, fallback_ms=60_000)  # woken by its own sends only
    behind = b.subscribe(CID, None)
    until(lambda: b.reads >= 1)  # its first read (nothing yet); no wake-up comes before its own send
    emit(a, 10)  # 8..10 retained; b's follower has read none of them
    emit(b, 1)
    assert read(behind, 1, timeout=5) == []
    assert behind.ended, "ended: its client resumes from 0 and is told events_expired"
    assert reset_reason(b, 0) == EVENTS_EXPIRED


def test_a_snapshot_reads_the_draft_and_the_last_id_of_its_own_transaction(pair: Pair) -> None:
    a, b = pair.replica(), pair.replica()
    for piece in ("Hel", "lo"):
        a.emit(CID, "message.delta", {"turnId": "trn_1", "messageId": "msg_1", "text": piece})
    with b.store.read() as tx:
        assert b.draft(tx, CID, "trn_1", lambda _: None) == {"messageId": "msg_1", "content": "Hello"}
        assert b.draft(tx, CID, "trn_2", lambda _: None) is None, "another turn's"
        assert b.last_event_id(CID, tx) == 2
        a.emit(CID, "message.delta", {"turnId": "trn_1", "messageId": "msg_1", "text": "!"})
        assert b.draft(tx, CID, "trn_1", lambda _: None) == {"messageId": "msg_1", "content": "Hello"}
        assert b.last_event_id(CID, tx) == 2, "what committed later is not in the snapshot"
    with a.store.write() as tx:  # the draft is stored as a message: no draft left
        a.send(a.stage(tx, CID, [("message.complete", {"turnId": "trn_1", "message": {"id": "msg_1"}})]))
    with b.store.read() as tx:
        assert b.draft(tx, CID, "trn_1", lambda _: None) is None
    a.emit(CID, "message.delta", {"turnId": "trn_1", "messageId": "msg_2", "text": "Next"})
    with b.store.read() as tx:
        assert b.draft(tx, CID, "trn_1", lambda _: None) == {"messageId": "msg_2", "content": "Next"}


def test_a_change_rolled_back_issues_nothing(pair: Pair) -> None:
    a = pair.replica()
    following = a.subscribe(CID, None)

    class Refused(Exception):
        pass

    with pytest.raises(Refused), a.store.write() as tx:
        a.stage(tx, CID, [("turn.waiting", {"n": 0})])
        raise Refused
    assert a.last_event_id(CID) == 0
    assert emit(a, 1) == [1], "no id was used"
    assert ids(read(following, 2, timeout=0.5)) == [1]


def test_open_streams_count_across_replicas_and_not_on_a_dead_one(pair: Pair) -> None:
    store = pair.stores[0]
    with store.write() as tx:
        for replica in ("rep_A", "rep_B"):
            tx.run("hub_replica_register", id=replica, release="test", settings_digest="-", now=START)
    a = SharedChatStreams(store, pair.clock, "rep_A", keepalive_s=15, limit=2)
    b = SharedChatStreams(store, pair.clock, "rep_B", keepalive_s=15, limit=2)
    first, second = a.take("uma"), b.take("uma")
    assert first is not None and second is not None
    assert a.take("uma") is None and b.take("uma") is None, "2 across both replicas"
    assert b.take("ivan") is not None, "per account"
    a.give_back("uma", first)
    third = b.take("uma")
    assert third is not None
    pair.clock.advance((LIVE_MS - 1) / 1000)
    with store.write() as tx:
        tx.run("hub_replica_renew", id="rep_A", now=pair.clock.now_ms())
    assert a.take("uma") is None
    assert a.sweep() == 0, "rep_B renewed 19.999 s ago: still live"
    pair.clock.advance(0.001)  # rep_B was last renewed 20 s ago: no longer live, its streams count for nothing
    assert a.take("uma") is not None
    assert a.sweep() == 3, "rep_B's two of uma's and ivan's one"
    a.close()
    with store.read() as tx:
        row = tx.one("stream_open_count", account="uma", since=0)
    assert row is not None and int(row["n"]) == 0
