"""One pass of team tools' reconciler (team-tools.md 4.1): every non-terminal goal, oldest first, through its
steps (authority, settle, G7, dispatch, review), then every pending delivery, then the admin cancel of each job
whose assignment is cancelling. Each step is its own short transaction; a step that fails is logged and the pass
goes on (the next pass retries). The answer says what the hub must do after the commits."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.lifecycle.audit_key import AuditKey
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store.interface import Store
from talaria.teams.deliveries import Deliveries
from talaria.teams.steps import Allowed, Effects, Steps, reconciler_actor

log = structlog.get_logger("talaria.teams")

CANCEL_REASON = "the assignment was cancelled"


class Reconcile:
    def __init__(
        self, store: Store, clock: Clock, settings: Settings, key: AuditKey, allowed: Allowed, engine: Engine
    ) -> None:
        self.steps = Steps(store, clock, settings, allowed)
        self.deliveries = Deliveries(self.steps, key)
        self.engine = engine
        self.passes = 0

    def open_goals(self) -> list[str]:
        with self.steps.store.read() as tx:
            return [str(row["id"]) for row in tx.all("goal_open_all")]

    def run(self) -> Effects:
        effects = Effects()
        order: tuple[Callable[[str, Effects], None], ...] = (
            self.steps.authority, self.steps.settle, self.steps.settle_cancel, self.steps.dispatch, self.steps.review,
        )  # fmt: skip
        for goal_id in self.open_goals():
            for step in order:
                try:
                    step(goal_id, effects)
                except TalariaError as exc:
                    log.warning("team_step_failed", goal=goal_id, step=step.__name__, code=exc.code)
        for delivery_id in self.deliveries.pending():
            self.deliveries.handle(delivery_id, effects)
        for tenant, task_id in effects.cancel_jobs:
            try:
                self.engine.cancel_task(reconciler_actor(self.steps.settings, tenant), tenant=tenant,
                                        task_id=task_id, reason=CANCEL_REASON)  # fmt: skip
            except TalariaError as exc:  # it ended meanwhile: the next pass settles it
                log.info("team_job_cancel_refused", task=task_id, code=exc.code)
        self.passes += 1
        return effects
