"""Team tool calls through their frame (team-tools.md 5, 6) over a real SQLite file: the tools of 6.3 with their
rules and codes in order, ``requestId`` replay byte for byte and ``idempotency_conflict``, results with ids and
states first, one audit event and one evidence row per applied call (digests, no text), and refusals that change
no table. The model and Hermes side of the same calls is tests/hermes/test_team_flow.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from talaria.accounts.service import Account, Accounts
from talaria.chat.bots import Bot, Bots
from talaria.chat.conversations import Conversations
from talaria.clock import ManualClock
from talaria.errors import TalariaError
from talaria.lifecycle.audit_key import AuditKey
from talaria.store import migrations
from talaria.store.interface import Tx
from talaria.store.sqlite import SQLiteStore
from talaria.teams import catalog, permission, reads, writes
from talaria.teams.calls import TeamToolCalls
from talaria.teams.round import AUTOMATIC, USER, Round
from tests.conftest import db_rows

pytestmark = pytest.mark.usefixtures("fast_argon2")
PASSWORD = "correct horse battery staple"
MARK = "marker-7f3a"
TABLES = ("bot", "bot_team", "team", "team_member", "goal", "assignment", "team_delivery", "team_request",
          "team_evidence", "audit_event")  # fmt: skip


@dataclass
class Access:
    pairs_allowed: set[tuple[str, str]] = field(default_factory=lambda: {("local", "default"), ("local", "work")})

    def allowed(self, account: Account, source: str, profile: str) -> bool:
        return (source, profile) in self.pairs_allowed and profile in account.allowed_profiles.get(source, [])

    def pairs(self, account: Account) -> list[tuple[str, str]]:
        return sorted(p for p in self.pairs_allowed if self.allowed(account, *p))


@dataclass
class Site:
    store: SQLiteStore
    clock: ManualClock
    accounts: Accounts
    bots: Bots
    conversations: Conversations
    access: Access
    calls: TeamToolCalls
    round: Round
    counted: list[tuple[str, str]]
    path: Path
    requests: int = 0

    def text(self, tool: str, **arguments: Any) -> str:
        return self.calls.call(self.round, tool, arguments)

    def ok(self, tool: str, **arguments: Any) -> dict[str, Any]:
        self.clock.advance(1)
        return dict(json.loads(self.text(tool, **arguments)))

    def new(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """A mutating call with a fresh requestId."""
        self.requests += 1
        return self.ok(tool, requestId=f"R{self.requests}", **arguments)

    def refused(self, code: str, tool: str, **arguments: Any) -> TalariaError:
        before = self.snapshot()
        self.requests += 1
        if tool not in READS:
            arguments.setdefault("requestId", f"R{self.requests}")
        with pytest.raises(TalariaError) as refusal:
            self.text(tool, **arguments)
        assert refusal.value.code == code, refusal.value
        assert self.snapshot() == before, "a refused call changed a table"
        return refusal.value

    def rows(self, sql: str) -> list[dict[str, Any]]:
        return db_rows(self.path, sql)

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        return {table: self.rows(f"SELECT * FROM {table} ORDER BY rowid") for table in TABLES}

    def alice(self) -> Account:
        account = self.accounts.get("alice")
        assert account is not None
        return account

    def audit_types(self) -> list[str]:
        return [row["type"] for row in self.rows("SELECT type FROM audit_event ORDER BY seq")]


READS = {"talaria_list_bots", "talaria_list_teams", "talaria_get_goal", "talaria_whoami"}


def _granted(account: Account) -> Any:
    def grant(tx: Tx, bot: Bot, now: int) -> Bot:
        return permission.set_permission(tx, account, bot, True, now, creating=True)

    return grant


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    path = tmp_path / "talaria.sqlite3"
    store = SQLiteStore(path)
    migrations.upgrade(store)
    clock = ManualClock(1_800_000_000_000)
    accounts = Accounts(store, clock)
    alice = accounts.create(username="alice", password=PASSWORD, role="admin", can_manage_team=True,
                            allowed_profiles={"local": ["default", "work"]})  # fmt: skip
    accounts.create(username="bob", password=PASSWORD, role="user", can_manage_team=True,
                    allowed_profiles={"local": ["default"]})  # fmt: skip
    access = Access()
    key = AuditKey(b"k" * 32)
    bots = Bots(store, clock, key, access.allowed)
    conversations = Conversations(store, clock, access.allowed)
    lead = bots.create(alice, name="Lead", source="local", profile="default", also=_granted(alice))
    conversation = conversations.start(alice, bot_id=lead.id)
    counted: list[tuple[str, str]] = []
    calls = TeamToolCalls(store, clock, key, access, catalog.HANDLERS, count=lambda t, o: counted.append((t, o)))
    captured = Round(tenant="default", owner="alice", auth_version=alice.auth_version, bot_id=lead.id,
                     bot_revision=lead.revision, conversation_id=conversation.id, turn_id="trn_1", trigger=USER,
                     grant_id="grt_1", runner_id="run_1", source="local", profile="default")  # fmt: skip
    yield Site(store, clock, accounts, bots, conversations, access, calls, captured, counted, path)
    store.close()


def _crew(site: Site) -> tuple[str, str]:
    writer = site.new("talaria_create_bot", name="Writer", profile="work")["bot"]["id"]
    team = site.new("talaria_create_team", name="Crew", memberIds=[writer])["team"]["id"]
    return writer, team


def _goal(site: Site, team: str, title: str = "Report", **more: Any) -> dict[str, Any]:
    return site.new("talaria_start_goal", teamId=team, title=title, objective=f"write it {MARK}", **more)["goal"]


def _settle(site: Site, assignment_id: str, status: str, result: str | None = "the draft") -> None:
    """What the reconciler's settle does (4.3, A4/A5), for the review and finish rules here."""
    with site.store.write() as tx:
        found = reads.assignment(tx, "default", "alice", assignment_id)
        assert found is not None
        writes.set_assignment(tx, found, site.clock.now_ms(), status=status, attempt=found.attempt + 1, result=result)


