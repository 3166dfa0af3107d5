"""Two or more PostgreSQL hub replicas of one database in front of one runner process (scale.md 4): ``Cluster``
holds in-process ``HubServer`` replicas behind a round-robin ``TcpProxy``, a ``talaria runner`` process connected
through the proxy, the Hermes fixture, alice signed in on each replica, and one conversation with her bot."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from talaria.clock import SystemClock
from talaria.hub.replica import LIVE_MS
from talaria.hub.timings import HubTimings
from talaria.settings import Settings
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database, raw_sql
from tests.conftest import PASSWORD, add_account, login
from tests.hermes.chat_support import make_bot, send, start_chat
from tests.integration.cli_support import HubProcess, clean_env
from tests.integration.runner_support import RunnerProcess, register_node
from tests.integration.web_support import TASK
from tests.tcp_proxy import TcpProxy

HOLD = 120.0  # seconds before each delta of a held turn: it runs until the test lets it go
T = TypeVar("T")


@dataclass
class Cluster:
    url: str
    hubs: dict[str, HubServer]
    hermes: HermesFixture
    runner: RunnerProcess
    proxy: TcpProxy
    clients: dict[str, httpx.Client]
    conversation_id: str

    timings: HubTimings | None = None
    processes: dict[str, HubProcess] = field(default_factory=dict)

    def start_process(self, name: str, tmp_path: Path) -> HubProcess:
        """A ``talaria hub`` process on the cluster's database (default timings), behind the proxy, alice signed in
        on it as ``clients[name]``: a replica the test can SIGKILL."""
        directory = tmp_path / name
        directory.mkdir()
        env = clean_env(TALARIA_DATABASE_URL=self.url, TALARIA_DATA_DIR=str(directory / "data"))
        process = HubProcess(directory, ["--port", "0"], env)
        self.processes[name] = process
        _, url = process.ready()
        self.proxy.backends.append(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        self.clients[name] = login_at(url, "alice")
        return process

    def kill(self, name: str) -> str:
        """SIGKILL the replica process ``name`` and take it out of the proxy (as a balancer's health check would);
        its replica id."""
        process = self.processes.pop(name)
        replica_id = self.replica_of(name)
        process.proc.kill()
        process.proc.wait(timeout=10)
        client = self.clients.pop(name)
        client.close()
        url = str(client.base_url).rstrip("/")
        self.proxy.backends.remove(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        process.close()
        return replica_id

    def replica_of(self, name: str) -> str:
        """The replica id of the hub ``name``: an in-process one's, or the one live row no in-process hub owns."""
        if name in self.hubs:
            replica = self.hubs[name].hub.replica
            assert replica is not None
            return replica.id
        mine = {hub.hub.replica.id for hub in self.hubs.values() if hub.hub.replica is not None}
        rows = raw_sql(Settings(database_url=self.url), "SELECT id FROM hub_replica ORDER BY started_at")
        [other] = [row["id"] for row in rows if row["id"] not in mine]
        return str(other)

    def start(self, name: str, tmp_path: Path, timings: HubTimings | None = None, **settings: Any) -> HubServer:
        hub = HubServer(tmp_path / name, SystemClock(), database_url=self.url, timings=timings or self.timings,
                        **settings).start()  # fmt: skip
        self.hubs[name] = hub
        self.proxy.backends.append(("127.0.0.1", port_of(hub)))
        self.clients[name] = login(hub, "alice")
        return hub

    def stop(self, name: str) -> None:
        hub = self.hubs.pop(name)
        self.clients.pop(name).close()
        self.proxy.backends.remove(("127.0.0.1", port_of(hub)))
        hub.stop()

    def holder(self, turn_id: str) -> str | None:
        """The hub (by name) holding the turn's lease now."""
        rows = raw_sql(Settings(database_url=self.url), "SELECT holder FROM turn_lease WHERE turn_id = ?", turn_id)
        ids = {self.replica_of(name): name for name in [*self.hubs, *self.processes]}
        return ids.get(rows[0]["holder"]) if rows and rows[0]["holder"] else None

    def driver_and_other(self, turn_id: str) -> tuple[str, str]:
        """The hub driving the turn (once it holds the lease) and the other one."""
        driver = until(lambda: self.holder(turn_id))
        return driver, next(name for name in self.hubs if name != driver)

    def held_turn(self, via: str, text: str) -> str:
        """A turn sent through hub ``via`` whose Hermes run holds before its first delta, once it runs."""
        self.hermes.delta_delay_for(text, HOLD)
        sent = send(self.clients[via], self.conversation_id, text)
        assert sent.status_code == 202, sent.text
        turn_id: str = sent.json()["turn"]["id"]
        self.hermes.wait_for(lambda: self.hermes.prompt_count(text) == 1, timeout=30)
        settings = Settings(database_url=self.url)
        until(
            lambda: (
                raw_sql(settings, "SELECT 1 FROM chat_turn WHERE id = ? AND submit_state = 'submitted'", turn_id)
                or None
            )
        )
        return turn_id


def job_of(client: httpx.Client, job_id: str) -> dict[str, Any]:
    answer = client.get(f"/api/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    job: dict[str, Any] = answer.json()["job"]
    return job


def running_job(both: Cluster, admins: dict[str, httpx.Client], prompt: str, approver: str) -> tuple[str, str]:
    """A job of alice's with ``prompt``, approved by ``admins[approver]``, held in Hermes before its first delta:
    its id once it runs, and the name of the hub whose dispatcher runs it."""
    both.hermes.delta_delay_for(prompt, HOLD)
    task = both.clients["a"].post("/api/tasks", json=TASK | {"prompt": prompt}).json()["task"]
    assert both.clients["a"].post(f"/api/tasks/{task['id']}/submit").status_code == 200
    approved = admins[approver].post(f"/api/tasks/{task['id']}/approve")
    assert approved.status_code == 200, approved.text
    job_id: str = approved.json()["job"]["id"]
    both.hermes.wait_for(lambda: both.hermes.prompt_count(prompt) == 1, timeout=30)
    viewer = admins[approver]
    running = until(lambda: job_of(viewer, job_id) if job_of(viewer, job_id)["state"] == "RUNNING" else None)
    instances = {hub.hub.dispatcher.worker_instance: name for name, hub in both.hubs.items()}
    return job_id, instances[running["lease"]["ownerInstance"]]


def chat_turn_channel(url: str, turn_id: str) -> dict[str, Any]:
    """A chat turn's recorded channel and frame cursor joined with its gateway's row (scale.md 4.4)."""
    [row] = raw_sql(Settings(database_url=url),
                    "SELECT t.connection_id, t.first_seq, t.frame_seq, t.runtime_session_id, g.owner_replica,"
                    " g.owner_counter, g.last_seq, g.closed_at FROM chat_turn t JOIN runner_gateway g"
                    " ON g.id = t.connection_id WHERE t.id = ?", turn_id)  # fmt: skip
    return row


def login_at(url: str, username: str, password: str = PASSWORD) -> httpx.Client:
    """A JSON API client of the hub at ``url`` signed in as ``username`` (Origin and CSRF token sent)."""
    client = httpx.Client(base_url=url, headers={"Origin": url}, timeout=30)
    response = client.post("/api/auth/login", json={"username": username, "password": password})
    assert response.status_code == 200, response.text
    client.headers["X-CSRF-Token"] = response.json()["csrfToken"]
    return client


def live_replica_ids(url: str) -> list[str]:
    """The replicas whose rows were renewed within the last 20 s by the database server's clock (scale.md 1), oldest
    first."""
    rows = raw_sql(Settings(database_url=url), "SELECT id FROM hub_replica WHERE renewed_at > (EXTRACT(EPOCH FROM"
                   " clock_timestamp()) * 1000)::bigint - ? ORDER BY started_at", LIVE_MS)  # fmt: skip
    return [str(row["id"]) for row in rows]


def replica_live(url: str, replica_id: str) -> bool:
    return replica_id in live_replica_ids(url)


def port_of(hub: HubServer) -> int:
    return int(hub.url.rsplit(":", 1)[1])


def until(found: Callable[[], T | None], timeout: float = 30.0, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while (value := found()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}" if what else "timed out"
        time.sleep(0.05)
    return value


@contextmanager
def cluster(
    server: PostgresServer,
    tmp_path: Path,
    names: tuple[str, ...] = ("a", "b"),
    timings: HubTimings | None = None,
    **settings: Any,
) -> Iterator[Cluster]:
    with HermesFixture() as hermes, postgres_database(server, migrated=True) as url:
        proxy = TcpProxy([]).start()
        made = Cluster(url, {}, hermes, None, proxy, {}, "", timings)  # type: ignore[arg-type]
        try:
            first = HubServer(tmp_path / names[0], SystemClock(), database_url=url, timings=timings, **settings).start()
            add_account(first, "alice", allowed_profiles={"local": ["default"]})
            made.hubs[names[0]] = first
            proxy.backends.append(("127.0.0.1", port_of(first)))
            made.clients[names[0]] = login(first, "alice")
            for name in names[1:]:
                made.start(name, tmp_path, **settings)
            path = register_node(first, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token,
                                 serverURL=proxy.url)  # fmt: skip
            made.runner = RunnerProcess(path, tmp_path / "logs", "runner")
            made.runner.wait_for("runner connected")
            made.conversation_id = start_chat(made.clients[names[0]], make_bot(made.clients[names[0]]))
            yield made
        finally:
            if made.runner is not None:
                made.runner.close()
            for client in made.clients.values():
                client.close()
            for hub in made.hubs.values():
                hub.stop()
            for process in made.processes.values():
                process.close()
            proxy.stop()
