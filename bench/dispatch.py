"""Dispatch benchmark (execution-node issue): what a runner command costs, and what idle runners cost.

In one run it prints, as progress on stderr and one JSON object as the last line of stdout:

- ``echo``: the bare floor, sequential httpx requests to a uvicorn echo app on 127.0.0.1 (p50/p99 ms);
- ``command``: round trips of a no-op ``http GET /api/status`` command from the hub through one real runner
  process (``talaria runner``) to the Hermes fixture and back (p50/p99 ms, commands/s), timed on the
  hub's event loop from enqueue to the runner's result, and ``ratio_p50`` = command p50 / echo p50.
  Echo requests and commands run in alternating blocks of 100, so drift moves both alike;
- ``idle``: for 100 and 1,000 runners long-polling one hub at once from one load process, the hub
  process's RSS and the p99 wake latency from enqueue to the command's arrival at the runner.

The hub runs in this process (a thread), so its RSS includes this driver; the echo server, the Hermes
fixture, the runner and the load generator are separate processes.

    .venv/bin/python bench/dispatch.py [--commands N] [--runners 100,1000]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

from talaria.clock import SystemClock
from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.runners.registry import RunnerRegistry, parse_registration
from talaria.logs import configure_logging
from talaria.testing.command_bench import FixtureProcess, RunnerProcess, percentile, round_trip_ms
from talaria.testing.hub_server import HubServer

BLOCK = 100  # requests per alternating block of echo requests and command round trips
TARGETS = {"ratio_p50": 4.5, "command_p99_ms": 25.0, "wake_p99_ms": 100.0, "rss_mb": 300.0}


def progress(text: str) -> None:
    print(f"[dispatch] {text}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE, text=True)


ECHO = """
import socket, sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"ok":true}'})
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False)).run(sockets=[sock])
"""


class Echo:
    """The bare floor: sequential httpx requests to a uvicorn echo app in its own process."""

    def __init__(self) -> None:
        self.server = spawn(ECHO)
        assert self.server.stdout is not None
        port = int(self.server.stdout.readline())
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
        for _ in range(50):
            self.client.get("/")

    def once(self) -> float:
        started = time.perf_counter()
        self.client.get("/")
        return (time.perf_counter() - started) * 1000

    def close(self) -> None:
        self.client.close()
        self.server.send_signal(signal.SIGINT)
        self.server.wait(10)


def register(server: HubServer, count: int, source_prefix: str) -> list[tuple[str, str, dict[str, Any]]]:
    registry: RunnerRegistry = server.hub.registry
    made = []
    for index in range(count):
        body = {"name": f"bench {index}", "source": f"{source_prefix}{index}", "allowedProfiles": ["default"]}
        registration = registry.register("default", parse_registration(body, default_server_url=server.url))
        made.append((registration.runner.id, registration.token, registration.config))
    return made


def bench_command(server: HubServer, workdir: Path, n: int, echo: Echo) -> tuple[dict[str, float], dict[str, float]]:
    """Command round trips and echo requests in alternating blocks of back-to-back requests: each is
    timed hot, as in steady use, and drift over the run (frequency scaling, neighbours) moves the
    baseline and the figure together."""
    fixture = FixtureProcess()
    try:
        runner = RunnerProcess(server, workdir / "node", fixture, source="cmd0")
    except BaseException:
        fixture.stop()
        raise
    try:
        created = server.hub.accounts.create(
            username="bench", password=secrets.token_urlsafe(16), role="user", allowed_profiles={"cmd0": ["default"]}
        )
        account = AccountRef(created.username, created.tenant, created.auth_version)

        def one() -> float:
            return round_trip_ms(server, runner.runner_id, account)

        for _ in range(20):
            one()
        samples: list[float] = []
        floor: list[float] = []
        busy = 0.0
        while len(samples) < n:
            block = min(BLOCK, n - len(samples))
            floor += [echo.once() for _ in range(block)]
            started = time.perf_counter()
            samples += [one() for _ in range(block)]
            busy += time.perf_counter() - started
            progress(f"command round trips: {len(samples)}/{n}")
    finally:
        runner.stop()
        fixture.stop()
    command = {
        "p50_ms": round(percentile(samples, 50), 3),
        "p99_ms": round(percentile(samples, 99), 3),
        "per_s": round(n / busy, 1),
    }
    return command, {"p50_ms": round(percentile(floor, 50), 3), "p99_ms": round(percentile(floor, 99), 3)}


def bench_idle(server: HubServer, count: int, wakes: int) -> dict[str, float]:
    made = register(server, count, f"idle{count}-")
    load = subprocess.Popen(
        [sys.executable, "-m", "talaria.testing.runner_load", server.url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert load.stdin is not None and load.stdout is not None
    load.stdin.write(json.dumps([[r, t] for r, t, _ in made]) + "\n")
    load.stdin.flush()
    for _ in range(count):
        load.stdout.readline()
    progress(f"{count} runners connected; hub RSS {rss_mb(os.getpid()):.0f} MB")

    async def holding() -> int:
        states = server.hub.runners.states
        return sum(1 for r, _, _ in made if (s := states.get(r)) is not None and s.waiter and not s.waiter.done())

    deadline = time.monotonic() + 120
    while (held := server.call(holding())) < count:  # time wakes only once every runner holds a poll
        if time.monotonic() > deadline:
            raise SystemExit(f"only {held} of {count} runners hold a poll after 120 s")
        time.sleep(0.2)
    progress(f"{count} runners hold a poll")
    rss = rss_mb(os.getpid())
    sent: dict[str, int] = {}
    step = max(1, count // wakes)
    for index in range(wakes):
        runner_id = made[(index * step) % count][0]
        marker = f"?bench={index}"

        async def wake(rid: str = runner_id, m: str = marker) -> None:
            sent[m] = time.time_ns()
            await server.hub.runners.send(
                rid, "http", {"path": "/api/status", "method": "GET", "search": m},
                account=None, profile=None, valid=True,
            )  # fmt: skip

        server.call(wake())
    load.stdin.write(f"report {wakes}\n")
    load.stdin.flush()
    arrivals = json.loads(load.stdout.readline())
    load.stdin.close()
    load.wait(30)
    latencies = [(arrivals[m] - sent[m]) / 1e6 for m in sent if m in arrivals]
    return {"runners": count, "rss_mb": round(rss, 1), "wake_p99_ms": round(percentile(latencies, 99), 3),
            "wake_p50_ms": round(statistics.median(latencies), 3)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commands", type=int, default=1000, help="command round trips to time")
    parser.add_argument("--runners", default="100,1000", help="idle runner counts, comma-separated")
    parser.add_argument("--wakes", type=int, default=200, help="wake-ups to time per idle count")
    args = parser.parse_args()
    configure_logging("WARNING")
    with tempfile.TemporaryDirectory(prefix="talaria-dispatch-") as tmp:
        workdir = Path(tmp)
        echo_server = Echo()
        server = HubServer(workdir / "data", SystemClock(), runtime_api_proxy_secret=secrets.token_hex(32)).start()
        try:
            progress("command round trips through one runner, each followed by one echo request (the floor)")
            try:
                command, echo = bench_command(server, workdir, args.commands, echo_server)
            finally:
                echo_server.close()
            idle = []
            for count in (int(c) for c in args.runners.split(",") if c):
                progress(f"{count} idle runners")
                idle.append(bench_idle(server, count, min(args.wakes, count)))
        finally:
            server.stop()
    ratio = round(command["p50_ms"] / echo["p50_ms"], 2)
    summary = {
        "echo": echo,
        "command": command,
        "ratio_p50": ratio,
        "idle": idle,
        "targets": TARGETS,
        "meets_targets": ratio <= TARGETS["ratio_p50"]
        and command["p99_ms"] <= TARGETS["command_p99_ms"]
        and all(i["wake_p99_ms"] <= TARGETS["wake_p99_ms"] and i["rss_mb"] <= TARGETS["rss_mb"] for i in idle),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
