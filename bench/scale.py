"""PostgreSQL scaling benchmark (scale.md 7): audited lifecycles by 1, 2 and 4 hub-like processes beside a raw
``SKIP LOCKED`` claim/ack loop on the same server in the same run.

A benchmark script, not a timed test. It starts its own durable PostgreSQL 15 (``testing/postgres_server``) and
checks with ``SHOW`` that ``fsync``, ``synchronous_commit`` and ``full_page_writes`` are on (else it aborts). Then:

- ``raw_pairs_per_s``, ``raw_tx_per_s``: a bare loop on a scratch table, as many processes and threads as the
  4-process lifecycle run: a claim transaction (``FOR UPDATE SKIP LOCKED LIMIT 1``, set running) and an ack
  transaction (a conditional set done and one event insert), psycopg directly;
- ``lifecycle_per_s`` {1, 2, 4}: audited lifecycles (``testing/lifecycles.lifecycle``: five write transactions each,
  as ``bench/lifecycle_bench.py``) by R processes of ``testing/audit_load`` (the engine and its own audit sealer,
  no HTTP), T threads each, on one migrated database per R; the tasks are approved before timing and the
  processes start timing together; the audit chain is verified after each R.

- ``audit_seal_lag_p99_ms``: the worst, over those runs, of a process's p99 time from an event occurring to its seal
  (``audit_seal_lag_p99_ms_by_replicas`` has each run's); every process seals, so from R = 2 the sealers queue on
  the chain's head, which a hub replica's sealer lease avoids;
- ``command``: no-op ``http GET /api/status`` round trips through a real ``talaria runner`` process and the Hermes
  fixture (``testing/command_bench``), p50/p99 ms: ``single_hub`` through one SQLite hub; ``one_replica`` and
  ``cross_replica`` through two in-process replicas of one PostgreSQL database while the runner polls the first,
  sent by the first and by the second in alternating blocks; ``ratio_cross`` = cross-replica p50 / single-hub p50;
  ``fallback_wakes`` counts waits the fallback query ended instead of a notification (target 0).

``scaling_2`` and ``scaling_4`` are ``lifecycle_per_s`` at R over at 1; they are judged (targets 1.8 and 3.2) only
with at least 2 x R + 2 cores, else ``scaling_judged`` is false: on a 2-core machine several processes share the
cores with the server, and the figures say how the work divides, not how it would scale. The two replicas of the
command figures share this process (and its GIL) with the driver, as the single hub does.

Progress goes to standard error; the last line of standard output is one JSON object. The exit status is 0 whether
or not the targets are met, 1 when the run itself fails (a lifecycle error, a chain that does not verify, a server
that is not durable).

    .venv/bin/python bench/scale.py [--seconds S] [--threads T] [--raw-seconds S] [--commands N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from talaria.clock import SystemClock
from talaria.lifecycle.audit import verify
from talaria.logs import configure_logging
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.open import open_store
from talaria.store.postgres import admin
from talaria.testing.command_bench import FixtureProcess, RunnerProcess, percentile, round_trip_ms
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer

REPLICAS = (1, 2, 4)
TARGETS = {"scaling_2": 1.8, "scaling_4": 3.2}
LIFECYCLE_SHARE_OF_RAW = 0.4  # lifecycle_per_s[4] >= 0.4 x raw_tx_per_s / 5
WRITE_TX_PER_LIFECYCLE = 5
DURABILITY = ("fsync", "synchronous_commit", "full_page_writes")
RAW_JOBS = 200_000
COMMAND_TARGETS = {"ratio_cross": 3.0, "cross_replica_p99_ms": 50.0, "fallback_wakes": 0}
COMMAND_WARM_UP = 20
COMMAND_BLOCK = 50  # round trips from one replica, then as many from the other


class BenchFailure(Exception):
    """The run itself went wrong (not a slow figure): exit 1."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# The raw loop (a child process: --raw-child URL THREADS SECONDS)
# ---------------------------------------------------------------------------------------------------

