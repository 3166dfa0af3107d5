"""The ``job_turn`` record: where a job's Hermes turn is going, written before ``prompt.submit``, and how it
ended, written before the job's terminal call.

The record is a state machine (``next_turn_state`` is its pure table; every move is a conditional update):

    (none) --begin--> submitting --submitted--> submitted --finished--> finished
                      submitting --finished---------------------------> finished

``submitting``: recorded, the submit may or may not have reached Hermes. ``submitted``: Hermes answered the
submit. ``finished``: the turn's outcome (``complete`` with its reply, ``error``, ``interrupted``,
``timeout``) is kept. What a later attempt does is decided by the record alone (``next_step``): no record → a
fresh turn; ``submitting``/``submitted`` → recover from Hermes, never submit again; ``finished`` → end the job
from the record, without opening a Hermes session.

The record also names the channel the turn runs in (``connection_id``, the turn's first event number on it
``first_seq``, the session's ``runtime_id``), which a PostgreSQL replica taking the job over adopts (scale.md 4.4).
Given the holder's lease, a write happens only while the job is held under it (scale.md 4.3): a holder whose lease
moved on gets ``stale_lease`` and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.lifecycle.records import LeaseRef
from talaria.store.interface import Row, Store, Tx

SUBMITTING, SUBMITTED, FINISHED = "submitting", "submitted", "finished"
OUTCOMES = frozenset({"complete", "error", "interrupted", "timeout"})


class TurnEvent(StrEnum):
    BEGIN = "begin"
    SUBMITTED = "submitted"
    FINISHED = "finished"


class NextStep(StrEnum):
    FRESH_TURN = "fresh_turn"
    RECOVER = "recover"
    FROM_RECORD = "from_record"


_TABLE: dict[tuple[str | None, TurnEvent], str] = {
    (None, TurnEvent.BEGIN): SUBMITTING,
    (SUBMITTING, TurnEvent.SUBMITTED): SUBMITTED,
    (SUBMITTING, TurnEvent.FINISHED): FINISHED,  # recovery took the outcome of a submit whose answer was lost
    (SUBMITTED, TurnEvent.FINISHED): FINISHED,
}


class TurnMoveRefused(Exception):
    """The record is not in a state the move starts from (another writer moved it, or it never existed)."""


def stale_lease(job_id: str) -> TalariaError:
    return TalariaError("stale_lease", f"job {job_id} is no longer held under this lease; its turn record is kept")


def _fence(lease: LeaseRef | None) -> dict[str, object]:
    return {"lease_id": lease.lease_id if lease else None, "lease_epoch": lease.lease_epoch if lease else None}


def next_turn_state(state: str | None, event: TurnEvent) -> str:
    """The state ``event`` leads to from ``state``; raises ``TurnMoveRefused`` for a move the table lacks."""
    target = _TABLE.get((state, event))
    if target is None:
        raise TurnMoveRefused(f"a job turn in state {state} cannot take {event}")
    return target


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
    outcome: str | None = None
    reply: str | None = None
    connection_id: str | None = None
    first_seq: int | None = None
    runtime_id: str | None = None

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
            outcome=row["outcome"],
            reply=row["reply"],
            connection_id=row["connection_id"],
            first_seq=int(row["first_seq"]) if row["first_seq"] is not None else None,
            runtime_id=row["runtime_session_id"],
        )


def next_step(turn: JobTurn | None) -> NextStep:
    """What an attempt that finds ``turn`` must do (the module docstring)."""
    if turn is None:
        return NextStep.FRESH_TURN
    if turn.state == FINISHED:
        return NextStep.FROM_RECORD
    return NextStep.RECOVER


class JobTurns:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def get(self, job_id: str) -> JobTurn | None:
        with self.store.read() as tx:
            row = tx.one("job_turn_get", job_id=job_id)
        return JobTurn.from_row(row) if row else None

    def begin(self, turn: JobTurn, lease: LeaseRef | None = None) -> None:
        """Record the turn in state ``submitting``; raises ``TurnMoveRefused`` if the job already has one, and
        ``stale_lease`` when ``lease`` no longer holds the job."""
        next_turn_state(None, TurnEvent.BEGIN)
        with self.store.write() as tx:
            made = tx.run(
                "job_turn_begin", job_id=turn.job_id, tenant=turn.tenant, attempt=turn.attempt,
                runner_id=turn.runner_id, profile=turn.profile, stored_session_id=turn.stored_session_id,
                marker=turn.marker, now=self.clock.now_ms(), connection_id=turn.connection_id,
                first_seq=turn.first_seq, runtime_session_id=turn.runtime_id, **_fence(lease),
            )  # fmt: skip
            if made != 1:  # a record of its own, a concurrent writer's committed first, or the lease moved on
                if tx.one("job_turn_lock", job_id=turn.job_id) is None:
                    raise stale_lease(turn.job_id)
                raise TurnMoveRefused(f"job {turn.job_id} already has a recorded turn")

    def submitted(self, job_id: str, stored_session_id: str | None, lease: LeaseRef | None = None) -> None:
        """``submitting`` → ``submitted``."""
        with self.store.write() as tx:
            self._move(tx, job_id, SUBMITTING, TurnEvent.SUBMITTED, stored_session_id, lease=lease)

    def finish(
        self, job_id: str, outcome: str, reply: str | None, stored_session_id: str | None,
        lease: LeaseRef | None = None,
    ) -> None:  # fmt: skip
        """``submitting``/``submitted`` → ``finished`` with the outcome, in one transaction. A turn already
        finished keeps its record (the first outcome wins)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown turn outcome {outcome}")
        with self.store.write() as tx:
            row = tx.one("job_turn_lock", job_id=job_id)  # a concurrent finish waits, then keeps this outcome
            if row is None:
                raise TurnMoveRefused(f"job {job_id} has no recorded turn")
            if row["state"] != FINISHED:
                self._move(tx, job_id, str(row["state"]), TurnEvent.FINISHED, stored_session_id, outcome, reply,
                           lease=lease)  # fmt: skip

    def _move(
        self,
        tx: Tx,
        job_id: str,
        from_state: str,
        event: TurnEvent,
        stored_session_id: str | None,
        outcome: str | None = None,
        reply: str | None = None,
        *,
        lease: LeaseRef | None = None,
    ) -> None:
        to_state = next_turn_state(from_state, event)
        changed = tx.run(
            "job_turn_move", job_id=job_id, from_state=from_state, to_state=to_state,
            stored_session_id=stored_session_id, outcome=outcome, reply=reply, now=self.clock.now_ms(),
            **_fence(lease),
        )  # fmt: skip
        if changed != 1:
            held = tx.one("job_turn_lock", job_id=job_id) if lease is not None else None
            if held is not None and held["state"] == from_state:  # in the state, so the lease refused it
                raise stale_lease(job_id)
            raise TurnMoveRefused(f"job {job_id}'s turn was not in state {from_state}")
