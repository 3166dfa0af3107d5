"""Lifecycle benchmark (lifecycle.md section 12): raw SQLite commits against full engine lifecycles.

A benchmark script, not a timed test. In one run and one temporary directory, on SQLite with WAL and
``synchronous=FULL``, it measures

- ``raw_tx_per_s``: single-connection commits of a 4-statement transaction (``BEGIN IMMEDIATE``;
  conditional job UPDATE; INSERT audit; INSERT evidence; INSERT idempotency key; ``COMMIT``) on a
  scratch file, with the standard-library ``sqlite3`` module directly;
- ``lifecycle_per_s``: full lifecycles through the engine (dispatch of a task approved before timing,
  claim, start, one heartbeat, complete with reconcile; every step with audit, evidence and an
  idempotency key, as the Runtime API would store it): five write transactions per lifecycle.

The two are timed in alternating slices (``ROUNDS``) on two files of the same directory, so that
drifting fsync latency affects both alike; the tasks are created and approved before any timing, and
the audit chain is verified after it.

Progress goes to standard error; the last line of standard output is one JSON object with the
figures. ``meets_target`` is informational: the exit status is 0 either way, and 1 only when the
run itself fails (an engine error, or an audit chain that does not verify).

``--http`` adds ``http_lifecycle_per_s``: the same lifecycle with claim, start, heartbeat and complete
sent as signed requests to the Runtime API of a real hub (``python -m talaria hub`` in a child process
on 127.0.0.1, its own data directory); the dispatch stays an in-process engine call, as the Runtime
API has no dispatch route. In the same run it times ``echo_p50_ms``: a round trip of the same client
(httpx, the same signed headers and an ``Idempotency-Key``, a body of a claim's size) to a bare uvicorn
app in another child process that reads the body and answers a JSON object of a claim answer's size,
four such round trips after each HTTP lifecycle. Then
``http_overhead_ratio`` = HTTP lifecycle time / (in-process lifecycle time + 4 x ``echo_p50_ms``):
how much the Runtime API door adds beyond the engine and four bare round trips (target <= 1.5).

    .venv/bin/python bench/lifecycle_bench.py [--jobs N] [--raw-tx N] [--http] [--dir PARENT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import secrets
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from talaria.clock import SystemClock
from talaria.errors import TalariaError
from talaria.lifecycle.engine import Engine
from talaria.logs import configure_logging
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.sqlite import SQLiteStore
from talaria.testing.lifecycles import (
    ADMIN,
    TENANT,
    WORKER,
    WORKER_INSTANCE,
    LifecycleFailure,
    lifecycle,
    prepare_tasks,
)

if TYPE_CHECKING:
    import httpx

    from talaria.testing.runtime_client import RuntimeClient

WRITE_TX_PER_LIFECYCLE = 5
TARGET_FRACTION = 0.5
HTTP_RATIO_TARGET = 1.5
ECHOES_PER_LIFECYCLE = 4
DEFAULT_JOBS = 2000
DEFAULT_RAW_TX = 5000
HUB_START_TIMEOUT_S = 60.0
# Raw transactions and lifecycles are timed in this many alternating slices, so that a disk whose
# fsync latency drifts during the run (a shared VM, a busy laptop) slows both figures alike and the
# ratio stays meaningful. The figures are totals over all slices.
ROUNDS = 10

_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


BenchFailure = LifecycleFailure  # the run itself went wrong (not a slow figure): exit 1


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def every(total: int) -> int:
    """Report progress about ten times per phase."""
    return max(1, total // 10)


def progress(count: int) -> Callable[[int], None]:
    step = every(count)

    def hear(done: int) -> None:
        if done % step == 0:
            log(f"prepare: {done}/{count} tasks approved")

    return hear


# ---------------------------------------------------------------------------------------------------
# Raw transactions on a scratch file
# ---------------------------------------------------------------------------------------------------

# Tables shaped like hermes_job, audit_event, execution_evidence and idempotency_key, with similar
# keys and secondary indexes, so each statement maintains about as many b-trees as the real one does.
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

RAW_UPDATE = "UPDATE job SET state = ?, revision = ?, lease_expires_at = ?, progress = ? WHERE id = ? AND revision = ?"
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
# Payloads about the size of the engine's: an audit body of ~1 KB, evidence ~130 bytes (payload and
# producer), a stored response ~210 bytes.
RAW_AUDIT_BODY = json.dumps({"binding": {"field": "x" * 60}, "pad": "y" * 950})
RAW_EVIDENCE_PAYLOAD = json.dumps({"lease_epoch": 1, "progress": {"step": 1}, "pad": "z" * 80})
RAW_RESPONSE = json.dumps({"job": "job_x", "state": "RUNNING", "pad": "r" * 160}).encode()
RAW_STATES = ("LEASED", "RUNNING", "RUNNING", "SUCCEEDED", "QUEUED")


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


class RawBench:
    """The 4-statement transaction on its own connection, run in slices (see ``measure``)."""

    def __init__(self, path: Path, total: int) -> None:
        self.conn = open_scratch(path)
        self.mode, self.sync = pragmas(self.conn)
        self.conn.executescript(RAW_SCHEMA)
        # One job row per WRITE_TX_PER_LIFECYCLE transactions, each updated at its current revision.
        rows = -(-total // WRITE_TX_PER_LIFECYCLE)
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(
            "INSERT INTO job (id, state, revision, lease_epoch) VALUES (?, 'QUEUED', 1, 0)",
            ((f"job_{r:020d}",) for r in range(rows)),
        )
        self.conn.execute("COMMIT")
        self.prev_hash = "0" * 64
        self.done = 0
        self.elapsed = 0.0

    @property
    def rate(self) -> float:
        return self.done / self.elapsed if self.elapsed else 0.0

    def run(self, count: int) -> None:
        """Commit the next ``count`` transactions, adding their wall time to ``elapsed``."""
        conn = self.conn
        started = time.perf_counter()
        for i in range(self.done, self.done + count):
            job_id = f"job_{i // WRITE_TX_PER_LIFECYCLE:020d}"
            revision = i % WRITE_TX_PER_LIFECYCLE + 1
            now = time.time_ns() // 1_000_000
            event_id = f"evt_{i:022d}"
            digest_hex = hashlib.sha256(f"{self.prev_hash}\n{i}".encode()).hexdigest()
            conn.execute("BEGIN IMMEDIATE")
            changed = conn.execute(
                RAW_UPDATE,
                (RAW_STATES[i % len(RAW_STATES)], revision + 1, now + 30_000, '{"step":1}', job_id, revision),
            ).rowcount
            if changed != 1:
                conn.execute("ROLLBACK")
                raise BenchFailure(f"raw: the conditional UPDATE of {job_id} matched {changed} rows")
            conn.execute(
                RAW_AUDIT, (i + 1, event_id, now, "hermes.job.x", job_id, RAW_AUDIT_BODY, self.prev_hash, digest_hex)
            )
            conn.execute(
                RAW_EVIDENCE, (f"evd_{i:022d}", job_id, "heartbeat", RAW_EVIDENCE_PAYLOAD, digest_hex, now, event_id)
            )
            conn.execute(
                RAW_IDEMPOTENCY,
                ("worker-1", "op", job_id, digest_hex, digest_hex, 200, RAW_RESPONSE, now, now + 86_400_000),
            )
            conn.execute("COMMIT")
            self.prev_hash = digest_hex
        self.elapsed += time.perf_counter() - started
        self.done += count

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------------------------------------------
# Full lifecycles through the engine
# ---------------------------------------------------------------------------------------------------


def engine_pragmas(store: SQLiteStore) -> tuple[str, str]:
    """The writer connection's journal mode and synchronous level (the figure means nothing otherwise)."""
    return pragmas(store._writer)