# --- bots -------------------------------------------------------------------------------------------------------


def test_create_bot_twice_with_one_request_id_makes_one_bot_and_answers_the_same_bytes(site: Site) -> None:
    first = site.text("talaria_create_bot", requestId="R1", name="Writer", profile="work")
    again = site.text("talaria_create_bot", requestId="R1", name="Writer", profile="work")
    assert again == first
    made = json.loads(first)["bot"]
    assert list(made)[:5] == ["id", "createdByBotId", "archived", "teamPermission", "revision"]
    assert made["createdByBotId"] == site.round.bot_id and made["teamPermission"] is False
    assert (made["source"], made["profile"]) == ("local", "work")
    named = site.rows("SELECT id FROM bot WHERE name = 'Writer'")
    with site.store.read() as tx:
        team = permission.of(tx, made["id"])
    assert [row["id"] for row in named] == [made["id"]]
    assert (team.created_by_bot_id, team.created_in_turn_id, team.permission) == (site.round.bot_id, "trn_1", False)
    assert site.audit_types().count("chat.bot.created") == 2  # Lead by its owner, Writer by the tool
    assert site.counted[-2:] == [("talaria_create_bot", "applied"), ("talaria_create_bot", "replayed")]


def test_one_request_id_with_other_arguments_is_an_idempotency_conflict(site: Site) -> None:
    site.text("talaria_create_bot", requestId="R1", name="Writer")
    site.refused("idempotency_conflict", "talaria_create_bot", requestId="R1", name="Other")


def test_a_request_id_s_answer_outlives_the_process(site: Site) -> None:
    first = site.text("talaria_create_bot", requestId="R1", name="Writer")
    again = TeamToolCalls(site.store, site.clock, AuditKey(b"k" * 32), site.access, catalog.HANDLERS)
    assert again.call(site.round, "talaria_create_bot", {"requestId": "R1", "name": "Writer"}) == first


