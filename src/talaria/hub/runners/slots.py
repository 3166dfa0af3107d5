"""Per-runner limits across replicas (scale.md 3.7): ``dispatcher.per_runner`` jobs and ``chat.per_runner`` chat turns
per runner, whichever replica runs them.

On SQLite one hub counts each runner's work in memory (the dispatcher's and the chat engine's ``per_runner``), so
``LocalSlots`` grants every request. On PostgreSQL each replica still counts its own work first, then takes one of
the runner's numbered rows (``dispatch_slot`` or ``chat_slot``, slots 1..limit) by a conditional upsert: a row is
free when missing, or when the work it was taken for no longer occupies the runner (a job's lease it was taken
under ended or expired; a chat turn ended). The taker frees its row when the work ends here; a replica that died
leaves rows those rules free.
"""

from __future__ import annotations

from typing import Protocol

from talaria.clock import Clock
from talaria.store.interface import Store

CLAIM_GRACE_MS = 30_000  # a dispatch slot taken for a claim that never recorded its lease is free after this


class RunnerSlots(Protocol):
    def take(self, runner_id: str, work_id: str, limit: int) -> int | None:
        """A slot of the runner's ``limit`` for ``work_id`` (a job or a chat turn), or None when all are busy."""
        ...

    def leased(self, runner_id: str, slot: int, work_id: str, lease_id: str) -> None:
        """The job's claim under the slot succeeded: the slot is held while that lease lives (dispatch slots)."""
        ...

    def free(self, runner_id: str, slot: int, work_id: str) -> None:
        """The work is over here: its slot is free at once."""
        ...

    def busy(self, runner_id: str, limit: int) -> int:
        """How many of the runner's ``limit`` slots the cluster holds now (0 where each hub counts its own)."""
        ...


class LocalSlots:
    """One hub: its own in-memory counts are the limit."""

    def take(self, runner_id: str, work_id: str, limit: int) -> int | None:
        return 0

    def leased(self, runner_id: str, slot: int, work_id: str, lease_id: str) -> None:
        return None

    def free(self, runner_id: str, slot: int, work_id: str) -> None:
        return None

    def busy(self, runner_id: str, limit: int) -> int:
        return 0


class SharedSlots:
    """``dispatch_slot`` (``kind="dispatch"``) or ``chat_slot`` (``kind="chat"``) rows of PostgreSQL replicas."""

    def __init__(self, store: Store, clock: Clock, kind: str) -> None:
        if kind not in ("dispatch", "chat"):
            raise ValueError(f"unknown slot kind {kind}")
        self.store, self.clock, self.kind = store, clock, kind
        self._work = "job_id" if kind == "dispatch" else "turn_id"
        self._drop = "dispatch_slot_drop_job" if kind == "dispatch" else "chat_slot_drop_turn"

    def take(self, runner_id: str, work_id: str, limit: int) -> int | None:
        now = self.clock.now_ms()
        with self.store.write() as tx:
            tx.run(self._drop, runner_id=runner_id, **{self._work: work_id})  # an earlier attempt's, if any
            for slot in range(1, limit + 1):
                params = {"runner_id": runner_id, "slot": slot, self._work: work_id, "now": now}
                if self.kind == "dispatch":
                    params["stale"] = now - CLAIM_GRACE_MS
                if tx.one(f"{self.kind}_slot_take", **params) is not None:
                    return slot
        return None

    def leased(self, runner_id: str, slot: int, work_id: str, lease_id: str) -> None:
        if self.kind != "dispatch":
            raise ValueError("only a dispatch slot records a lease")
        with self.store.write() as tx:
            tx.run("dispatch_slot_leased", runner_id=runner_id, slot=slot, job_id=work_id, lease_id=lease_id)

    def free(self, runner_id: str, slot: int, work_id: str) -> None:
        with self.store.write() as tx:
            tx.run(f"{self.kind}_slot_free", runner_id=runner_id, slot=slot, **{self._work: work_id})

    def busy(self, runner_id: str, limit: int) -> int:
        if self.kind != "dispatch":
            raise ValueError("only dispatch slots are counted")
        now = self.clock.now_ms()
        with self.store.read() as tx:
            row = tx.one("dispatch_slot_busy", runner_id=runner_id, limit=limit, now=now, stale=now - CLAIM_GRACE_MS)
        return int(row["n"]) if row is not None else 0
