"""Team tools' acceptance on real Hermes (team-tools.md 13): real ``hermes serve`` 0.19.0 with the plugin, a real
hub and a real ``talaria runner`` process, the scripted model deciding deterministically. Setup: ``alice``
(``canManageTeam``, ``local: [default, work]``), her bot ``Lead`` on ``local/default`` with team permission, a
conversation with it. Every scenario ends with ``talaria audit verify``. Tool names drop ``talaria_`` below."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.testing.model_server import (
    LoggedRequest,
    ModelServer,
    Rule,
    Step,
    ToolSelector,
    fail,
    from_prompt,
    from_result,
    gated,
    reply,
    slow,
    tool_call,
    when,
)
from talaria.testing.real_hermes import RealHermes
from tests.conftest import db_rows, login
from tests.hermes.chat_support import audit_verifies, make_bot, messages, send, start_chat, wait_turn
from tests.hermes.conftest import Node
from tests.hermes.site_support import Site, stored_reply, with_token_file
from tests.hermes.team_support import TEAM, offered_team_tools, tool_results
from tests.integration.runner_support import RunnerProcess, wait_until

ASSIGNMENT = r"(?m)^\[talaria-assignment\]"
REVIEW = r"(?m)^\[talaria-goal-review\]"
RESULT = r"(?m)^\[talaria-goal-result\]"
MARK = "mark-9c41"


def tool(name: str, arguments: dict[str, Any]) -> Step:
    return tool_call(ToolSelector(TEAM, f"talaria_{name}:"), arguments)


def build_it(brief: str = "mw-1 write the draft") -> Rule:
    """S1's user turn: a member twice under one requestId, a team, a goal and one assignment."""
    return when(
        None,
        tool("create_bot", {"requestId": "R1", "name": "Writer", "profile": "work"}),
        tool("create_bot", {"requestId": "R1", "name": "Writer", "profile": "work"}),
        tool("create_team", {"requestId": "R2", "name": "Crew", "memberIds": [from_result(0, "/bot/id")]}),
        tool("start_goal", {"requestId": "R3", "teamId": from_result(2, "/team/id"), "title": "Report",
                            "objective": "write the report"}),
        tool("assign", {"requestId": "R4", "goalId": from_result(3, "/goal/id"), "botId": from_result(0, "/bot/id"),
                        "title": "Draft", "brief": brief}),
        reply("started"),
        pattern=r"^build it",
    )  # fmt: skip


def review_and_finish() -> Rule:
    """S1b's wake: accept the assignment, finish the goal with one check."""
    return when(
        None,
        tool("review_assignment", {"requestId": "R5", "assignmentId": from_prompt(r"assignment (asg_\S+) review"),
                                   "decision": "accept", "note": "good"}),
        tool("finish_goal", {"requestId": "R6", "goalId": from_prompt(r"goalId: (\S+)"), "status": "complete",
                             "result": "the report is written", "acceptanceRevision": 1,
                             "checks": [{"criterion": 0, "passed": True, "evidence": "the draft"}]}),
        reply("done"),
        pattern=REVIEW,
    )  # fmt: skip


@dataclass
class Team:
    """The setup of team-tools.md 13 on a hub: in this process by default, a ``talaria hub`` process with
    ``HERMES_TEAM_RUNNER=1``."""

    model: ModelServer
    data_dir: Path
    runner_id: str
    sign_in: Callable[[str], httpx.Client]
    alice: httpx.Client
    lead: str
    conversation_id: str

    def rows(self, sql: str) -> list[dict[str, Any]]:
        return db_rows(self.data_dir / "talaria.sqlite3", sql)

    def say(self, text: str, conversation_id: str | None = None) -> dict[str, Any]:
        where = conversation_id or self.conversation_id
        sent = send(self.alice, where, text)
        assert sent.status_code == 202, sent.text
        return wait_turn(self.alice, where, sent.json()["turn"]["id"], timeout=120)

    def requests_after(self, pattern: str) -> list[LoggedRequest]:
        """The model requests whose last user message matches ``pattern`` (its own turn's requests)."""
        found = []
        for request in self.model.chat_requests():
            prompt = _last_user_text(request)
            if request.tools and prompt is not None and re.search(pattern, prompt):
                found.append(request)
        return found

    def goal(self) -> dict[str, Any]:
        [row] = self.rows("SELECT * FROM goal")
        return row

    def system_messages(self) -> list[dict[str, Any]]:
        return [m for m in messages(self.alice, self.conversation_id) if m["role"] == "system"]


