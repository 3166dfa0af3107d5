"""The ``job_turn`` table: where a job's Hermes turn is going, written before ``prompt.submit``.

States: ``submitting`` (recorded, the submit may or may not have reached Hermes), ``submitted`` (Hermes
answered the submit), ``finished`` (the turn's outcome was taken). A later attempt that finds
``submitting`` or ``submitted`` must recover the turn and never submit the prompt again.
"""

from __future__ import annotations

from dataclasses import dataclass

from talaria.clock import Clock
from talaria.store.interface import Row, Store

SUBMITTING, SUBMITTED, FINISHED = "submitting", "submitted", "finished"


@dataclass(frozen=True)
class JobTurn:
    job_id: str
    tenant: str
    attempt: int
    runner_id: str
    profile: str
    stored_session_id: str | None
    marker: str
    state: str

    @classmethod
    def from_row(cls, row: Row) -> JobTurn:
        return cls(
            job_id=str(row["job_id"]),
            tenant=str(row["tenant"]),
            attempt=int(row["attempt"]),
            runner_id=str(row["runner_id"]),
            profile=str(row["profile"]),
            stored_session_id=row["stored_session_id"],
            marker=str(row["marker"]),
            state=str(row["state"]),
        )


class JobTurns:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def get(self, job_id: str) -> JobTurn | None:
        with self.store.read() as tx:
            row = tx.one("job_turn_get", job_id=job_id)
        return JobTurn.from_row(row) if row else None

    def begin(self, turn: JobTurn) -> None:
        with self.store.write() as tx:
            tx.run(
                "job_turn_begin", job_id=turn.job_id, tenant=turn.tenant, attempt=turn.attempt,
                runner_id=turn.runner_id, profile=turn.profile, stored_session_id=turn.stored_session_id,
                marker=turn.marker, now=self.clock.now_ms(),
            )  # fmt: skip

    def mark(self, job_id: str, state: str, stored_session_id: str | None = None) -> None:
        with self.store.write() as tx:
            tx.run(
                "job_turn_mark", job_id=job_id, state=state, stored_session_id=stored_session_id,
                now=self.clock.now_ms(),
            )  # fmt: skip
