"""Sending messages and stopping turns over a real hub and its SQLite file (chat.md 3.2-3.3, 5.2, 5.6, 7, 8), with
the bot's node registered but not connected, so that every accepted turn stays ``pending``: strict bodies and
limits at their edges, one live turn per conversation, Idempotency-Key replay, stop, and 404 for anyone else."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import pytest

from talaria.chat.records import ChatTurn
from talaria.errors import StoreUnavailable
from talaria.hub.runners.slots import LocalSlots
from talaria.hub.turns.chat_context import ChatContext
from talaria.limits import MAX_CHAT_TEXT_CHARS
from talaria.store.interface import Row
from talaria.testing.hub_server import HubServer
from tests.integration.chat_web_support import chat, send
from tests.integration.runner_support import Machine, pending_wire, register
from tests.integration.web_support import Web, assert_error, open_web

pytestmark = pytest.mark.usefixtures("fast_argon2")

TURN_KEYS = {"id", "conversationId", "state", "code", "error", "waitingReason", "trigger", "triggerMessageId",
             "replyMessageId", "runnerId", "hermesSessionId", "carry", "teamTools", "stopRequested", "createdAt",
             "submittedAt", "finishedAt", "usage"}  # fmt: skip
MESSAGE_KEYS = {"id", "conversationId", "turnId", "ordinal", "role", "author", "content", "reference", "status",
                "final", "recovered", "createdAt", "attachments", "tool", "usage"}  # fmt: skip
TABLES = ("chat_turn", "chat_message", "chat_conversation", "audit_event")


def snapshot(server: HubServer) -> tuple[Any, ...]:
    conn = sqlite3.connect(server.settings.sqlite_path)
    try:
        return tuple(conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() for table in TABLES)
    finally:
        conn.close()


def wait_for(check: Callable[[], Any], what: str, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return found


def test_a_message_is_accepted_at_once_as_a_pending_turn_that_waits_for_its_node(web: Web) -> None:
    conversation_id = chat(web)
    sent = send(web.user, conversation_id, {"text": "  Plan the trip\nwith details"})
    assert sent.status_code == 202, sent.text
    turn, message = sent.json()["turn"], sent.json()["message"]
    assert set(turn) == TURN_KEYS and set(message) == MESSAGE_KEYS
    assert turn["id"].startswith("trn_") and message["id"].startswith("msg_")
    shape = (turn["state"], turn["trigger"], turn["triggerMessageId"], turn["carry"])
    assert shape == ("pending", "user", message["id"], "none")
    assert (message["role"], message["author"], message["content"], message["ordinal"]) == (
        "user", "uma", "  Plan the trip\nwith details", 1)  # fmt: skip
    conversation = web.user.get(f"/api/conversations/{conversation_id}").json()["conversation"]
    assert conversation["title"] == "Plan the trip"
    assert (conversation["messageCount"], conversation["liveTurnId"]) == (1, turn["id"])
    waiting = wait_for(lambda: web.user.get(f"/api/conversations/{conversation_id}/turns/{turn['id']}").json()[
        "turn"]["waitingReason"], "the turn's waiting reason")  # fmt: skip
    assert waiting == "waiting for node node-1 to connect"
    page = web.user.get(f"/api/conversations/{conversation_id}/messages").json()
    assert [m["id"] for m in page["messages"]] == [message["id"]] and page["nextCursor"] is None
    assert page["liveTurn"]["turn"]["id"] == turn["id"] and page["liveTurn"]["approvals"] == []
    assert page["lastEventId"] >= 2  # turn.started, conversation.updated (the title), turn.waiting
    events = web.user.get("/api/audit", params={"conversation": conversation_id}).json()["events"]
    started = next(e for e in events if e["type"] == "chat.turn.started")
    assert started["subject"] == {"conversation": conversation_id, "turn": turn["id"]}
    assert started["toState"] == "pending" and started["evidence"]["kind"] == "chat_message"
    conn = sqlite3.connect(web.server.settings.sqlite_path)
    try:
        dump = "\n".join(str(row) for row in conn.execute("SELECT * FROM audit_event"))
    finally:
        conn.close()
    assert "Plan the trip" not in dump


def test_a_pending_turn_fails_runner_offline_after_chat_pending_wait_s(web: Web) -> None:
    conversation_id = chat(web)
    turn_id = send(web.user, conversation_id, {"text": "anyone there?"}).json()["turn"]["id"]
    url = f"/api/conversations/{conversation_id}/turns/{turn_id}"
    wait_for(lambda: web.user.get(url).json()["turn"]["waitingReason"], "waiting")
    web.server.clock.advance(web.server.settings.chat_pending_wait_s)
    done = wait_for(lambda: (t := web.user.get(url).json())["turn"]["state"] != "pending" and t["turn"], "the end")
    assert (done["state"], done["code"]) == ("failed", "runner_offline")
    assert send(web.user, conversation_id, {"text": "again"}).status_code == 202  # the conversation is free again


def test_a_pending_turn_whose_runner_went_away_before_taking_its_first_command_waits_again(web: Web) -> None:
    """Chat.md 5.3: ``runner_offline`` before the submit record sends the turn back to step 2 (wait for the node);
    only ``chat.pending_wait_s`` ends it so."""
    node = register(web.admin, name="node-1", source="local", allowedProfiles=["default"])
    runner_id = node["runner"]["id"]
    first = Machine(web.server, runner_id, node["token"])
    first.connect()
    conversation_id = chat(web)
    turn_id = send(web.user, conversation_id, {"text": "are you there?"}).json()["turn"]["id"]
    url = f"/api/conversations/{conversation_id}/turns/{turn_id}"
    queued = wait_for(lambda: pending_wire(web.server, runner_id), "the turn's first command")
    assert [w["kind"] for w in queued] == ["gateway.open"]

    async def gone() -> None:  # the watchdog's disconnect: the command was never taken, so it did not run
        await web.server.hub.runners.disconnect(runner_id, "watchdog")

    web.server.call(gone())
    waiting = wait_for(lambda: (t := web.user.get(url).json()["turn"])["waitingReason"] and t, "waiting again")
    assert (waiting["state"], waiting["code"]) == ("pending", None), waiting
    assert waiting["waitingReason"] == "waiting for node node-1 to connect"
    second = Machine(web.server, runner_id, node["token"])
    second.connect()
    again = wait_for(lambda: pending_wire(web.server, runner_id), "the first command, on the new connection")
    assert [w["kind"] for w in again] == ["gateway.open"] and again[0]["id"] != queued[0]["id"]
    assert web.user.get(url).json()["turn"]["state"] == "pending"
    first.close()
    second.close()


def test_bad_bodies_and_keys_are_refused_and_change_nothing(web: Web) -> None:
    conversation_id = chat(web)
    before = snapshot(web.server)
    cases: list[tuple[Any, str]] = [
        ({}, "invalid_request"), ({"text": 5}, "invalid_request"), ({"text": ""}, "invalid_request"),
        ({"text": " \n\t "}, "invalid_request"), ({"text": "x" * (MAX_CHAT_TEXT_CHARS + 1)}, "invalid_request"),
        ({"text": "hi", "extra": 1}, "invalid_request"), ({"text": "bell\x07"}, "invalid_request"),
        ({"text": "hi", "attachments": "att_1"}, "invalid_request"),
        ({"text": "hi", "attachments": ["a", "b", "c", "d", "e"]}, "invalid_request"),
        ({"text": "hi", "attachments": ["a", "a"]}, "invalid_request"), (["hi"], "invalid_request"),
    ]  # fmt: skip
    for body, code in cases:
        assert_error(send(web.user, conversation_id, body), 400, code, body)
    raw = web.user.post(f"/api/conversations/{conversation_id}/turns", content=b"{not json",
                        headers={"Content-Type": "application/json"})  # fmt: skip
    assert_error(raw, 400, "invalid_request")
    for key in ("has space", "x" * 256, "é".encode()):
        assert_error(send(web.user, conversation_id, {"text": "hi"}, **{"Idempotency-Key": key}), 400,
                     "idempotency_key_invalid")  # fmt: skip
    assert_error(send(web.user, conversation_id, {"text": "hi", "attachments": ["att_nosuch"]}), 404, "not_found")
    assert snapshot(web.server) == before
    edge = send(web.user, conversation_id, {"text": "y" * MAX_CHAT_TEXT_CHARS})
    assert edge.status_code == 202, edge.text


def test_sessions_csrf_origin_and_other_accounts_are_refused_before_anything_else(web: Web) -> None:
    conversation_id = chat(web)
    before = snapshot(web.server)
    anon = web.anon(headers={"Origin": web.server.url})
    assert_error(send(anon, conversation_id, {"text": "hi"}), 401, "unauthenticated")
    no_csrf = web.login("uma")
    del no_csrf.headers["X-CSRF-Token"]
    assert_error(send(no_csrf, conversation_id, {"text": "hi"}), 403, "csrf_failed")
    wrong_origin = web.login("uma")
    wrong_origin.headers["Origin"] = "http://evil.example"
    assert_error(send(wrong_origin, conversation_id, {"text": "hi"}), 403, "csrf_failed")
    for client in (web.other, web.admin):  # another account's conversation: 404 even with a bad key and body
        assert_error(send(client, conversation_id, {"bad": 1}, **{"Idempotency-Key": "bad key"}), 404, "not_found")
        assert_error(client.get(f"/api/conversations/{conversation_id}/messages"), 404, "not_found")
    assert_error(send(web.user, "cnv_nosuch", {"text": "hi"}), 404, "not_found")
    assert snapshot(web.server) == before
    turn_id = send(web.user, conversation_id, {"text": "mine"}).json()["turn"]["id"]
    for client in (web.other, web.admin):
        assert_error(client.get(f"/api/conversations/{conversation_id}/turns/{turn_id}"), 404, "not_found")
        assert_error(client.post(f"/api/conversations/{conversation_id}/turns/{turn_id}/stop"), 404, "not_found")
    other_chat = chat(web, web.other)
    assert_error(web.other.get(f"/api/conversations/{other_chat}/turns/{turn_id}"), 404, "not_found")


def test_one_live_turn_and_the_idempotency_key_replays_byte_for_byte(web: Web) -> None:
    conversation_id = chat(web)
    first = send(web.user, conversation_id, {"text": "one"}, **{"Idempotency-Key": "k-1"})
    assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
    replay = send(web.user, conversation_id, {"text": "one"}, **{"Idempotency-Key": "k-1"})
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    assert_error(send(web.user, conversation_id, {"text": "two"}, **{"Idempotency-Key": "k-1"}), 422,
                 "idempotency_key_reused")  # fmt: skip
    assert_error(send(web.user, conversation_id, {"text": "two"}), 409, "turn_in_progress")
    turn_id = first.json()["turn"]["id"]
    stopped = web.user.post(f"/api/conversations/{conversation_id}/turns/{turn_id}/stop")
    assert stopped.status_code == 202
    assert (stopped.json()["turn"]["state"], stopped.json()["turn"]["code"]) == ("interrupted", "stopped")
    assert_error(web.user.post(f"/api/conversations/{conversation_id}/turns/{turn_id}/stop"), 409, "turn_finished")
    # the key replays its accepted turn even after the turn ended; another key sends anew
    again = send(web.user, conversation_id, {"text": "one"}, **{"Idempotency-Key": "k-1"})
    assert again.content == first.content
    web.server.clock.advance(24 * 3600)  # kept 24 h (the session expired meanwhile)
    uma = web.login("uma")
    assert send(uma, conversation_id, {"text": "one"}, **{"Idempotency-Key": "k-1"}).content == first.content
    web.server.clock.advance(0.001)  # then the key is free again
    fresh = send(uma, conversation_id, {"text": "one"}, **{"Idempotency-Key": "k-1"})
    assert fresh.status_code == 202 and fresh.json()["turn"]["id"] != turn_id


def test_archived_conversations_and_bots_refuse_sends(web: Web) -> None:
    conversation_id = chat(web)
    assert web.user.patch(f"/api/conversations/{conversation_id}", json={"archived": True}).status_code == 200
    assert_error(send(web.user, conversation_id, {"text": "hi"}), 409, "conversation_archived")
    assert web.user.patch(f"/api/conversations/{conversation_id}", json={"archived": False}).status_code == 200
    bot_id = web.user.get("/api/bots").json()["bots"][0]["id"]
    assert web.user.patch(f"/api/bots/{bot_id}", json={"archived": True}).status_code == 200
    assert_error(send(web.user, conversation_id, {"text": "hi"}), 409, "bot_archived")


def test_live_turns_per_account_and_per_hub_are_limited_with_retry_after(
    make_hub: Callable[..., HubServer], fast_argon2: None
) -> None:
    with ExitStack() as stack:
        web = open_web(make_hub, stack, chat_per_account=2, chat_per_hub=3)
        chats = [chat(web) for _ in range(3)]
        for conversation_id in chats[:2]:
            assert send(web.user, conversation_id, {"text": "go"}).status_code == 202
        limited = send(web.user, chats[2], {"text": "go"})
        assert_error(limited, 429, "chat_turn_limit")
        assert limited.headers["Retry-After"] == "5"
        mine = chat(web, web.other)
        assert send(web.other, mine, {"text": "go"}).status_code == 202  # the hub's third
        busy = send(web.other, chat(web, web.other), {"text": "go"})
        assert_error(busy, 429, "chat_busy")
        assert busy.headers["Retry-After"] == "5"


def one_slot_hub(make_hub: Callable[..., HubServer], stack: ExitStack) -> tuple[Web, str]:
    """A hub with ``chat.per_runner = 1`` and its one node connected (the node's runner id)."""
    web = open_web(make_hub, stack, chat_per_runner=1)
    node = register(web.admin, name="node-1", source="local", allowedProfiles=["default"])
    runner_id: str = node["runner"]["id"]
    machine = Machine(web.server, runner_id, node["token"])
    stack.callback(machine.close)
    machine.connect()
    return web, runner_id


def test_turns_arriving_together_never_take_more_than_chat_per_runner_slots(
    make_hub: Callable[..., HubServer], fast_argon2: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chat.md 5.3 step 2: a runner running ``chat.per_runner`` turns makes the next one wait ``busy``, also while
    the first is still between its admission and its first command (here held there): the slot is taken with the
    count, not later."""
    held, release = threading.Event(), threading.Event()
    allowed = ChatContext._still_allowed

    def slow_check(self: ChatContext, turn: ChatTurn, conversation: Row) -> bool:
        held.set()
        release.wait(30)
        return allowed(self, turn, conversation)

    monkeypatch.setattr(ChatContext, "_still_allowed", slow_check)
    with ExitStack() as stack:
        stack.callback(release.set)
        web, runner_id = one_slot_hub(make_hub, stack)
        first, second = chat(web), chat(web)
        assert send(web.user, first, {"text": "first"}).status_code == 202
        assert held.wait(10), "the first turn never reached its access check"
        turn_id = send(web.user, second, {"text": "second"}).json()["turn"]["id"]
        url = f"/api/conversations/{second}/turns/{turn_id}"
        waiting = wait_for(lambda: web.user.get(url).json()["turn"]["waitingReason"], "the second turn waiting")
        assert waiting == "waiting for node node-1: busy"
        release.set()
        opened = wait_for(lambda: pending_wire(web.server, runner_id), "the first turn's first command")
        assert [w["kind"] for w in opened] == ["gateway.open"]
        assert web.user.get(url).json()["turn"]["waitingReason"] == "waiting for node node-1: busy"
        assert [w["kind"] for w in pending_wire(web.server, runner_id)] == ["gateway.open"]


def test_a_slot_that_could_not_be_taken_gives_its_runner_s_count_back(
    make_hub: Callable[..., HubServer], fast_argon2: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store error while the cluster's slot is taken (scale.md 3.7) fails that turn (``internal_error``), and the
    runner's local count goes back with it: the next turn (``chat.per_runner = 1``) opens its gateway rather than
    waiting ``busy`` for ever."""
    failed = threading.Event()
    take = LocalSlots.take

    def failing_once(self: LocalSlots, runner_id: str, work_id: str, limit: int) -> int | None:
        if not failed.is_set():
            failed.set()
            raise StoreUnavailable("the database did not answer")
        return take(self, runner_id, work_id, limit)

    monkeypatch.setattr(LocalSlots, "take", failing_once)
    with ExitStack() as stack:
        web, runner_id = one_slot_hub(make_hub, stack)
        first = chat(web)
        turn_id = send(web.user, first, {"text": "go"}).json()["turn"]["id"]
        url = f"/api/conversations/{first}/turns/{turn_id}"
        failed_turn = wait_for(lambda: web.user.get(url).json()["turn"]["code"], "the first turn's end")
        assert failed_turn == "internal_error"
        assert send(web.user, chat(web), {"text": "go again"}).status_code == 202
        opened = wait_for(lambda: pending_wire(web.server, runner_id), "the second turn's first command")
        assert [w["kind"] for w in opened] == ["gateway.open"]