def turn_results(request: LoggedRequest) -> list[str]:
    """The tool results of the request's own turn: the tool messages after its last user message."""
    listed = request.body["messages"]
    last = max((i for i, m in enumerate(listed) if m.get("role") == "user"), default=-1)
    return [str(m.get("content")) for m in listed[last + 1 :] if m.get("role") == "tool"]


def _last_user_text(request: LoggedRequest) -> str | None:
    for message in reversed(request.body["messages"]):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return None


@pytest.fixture
def team(request: pytest.FixtureRequest, model: ModelServer) -> Iterator[Team]:
    if os.environ.get("HERMES_TEAM_RUNNER") == "1":  # the hub too a process (team-tools.md 13)
        site: Site = request.getfixturevalue("site")
        granted = site.root.patch("/api/admin/accounts/alice", json={"canManageTeam": True})
        assert granted.status_code == 200, granted.text
        data_dir, runner_id, sign_in = site.data, site.runner_id, site.sign_in
    else:
        node: Node = request.getfixturevalue("node")
        node.server.hub.accounts.update("alice", "default", {"canManageTeam": True})
        data_dir, runner_id = node.server.settings.data_dir, node.runner_id

        def sign_in(username: str) -> httpx.Client:
            return login(node.server, username)

    alice = sign_in("alice")
    try:
        lead = make_bot(alice, "Lead")
        assert alice.patch(f"/api/bots/{lead}", json={"teamPermission": True}).status_code == 200
        yield Team(model, data_dir, runner_id, sign_in, alice, lead, start_chat(alice, lead))
    finally:
        alice.close()
    assert audit_verifies(data_dir)


def _successful_results_say_no_failure(team: Team) -> None:
    """Hermes 0.19.0 marks a result failed when its first 500 characters say failed or error (6.1)."""
    for request in team.model.chat_requests():
        for text in tool_results(request):
            if '"code":' not in text[:200]:
                assert "failed" not in text[:500] and "error" not in text[:500], text[:500]


def test_s1_one_user_turn_forms_a_team_and_runs_the_goal_to_its_report(team: Team) -> None:
    model = team.model
    model.script(build_it(), when(None, reply("draft done: mw-1 is written"), pattern=ASSIGNMENT), review_and_finish())
    started = team.say("build it")
    assert started["state"] == "completed"
    # S1: one new bot, the same answer twice
    first = team.requests_after(r"^build it")
    results = turn_results(first[-1])
    assert results[0] == results[1]
    writer = json.loads(results[0])["bot"]
    assert [r["name"] for r in team.rows("SELECT name FROM bot ORDER BY created_at")] == ["Lead", "Writer"]
    members = team.rows("SELECT bot_id FROM team_member ORDER BY position")
    assert [m["bot_id"] for m in members] == [team.lead, writer["id"]]
    wait_until(lambda: team.goal()["status"] in ("review", "complete"), what="the goal to enter review", timeout=120)
    [task] = team.rows("SELECT * FROM task")
    assert (task["cell"], task["profile"], task["approved_by"]) == (
        "local",
        "work",
        f"policy:team_permission:{team.lead}",
    )
    assert json.loads(task["spec"])["approval"]["grantedBy"] == "alice"
    member_requests = team.requests_after(ASSIGNMENT)
    assert member_requests and all(offered_team_tools(r) == [] for r in member_requests)
    # S1b: the review wake accepts and finishes; the terminal message needs no second wake
    wait_until(lambda: team.goal()["status"] == "complete", what="the goal to complete", timeout=120)
    wait_until(lambda: len(team.system_messages()) == 2, what="the terminal message", timeout=60)
    shown = [(m["role"], m["author"], m["content"].split("\n")[0]) for m in messages(team.alice, team.conversation_id)
             if m["role"] != "tool"]  # fmt: skip
    assert shown == [
        ("user", "alice", "build it"),
        ("assistant", team.lead, "started"),
        ("system", "talaria", 'Goal "Report" of team "Crew" has results awaiting review.'),
        ("assistant", team.lead, "done"),
        ("system", "talaria", 'Goal "Report" of team "Crew" is complete.'),
    ]
    review, terminal = team.system_messages()
    assert review["reference"]["goalId"] == terminal["reference"]["goalId"] == team.goal()["id"]
    wake = team.rows("SELECT * FROM chat_turn WHERE trigger = 'automatic'")
    assert [(w["trigger_message_id"], w["state"]) for w in wake] == [(review["id"], "completed")]
    assert team.rows("SELECT kind, woke FROM team_delivery ORDER BY created_at") == [
        {"kind": "review", "woke": 1}, {"kind": "terminal", "woke": 0}]  # fmt: skip
    [assignment] = team.rows("SELECT status, attempt FROM assignment")
    assert assignment == {"status": "complete", "attempt": 1}
    assert model.unresolved == []
    _successful_results_say_no_failure(team)


