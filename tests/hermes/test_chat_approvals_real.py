"""Approvals and questions on a real Hermes (chat.md 3.5, scenario 5): a ``talaria hub`` process, a real runner, real
``hermes serve`` 0.19.0 and the scripted model, which calls Hermes' own ``terminal`` and ``clarify`` tools. Hermes
asks (``approval.request`` for a dangerous command, ``clarify.request`` for a question) and waits; the owner's answer
goes back through the approvals route, and what Hermes does next shows it got there: an approved ``rm -rf`` removes
the directory, a denied one leaves it and Hermes' refusal becomes the reply, a question's answer reaches the model in
the tool result. A second answer is 409 ``approval_expired``, ``always`` is 400; each prompt is seen once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from talaria.testing.model_server import ModelServer, reply_with_tool_result, tool_call, when
from tests.hermes.chat_support import (
    Stream,
    assert_text_kept_out,
    audit_verifies,
    ended,
    make_bot,
    messages,
    send,
    start_chat,
    wait_turn,
)
from tests.hermes.site_support import Site
from tests.integration.web_support import assert_error

APPROVE: dict[str, str] = {"choice": "once"}  # what the page's Approve button sends (chat.md 6.2)
DENY: dict[str, str] = {"choice": "deny"}


def approvals_url(conversation_id: str, turn_id: str) -> str:
    return f"/api/conversations/{conversation_id}/turns/{turn_id}/approvals"


def requested(stream: Stream, turn_id: str, count: int = 1) -> list[dict[str, Any]]:
    """The turn's first ``count`` ``approval.requested`` approvals, once they have come (Hermes builds its agent
    first, so this may take a while under load)."""

    def asked(events: list[tuple[int | None, str, dict[str, Any]]]) -> list[dict[str, Any]]:
        return [d["approval"] for _, k, d in events if k == "approval.requested" and d["turnId"] == turn_id]

    return asked(stream.wait_for(lambda events: len(asked(events)) >= count, timeout=120))[:count]


def pending_shown(client: httpx.Client, conversation_id: str) -> list[dict[str, Any]]:
    """The pending approvals of the snapshot the page renders (its ``Approval needed`` cards)."""
    live = client.get(f"/api/conversations/{conversation_id}/messages").json()["liveTurn"]
    assert live is not None
    shown: list[dict[str, Any]] = live["approvals"]
    return shown


def seen(model: ModelServer, text: str) -> int:
    return model.turn_starts(text)


def tool_results(model: ModelServer, text: str) -> list[str]:
    """The contents of the tool messages after the last user message, in the model requests whose last user message
    holds ``text`` (what the model was told the tool answered in that turn)."""
    found: list[str] = []
    for request in model.chat_requests():
        body = request.body if isinstance(request.body, dict) else {}
        said = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        last_user = max((i for i, m in enumerate(said) if m.get("role") == "user"), default=None)
        if last_user is None or text not in str(said[last_user].get("content")):
            continue
        found += [str(m.get("content")) for m in said[last_user:] if m.get("role") == "tool"]
    return found


def system_texts(client: httpx.Client, conversation_id: str, turn_id: str) -> list[str]:
    return [m["content"] for m in messages(client, conversation_id) if m["role"] == "system" and m["turnId"] == turn_id]


def answered_audit(client: httpx.Client, conversation_id: str) -> list[str]:
    """The reason codes of the conversation's ``chat.approval.answered`` audit events, oldest first."""
    events = client.get("/api/audit", params={"conversation": conversation_id}).json()["events"]
    return [e["reasonCode"] for e in reversed(events) if e["type"] == "chat.approval.answered"]


def logs(site: Site) -> tuple[str, ...]:
    return site.hub.stderr(), site.runner.stderr, site.runner.stdout


