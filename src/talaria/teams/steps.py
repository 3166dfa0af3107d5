"""The reconciler's steps for one goal (team-tools.md 4.1-4.6), each one short write transaction conditional on
revisions, audited by the reconciler (the dispatcher principal via ``team``).

- ``authority``: a running, review or waiting goal whose authority fails, or whose origin is gone, is cancelled
  (G6), its open assignments with it (A9).
- ``settle``: a running or cancelling assignment whose job ended takes A4-A6 and records its attempt's outcome; a
  cancelling one whose job still runs gets the job's admin cancel (after the transaction).
- ``settle_cancel``: a cancelling goal whose last cancelling assignment settled is cancelled (G7).
- ``dispatch``: each ready pending assignment of a running goal becomes a job by policy (4.2), or ``blocked`` when
  its member is unusable (A3).
- ``review``: a running, quiescent goal whose turns ended and whose signature moved enters review with a delivery
  (G2, 4.5).

``cancel_goal`` is G6 itself, shared with a person's ``Stop goal``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from talaria.accounts.service import Account
from talaria.canonical import canonical_json, sha256_hex
from talaria.chat import bots
from talaria.chat.automatic import Enqueued
from talaria.clock import Clock, rfc3339
from talaria.errors import TalariaError
from talaria.lifecycle import audit
from talaria.lifecycle.actor import PLATFORM_ADMIN, Actor
from talaria.lifecycle.context import Signals
from talaria.lifecycle.machine import TERMINAL, JobState
from talaria.lifecycle.policy import PolicyTask, dispatch_by_policy
from talaria.limits import MAX_ASSIGNMENT_RESULT_CHARS, MAX_RUNNING_PER_ACCOUNT, MAX_RUNNING_PER_GOAL
from talaria.settings import Settings
from talaria.store.interface import Store, Tx
from talaria.teams import authority, permission, prompts, reads, writes
from talaria.teams.machine import (
    STOPPABLE_GOAL,
    AssignmentEvent,
    AssignmentStatus,
    GoalEvent,
    GoalStatus,
    assignment_after,
    goal_after,
)
from talaria.teams.permission import team_body
from talaria.teams.records import Assignment, Goal

A = AssignmentStatus
ENDED_TURN: Final = frozenset({"completed", "failed", "interrupted", "uncertain"})
MEMBER_UNAVAILABLE: Final = "member unavailable"
NO_RESULT: Final = "the run gave no result"
POLICY: Final = "team_permission"
Allowed = Callable[[Account, str, str], bool]


@dataclass
class Effects:
    """What committed steps ask of the hub afterwards: chat announcements, engine signals, the goals whose status
    or assignments' statuses may have changed (their ``team.goal`` event), and jobs to cancel."""

    enqueued: list[Enqueued] = field(default_factory=list)
    staged: list[Any] = field(default_factory=list)  # what ``Deliveries.stage`` made of each, in its transaction
    signals: Signals = field(default_factory=list)
    goals: set[str] = field(default_factory=set)
    cancel_jobs: list[tuple[str, str]] = field(default_factory=list)  # (tenant, task id)


def reconciler_actor(settings: Settings, tenant: str) -> Actor:
    return Actor(settings.lifecycle_dispatcher_principal, frozenset({PLATFORM_ADMIN}), "team", tenant)


def record(
    tx: Tx, actor: Actor, goal: Goal, kind: str, now_ms: int, *, from_state: str | None, to_state: str | None,
    revision_after: int | None, reason_code: str | None = None, assignment: Assignment | None = None,
    subject: audit.Subject | None = None,
) -> str:  # fmt: skip
    """One team event of a reconciler step or a person's change (team-tools.md 10): ids, states, no text."""
    return audit.append(
        tx, now_ms=now_ms, type=kind, tenant=goal.tenant, actor=actor, subject=subject or audit.Subject(),
        from_state=from_state, to_state=to_state, revision_after=revision_after, reason_code=reason_code,
        team=team_body(account=goal.owner, teamId=goal.team_id, goalId=goal.id,
                       assignmentId=assignment.id if assignment is not None else None,
                       targetBotId=assignment.bot_id if assignment is not None else None),
    )  # fmt: skip