def test_s3_bad_and_forged_arguments_are_refused_in_hermes_and_whoami_names_alice_lead_and_this_turn(
    team: Team,
) -> None:
    bob = team.sign_in("bob")
    theirs = make_bot(bob, "Theirs")
    bob.close()
    model = team.model
    model.script(when(None,
        tool("create_bot", {"requestId": "R1", "name": "Ghost", "teamPermission": True}),
        tool("create_bot", {"requestId": "R2", "name": "Ghost", "owner": "bob"}),
        tool("create_team", {"requestId": "R3", "name": "Crew", "memberIds": "not a list"}),
        tool("create_bot", {"requestId": "R4", "name": "x" * 101}),
        tool("create_team", {"requestId": "R5", "name": "Crew", "memberIds": [theirs]}),
        tool("whoami", {"account": "mallory", "botId": "bot_x", "turnId": "trn_x"}),
        reply("checked"), pattern=r"^forge"))  # fmt: skip
    before = team.rows("SELECT COUNT(*) AS n FROM team"), team.rows("SELECT COUNT(*) AS n FROM bot")
    turn = team.say("forge it")
    assert turn["state"] == "completed"
    results = turn_results(team.requests_after(r"^forge")[-1])
    # Hermes appends a loop warning to a tool's third failure in a turn: the hub's answer is the first paragraph
    refusals = [json.loads(r.split("\n\n")[0]) for r in results[:5]]
    assert [r["code"] for r in refusals] == ["invalid_request"] * 4 + ["not_found"]
    named = [r["error"].split(":")[0] for r in refusals[:4]]
    assert named == ["teamPermission", "owner", "memberIds", "name"]  # the first key at fault
    identity = json.loads(results[5])
    assert (identity["account"], identity["botId"], identity["turnId"]) == ("alice", team.lead, turn["id"])
    assert (team.rows("SELECT COUNT(*) AS n FROM team"), team.rows("SELECT COUNT(*) AS n FROM bot")) == before


def test_s8_a_review_wake_cannot_start_or_resume_a_goal(team: Team) -> None:
    model = team.model
    model.script(
        build_it(), when(None, reply("draft done"), pattern=ASSIGNMENT),
        when(None, tool("start_goal", {"requestId": "R7", "teamId": from_prompt(r"teamId: (\S+)"), "title": "Again",
                                       "objective": "more"}),
             tool("resume_goal", {"requestId": "R8", "goalId": from_prompt(r"goalId: (\S+)")}),
             reply("cannot"), pattern=REVIEW),
    )  # fmt: skip
    team.say("build it")
    wait_until(lambda: team.requests_after(REVIEW) and turn_results(team.requests_after(REVIEW)[-1])[1:],
               what="the wake's two calls", timeout=120)  # fmt: skip
    wait_until(lambda: team.rows("SELECT state FROM chat_turn WHERE trigger = 'automatic'")[0]["state"] == "completed",
               what="the wake to end", timeout=60)  # fmt: skip
    results = turn_results(team.requests_after(REVIEW)[-1])
    assert [json.loads(r)["code"] for r in results] == ["user_instruction_required", "user_instruction_required"]
    assert len(team.rows("SELECT id FROM goal")) == 1


