"""The live stream's events (chat.md 4.2) over a real SQLite store and a ManualClock: ids strictly increasing per
conversation across restarts from reserved blocks, ``last_event_id`` (3.2), replay from a resume point with no
duplicate and no gap, ``stream.reset`` with ``events_expired`` or ``unknown_event_id``, the 2,000 retained events,
the 15-minute idle drop, delivery from worker threads, far-behind subscribers and hub shutdown."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.clock import ManualClock
from talaria.errors import TalariaError
from talaria.hub.chat.delivery import ChatEvent, Subscription
from talaria.hub.chat.events import EVENTS_EXPIRED, RESET, UNKNOWN_EVENT_ID, ChatEvents
from talaria.store import migrations
from talaria.store.interface import Store
from talaria.store.open import open_sqlite

CNV = "cnv_01TESTCONVERSATION00000000"
OTHER = "cnv_01TESTCONVERSATION00000001"
DELTA = "message.delta"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A migrated store holding one account, one bot and two conversations."""
    opened = open_sqlite(tmp_path / "data")
    migrations.upgrade(opened)
    with opened.write() as tx:
        tx.run("tenant_ensure", name="default", now=1)
        tx.run("account_insert", username="uma", tenant="default", role="user", password_hash="-",
               allowed_profiles="{}", can_manage_team=0, now=1)  # fmt: skip
        tx.run("bot_insert", id="bot_01TEST", tenant="default", owner="uma", name="Helper", name_key="helper",
               source="local", profile="default", instructions="", now=1)  # fmt: skip
        for conversation in (CNV, OTHER):
            tx.run("chat_conversation_insert", id=conversation, tenant="default", owner="uma", bot_id="bot_01TEST",
                   title="t", title_set=0, now=1)  # fmt: skip
    yield opened
    opened.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def reserved(store: Store, conversation: str = CNV) -> int:
    with store.read() as tx:
        row = tx.one("chat_conversation_event_seq", id=conversation)
    assert row is not None
    return int(row["event_seq_reserved"])


def emit_many(events: ChatEvents, count: int, conversation: str = CNV) -> list[int]:
    return [events.emit(conversation, DELTA, {"n": n}) for n in range(count)]


def drain(subscription: Subscription) -> list[ChatEvent]:
    """Everything the subscription holds now (``next`` with no wait)."""

    async def run() -> list[ChatEvent]:
        got = []
        while (event := await subscription.next(0)) is not None:
            got.append(event)
        return got

    return asyncio.run(run())


def ids(events: list[ChatEvent]) -> list[int | None]:
    return [event.id for event in events]


def assert_reset(subscription: Subscription, reason: str) -> None:
    (reset,) = drain(subscription)
    assert (reset.id, reset.type, dict(reset.data)) == (None, RESET, {"conversationId": CNV, "reason": reason})
    assert subscription.ended


def test_ids_increase_one_by_one_per_conversation_from_a_reserved_block(store: Store, clock: ManualClock) -> None:
    events = ChatEvents(store, clock, block=3)
    assert events.last_event_id(CNV) == 0 and reserved(store) == 0
    assert emit_many(events, 7) == [1, 2, 3, 4, 5, 6, 7]
    assert reserved(store) == 9  # three blocks of 3, each reserved with its first id
    assert emit_many(events, 2, OTHER) == [1, 2]
    assert events.last_event_id(CNV) == 7 and events.last_event_id(OTHER) == 2


def test_a_restarted_hub_issues_ids_above_the_previous_process_s_block(store: Store, clock: ManualClock) -> None:
    first = ChatEvents(store, clock)
    assert emit_many(first, 3) == [1, 2, 3]
    assert first.last_event_id(CNV) == 3
    second = ChatEvents(store, clock)  # a restart over the same file
    assert second.last_event_id(CNV) == 1000  # nothing issued yet: the stored high-water
    assert emit_many(second, 2) == [1001, 1002]
    assert second.last_event_id(CNV) == 1002 and reserved(store) == 2000