def cancel_goal(tx: Tx, goal: Goal, cause: str, actor: Actor, now_ms: int, *, stopped_by: str | None = None) -> Goal:
    """G6: ``cancelling`` while an assignment is ``cancelling`` (their jobs then get an admin cancel), else
    ``cancelled`` (a terminal delivery); every open assignment cancelled (A9), each with its event."""
    assignments = reads.assignments(tx, goal.id)
    cancelled = writes.cancel_open(tx, assignments, now_ms, None)
    still = [a for a in reads.assignments(tx, goal.id) if a.status == A.CANCELLING]
    event = GoalEvent.CANCEL if still else GoalEvent.CANCEL_SETTLED
    after = writes.set_goal(tx, goal, now_ms, status=goal_after(goal.status, event).value, cause=cause,
                            stopped_by=stopped_by)  # fmt: skip
    record(tx, actor, after, "team.goal.cancelled", now_ms, from_state=goal.status, to_state=after.status,
           revision_after=after.revision, reason_code=cause)  # fmt: skip
    before = {a.id: a.status for a in assignments}
    for a in cancelled:
        record(tx, actor, after, "team.assignment.cancelled", now_ms, from_state=before[a.id], to_state=a.status,
               revision_after=a.revision, reason_code=cause, assignment=a)  # fmt: skip
    return after


def turn_ended(tx: Tx, turn_id: str | None) -> bool:
    """A goal's turn has ended (an unset or unknown turn counts as ended)."""
    if turn_id is None:
        return True
    row = tx.one("chat_turn_by_id", id=turn_id)
    return row is None or row["state"] in ENDED_TURN


def signature(goal: Goal, assignments: list[Assignment]) -> str:
    """4.5: sha256 hex of ``{activation, acceptanceRevision, assignments: [[id, status, attempt]]}``."""
    listed = sorted([a.id, a.status, a.attempt] for a in assignments)
    body = {"activation": goal.activation, "acceptanceRevision": goal.acceptance_revision, "assignments": listed}
    return sha256_hex(canonical_json(body))