def test_s9_a_failed_member_run_is_retried_as_a_new_task_up_to_the_limit(team: Team) -> None:
    model = team.model

    def retry(request_id: str, status: str) -> Step:
        return tool("review_assignment", {"requestId": request_id, "decision": "retry", "note": "try again",
                                          "assignmentId": from_prompt(rf"assignment (asg_\S+) {status}")})  # fmt: skip

    model.script(
        build_it(),
        when(None, fail(500), pattern=ASSIGNMENT),
        when(None, reply("second try worked"), pattern=ASSIGNMENT + r"[\s\S]*attempt: 2"),
        when(None, reply("third try worked"), pattern=ASSIGNMENT + r"[\s\S]*attempt: 3"),
        when(None, retry("R9", "failed"), reply("retried"), pattern=REVIEW + r"[\s\S]*failed attempt 1/3"),
        when(None, retry("R10", "review"), reply("again"), pattern=REVIEW + r"[\s\S]*review attempt 2/3"),
        when(None, retry("R11", "review"), reply("past the limit"), pattern=REVIEW + r"[\s\S]*review attempt 3/3"),
    )  # fmt: skip
    team.say("build it")
    wait_until(lambda: [r["attempt"] for r in team.rows("SELECT attempt FROM assignment_run")] == [1, 2, 3],
               what="the third attempt", timeout=240)  # fmt: skip
    wait_until(lambda: team.requests_after(REVIEW + r"[\s\S]*review attempt 3/3")
               and turn_results(team.requests_after(REVIEW + r"[\s\S]*review attempt 3/3")[-1]),
               what="the retry past the limit", timeout=120)  # fmt: skip
    [refused] = turn_results(team.requests_after(REVIEW + r"[\s\S]*review attempt 3/3")[-1])
    assert json.loads(refused.split("\n\n")[0])["code"] == "assignment_retry_limit"
    runs = team.rows("SELECT attempt, outcome, task_id FROM assignment_run ORDER BY attempt")
    assert [r["outcome"] for r in runs] == ["FAILED", "SUCCEEDED", "SUCCEEDED"]
    assert len({r["task_id"] for r in runs}) == 3 and len(team.rows("SELECT id FROM task")) == 3
    assert team.rows("SELECT status, attempt FROM assignment") == [{"status": "review", "attempt": 3}]


def test_s11_no_audit_body_or_evidence_holds_a_free_text_argument(team: Team) -> None:
    model = team.model
    model.script(build_it(brief=f"brief {MARK}"), when(None, reply(f"result {MARK}"), pattern=ASSIGNMENT),
                 when(None, reply("noted"), pattern=REVIEW))  # fmt: skip
    team.say("build it")
    wait_until(lambda: team.goal()["status"] == "review", what="the review", timeout=120)
    dumped = json.dumps(team.rows("SELECT * FROM audit_event")) + json.dumps(team.rows("SELECT * FROM team_evidence"))
    assert MARK not in dumped
    calls = [json.loads(r["body"]) for r in team.rows("SELECT body FROM audit_event") if '"team_tool"' in r["body"]]
    assert calls and all(c["team"]["runnerId"] == team.runner_id for c in calls)


def test_s2_a_request_id_reused_for_another_call_is_an_idempotency_conflict_and_changes_nothing(team: Team) -> None:
    team.model.script(
        build_it(), when(None, reply("draft done"), pattern=ASSIGNMENT),
        when(None, tool("create_team", {"requestId": "R2", "name": "Other crew", "memberIds": [team.lead]}),
             reply("reused"), pattern=r"^reuse"),
    )  # fmt: skip
    team.say("build it")
    before = team.rows("SELECT id, name, revision FROM team")
    assert team.say("reuse R2")["state"] == "completed"
    [result] = turn_results(team.requests_after(r"^reuse")[-1])
    assert json.loads(result)["code"] == "idempotency_conflict"
    assert team.rows("SELECT id, name, revision FROM team") == before