def test_every_event_s_data_names_its_conversation_and_its_sse_text_is_one_json_line() -> None:
    event = ChatEvent(7, DELTA, {"conversationId": CNV, "text": "two\nlines \u2028 é"})
    head, kind, data, blank, end = event.sse().split("\n")
    assert (head, kind, blank, end) == ("id: 7", "event: message.delta", "", "")
    assert data.startswith("data: {") and json.loads(data.removeprefix("data: ")) == dict(event.data)
    reset = ChatEvent(None, RESET, {"conversationId": CNV, "reason": EVENTS_EXPIRED})
    assert reset.sse() == f'event: stream.reset\ndata: {{"conversationId":"{CNV}","reason":"events_expired"}}\n\n'


def test_emit_adds_the_conversation_id_and_refuses_odd_types_and_unknown_conversations(
    store: Store, clock: ManualClock
) -> None:
    events = ChatEvents(store, clock)
    subscription = events.subscribe(CNV, None)
    events.emit(CNV, "turn.started", {"turnId": "trn_1"})
    assert [dict(e.data) for e in drain(subscription)] == [{"turnId": "trn_1", "conversationId": CNV}]
    with pytest.raises(ValueError, match="event type"):
        events.emit(CNV, "bad type\n", {})
    with pytest.raises(TalariaError) as refused:
        events.emit("cnv_nosuch", DELTA, {})
    assert refused.value.code == "not_found"
    assert events.last_event_id("cnv_nosuch") == 0


def test_a_resume_point_in_the_window_replays_each_later_event_once_then_follows_live(
    store: Store, clock: ManualClock
) -> None:
    events = ChatEvents(store, clock)
    emit_many(events, 10)
    subscription = events.subscribe(CNV, 4)
    assert ids(drain(subscription)) == [5, 6, 7, 8, 9, 10]
    emit_many(events, 2)
    assert ids(drain(subscription)) == [11, 12]
    assert ids(drain(events.subscribe(CNV, 12))) == []  # the last issued: live only
    assert ids(drain(events.subscribe(CNV, 0))) == list(range(1, 13))  # the oldest minus 1
    live = events.subscribe(CNV, None)
    emit_many(events, 1)
    assert ids(drain(live)) == [13] and not live.ended


def test_2000_events_are_retained_and_older_resume_points_are_expired(store: Store, clock: ManualClock) -> None:
    events = ChatEvents(store, clock)
    emit_many(events, 2005)
    assert_reset(events.subscribe(CNV, 1), EVENTS_EXPIRED)
    assert_reset(events.subscribe(CNV, 4), EVENTS_EXPIRED)
    subscription = events.subscribe(CNV, 5)  # the oldest retained (6) minus 1
    replay = drain(subscription)
    assert ids(replay) == list(range(6, 2006))
    emit_many(events, 1)  # a replay of 2,000 does not count as being behind
    assert ids(drain(subscription)) == [2006]


def test_a_resume_point_above_the_last_issued_is_unknown(store: Store, clock: ManualClock) -> None:
    events = ChatEvents(store, clock)
    assert_reset(events.subscribe(CNV, 1), UNKNOWN_EVENT_ID)  # nothing issued, nothing stored
    emit_many(events, 3)
    assert_reset(events.subscribe(CNV, 4), UNKNOWN_EVENT_ID)
    assert_reset(events.subscribe(CNV, 10**30), UNKNOWN_EVENT_ID)


def test_after_a_restart_nothing_is_retained_and_the_stored_high_water_decides(
    store: Store, clock: ManualClock
) -> None:
    emit_many(ChatEvents(store, clock), 3)
    events = ChatEvents(store, clock)
    follows = events.subscribe(CNV, 1000)  # = last_event_id: follows live
    assert_reset(events.subscribe(CNV, 1001), UNKNOWN_EVENT_ID)
    assert_reset(events.subscribe(CNV, 999), EVENTS_EXPIRED)
    assert_reset(events.subscribe(CNV, 3), EVENTS_EXPIRED)
    assert drain(follows) == []
    emit_many(events, 1)
    assert ids(drain(follows)) == [1001]