class Steps:
    def __init__(self, store: Store, clock: Clock, settings: Settings, allowed: Allowed) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings
        self.allowed = allowed

    # --- 4.6 ---------------------------------------------------------------------------------------------------

    def authority(self, goal_id: str, effects: Effects) -> None:
        with self.store.read() as tx:
            goal = reads.goal_by_id(tx, goal_id)
            if goal is None or goal.status not in STOPPABLE_GOAL:
                return
            if authority.lost_because(tx, goal, reads.assignments(tx, goal.id), self.allowed) is None:
                return
        with self.store.write() as tx:
            goal = reads.goal_by_id(tx, goal_id)
            if goal is None or goal.status not in STOPPABLE_GOAL:
                return
            cause = authority.lost_because(tx, goal, reads.assignments(tx, goal.id), self.allowed)
            if cause is None:
                return
            actor = reconciler_actor(self.settings, goal.tenant)
            cancel_goal(tx, goal, cause, actor, self.clock.now_ms())
        effects.goals.add(goal_id)

    # --- 4.3 settle --------------------------------------------------------------------------------------------

    def settle(self, goal_id: str, effects: Effects) -> None:
        with self.store.read() as tx:
            goal = reads.goal_by_id(tx, goal_id)
            if goal is None:
                return
            live = [a for a in reads.assignments(tx, goal_id) if a.status in (A.RUNNING, A.CANCELLING) and a.job_id]
            jobs = {a.id: tx.one("job_get", tenant=goal.tenant, id=a.job_id) for a in live}
        for assignment in live:
            job = jobs[assignment.id]
            if job is not None and job["state"] in TERMINAL:
                self._settle_one(assignment.id, goal_id, effects)
            elif job is not None and assignment.status == A.CANCELLING and not job["cancel_requested"]:
                assert assignment.task_id is not None
                effects.cancel_jobs.append((goal.tenant, assignment.task_id))

    def _settle_one(self, assignment_id: str, goal_id: str, effects: Effects) -> None:
        now = self.clock.now_ms()
        with self.store.write() as tx:
            goal = reads.goal_by_id(tx, goal_id)
            row = tx.one("assignment_get", tenant=goal.tenant, owner=goal.owner, id=assignment_id) if goal else None
            if goal is None or row is None:
                return
            assignment = Assignment.from_row(row)
            job = tx.one("job_get", tenant=goal.tenant, id=assignment.job_id)
            if assignment.status not in (A.RUNNING, A.CANCELLING) or job is None or job["state"] not in TERMINAL:
                return
            stored = tx.one("result_get", job_id=job["id"])
            payload: Any = json.loads(stored["payload"]) if stored is not None else {}
            event, changes = _outcome(str(job["state"]), payload)
            status = assignment_after(assignment.status, event)
            if status == A.CANCELLED:
                changes = {}
            after = writes.set_assignment(tx, assignment, now, status=status.value, **changes)
            tx.run("assignment_run_settle", assignment_id=assignment.id, attempt=assignment.attempt,
                   outcome=str(job["state"]), now=now)  # fmt: skip
            subject = audit.Subject(task=assignment.task_id, job=assignment.job_id)
            record(tx, reconciler_actor(self.settings, goal.tenant), goal, "team.assignment.settled", now,
                   from_state=assignment.status, to_state=after.status, revision_after=after.revision,
                   reason_code=str(job["state"]), assignment=after, subject=subject)  # fmt: skip
        effects.goals.add(goal_id)

    # --- G7 ----------------------------------------------------------------------------------------------------

    def settle_cancel(self, goal_id: str, effects: Effects) -> None:
        now = self.clock.now_ms()
        with self.store.write() as tx:
            goal = reads.goal_by_id(tx, goal_id)
            if goal is None or goal.status != GoalStatus.CANCELLING:
                return
            if any(a.status == A.CANCELLING for a in reads.assignments(tx, goal.id)):
                return
            after = writes.set_goal(tx, goal, now, status=goal_after(goal.status, GoalEvent.CANCEL_SETTLED).value)
            record(tx, reconciler_actor(self.settings, goal.tenant), after, "team.goal.cancelled", now,
                   from_state=goal.status, to_state=after.status, revision_after=after.revision,
                   reason_code=goal.cause)  # fmt: skip
        effects.goals.add(goal_id)

    # --- 4.2 dispatch ------------------------------------------------------------------------------------------

    def ready(self, tx: Tx, goal: Goal, assignments: list[Assignment]) -> list[tuple[Assignment, bool]]:
        """The pending assignments whose dependencies are complete, in creation order, each with whether its
        member is usable (an unusable one is blocked, A3)."""
        status = {a.id: a.status for a in assignments}
        team = reads.team(tx, goal.tenant, goal.owner, goal.team_id)
        owner = authority.owner_of(tx, goal)
        out = []
        for a in assignments:
            if a.status != A.PENDING or any(status.get(d) != A.COMPLETE for d in a.depends_on):
                continue
            member = bots.get(tx, goal.tenant, goal.owner, a.bot_id)
            usable = (
                member is not None and owner is not None and team is not None and not member.archived
                and a.bot_id in team.member_ids and self.allowed(owner, member.source, member.profile)
            )  # fmt: skip
            out.append((a, usable))
        return out

    def dispatch(self, goal_id: str, effects: Effects) -> None:
        while True:
            with self.store.read() as tx:
                goal = reads.goal_by_id(tx, goal_id)
                if goal is None or goal.status != GoalStatus.RUNNING:
                    return
                assignments = reads.assignments(tx, goal.id)
                candidates = self.ready(tx, goal, assignments)
                busy = {a.bot_id for a in assignments if a.status in (A.RUNNING, A.CANCELLING)}
                running = sum(1 for a in assignments if a.status == A.RUNNING)
                owner_running = reads.count(tx, "assignment_running_count_owner", tenant=goal.tenant, owner=goal.owner)
            pick = next(((a, usable) for a, usable in candidates if not usable or a.bot_id not in busy), None)
            if pick is None:
                return
            assignment, usable = pick
            if usable and (running >= MAX_RUNNING_PER_GOAL or owner_running >= MAX_RUNNING_PER_ACCOUNT):
                return  # stays pending, in creation order, without error
            if not self._dispatch_one(goal.id, assignment.id, usable, effects):
                return

    def _dispatch_one(self, goal_id: str, assignment_id: str, usable: bool, effects: Effects) -> bool:
        """One assignment dispatched (A2) or blocked (A3) in one transaction; False when nothing changed."""
        now = self.clock.now_ms()
        signals: Signals = []
        with self.store.write() as tx:
            goal = reads.goal_by_id(tx, goal_id)
            if goal is None or goal.status != GoalStatus.RUNNING:
                return False
            assignments = reads.assignments(tx, goal.id)
            found = {a.id: (a, ok) for a, ok in self.ready(tx, goal, assignments)}
            if assignment_id not in found or found[assignment_id][1] != usable:
                return False
            assignment = found[assignment_id][0]
            actor = reconciler_actor(self.settings, goal.tenant)
            if not usable:
                blocked = assignment_after(assignment.status, AssignmentEvent.MEMBER_UNUSABLE)
                after = writes.set_assignment(tx, assignment, now, review=MEMBER_UNAVAILABLE, status=blocked.value)
                record(tx, actor, goal, "team.assignment.settled", now, from_state=assignment.status,
                       to_state=after.status, revision_after=after.revision, reason_code="member_unavailable",
                       assignment=after)  # fmt: skip
            else:
                if not authority.holds(tx, goal, assignments, self.allowed):
                    return False  # the authority step cancels it
                task, dispatch, job = dispatch_by_policy(
                    self.settings, tx, now, self._policy_task(tx, goal, assignment, assignments), signals,
                    lambda inner: self._verify(inner, goal),
                )  # fmt: skip
                attempt = assignment.attempt + 1
                tx.run("assignment_run_insert", assignment_id=assignment.id, attempt=attempt, task_id=task.id,
                       job_id=job.id, activation=goal.activation, now=now)  # fmt: skip
                after = writes.set_assignment(
                    tx, assignment, now, attempt=attempt, task_id=task.id, job_id=job.id,
                    status=assignment_after(assignment.status, AssignmentEvent.DISPATCH).value,
                )  # fmt: skip
                record(tx, actor, goal, "team.assignment.dispatched", now, from_state=assignment.status,
                       to_state=after.status, revision_after=after.revision, assignment=after,
                       subject=audit.Subject(task=task.id, dispatch=dispatch.id, job=job.id))  # fmt: skip
        effects.signals.extend(signals)
        effects.goals.add(goal_id)
        return True

    def _verify(self, tx: Tx, goal: Goal) -> None:
        """``dispatch_by_policy``'s refusal: the authority behind the approval no longer holds."""
        if not authority.holds(tx, goal, reads.assignments(tx, goal.id), self.allowed):
            raise TalariaError("invalid_transition", "the goal's authority no longer holds")

    def _policy_task(self, tx: Tx, goal: Goal, assignment: Assignment, assignments: list[Assignment]) -> PolicyTask:
        team = reads.team(tx, goal.tenant, goal.owner, goal.team_id)
        member = bots.get(tx, goal.tenant, goal.owner, assignment.bot_id)
        owner = authority.owner_of(tx, goal)
        assert team is not None and member is not None and owner is not None
        granted = permission.of(tx, goal.coordinator_id)
        by_id = {a.id: a for a in assignments}
        prompt = prompts.assignment_prompt(assignment=assignment, goal=goal, team=team,
                                           member_instructions=member.instructions,
                                           done=[by_id[d] for d in assignment.depends_on if d in by_id])  # fmt: skip
        spec = {
            "prompt": prompt,
            "team": {"teamId": team.id, "goalId": goal.id, "assignmentId": assignment.id,
                     "attempt": assignment.attempt + 1, "activation": goal.activation, "memberBotId": member.id},
            "approval": {"policy": POLICY, "coordinatorBotId": goal.coordinator_id, "teamRevision": granted.revision,
                         "grantedBy": granted.granted_by,
                         "grantedAt": rfc3339(granted.granted_at) if granted.granted_at is not None else None,
                         "authVersion": owner.auth_version},
        }  # fmt: skip
        return PolicyTask(tenant=goal.tenant, owner=goal.owner, policy=POLICY, approver=goal.coordinator_id,
                          title=f"Assignment: {assignment.title}", spec=spec, cell=member.source,
                          profile=member.profile, trace=uuid.uuid4().hex)  # fmt: skip

    # --- 4.5 review --------------------------------------------------------------------------------------------

    def review(self, goal_id: str, effects: Effects) -> None:
        now = self.clock.now_ms()
        with self.store.write() as tx:
            goal = reads.goal_by_id(tx, goal_id)
            if goal is None or goal.status != GoalStatus.RUNNING:
                return
            assignments = reads.assignments(tx, goal.id)
            if any(a.status in (A.RUNNING, A.CANCELLING) for a in assignments) or self.ready(tx, goal, assignments):
                return
            if not (turn_ended(tx, goal.last_turn_id) and turn_ended(tx, goal.wake_turn_id)):
                return
            sig = signature(goal, assignments)
            if sig == goal.last_signature:
                return
            after = writes.set_goal(tx, goal, now, status=goal_after(goal.status, GoalEvent.REVIEW).value,
                                    last_signature=sig)  # fmt: skip
            writes.add_delivery(tx, after, writes.REVIEW, sig, now)
            record(tx, reconciler_actor(self.settings, goal.tenant), after, "team.goal.review", now,
                   from_state=goal.status, to_state=after.status, revision_after=after.revision)  # fmt: skip
        effects.goals.add(goal_id)


def _outcome(state: str, payload: Any) -> tuple[AssignmentEvent, dict[str, Any]]:
    """A4-A6 from a terminal job: its event, and the assignment's ``result`` or ``review``."""
    if state == JobState.SUCCEEDED:
        outputs = payload.get("outputs") if isinstance(payload, dict) else None
        reply = outputs.get("reply") if isinstance(outputs, dict) else None
        if isinstance(reply, str) and reply.strip():
            return AssignmentEvent.JOB_REPLIED, {"result": reply[-MAX_ASSIGNMENT_RESULT_CHARS:]}
        return AssignmentEvent.JOB_FAILED, {"review": NO_RESULT}
    if state == JobState.FAILED:
        code = payload.get("code") if isinstance(payload, dict) else None
        message = payload.get("message") if isinstance(payload, dict) else None
        if code:
            return AssignmentEvent.JOB_FAILED, {"review": f"{code}: {message or ''}".strip()}
        return AssignmentEvent.JOB_FAILED, {"review": NO_RESULT}
    return AssignmentEvent.JOB_CANCELLED, {}
