"""Typed answers of the job entry points, and their one wire form (lifecycle.md 6.4).

The engine answers typed values (``Claimed``, ``Started``, ``Beat``, ``Ended``, ``CancelPending``,
``JobStatus``, ``Discovery``) wrapped in a ``Reply``. The Runtime API door sends ``body_of(reply)``.

Why the wire form lives here and not at the door: an applied keyed call stores its response bytes with
its idempotency key, and a terminal transition stores them on the job row (``terminal_response``), both
inside the write transaction, and a replay must send exactly those bytes. So the lifecycle needs the one
deterministic shaping function in its own transaction; the door calls the same function (``body_of``),
and a ``Reply`` carries the bytes already made for it, so they are never made twice or differently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from talaria.canonical import canonical_json
from talaria.clock import rfc3339
from talaria.lifecycle.binding import Binding
from talaria.lifecycle.machine import JobState, TaskState
from talaria.lifecycle.records import LeaseRef

A = TypeVar("A")


def _ts(ms: int | None) -> str | None:
    return rfc3339(ms) if ms is not None else None


def _ms(text: str) -> int:
    """The inverse of ``rfc3339`` (millisecond precision, so exact)."""
    return round(datetime.fromisoformat(text).timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    lease_id: str
    lease_epoch: int
    acquired_at: int
    expires_at: int
    ttl_s: int
    heartbeat_interval_s: int
    max_life_s: int

    @property
    def ref(self) -> LeaseRef:
        return LeaseRef(self.lease_id, self.lease_epoch)


@dataclass(frozen=True, slots=True)
class Claimed:
    """Row 2: the job is LEASED to the caller."""

    job: str
    state: str
    attempt: int
    revision: int
    cancel_requested: bool
    lease: LeaseGrant

    def wire(self) -> dict[str, Any]:
        lease = self.lease
        return {
            "job": self.job,
            "state": self.state,
            "attempt": self.attempt,
            "revision": self.revision,
            "cancel_requested": self.cancel_requested,
            "lease": {
                "lease_id": lease.lease_id,
                "lease_epoch": lease.lease_epoch,
                "acquired_at": rfc3339(lease.acquired_at),
                "expires_at": rfc3339(lease.expires_at),
                "ttl_s": lease.ttl_s,
                "heartbeat_interval_s": lease.heartbeat_interval_s,
                "max_life_s": lease.max_life_s,
            },
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Claimed:
        lease = data["lease"]
        grant = LeaseGrant(
            lease["lease_id"],
            lease["lease_epoch"],
            _ms(lease["acquired_at"]),
            _ms(lease["expires_at"]),
            lease["ttl_s"],
            lease["heartbeat_interval_s"],
            lease["max_life_s"],
        )
        return cls(data["job"], data["state"], data["attempt"], data["revision"], data["cancel_requested"], grant)


@dataclass(frozen=True, slots=True)
class Started:
    """Row 3: the job is RUNNING."""

    job: str
    state: str
    revision: int
    cancel_requested: bool
    lease_epoch: int
    expires_at: int

    def wire(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "state": self.state,
            "revision": self.revision,
            "cancel_requested": self.cancel_requested,
            "lease": {"lease_epoch": self.lease_epoch, "expires_at": rfc3339(self.expires_at)},
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Started:
        lease = data["lease"]
        return cls(
            data["job"],
            data["state"],
            data["revision"],
            data["cancel_requested"],
            lease["lease_epoch"],
            _ms(lease["expires_at"]),
        )


@dataclass(frozen=True, slots=True)
class Beat:
    """Row 4: the lease is renewed; ``cancel_requested`` tells the holder to stop."""

    job: str
    state: str
    revision: int
    expires_at: int
    heartbeat_interval_s: int
    cancel_requested: bool

    def wire(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "state": self.state,
            "revision": self.revision,
            "expires_at": rfc3339(self.expires_at),
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "cancel_requested": self.cancel_requested,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Beat:
        return cls(
            data["job"],
            data["state"],
            data["revision"],
            _ms(data["expires_at"]),
            data["heartbeat_interval_s"],
            data["cancel_requested"],
        )


@dataclass(frozen=True, slots=True)
class Ended:
    """A terminal transition (rows 5-8, 11, 12): Task and Dispatch followed via reconcile.

    ``cancel_requested`` is part of a cancel's answer only (None: complete, fail, expiry)."""

    job: str
    state: str
    revision: int
    result_digest: str
    cancel_requested: bool | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "state": self.state,
            "revision": self.revision,
            "result_digest": self.result_digest,
            "task_state": self.state,
            "dispatch_state": self.state,
        }
        if self.cancel_requested is not None:
            out["cancel_requested"] = self.cancel_requested
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Ended:
        return cls(data["job"], data["state"], data["revision"], data["result_digest"], data.get("cancel_requested"))


