"""Approval by policy (team-tools.md 4.2): the one engine entry that creates, submits, approves and dispatches a
task inside the caller's transaction, so no other transaction ever sees it unapproved.

Only team tools' reconciler calls it, for an assignment's attempt. The task is the owner's (``task.created`` and
``task.submitted`` by ``acct:<tenant>/<owner>`` via ``team``), approved by the policy principal
``policy:team_permission:<coordinatorBotId>`` via ``team`` (reason code ``policy:team_permission``), and dispatched by
the reconciler (``task.dispatched``, ``hermes.job.enqueued``, ``enqueue`` evidence, as any dispatch). Its job runs
only through the in-process dispatcher: the Runtime API never sees it (ADR 0039). No person approves it, so a
``user`` owner runs it even when ``approval.allow_self_approval`` is false: the owner already has chat access to
the same profiles, and the coordinator's team permission is the approval (ADR 0039). ``verify`` runs first in the
transaction: the caller's check that the authority behind the approval still holds; it raises to refuse, and the
whole transaction rolls back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from talaria.lifecycle.actor import Actor, account_principal
from talaria.lifecycle.context import Signals
from talaria.lifecycle.records import Dispatch, Job, Task
from talaria.lifecycle.tasks import approve_by_policy_in, dispatch_in, insert_task, submit_in
from talaria.settings import Settings
from talaria.store.interface import Tx

VIA: Final = "team"


@dataclass(frozen=True)
class PolicyTask:
    """What a policy dispatch creates: the owner's task, approved under ``policy`` by ``approver`` (a bot id)."""

    tenant: str
    owner: str
    policy: str
    approver: str
    title: str
    spec: dict[str, Any]
    cell: str
    profile: str
    trace: str

    @property
    def approved_by(self) -> str:
        return f"policy:{self.policy}:{self.approver}"


def dispatch_by_policy(
    settings: Settings, tx: Tx, now: int, task: PolicyTask, signals: Signals, verify: Callable[[Tx], None]
) -> tuple[Task, Dispatch, Job]:
    """Create, submit, approve and dispatch ``task`` in ``tx`` (the caller commits, then emits ``signals``)."""
    verify(tx)
    owner = Actor(account_principal(task.tenant, task.owner), frozenset(), VIA, task.tenant)
    policy = Actor(task.approved_by, frozenset(), VIA, task.tenant)
    reconciler = Actor(settings.lifecycle_dispatcher_principal, frozenset(), VIA, task.tenant)
    draft = insert_task(tx, now, owner, task.tenant, task.title, task.spec, task.cell, task.profile, task.trace)
    submitted = submit_in(tx, now, owner, draft)
    approved = approve_by_policy_in(tx, now, policy, submitted, f"policy:{task.policy}")
    return dispatch_in(settings, tx, now, reconciler, approved, signals, in_process_only=True)
