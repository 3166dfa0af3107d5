"""One process of audited lifecycles on a shared PostgreSQL database, with its own audit sealer (scale.md 6,
scenario 11; ``bench/scale.py``): ``--threads`` engine threads each prepare a task and run its lifecycle until
``--seconds`` have passed (a lifecycle under way is finished), then the sealer stops, sealing what is left.

    python -m talaria.testing.audit_load --url postgresql://... --data-dir DIR [--threads 4] [--seconds 30]
        [--prepare N --barrier]

With ``--prepare N`` each thread creates and approves N tasks first (untimed) and then only runs lifecycles, at most
one per prepared task; with ``--barrier`` the process prints ``ready`` once prepared and starts timing when a line
arrives on its standard input, so that a benchmark starts several processes together.

The last stdout line is one JSON object: ``jobs`` (lifecycles finished), ``seconds`` (timed, from the start to the
last thread's end), ``sealed`` (events this process's sealer chained), ``seal_lag_p99_ms`` (the p99 time from
occurring to seal of the events it sealed that occurred once timing started; null when none) and ``errors`` (one
line each; a lifecycle answering wrongly or the store failing ends its thread).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from talaria.clock import SystemClock
from talaria.lifecycle.audit_sealer import AuditSealer
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store.open import open_store
from talaria.testing.lifecycles import TENANT, lifecycle, prepare_tasks

LAGS_KEPT = 200_000  # enough for every event a process seals in a benchmark's run


def run(
    url: str, data_dir: Path, threads: int, seconds: float, seal_interval_ms: int, *, prepare: int = 0,
    barrier: bool = False,
) -> dict[str, object]:  # fmt: skip
    settings = Settings(data_dir=data_dir, database_url=url, database_pool_max=threads + 2)
    store = open_store(settings, application_name="talaria/audit-load")
    clock = SystemClock()
    engine = Engine(store, clock, settings)
    with store.write() as tx:
        tx.run("tenant_ensure", name=TENANT, now=clock.now_ms())
    sealer = AuditSealer(store, seal_interval_ms, lags_kept=LAGS_KEPT)
    sealer.watch()
    sealer.start()
    prepared = [prepare_tasks(engine, prepare) for _ in range(threads)] if prepare else [[] for _ in range(threads)]
    if barrier:
        print("ready", flush=True)
        sys.stdin.readline()
    started, started_ms = time.monotonic(), clock.now_ms()
    deadline = started + seconds
    done = [0] * threads
    errors: list[str] = []

    def work(index: int) -> None:
        tasks = iter(prepared[index])
        try:
            while time.monotonic() < deadline:
                task_id = next(tasks, None) if prepare else prepare_tasks(engine, 1)[0]
                if task_id is None:
                    return
                lifecycle(engine, task_id)
                done[index] += 1
        except Exception as exc:  # reported, and the test fails on it
            errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=(i,), name=f"load-{i}") for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    sealer.stop()
    store.close()
    lags = sorted(lag for at, lag in sealer.lags_ms if at >= started_ms)  # not the backlog of the preparing
    lag_p99 = lags[min(len(lags) - 1, round(0.99 * (len(lags) - 1)))] if lags else None
    return {"jobs": sum(done), "seconds": round(elapsed, 3), "sealed": sealer.sealed, "seal_lag_p99_ms": lag_p99,
            "errors": errors}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seal-interval-ms", type=int, default=200)
    parser.add_argument("--prepare", type=int, default=0, help="tasks per thread approved before timing")
    parser.add_argument("--barrier", action="store_true", help="print ready, then wait for a line on stdin")
    args = parser.parse_args(argv)
    result = run(args.url, args.data_dir, args.threads, args.seconds, args.seal_interval_ms, prepare=args.prepare,
                 barrier=args.barrier)  # fmt: skip
    print(json.dumps(result), flush=True)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