@dataclass(frozen=True, slots=True)
class CancelPending:
    """Row 9: an admin cancel of a leased job sets the flag; the holder learns it on its next heartbeat."""

    job: str
    state: str
    revision: int

    def wire(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "state": self.state,
            "revision": self.revision,
            "cancel_requested": True,
            "result_digest": None,
            "task_state": TaskState.DISPATCHED,
            "dispatch_state": "OPEN",
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> CancelPending:
        return cls(data["job"], data["state"], data["revision"])


Cancelled = Ended | CancelPending


def _cancel_from_wire(data: dict[str, Any]) -> Cancelled:
    return CancelPending.from_wire(data) if data["result_digest"] is None else Ended.from_wire(data)


@dataclass(frozen=True, slots=True)
class Requeued:
    """A holder's release that put the job back in the queue for its next attempt (ADR 0030)."""

    job: str
    revision: int
    attempt: int

    def wire(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "state": JobState.QUEUED,
            "revision": self.revision,
            "attempt": self.attempt,
            "result_digest": None,
            "task_state": TaskState.DISPATCHED,
            "dispatch_state": "OPEN",
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Requeued:
        return cls(data["job"], data["revision"], data["attempt"])


Released = Ended | Requeued


def _release_from_wire(data: dict[str, Any]) -> Released:
    return Requeued.from_wire(data) if data["result_digest"] is None else Ended.from_wire(data)


@dataclass(frozen=True, slots=True)
class LeaseView:
    lease_epoch: int
    owner_principal: str
    owner_instance: str
    acquired_at: int
    expires_at: int
    last_heartbeat_at: int | None
    lease_id: str | None  # only for the lease's owner


@dataclass(frozen=True, slots=True)
class TerminalView:
    kind: str
    reason_code: str | None
    result_digest: str | None
    finished_at: int | None


@dataclass(frozen=True, slots=True)
class JobStatus:
    job: str
    state: str
    revision: int
    attempt: int
    max_attempts: int
    cancel_requested: bool
    task_state: str | None
    dispatch_state: str
    lease: LeaseView | None
    terminal: TerminalView | None

    def wire(self) -> dict[str, Any]:
        lease: dict[str, Any] | None = None
        if self.lease is not None:
            held = self.lease
            lease = {
                "lease_epoch": held.lease_epoch,
                "owner": {"principal": held.owner_principal, "worker_instance": held.owner_instance},
                "acquired_at": rfc3339(held.acquired_at),
                "expires_at": rfc3339(held.expires_at),
                "last_heartbeat_at": _ts(held.last_heartbeat_at),
            }
            if held.lease_id is not None:
                lease["lease_id"] = held.lease_id
        terminal = None
        if self.terminal is not None:
            end = self.terminal
            terminal = {
                "kind": end.kind,
                "reason_code": end.reason_code,
                "result_digest": end.result_digest,
                "finished_at": _ts(end.finished_at),
            }
        return {
            "job": self.job,
            "state": self.state,
            "revision": self.revision,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "cancel_requested": self.cancel_requested,
            "task_state": self.task_state,
            "dispatch_state": self.dispatch_state,
            "lease": lease,
            "terminal": terminal,
        }


@dataclass(frozen=True, slots=True)
class Discovered:
    """One job a worker may claim, with the full binding it must present."""

    binding: Binding
    state: str
    attempt: int
    max_attempts: int
    revision: int
    enqueued_at: int

    def wire(self) -> dict[str, Any]:
        return {
            "binding": self.binding.as_dict(),
            "state": self.state,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "revision": self.revision,
            "enqueued_at": rfc3339(self.enqueued_at),
        }


@dataclass(frozen=True, slots=True)
class Discovery:
    jobs: tuple[Discovered, ...]

    def wire(self) -> dict[str, Any]:
        return {"jobs": [job.wire() for job in self.jobs]}


JobAnswer = Claimed | Started | Beat | Ended | CancelPending | Requeued


@dataclass(frozen=True, slots=True)
class Reply(Generic[A]):
    """An entry point's answer. ``body`` holds the canonical bytes already made for it (stored with
    its idempotency key or as the job's terminal response); ``replayed`` marks an idempotent replay."""

    answer: A
    body: bytes | None = None
    replayed: bool = False
    applied: bool = field(default=True, repr=False)  # False: a 200 that changed nothing (stores no key)


def encode(answer: JobAnswer | JobStatus | Discovery) -> bytes:
    """The canonical JSON of an answer: the one shaping function of the Runtime API's bodies."""
    return canonical_json(answer.wire())


def body_of(reply: Reply[Any]) -> bytes:
    return reply.body if reply.body is not None else encode(reply.answer)


# How a stored response of each idempotency operation reads back as its typed answer (replays only).
DECODERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "claim": Claimed.from_wire,
    "start": Started.from_wire,
    "heartbeat": Beat.from_wire,
    "complete": Ended.from_wire,
    "fail": Ended.from_wire,
    "cancel": _cancel_from_wire,
    "release": _release_from_wire,
}


def decode(operation: str, body: bytes) -> Any:
    return DECODERS[operation](json.loads(body))
