"""Taking and keeping a lease (lifecycle.md 4 rows 2-4, section 5): claim, start, heartbeat.

Each entry point is one write transaction in the order of section 6.5 (``frame.keyed``); refusals raise
``TalariaError`` with the codes of section 6.7.
"""

from __future__ import annotations

from typing import Any

from talaria.canonical import canonical_json
from talaria.errors import TalariaError
from talaria.ids import lease_id as new_lease_id
from talaria.lifecycle import journal
from talaria.lifecycle.actor import RUNTIME, Actor
from talaria.lifecycle.answers import Beat, Claimed, LeaseGrant, Reply, Started
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import Context, IdemRequest, Refusal, Signals
from talaria.lifecycle.expiry import expire
from talaria.lifecycle.frame import Bound, caller_identity, expired_refusal, keyed, lease_rules, require_role
from talaria.lifecycle.machine import AUDIT_TYPE, EVIDENCE_KIND, LEASED_STATES, TERMINAL, JobOp, TaskState
from talaria.lifecycle.machine import next_job_state as to
from talaria.lifecycle.records import Job, LeaseRef
from talaria.store.interface import Tx


def _ended() -> TalariaError:
    return TalariaError("terminal_conflict", "the job has ended")


class LeaseEntries(Context):
    def _extended(self, now: int, job: Job) -> int:
        """The new expiry of start and heartbeat: one TTL from now, capped at the maximum lease life."""
        cap = (job.lease_acquired_at or now) + job.max_life_s * 1000
        return min(now + self.settings.lifecycle_lease_ttl_s * 1000, cap)

    def claim(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        worker_instance: str,
        idem: IdemRequest | None = None,
    ) -> Reply[Claimed]:
        """Row 2. A due expiry of the job is applied first (and kept if the claim is then refused)."""
        require_role(actor, RUNTIME)
        caller_identity(actor, binding, job_id)
        ttl = self.settings.lifecycle_lease_ttl_s
        interval = self.settings.lifecycle_heartbeat_interval_s

        def body(tx: Tx, now: int, signals: Signals, bound: Bound) -> Reply[Claimed] | Refusal:
            job, dispatch = bound.job, bound.dispatch
            if job.state in TERMINAL:
                raise _ended()
            if job.state in LEASED_STATES and (job.lease_expires_at or 0) <= now:
                job = expire(tx, now, job, dispatch, actor=actor, reason="lease_expired", signals=signals)
                if job.state in TERMINAL:
                    return Refusal(_ended())
            if bound.task_state != TaskState.DISPATCHED or bound.task_approved_by is None:
                return Refusal(TalariaError("not_approved", "the job's task is not dispatched with an approval"))
            if job.state in LEASED_STATES:
                return Refusal(TalariaError("already_leased", "the job is leased by another worker"))
            grant = LeaseGrant(
                new_lease_id(), job.lease_epoch + 1, now, now + ttl * 1000, ttl, interval, job.max_life_s
            )
            after = journal.apply(
                tx,
                now,
                before=job,
                changes={
                    "state": to(job.state, JobOp.CLAIM),
                    "attempt": job.attempt + 1,
                    "lease_id": grant.lease_id,
                    "lease_epoch": grant.lease_epoch,
                    "lease_owner_principal": actor.principal,
                    "lease_owner_instance": worker_instance,
                    "lease_acquired_at": now,
                    "lease_expires_at": grant.expires_at,
                    "last_heartbeat_at": None,
                },
                actor=actor,
                audit_type=AUDIT_TYPE[JobOp.CLAIM],
                evidence_kind=EVIDENCE_KIND[JobOp.CLAIM],
                binding=binding,
                idem=idem,
                worker_instance=worker_instance,
                evidence_payload={
                    "worker_instance": worker_instance,
                    "lease_epoch": grant.lease_epoch,
                    "attempt": job.attempt + 1,
                },
                statement="job_claim",
            )
            return Reply(Claimed(job.id, after.state, after.attempt, after.revision, after.cancel_requested, grant))

        return keyed(self, actor, "claim", job_id, binding, idem, body)

    def start(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        lease: LeaseRef,
        idem: IdemRequest | None = None,
    ) -> Reply[Started]:
        """Row 3: LEASED to RUNNING, the expiry extended."""
        require_role(actor, RUNTIME)
        caller_identity(actor, binding, job_id)

        def body(tx: Tx, now: int, signals: Signals, bound: Bound) -> Reply[Started] | Refusal:
            job, dispatch = bound.job, bound.dispatch
            if job.state in TERMINAL:
                raise _ended()
            if lease_rules(now, actor, job, JobOp.START, lease):
                return expired_refusal(tx, now, actor, job, dispatch, signals)
            after = journal.apply(
                tx,
                now,
                before=job,
                changes={
                    "state": to(job.state, JobOp.START),
                    "started_at": now,
                    "lease_expires_at": self._extended(now, job),
                },
                actor=actor,
                audit_type=AUDIT_TYPE[JobOp.START],
                evidence_kind=EVIDENCE_KIND[JobOp.START],
                evidence_payload={"lease_epoch": lease.lease_epoch},
                binding=binding,
                idem=idem,
                worker_instance=job.lease_owner_instance,
                statement="job_start",
            )
            expires = after.lease_expires_at or now
            return Reply(
                Started(job.id, after.state, after.revision, after.cancel_requested, lease.lease_epoch, expires)
            )

        return keyed(self, actor, "start", job_id, binding, idem, body)

    def heartbeat(
        self,
        actor: Actor,
        *,
        job_id: str,
        binding: Binding,
        lease: LeaseRef,
        progress: dict[str, Any] | None = None,
        idem: IdemRequest | None = None,
    ) -> Reply[Beat]:
        """Row 4: the expiry extended, ``progress`` kept; the answer carries ``cancel_requested``."""
        require_role(actor, RUNTIME)
        caller_identity(actor, binding, job_id)
        interval = self.settings.lifecycle_heartbeat_interval_s

        def body(tx: Tx, now: int, signals: Signals, bound: Bound) -> Reply[Beat] | Refusal:
            job, dispatch = bound.job, bound.dispatch
            if job.state in TERMINAL:
                raise _ended()
            if lease_rules(now, actor, job, JobOp.HEARTBEAT, lease):
                return expired_refusal(tx, now, actor, job, dispatch, signals)
            # row 4 keeps the state (the table says so; the statement does not set it)
            assert to(job.state, JobOp.HEARTBEAT) == job.state
            renewal: dict[str, Any] = {"lease_expires_at": self._extended(now, job), "last_heartbeat_at": now}
            if progress is not None:
                renewal["progress"] = canonical_json(progress).decode("utf-8")
            after = journal.apply(
                tx,
                now,
                before=job,
                changes=renewal,
                actor=actor,
                audit_type=AUDIT_TYPE[JobOp.HEARTBEAT],
                evidence_kind=EVIDENCE_KIND[JobOp.HEARTBEAT],
                binding=binding,
                idem=idem,
                evidence_payload={"lease_epoch": lease.lease_epoch, "progress": progress},
                worker_instance=job.lease_owner_instance,
                statement="job_heartbeat",
            )
            expires = after.lease_expires_at or now
            return Reply(Beat(job.id, after.state, after.revision, expires, interval, after.cancel_requested))

        return keyed(self, actor, "heartbeat", job_id, binding, idem, body)