def test_an_approved_dangerous_command_runs_once_the_owner_approves(
    site: Site, model: ModelServer, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch-approve"
    scratch.mkdir()
    (scratch / "kept.txt").write_text("x")
    command = f"rm -rf {scratch}"
    prompt = "please clear the approve scratch directory"
    model.script(when("approve scratch", tool_call("terminal", {"command": command}),
                      reply_with_tool_result("The command ran: ")))  # fmt: skip
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    stream = Stream(alice, conversation_id)
    sent = send(alice, conversation_id, prompt)
    assert sent.status_code == 202, sent.text
    turn_id = sent.json()["turn"]["id"]
    (asked,) = requested(stream, turn_id)
    assert (asked["kind"], asked["state"], asked["command"]) == ("approval", "pending", command)
    assert asked["choices"] == ["once", "session", "deny"]  # Hermes offers "always" too; a person may not give it
    assert asked["description"]
    assert [a["id"] for a in pending_shown(alice, conversation_id)] == [asked["id"]]
    assert scratch.is_dir(), "the command ran before it was approved"
    url = approvals_url(conversation_id, turn_id)
    always = alice.post(url, json={"approvalId": asked["id"], "choice": "always"})
    assert_error(always, 400, "invalid_request")
    assert [a["state"] for a in pending_shown(alice, conversation_id)] == ["pending"]
    approved = alice.post(url, json={"approvalId": asked["id"]} | APPROVE)
    assert approved.status_code == 200, approved.text
    assert (approved.json()["approval"]["state"], approved.json()["approval"]["choice"]) == ("approved", "once")
    done = wait_turn(alice, conversation_id, turn_id, timeout=120)
    assert done["state"] == "completed", done
    assert not scratch.exists(), "the approved command did not run"
    (ran,) = tool_results(model, prompt)
    assert json.loads(ran)["exit_code"] == 0, ran
    again = alice.post(url, json={"approvalId": asked["id"]} | APPROVE)
    assert_error(again, 409, "approval_expired")
    assert system_texts(alice, conversation_id, turn_id) == [f"Approved once: {command}"]
    assert answered_audit(alice, conversation_id) == ["once"]
    stream.wait_for(ended(turn_id))
    kinds = [k for _, k, _ in stream.of_turn(turn_id)]
    assert kinds.count("approval.requested") == 1 and kinds.count("approval.resolved") == 1
    assert kinds.index("approval.requested") < kinds.index("approval.resolved") < kinds.index("turn.completed")
    assert seen(model, f"[talaria-run:{turn_id}:") == 1
    stream.close()
    assert audit_verifies(site.tmp / "data")
    assert_text_kept_out([prompt, command], site.tmp / "data", *logs(site))


def test_a_denied_dangerous_command_does_not_run_and_hermes_refusal_is_the_reply(
    site: Site, model: ModelServer, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch-deny"
    scratch.mkdir()
    command = f"rm -rf {scratch}"
    prompt = "please clear the deny scratch directory"
    model.script(when("deny scratch", tool_call("terminal", {"command": command}),
                      reply_with_tool_result("The terminal said: ")))  # fmt: skip
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    stream = Stream(alice, conversation_id)
    turn_id = send(alice, conversation_id, prompt).json()["turn"]["id"]
    (asked,) = requested(stream, turn_id)
    assert [a["id"] for a in pending_shown(alice, conversation_id)] == [asked["id"]]
    url = approvals_url(conversation_id, turn_id)
    denied = alice.post(url, json={"approvalId": asked["id"]} | DENY)
    assert denied.status_code == 200, denied.text
    assert denied.json()["approval"]["state"] == "denied"
    done = wait_turn(alice, conversation_id, turn_id, timeout=120)
    assert done["state"] == "completed", done
    assert scratch.is_dir(), "the denied command ran"
    (refused,) = tool_results(model, prompt)
    assert "BLOCKED: Command denied by user" in refused, refused
    reply = [m for m in messages(alice, conversation_id) if m["role"] == "assistant" and m["final"]]
    assert len(reply) == 1 and reply[0]["content"].startswith("The terminal said: ")
    assert refused in reply[0]["content"]
    assert system_texts(alice, conversation_id, turn_id) == [f"Denied: {command}"]
    assert answered_audit(alice, conversation_id) == ["deny"]
    again = alice.post(url, json={"approvalId": asked["id"]} | DENY)
    assert_error(again, 409, "approval_expired")
    assert seen(model, f"[talaria-run:{turn_id}:") == 1
    stream.close()
    assert audit_verifies(site.tmp / "data")
    assert_text_kept_out([prompt, command, reply[0]["content"]], site.tmp / "data", *logs(site))


def test_a_question_takes_a_choice_or_a_free_text_answer_and_the_model_gets_it(site: Site, model: ModelServer) -> None:
    question, choices = "Which colour should the banner be?", ["teal", "amber"]
    model.script(when("banner colour", tool_call("clarify", {"question": question, "choices": choices}),
                      reply_with_tool_result("Noted: ")))  # fmt: skip
    alice = site.alice
    conversation_id = start_chat(alice, make_bot(alice))
    stream = Stream(alice, conversation_id)
    answers = {"pick the banner colour": "amber", "choose the banner colour freely": "a deep forest green"}
    for prompt, answer in answers.items():
        turn_id = send(alice, conversation_id, prompt).json()["turn"]["id"]
        (asked,) = requested(stream, turn_id)
        assert (asked["kind"], asked["question"], asked["choices"]) == ("clarify", question, choices)
        assert [a["id"] for a in pending_shown(alice, conversation_id)] == [asked["id"]]
        url = approvals_url(conversation_id, turn_id)
        wrong = alice.post(url, json={"approvalId": asked["id"], "choice": "once"})
        assert_error(wrong, 400, "invalid_request")
        answered = alice.post(url, json={"approvalId": asked["id"], "answer": answer})
        assert answered.status_code == 200, answered.text
        assert (answered.json()["approval"]["state"], answered.json()["approval"]["choice"]) == ("answered", answer)
        done = wait_turn(alice, conversation_id, turn_id, timeout=120)
        assert done["state"] == "completed", done
        results = tool_results(model, prompt)
        assert len(results) == 1 and json.loads(results[0])["user_response"] == answer, results
        assert system_texts(alice, conversation_id, turn_id) == [f"Answered: {answer}"]
        again = alice.post(url, json={"approvalId": asked["id"], "answer": answer})
        assert_error(again, 409, "approval_expired")
        assert seen(model, f"[talaria-run:{turn_id}:") == 1
    assert answered_audit(alice, conversation_id) == ["answer", "answer"]
    stream.close()
    assert audit_verifies(site.tmp / "data")
    assert_text_kept_out([*answers, *answers.values(), question], site.tmp / "data", *logs(site))
