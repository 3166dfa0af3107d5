"""Jobs benchmark (dispatcher issue): what running a Hermes turn as a durable job costs.

In one run, against a real ``hermes serve`` (hermes-agent 0.19.0 from ``.venv-hermes``) with the scripted
model, it prints as progress on stderr and one JSON object as the last line of stdout:

- ``direct``: short turns driven directly on Hermes over ``/api/ws`` (a fresh session per turn, as the
  dispatcher opens one per job): p50/p99 seconds from ``session.create`` to ``message.complete``;
- ``jobs``: the same turns as approved tasks, one at a time, through the hub, the dispatcher and one
  runner: p50/p99 end-to-end job time (enqueued to finished) and ``ratio_p50`` = job p50 / direct p50
  (target ≤ 1.3);
- ``burst``: N jobs approved at once: jobs per second (first enqueue to last finish) and p50/p99
  queue-to-start latency (enqueued to started).

    .venv/bin/python bench/jobs.py [--turns 8] [--burst 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from talaria.clock import SystemClock
from talaria.hermes.ws import HermesChannel
from talaria.hub.runners.registry import parse_registration
from talaria.logs import configure_logging
from talaria.testing.hub_server import HubServer
from talaria.testing.model_server import ModelServer
from talaria.testing.real_hermes import RealHermes

TARGET_RATIO = 1.3
PASSWORD = secrets.token_urlsafe(16)


def progress(text: str) -> None:
    print(f"[jobs] {text}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def direct_turns(hermes: RealHermes, n: int) -> list[float]:
    samples: list[float] = []
    complete: asyncio.Queue[str] = asyncio.Queue()

    def on_event(params: dict[str, Any]) -> None:
        if params.get("type") == "message.complete":
            complete.put_nowait(str(params.get("session_id")))

    channel = await HermesChannel.connect(hermes.url, ("token", hermes.session_token), on_event=on_event,
                                          on_lost=lambda: None)  # fmt: skip
    try:
        for index in range(n):
            started = time.perf_counter()
            created = await channel.request("session.create", {"close_on_disconnect": True})
            runtime_id = created["session_id"]
            await channel.request("prompt.submit", {"session_id": runtime_id, "text": f"direct turn {index}"})
            while await asyncio.wait_for(complete.get(), 120) != runtime_id:
                pass
            samples.append(time.perf_counter() - started)
            await channel.request("session.close", {"session_id": runtime_id})
            progress(f"direct turn {index + 1}/{n}: {samples[-1]:.2f} s")
    finally:
        await channel.close()
    return samples


def approve(alice: httpx.Client, root: httpx.Client, prompt: str) -> str:
    body = {"title": "bench", "prompt": prompt, "cell": "local", "profile": "default"}
    task = alice.post("/api/tasks", json=body).json()["task"]
    alice.post(f"/api/tasks/{task['id']}/submit").raise_for_status()
    answer = root.post(f"/api/tasks/{task['id']}/approve")
    answer.raise_for_status()
    return str(answer.json()["job"]["id"])


def wait_done(root: httpx.Client, job_ids: list[str], timeout: float = 600) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        jobs = {j: root.get(f"/api/jobs/{j}").json()["job"] for j in job_ids}
        if all(job["terminal"] is not None for job in jobs.values()):
            failed = [job for job in jobs.values() if job["state"] != "SUCCEEDED"]
            if failed:
                raise SystemExit(f"a benchmark job did not succeed: {failed[0]['result']}")
            return jobs
        if time.monotonic() > deadline:
            raise SystemExit("benchmark jobs did not finish in time")
        time.sleep(0.05)


def end_to_end_s(job: dict[str, Any]) -> float:
    return float(job["terminal"]["finishedAt"] - job["enqueuedAt"]) / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8, help="sequential turns, direct and as jobs")
    parser.add_argument("--burst", type=int, default=12, help="jobs approved at once")
    args = parser.parse_args()
    configure_logging("WARNING")
    with tempfile.TemporaryDirectory(prefix="talaria-jobs-") as tmp, ModelServer() as model:
        work = Path(tmp)
        hermes = RealHermes(work / "hermes", model.base_url).start()
        server = HubServer(work / "data", SystemClock()).start()
        runner: subprocess.Popen[str] | None = None
        try:
            progress(f"hermes serve at {hermes.url}; hub at {server.url}")
            direct = asyncio.run(direct_turns(hermes, args.turns))
            server.hub.accounts.create(username="alice", password=PASSWORD, role="user",
                                       allowed_profiles={"local": ["default"]})  # fmt: skip
            server.hub.accounts.create(username="root", password=PASSWORD, role="admin", allowed_profiles={})
            fields = parse_registration({"name": "bench", "allowedProfiles": ["default"], "hermesURL": hermes.url},
                                        default_server_url=server.url)  # fmt: skip
            registration = server.hub.registry.register("default", fields)
            node = work / "node"
            node.mkdir()
            token_file = node / "hermes-token"
            token_file.write_text(hermes.session_token)
            token_file.chmod(0o600)
            config = node / "runner.json"
            config.write_text(json.dumps(registration.config | {"hermesTokenFile": str(token_file)}))
            config.chmod(0o600)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TALARIA_", "HERMES_"))}
            runner = subprocess.Popen(
                [sys.executable, "-m", "talaria", "runner", "--config", str(config)],
                stderr=subprocess.PIPE, text=True, env=env,
            )  # fmt: skip
            assert runner.stderr is not None
            if "runner connected" not in runner.stderr.readline():
                raise SystemExit("the runner did not connect")
            clients = []
            for username in ("alice", "root"):
                client = httpx.Client(base_url=server.url, headers={"Origin": server.url}, timeout=30)
                login = client.post("/api/auth/login", json={"username": username, "password": PASSWORD})
                login.raise_for_status()
                client.headers["X-CSRF-Token"] = login.json()["csrfToken"]
                clients.append(client)
            alice, root = clients
            sequential = []
            for index in range(args.turns):
                job_id = approve(alice, root, f"job turn {index}")
                sequential.append(end_to_end_s(wait_done(root, [job_id])[job_id]))
                progress(f"job {index + 1}/{args.turns}: {sequential[-1]:.2f} s end to end")
            progress(f"burst of {args.burst} jobs")
            ids = [approve(alice, root, f"burst job {index}") for index in range(args.burst)]
            jobs = wait_done(root, ids)
            first = min(job["enqueuedAt"] for job in jobs.values())
            last = max(job["terminal"]["finishedAt"] for job in jobs.values())
            waits = [(job["startedAt"] - job["enqueuedAt"]) / 1000 for job in jobs.values()]
            for client in clients:
                client.close()
        finally:
            if runner is not None:
                runner.send_signal(signal.SIGTERM)
                runner.wait(20)
            server.stop()
            hermes.stop()
    ratio = round(statistics.median(sequential) / statistics.median(direct), 2)
    summary = {
        "direct": {"p50_s": round(percentile(direct, 50), 3), "p99_s": round(percentile(direct, 99), 3)},
        "jobs": {"p50_s": round(percentile(sequential, 50), 3), "p99_s": round(percentile(sequential, 99), 3)},
        "ratio_p50": ratio,
        "burst": {
            "jobs": args.burst,
            "per_s": round(args.burst / max(0.001, (last - first) / 1000), 3),
            "queue_to_start_p50_s": round(percentile(waits, 50), 3),
            "queue_to_start_p99_s": round(percentile(waits, 99), 3),
        },
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