def test_create_bot_defaults_to_the_caller_s_profile_and_keeps_chat_s_rules(site: Site) -> None:
    made = site.new("talaria_create_bot", name="Helper")["bot"]
    assert (made["source"], made["profile"]) == ("local", "default")
    site.refused("duplicate_bot_name", "talaria_create_bot", name="helper")
    site.refused("bot_not_allowed", "talaria_create_bot", name="Lab", source="lab", profile="default")
    site.refused("invalid_request", "talaria_create_bot", name="a@b")


@pytest.mark.parametrize("forged", [{"teamPermission": True}, {"owner": "bob"}, {"botId": "bot_x"}, {"tenant": "t"}])
def test_create_bot_refuses_forged_fields(site: Site, forged: dict[str, Any]) -> None:
    refusal = site.refused("invalid_request", "talaria_create_bot", name="Ghost", **forged)
    assert str(next(iter(forged))) in refusal.message


def test_only_the_bot_that_made_a_bot_changes_or_archives_it(site: Site) -> None:
    alice = site.alice()
    other = site.bots.create(alice, name="Manual", source="local", profile="default")
    site.refused("bot_creator_required", "talaria_update_bot", botId=other.id, name="Renamed")
    site.refused("bot_creator_required", "talaria_update_bot", botId=site.round.bot_id, name="Me")
    site.refused("bot_creator_required", "talaria_archive_bot", botId=other.id, confirmName="Manual")
    made = site.new("talaria_create_bot", name="Writer")["bot"]
    updated = site.new("talaria_update_bot", botId=made["id"], instructions=f"Be brief {MARK}")["bot"]
    assert updated["revision"] == made["revision"] + 1 and updated["instructions"] == f"Be brief {MARK}"
    site.refused("bot_name_mismatch", "talaria_archive_bot", botId=made["id"], confirmName="writer")
    archived = site.new("talaria_archive_bot", botId=made["id"], confirmName="Writer")["bot"]
    assert archived["archived"] is True
    site.refused("bot_unavailable", "talaria_update_bot", botId=made["id"], name="Again")


def test_a_bot_of_another_owner_is_not_found(site: Site) -> None:
    bob = site.accounts.get("bob")
    assert bob is not None
    theirs = site.bots.create(bob, name="Theirs", source="local", profile="default")
    site.refused("not_found", "talaria_update_bot", botId=theirs.id, name="Mine")
    site.refused("not_found", "talaria_create_team", name="Crew", memberIds=[theirs.id])


def test_list_bots_shows_usable_bots_by_name_and_the_intersection(site: Site) -> None:
    site.new("talaria_create_bot", name="Zed", profile="work")
    site.new("talaria_create_bot", name="Amy", instructions="x" * 3000)
    listed = site.ok("talaria_list_bots")
    assert [b["name"] for b in listed["bots"]] == ["Amy", "Lead", "Zed"]
    assert len(listed["bots"][0]["instructions"]) == 2000
    assert listed["profiles"] == [{"source": "local", "profile": "default"}, {"source": "local", "profile": "work"}]
    site.access.pairs_allowed.discard(("local", "work"))
    assert [b["name"] for b in site.ok("talaria_list_bots")["bots"]] == ["Amy", "Lead"]


def test_archiving_a_member_of_a_team_is_bot_in_use(site: Site) -> None:
    writer, _ = _crew(site)
    site.refused("bot_in_use", "talaria_archive_bot", botId=writer, confirmName="Writer")


# --- teams ------------------------------------------------------------------------------------------------------


