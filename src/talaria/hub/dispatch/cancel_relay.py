"""A cancel accepted by one PostgreSQL replica reaches the replica whose dispatcher runs the job (scale.md 3.7): the
accepting replica notifies ``talaria_job`` with the job's id after the commit, and each replica's dispatcher reads,
every ``database.wake_fallback_ms``, which of the jobs it runs have ``cancel_requested`` set (one bounded query, so
a lost notification delays a cancel by at most that long instead of until the next heartbeat's answer)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Final

import structlog

from talaria.errors import TalariaError
from talaria.store.interface import Signals, Store

log = structlog.get_logger("talaria.dispatch")

JOB_CHANNEL: Final = "talaria_job"  # a job's cancel was requested (the id notified is the job's)


class CancelRelay:
    def __init__(
        self, store: Store, signals: Signals, *, fallback_ms: int, running: Callable[[], Iterable[str]],
        deliver: Callable[[str], None],
    ) -> None:  # fmt: skip
        """``running``: the ids of the jobs this replica runs; ``deliver(job_id)``: hand a cancel request to its
        job (any thread)."""
        self.store, self.signals, self.fallback_ms = store, signals, fallback_ms
        self.running, self.deliver = running, deliver
        signals.subscribe(JOB_CHANNEL, deliver)

    def requested(self, job_id: str) -> None:
        """A cancel of ``job_id`` committed here: tell the other replicas."""
        self.signals.notify(JOB_CHANNEL, job_id)

    async def watch(self) -> None:
        """The fallback, until cancelled."""
        while True:
            await asyncio.sleep(self.fallback_ms / 1000)
            ids = sorted(self.running())
            if not ids:
                continue
            try:
                found = await asyncio.to_thread(self._requested_among, ids)
            except TalariaError as exc:  # the heartbeat still answers cancel_requested
                log.warning("job_cancel_check_failed", code=exc.code)
                continue
            for job_id in found:
                self.deliver(job_id)

    def _requested_among(self, ids: list[str]) -> list[str]:
        with self.store.read() as tx:
            return [str(row["id"]) for row in tx.all("job_cancel_requested_among", ids=ids)]
