"""Scenario 26 of lifecycle.md 11: a stateful property test of the job engine.

A hypothesis ``RuleBasedStateMachine`` drives the engine functions (claim, start, heartbeat, complete,
fail, holder and admin cancel, reaper sweeps, same-key replays, restarts) with a ``ManualClock`` and
compares every answer code with a small pure-Python reference model of the job state machine of
lifecycle.md 4-6. After every step invariants I1-I8 are checked against the database, read through a
separate ``sqlite3`` connection (SELECT only).

The model follows the spec, not the engine: a disagreement fails the test with the request, the
expected code and the engine's answer. The run also counts the paths it reached and fails if one of
``REQUIRED_OUTCOMES`` or ``REQUIRED_CODES`` never happened, so the property cannot pass vacuously.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from talaria.canonical import canonical_json, digest, sha256_hex
from talaria.clock import ManualClock, rfc3339
from talaria.errors import TalariaError
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.answers import Reply, body_of, encode
from talaria.lifecycle.binding import FIELDS, Binding
from talaria.lifecycle.context import IdemRequest
from talaria.lifecycle.engine import Engine
from talaria.lifecycle.records import LeaseRef
from talaria.settings import ProfileOverride, Settings
from talaria.store import migrations
from talaria.store.interface import Store
from talaria.store.postgres import admin
from talaria.store.postgres.store import PostgresStore
from talaria.store.sqlite import SQLiteStore
from talaria.testing.postgres_server import PostgresServer
from tests.backends import PostgresReader, new_postgres_database


@dataclass(frozen=True)
class Wire:
    """An engine reply as the Runtime API sends it (status, canonical body bytes, replayed)."""

    status: int
    body: bytes
    replayed: bool

    @classmethod
    def of(cls, reply: Reply[Any]) -> Wire:
        return cls(200, body_of(reply), reply.replayed)

    @property
    def data(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value


TENANT = "default"
CELL = "local"
TTL_S = 30
HEARTBEAT_S = 10
MAX_LIFE_S = 60
MAX_ATTEMPTS = 2
RETENTION_S = 86_400
# One profile per job: (profile, max_attempts, max_life_s); "once" has a settings-file override.
PROFILES = (("default", MAX_ATTEMPTS, MAX_LIFE_S), ("once", 1, 45), ("default", MAX_ATTEMPTS, MAX_LIFE_S))

EXAMPLES = 150
STEPS_PER_EXAMPLE = 50
MIN_TOTAL_STEPS = 2_000

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
LEASED = frozenset({"LEASED", "RUNNING"})
HOLDER_ALLOWED = {
    "start": frozenset({"LEASED"}),
    "heartbeat": LEASED,
    "complete": frozenset({"RUNNING"}),
    "fail": LEASED,
    "cancel_holder": LEASED,
}
FINISH_KIND = {"complete": "SUCCEEDED", "fail": "FAILED", "cancel_holder": "CANCELLED"}
FINISH_AUDIT = {
    "complete": "hermes.job.completed",
    "fail": "hermes.job.failed",
    "cancel_holder": "hermes.job.cancelled",
}
FINISH_EVIDENCE = {"complete": "complete", "fail": "fail", "cancel_holder": "cancel"}
IDEM_OPERATION = {
    "claim": "claim",
    "start": "start",
    "heartbeat": "heartbeat",
    "complete": "complete",
    "fail": "fail",
    "cancel_holder": "cancel",
    "cancel_admin": "cancel",
}
LEASE_ID = re.compile(r"^[0-9a-f]{32}$")

WORKERS = {
    "a": Actor("worker-a", frozenset({"runtime"}), "trusted_proxy", TENANT),
    "b": Actor("worker-b", frozenset({"runtime"}), "trusted_proxy", TENANT),
}
ADMIN = Actor("admin-1", frozenset({"platform_admin"}), "trusted_proxy", TENANT)
ACTORS = {**WORKERS, "admin": ADMIN}
AUTHOR = Actor("acct:default/alice", frozenset(), "web", TENANT)
APPROVER = Actor("acct:default/bob", frozenset({"platform_admin"}), "web", TENANT)
INSTANCES = {"a": "wa-1", "b": "wb-1", "admin": "adm-1"}

PLACEHOLDER = "<lease id minted by the engine>"
NO_LEASE = ("0" * 32, 0)

STEPS_RUN = 0
OUTCOMES: Counter[str] = Counter()


# --------------------------------------------------------------------------------------------
# Requests and expectations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Req:
    """One engine call as a Runtime API request: operation, caller, job, key and parsed body."""

    op: str
    who: str
    job: int
    key: str
    binding: Binding
    lease: tuple[str, int] | None = None
    payload: Any = None
    instance: str | None = None

    @property
    def key_hash(self) -> str:
        return sha256_hex(self.key)

    @property
    def request_digest(self) -> str:
        body: dict[str, Any] = {"binding": self.binding.as_dict(), "payload": self.payload}
        if self.lease is not None:
            body["lease_id"], body["lease_epoch"] = self.lease
        if self.instance is not None:
            body["worker_instance"] = self.instance
        return digest(body)


@dataclass
class Expect:
    code: str | None = None  # an error code, or None for 200
    status: int | None = None  # the error status, when it matters (binding_mismatch is 403 or 409)
    data: dict[str, Any] | None = None  # expected parsed body of a fresh answer
    body: bytes | None = None  # expected exact bytes (replays)
    replayed: bool = False
    store_key: bool = False
    learn_lease: bool = False


def err(code: str, status: int | None = None) -> Expect:
    return Expect(code=code, status=status)


@dataclass
class StoredKey:
    request_digest: str
    status: int
    body: bytes
    expires_at: int


@dataclass
class Terminal:
    kind: str
    reason: str | None
    lease_id: str | None
    epoch: int
    result_digest: str
    response: bytes


@dataclass
class JobModel:
    """The reference model of one job (lifecycle.md 4-5)."""

    idx: int
    id: str
    persisted: dict[str, str]  # the binding without its principal
    max_attempts: int
    max_life_s: int
    state: str = "QUEUED"
    revision: int = 1
    attempt: int = 0
    epoch: int = 0
    lease_id: str | None = None
    owner: str | None = None
    instance: str | None = None
    acquired_at: int | None = None
    expires_at: int | None = None
    last_heartbeat_at: int | None = None
    started_at: int | None = None
    progress: str | None = None
    cancel: bool = False
    cancel_at: int | None = None
    cancel_by: str | None = None
    finished_at: int | None = None
    terminal: Terminal | None = None
    # (type, from, to, revision_before, revision_after, lease_epoch, reason_code, evidence kind)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    lease_ids: set[str] = field(default_factory=set)
    claim_epochs: list[int] = field(default_factory=list)

    def binding(self, principal: str) -> Binding:
        return Binding(**(self.persisted | {"principal": principal}))

    def event(self, type_: str, from_state: str, reason: str | None, evidence: str) -> None:
        before = self.revision
        self.revision += 1
        self.events.append((type_, from_state, self.state, before, self.revision, self.epoch, reason, evidence))

    def clear_lease(self) -> None:
        self.lease_id = self.owner = self.instance = None
        self.acquired_at = self.expires_at = None

    def terminal_body(self, kind: str, result_digest: str) -> dict[str, Any]:
        # the revision the terminal transition leads to
        return {
            "job": self.id,
            "state": kind,
            "revision": self.revision + 1,
            "result_digest": result_digest,
            "task_state": kind,
            "dispatch_state": kind,
        }

    def pending_cancel_body(self) -> dict[str, Any]:
        return {
            "job": self.id,
            "state": self.state,
            "revision": self.revision,
            "cancel_requested": True,
            "result_digest": None,
            "task_state": "DISPATCHED",
            "dispatch_state": "OPEN",
        }


class Model:
    """Pure-Python reference of lifecycle.md 4-6 (no I/O); ``evaluate`` mutates it like the engine must."""

    def __init__(self, jobs: list[JobModel]) -> None:
        self.jobs = jobs
        self.keys: dict[tuple[str, str, str, str], StoredKey] = {}

    # rows 10-12
    def expire(self, job: JobModel, now: int, reason: str) -> None:
        from_state = job.state
        job.epoch += 1
        job.clear_lease()
        OUTCOMES[f"expire:{reason}"] += 1
        if job.cancel:
            kind, code, type_ = "CANCELLED", "lease_expired_cancel_requested", "hermes.job.cancelled"
        elif job.attempt >= job.max_attempts:
            kind, code, type_ = "FAILED", "lease_expired_exhausted", "hermes.job.failed"
        else:
            job.state = "QUEUED"
            job.event("hermes.job.requeued", from_state, reason, "requeue")
            return
        OUTCOMES[f"expire:{code}"] += 1
        result_digest = digest({"reason_code": code})
        response = canonical_json(job.terminal_body(kind, result_digest))
        job.state = kind
        job.finished_at = now
        job.terminal = Terminal(kind, code, None, job.epoch, result_digest, response)
        job.event(type_, from_state, code, "expire")

    def due(self, now: int) -> list[JobModel]:
        return [j for j in self.jobs if j.state in LEASED and j.expires_at is not None and j.expires_at <= now]

    def sweep(self, now: int, reason: str) -> int:
        due = self.due(now)
        for job in due:
            self.expire(job, now, reason)
        return len(due)

    def live_keys(self, now: int) -> dict[tuple[str, str, str, str], StoredKey]:
        return {scope: k for scope, k in self.keys.items() if k.expires_at > now}

    def scope(self, req: Req) -> tuple[str, str, str, str]:
        return (ACTORS[req.who].principal, IDEM_OPERATION[req.op], self.jobs[req.job].id, req.key_hash)

    def evaluate(self, req: Req, now: int) -> Expect:
        """lifecycle.md 6.5: role, binding step 1, idempotency, binding 2-4, terminal rules, operation."""
        job = self.jobs[req.job]
        actor = ACTORS[req.who]
        role = "platform_admin" if req.op == "cancel_admin" else "runtime"
        if role not in actor.roles:
            return err("role_forbidden", 403)
        if req.binding.tenant != actor.tenant or req.binding.principal != actor.principal:
            return err("binding_mismatch", 403)
        if req.binding.job != job.id:
            return err("binding_mismatch", 409)
        stored = self.keys.get(self.scope(req))
        if stored is not None and stored.expires_at > now:
            if stored.request_digest != req.request_digest:
                return err("idempotency_key_reused", 422)
            return Expect(body=stored.body, replayed=True)
        if req.binding != job.binding(actor.principal):
            return err("binding_mismatch", 409)
        if req.op == "claim":
            return self._claim(job, req, now, actor)
        if req.op == "cancel_admin":
            return self._admin_cancel(job, req, now, actor)
        return self._holder(job, req, now, actor)

    def _claim(self, job: JobModel, req: Req, now: int, actor: Actor) -> Expect:
        if job.state in TERMINAL:
            return err("terminal_conflict", 409)
        if job.state in LEASED and job.expires_at is not None and job.expires_at <= now:
            self.expire(job, now, "lease_expired")
            if job.state in TERMINAL:
                return err("terminal_conflict", 409)
        if job.state != "QUEUED":
            return err("already_leased", 409)
        job.state = "LEASED"
        job.attempt += 1
        job.epoch += 1
        job.lease_id = PLACEHOLDER
        job.owner = actor.principal
        job.instance = req.instance
        job.acquired_at = now
        job.expires_at = now + TTL_S * 1000
        job.last_heartbeat_at = None
        job.event("hermes.job.claimed", "QUEUED", None, "claim")
        data = {
            "job": job.id,
            "state": "LEASED",
            "attempt": job.attempt,
            "revision": job.revision,
            "cancel_requested": job.cancel,
            "lease": {
                "lease_id": PLACEHOLDER,
                "lease_epoch": job.epoch,
                "acquired_at": rfc3339(now),
                "expires_at": rfc3339(job.expires_at),
                "ttl_s": TTL_S,
                "heartbeat_interval_s": HEARTBEAT_S,
                "max_life_s": job.max_life_s,
            },
        }
        return Expect(data=data, store_key=True, learn_lease=True)

    def _holder(self, job: JobModel, req: Req, now: int, actor: Actor) -> Expect:
        assert req.lease is not None
        lease_id, epoch = req.lease
        op = req.op
        if job.state in TERMINAL:
            if op in FINISH_KIND:
                t = job.terminal
                assert t is not None
                if (t.kind, t.lease_id, t.epoch, t.result_digest) == (
                    FINISH_KIND[op],
                    lease_id,
                    epoch,
                    self.result_digest(req),
                ):
                    return Expect(body=t.response, replayed=False)
            return err("terminal_conflict", 409)
        # section 5, holder rules 1-4 in order
        if epoch < job.epoch:
            return err("stale_lease", 409)
        if job.state not in HOLDER_ALLOWED[op]:
            return err("invalid_transition", 409)
        if epoch > job.epoch or lease_id != job.lease_id or actor.principal != job.owner:
            return err("lease_mismatch", 409)
        assert job.expires_at is not None and job.acquired_at is not None
        if now >= job.expires_at:
            self.expire(job, now, "lease_expired")
            return err("lease_expired", 409)
        extended = min(now + TTL_S * 1000, job.acquired_at + job.max_life_s * 1000)
        if op == "start":
            job.state = "RUNNING"
            job.started_at = now
            job.expires_at = extended
            job.event("hermes.job.started", "LEASED", None, "start")
            data = {
                "job": job.id,
                "state": "RUNNING",
                "revision": job.revision,
                "cancel_requested": job.cancel,
                "lease": {"lease_epoch": epoch, "expires_at": rfc3339(extended)},
            }
            return Expect(data=data, store_key=True)
        if op == "heartbeat":
            job.expires_at = extended
            job.last_heartbeat_at = now
            if req.payload is not None:
                job.progress = canonical_json(req.payload).decode("utf-8")
            job.event("hermes.job.heartbeat", job.state, None, "heartbeat")
            data = {
                "job": job.id,
                "state": job.state,
                "revision": job.revision,
                "expires_at": rfc3339(extended),
                "heartbeat_interval_s": HEARTBEAT_S,
                "cancel_requested": job.cancel,
            }
            return Expect(data=data, store_key=True)
        # rows 5-7
        kind = FINISH_KIND[op]
        result_digest = self.result_digest(req)
        data = job.terminal_body(kind, result_digest)
        reason = req.payload["code"] if op == "fail" else ("holder_cancel" if op == "cancel_holder" else None)
        if op == "cancel_holder":
            data["cancel_requested"] = job.cancel
        from_state = job.state
        job.clear_lease()
        job.state = kind
        job.finished_at = now
        job.terminal = Terminal(kind, reason, lease_id, epoch, result_digest, canonical_json(data))
        job.event(FINISH_AUDIT[op], from_state, reason, FINISH_EVIDENCE[op])
        return Expect(data=data, store_key=True)

    def _admin_cancel(self, job: JobModel, req: Req, now: int, actor: Actor) -> Expect:
        if job.state in TERMINAL:
            return err("terminal_conflict", 409)
        if job.state == "QUEUED":  # row 8
            result_digest = digest({"reason": req.payload})
            data = job.terminal_body("CANCELLED", result_digest) | {"cancel_requested": False}
            job.state = "CANCELLED"
            job.finished_at = now
            job.terminal = Terminal("CANCELLED", "admin_cancel", None, job.epoch, result_digest, canonical_json(data))
            job.event("hermes.job.cancelled", "QUEUED", "admin_cancel", "cancel")
            return Expect(data=data, store_key=True)
        if job.cancel:  # a repeated admin cancel: no-op 200, no key
            OUTCOMES["admin_cancel_repeated"] += 1
            return Expect(data=job.pending_cancel_body())
        OUTCOMES["admin_cancel_requested"] += 1
        job.cancel = True  # row 9
        job.cancel_at = now
        job.cancel_by = actor.principal
        job.event("hermes.job.cancel_requested", job.state, None, "cancel_request")
        return Expect(data=job.pending_cancel_body(), store_key=True)

    @staticmethod
    def result_digest(req: Req) -> str:
        if req.op == "cancel_holder":
            return digest({"reason": req.payload})
        return digest(req.payload)


# --------------------------------------------------------------------------------------------
# The state machine
# --------------------------------------------------------------------------------------------

workers = st.sampled_from(sorted(WORKERS))
job_indexes = st.integers(0, len(PROFILES) - 1)
operations = st.sampled_from(
    ["next"] * 8 + ["claim"] * 2 + ["start"] * 2 + ["heartbeat"] * 2 + ["complete", "fail", "cancel_holder"]
)
lease_choices = st.sampled_from(["own", "own", "own", "own", "current", "other", "bumped"])
variants = st.integers(0, 99)
key_picks = st.integers(0, 99)  # < 85: a fresh key; else reuse an issued key string (any scope)
advances = st.sampled_from([1, 5, 10, 15, 31])
SUMMARIES = ("s1", "s2")
ERROR_CODES = ("e1", "e2")
REASONS = ("r1", "r2")
MISUSES = ("admin_claims", "worker_admin_cancels", "bad_binding_claim", "bad_binding_heartbeat")
# What a holder does next on a RUNNING job, by ``variant``: mostly heartbeat, then complete.
RUNNING_NEXT = ((45, "heartbeat"), (85, "complete"), (93, "fail"), (100, "cancel_holder"))
HOLDER_NAME = {actor.principal: name for name, actor in WORKERS.items()}


class LifecycleMachine(RuleBasedStateMachine):
    # the PostgreSQL server of the run on PostgreSQL (scale.md 6.1), None on SQLite
    postgres: PostgresServer | None = None

    def __init__(self) -> None:
        super().__init__()
        self.tmp: Path | None = None
        self.store: Store | None = None
        self.reader: sqlite3.Connection | None = None
        self.pg_reader: PostgresReader | None = None
        self.url = ""
        self.db_name = ""

    def open_store(self) -> Store:
        return PostgresStore(self.url) if self.url else SQLiteStore(self.path)

    # ---- set-up and tear-down ---------------------------------------------------------------

    @initialize()
    def set_up(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="talaria-s26-"))
        self.clock = ManualClock()
        self.settings = Settings(
            data_dir=self.tmp,
            lifecycle_lease_ttl_s=TTL_S,
            lifecycle_heartbeat_interval_s=HEARTBEAT_S,
            lifecycle_max_attempts=MAX_ATTEMPTS,
            lifecycle_max_lease_life_s=MAX_LIFE_S,
            lifecycle_idempotency_retention_s=RETENTION_S,
            profiles={f"{CELL}/once": ProfileOverride(max_attempts=1, max_lease_life_s=45)},
        )
        self.path = self.settings.sqlite_path
        if self.postgres is not None:
            self.db_name = new_postgres_database(self.postgres, migrated=True)
            self.url = self.postgres.url(self.db_name)
        self.store = self.open_store()
        migrations.upgrade(self.store)
        self.engine = Engine(self.store, self.clock, self.settings)
        with self.store.write() as tx:
            tx.run("tenant_ensure", name=TENANT, now=self.clock.now_ms())
        jobs: list[JobModel] = []
        for idx, (profile, max_attempts, max_life_s) in enumerate(PROFILES):
            task = self.engine.create_task(
                AUTHOR,
                tenant=TENANT,
                title=f"job {idx}",
                spec={"prompt": f"p{idx}"},
                cell=CELL,
                profile=profile,
                trace=f"{idx:032x}",
            )
            self.engine.submit_task(AUTHOR, tenant=TENANT, task_id=task.id)
            task, disp, job = self.engine.approve_and_dispatch(APPROVER, tenant=TENANT, task_id=task.id)
            assert job.max_attempts == max_attempts == self.settings.max_attempts_for(CELL, profile)
            assert job.max_life_s == max_life_s == self.settings.max_life_for(CELL, profile)
            persisted = {
                "tenant": TENANT,
                "task": task.id,
                "trace": task.trace,
                "provenance": disp.provenance,
                "run": disp.run_id,
                "dispatch": disp.id,
                "job": job.id,
                "cell": CELL,
                "profile": profile,
            }
            model_job = JobModel(idx, job.id, persisted, job.max_attempts, job.max_life_s)
            model_job.events.append(("hermes.job.enqueued", None, "QUEUED", None, 1, 0, None, "enqueue"))
            jobs.append(model_job)
        self.model = Model(jobs)
        if self.url:
            self.pg_reader = PostgresReader(psycopg.connect(self.url, autocommit=True))
            self.pg_reader.conn.execute("SET default_transaction_read_only = on")
        else:
            self.reader = sqlite3.connect(self.path, isolation_level=None)
            self.reader.row_factory = sqlite3.Row
            self.reader.execute("PRAGMA query_only=ON")
        self.memory: dict[tuple[str, int], tuple[str, int]] = {}  # (worker, job) -> last lease got
        self.issued: list[Req] = []
        self.finishes: list[Req] = []  # complete, fail and holder cancel requests that ended a job
        self.keys: list[str] = []
        self.key_counter = 0
        self.last_epoch = [0] * len(jobs)
        self.frozen: dict[str, dict[str, Any]] = {}
        self.big_jump_done = False
        self.task_events = 4 * len(jobs)  # created, submitted, approved, dispatched

    def teardown(self) -> None:
        if self.reader is not None:
            self.reader.close()
        if self.pg_reader is not None:
            self.pg_reader.conn.close()
        if self.store is not None:
            self.store.close()
        if self.postgres is not None and self.db_name:
            admin.drop_database(self.postgres.url(), self.db_name)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- helpers ------------------------------------------------------------------------------

    def _count_step(self) -> None:
        global STEPS_RUN
        STEPS_RUN += 1

    def _fresh_key(self) -> str:
        self.key_counter += 1
        return f"key-{self.key_counter}"

    def _key(self, pick: int) -> str:
        if pick < 85 or not self.keys:
            return self._fresh_key()
        return self.keys[pick % len(self.keys)]

    def _lease(self, who: str, job: int, choice: str) -> tuple[str, int]:
        other = "b" if who == "a" else "a"
        model_job = self.model.jobs[job]
        own = self.memory.get((who, job), NO_LEASE)
        if choice == "own":
            return own
        if choice == "other":
            return self.memory.get((other, job), NO_LEASE)
        if choice == "current":
            return (model_job.lease_id or "f" * 32, model_job.epoch)
        return (own[0], own[1] + 1)  # bumped: a higher epoch than the worker ever got

    def _binding(self, who: str, job: int) -> Binding:
        return self.model.jobs[job].binding(ACTORS[who].principal)

    def _engine_call(self, req: Req) -> Reply[Any]:
        actor = ACTORS[req.who]
        job_id = self.model.jobs[req.job].id
        idem = IdemRequest(req.key_hash, req.request_digest)
        common: dict[str, Any] = {"job_id": job_id, "binding": req.binding, "idem": idem}
        if req.op == "claim":
            assert req.instance is not None
            return self.engine.claim(actor, worker_instance=req.instance, **common)
        if req.op == "cancel_admin":
            return self.engine.cancel(actor, reason=req.payload, **common)
        assert req.lease is not None
        common["lease"] = LeaseRef(*req.lease)
        if req.op == "start":
            return self.engine.start(actor, **common)
        if req.op == "heartbeat":
            return self.engine.heartbeat(actor, progress=req.payload, **common)
        if req.op == "complete":
            return self.engine.complete(actor, result=req.payload, **common)
        if req.op == "fail":
            return self.engine.fail(actor, error=req.payload, **common)
        assert req.op == "cancel_holder"
        return self.engine.cancel(actor, reason=req.payload, **common)

    def _exec(self, req: Req) -> None:
        """Run ``req`` through the model and the engine and compare the answers."""
        now = self.clock.now_ms()
        expect = self.model.evaluate(req, now)
        try:
            result: Wire | None = Wire.of(self._engine_call(req))
            got: tuple[Any, ...] = (200, None)
        except TalariaError as exc:
            result = None
            got = (exc.status, exc.code)
        where = f"{req!r} at t={now}"
        OUTCOMES[f"{req.op}:{expect.code or ('replayed' if expect.replayed else 'ok')}"] += 1
        if expect.body is not None and not expect.replayed:
            OUTCOMES["terminal_replay"] += 1
        if expect.code is not None:
            assert got[1] == expect.code, f"{where}: expected {expect.code}, engine answered {got}"
            if expect.status is not None:
                assert got[0] == expect.status, f"{where}: expected status {expect.status}, got {got}"
        else:
            assert result is not None, f"{where}: expected 200, engine answered {got}"
            assert result.status == 200, where
            assert result.replayed is expect.replayed, f"{where}: replayed={result.replayed}"
            if expect.body is not None:
                assert result.body == expect.body, f"{where}: body {result.body!r} != {expect.body!r}"
            else:
                data = result.data
                assert expect.data is not None
                if expect.learn_lease:
                    lease_id = data["lease"]["lease_id"]
                    job = self.model.jobs[req.job]
                    assert LEASE_ID.match(lease_id), lease_id
                    assert lease_id not in job.lease_ids, "a claim reused an earlier lease_id"
                    job.lease_ids.add(lease_id)
                    job.lease_id = lease_id
                    expect.data["lease"]["lease_id"] = lease_id
                    # I2: every claim's epoch exceeds every earlier epoch of the job
                    epoch = data["lease"]["lease_epoch"]
                    assert all(epoch > e for e in job.claim_epochs), (epoch, job.claim_epochs)
                    assert epoch > self.last_epoch[req.job]
                    job.claim_epochs.append(epoch)
                assert data == expect.data, f"{where}: body {data} != expected {expect.data}"
                assert result.body == canonical_json(data), f"{where}: body is not canonical JSON"
            if expect.store_key:
                self.model.keys[self.model.scope(req)] = StoredKey(
                    req.request_digest, 200, result.body, now + RETENTION_S * 1000
                )
            if req.op in FINISH_KIND and expect.data is not None:
                self.finishes.append(req)
            if req.op == "claim" and "lease" in result.data and req.who in WORKERS:
                lease = result.data["lease"]
                self.memory[(req.who, req.job)] = (lease["lease_id"], lease["lease_epoch"])
        if req.binding == self._binding(req.who, req.job):
            self.issued.append(req)
        if req.key not in self.keys:
            self.keys.append(req.key)

    # ---- worker and admin rules ------------------------------------------------------------

    def _act(self, job: int, who: str, op: str, choice: str, variant: int, pick: int) -> None:
        """One worker call. ``next`` is what a well-behaved worker would do now (the holder, with its
        own lease); the other operations are arbitrary and often refused."""
        self._count_step()
        if op == "next":
            # a well-behaved worker works on a job that has not ended, if there is one
            live = [j.idx for j in self.model.jobs if j.state not in TERMINAL]
            if live and job not in live:
                job = live[job % len(live)]
        m = self.model.jobs[job]
        if op == "next":
            choice = "own"
            holder = HOLDER_NAME.get(m.owner or "")
            if m.state == "QUEUED":
                op = "claim"
            elif m.state == "LEASED":
                who = holder or who
                op = "start" if variant < 75 else "heartbeat"
            elif m.state == "RUNNING":
                who = holder or who
                op = next(name for bound, name in RUNNING_NEXT if variant < bound)
            else:
                # a worker whose answer was lost sends its finishing request again, under a new key
                ended = [r for r in self.finishes if r.job == job]
                if ended and variant < 50:
                    self._exec(replace(ended[-1], key=self._fresh_key()))
                    return
                op = "complete"
        key = self._key(pick)
        binding = self._binding(who, job)
        if op == "claim":
            self._exec(Req(op, who, job, key, binding, instance=INSTANCES[who]))
            return
        lease = self._lease(who, job, choice)
        payload: Any
        if op == "heartbeat":
            payload = [None, {"p": 1}, {"p": 2}][variant % 3]
        elif op == "complete":
            payload = {"outputs": {}, "artifacts": [], "summary": SUMMARIES[variant % 2]}
        elif op == "fail":
            payload = {"code": ERROR_CODES[variant % 2], "message": "m", "retryable": variant % 4 < 2}
        elif op == "cancel_holder":
            payload = REASONS[variant % 2]
        else:
            payload = None
        self._exec(Req(op, who, job, key, binding, lease=lease, payload=payload))

    # Registered several times so that calls outweigh clock, reaper and restart steps.
    @rule(job=job_indexes, who=workers, op=operations, choice=lease_choices, variant=variants, pick=key_picks)
    def act(self, job: int, who: str, op: str, choice: str, variant: int, pick: int) -> None:
        self._act(job, who, op, choice, variant, pick)

    @rule(job=job_indexes, who=workers, op=operations, choice=lease_choices, variant=variants, pick=key_picks)
    def act_again(self, job: int, who: str, op: str, choice: str, variant: int, pick: int) -> None:
        self._act(job, who, op, choice, variant, pick)

    @rule(job=job_indexes, who=workers, op=operations, choice=lease_choices, variant=variants, pick=key_picks)
    def act_once_more(self, job: int, who: str, op: str, choice: str, variant: int, pick: int) -> None:
        self._act(job, who, op, choice, variant, pick)

    @rule(job=job_indexes, who=workers, op=operations, choice=lease_choices, variant=variants, pick=key_picks)
    def act_yet_again(self, job: int, who: str, op: str, choice: str, variant: int, pick: int) -> None:
        self._act(job, who, op, choice, variant, pick)

    @precondition(lambda self: any(m.state in LEASED for m in self.model.jobs))
    @rule(
        i=st.integers(0, 10**6),
        offset_ms=st.sampled_from([-1, 0, 0, 1, 5_000]),
        op=st.sampled_from(["start", "heartbeat", "heartbeat", "complete", "fail"]),
        variant=variants,
    )
    def holder_calls_at_expiry(self, i: int, offset_ms: int, op: str, variant: int) -> None:
        """The holder of a lease stalls until just before, exactly at, or after its expiry and then
        calls with its own lease: live while now < expires_at, else 409 lease_expired (scenario 14)."""
        held = [m for m in self.model.jobs if m.state in LEASED]
        m = held[i % len(held)]
        assert m.expires_at is not None and m.owner is not None
        target = m.expires_at + offset_ms
        if target > self.clock.now_ms():
            self.clock.set_ms(target)
        self._act(m.idx, HOLDER_NAME[m.owner], op, "own", variant, pick=0)

    @rule(
        job=job_indexes,
        leased=st.sampled_from([True, True, True, True, True, False]),
        reason=st.sampled_from(REASONS),
        pick=key_picks,
    )
    def admin_cancel(self, job: int, leased: bool, reason: str, pick: int) -> None:
        """The admin cancels a job. With ``leased`` it picks a LEASED or RUNNING job (row 9, then the
        no-op repeat and row 12) and, when there is none, only reads a status; otherwise it cancels
        the given job (row 8 when QUEUED)."""
        held = [m.idx for m in self.model.jobs if m.state in LEASED]
        if leased and not held:
            self.status("admin", job)
            return
        self._count_step()
        if leased:
            job = held[job % len(held)]
        binding = self._binding("admin", job)
        self._exec(Req("cancel_admin", "admin", job, self._key(pick), binding, payload=reason))

    @rule(job=job_indexes, who=workers, kind=st.sampled_from(MISUSES), name=st.sampled_from(FIELDS))
    def misuse(self, job: int, who: str, kind: str, name: str) -> None:
        """An admin claiming or a worker asking for an admin cancel (403 role_forbidden), or a claim or
        heartbeat with one binding field changed (403 for tenant and principal, else 409
        binding_mismatch); nothing changes and no key is stored."""
        self._count_step()
        key = self._fresh_key()
        if kind == "admin_claims":
            self._exec(Req("claim", "admin", job, key, self._binding("admin", job), instance="adm-1"))
            return
        if kind == "worker_admin_cancels":
            self._exec(Req("cancel_admin", who, job, key, self._binding(who, job), payload="r1"))
            return
        fields = self._binding(who, job).as_dict()
        if name == "job":
            fields["job"] = self.model.jobs[(job + 1) % len(self.model.jobs)].id
        else:
            fields[name] = fields[name] + "x"
        binding = Binding(**fields)
        if kind == "bad_binding_claim":
            self._exec(Req("claim", who, job, key, binding, instance=INSTANCES[who]))
        else:
            self._exec(Req("heartbeat", who, job, key, binding, lease=self._lease(who, job, "own")))

    # ---- idempotency rules -------------------------------------------------------------------

    def _recent(self, i: int) -> Req:
        """One of the last few issued requests (their keys are the likeliest to be stored)."""
        return self.issued[-1 - i % min(len(self.issued), 8)]

    @precondition(lambda self: bool(self.issued))
    @rule(i=st.integers(0, 10**6))
    def replay_same(self, i: int) -> None:
        """Same key, same body: the stored bytes with replayed=True (if the key was stored)."""
        self._count_step()
        self._exec(self._recent(i))

    @precondition(lambda self: bool(self.issued))
    @rule(i=st.integers(0, 10**6))
    def replay_different(self, i: int) -> None:
        """Same key, another body: 422 idempotency_key_reused (if the key was stored)."""
        self._count_step()
        req = self._recent(i)
        if req.op == "claim":
            req = replace(req, instance=(req.instance or "") + "-x")
        elif req.op == "start":
            assert req.lease is not None
            req = replace(req, lease=(req.lease[0], req.lease[1] + 1))
        elif req.op == "heartbeat":
            req = replace(req, payload={"p": 99})
        elif req.op == "complete":
            req = replace(req, payload=req.payload | {"summary": "other"})
        elif req.op == "fail":
            req = replace(req, payload=req.payload | {"message": "other"})
        else:
            req = replace(req, payload=req.payload + "-other")
        self._exec(req)

    @precondition(lambda self: bool(self.finishes))
    @rule(i=st.integers(0, 10**6), same=st.sampled_from([True, True, True, False]))
    def terminal_replay_new_key(self, i: int, same: bool) -> None:
        """A complete, fail or holder cancel that ended a job, re-sent under a NEW key: the stored
        terminal response (lifecycle.md 6.6); with another result: 409 terminal_conflict."""
        self._count_step()
        req = replace(self.finishes[i % len(self.finishes)], key=self._fresh_key())
        if not same:
            req = replace(req, op={"complete": "fail", "fail": "cancel_holder", "cancel_holder": "complete"}[req.op])
            req = replace(req, payload=self._payload_for(req.op))
        self._exec(req)

    @staticmethod
    def _payload_for(op: str) -> Any:
        if op == "complete":
            return {"outputs": {}, "artifacts": [], "summary": "s1"}
        if op == "fail":
            return {"code": "e1", "message": "m", "retryable": False}
        return "r1"

    # ---- time, reaper, restart ---------------------------------------------------------------

    @rule(seconds=advances)
    def advance(self, seconds: int) -> None:
        self._count_step()
        self.clock.advance(seconds)

    @precondition(lambda self: not self.big_jump_done)
    @rule()
    def advance_past_retention(self) -> None:
        """Once per example: jump past the idempotency retention, so every stored key expires."""
        self._count_step()
        self.big_jump_done = True
        self.clock.advance(RETENTION_S + 1)

    @rule(seconds=st.sampled_from([0, 0, 31]))
    def reap(self, seconds: int) -> None:
        """A reaper sweep, sometimes after the clock has passed one TTL (lifecycle.md 5)."""
        self._count_step()
        self.clock.advance(seconds)
        expected = self.model.sweep(self.clock.now_ms(), "lease_expired_by_reaper")
        assert self.engine.expire_due() == expected

    @rule(seconds=st.sampled_from([0, 5, 31]))
    def restart(self, seconds: int) -> None:
        """Stop the hub, optionally let time pass, open a new store and engine, run recovery."""
        self._count_step()
        assert self.store is not None
        self.store.close()
        self.store = None
        self.clock.advance(seconds)
        audit_events = self.reader_one("SELECT count(*) AS n FROM audit_event")["n"]
        self.store = self.open_store()
        self.engine = Engine(self.store, self.clock, self.settings)
        expected = self.model.sweep(self.clock.now_ms(), "lease_expired_on_recovery")
        report = self.engine.recover()
        assert report.expired == expected, (report, expected)
        assert report.dispatched == 0
        assert report.audit_head_seq == audit_events

    @rule(who=st.sampled_from(["a", "b", "admin"]), job=job_indexes)
    def status(self, who: str, job: int) -> None:
        """Status writes nothing and shows lease_id to the lease owner only (lifecycle.md 6.4)."""
        self._count_step()
        actor = ACTORS[who]
        m = self.model.jobs[job]
        data = json.loads(encode(self.engine.status(actor, job_id=m.id, binding=self._binding(who, job))))
        lease = None
        if m.state in LEASED:
            assert m.acquired_at is not None and m.expires_at is not None
            lease = {
                "lease_epoch": m.epoch,
                "owner": {"principal": m.owner, "worker_instance": m.instance},
                "acquired_at": rfc3339(m.acquired_at),
                "expires_at": rfc3339(m.expires_at),
                "last_heartbeat_at": None if m.last_heartbeat_at is None else rfc3339(m.last_heartbeat_at),
            }
            if actor.principal == m.owner:
                lease["lease_id"] = m.lease_id
        terminal = None
        if m.terminal is not None:
            assert m.finished_at is not None
            terminal = {
                "kind": m.terminal.kind,
                "reason_code": m.terminal.reason,
                "result_digest": m.terminal.result_digest,
                "finished_at": rfc3339(m.finished_at),
            }
        shown = m.state if m.state in TERMINAL else None
        assert data == {
            "job": m.id,
            "state": m.state,
            "revision": m.revision,
            "attempt": m.attempt,
            "max_attempts": m.max_attempts,
            "cancel_requested": m.cancel,
            "task_state": shown or "DISPATCHED",
            "dispatch_state": shown or "OPEN",
            "lease": lease,
            "terminal": terminal,
        }

    # ---- invariants --------------------------------------------------------------------------

    def reader_all(self, sql: str, *params: Any) -> list[Any]:
        if self.pg_reader is not None:
            return self.pg_reader.all(sql, *params)
        assert self.reader is not None
        return list(self.reader.execute(sql, params))

    def reader_one(self, sql: str, *params: Any) -> Any:
        rows = self.reader_all(sql, *params)
        assert len(rows) == 1, (sql, len(rows))
        return rows[0]

    @invariant()
    def invariants_hold(self) -> None:
        now = self.clock.now_ms()
        assert self.store is not None
        audit.seal_all(self.store)  # PostgreSQL chains events after commit (scale.md 2.4); every one is checked
        rows = {r["id"]: dict(r) for r in self.reader_all("SELECT * FROM hermes_job")}
        assert len(rows) == len(self.model.jobs)
        terminal_jobs = 0
        for m in self.model.jobs:
            row = rows[m.id]
            self._row_matches_model(row, m)
            # I1: at most one live lease per job; lease columns exist exactly in LEASED and RUNNING
            leased = row["state"] in LEASED
            assert (row["lease_id"] is not None) == leased
            assert (row["lease_owner_principal"] is not None) == leased
            live = self.reader_one(
                "SELECT count(*) AS n FROM hermes_job WHERE id = ? AND lease_id IS NOT NULL AND lease_expires_at > ?",
                m.id,
                now,
            )["n"]
            assert live <= 1
            # I2: the epoch never decreases
            assert row["lease_epoch"] >= self.last_epoch[m.idx]
            self.last_epoch[m.idx] = row["lease_epoch"]
            # I3: a terminal row never changes again
            if row["state"] in TERMINAL:
                terminal_jobs += 1
                snapshot = self.frozen.setdefault(m.id, row)
                assert row == snapshot, f"terminal row of {m.id} changed"
            # I4: one audit event and one evidence row per applied transition, revision = 1 + count
            self._audit_matches_model(m, row)
            # I6: terminal iff Task and Dispatch hold the same kind and a Reconciliation row exists
            self._reconciled_iff_terminal(m, row)
            # I7, I8
            if row["state"] == "QUEUED":
                assert row["cancel_requested"] == 0
            assert row["attempt"] <= row["max_attempts"]
        # I5: the chain verifies; no audit event beyond the applied transitions and reconciliations
        report = self.engine.verify_audit()
        assert report.ok, report.line()
        job_events = sum(len(m.events) for m in self.model.jobs)
        assert report.events == self.task_events + job_events + terminal_jobs, report.line()
        evidence = self.reader_one("SELECT count(*) AS n FROM execution_evidence")["n"]
        assert evidence == job_events
        # a key exists iff its effect exists; stored responses are exactly the first answers
        stored = {
            (r["principal"], r["operation"], r["job_id"], r["key_hash"]): StoredKey(
                r["request_digest"], r["response_status"], bytes(r["response_body"]), r["expires_at"]
            )
            for r in self.reader_all("SELECT * FROM idempotency_key WHERE expires_at > ?", now)
        }
        assert stored == self.model.live_keys(now)

    def _row_matches_model(self, row: dict[str, Any], m: JobModel) -> None:
        t = m.terminal
        expected = {
            "state": m.state,
            "revision": m.revision,
            "attempt": m.attempt,
            "max_attempts": m.max_attempts,
            "max_life_s": m.max_life_s,
            "lease_epoch": m.epoch,
            "lease_id": m.lease_id,
            "lease_owner_principal": m.owner,
            "lease_owner_instance": m.instance,
            "lease_acquired_at": m.acquired_at,
            "lease_expires_at": m.expires_at,
            "started_at": m.started_at,
            "progress": m.progress,
            "cancel_requested": int(m.cancel),
            "cancel_requested_at": m.cancel_at,
            "cancel_requested_by": m.cancel_by,
            "finished_at": m.finished_at,
            "terminal_kind": t.kind if t else None,
            "terminal_reason": t.reason if t else None,
            "terminal_lease_id": t.lease_id if t else None,
            "terminal_epoch": t.epoch if t else None,
            "result_digest": t.result_digest if t else None,
            "terminal_response": t.response if t else None,
        }
        actual = {k: row[k] for k in expected}
        if actual["terminal_response"] is not None:
            actual["terminal_response"] = bytes(actual["terminal_response"])
        assert actual == expected, f"job {m.idx} row differs from the model"
        if m.state in LEASED:
            assert row["last_heartbeat_at"] == m.last_heartbeat_at

    def _audit_matches_model(self, m: JobModel, row: dict[str, Any]) -> None:
        events = self.reader_all(
            "SELECT a.type, a.from_state, a.to_state, a.revision_before, a.revision_after, a.lease_epoch,"
            " a.reason_code, a.event_id, a.job_id FROM audit_event a"
            " WHERE a.job_id = ? AND a.type LIKE 'hermes.job.%' ORDER BY a.seq",
            m.id,
        )
        evidence = self.reader_all("SELECT kind, audit_event_id FROM execution_evidence WHERE job_id = ?", m.id)
        assert len(events) == len(evidence) == len(m.events) == row["revision"]
        kinds = {e["audit_event_id"]: e["kind"] for e in evidence}
        assert len(kinds) == len(evidence)
        got = []
        for e in events:
            assert e["event_id"] in kinds, "an applied transition without its evidence row"
            if e["revision_before"] is not None:
                assert e["revision_after"] == e["revision_before"] + 1
            got.append(
                (
                    e["type"],
                    e["from_state"],
                    e["to_state"],
                    e["revision_before"],
                    e["revision_after"],
                    e["lease_epoch"],
                    e["reason_code"],
                    kinds[e["event_id"]],
                )
            )
        assert got == m.events, f"job {m.idx}: audit trail differs from the model"

    def _reconciled_iff_terminal(self, m: JobModel, row: dict[str, Any]) -> None:
        task = self.reader_one("SELECT state FROM task WHERE id = ?", m.persisted["task"])
        dispatch = self.reader_one("SELECT status, result_digest FROM dispatch WHERE id = ?", m.persisted["dispatch"])
        recon = self.reader_all("SELECT * FROM reconciliation WHERE job_id = ?", m.id)
        result = self.reader_all("SELECT * FROM hermes_result WHERE job_id = ?", m.id)
        reconciled_events = self.reader_one(
            "SELECT count(*) AS n FROM audit_event WHERE type = 'task.reconciled' AND job_id = ?", m.id
        )["n"]
        if row["state"] in TERMINAL:
            assert task["state"] == dispatch["status"] == row["state"]
            assert dispatch["result_digest"] == row["result_digest"]
            assert len(recon) == 1 and len(result) == 1
            assert (recon[0]["terminal_kind"], recon[0]["result_digest"], recon[0]["lease_epoch"]) == (
                row["state"],
                row["result_digest"],
                row["terminal_epoch"],
            )
            assert (result[0]["kind"], result[0]["result_digest"], result[0]["lease_epoch"]) == (
                row["state"],
                row["result_digest"],
                row["terminal_epoch"],
            )
            assert result[0]["lease_id"] == row["terminal_lease_id"]
            assert reconciled_events == 1
        else:
            assert (task["state"], dispatch["status"]) == ("DISPATCHED", "OPEN")
            assert recon == [] and result == [] and reconciled_events == 0


# Paths every run must reach, so that the property cannot pass vacuously (each is hit dozens of
# times in a typical run).
REQUIRED_OUTCOMES = frozenset(
    {
        "claim:ok",
        "start:ok",
        "heartbeat:ok",
        "complete:ok",
        "cancel_admin:ok",
        "terminal_replay",
        "admin_cancel_requested",
        "admin_cancel_repeated",
        "expire:lease_expired",
        "expire:lease_expired_by_reaper",
        "expire:lease_expired_on_recovery",
        "expire:lease_expired_exhausted",
        "expire:lease_expired_cancel_requested",
    }
)
REQUIRED_CODES = frozenset(
    {
        "replayed",
        "idempotency_key_reused",
        "stale_lease",
        "lease_mismatch",
        "lease_expired",
        "invalid_transition",
        "already_leased",
        "terminal_conflict",
        "binding_mismatch",
        "role_forbidden",
    }
)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_lifecycle_state_machine_against_reference_model(backend: str, request: pytest.FixtureRequest) -> None:
    global STEPS_RUN
    STEPS_RUN = 0
    OUTCOMES.clear()
    machine = type(f"LifecycleMachineOn{backend.title()}", (LifecycleMachine,), {})
    if backend == "postgresql":
        machine.postgres = request.getfixturevalue("postgres_server")
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS_PER_EXAMPLE,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    print(f"scenario 26: {STEPS_RUN} steps; outcomes: {dict(sorted(OUTCOMES.items()))}")
    assert STEPS_RUN >= MIN_TOTAL_STEPS, f"only {STEPS_RUN} steps ran"
    missing = REQUIRED_OUTCOMES - set(OUTCOMES)
    missing |= REQUIRED_CODES - {name.split(":", 1)[1] for name in OUTCOMES if ":" in name}
    assert not missing, f"the run never reached {sorted(missing)}"