def test_a_team_is_its_administrator_first_then_the_others_without_repeats(site: Site) -> None:
    writer = site.new("talaria_create_bot", name="Writer")["bot"]["id"]
    team = site.new("talaria_create_team", name="Crew", memberIds=[site.round.bot_id, writer])["team"]
    assert list(team)[:5] == ["id", "administratorId", "memberIds", "archived", "revision"]
    assert team["memberIds"] == [site.round.bot_id, writer] and team["administratorId"] == site.round.bot_id
    site.refused("invalid_members", "talaria_create_team", name="Solo", memberIds=[site.round.bot_id])
    site.refused("duplicate_team_name", "talaria_create_team", name="crew", memberIds=[writer])
    listed = site.ok("talaria_list_teams")["teams"]
    assert [(t["id"], t["goals"]) for t in listed] == [(team["id"], [])]


def test_an_unusable_member_is_bot_unavailable(site: Site) -> None:
    writer = site.new("talaria_create_bot", name="Writer", profile="work")["bot"]["id"]
    site.access.pairs_allowed.discard(("local", "work"))
    site.refused("bot_unavailable", "talaria_create_team", name="Crew", memberIds=[writer])


def test_the_twenty_first_team_of_an_administrator_is_team_limit(site: Site) -> None:
    writer = site.new("talaria_create_bot", name="Writer")["bot"]["id"]
    for n in range(20):
        site.new("talaria_create_team", name=f"Crew {n}", memberIds=[writer])
    site.refused("team_limit", "talaria_create_team", name="Crew 20", memberIds=[writer])


def test_update_team_renames_replaces_members_and_archives_one_way(site: Site) -> None:
    _, team = _crew(site)
    editor = site.new("talaria_create_bot", name="Editor")["bot"]["id"]
    changed = site.new("talaria_update_team", teamId=team, memberIds=[editor], name="Crew B")["team"]
    assert changed["memberIds"] == [site.round.bot_id, editor] and changed["revision"] == 2
    _goal(site, team)
    site.refused("team_busy", "talaria_update_team", teamId=team, archived=True)
    site.refused("invalid_request", "talaria_update_team", teamId=team, archived=False)
    site.refused("invalid_request", "talaria_update_team", teamId=team)


def test_only_the_administrator_manages_its_team(site: Site) -> None:
    _, team = _crew(site)
    alice = site.alice()
    other = site.bots.create(alice, name="Lead2", source="local", profile="default", also=_granted(alice))
    conversation = site.conversations.start(alice, bot_id=other.id)
    site.round = replace(site.round, bot_id=other.id, bot_revision=other.revision, conversation_id=conversation.id)
    site.refused("team_forbidden", "talaria_update_team", teamId=team, name="Mine")
    site.refused("team_forbidden", "talaria_start_goal", teamId=team, title="Mine", objective="x")
    assert site.ok("talaria_list_teams") == {"teams": []}


# --- goals and assignments --------------------------------------------------------------------------------------


def test_the_whole_flow_of_one_user_turn_starts_a_goal_and_a_pending_assignment(site: Site) -> None:
    writer, team = _crew(site)
    goal = _goal(site, team)
    assert list(goal)[:6] == ["id", "teamId", "coordinatorId", "status", "cause", "revision"]
    assert goal["status"] == "running" and goal["counts"] == {} and goal["activation"] == 1
    assert goal["acceptanceCriteria"] == ["The delivery meets the original request, with evidence."]
    assert goal["origin"] == {"conversationId": site.round.conversation_id, "turnId": "trn_1"}
    assigned = site.new("talaria_assign", goalId=goal["id"], botId=writer, title="Draft", brief=f"mw-1 {MARK}")
    assignment = assigned["assignment"]
    assert (assignment["status"], assignment["attempt"], assignment["maxAttempts"]) == ("pending", 0, 3)
    shown = site.ok("talaria_get_goal", goalId=goal["id"])
    assert shown["goal"]["counts"] == {"pending": 1} and shown["team"]["id"] == team
    assert [a["id"] for a in shown["assignments"]] == [assignment["id"]]
    with site.store.read() as tx:
        stored = reads.goal(tx, "default", "alice", goal["id"])
    assert stored is not None and (stored.last_turn_id, stored.team_revision) == ("trn_1", 1)
    listed = site.ok("talaria_list_teams")["teams"][0]["goals"]
    assert [(g["id"], g["status"]) for g in listed] == [(goal["id"], "running")]


