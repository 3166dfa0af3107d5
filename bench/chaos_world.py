"""The processes of ``bench/chaos.py``: a ``talaria hub`` process on SQLite, or two replicas of one PostgreSQL
database (``--postgres``; scale.md), each killed with SIGKILL and started again on the same port and data directory;
``talaria runner`` processes (the same); a Hermes fixture per runner in this process (whose request logs are the
evidence of what ran), or, with ``--real-hermes``, the first runner in front of a real ``hermes serve`` (hermes-agent
0.19.0) whose model is the scripted model server in this process (its request log is then the evidence); and the
fault proxy between the runners and the hub. With replicas, the fault proxy is also
the runners' balancer, and the users reach the replicas through a second balancer that injects nothing.

Every process's standard error is appended to a log file in the work directory, across restarts; peak RSS
(``VmHWM``) is sampled while a process lives and read once more before it is stopped or killed.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from talaria.testing.fault_proxy import FaultProxy
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.model_server import ModelServer, Rule, demo_team_rules, from_prompt
from talaria.testing.postgres_server import PostgresServer
from talaria.testing.real_hermes import RealHermes

PASSWORD = secrets.token_urlsafe(18)
PROXY_SECRET = secrets.token_urlsafe(40)
READY_PREFIX = "talaria hub listening on "
START_S = 60.0

# The hub's lifecycle timings for the run: shorter leases than the defaults, so that the stale-lease writer's
# lease expires in seconds (operations documented in docs/reliability.md).
HUB_SETTINGS = {
    "TALARIA_RUNTIME_API_ENABLED": "true",
    "TALARIA_LIFECYCLE_LEASE_TTL_S": "8",
    "TALARIA_LIFECYCLE_HEARTBEAT_INTERVAL_S": "2",
    "TALARIA_LIFECYCLE_REAPER_INTERVAL_S": "1",
}


# A team goal in real Hermes (the demo's, team-tools.md 13's S1 in small): the lead forms a team and assigns a draft,
# the member writes it as a job, the review wake accepts it and finishes the goal. Every name and request id is the
# goal's own (from its prompt, or an id Talaria put in the review prompt), so goals never collide.
GOAL_TEXT = ("Write the launch note with your team. r1={g}-1 r2={g}-2 r3={g}-3 r4={g}-4 writer=Writer-{g} "
             "crew=Crew-{g}")  # fmt: skip
_REVIEW_IDS = {5: r"assignment (asg_\S+) review", 6: r"goalId: (\S+)"}  # the review's request ids: Talaria's ids
# One attempt per model call: Hermes would send a failed call again (3 attempts by default), and a request sent again
# cannot be told from a prompt run twice in the model server's log. The scripted model fails a call only on purpose
# (a tool result a later call needs is missing after a fault): that run then fails, as a user would see it.
HERMES_CONFIG = "agent:\n  api_max_retries: 1\n"


def goal_rules() -> list[Rule]:
    return demo_team_rules(
        request_id=lambda n: from_prompt(_REVIEW_IDS.get(n, rf"r{n}=(\S+)")),
        writer=from_prompt(r"writer=(\S+)"),
        crew=from_prompt(r"crew=(\S+)"),
        lead=r"^Write the launch note with your team\.",
    )


def progress(text: str) -> None:
    print(f"[chaos] {text}", file=sys.stderr, flush=True)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALARIA_", "HERMES_"))}
    return env | extra


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def peak_rss_kib(pid: int) -> int:
    """``VmHWM`` of a live process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def talaria(*args: str, cwd: Path, env: dict[str, str], stdin: str = "") -> str:
    done = subprocess.run(
        [sys.executable, "-m", "talaria", *args], input=stdin, capture_output=True, text=True, cwd=cwd,
        env=clean_env(**env), timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"talaria {args[0]} {args[1]} failed: {done.stderr.strip()[-400:]}")
    return done.stdout


@dataclass
class Managed:
    """A child process started again and again; ``peak_kib`` is the largest ``VmHWM`` of any of its lives."""

    name: str
    log: Path
    proc: subprocess.Popen[str] | None = None
    peak_kib: int = 0
    starts: int = 0

    def sample(self) -> None:
        proc = self.proc  # read once: another thread may set it to None
        if proc is not None and proc.poll() is None:
            self.peak_kib = max(self.peak_kib, peak_rss_kib(proc.pid))

    def kill(self) -> None:
        if self.proc is not None:
            self.sample()
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
            self.proc = None

    def stop(self) -> int:
        if self.proc is None:
            return 0
        self.sample()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self.proc = None
        return code