def test_a_buffer_is_dropped_15_minutes_after_its_last_event(store: Store, clock: ManualClock) -> None:
    events = ChatEvents(store, clock)
    emit_many(events, 3)
    clock.advance(15 * 60 - 0.001)
    assert ids(drain(events.subscribe(CNV, 0))) == [1, 2, 3]
    assert events.prune() == 0
    clock.advance(0.001)
    assert events.prune() == 1
    assert events.last_event_id(CNV) == 3  # the process still knows the last id it issued
    assert_reset(events.subscribe(CNV, 0), EVENTS_EXPIRED)
    follows = events.subscribe(CNV, 3)
    emit_many(events, 1)
    assert ids(drain(follows)) == [4]
    clock.advance(15 * 60)  # dropped lazily too, without prune
    assert_reset(events.subscribe(CNV, 3), EVENTS_EXPIRED)


def test_an_event_emitted_from_a_worker_thread_wakes_an_asyncio_subscriber(store: Store, clock: ManualClock) -> None:
    events = ChatEvents(store, clock)

    async def run() -> ChatEvent | None:
        subscription = await asyncio.to_thread(events.subscribe, CNV, None)
        waiting = asyncio.create_task(subscription.next(30))
        await asyncio.sleep(0)  # let it start waiting
        worker = threading.Thread(target=events.emit, args=(CNV, DELTA, {"text": "hi"}))
        worker.start()
        got = await waiting
        worker.join()
        return got

    got = asyncio.run(run())
    assert got is not None and (got.id, got.type, got.data["text"]) == (1, DELTA, "hi")


def test_next_answers_none_when_nothing_comes_in_time(store: Store, clock: ManualClock) -> None:
    subscription = ChatEvents(store, clock).subscribe(CNV, None)
    assert asyncio.run(subscription.next(0.01)) is None
    assert not subscription.ended


def test_close_all_ends_every_subscription_and_every_later_one(store: Store, clock: ManualClock) -> None:
    events = ChatEvents(store, clock)

    async def run() -> tuple[ChatEvent | None, bool]:
        subscription = events.subscribe(CNV, None)
        waiting = asyncio.create_task(subscription.next(30))
        await asyncio.sleep(0)
        await asyncio.to_thread(events.close_all)
        return await waiting, subscription.ended

    assert asyncio.run(run()) == (None, True)
    later = events.subscribe(CNV, None)
    assert later.ended and drain(later) == []
    assert emit_many(events, 1) == [1]  # events still get ids after shutdown began


def test_a_subscriber_too_far_behind_is_ended_and_a_closed_one_gets_nothing(store: Store, clock: ManualClock) -> None:
    events = ChatEvents(store, clock, behind=3)
    slow, closed = events.subscribe(CNV, None), events.subscribe(CNV, None)
    closed.close()
    closed.close()  # idempotent
    emit_many(events, 3)
    assert not slow.ended
    emit_many(events, 1)
    assert slow.ended and drain(slow) == [] and drain(closed) == []


def test_the_conversation_lock_is_the_one_emit_takes_and_is_reentrant(store: Store, clock: ManualClock) -> None:
    events = ChatEvents(store, clock)
    taken: list[bool] = []
    with events.locked(CNV):
        probe = threading.Thread(target=lambda: taken.append(events._of(CNV).lock.acquire(blocking=False)))
        probe.start()
        probe.join()
        assert events.emit(CNV, DELTA, {}) == 1  # the writer's "commit, then emit" inside the lock
        assert events.last_event_id(CNV) == 1
    assert taken == [False]