def test_success_results_do_not_say_failed_or_error(site: Site) -> None:
    _, team = _crew(site)
    goal = _goal(site, team)
    texts = [site.text("talaria_get_goal", goalId=goal["id"]), site.text("talaria_list_teams")]
    assert not any(word in text[:500] for text in texts for word in ("failed", "error"))


def test_goals_start_only_on_a_user_instruction_and_not_twice(site: Site) -> None:
    _, team = _crew(site)
    automatic = replace(site.round, trigger=AUTOMATIC)
    with pytest.raises(TalariaError) as refusal:
        site.calls.call(automatic, "talaria_start_goal", {"requestId": "RA", "teamId": team, "title": "A",
                                                           "objective": "x"})  # fmt: skip
    assert refusal.value.code == "user_instruction_required"
    _goal(site, team, "Report")
    site.refused("goal_exists", "talaria_start_goal", teamId=team, title="REPORT", objective="again")
    for n in range(3):
        _goal(site, team, f"Other {n}")
    site.refused("goal_limit", "talaria_start_goal", teamId=team, title="Fifth", objective="x")


def test_assign_refuses_the_caller_strangers_unknown_dependencies_and_a_thirty_third(site: Site) -> None:
    writer, team = _crew(site)
    goal = _goal(site, team)["id"]
    outsider = site.new("talaria_create_bot", name="Outsider")["bot"]["id"]
    brief = {"title": "Draft", "brief": "b"}
    site.refused("invalid_assignment_bot", "talaria_assign", goalId=goal, botId=site.round.bot_id, **brief)
    site.refused("invalid_assignment_bot", "talaria_assign", goalId=goal, botId=outsider, **brief)
    site.refused("invalid_assignment_dependency", "talaria_assign", goalId=goal, botId=writer, dependsOn=["asg_x"],
                 **brief)  # fmt: skip
    first = site.new("talaria_assign", goalId=goal, botId=writer, **brief)["assignment"]["id"]
    second = site.new("talaria_assign", goalId=goal, botId=writer, dependsOn=[first], **brief)["assignment"]
    assert second["dependsOn"] == [first]
    for _ in range(30):
        site.new("talaria_assign", goalId=goal, botId=writer, **brief)
    site.refused("assignment_limit", "talaria_assign", goalId=goal, botId=writer, **brief)


def test_review_accept_then_finish_complete_with_one_check_per_criterion(site: Site) -> None:
    writer, team = _crew(site)
    goal = _goal(site, team)["id"]
    assignment = site.new("talaria_assign", goalId=goal, botId=writer, title="Draft", brief="b")["assignment"]["id"]
    site.refused("assignment_not_reviewable", "talaria_review_assignment", assignmentId=assignment,
                 decision="accept", note="n")  # fmt: skip
    site.refused("goal_incomplete", "talaria_finish_goal", goalId=goal, status="complete", result="r",
                 acceptanceRevision=1)  # fmt: skip
    _settle(site, assignment, "review")
    reviewed = site.new("talaria_review_assignment", assignmentId=assignment, decision="accept", note=f"ok {MARK}")
    assert reviewed["assignment"]["status"] == "complete" and reviewed["goal"]["counts"] == {"complete": 1}
    site.refused("goal_criteria_changed", "talaria_finish_goal", goalId=goal, status="complete", result="r",
                 acceptanceRevision=2)  # fmt: skip
    site.refused("goal_checks_missing", "talaria_finish_goal", goalId=goal, status="complete", result="r",
                 acceptanceRevision=1, checks=[{"criterion": 0, "passed": False, "evidence": "e"}])  # fmt: skip
    site.refused("invalid_request", "talaria_finish_goal", goalId=goal, status="complete", result="r",
                 acceptanceRevision=1, checks=[{"criterion": 1, "passed": True, "evidence": "e"}])  # fmt: skip
    check = {"criterion": 0, "passed": True, "evidence": f"e {MARK}"}
    done = site.new("talaria_finish_goal", goalId=goal, status="complete", result=f"done {MARK}",
                    acceptanceRevision=1, checks=[check])["goal"]  # fmt: skip
    assert done["status"] == "complete" and done["finishedAt"] is not None
    deliveries = site.rows("SELECT kind, status, goal_status FROM team_delivery")
    with site.store.read() as tx:
        stored = reads.goal(tx, "default", "alice", goal)
    assert deliveries == [{"kind": "terminal", "status": "pending", "goal_status": "complete"}]
    assert stored is not None and stored.finish_turn_id == "trn_1"
    site.refused("goal_not_active", "talaria_assign", goalId=goal, botId=writer, title="More", brief="b")
    site.refused("goal_not_resumable", "talaria_resume_goal", goalId=goal)


