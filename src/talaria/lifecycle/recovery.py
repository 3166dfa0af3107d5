"""Start-up recovery (lifecycle.md 10), run before the listener opens."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import structlog

from talaria.errors import TalariaError
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.context import Context, Signals
from talaria.lifecycle.endings import admin_cancel_in
from talaria.lifecycle.expiry import expire_all_due, expire_due
from talaria.lifecycle.machine import TERMINAL
from talaria.lifecycle.records import Dispatch, Job, Task
from talaria.lifecycle.tasks import dispatch_in
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.interface import Tx

log = structlog.get_logger("talaria.lifecycle")


class RecoveryError(Exception):
    """Start-up must stop: the store is not migrated, or invariant I6 is broken."""


@dataclass(frozen=True)
class RecoveryReport:
    dispatched: int
    expired: int
    pruned_keys: int
    audit_head_seq: int


def recovery_actor(settings: Settings, tenant: str | None = None) -> Actor:
    """Who start-up recovery (and a restore's start, operations.md 7.2) acts as: the dispatcher principal, via
    ``recovery``."""
    return Actor(settings.lifecycle_dispatcher_principal, frozenset({"runtime"}), "recovery", tenant=tenant)


def recover(ctx: Context) -> RecoveryReport:
    actor = recovery_actor(ctx.settings)
    schema = migrations.schema(ctx.store)
    missing = schema.pending
    if missing:
        raise RecoveryError(
            "the database needs migrations ("
            + ", ".join(f"{name}: {n} pending" for name, n in missing.items())
            + "); run: talaria db upgrade"
        )
    newer = schema.newer_steps
    if any(not additive for _, _, additive in newer):
        raise RecoveryError("a newer release changed the schema; upgrade this replica")
    if newer:
        log.warning("database_newer_than_release", versions=schema.ahead)
    with ctx.store.read() as tx:
        head = tx.one("audit_head_get")
        undispatched = tx.all("task_approved_undispatched")
    dispatched = 0
    for task in undispatched:
        guard = recovery_actor(ctx.settings, task["tenant"])
        if ctx.write(functools.partial(_dispatch_one, ctx, guard, Task.from_row(task))):
            dispatched += 1
    expired = ctx.write(
        lambda tx, now, signals: expire_all_due(
            tx, now, actor=actor, reason="lease_expired_on_recovery", limit=2**31 - 1, signals=signals
        )
    )
    with ctx.store.read() as tx:
        broken = tx.all("job_terminal_unreconciled")
    if broken:
        raise RecoveryError(
            "invariant I6 is broken: terminal jobs without a matching reconciliation: "
            + ", ".join(row["id"] for row in broken)
        )
    pruned = ctx.write(lambda tx, now, signals: tx.run("idempotency_prune", now=now))
    report = RecoveryReport(dispatched, expired, pruned, int(head["seq"]) if head else 0)
    log.info("recovery_done", **report.__dict__)
    return report


def _dispatch_one(ctx: Context, actor: Actor, task: Task, tx: Tx, now: int, signals: Signals) -> bool:
    """Dispatch an approved task read before this transaction, unless it changed since (another replica's recovery
    or a request dispatched it)."""
    held = tx.one("task_lock", id=task.id)
    if held is None or int(held["revision"]) != task.revision:
        return False
    dispatch_in(ctx.settings, tx, now, actor, task, signals)
    return True


def cancel_unended(ctx: Context, reason: str) -> int:
    """Every job not terminal gets an admin cancel by the recovery actor with ``reason`` (operations.md 7.2: row 8,
    or row 9 and then row 12 once its lease expires), one transaction each. A job that ended or was flagged
    meanwhile is left, so a start interrupted half-way repeats nothing. Returns how many were cancelled or flagged."""
    with ctx.store.read() as tx:
        unended = [(row["tenant"], row["id"]) for row in tx.all("job_unended")]
    count = 0
    for tenant, job_id in unended:
        actor = recovery_actor(ctx.settings, tenant)
        if ctx.write(functools.partial(_cancel_one, actor, job_id, reason)):
            count += 1
    return count


def _cancel_one(actor: Actor, job_id: str, reason: str, tx: Tx, now: int, signals: Signals) -> bool:
    row = tx.one("job_get", tenant=actor.tenant, id=job_id)
    job = Job.from_row(row) if row is not None else None
    if job is None or job.state in TERMINAL or job.cancel_requested:
        return False
    found = tx.one("dispatch_get", id=job.dispatch_id)
    if found is None:  # invariant I6's check names it after recovery
        return False
    dispatch = Dispatch.from_row(found)
    admin_cancel_in(tx, now, actor, job, dispatch, dispatch.binding(actor.principal), reason, None, signals)
    return True


def sweep(ctx: Context) -> int:
    """One reaper tick: expire due leases, prune idempotency keys, run the WAL guard."""
    actor = Actor(ctx.settings.lifecycle_dispatcher_principal, frozenset({"runtime"}), "reaper")
    count = expire_due(ctx, actor)
    ctx.write(lambda tx, now, signals: tx.run("idempotency_prune", now=now))
    try:
        ctx.store.maintain()
    except TalariaError as exc:  # upkeep must never stop the reaper
        log.warning("store_maintenance_failed", code=exc.code)
    return count
