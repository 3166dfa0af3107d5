"""The dispatcher as a lease holder: its calls into the lifecycle engine for one job (claim, start, heartbeat,
complete, fail, cancel, release), each with the full binding and the idempotency key the Runtime API would see,
and the heartbeat loop that keeps the lease while a turn runs (ADR 0020)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from talaria.canonical import digest, sha256_hex
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.timings import HubTimings
from talaria.lifecycle.actor import RUNTIME, Actor
from talaria.lifecycle.answers import Discovered, Released
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.context import IdemRequest
from talaria.lifecycle.engine import Engine
from talaria.lifecycle.records import LeaseRef
from talaria.settings import Settings

log = structlog.get_logger("talaria.dispatcher")

# A heartbeat or access check failing with one of these is retried (the lease may still be renewed); any other
# refusal (stale_lease, lease_expired, lease_mismatch, terminal_conflict, ...) is a definite loss.
TRANSIENT = frozenset({"store_unavailable"})


@dataclass
class Lease:
    job_id: str
    binding: Binding
    ref: LeaseRef
    attempt: int
    life_end_ms: int  # acquired + max_life_s: the lease cannot be renewed past this
    expires_ms: int  # when the lease runs out unless renewed (a conservative reading of the hub's clock)
    lost: bool = False


class JobFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message[:1000]


class LeaseHolder:
    """One hub process's holder calls, principal ``lifecycle.dispatcher_principal``, one ``worker_instance``."""

    def __init__(self, engine: Engine, clock: Clock, settings: Settings, worker_instance: str) -> None:
        self.engine = engine
        self.clock = clock
        self.settings = settings
        self.worker_instance = worker_instance

    def actor(self, tenant: str) -> Actor:
        return Actor(self.settings.lifecycle_dispatcher_principal, frozenset({RUNTIME}), "in_process", tenant)

    def _idem(self, job_id: str, attempt: int, op: str, body: dict[str, Any]) -> IdemRequest:
        key = f"{self.worker_instance}:{job_id}:{attempt}:{op}"
        return IdemRequest(sha256_hex(key), digest(body))

    def claim(self, job: Discovered) -> Lease | None:
        binding = job.binding
        actor = self.actor(binding.tenant)
        body = {"binding": binding.as_dict(), "worker_instance": self.worker_instance}
        asked = self.clock.now_ms()  # the lease was acquired no earlier than this
        try:
            claimed = self.engine.claim(
                actor, job_id=binding.job, binding=binding, worker_instance=self.worker_instance,
                idem=self._idem(binding.job, job.attempt + 1, "claim", body),
            ).answer  # fmt: skip
        except TalariaError as exc:
            log.info("dispatcher_claim_refused", job_id=binding.job, code=exc.code)
            return None
        grant = claimed.lease
        return Lease(
            binding.job, binding, grant.ref, claimed.attempt,
            life_end_ms=asked + grant.max_life_s * 1000, expires_ms=asked + grant.ttl_s * 1000,
        )  # fmt: skip

    def _held(self, lease: Lease, op: str, extra: dict[str, Any]) -> tuple[Actor, IdemRequest]:
        """The actor and idempotency key of a holder call (the body digest is what the Runtime API would see)."""
        body = {
            "binding": lease.binding.as_dict(),
            "lease_id": lease.ref.lease_id,
            "lease_epoch": lease.ref.lease_epoch,
        }
        body |= extra
        key = f"{op}:{self.clock.now_ms()}" if op == "heartbeat" else op
        return self.actor(lease.binding.tenant), self._idem(lease.job_id, lease.attempt, key, body)

    def start(self, lease: Lease) -> None:
        actor, idem = self._held(lease, "start", {})
        self.engine.start(actor, job_id=lease.job_id, binding=lease.binding, lease=lease.ref, idem=idem)

    def beat(self, lease: Lease) -> bool:
        """Renew the lease; whether a cancel was requested."""
        actor, idem = self._held(lease, "heartbeat", {"progress": None})
        beat = self.engine.heartbeat(
            actor, job_id=lease.job_id, binding=lease.binding, lease=lease.ref, progress=None, idem=idem
        )
        return beat.answer.cancel_requested

    def complete(self, lease: Lease, result: dict[str, Any]) -> None:
        actor, idem = self._held(lease, "complete", {"result": result})
        self.engine.complete(
            actor, job_id=lease.job_id, binding=lease.binding, lease=lease.ref, result=result, idem=idem
        )

    def fail(self, lease: Lease, error: dict[str, Any]) -> None:
        actor, idem = self._held(lease, "fail", {"error": error})
        self.engine.fail(actor, job_id=lease.job_id, binding=lease.binding, lease=lease.ref, error=error, idem=idem)

    def cancel(self, lease: Lease, reason: str) -> None:
        actor, idem = self._held(lease, "cancel", {"reason": reason})
        self.engine.cancel(actor, job_id=lease.job_id, binding=lease.binding, reason=reason, lease=lease.ref, idem=idem)

    def release(self, lease: Lease, error: dict[str, Any]) -> Released:
        """Give the lease back (nothing ran): the job's next attempt, or its end once its attempts are used."""
        actor, idem = self._held(lease, "release", {"error": error})
        released = self.engine.release(
            actor, job_id=lease.job_id, binding=lease.binding, lease=lease.ref, error=error, idem=idem
        )
        return released.answer

    def deadline_ms(self, lease: Lease) -> int:
        """When the job's turn must end: ``turns.max_turn_s`` from now, and never later than the lease can be
        renewed, less one heartbeat interval left for stopping the turn and failing the job."""
        limit = self.settings.max_turn_for(lease.binding.cell, lease.binding.profile)
        margin = self.settings.lifecycle_heartbeat_interval_s * 1000
        return min(self.clock.now_ms() + limit * 1000, lease.life_end_ms - margin)

    async def keep(
        self,
        lease: Lease,
        *,
        cancel: asyncio.Event,
        revoked: asyncio.Event,
        still_allowed: Callable[[], bool],
        timings: HubTimings,
    ) -> None:
        """Renew the lease and re-check the author's access (``still_allowed``) every heartbeat interval. A
        transient failure of either is retried after ``timings.heartbeat_retry_s`` while the lease can still be
        renewed; a definite loss (any other refusal, or the lease running out) stops the turn."""
        interval = float(self.settings.lifecycle_heartbeat_interval_s)
        ttl_ms = self.settings.lifecycle_lease_ttl_s * 1000
        wait = interval
        while True:
            await asyncio.sleep(wait)
            wait = interval
            try:
                if not await asyncio.to_thread(still_allowed):
                    revoked.set()
            except Exception as exc:  # a read error: the next pass checks again
                log.warning("dispatcher_access_check_failed", job_id=lease.job_id, error=type(exc).__name__)
                wait = timings.heartbeat_retry_s
            sent = self.clock.now_ms()
            try:
                cancel_requested = await asyncio.to_thread(self.beat, lease)
            except Exception as exc:
                code = exc.code if isinstance(exc, TalariaError) else type(exc).__name__
                transient = not isinstance(exc, TalariaError) or exc.code in TRANSIENT
                retry_s = timings.heartbeat_retry_s
                if transient and self.clock.now_ms() + retry_s * 1000 < lease.expires_ms:
                    log.warning("dispatcher_heartbeat_retry", job_id=lease.job_id, code=code)
                    wait = retry_s
                    continue
                log.info("dispatcher_heartbeat_refused", job_id=lease.job_id, code=code)
                lease.lost = True  # the lease ended (maximum life, expiry): stop; the reaper decides what follows
                cancel.set()
                return
            lease.expires_ms = min(sent + ttl_ms, lease.life_end_ms)
            if cancel_requested:
                cancel.set()