RAW_SCHEMA = """
CREATE TABLE bench_job (id bigint PRIMARY KEY, state text NOT NULL, payload text NOT NULL);
CREATE INDEX bench_job_queued ON bench_job (id) WHERE state = 'queued';
CREATE TABLE bench_event (id bigserial PRIMARY KEY, job_id bigint NOT NULL, at bigint NOT NULL);
"""
CLAIM = """
UPDATE bench_job SET state = 'running' WHERE id = (
    SELECT id FROM bench_job WHERE state = 'queued' ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1
) RETURNING id
"""
ACK = "UPDATE bench_job SET state = 'done' WHERE id = %s AND state = 'running'"
EVENT = "INSERT INTO bench_event (job_id, at) VALUES (%s, %s)"


def raw_child(url: str, threads: int, seconds: float) -> int:
    """Claim and ack pairs on ``threads`` connections for ``seconds`` after a line on stdin; prints the count."""
    conns = [psycopg.connect(url, autocommit=True) for _ in range(threads)]
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + seconds
    pairs = [0] * threads
    errors: list[str] = []

    def work(index: int) -> None:
        conn = conns[index]
        try:
            while time.monotonic() < deadline:
                with conn.transaction():
                    row = conn.execute(CLAIM).fetchone()
                if row is None:
                    return
                with conn.transaction():
                    if conn.execute(ACK, (row[0],)).rowcount != 1:
                        raise BenchFailure(f"job {row[0]} was acked twice")
                    conn.execute(EVENT, (row[0], time.time_ns()))
                pairs[index] += 1
        except Exception as exc:  # reported: the parent fails the run
            errors.append(f"{type(exc).__name__}: {exc}")

    started = time.monotonic()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    for conn in conns:
        conn.close()
    print(json.dumps({"pairs": sum(pairs), "seconds": round(elapsed, 3), "errors": errors}), flush=True)
    return 1 if errors else 0


# ---------------------------------------------------------------------------------------------------
# Children started together
# ---------------------------------------------------------------------------------------------------