def test_s4_permission_revoked_mid_round_refuses_the_next_call_and_creates_nothing(team: Team) -> None:
    model = team.model
    held = gated(tool("create_bot", {"requestId": "R7", "name": "Ghost"}), "revoke")
    later = tool("create_bot", {"requestId": "R8", "name": "Ghost2"})
    model.script(when(None, tool("list_bots", {}), held, later, reply("went on"), pattern=r"^revoke"))
    sent = send(team.alice, team.conversation_id, "revoke it")
    assert sent.status_code == 202
    model.wait_for(lambda log: model.arrived("revoke") == 1, timeout=120)
    revoked = team.alice.patch(f"/api/bots/{team.lead}", json={"teamPermission": False})
    assert revoked.status_code == 200
    [changed] = team.rows("SELECT seq FROM audit_event WHERE type = 'team.bot.permission_changed' "
                          "AND reason_code = 'revoked'")  # fmt: skip
    model.release("revoke")
    turn = wait_turn(team.alice, team.conversation_id, sent.json()["turn"]["id"], timeout=120)
    assert turn["state"] == "completed"
    results = turn_results(team.requests_after(r"^revoke")[-1])
    assert json.loads(results[1])["code"] == "team_tools_forbidden"
    assert len(results) == 3 and '"bot":' not in results[2]  # refused, whoever refused it
    assert team.rows("SELECT name FROM bot WHERE name LIKE 'Ghost%'") == []
    later = team.rows(f"SELECT body FROM audit_event WHERE seq > {changed['seq']}")
    assert not [e for e in later if '"via":"team_tool"' in e["body"] or '"team_tool"' in e["body"]]


def test_s5_two_administrators_at_once_get_their_own_tools_and_no_cross_talk(team: Team) -> None:
    model = team.model
    lead2 = make_bot(team.alice, "Lead2")
    assert team.alice.patch(f"/api/bots/{lead2}", json={"teamPermission": True}).status_code == 200
    other_chat = start_chat(team.alice, lead2)
    for text, name, other, request_id in (("pair A", "Crew A", lead2, "R9"), ("pair B", "Crew B", team.lead, "R10")):
        model.script(when(None, gated(tool("whoami", {}), "both", parties=2),
                          tool("create_team", {"requestId": request_id, "name": name, "memberIds": [other]}),
                          reply(f"{name} formed"), pattern=f"^{text}"))  # fmt: skip
    first = send(team.alice, team.conversation_id, "pair A")
    second = send(team.alice, other_chat, "pair B")
    turns = [wait_turn(team.alice, team.conversation_id, first.json()["turn"]["id"], timeout=120),
             wait_turn(team.alice, other_chat, second.json()["turn"]["id"], timeout=120)]  # fmt: skip
    assert [t["state"] for t in turns] == ["completed", "completed"]
    a, b = team.requests_after(r"^pair A")[-1], team.requests_after(r"^pair B")[-1]
    assert set(offered_team_tools(a)).isdisjoint(offered_team_tools(b))
    for request, bot, turn in ((a, team.lead, turns[0]), (b, lead2, turns[1])):
        identity = json.loads(turn_results(request)[0])
        assert (identity["botId"], identity["turnId"]) == (bot, turn["id"])
    teams = {t["name"]: t["administrator_id"] for t in team.rows("SELECT name, administrator_id FROM team")}
    assert teams == {"Crew A": team.lead, "Crew B": lead2}


def test_s10_stopping_a_goal_while_its_member_runs_cancels_the_job_and_posts_was_stopped(team: Team) -> None:
    model = team.model
    model.script(build_it(), when(None, gated(reply("too late"), "member"), pattern=ASSIGNMENT))
    try:
        team.say("build it")
        model.wait_for(lambda log: model.arrived("member") == 1, timeout=120)
        goal_id = team.goal()["id"]
        stopped = team.alice.post(f"/api/goals/{goal_id}/stop", json={})
        assert stopped.status_code == 200 and stopped.json()["goal"]["status"] == "cancelling"
        wait_until(lambda: team.goal()["status"] == "cancelled", what="the goal to be cancelled", timeout=120)
        assert team.rows("SELECT state FROM hermes_job") == [{"state": "CANCELLED"}]
        wait_until(lambda: team.system_messages() != [], what="the stop message", timeout=60)
        assert [m["content"] for m in team.system_messages()] == ['Goal "Report" of team "Crew" was stopped.']
        assert team.rows("SELECT woke FROM team_delivery") == [{"woke": 0}]
        assert team.rows("SELECT COUNT(*) AS n FROM chat_turn WHERE trigger = 'automatic'") == [{"n": 0}]
    finally:
        model.release("member")


