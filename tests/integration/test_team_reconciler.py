"""Team tools' reconciler over a real hub, a real runner process and the Hermes fixture (team-tools.md 4, 7): the
calls a model would make are sent to the grant's loopback listener during the turns, and everything after is the
hub's own doing. An assignment becomes a job approved by policy and runs as the member's own turn without team
tools; its reply settles it into review; the goal enters review once the coordinator's turn ended; the review
delivery posts a system message in the origin conversation and wakes the coordinator once; the wake reviews and
finishes; the terminal delivery posts "is complete." without a second wake. A stopped goal cancels its running
assignment's job and posts "was stopped." with no wake. The real-Hermes scenarios are tests/hermes/test_team_flow.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.clock import SystemClock
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account, db_rows, login
from tests.hermes.chat_support import Stream, make_bot, messages, send, start_chat, wait_turn
from tests.integration.runner_support import RunnerProcess, register_node, wait_until

HOLD = 1.0  # seconds before each reply delta while a test drives a turn's tools (then 0: the turn ends at once)


@dataclass
class Team:
    server: HubServer
    hermes: HermesFixture
    alice: httpx.Client
    lead: str
    conversation_id: str

    def rows(self, sql: str) -> list[dict[str, Any]]:
        return db_rows(self.server.settings.sqlite_path, sql)

    def tools(self, turn_text: str) -> Callable[..., Any]:
        """A caller of the team tools bound for the turn whose prompt holds ``turn_text``."""
        # a reconciler wake, a delivery, a chat turn, a gateway and a grant: a generous bound for a loaded machine
        wait_until(
            lambda: self._binding(turn_text) is not None, what=f"the grant of the turn {turn_text!r}", timeout=30
        )
        bind = self._binding(turn_text)
        assert bind is not None
        headers = {"Authorization": f"Bearer {bind['token']}"}
        listed = httpx.post(f"{bind['bridge_url']}/tools/list", json={}, headers=headers, timeout=10).json()
        ids = {tool["name"]: tool["id"] for tool in listed["tools"]}
        calls = iter(range(1, 1000))

        def call(tool: str, /, **arguments: Any) -> Any:
            body = {"toolId": ids[tool], "arguments": arguments, "callId": f"c{next(calls)}"}
            answer = httpx.post(f"{bind['bridge_url']}/tools/call", json=body, headers=headers, timeout=30).json()
            text = answer["content"][0]["text"]
            assert not answer.get("isError"), text
            return json.loads(text)

        return call

    def _binding(self, turn_text: str) -> dict[str, Any] | None:
        bindings = self.hermes.bindings()
        running = [t.runtime_id for t in self.hermes.turns() if turn_text in t.text and t.status == "running"]
        return next((bindings[r] for r in running if r in bindings), None)

    def goal(self, goal_id: str) -> dict[str, Any]:
        [row] = self.rows(f"SELECT * FROM goal WHERE id = '{goal_id}'")
        return row


@pytest.fixture
def team(tmp_path: Path, fast_argon2: None) -> Iterator[Team]:
    with HermesFixture() as hermes:
        server = HubServer(tmp_path / "data", SystemClock()).start()
        runner = None
        try:
            add_account(server, "alice", allowed_profiles={"local": ["default"]}, can_manage_team=True)
            path = register_node(server, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token)
            runner = RunnerProcess(path, tmp_path / "logs", "runner")
            runner.wait_for("runner connected")
            alice = login(server, "alice")
            lead = make_bot(alice, "Lead")
            assert alice.patch(f"/api/bots/{lead}", json={"teamPermission": True}).status_code == 200
            yield Team(server, hermes, alice, lead, start_chat(alice, lead))
            alice.close()
        finally:
            if runner is not None:
                runner.close()
            server.stop()


def _start(team: Team, text: str) -> str:
    sent = send(team.alice, team.conversation_id, text)
    assert sent.status_code == 202, sent.text
    return str(sent.json()["turn"]["id"])


def _form_and_assign(team: Team) -> tuple[str, str, str]:
    """One user turn: a member, a team, a goal and one assignment; answers (turn id, goal id, assignment id)."""
    team.hermes.knobs.delta_count, team.hermes.knobs.delta_delay = 100, HOLD
    turn_id = _start(team, "build it")
    call = team.tools("build it")
    writer = call("talaria_create_bot", requestId="R1", name="Writer")["bot"]["id"]
    crew = call("talaria_create_team", requestId="R2", name="Crew", memberIds=[writer])["team"]["id"]
    goal = call("talaria_start_goal", requestId="R3", teamId=crew, title="Report", objective="write the report")
    goal_id = goal["goal"]["id"]
    assigned = call("talaria_assign", requestId="R4", goalId=goal_id, botId=writer, title="Draft", brief="mw-1 draft")
    team.hermes.knobs.delta_delay = 0
    assert wait_turn(team.alice, team.conversation_id, turn_id, timeout=30)["state"] == "completed"
    return turn_id, goal_id, assigned["assignment"]["id"]


def test_a_goal_runs_its_assignment_as_a_job_reviews_finishes_and_reports_back(team: Team) -> None:
    team.hermes.knobs.delta_delay = 0
    stream = Stream(team.alice, team.conversation_id)
    # the review wake starts as soon as the user turn ends (maybe before the test sees that end): it holds from its
    # first delta, the other turns do not
    team.hermes.delta_delay_for("[talaria-goal-review]", HOLD)
    user_turn, goal_id, assignment_id = _form_and_assign(team)
    wait_until(lambda: team.goal(goal_id)["status"] == "review", what="the goal to enter review", timeout=30)
    [assignment] = team.rows(f"SELECT * FROM assignment WHERE id = '{assignment_id}'")
    assert (assignment["status"], assignment["attempt"]) == ("review", 1)
    assert assignment["result"].startswith("echo: [talaria-assignment]\nassignmentId: " + assignment_id)
    [task] = team.rows("SELECT * FROM task")
    assert task["approved_by"] == f"policy:team_permission:{team.lead}" and task["title"] == "Assignment: Draft"
    spec = json.loads(task["spec"])
    assert spec["approval"]["grantedBy"] == "alice" and spec["team"]["attempt"] == 1
    member_turns = [t for t in team.hermes.turns() if t.text.startswith("[talaria-assignment]")]
    assert len(member_turns) == 1
    assert all(b.get("session_id") != member_turns[0].runtime_id for b in team.hermes.binds())  # no team tools

    # the review delivery wakes the coordinator once; its wake reviews and finishes the goal
    call = team.tools("[talaria-goal-review]")
    wake = [t for t in team.hermes.turns() if t.text.startswith("[talaria-goal-review]")]
    assert len(wake) == 1 and f"goalId: {goal_id}" in wake[0].text
    call("talaria_review_assignment", requestId="R5", assignmentId=assignment_id, decision="accept", note="good")
    done = call("talaria_finish_goal", requestId="R6", goalId=goal_id, status="complete", result="the report",
                acceptanceRevision=1, checks=[{"criterion": 0, "passed": True, "evidence": "the draft"}])  # fmt: skip
    assert done["goal"]["status"] == "complete"
    team.hermes.delta_delay_for("[talaria-goal-review]", 0)
    wait_until(lambda: len([m for m in messages(team.alice, team.conversation_id) if m["role"] == "system"]) == 2,
               what="the terminal message", timeout=30)  # fmt: skip
    shown = [(m["role"], m["author"], m["content"].split("\n")[0]) for m in messages(team.alice, team.conversation_id)
             if m["role"] != "tool"]  # fmt: skip
    lead = team.lead
    assert shown == [
        ("user", "alice", "build it"),
        ("assistant", lead, "echo: build it"),
        ("system", "talaria", 'Goal "Report" of team "Crew" has results awaiting review.'),
        ("assistant", lead, "echo: [talaria-goal-review]"),
        ("system", "talaria", 'Goal "Report" of team "Crew" is complete.'),
    ]
    system = [m for m in messages(team.alice, team.conversation_id) if m["role"] == "system"]
    assert [m["reference"]["deliveryKind"] for m in system] == ["review", "terminal"]
    assert all(m["reference"]["goalId"] == goal_id for m in system)
    deliveries = team.rows("SELECT kind, status, woke FROM team_delivery ORDER BY created_at")
    assert deliveries == [{"kind": "review", "status": "delivered", "woke": 1},
                          {"kind": "terminal", "status": "delivered", "woke": 0}]  # fmt: skip
    turns = team.rows(f"SELECT trigger, trigger_message_id FROM chat_turn WHERE id <> '{user_turn}'")
    assert turns == [{"trigger": "automatic", "trigger_message_id": system[0]["id"]}]
    assert team.goal(goal_id)["automatic_wakes"] == 1
    # the stream, in commit order: each status change as team.goal, each report-back message, the wake's start
    stream.wait_for(lambda events: any(k == "team.goal" and d["status"] == "complete" for _, k, d in events))
    stream.close()
    shown_goal = [(d["status"], d["counts"]) for _, k, d in stream.events if k == "team.goal"]
    assert shown_goal[:2] == [("running", {}), ("running", {"pending": 1})]  # started, then assigned
    assert shown_goal[-1] == ("complete", {"complete": 1})
    assert ("review", {"review": 1}) in shown_goal and all(d["goalId"] == goal_id for _, k, d in stream.events
                                                           if k == "team.goal")  # fmt: skip

    def ours(kind: str, data: dict[str, Any]) -> bool:  # the report-back's messages and the wake's start
        if kind == "turn.started":
            return bool(data["turn"]["trigger"] == "automatic")
        return kind == "message.complete" and data["message"]["role"] == "system"

    kinds = [k for _, k, d in stream.events if ours(k, d)]
    assert kinds == ["message.complete", "turn.started", "message.complete"]


def test_stopping_a_goal_cancels_its_running_job_and_posts_was_stopped_without_a_wake(team: Team) -> None:
    team.hermes.approval_for("[talaria-assignment]")  # the member's run waits for an approval
    _, goal_id, assignment_id = _form_and_assign(team)
    wait_until(lambda: team.rows(f"SELECT status FROM assignment WHERE id = '{assignment_id}'")[0]["status"]
               == "running", what="the assignment to run", timeout=30)  # fmt: skip
    team.hermes.wait_for(lambda: any(t.text.startswith("[talaria-assignment]") for t in team.hermes.turns()))
    stopped = team.alice.post(f"/api/goals/{goal_id}/stop", json={"reason": "not needed"})
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["goal"]["status"] == "cancelling"
    wait_until(lambda: team.goal(goal_id)["status"] == "cancelled", what="the goal to be cancelled", timeout=30)
    [job] = team.rows("SELECT state FROM hermes_job")
    assert job["state"] == "CANCELLED"
    wait_until(lambda: [m for m in messages(team.alice, team.conversation_id) if m["role"] == "system"] != [],
               what="the stop message", timeout=30)  # fmt: skip
    system = [m["content"] for m in messages(team.alice, team.conversation_id) if m["role"] == "system"]
    assert system == ['Goal "Report" of team "Crew" was stopped.']
    assert team.rows("SELECT woke FROM team_delivery") == [{"woke": 0}]
    assert team.rows("SELECT COUNT(*) AS n FROM chat_turn") == [{"n": 1}]  # no wake