@dataclass
class Runner(Managed):
    config: Path = Path()
    runner_id: str = ""
    token: str = field(default="", repr=False)
    source: str = ""
    hermes: HermesFixture | None = None

    def start(self) -> None:
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "talaria", "runner", "--config", str(self.config), "--log-format", "json"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, text=True, env=clean_env(),
            )  # fmt: skip
        self.starts += 1

    def lines(self) -> Iterator[dict[str, Any]]:
        for raw in self.log.read_text(errors="replace").splitlines():
            if raw.startswith("{"):
                try:
                    yield json.loads(raw)
                except json.JSONDecodeError:
                    continue  # a line cut by SIGKILL

    def connections(self) -> list[tuple[str, str]]:
        """(instance, epoch) of every ``runner_connected`` line, oldest first."""
        return [(str(line.get("instance")), str(line.get("epoch"))) for line in self.lines()
                if line.get("event") == "runner_connected"]  # fmt: skip

    def wait_connected(self, after: int, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if len(self.connections()) > after:
                return True
            if self.proc is None or self.proc.poll() is not None:
                return False
            time.sleep(0.1)
        return False


@dataclass
class Hub(Managed):
    data: Path = Path()
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)  # the database and the public URL, when on PostgreSQL

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start on the same port and data directory; returns the seconds until its ready line."""
        started = time.monotonic()
        env = clean_env(TALARIA_RUNTIME_API_PROXY_SECRET=PROXY_SECRET, **HUB_SETTINGS, **self.env)
        with self.log.open("a") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "talaria", "hub", "--data-dir", str(self.data), "--port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
            )  # fmt: skip
        assert proc.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
        try:
            line = lines.get(timeout=START_S)
        except queue.Empty:
            line = ""
        if not line.startswith(READY_PREFIX):
            proc.kill()
            proc.wait(10)
            raise RuntimeError(f"the hub did not start within {START_S:.0f} s: {self.log.read_text()[-600:]}")
        self.proc = proc
        self.starts += 1
        return time.monotonic() - started


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    """The hub's stdout, line by line, until it ends (read for as long as the hub runs, so it never blocks)."""
    for line in stream:
        lines.put(line)
    lines.put("")