def test_s6_the_hub_killed_mid_member_run_restarts_and_the_goal_goes_on_without_a_second_dispatch(
    site: Site, hermes: RealHermes, model: ModelServer
) -> None:
    granted = site.root.patch("/api/admin/accounts/alice", json={"canManageTeam": True})
    assert granted.status_code == 200, granted.text
    alice = site.sign_in("alice")  # the change ended her sessions
    lead = make_bot(alice, "Lead")
    assert alice.patch(f"/api/bots/{lead}", json={"teamPermission": True}).status_code == 200
    conversation_id = start_chat(alice, lead)
    model.script(build_it(), when(None, slow("draft done: mw-1 is written", first_byte_delay_s=1.0,
                                             chunk_delay_s=0.3), pattern=ASSIGNMENT), review_and_finish())  # fmt: skip
    sent = send(alice, conversation_id, "build it")
    assert wait_turn(alice, conversation_id, sent.json()["turn"]["id"], timeout=120)["state"] == "completed"
    model.wait_for(lambda log: model.turn_starts("[talaria-assignment]") == 1, timeout=120)
    os.kill(site.hub.proc.pid, signal.SIGSTOP)  # mid member stream
    rows = _site_rows(site, "SELECT id, run_id FROM hermes_job")
    assert len(rows) == 1
    marker = f"[talaria-run:{rows[0]['run_id']}:{rows[0]['id']}]"
    deadline = time.monotonic() + 60
    while stored_reply(hermes, marker, "work") is None:
        assert time.monotonic() < deadline, "Hermes never stored the member's reply"
        time.sleep(0.2)
    site.kill_hub()
    site.restart_hub()
    site.runner.wait_for("runner connected", count=2, timeout=60)
    alice = site.sign_in("alice")
    wait_until(lambda: _site_rows(site, "SELECT status FROM goal")[0]["status"] == "complete",
               what="the goal to complete after the restart", timeout=180)  # fmt: skip
    wait_until(lambda: len([m for m in messages(alice, conversation_id) if m["role"] == "system"]) == 2,
               what="the terminal message", timeout=60)  # fmt: skip
    [job] = _site_rows(site, "SELECT state, attempt FROM hermes_job")
    assert job == {"state": "SUCCEEDED", "attempt": 2}  # the second attempt took the reply from Hermes' history
    assert _site_rows(site, "SELECT attempt FROM assignment") == [{"attempt": 1}]
    assert len(_site_rows(site, "SELECT id FROM task")) == 1
    assert model.turn_starts("[talaria-assignment]") == 1  # the member's prompt reached the model once
    system = [m["content"].split("\n")[0] for m in messages(alice, conversation_id) if m["role"] == "system"]
    assert system == ['Goal "Report" of team "Crew" has results awaiting review.',
                      'Goal "Report" of team "Crew" is complete.']  # fmt: skip
    assert audit_verifies(site.data)


def _site_rows(site: Site, sql: str) -> list[dict[str, Any]]:
    return db_rows(site.data / "talaria.sqlite3", sql)


def _team_site(site: Site, allowed: dict[str, list[str]] | None = None) -> tuple[httpx.Client, str, str]:
    """alice with ``canManageTeam`` (and ``allowed`` profiles), her bot Lead with team permission, a chat with it."""
    body: dict[str, Any] = {"canManageTeam": True} | ({"allowedProfiles": allowed} if allowed else {})
    granted = site.root.patch("/api/admin/accounts/alice", json=body)
    assert granted.status_code == 200, granted.text
    alice = site.sign_in("alice")  # the change ended her sessions
    lead = make_bot(alice, "Lead")
    assert alice.patch(f"/api/bots/{lead}", json={"teamPermission": True}).status_code == 200
    return alice, lead, start_chat(alice, lead)