def verify_chain(eng: Engine, count: int) -> None:
    """The whole audit chain must verify and hold exactly the events of ``count`` lifecycles."""
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


def slices(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` sizes that differ by at most one."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


@dataclass(frozen=True)
class Figures:
    raw_tx_per_s: float
    lifecycle_per_s: float
    journal_mode: str
    synchronous: str


def measure(data_dir: Path, jobs: int, raw_tx: int) -> Figures:
    """Both figures, timed in alternating slices so that both see the same disk (see ROUNDS)."""
    raw = RawBench(data_dir / "raw-scratch.sqlite3", raw_tx)
    store = SQLiteStore(data_dir / "talaria.sqlite3")
    try:
        migrations.upgrade(store)
        clock = SystemClock()
        eng = Engine(store, clock, Settings(data_dir=data_dir))
        with store.write() as tx:
            tx.run("tenant_ensure", name=TENANT, now=clock.now_ms())
        mode, sync = engine_pragmas(store)
        if (mode, sync) != (raw.mode, raw.sync):
            raise BenchFailure(f"raw runs {raw.mode}/{raw.sync} but the engine {mode}/{sync}")
        task_ids = prepare_tasks(eng, jobs, progress(jobs))
        rounds = min(ROUNDS, jobs, raw_tx)
        done, elapsed = 0, 0.0
        for number, (raw_count, life_count) in enumerate(
            zip(slices(raw_tx, rounds), slices(jobs, rounds), strict=True)
        ):
            raw.run(raw_count)
            started = time.perf_counter()
            for task_id in task_ids[done : done + life_count]:
                lifecycle(eng, task_id)
            elapsed += time.perf_counter() - started
            done += life_count
            log(
                f"round {number + 1}/{rounds}: raw {raw.done}/{raw_tx} tx, {raw.rate:.0f} tx/s; "
                f"lifecycles {done}/{jobs}, {done / elapsed:.0f}/s"
            )
        verify_chain(eng, jobs)
    finally:
        store.close()
        raw.close()
    return Figures(raw.rate, jobs / elapsed, mode, sync)


# ---------------------------------------------------------------------------------------------------
# The same lifecycle through the Runtime API of a hub in a child process (--http)
# ---------------------------------------------------------------------------------------------------


@contextmanager
def hub_process(data_dir: Path, secret: str) -> Iterator[str]:
    """Run ``python -m talaria hub`` on 127.0.0.1 with the Runtime API on; yields its base URL."""
    env = dict(os.environ)
    env.update(
        {
            "TALARIA_RUNTIME_API_ENABLED": "true",
            "TALARIA_RUNTIME_API_PROXY_SECRET": secret,
            "TALARIA_LOG_LEVEL": "WARNING",
        }
    )
    command = [sys.executable, "-m", "talaria", "hub", "--data-dir", str(data_dir), "--host", "127.0.0.1"]
    proc = subprocess.Popen([*command, "--port", "0"], stdout=subprocess.PIPE, env=env, text=True, encoding="utf-8")
    try:
        yield wait_ready(proc)
    finally:
        stop_process(proc)


def wait_ready(proc: subprocess.Popen[str]) -> str:
    """The URL from the hub's ready line (``talaria hub listening on <url>``)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, name="hub-stdout", daemon=True).start()
    deadline = time.monotonic() + HUB_START_TIMEOUT_S
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise BenchFailure(f"the hub did not start within {HUB_START_TIMEOUT_S:.0f} s") from None
        if not line:
            raise BenchFailure(f"the hub exited during start-up (status {proc.wait()})")
        if "listening on " in line:
            return line.rsplit("listening on ", 1)[1].strip()


def stop_process(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def http_expect(response: httpx.Response, state: str, what: str) -> dict[str, Any]:
    if response.status_code != 200 or "idempotent-replayed" in response.headers:
        raise BenchFailure(f"{what}: expected a fresh 200, got {response.status_code} {response.text}")
    data: dict[str, Any] = response.json()
    if data.get("state") != state:
        raise BenchFailure(f"{what}: expected {state}, got {data}")
    return data


def http_lifecycle(eng: Engine, client: RuntimeClient, task_id: str) -> None:
    """Dispatch in process, then claim, start, heartbeat and complete as signed Runtime API requests."""
    _task, dispatch, job = eng.dispatch(ADMIN, tenant=TENANT, task_id=task_id)
    job_id = job.id
    bound = dispatch.binding(WORKER.principal).as_dict()

    claim = {"binding": bound, "worker_instance": WORKER_INSTANCE}
    lease = http_expect(client.post(job_id, "claim", claim, key=f"bench:{job_id}:claim"), "LEASED", "claim")["lease"]
    held = {"binding": bound, "lease_id": lease["lease_id"], "lease_epoch": lease["lease_epoch"]}
    http_expect(client.post(job_id, "start", held, key=f"bench:{job_id}:start"), "RUNNING", "start")
    beat = held | {"progress": {"step": 1}}
    http_expect(client.post(job_id, "heartbeat", beat, key=f"bench:{job_id}:heartbeat"), "RUNNING", "heartbeat")
    done = held | {"result": {"outputs": {}, "artifacts": [], "summary": "ok"}}
    finished = http_expect(
        client.post(job_id, "complete", done, key=f"bench:{job_id}:complete"), "SUCCEEDED", "complete"
    )
    if finished.get("task_state") != "SUCCEEDED":
        raise BenchFailure(f"complete: the task of {job_id} was not reconciled to SUCCEEDED")


# A bare ASGI app for the echo floor: it reads the request body and answers a JSON object the size of a
# claim's answer, on a socket made like the hub's (``IPPROTO_TCP``, so asyncio turns Nagle's algorithm
# off, as for the hub), with the headers the hub's answers carry.
ECHO_APP = """
import socket, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    body = b'{"job":"job_x","pad":"' + b"p" * 300 + b'"}'
    headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json"),
               (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False)).run(sockets=[sock])
"""


@contextmanager
def echo_server() -> Iterator[str]:
    """The echo floor's uvicorn app in a child process; yields its base URL."""
    code = textwrap.dedent(ECHO_APP)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, encoding="utf-8")
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + HUB_START_TIMEOUT_S
        while True:  # the port is printed before uvicorn listens on it
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchFailure("the echo app did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


@dataclass(frozen=True)
class HttpFigures:
    lifecycle_per_s: float
    echo_p50_ms: float


def measure_http(data_dir: Path, count: int) -> HttpFigures:
    import httpx

    from talaria.testing.runtime_client import RuntimeClient

    data_dir.mkdir()
    secret = secrets.token_hex(32)  # a throw-away proxy secret shared with the child hub only
    with hub_process(data_dir, secret) as url, echo_server() as echo_url:
        log(f"http: hub listening on {url}, echo app on {echo_url}")
        # The hub has migrated the database and run start-up recovery; tasks approved from now on
        # stay undispatched until the timed loop dispatches them.
        store = SQLiteStore(data_dir / "talaria.sqlite3")
        client = RuntimeClient(url, secret, principal=WORKER.principal, roles="runtime", tenant=TENANT)
        echo = httpx.Client(base_url=echo_url, timeout=10.0)
        echoes: list[float] = []

        def echo_once() -> None:
            """One round trip shaped like a Runtime API call: a body of a claim's size, signed like one by
            the same client code, with an Idempotency-Key (the floor is the HTTP stack, not the door)."""
            target = "/internal/runtime/v1/hermes/jobs/job_x/claim"
            raw = json.dumps({"binding": {"job": "job_" + "x" * 26, "pad": "p" * 560}, "worker_instance": "w1"})
            headers = client.headers("POST", target, raw.encode())
            headers |= {"Content-Type": "application/json", "Idempotency-Key": secrets.token_hex(16)}
            echo.post(target, content=raw, headers=headers)

        try:
            eng = Engine(store, SystemClock(), Settings(data_dir=data_dir))
            task_ids = prepare_tasks(eng, count, progress(count))
            for _ in range(50):  # warm the echo connection and app
                echo_once()
            step = every(count)
            elapsed = 0.0
            try:
                for i, task_id in enumerate(task_ids):
                    started = time.perf_counter()
                    http_lifecycle(eng, client, task_id)
                    elapsed += time.perf_counter() - started
                    for _ in range(ECHOES_PER_LIFECYCLE):  # the floor, timed between lifecycles
                        sent = time.perf_counter()
                        echo_once()
                        echoes.append((time.perf_counter() - sent) * 1000)
                    if (i + 1) % step == 0:
                        log(f"http: {i + 1}/{count} lifecycles, {(i + 1) / elapsed:.0f}/s")
            except httpx.HTTPError as exc:
                raise BenchFailure(f"the Runtime API request failed: {exc!r}") from exc
            rate = count / elapsed
        finally:
            echo.close()
            client.close()
            store.close()
    store = SQLiteStore(data_dir / "talaria.sqlite3")
    try:
        verify_chain(Engine(store, SystemClock(), Settings(data_dir=data_dir)), count)
    finally:
        store.close()
    return HttpFigures(rate, statistics.median(echoes))


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
        "--http",
        action="store_true",
        help="also time the lifecycle through the Runtime API of a hub in a child process",
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
    configure_logging("WARNING")  # logs on stderr only; standard output carries the JSON object
    http: HttpFigures | None = None
    with tempfile.TemporaryDirectory(prefix="talaria-bench-", dir=args.dir) as tmp:
        data_dir = Path(tmp)
        log(f"bench: SQLite {sqlite3.sqlite_version} in {data_dir}")
        try:
            figures = measure(data_dir, args.jobs, args.raw_tx)
            if args.http:
                http = measure_http(data_dir / "http", args.jobs)
        except BenchFailure as exc:
            log(f"bench FAILED: {exc}")
            return 1
        except TalariaError as exc:
            log(f"bench FAILED: the engine refused a step: {exc.code}: {exc.message}")
            return 1
    raw_rate, life_rate = figures.raw_tx_per_s, figures.lifecycle_per_s
    target = TARGET_FRACTION * raw_rate / WRITE_TX_PER_LIFECYCLE
    out: dict[str, Any] = {
        "sqlite_version": sqlite3.sqlite_version,
        "journal_mode": figures.journal_mode,
        "synchronous": figures.synchronous,
        "jobs": args.jobs,
        "raw_tx_per_s": round(raw_rate, 1),
        "lifecycle_per_s": round(life_rate, 1),
        "write_tx_per_lifecycle": WRITE_TX_PER_LIFECYCLE,
        "target_lifecycle_per_s": round(target, 1),
        "meets_target": life_rate >= target,
    }
    if http is not None:
        # HTTP lifecycle time / (in-process lifecycle time + 4 echo round trips), all from this run
        floor_s = 1 / life_rate + ECHOES_PER_LIFECYCLE * http.echo_p50_ms / 1000
        ratio = (1 / http.lifecycle_per_s) / floor_s
        out["http_lifecycle_per_s"] = round(http.lifecycle_per_s, 1)
        out["echo_p50_ms"] = round(http.echo_p50_ms, 3)
        out["http_overhead_ratio"] = round(ratio, 2)
        out["meets_http_target"] = ratio <= HTTP_RATIO_TARGET
        log(
            f"bench: HTTP lifecycle {1000 / http.lifecycle_per_s:.2f} ms against {1000 / life_rate:.2f} ms in process "
            f"+ 4 x {http.echo_p50_ms:.3f} ms echo: ratio {ratio:.2f} (target <= {HTTP_RATIO_TARGET})"
        )
    log(
        f"bench: {life_rate:.1f} lifecycles/s against a target of {target:.1f}/s "
        f"({life_rate / target:.2f}x; raw {raw_rate:.1f} tx/s)"
    )
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