class World:
    """Everything the run starts, in ``work``; ``close`` stops what still runs."""

    def __init__(self, work: Path, runners: int, *, postgres: bool = False, real_hermes: bool = False) -> None:
        self.work = work
        # With real Hermes: the scripted model it calls, and the hermes serve process watched for its peak RSS.
        self.model = ModelServer(goal_rules()) if real_hermes else None
        self.others: list[Managed] = []
        self.real_hermes: list[RealHermes] = []
        self.postgres: PostgresServer | None = None
        self.env: dict[str, str] = {}  # for every talaria process: the database, when on PostgreSQL
        names = ["hub_a", "hub_b"] if postgres else ["hub"]
        self.hubs = [Hub(name=name, log=work / f"{name}.log", data=work / name / "data", port=free_port())
                     for name in names]  # fmt: skip
        backends = [("127.0.0.1", hub.port) for hub in self.hubs]
        self.proxy = FaultProxy(*backends)
        self.front = FaultProxy(*backends) if postgres else None  # the users' balancer: no faults
        self.runners: list[Runner] = []
        self.count = runners
        self._sampling = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    @property
    def hub(self) -> Hub:
        """The hub whose data directory the administration commands use (the first replica's on PostgreSQL)."""
        return self.hubs[0]

    @property
    def api_url(self) -> str:
        """Where users reach the hub: the hub itself, or the users' balancer in front of the replicas."""
        return self.front.url if self.front is not None else self.hub.url

    def open(self) -> World:
        self.proxy.start()
        if self.front is not None:
            self.front.start()
            self.postgres = PostgresServer.create(durable=True)
            self.env = {"TALARIA_DATABASE_URL": self.postgres.url()}
            for hub in self.hubs:
                hub.env = self.env | {"TALARIA_HUB_PUBLIC_URL": self.front.url}
            talaria("db", "upgrade", "--data-dir", str(self.hub.data), cwd=self.work, env=self.env)
            progress(f"PostgreSQL in {self.postgres.root}; users reach the replicas through {self.front.url}")
        data = str(self.hub.data)
        talaria("admin", "create-user", "--data-dir", data, "--username", "root", "--role", "admin", cwd=self.work,
                env=self.env, stdin=PASSWORD + "\n")  # fmt: skip
        allows = [arg for k in range(self.count) for arg in ("--allow", f"n{k + 1}:default")]
        talaria("admin", "create-user", "--data-dir", data, "--username", "alice", "--role", "user", "--allow",
                "rt:default", *allows, "--team", cwd=self.work, env=self.env, stdin=PASSWORD + "\n")  # fmt: skip
        if self.model is not None:
            self.model.start()
        for k in range(self.count):
            self.runners.append(self._register(k + 1))
        for hub in self.hubs:
            progress(f"{hub.name} {hub.url} ({hub.start():.1f} s to start); runners reach it through {self.proxy.url}")
        for runner in self.runners:
            runner.start()
        deadline = time.monotonic() + START_S
        for runner in self.runners:
            if not runner.wait_connected(0, deadline):
                raise RuntimeError(f"runner {runner.name} did not connect: {runner.log.read_text()[-600:]}")
        self._sampler.start()
        return self

    def _register(self, k: int) -> Runner:
        node = self.work / f"n{k}"
        node.mkdir()
        hermes = None
        if k == 1 and self.model is not None:
            started = time.monotonic()
            real = RealHermes(node / "hermes", self.model.base_url, config_extra=HERMES_CONFIG)
            self.real_hermes.append(real)  # stopped by close, whatever happens next
            real.start()
            assert real.process is not None
            self.others.append(Managed(name=f"n{k}_hermes", log=node / "hermes.log", proc=real.process, starts=1))
            progress(f"n{k} is in front of a real hermes serve ({time.monotonic() - started:.1f} s to start)")
            url, session_token = real.url, real.session_token
        else:
            hermes = HermesFixture().start()
            hermes.knobs.delta_delay = 0.005
            url, session_token = hermes.url, hermes.session_token
        config = node / "runner.json"
        talaria("admin", "runners", "register", "--data-dir", str(self.hub.data), "--name", f"node {k}", "--source",
                f"n{k}", "--profile", "default", "--server-url", self.proxy.url, "--hermes-url", url,
                "--out", str(config), cwd=self.work, env=self.env)  # fmt: skip
        token_file = node / "hermes-token"
        token_file.write_text(session_token)
        token_file.chmod(0o600)
        body = json.loads(config.read_text()) | {"hermesTokenFile": str(token_file)}
        config.write_text(json.dumps(body))
        config.chmod(0o600)
        return Runner(name=f"n{k}", log=node / "runner.log", config=config, runner_id=body["runnerId"],
                      token=body["token"], source=f"n{k}", hermes=hermes)  # fmt: skip

    def _sample(self) -> None:
        while not self._sampling.wait(0.5):
            for managed in [*self.hubs, *self.runners, *self.others]:
                managed.sample()

    def client(self, username: str) -> httpx.Client:
        """A signed-in JSON API client (Origin and CSRF token set); the session outlives hub restarts."""
        client = httpx.Client(base_url=self.api_url, headers={"Origin": self.api_url}, timeout=30)
        answer = client.post("/api/auth/login", json={"username": username, "password": PASSWORD})
        answer.raise_for_status()
        client.headers["X-CSRF-Token"] = answer.json()["csrfToken"]
        return client

    def sizes(self) -> dict[str, int]:
        """Bytes on disk: the hubs' data directories, each runner's state directory (its receipts), and on
        PostgreSQL the database (``pg_database_size``: its tables and indexes, not the server's write-ahead log)."""

        def size(root: Path) -> int:
            return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())

        sizes = {"hub_data": sum(size(hub.data) for hub in self.hubs)}
        if self.postgres is not None:
            import psycopg  # the PostgreSQL extra: only a run on PostgreSQL needs it

            with psycopg.connect(self.postgres.url()) as db:
                row = db.execute("SELECT pg_database_size(current_database())").fetchone()
            sizes["postgres_database"] = int(row[0]) if row else 0
        return sizes | {f"{r.name}_state": size(r.config.parent / "state") for r in self.runners}

    def stop_hubs(self) -> None:
        for hub in self.hubs:
            hub.stop()

    def close(self) -> None:
        self._sampling.set()
        for runner in self.runners:
            runner.stop()
        self.stop_hubs()
        self.proxy.stop()
        if self.front is not None:
            self.front.stop()
        for other in self.others:
            other.sample()
        for runner in self.runners:
            if runner.hermes is not None:
                runner.hermes.stop()
        for real in self.real_hermes:
            real.stop()
            (real.workdir.parent / "hermes.log").write_text("\n".join(real.output) + "\n")
        if self.model is not None:
            self.model.stop()
        if self.postgres is not None:
            self.postgres.stop()