def test_s2_a_request_id_is_replayed_after_a_hub_restart(site: Site, model: ModelServer) -> None:
    alice, _, conversation_id = _team_site(site)
    call = tool("create_bot", {"requestId": "R1", "name": "Writer", "profile": "work"})
    model.script(when(None, call, reply("made"), pattern=r"^make writer"))
    first = send(alice, conversation_id, "make writer")
    assert wait_turn(alice, conversation_id, first.json()["turn"]["id"], timeout=120)["state"] == "completed"
    site.kill_hub()
    site.restart_hub()
    site.runner.wait_for("runner connected", count=2, timeout=60)
    alice = site.sign_in("alice")
    again = send(alice, conversation_id, "make writer again")
    assert wait_turn(alice, conversation_id, again.json()["turn"]["id"], timeout=120)["state"] == "completed"
    answers = [turn_results(r)[-1] for r in model.chat_requests() if r.tools and turn_results(r)
               and re.search(r"^make writer", _last_user_text(r) or "")]  # fmt: skip
    assert answers[0] == answers[-1] and json.loads(answers[-1])["bot"]["name"] == "Writer"  # the stored bytes
    assert [r["name"] for r in _site_rows(site, "SELECT name FROM bot ORDER BY created_at")] == ["Lead", "Writer"]
    assert audit_verifies(site.data)


def test_s7_a_member_on_a_node_that_is_down_runs_once_it_is_back_after_a_hub_restart(
    site: Site, model: ModelServer, tmp_path: Path
) -> None:
    alice, _, conversation_id = _team_site(site, {"local": ["default", "work"], "lab": ["default"]})
    with RealHermes(tmp_path / "hermes-lab", model.base_url) as lab_hermes:
        registered = site.root.post("/api/admin/runners", json={
            "name": "lab node", "source": "lab", "allowedProfiles": ["default"], "hermesURL": lab_hermes.url,
            "serverURL": site.url})  # fmt: skip
        assert registered.status_code == 201, registered.text
        (tmp_path / "lab").mkdir()
        lab_config = with_token_file(tmp_path / "lab" / "runner.json", lab_hermes, registered.json()["config"])
        model.script(
            when(None,
                 tool("create_bot", {"requestId": "R1", "name": "Writer", "source": "lab", "profile": "default"}),
                 tool("create_team", {"requestId": "R2", "name": "Crew", "memberIds": [from_result(0, "/bot/id")]}),
                 tool("start_goal", {"requestId": "R3", "teamId": from_result(1, "/team/id"), "title": "Report",
                                     "objective": "write the report"}),
                 tool("assign", {"requestId": "R4", "goalId": from_result(2, "/goal/id"),
                                 "botId": from_result(0, "/bot/id"), "title": "Draft", "brief": "mw-7 draft"}),
                 reply("started"), pattern=r"^build it"),
            when(None, reply("draft done on lab"), pattern=ASSIGNMENT),
            review_and_finish(),
        )  # fmt: skip
        sent = send(alice, conversation_id, "build it")
        assert wait_turn(alice, conversation_id, sent.json()["turn"]["id"], timeout=120)["state"] == "completed"
        wait_until(lambda: _site_rows(site, "SELECT status FROM assignment")[0]["status"] == "running",
                   what="the dispatch", timeout=60)  # fmt: skip
        assert _site_rows(site, "SELECT state FROM hermes_job") == [{"state": "QUEUED"}]  # no lab runner yet
        site.kill_hub()
        site.restart_hub()
        site.runner.wait_for("runner connected", count=2, timeout=60)
        lab_runner = RunnerProcess(lab_config, tmp_path / "logs", name="lab-runner")
        try:
            lab_runner.wait_for("runner connected", timeout=60)
            alice = site.sign_in("alice")
            wait_until(lambda: _site_rows(site, "SELECT status FROM goal")[0]["status"] == "complete",
                       what="the goal to complete", timeout=180)  # fmt: skip
        finally:
            lab_runner.stop()
            lab_runner.close()
    assert len(_site_rows(site, "SELECT id FROM task")) == 1
    assert _site_rows(site, "SELECT attempt FROM assignment") == [{"attempt": 1}]
    assert model.turn_starts("[talaria-assignment]") == 1
    [job] = _site_rows(site, "SELECT cell, state FROM hermes_job")
    assert job == {"cell": "lab", "state": "SUCCEEDED"}
    system = [m["content"].split("\n")[0] for m in messages(alice, conversation_id) if m["role"] == "system"]
    assert system[-1] == 'Goal "Report" of team "Crew" is complete.'
    assert audit_verifies(site.data)