def test_retry_gives_attempts_up_to_the_limit_and_block_stops_the_assignment(site: Site) -> None:
    writer, team = _crew(site)
    goal = _goal(site, team)["id"]
    assignment = site.new("talaria_assign", goalId=goal, botId=writer, title="Draft", brief="b")["assignment"]["id"]
    for attempt in (1, 2, 3):
        _settle(site, assignment, "failed", None)
        if attempt < 3:
            retried = site.new("talaria_review_assignment", assignmentId=assignment, decision="retry", note="n")
            assert retried["assignment"]["status"] == "pending" and retried["assignment"]["result"] is None
    site.refused("assignment_retry_limit", "talaria_review_assignment", assignmentId=assignment, decision="retry",
                 note="again")  # fmt: skip
    blocked = site.new("talaria_review_assignment", assignmentId=assignment, decision="block", note="stop")
    assert blocked["assignment"]["status"] == "blocked" and blocked["assignment"]["review"] == "stop"


def test_finish_waiting_cancels_open_assignments_and_resume_reopens_them(site: Site) -> None:
    writer, team = _crew(site)
    goal = _goal(site, team)["id"]
    site.new("talaria_assign", goalId=goal, botId=writer, title="Draft", brief="b")
    waiting = site.new("talaria_finish_goal", goalId=goal, status="waiting", result="need the date",
                       acceptanceRevision=1)["goal"]  # fmt: skip
    assert waiting["status"] == "waiting" and waiting["counts"] == {"cancelled": 1}
    types = site.audit_types()
    assert types[-2:] == ["team.goal.finished", "team.assignment.cancelled"]
    automatic = replace(site.round, trigger=AUTOMATIC, turn_id="trn_wake")
    with pytest.raises(TalariaError) as refusal:
        site.calls.call(automatic, "talaria_resume_goal", {"requestId": "RW", "goalId": goal})
    assert refusal.value.code == "user_instruction_required"
    site.round = replace(site.round, turn_id="trn_2")
    resumed = site.new("talaria_resume_goal", goalId=goal)["goal"]
    assert (resumed["status"], resumed["activation"], resumed["counts"]) == ("running", 2, {"pending": 1})
    assert resumed["origin"]["turnId"] == "trn_2" and resumed["result"] is None
    shown = site.ok("talaria_get_goal", goalId=goal)["assignments"][0]
    assert (shown["status"], shown["maxAttempts"]) == ("pending", 6)


