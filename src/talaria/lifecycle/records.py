"""Typed records of the lifecycle tables (lifecycle.md 2): ``Task``, ``Dispatch``, ``Job``, ``StoredResult``.

The store answers rows (``dict``); the lifecycle turns each into a frozen record with ``from_row`` the
moment it reads one, and writes a transition as the changed record's columns. ``LeaseRef`` is the pair a
holder presents (``lease_id``, ``lease_epoch``); ``Binding`` (``binding.py``) names a job.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from dataclasses import dataclass
from typing import Any

from talaria.lifecycle.binding import Binding
from talaria.store.interface import Row


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """What a holder presents: the opaque lease id and its fencing epoch."""

    lease_id: str
    lease_epoch: int


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    tenant: str
    title: str
    spec: str  # canonical JSON
    cell: str
    profile: str
    provenance: str | None
    trace: str
    state: str
    revision: int
    created_by: str
    created_at: int
    submitted_at: int | None
    approved_by: str | None
    approved_at: int | None
    rejected_by: str | None
    rejected_at: int | None
    rejection_reason: str | None
    finished_at: int | None

    @classmethod
    def from_row(cls, row: Row) -> Task:
        return cls(
            row["id"],
            row["tenant"],
            row["title"],
            row["spec"],
            row["cell"],
            row["profile"],
            row["provenance"],
            row["trace"],
            row["state"],
            row["revision"],
            row["created_by"],
            row["created_at"],
            row["submitted_at"],
            row["approved_by"],
            row["approved_at"],
            row["rejected_by"],
            row["rejected_at"],
            row["rejection_reason"],
            row["finished_at"],
        )

    @property
    def prompt(self) -> str | None:
        """The spec's ``prompt`` when it is a non-empty string (what a job's turn sends)."""
        spec = json.loads(self.spec)
        prompt = spec.get("prompt") if isinstance(spec, dict) else None
        return prompt if isinstance(prompt, str) and prompt else None


@dataclass(frozen=True, slots=True)
class Dispatch:
    id: str
    tenant: str
    task_id: str
    job_id: str
    run_id: str
    trace: str
    provenance: str
    cell: str
    profile: str
    status: str
    created_by: str
    created_at: int
    finished_at: int | None
    result_digest: str | None

    @classmethod
    def from_row(cls, row: Row, prefix: str = "") -> Dispatch:
        """From a ``dispatch`` row, or from a join's columns named ``<prefix><column>``."""
        return cls(
            row[prefix + "id"],
            row[prefix + "tenant"],
            row[prefix + "task_id"],
            row[prefix + "job_id"],
            row[prefix + "run_id"],
            row[prefix + "trace"],
            row[prefix + "provenance"],
            row[prefix + "cell"],
            row[prefix + "profile"],
            row[prefix + "status"],
            row[prefix + "created_by"],
            row[prefix + "created_at"],
            row[prefix + "finished_at"],
            row[prefix + "result_digest"],
        )

    def binding(self, principal: str) -> Binding:
        """The binding a worker presents for this dispatch's job, with ``principal`` filled in."""
        return Binding(
            self.tenant,
            self.task_id,
            self.trace,
            principal,
            self.provenance,
            self.run_id,
            self.id,
            self.job_id,
            self.cell,
            self.profile,
        )


# The columns a transition may change (``job_update``), in the order of the statement.
JOB_COLUMNS = (
    "state",
    "revision",
    "attempt",
    "started_at",
    "progress",
    "cancel_requested",
    "cancel_requested_at",
    "cancel_requested_by",
    "finished_at",
    "terminal_kind",
    "terminal_reason",
    "terminal_lease_id",
    "terminal_epoch",
    "result_digest",
    "terminal_response",
    "lease_id",
    "lease_epoch",
    "lease_owner_principal",
    "lease_owner_instance",
    "lease_acquired_at",
    "lease_expires_at",
    "last_heartbeat_at",
)
_JOB_FIELDS = (
    "id",
    "tenant",
    "task_id",
    "dispatch_id",
    "run_id",
    "trace",
    "provenance",
    "cell",
    "profile",
    "max_attempts",
    "max_life_s",
    "enqueued_at",
    *JOB_COLUMNS,
)


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    tenant: str
    task_id: str
    dispatch_id: str
    run_id: str
    trace: str
    provenance: str
    cell: str
    profile: str
    max_attempts: int
    max_life_s: int
    enqueued_at: int
    state: str
    revision: int
    attempt: int
    started_at: int | None
    progress: str | None  # canonical JSON
    cancel_requested: bool
    cancel_requested_at: int | None
    cancel_requested_by: str | None
    finished_at: int | None
    terminal_kind: str | None
    terminal_reason: str | None
    terminal_lease_id: str | None
    terminal_epoch: int | None
    result_digest: str | None
    terminal_response: bytes | None
    lease_id: str | None
    lease_epoch: int
    lease_owner_principal: str | None
    lease_owner_instance: str | None
    lease_acquired_at: int | None
    lease_expires_at: int | None
    last_heartbeat_at: int | None

    @classmethod
    def from_row(cls, row: Row) -> Job:
        values = [row[name] for name in _JOB_FIELDS]
        values[_CANCEL_REQUESTED] = bool(values[_CANCEL_REQUESTED])
        if values[_TERMINAL_RESPONSE] is not None:
            values[_TERMINAL_RESPONSE] = bytes(values[_TERMINAL_RESPONSE])
        return cls(*values)

    def changed(self, changes: dict[str, Any]) -> Job:
        """The record after ``changes``, with ``revision`` + 1 (every transition's).

        Positional, not ``dataclasses.replace``: a transition makes one of these, and replace costs
        about twice as much for 34 fields."""
        values = list(_job_values(self))
        for name, value in changes.items():
            values[_JOB_INDEX[name]] = value
        values[_REVISION] = self.revision + 1
        return Job(*values)

    def binding(self, principal: str) -> Binding:
        """The job's persisted binding (copied from its Dispatch) with ``principal`` filled in."""
        return Binding(
            tenant=self.tenant,
            task=self.task_id,
            trace=self.trace,
            principal=principal,
            provenance=self.provenance,
            run=self.run_id,
            dispatch=self.dispatch_id,
            job=self.id,
            cell=self.cell,
            profile=self.profile,
        )

    @property
    def lease(self) -> LeaseRef | None:
        return LeaseRef(self.lease_id, self.lease_epoch) if self.lease_id is not None else None


_job_values = operator.attrgetter(*_JOB_FIELDS)
_JOB_INDEX = {name: index for index, name in enumerate(_JOB_FIELDS)}
_REVISION, _CANCEL_REQUESTED = _JOB_INDEX["revision"], _JOB_INDEX["cancel_requested"]
_TERMINAL_RESPONSE = _JOB_INDEX["terminal_response"]
assert tuple(field.name for field in dataclasses.fields(Job)) == _JOB_FIELDS


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A terminal job's ``hermes_result`` row: what it ended with (result, error or reason)."""

    job_id: str
    kind: str
    result_digest: str
    payload: str  # canonical JSON
    recorded_at: int

    @classmethod
    def from_row(cls, row: Row) -> StoredResult:
        return cls(row["job_id"], row["kind"], row["result_digest"], row["payload"], row["recorded_at"])

    def value(self) -> Any:
        return json.loads(self.payload)
