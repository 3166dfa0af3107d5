"""How a chat turn ends (chat.md 2, 5.3 step 10, 5.5), over a real hub, a real runner process and the Hermes
fixture: Hermes' ``error`` event that no ``message.complete`` follows (0.19.0 ends a prompt whose agent did not
initialise in time so) fails the turn ``hermes_error`` at once; a turn's usage is its own share of the session's
running totals; the end-of-turn ``session.info`` of a compressed session moves the binding to the new stored
session, and the next turn goes on in that one. A completed turn's channel is kept ``chat.channel_idle_s`` for the
next turn (5.3 step 4: no ``gateway.open``, no ``session.resume``), then closed; archive and an access change close
it at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.clock import SystemClock
from talaria.hub.timings import HubTimings
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.hermes.chat_support import Stream, ended, make_bot, messages, send, start_chat, turn_of, wait_turn
from tests.integration.runner_support import RunnerProcess, register_node


@dataclass
class Chat:
    server: HubServer
    hermes: HermesFixture
    alice: httpx.Client
    conversation_id: str
    runner: RunnerProcess | None = None


@contextmanager
def chat_hub(tmp_path: Path, **settings: Any) -> Iterator[Chat]:
    with HermesFixture() as hermes:
        server = HubServer(tmp_path / "data", SystemClock(), **settings).start()
        runner = None
        try:
            add_account(server, "alice", allowed_profiles={"local": ["default"]})
            path = register_node(server, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token)
            runner = RunnerProcess(path, tmp_path / "logs", "runner")
            runner.wait_for("runner connected")
            alice = login(server, "alice")
            made = Chat(server, hermes, alice, start_chat(alice, make_bot(alice)), runner)
            yield made
            made.alice.close()  # a test may have signed her in again
        finally:
            if runner is not None:
                runner.close()
            server.stop()


@pytest.fixture
def chat(tmp_path: Path, fast_argon2: None) -> Iterator[Chat]:
    with chat_hub(tmp_path) as made:
        yield made


def _turn(chat: Chat, text: str) -> dict[str, object]:
    sent = send(chat.alice, chat.conversation_id, text)
    assert sent.status_code == 202, sent.text
    return wait_turn(chat.alice, chat.conversation_id, sent.json()["turn"]["id"], timeout=30)


def _conversation(chat: Chat) -> dict[str, object]:
    answer = chat.alice.get(f"/api/conversations/{chat.conversation_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, object] = answer.json()["conversation"]
    return found


def test_an_error_event_without_a_reply_fails_the_turn_hermes_error_at_once(chat: Chat) -> None:
    chat.hermes.error_event_for("never built", "agent initialization timed out", times=1)
    stream = Stream(chat.alice, chat.conversation_id)
    try:
        sent = send(chat.alice, chat.conversation_id, "this agent is never built")
        turn_id = sent.json()["turn"]["id"]
        events = stream.wait_for(ended(turn_id), timeout=30)
    finally:
        stream.close()
    kinds = [k for _, k, d in events if (d.get("turnId") or d.get("turn", {}).get("id")) == turn_id]
    assert kinds[-1] == "turn.failed"
    turn = wait_turn(chat.alice, chat.conversation_id, turn_id)
    assert (turn["state"], turn["code"]) == ("failed", "hermes_error")
    notices = [m["content"] for m in messages(chat.alice, chat.conversation_id) if m["role"] == "system"]
    assert notices == ["Hermes reported an error: agent initialization timed out"]
    assert not [m for m in messages(chat.alice, chat.conversation_id) if m["role"] == "assistant"]
    assert chat.hermes.prompt_count("this agent is never built") == 1
    after = _turn(chat, "and now a question that works")  # the conversation goes on
    assert after["state"] == "completed"


def test_each_turn_s_usage_is_its_own_share_of_the_session_s_running_totals(chat: Chat) -> None:
    chat.hermes.reply_for("first", "One.")
    chat.hermes.reply_for("second", "Two, longer.")
    first, second = _turn(chat, "first question"), _turn(chat, "second question")
    assert (first["state"], second["state"]) == ("completed", "completed")
    marker_len = len(f"\n[talaria-run:{first['id']}:{first['triggerMessageId']}]")
    assert first["usage"] == {"model": first["usage"]["model"], "inputTokens": len("first question") + marker_len,  # type: ignore[index]
                              "outputTokens": len("One."), "totalTokens": len("first question") + marker_len + 4,
                              "calls": 1}  # fmt: skip
    assert second["usage"]["calls"] == 1  # type: ignore[index]
    assert second["usage"]["outputTokens"] == len("Two, longer.")  # type: ignore[index]
    replies = [m for m in messages(chat.alice, chat.conversation_id) if m["role"] == "assistant"]
    assert [m["usage"] for m in replies] == [first["usage"], second["usage"]]


def test_a_compressed_session_moves_the_binding_and_the_next_turn_resumes_the_new_one(chat: Chat) -> None:
    first = _turn(chat, "before anything")
    before = _conversation(chat)["hermesSessionId"]
    assert first["state"] == "completed" and before is not None
    chat.hermes.compress_on("compress me")
    _turn(chat, "compress me now")
    moved = _conversation(chat)["hermesSessionId"]
    assert moved not in (None, before)
    assert moved in chat.hermes.stored_ids()
    third = _turn(chat, "after the compression")
    assert third["state"] == "completed" and third["carry"] == "none" and third["hermesSessionId"] == moved
    assert len(chat.hermes.stored_ids()) == 2  # the turn went on in the compressed session, no other one


def _connections(chat: Chat, method: str) -> list[int]:
    return [r.connection for r in chat.hermes.rpc_requests(method)]


def test_the_next_turn_goes_on_in_the_kept_channel_without_opening_or_resuming(chat: Chat) -> None:
    turns = [_turn(chat, text) for text in ("one", "two", "three")]
    assert [t["state"] for t in turns] == ["completed"] * 3
    assert [t["carry"] for t in turns] == ["none"] * 3
    submits = _connections(chat, "prompt.submit")
    assert len(submits) == 3 and len(set(submits)) == 1
    assert chat.hermes.rpc_requests("session.resume") == []
    assert len(chat.hermes.rpc_requests("session.create")) == 1
    assert chat.hermes.connection_count() == 1  # kept, idle


def test_an_idle_channel_closes_after_chat_channel_idle_s_and_the_next_turn_resumes(
    tmp_path: Path, fast_argon2: None
) -> None:
    with chat_hub(tmp_path, chat_channel_idle_s=1) as chat:
        first = _turn(chat, "before the pause")
        chat.hermes.wait_for(lambda: chat.hermes.connection_count() == 0, timeout=15)
        second = _turn(chat, "after the pause")
        assert (first["state"], second["state"], second["carry"]) == ("completed", "completed", "none")
        resumed = chat.hermes.rpc_requests("session.resume")
        assert [r.params["session_id"] for r in resumed] == [first["hermesSessionId"]]
        assert len(set(_connections(chat, "prompt.submit"))) == 2


def test_archiving_the_conversation_or_changing_the_account_closes_its_kept_channel_at_once(chat: Chat) -> None:
    assert _turn(chat, "keep this channel")["state"] == "completed"
    assert chat.hermes.connection_count() == 1
    archived = chat.alice.patch(f"/api/conversations/{chat.conversation_id}", json={"archived": True})
    assert archived.status_code == 200, archived.text
    chat.hermes.wait_for(lambda: chat.hermes.connection_count() == 0, timeout=10)
    chat.conversation_id = start_chat(chat.alice, make_bot(chat.alice, name="Second"))
    assert _turn(chat, "another channel")["state"] == "completed"
    assert chat.hermes.connection_count() == 1
    add_account(chat.server, "root", role="admin")
    root = login(chat.server, "root")
    try:
        changed = root.patch("/api/admin/accounts/alice", json={"allowedProfiles": {"local": ["default", "work"]}})
        assert changed.status_code == 200, changed.text
    finally:
        root.close()
    chat.hermes.wait_for(lambda: chat.hermes.connection_count() == 0, timeout=10)


def test_a_turn_entitled_to_team_tools_on_a_node_not_ready_runs_without_them_and_says_so(chat: Chat) -> None:
    chat.server.hub.accounts.update("alice", "default", {"canManageTeam": True})
    chat.alice.close()
    chat.alice = login(chat.server, "alice")  # the change ended her sessions
    bot_id = chat.alice.get(f"/api/conversations/{chat.conversation_id}").json()["conversation"]["bot"]["id"]
    assert chat.alice.patch(f"/api/bots/{bot_id}", json={"teamPermission": True}).status_code == 200
    chat.hermes.knobs.capabilities = {**chat.hermes.knobs.capabilities, "ready": False}
    turn = _turn(chat, "no tools here")
    assert (turn["state"], turn["teamTools"]) == ("completed", False)
    notices = [m["content"] for m in messages(chat.alice, chat.conversation_id) if m["role"] == "system"]
    assert notices == ["Team tools are not available on this node; this turn runs without them."]
    assert chat.hermes.binds() == []
    chat.hermes.knobs.capabilities = {**chat.hermes.knobs.capabilities, "ready": True}
    ready = _turn(chat, "tools now")
    assert (ready["state"], ready["teamTools"]) == ("completed", True)
    assert len(chat.hermes.binds()) == 1
    assert len([m for m in messages(chat.alice, chat.conversation_id) if m["role"] == "system"]) == 1


def test_stopping_a_recovering_turn_whose_source_another_node_serves_now_is_409_and_the_turn_ends_uncertain(
    tmp_path: Path, fast_argon2: None
) -> None:
    # the recovery looks for its runner rarely here, so the stop route is what finds the new node
    with chat_hub(tmp_path, timings=HubTimings(runner_back_check_s=120)) as chat:
        chat.hermes.knobs.delta_delay = 0.5
        stream = Stream(chat.alice, chat.conversation_id)
        try:
            sent = send(chat.alice, chat.conversation_id, "a long answer please")
            turn_id = sent.json()["turn"]["id"]
            stream.wait_for(lambda events: any(k == "message.delta" for _, k, _ in events), timeout=30)
            assert chat.runner is not None
            chat.runner.stop()  # its channel ends with it: the turn is recovering, waiting for its node
            stream.wait_for(lambda _: "turn.recovering" in [k for _, k, _ in stream.of_turn(turn_id)], timeout=30)
            recovering = turn_of(chat.alice, chat.conversation_id, turn_id)
            assert recovering["state"] == "recovering", recovering
            assert chat.server.hub.registry.disable(str(recovering["runnerId"]))
            register_node(chat.server, tmp_path / "node-2", hermes_url=chat.hermes.url,
                          session_token=chat.hermes.session_token, name="node-2")  # fmt: skip
            stopped = chat.alice.post(f"/api/conversations/{chat.conversation_id}/turns/{turn_id}/stop")
            assert stopped.status_code == 409 and stopped.json()["code"] == "runner_target_changed", stopped.text
            stream.wait_for(ended(turn_id), timeout=10)
        finally:
            stream.close()
        done = wait_turn(chat.alice, chat.conversation_id, turn_id)
        assert (done["state"], done["code"]) == ("uncertain", "runner_target_changed")


def test_a_message_sent_at_once_after_the_end_waits_for_the_channel_and_goes_on_in_it(chat: Chat) -> None:
    # the end is stored at Hermes' message.complete; the end-of-turn session.info comes 0.5 s later, and only then is
    # the channel kept: a message sent at once must not open another channel onto the same live session
    chat.hermes.knobs.end_info_delay = 0.5
    first = _turn(chat, "the first of two quick ones")
    second = _turn(chat, "the second at once")
    assert (first["state"], second["state"], second["carry"]) == ("completed", "completed", "none")
    assert chat.hermes.rpc_requests("session.resume") == []
    assert len(set(_connections(chat, "prompt.submit"))) == 1
