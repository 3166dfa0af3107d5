"""Runner command round trips for the benchmarks (``bench/dispatch.py``, ``bench/scale.py``): the Hermes fixture in
its own process, a real ``talaria runner`` process registered on a hub, and no-op ``http GET /api/status`` round
trips timed on the sending hub's event loop, from enqueue to the runner's result.

The sender need not be the hub the runner polls: on PostgreSQL any replica sends (scale.md 3.3), and ``bench/scale.py``
times both. The runner's standard error goes to a file beside its runner.json, so a chatty runner never blocks on a
full pipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.runners.registry import parse_registration
from talaria.testing.hub_server import HubServer

NO_OP = {"path": "/api/status", "method": "GET", "search": ""}
CONNECT_S = 60.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class FixtureProcess:
    """``python -m talaria.testing.fixture_process``: the Hermes fixture outside the measuring process."""

    def __init__(self) -> None:
        command = [sys.executable, "-m", "talaria.testing.fixture_process"]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)  # noqa: S603 - our own module
        assert self.proc.stdout is not None
        self.url, self.session_token = self.proc.stdout.readline().split()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


class RunnerProcess:
    """A runner registered on ``server`` (``source`` tells registrations apart), polling ``server_url`` (default the
    hub's own), started and waited for until it prints ``runner connected``."""

    def __init__(
        self, server: HubServer, directory: Path, hermes: FixtureProcess, *, source: str, server_url: str | None = None
    ) -> None:
        body = {"name": f"bench {source}", "source": source, "allowedProfiles": ["default"],
                "hermesURL": hermes.url}  # fmt: skip
        registration = server.hub.registry.register("default", parse_registration(body, default_server_url=server.url))
        self.runner_id = registration.runner.id
        config = registration.config | ({"serverURL": server_url} if server_url else {})
        directory.mkdir(parents=True)
        path = directory / "runner.json"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        self.log = directory / "runner.stderr"
        env = dict(os.environ, HERMES_DASHBOARD_SESSION_TOKEN=hermes.session_token)
        command = [sys.executable, "-m", "talaria", "runner", "--config", str(path)]
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)  # noqa: S603 - our CLI
        deadline = time.monotonic() + CONNECT_S
        while "runner connected" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the benchmark's runner did not connect: {self.log.read_text()[-500:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


def round_trip_ms(sender: HubServer, runner_id: str, account: AccountRef | None = None) -> float:
    """One no-op command sent through ``sender``, timed on its event loop: enqueue to the runner's result."""

    async def one() -> float:
        started = time.perf_counter()
        await sender.hub.runners.send(runner_id, "http", dict(NO_OP), account=account, profile=None,
                                      valid=True if account is None else None)  # fmt: skip
        return (time.perf_counter() - started) * 1000

    elapsed: float = sender.call(one())
    return elapsed
