"""Lifecycle benchmark (lifecycle.md section 12): raw SQLite commits against full engine lifecycles.

A benchmark script, not a timed test. In one run and one temporary directory, on SQLite with WAL and
``synchronous=FULL``, it measures

- ``raw_tx_per_s``: single-connection commits of a 4-statement transaction (``BEGIN IMMEDIATE``;
  conditional job UPDATE; INSERT audit; INSERT evidence; INSERT idempotency key; ``COMMIT``) on a
  scratch file, with the standard-library ``sqlite3`` module directly;
- ``lifecycle_per_s``: full lifecycles through the engine (dispatch of a task approved before timing,
  claim, start, one heartbeat, complete with reconcile; every step with audit, evidence and an
  idempotency key, as the Runtime API would store it): five write transactions per lifecycle.

Progress goes to standard error; the last line of standard output is one JSON object with the
figures. ``meets_target`` is informational: the exit status is 0 either way, and 1 only when the
run itself fails (an engine error, or an audit chain that does not verify).

    .venv/bin/python bench/lifecycle_bench.py [--jobs N] [--raw-tx N] [--dir PARENT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from talaria.canonical import digest, sha256_hex
from talaria.clock import SystemClock
from talaria.errors import TalariaError
from talaria.ids import trace_id
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.binding import Binding, persisted_binding
from talaria.lifecycle.context import IdemRequest, OpResult
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.sqlite import SQLiteStore

WRITE_TX_PER_LIFECYCLE = 5
TARGET_FRACTION = 0.5
DEFAULT_JOBS = 2000
DEFAULT_RAW_TX = 5000

TENANT = "default"
AUTHOR = Actor("acct:default/alice", frozenset(), "web", TENANT)
ADMIN = Actor("acct:default/bob", frozenset({"platform_admin"}), "web", TENANT)
WORKER = Actor("worker-1", frozenset({"runtime"}), "in_process", TENANT)
WORKER_INSTANCE = "w1"
CELL, PROFILE = "local", "default"

_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}

# ---------------------------------------------------------------------------------------------------
# Raw transactions on a scratch file
# ---------------------------------------------------------------------------------------------------

# Tables shaped like hermes_job, audit_event, execution_evidence and idempotency_key, with the same
# keys and secondary indexes, so each INSERT maintains as many b-trees as the real one does.
RAW_SCHEMA = """
CREATE TABLE job (
    id                TEXT PRIMARY KEY,
    state             TEXT NOT NULL,
    revision          INTEGER NOT NULL,
    lease_epoch       INTEGER NOT NULL,
    lease_expires_at  INTEGER,
    progress          TEXT
);
CREATE INDEX job_due ON job(state, lease_expires_at);
CREATE TABLE audit (
    seq          INTEGER PRIMARY KEY,
    event_id     TEXT NOT NULL UNIQUE,
    occurred_at  INTEGER NOT NULL,
    type         TEXT NOT NULL,
    job_id       TEXT,
    body         TEXT NOT NULL,
    prev_hash    TEXT NOT NULL,
    hash         TEXT NOT NULL
);
CREATE INDEX audit_by_job ON audit(job_id, seq);
CREATE TABLE evidence (
    evidence_id     TEXT PRIMARY KEY,
    job_id          TEXT NOT NULL,
    kind            TEXT NOT NULL,
    payload         TEXT NOT NULL,
    content_digest  TEXT NOT NULL,
    recorded_at     INTEGER NOT NULL,
    audit_event_id  TEXT NOT NULL UNIQUE
);
CREATE INDEX evidence_by_job ON evidence(job_id);
CREATE TABLE idempotency (
    principal        TEXT NOT NULL,
    operation        TEXT NOT NULL,
    job_id           TEXT NOT NULL,
    key_hash         TEXT NOT NULL,
    request_digest   TEXT NOT NULL,
    response_status  INTEGER NOT NULL,
    response_body    BLOB NOT NULL,
    created_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    PRIMARY KEY (principal, operation, job_id, key_hash)
);
CREATE INDEX idempotency_expiry ON idempotency(expires_at);
"""

RAW_UPDATE = (
    "UPDATE job SET state = ?, revision = ?, lease_expires_at = ?, progress = ? WHERE id = ? AND revision = ?"
)
RAW_AUDIT = (
    "INSERT INTO audit (seq, event_id, occurred_at, type, job_id, body, prev_hash, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
RAW_EVIDENCE = (
    "INSERT INTO evidence (evidence_id, job_id, kind, payload, content_digest, recorded_at, audit_event_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
RAW_IDEMPOTENCY = (
    "INSERT INTO idempotency (principal, operation, job_id, key_hash, request_digest, response_status, "
    "response_body, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# Payloads about the size of the engine's: an audit body of ~900 bytes, evidence ~100, a response ~250.
RAW_AUDIT_BODY = json.dumps({"binding": {"field": "x" * 60}, "pad": "y" * 700})
RAW_EVIDENCE_PAYLOAD = json.dumps({"lease_epoch": 1, "progress": {"step": 1}, "pad": "z" * 60})
RAW_RESPONSE = json.dumps({"job": "job_x", "state": "RUNNING", "pad": "r" * 200}).encode()
RAW_STATES = ("LEASED", "RUNNING", "RUNNING", "SUCCEEDED", "QUEUED")


class BenchFailure(Exception):
    """The run itself went wrong (not a slow figure): exit 1."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def every(total: int) -> int:
    """Report progress about ten times per phase."""
    return max(1, total // 10)


def open_scratch(path: Path) -> sqlite3.Connection:
    """One connection configured like ``SQLiteStore``: WAL, synchronous=FULL, explicit transactions."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    if sys.platform == "darwin":
        conn.execute("PRAGMA fullfsync=ON")
    return conn


def pragmas(conn: sqlite3.Connection) -> tuple[str, str]:
    mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    level = int(conn.execute("PRAGMA synchronous").fetchone()[0])
    return mode, _SYNCHRONOUS.get(level, str(level))


def measure_raw(path: Path, count: int) -> tuple[float, str, str]:
    """Commits per second of the 4-statement transaction; also the connection's journal mode and sync."""
    conn = open_scratch(path)
    try:
        mode, sync = pragmas(conn)
        conn.executescript(RAW_SCHEMA)
        # One job row per WRITE_TX_PER_LIFECYCLE transactions, each updated at its current revision.
        rows = -(-count // WRITE_TX_PER_LIFECYCLE)
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO job (id, state, revision, lease_epoch) VALUES (?, 'QUEUED', 1, 0)",
            ((f"job_{r:020d}",) for r in range(rows)),
        )
        conn.execute("COMMIT")
        prev_hash = "0" * 64
        step = every(count)
        started = time.perf_counter()
        for i in range(count):
            job_id = f"job_{i // WRITE_TX_PER_LIFECYCLE:020d}"
            revision = i % WRITE_TX_PER_LIFECYCLE + 1
            now = time.time_ns() // 1_000_000
            event_id = f"evt_{i:022d}"
            digest_hex = hashlib.sha256(f"{prev_hash}\n{i}".encode()).hexdigest()
            conn.execute("BEGIN IMMEDIATE")
            changed = conn.execute(
                RAW_UPDATE,
                (RAW_STATES[i % len(RAW_STATES)], revision + 1, now + 30_000, '{"step":1}', job_id, revision),
            ).rowcount
            if changed != 1:
                conn.execute("ROLLBACK")
                raise BenchFailure(f"raw: the conditional UPDATE of {job_id} matched {changed} rows")
            conn.execute(
                RAW_AUDIT,
                (i + 1, event_id, now, "hermes.job.x", job_id, RAW_AUDIT_BODY, prev_hash, digest_hex),
            )
            conn.execute(
                RAW_EVIDENCE,
                (f"evd_{i:022d}", job_id, "heartbeat", RAW_EVIDENCE_PAYLOAD, digest_hex, now, event_id),
            )
            conn.execute(
                RAW_IDEMPOTENCY,
                ("worker-1", "op", job_id, digest_hex, digest_hex, 200, RAW_RESPONSE, now, now + 86_400_000),
            )
            conn.execute("COMMIT")
            prev_hash = digest_hex
            if (i + 1) % step == 0:
                elapsed = time.perf_counter() - started
                log(f"raw: {i + 1}/{count} transactions, {(i + 1) / elapsed:.0f} tx/s")
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    return count / elapsed, mode, sync


# ---------------------------------------------------------------------------------------------------
# Full lifecycles through the engine
# ---------------------------------------------------------------------------------------------------


def idem(key: str, body: dict[str, Any]) -> IdemRequest:
    """What the Runtime API derives from a request: the key's SHA-256 and the parsed body's digest."""
    return IdemRequest(sha256_hex(key), digest(body))


def expect(result: OpResult, state: str, what: str) -> dict[str, Any]:
    data = result.data
    if result.status != 200 or result.replayed or data.get("state") != state:
        raise BenchFailure(f"{what}: expected a fresh 200 in {state}, got {result.status} {data}")
    return data


def prepare_tasks(eng: Engine, count: int) -> list[str]:
    """Create, submit and approve ``count`` tasks (untimed); returns their ids."""
    ids: list[str] = []
    step = every(count)
    for i in range(count):
        task = eng.create_task(
            AUTHOR,
            tenant=TENANT,
            title=f"bench task {i}",
            spec={"prompt": "hi"},
            cell=CELL,
            profile=PROFILE,
            trace=trace_id(),
        )
        eng.submit_task(AUTHOR, tenant=TENANT, task_id=task["id"])
        eng.approve_task(ADMIN, tenant=TENANT, task_id=task["id"])
        ids.append(task["id"])
        if (i + 1) % step == 0:
            log(f"prepare: {i + 1}/{count} tasks approved")
    return ids


def lifecycle(eng: Engine, task_id: str) -> None:
    """One job from enqueue to SUCCEEDED: dispatch, claim, start, heartbeat, complete (5 write tx)."""
    _task, dispatch, job = eng.dispatch(ADMIN, tenant=TENANT, task_id=task_id)
    job_id: str = job["id"]
    binding: Binding = persisted_binding(dispatch, WORKER.principal)
    bound = binding.as_dict()

    body: dict[str, Any] = {"binding": bound, "worker_instance": WORKER_INSTANCE}
    claimed = eng.claim(
        WORKER,
        job_id=job_id,
        binding=binding,
        worker_instance=WORKER_INSTANCE,
        idem=idem(f"bench:{job_id}:claim", body),
    )
    lease = expect(claimed, "LEASED", "claim")["lease"]
    lease_id, epoch = lease["lease_id"], lease["lease_epoch"]
    held = {"binding": bound, "lease_id": lease_id, "lease_epoch": epoch}

    started = eng.start(
        WORKER,
        job_id=job_id,
        binding=binding,
        lease_id=lease_id,
        lease_epoch=epoch,
        idem=idem(f"bench:{job_id}:start", held),
    )
    expect(started, "RUNNING", "start")

    progress = {"step": 1}
    beat = eng.heartbeat(
        WORKER,
        job_id=job_id,
        binding=binding,
        lease_id=lease_id,
        lease_epoch=epoch,
        progress=progress,
        idem=idem(f"bench:{job_id}:heartbeat", held | {"progress": progress}),
    )
    expect(beat, "RUNNING", "heartbeat")

    result = {"outputs": {}, "artifacts": [], "summary": "ok"}
    done = eng.complete(
        WORKER,
        job_id=job_id,
        binding=binding,
        lease_id=lease_id,
        lease_epoch=epoch,
        result=result,
        idem=idem(f"bench:{job_id}:complete", held | {"result": result}),
    )
    if expect(done, "SUCCEEDED", "complete").get("task_state") != "SUCCEEDED":
        raise BenchFailure(f"complete: the task of {job_id} was not reconciled to SUCCEEDED")


def timed(label: str, items: list[str], fn: Callable[[str], None]) -> float:
    """Run ``fn`` on every item; returns items per second."""
    step = every(len(items))
    started = time.perf_counter()
    for i, item in enumerate(items):
        fn(item)
        if (i + 1) % step == 0:
            elapsed = time.perf_counter() - started
            log(f"{label}: {i + 1}/{len(items)}, {(i + 1) / elapsed:.0f}/s")
    return len(items) / (time.perf_counter() - started)


def engine_pragmas(store: SQLiteStore) -> tuple[str, str]:
    """The writer connection's journal mode and synchronous level (the figure means nothing otherwise)."""
    return pragmas(store._writer)


def measure_lifecycles(data_dir: Path, count: int) -> tuple[float, str, str]:
    store = SQLiteStore(data_dir / "talaria.sqlite3")
    try:
        migrations.upgrade(store)
        clock = SystemClock()
        eng = Engine(store, clock, Settings(data_dir=data_dir))
        with store.write() as tx:
            tx.run("tenant_ensure", name=TENANT, now=clock.now_ms())
        mode, sync = engine_pragmas(store)
        task_ids = prepare_tasks(eng, count)
        try:
            rate = timed("lifecycle", task_ids, lambda task_id: lifecycle(eng, task_id))
        except TalariaError as exc:
            raise BenchFailure(f"the engine refused a lifecycle step: {exc.code}: {exc}") from exc
        log("verifying the audit chain ...")
        report = eng.verify_audit()
        log(report.line())
        if not report.ok:
            raise BenchFailure(report.line())
        # Per job: task.created, submitted, approved (untimed); task.dispatched, hermes.job.enqueued,
        # claimed, started, heartbeat, succeeded, task.reconciled (timed).
        expected_events = count * (3 + 7)
        if report.events != expected_events:
            raise BenchFailure(f"expected {expected_events} audit events, found {report.events}")
    finally:
        store.close()
    return rate, mode, sync


# ---------------------------------------------------------------------------------------------------


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Lifecycle benchmark (lifecycle.md 12): raw SQLite commits vs. full engine lifecycles. "
        "Progress on stderr; the last line of stdout is a JSON object.",
    )
    parser.add_argument(
        "--jobs", type=positive, default=DEFAULT_JOBS, help=f"lifecycles to time (default {DEFAULT_JOBS})"
    )
    parser.add_argument(
        "--raw-tx",
        type=positive,
        default=DEFAULT_RAW_TX,
        help=f"raw 4-statement transactions to time (default {DEFAULT_RAW_TX})",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="parent of the temporary directory (default: the system temp dir); "
        "put it on the disk you mean to measure, not on a tmpfs",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="talaria-bench-", dir=args.dir) as tmp:
        data_dir = Path(tmp)
        log(f"bench: SQLite {sqlite3.sqlite_version} in {data_dir}")
        try:
            raw_rate, raw_mode, raw_sync = measure_raw(data_dir / "raw-scratch.sqlite3", args.raw_tx)
            life_rate, eng_mode, eng_sync = measure_lifecycles(data_dir, args.jobs)
        except BenchFailure as exc:
            log(f"bench FAILED: {exc}")
            return 1
    if (raw_mode, raw_sync) != (eng_mode, eng_sync):
        log(f"bench FAILED: raw ran {raw_mode}/{raw_sync} but the engine {eng_mode}/{eng_sync}")
        return 1
    target = TARGET_FRACTION * raw_rate / WRITE_TX_PER_LIFECYCLE
    figures = {
        "sqlite_version": sqlite3.sqlite_version,
        "journal_mode": raw_mode,
        "synchronous": raw_sync,
        "jobs": args.jobs,
        "raw_tx_per_s": round(raw_rate, 1),
        "lifecycle_per_s": round(life_rate, 1),
        "write_tx_per_lifecycle": WRITE_TX_PER_LIFECYCLE,
        "target_lifecycle_per_s": round(target, 1),
        "meets_target": life_rate >= target,
    }
    log(
        f"bench: {life_rate:.1f} lifecycles/s against a target of {target:.1f}/s "
        f"({life_rate / target:.2f}x; raw {raw_rate:.1f} tx/s)"
    )
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