def together(commands: list[list[str]], timeout: float) -> list[dict[str, Any]]:
    """Start every command, wait for each to print ``ready``, release them at once, collect their last JSON line."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        for command in commands
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            if line != "ready":
                raise BenchFailure(f"a child did not get ready: {line!r}")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        results = []
        for child in children:
            out, _ = child.communicate(timeout=timeout)
            lines = out.strip().splitlines()
            if child.returncode != 0 or not lines:
                raise BenchFailure(f"a child failed ({child.returncode}): {out.strip()[-500:]}")
            results.append(json.loads(lines[-1]))
        return results
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def raw_figures(server: PostgresServer, processes: int, threads: int, seconds: float) -> dict[str, float]:
    name = "bench_raw"
    admin.create_database(server.url(), name)
    url = server.url(name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_SCHEMA)
        conn.execute(
            "INSERT INTO bench_job SELECT g, 'queued', repeat('x', 200) FROM generate_series(1, %s) g", (RAW_JOBS,)
        )
        conn.execute("VACUUM ANALYZE bench_job")
    command = [sys.executable, __file__, "--raw-child", url, str(threads), str(seconds)]
    log(f"raw: {processes} processes x {threads} threads, {seconds:g} s")
    results = together([command] * processes, timeout=seconds + 120)
    pairs = sum(r["pairs"] for r in results)
    elapsed = max(r["seconds"] for r in results)
    if pairs >= RAW_JOBS:
        raise BenchFailure("the raw loop ran out of queued jobs; shorten --raw-seconds")
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM bench_event").fetchone()
    if row is None or row[0] != pairs:
        raise BenchFailure(f"raw loop: {pairs} acks counted, {row} events stored")
    return {"raw_pairs_per_s": round(pairs / elapsed, 1), "raw_tx_per_s": round(2 * pairs / elapsed, 1)}


def migrated_database(server: PostgresServer, parent: Path, name: str) -> str:
    admin.create_database(server.url(), name)
    url = server.url(name)
    store = open_store(Settings(data_dir=parent / name, database_url=url), application_name="talaria/bench")
    try:
        migrations.upgrade(store)
    finally:
        store.close()
    return url


def lifecycle_figure(
    server: PostgresServer, parent: Path, replicas: int, threads: int, seconds: float
) -> tuple[float, int | None]:
    """Lifecycles per second by ``replicas`` processes, and the worst of their seal-lag p99s (ms)."""
    name = f"bench_lifecycle_{replicas}"
    url = migrated_database(server, parent, name)
    settings = Settings(data_dir=parent / name, database_url=url)
    # more than a thread finishes in the time: 15-35 a second on the 2-core machines measured so far, so 100 a
    # second leaves room for a faster one (preparing happens before the barrier, outside the measured time)
    prepare = max(200, int(seconds * 100))
    command = [sys.executable, "-m", "talaria.testing.audit_load", "--url", url, "--threads", str(threads),
               "--seconds", str(seconds), "--prepare", str(prepare), "--barrier"]  # fmt: skip
    log(f"lifecycle: {replicas} processes x {threads} threads, {seconds:g} s ({prepare} tasks each prepared)")
    commands = [[*command, "--data-dir", str(parent / f"{name}_{i}")] for i in range(replicas)]
    results = together(commands, timeout=seconds + 600)
    jobs = sum(int(r["jobs"]) for r in results)
    elapsed = max(float(r["seconds"]) for r in results)
    if any(int(r["jobs"]) >= prepare * threads for r in results):
        raise BenchFailure("a process ran out of prepared tasks; the figure would be cut short")
    store = open_store(settings, application_name="talaria/bench")
    try:
        verdict = verify(store)
    finally:
        store.close()
    if not verdict.ok:
        raise BenchFailure(f"after {replicas} processes: {verdict.line()}")
    lags = [int(r["seal_lag_p99_ms"]) for r in results if r.get("seal_lag_p99_ms") is not None]
    log(f"lifecycle: {replicas} processes: {jobs} lifecycles in {elapsed:.1f} s; audit chain OK")
    return round(jobs / elapsed, 1), max(lags) if lags else None


def fallback_wakes(*hubs: HubServer) -> float:
    """Waits the fallback query ended on these hubs, every channel (``talaria_wake_fallback_total``)."""
    return sum(sample.value for hub in hubs for metric in hub.hub.metrics.wake_fallback.collect()
               for sample in metric.samples if sample.name.endswith("_total"))  # fmt: skip


def timings(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(samples, 50), 3), "p99_ms": round(percentile(samples, 99), 3)}


def command_figures(server: PostgresServer, parent: Path, n: int) -> dict[str, Any]:
    fixture = FixtureProcess()
    try:
        single = HubServer(parent / "single_hub", SystemClock()).start()
        try:
            runner = RunnerProcess(single, parent / "single_node", fixture, source="single")
            try:
                for _ in range(COMMAND_WARM_UP):
                    round_trip_ms(single, runner.runner_id)
                alone = [round_trip_ms(single, runner.runner_id) for _ in range(n)]
            finally:
                runner.stop()
        finally:
            single.stop()
        log(f"command: single hub p50 {percentile(alone, 50):.2f} ms")
        url = migrated_database(server, parent, "bench_command")
        hubs = [HubServer(parent / f"replica_{name}", SystemClock(), database_url=url) for name in "ab"]
        try:
            a, b = (hub.start() for hub in hubs)
            runner = RunnerProcess(a, parent / "replica_node", fixture, source="replicas")  # its polls are a's
            try:
                for _ in range(COMMAND_WARM_UP):
                    round_trip_ms(a, runner.runner_id)
                    round_trip_ms(b, runner.runner_id)
                before = fallback_wakes(a, b)
                one: list[float] = []
                cross: list[float] = []
                while len(one) < n:
                    block = min(COMMAND_BLOCK, n - len(one))
                    one += [round_trip_ms(a, runner.runner_id) for _ in range(block)]
                    cross += [round_trip_ms(b, runner.runner_id) for _ in range(block)]
                    log(f"command: {len(one)}/{n} round trips from the poll's replica and from the other")
                woken = fallback_wakes(a, b) - before
            finally:
                runner.stop()
        finally:
            for hub in reversed(hubs):  # stopping one never started does nothing
                hub.stop()
    finally:
        fixture.stop()
    figures = {"single_hub": timings(alone), "one_replica": timings(one), "cross_replica": timings(cross)}
    ratio = round(figures["cross_replica"]["p50_ms"] / figures["single_hub"]["p50_ms"], 2)
    return {**figures, "ratio_cross": ratio, "fallback_wakes": int(woken), "round_trips": n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds per lifecycle run")
    parser.add_argument("--raw-seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=2, help="threads per process")
    parser.add_argument("--commands", type=int, default=500, help="command round trips per figure")
    parser.add_argument("--raw-child", nargs=3, metavar=("URL", "THREADS", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.raw_child:
        url, threads, seconds = args.raw_child
        return raw_child(url, int(threads), float(seconds))
    cores = os.cpu_count() or 1
    configure_logging("WARNING")
    server = PostgresServer.create(durable=True)
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            shown = {name: conn.execute(f"SHOW {name}").fetchone() for name in DURABILITY}
        settings = {name: row[0] if row else None for name, row in shown.items()}
        if any(value != "on" for value in settings.values()):
            raise BenchFailure(f"the server is not durable: {settings}")
        log(f"postgres {version[0] if version else '?'} on {cores} cores; {settings}")
        with tempfile.TemporaryDirectory(prefix="talaria-scale-") as tmp:
            raw = raw_figures(server, max(REPLICAS), args.threads, args.raw_seconds)
            log(f"raw: {raw}")
            runs = {str(r): lifecycle_figure(server, Path(tmp), r, args.threads, args.seconds) for r in REPLICAS}
            command = command_figures(server, Path(tmp), args.commands)
            log(f"command: {command}")
    except BenchFailure as exc:
        log(f"scale benchmark failed: {exc}")
        return 1
    finally:
        server.stop()
    per_s = {r: figure for r, (figure, _) in runs.items()}
    lags = {r: lag for r, (_, lag) in runs.items()}
    scaling = {f"scaling_{r}": round(per_s[str(r)] / per_s["1"], 2) for r in REPLICAS if r > 1}
    judged = cores >= 2 * max(REPLICAS) + 2
    share = per_s[str(max(REPLICAS))] / (raw["raw_tx_per_s"] / WRITE_TX_PER_LIFECYCLE)
    targets = {
        "scaling_2": TARGETS["scaling_2"],
        "scaling_4": TARGETS["scaling_4"],
        "lifecycle_share_of_raw": LIFECYCLE_SHARE_OF_RAW,
        **COMMAND_TARGETS,
    }
    meets = (
        share >= LIFECYCLE_SHARE_OF_RAW
        and (not judged or all(scaling[name] >= TARGETS[name] for name in TARGETS))
        and command["ratio_cross"] <= COMMAND_TARGETS["ratio_cross"]
        and command["cross_replica"]["p99_ms"] <= COMMAND_TARGETS["cross_replica_p99_ms"]
        and command["fallback_wakes"] == COMMAND_TARGETS["fallback_wakes"]
    )
    result = {
        "postgres_version": version[0] if version else None,
        "settings": settings,
        "cores": cores,
        "threads_per_process": args.threads,
        **raw,
        "lifecycle_per_s": per_s,
        **scaling,
        "scaling_judged": judged,
        "lifecycle_share_of_raw": round(share, 3),
        "audit_seal_lag_p99_ms": max((lag for lag in lags.values() if lag is not None), default=None),
        "audit_seal_lag_p99_ms_by_replicas": lags,
        "command": command,
        "targets": targets,
        "meets_target": meets,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
