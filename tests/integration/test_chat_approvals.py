"""Approvals and questions of a chat turn (chat.md 3.5, scenario 5's API), over a real hub, a real runner process
and the Hermes fixture, which asks ``approval.request`` or ``clarify.request`` and waits for the answer: the hub
mints ids, relays only answers to the oldest pending one, stores the resolution as a system message with
``chat.approval.answered``, and refuses ``always``, the wrong field, a second answer (409 ``approval_expired``)
and other accounts (404)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from talaria.clock import SystemClock
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, login
from tests.hermes.chat_support import Stream, make_bot, messages, send, start_chat, wait_turn
from tests.integration.runner_support import RunnerProcess, register_node
from tests.integration.web_support import assert_error


@dataclass
class Chat:
    server: HubServer
    hermes: HermesFixture
    alice: httpx.Client
    bob: httpx.Client
    conversation_id: str


@pytest.fixture
def chat(tmp_path: Path, fast_argon2: None) -> Iterator[Chat]:
    with HermesFixture() as hermes:
        server = HubServer(tmp_path / "data", SystemClock()).start()
        runner = None
        try:
            for name in ("alice", "bob"):
                add_account(server, name, allowed_profiles={"local": ["default"]})
            path = register_node(server, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token)
            runner = RunnerProcess(path, tmp_path / "logs", "runner")
            runner.wait_for("runner connected")
            alice, bob = login(server, "alice"), login(server, "bob")
            yield Chat(server, hermes, alice, bob, start_chat(alice, make_bot(alice)))
            alice.close()
            bob.close()
        finally:
            if runner is not None:
                runner.close()
            server.stop()


def approvals_url(chat: Chat, turn_id: str) -> str:
    return f"/api/conversations/{chat.conversation_id}/turns/{turn_id}/approvals"


def asked(stream: Stream) -> dict[str, object]:
    found = stream.wait_for(lambda events: any(k == "approval.requested" for _, k, _ in events))
    approval: dict[str, object] = next(d["approval"] for _, k, d in found if k == "approval.requested")
    return approval


def test_an_approval_is_answered_once_and_resolves_with_a_system_message(chat: Chat) -> None:
    chat.hermes.approval_for("clean up", command="rm -rf build")
    chat.hermes.reply_for("clean up", "Cleaned.")
    stream = Stream(chat.alice, chat.conversation_id)
    turn_id = send(chat.alice, chat.conversation_id, "please clean up").json()["turn"]["id"]
    approval = asked(stream)
    assert (approval["kind"], approval["state"], approval["command"]) == ("approval", "pending", "rm -rf build")
    assert "always" not in approval["choices"] and str(approval["id"]).startswith("apr_")
    snapshot = chat.alice.get(f"/api/conversations/{chat.conversation_id}/messages").json()
    assert [a["id"] for a in snapshot["liveTurn"]["approvals"]] == [approval["id"]]
    url = approvals_url(chat, turn_id)
    assert_error(chat.alice.post(url, json={"approvalId": approval["id"], "choice": "always"}), 400, "invalid_request")
    assert_error(chat.alice.post(url, json={"approvalId": approval["id"], "answer": "yes"}), 400, "invalid_request")
    assert_error(chat.alice.post(url, json={"approvalId": "apr_nosuch", "choice": "once"}), 404, "not_found")
    assert_error(chat.bob.post(url, json={"approvalId": approval["id"], "choice": "once"}), 404, "not_found")
    answered = chat.alice.post(url, json={"approvalId": approval["id"], "choice": "once"})
    assert answered.status_code == 200, answered.text
    assert answered.json()["approval"]["state"] == "approved" and answered.json()["approval"]["choice"] == "once"
    assert chat.hermes.approval_choices()[-1]["choice"] == "once"
    again = chat.alice.post(url, json={"approvalId": approval["id"], "choice": "deny"})
    assert_error(again, 409, "approval_expired")
    assert wait_turn(chat.alice, chat.conversation_id, turn_id)["state"] == "completed"
    shown = [m["content"] for m in messages(chat.alice, chat.conversation_id) if m["role"] == "system"]
    assert shown == ["Approved once: rm -rf build"]
    events = chat.alice.get("/api/audit", params={"conversation": chat.conversation_id}).json()["events"]
    answers = [e for e in events if e["type"] == "chat.approval.answered"]
    assert len(answers) == 1 and answers[0]["reasonCode"] == "once"
    resolved = [d for _, k, d in stream.events if k == "approval.resolved"]
    assert [r["approval"]["state"] for r in resolved] == ["approved"]
    stream.close()


def test_a_question_takes_an_answer_and_a_denied_approval_says_so(chat: Chat) -> None:
    chat.hermes.clarify_for("which colour", "Which colour?", choices=["red", "blue"])
    stream = Stream(chat.alice, chat.conversation_id)
    turn_id = send(chat.alice, chat.conversation_id, "which colour should it be").json()["turn"]["id"]
    question = asked(stream)
    assert (question["kind"], question["question"], question["choices"]) == ("clarify", "Which colour?",
                                                                             ["red", "blue"])  # fmt: skip
    url = approvals_url(chat, turn_id)
    assert_error(chat.alice.post(url, json={"approvalId": question["id"], "choice": "once"}), 400, "invalid_request")
    assert_error(chat.alice.post(url, json={"approvalId": question["id"], "answer": "x" * 4001}), 400,
                 "invalid_request")  # fmt: skip
    answered = chat.alice.post(url, json={"approvalId": question["id"], "answer": "blue"})
    assert answered.status_code == 200, answered.text
    assert answered.json()["approval"]["state"] == "answered"
    assert chat.hermes.clarify_answers()[-1]["answer"] == "blue"
    assert wait_turn(chat.alice, chat.conversation_id, turn_id)["state"] == "completed"
    events = chat.alice.get("/api/audit", params={"conversation": chat.conversation_id}).json()["events"]
    answer = next(e for e in events if e["type"] == "chat.approval.answered")
    assert answer["reasonCode"] == "answer" and answer["evidence"]["kind"] == "chat_answer"
    chat.hermes.approval_for("deploy it", command="deploy prod")
    second = send(chat.alice, chat.conversation_id, "deploy it now").json()["turn"]["id"]
    approval = stream.wait_for(lambda ev: sum(1 for _, k, _ in ev if k == "approval.requested") == 2)
    pending = [d["approval"] for _, k, d in approval if k == "approval.requested"][-1]
    denied = chat.alice.post(approvals_url(chat, second), json={"approvalId": pending["id"], "choice": "deny"})
    assert denied.status_code == 200 and denied.json()["approval"]["state"] == "denied"
    wait_turn(chat.alice, chat.conversation_id, second)
    shown = [m["content"] for m in messages(chat.alice, chat.conversation_id) if m["role"] == "system"]
    assert shown == ["Answered: blue", "Denied: deploy prod"]
    stream.close()


def test_pending_approvals_expire_with_their_turn(chat: Chat) -> None:
    chat.hermes.approval_for("risky", command="rm -rf /tmp/x")
    stream = Stream(chat.alice, chat.conversation_id)
    turn_id = send(chat.alice, chat.conversation_id, "something risky").json()["turn"]["id"]
    approval = asked(stream)
    assert chat.alice.post(f"/api/conversations/{chat.conversation_id}/turns/{turn_id}/stop").status_code == 202
    done = wait_turn(chat.alice, chat.conversation_id, turn_id, timeout=10)
    assert (done["state"], done["code"]) == ("interrupted", "stopped")
    stream.wait_for(lambda ev: any(k == "approval.resolved" for _, k, _ in ev))
    resolved = [d["approval"] for _, k, d in stream.events if k == "approval.resolved"]
    assert [(r["id"], r["state"]) for r in resolved] == [(approval["id"], "expired")]
    late = chat.alice.post(approvals_url(chat, turn_id), json={"approvalId": approval["id"], "choice": "once"})
    assert_error(late, 409, "approval_expired")
    stream.close()