def test_cancel_and_criteria_changes_follow_their_rules(site: Site) -> None:
    writer, team = _crew(site)
    goal = _goal(site, team)["id"]
    assignment = site.new("talaria_assign", goalId=goal, botId=writer, title="Draft", brief="b")["assignment"]["id"]
    cancelled = site.new("talaria_cancel_assignment", assignmentId=assignment, reason=f"no longer {MARK}")
    assert cancelled["assignment"]["status"] == "cancelled"
    site.refused("assignment_not_cancellable", "talaria_cancel_assignment", assignmentId=assignment, reason="again")
    site.refused("goal_criteria_changed", "talaria_update_goal_criteria", goalId=goal, expectedRevision=2,
                 acceptanceCriteria=["new"])  # fmt: skip
    changed = site.new("talaria_update_goal_criteria", goalId=goal, expectedRevision=1,
                       acceptanceCriteria=["one", "two"])["goal"]  # fmt: skip
    assert (changed["acceptanceRevision"], changed["checks"], changed["acceptanceCriteria"]) == (2, [], ["one", "two"])


def test_another_coordinator_s_goal_is_goal_forbidden(site: Site) -> None:
    _, team = _crew(site)
    goal = _goal(site, team)["id"]
    alice = site.alice()
    other = site.bots.create(alice, name="Lead2", source="local", profile="default", also=_granted(alice))
    conversation = site.conversations.start(alice, bot_id=other.id)
    site.round = replace(site.round, bot_id=other.id, bot_revision=other.revision, conversation_id=conversation.id)
    site.refused("goal_forbidden", "talaria_get_goal", goalId=goal)
    site.refused("goal_forbidden", "talaria_finish_goal", goalId=goal, status="blocked", result="r",
                 acceptanceRevision=1)  # fmt: skip
    site.round = replace(site.round, owner="bob")
    site.refused("team_tools_forbidden", "talaria_get_goal", goalId=goal)


# --- the frame --------------------------------------------------------------------------------------------------


def test_permission_revoked_mid_round_refuses_the_next_call_and_creates_nothing(site: Site) -> None:
    site.new("talaria_create_bot", name="Writer")
    alice = site.alice()

    def revoke(tx: Tx, bot: Bot, now: int) -> Bot:
        return permission.set_permission(tx, alice, bot, False, now)

    site.bots.update(alice, site.round.bot_id, also=revoke)
    site.refused("team_tools_forbidden", "talaria_create_bot", name="Ghost")
    site.refused("team_tools_forbidden", "talaria_list_bots")
    assert site.counted[-1] == ("talaria_list_bots", "refused")


def test_checks_run_in_order_the_round_before_the_arguments(site: Site) -> None:
    site.conversations.update(site.alice(), site.round.conversation_id, archived=True)
    site.refused("team_tools_forbidden", "talaria_create_bot", owner="bob")


def test_an_unknown_tool_is_not_found_and_whoami_answers_the_round(site: Site) -> None:
    site.refused("not_found", "talaria_nosuch")
    assert site.ok("talaria_whoami", account="mallory", botId="bot_x") == site.round.whoami()


def test_each_applied_call_writes_one_event_with_evidence_and_no_text(site: Site) -> None:
    writer, team = _crew(site)
    goal = _goal(site, team)["id"]
    site.new("talaria_assign", goalId=goal, botId=writer, title=f"Draft {MARK}", brief=f"mw-1 {MARK}")
    events = site.rows("SELECT event_id, type, body FROM audit_event WHERE body LIKE '%team_tool%' ORDER BY seq")
    evidence = site.rows("SELECT * FROM team_evidence ORDER BY recorded_at, id")
    dumped = json.dumps([site.rows(f"SELECT * FROM {t}") for t in ("audit_event", "team_evidence")])
    assert [e["type"] for e in events] == ["chat.bot.created", "team.team.created", "team.goal.started",
                                           "team.assignment.created"]  # fmt: skip
    assert [e["audit_event_id"] for e in evidence] == [e["event_id"] for e in events]
    bodies = [json.loads(e["body"]) for e in events]
    assert all(b["team"]["runnerId"] == "run_1" and b["team"]["turnId"] == "trn_1" for b in bodies)
    assert bodies[-1]["team"]["targetBotId"] == writer and bodies[-1]["team"]["goalId"] == goal
    assert MARK not in dumped
