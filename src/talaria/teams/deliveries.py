"""Report-back (team-tools.md 7): each pending delivery, once its goal's last and finishing turns ended and no
assignment is cancelling, is handled in ONE transaction under its deterministic id.

**Suppressed** (a reason, no message, no wake) when the goal's authority is lost, the origin conversation is
missing, archived or not the coordinator's, or a review delivery's goal left review or changed signature. Else
**delivered** through chat's automatic turns (chat.md 5.10): the system message in the origin conversation with its
``team_goal`` reference, and, unless skipped, a wake: an automatic turn of the coordinator with the wake prompt
(``automaticWakes`` +1, ``wakeTurnId`` set). The wake is skipped for a terminal delivery whose finishing turn was a
turn of the origin conversation that completed with a non-empty reply, for a goal a person stopped, and once the
activation has had 8 wakes. If chat refuses the enqueue (``turn_queue_full``, an archived conversation, ...) the
transaction rolls back and the delivery stays pending for a later pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import structlog

from talaria.chat import automatic
from talaria.errors import TalariaError
from talaria.lifecycle.audit_key import AuditKey
from talaria.limits import MAX_WAKES_PER_ACTIVATION
from talaria.store.interface import Row, Tx
from talaria.teams import authority, prompts, reads, writes
from talaria.teams.machine import AssignmentStatus, GoalStatus
from talaria.teams.records import Goal
from talaria.teams.steps import Effects, Steps, reconciler_actor, record, signature, turn_ended

log = structlog.get_logger("talaria.teams")

DELIVERED: Final = "delivered"
SUPPRESSED: Final = "suppressed"
STOPPED: Final = "stopped"


class Deliveries:
    def __init__(self, steps: Steps, key: AuditKey) -> None:
        self.steps = steps
        self.key = key
        # called in the transaction of each delivered message: the hub stages its stream events there (scale.md 4.2)
        self.stage: Callable[[Tx, automatic.Enqueued], Any] | None = None

    def pending(self) -> list[str]:
        with self.steps.store.read() as tx:
            return [str(row["id"]) for row in tx.all("team_delivery_pending")]

    def handle(self, delivery_id: str, effects: Effects) -> None:
        """Deliver or suppress one pending delivery if its goal is ready for it; a refused enqueue leaves it."""
        try:
            self._handle(delivery_id, effects)
        except TalariaError as exc:  # rolled back: the delivery stays pending, a later pass retries
            log.info("team_delivery_waits", delivery=delivery_id, code=exc.code)

    def _handle(self, delivery_id: str, effects: Effects) -> None:
        steps = self.steps
        now = steps.clock.now_ms()
        with steps.store.write() as tx:
            delivery = tx.one("team_delivery_get", id=delivery_id)
            goal = reads.goal_by_id(tx, delivery["goal_id"]) if delivery is not None else None
            if delivery is None or goal is None or delivery["status"] != "pending":
                return
            assignments = reads.assignments(tx, goal.id)
            if not (turn_ended(tx, goal.last_turn_id) and turn_ended(tx, goal.finish_turn_id)):
                return
            if any(a.status == AssignmentStatus.CANCELLING for a in assignments):
                return
            actor = reconciler_actor(steps.settings, goal.tenant)
            reason = self._suppressed_because(tx, goal, delivery)
            if reason is not None:
                self._finish(tx, delivery, SUPPRESSED, now, reason=reason)
                record(tx, actor, goal, "team.delivery.suppressed", now, from_state=goal.status,
                       to_state=goal.status, revision_after=goal.revision, reason_code=reason)  # fmt: skip
                return
            team = reads.team(tx, goal.tenant, goal.owner, goal.team_id)
            assert team is not None
            kind = str(delivery["kind"])
            content = prompts.delivery_message(goal, team, kind)
            reference = {"kind": "team_goal", "teamId": goal.team_id, "goalId": goal.id, "deliveryId": delivery_id,
                         "deliveryKind": kind, "status": str(delivery["goal_status"])}  # fmt: skip
            if self._wake_skipped(tx, goal, kind):
                enqueued = automatic.system_message(tx, goal.origin_conversation_id, content=content,
                                                    reference=reference, now_ms=now)  # fmt: skip
                self._finish(tx, delivery, DELIVERED, now, message_id=enqueued.message.id, woke=False)
            else:
                prompt = prompts.wake_prompt(goal, assignments, kind)
                enqueued = automatic.enqueue(
                    tx, goal.origin_conversation_id, content=content, prompt=prompt, reference=reference, actor=actor,
                    key=self.key, now_ms=now,
                )  # fmt: skip
                assert enqueued.turn is not None
                writes.set_goal(tx, goal, now, automatic_wakes=goal.automatic_wakes + 1, wake_turn_id=enqueued.turn.id)
                self._finish(tx, delivery, DELIVERED, now, message_id=enqueued.message.id,
                             wake_turn_id=enqueued.turn.id, woke=True)  # fmt: skip
            woke = "woke" if enqueued.turn is not None else "posted"
            record(tx, actor, goal, "team.delivery.delivered", now, from_state=goal.status, to_state=goal.status,
                   revision_after=goal.revision, reason_code=woke)  # fmt: skip
            staged = self.stage(tx, enqueued) if self.stage is not None else None
        effects.enqueued.append(enqueued)
        if staged is not None:
            effects.staged.append(staged)

    def _suppressed_because(self, tx: Tx, goal: Goal, delivery: Row) -> str | None:
        assignments = reads.assignments(tx, goal.id)
        if not authority.holds(tx, goal, assignments, self.steps.allowed):
            return authority.AUTHORITY_LOST
        row = tx.one("chat_conversation_get", tenant=goal.tenant, owner=goal.owner, id=goal.origin_conversation_id)
        if row is None or row["archived"] or row["bot_id"] != goal.coordinator_id:
            return authority.ORIGIN_GONE
        if delivery["kind"] == writes.REVIEW:
            if goal.status != GoalStatus.REVIEW:
                return "goal_left_review"
            if delivery["signature"] != signature(goal, assignments):
                return "signature_changed"
        return None

    def _wake_skipped(self, tx: Tx, goal: Goal, kind: str) -> bool:
        if goal.cause == STOPPED or goal.automatic_wakes >= MAX_WAKES_PER_ACTIVATION:
            return True
        if kind != writes.TERMINAL or goal.finish_turn_id is None:
            return False
        turn = tx.one("chat_turn_by_id", id=goal.finish_turn_id)
        if turn is None or turn["conversation_id"] != goal.origin_conversation_id or turn["state"] != "completed":
            return False
        return tx.one("chat_message_reply_of_turn", turn_id=goal.finish_turn_id) is not None

    @staticmethod
    def _finish(
        tx: Tx, delivery: Row, status: str, now: int, *, reason: str | None = None, message_id: str | None = None,
        wake_turn_id: str | None = None, woke: bool | None = None,
    ) -> None:  # fmt: skip
        written = tx.run(
            "team_delivery_finish", id=delivery["id"], status=status, reason=reason, message_id=message_id,
            wake_turn_id=wake_turn_id, woke=None if woke is None else int(woke), now=now,
        )  # fmt: skip
        if written != 1:
            raise TalariaError("store_unavailable", "the delivery was handled meanwhile")
