"""A ``talaria hub`` process over a data directory made by the ``talaria`` commands, one runner process in front of
a real Hermes, and three signed-in people: for the tests that run chat and jobs through processes, and kill and
restart the hub or the runner.

The people (chat.md 9): alice may use ``local:default`` and ``local:work``, bob ``local:default``, root is an admin
(``local:default``). The node ``node`` allows ``default`` and ``work`` (the ``hermes`` fixture has a ``work``
profile). ``Site.logs()`` is every hub and runner process's output so far, for ``assert_text_kept_out``."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.testing.real_hermes import RealHermes
from tests.integration.cli_support import HubProcess, clean_env, free_port, talaria
from tests.integration.runner_support import RunnerProcess, wait_until

PASSWORD = "correct horse battery staple"
LEASE = {"TALARIA_LIFECYCLE_LEASE_TTL_S": "3", "TALARIA_LIFECYCLE_HEARTBEAT_INTERVAL_S": "1",
         "TALARIA_LIFECYCLE_REAPER_INTERVAL_S": "1"}  # fmt: skip
NODE_PROFILES = ("default", "work")
PEOPLE = (("alice", "user", ("local:default", "local:work")), ("bob", "user", ("local:default",)),
          ("root", "admin", ("local:default",)))  # fmt: skip


@dataclass
class Site:
    """A ``talaria hub`` process, its data directory, one runner process, and three signed-in people. ``hub`` and
    ``runner`` are the current processes; every one started is kept (closed at the end) for ``logs``."""

    tmp: Path
    url: str
    hermes: RealHermes
    hub: HubProcess
    runner: RunnerProcess
    alice: httpx.Client
    bob: httpx.Client
    root: httpx.Client
    hubs: list[HubProcess] = field(default_factory=list)
    runners: list[RunnerProcess] = field(default_factory=list)
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.tmp / "data"

    @property
    def runner_config(self) -> Path:
        return self.tmp / "node" / "runner.json"

    @property
    def runner_id(self) -> str:
        runner_id: str = json.loads(self.runner_config.read_text())["runnerId"]
        return runner_id

    def hub_args(self) -> list[str]:
        return ["--data-dir", str(self.data), "--port", self.url.rsplit(":", 1)[1]]

    def kill_hub(self) -> None:
        """SIGKILL (a stopped process too) and wait for it to be gone."""
        self.hub.proc.kill()
        self.hub.proc.wait(10)

    def restart_hub(self) -> None:
        self.hub.close()
        self.hub = HubProcess(self.tmp, self.hub_args(), clean_env(**LEASE))
        self.hubs.append(self.hub)
        self.hub.ready()

    def kill_runner(self) -> None:
        """SIGKILL the current runner (no goodbye, nothing interrupted) and wait for it to be gone."""
        self.runner.proc.kill()
        self.runner.proc.wait(10)

    def stop_runner(self) -> None:
        """SIGTERM the current runner, wait for its exit and until the hub shows it offline."""
        self.runner.stop(signal.SIGTERM)
        wait_until(lambda: not self.online(self.runner_id), timeout=30, what="the hub to see the runner offline")

    def start_runner(self, config: Path | None = None) -> RunnerProcess:
        """A new runner process (the site's node unless ``config``), once it has connected."""
        self.runner.close()
        self.runner = RunnerProcess(config or self.runner_config, self.tmp / "logs", name=f"runner-{len(self.runners)}")
        self.runners.append(self.runner)
        self.runner.wait_for("runner connected", timeout=30)
        return self.runner

    def switch_node(self, name: str = "node-2") -> str:
        """Re-register the source's node (chat.md 9 scenario 10): the runner stopped, its registration deleted, a new
        node ``name`` registered through the admin API and its runner started; returns the new runner's id."""
        old_id = self.runner_id
        self.stop_runner()
        disabled = self.root.delete(f"/api/admin/runners/{old_id}")
        assert disabled.status_code == 200, disabled.text
        body = {"name": name, "allowedProfiles": list(NODE_PROFILES), "hermesURL": self.hermes.url,
                "serverURL": self.url}  # fmt: skip
        registered = self.root.post("/api/admin/runners", json=body)
        assert registered.status_code == 201, registered.text
        new_id: str = registered.json()["runner"]["id"]
        (self.tmp / name).mkdir()
        config = with_token_file(self.tmp / name / "runner.json", self.hermes, registered.json()["config"])
        self.start_runner(config)
        wait_until(lambda: self.online(new_id), timeout=30, what="the new runner's state")
        return new_id

    def online(self, runner_id: str) -> bool:
        """The runner's ``online`` in the admin list (it has a connection state, runner-protocol.md 3)."""
        runners = self.root.get("/api/admin/runners").json()["runners"]
        return any(r["id"] == runner_id and r["online"] for r in runners)

    def sign_in(self, username: str) -> httpx.Client:
        """Another signed-in client for ``username`` (closed at the end)."""
        client = sign_in(self.url, username)
        self.clients.append(client)
        return client

    def logs(self) -> list[str]:
        """Every hub's standard error (its JSON log) and every runner's output, so far."""
        texts = [h.stderr_path.read_text(encoding="utf-8", errors="replace") for h in self.hubs]
        return texts + [text for r in self.runners for text in (r.stdout, r.stderr)]

    def close(self) -> None:
        for client in (self.alice, self.bob, self.root, *self.clients):
            client.close()
        for runner in (*self.runners, self.runner):
            runner.close()
        for hub in (*self.hubs, self.hub):
            hub.close()


def sign_in(url: str, username: str) -> httpx.Client:
    client = httpx.Client(base_url=url, headers={"Origin": url}, timeout=30)
    answer = client.post("/api/auth/login", json={"username": username, "password": PASSWORD})
    assert answer.status_code == 200, answer.text
    client.headers["X-CSRF-Token"] = answer.json()["csrfToken"]
    return client


def register_node(
    tmp: Path, url: str, hermes: RealHermes, name: str, profiles: tuple[str, ...] = ("default",), source: str = "local"
) -> Path:
    """`talaria admin runners register` (of ``source``) and the node's Hermes token file; returns runner.json."""
    config = tmp / name / "runner.json"
    config.parent.mkdir()
    node = ["--name", name, "--source", source, "--server-url", url, "--hermes-url", hermes.url]
    node += [arg for profile in profiles for arg in ("--profile", profile)]
    registered = talaria("admin", "runners", "register", "--data-dir", str(tmp / "data"), *node, "--out", str(config),
                         cwd=tmp)  # fmt: skip
    assert registered.returncode == 0, registered.stderr
    return with_token_file(config, hermes)


def with_token_file(config: Path, hermes: RealHermes, registered: dict[str, Any] | None = None) -> Path:
    """``config`` (written from ``registered`` if given) naming a mode-600 file beside it with Hermes' token."""
    token_file = config.parent / "hermes-token"
    token_file.write_text(hermes.session_token)
    token_file.chmod(0o600)
    body = registered if registered is not None else json.loads(config.read_text())
    config.write_text(json.dumps(body | {"hermesTokenFile": str(token_file)}))
    config.chmod(0o600)
    return config


def create_user(data: Path, username: str, role: str, allowed: tuple[str, ...]) -> None:
    """``talaria admin create-user`` with the site's password and each ``allowed`` pair."""
    pairs = [arg for pair in allowed for arg in ("--allow", pair)]
    created = talaria("admin", "create-user", "--data-dir", str(data), "--username", username, "--role", role, *pairs,
                      cwd=data.parent, stdin=PASSWORD + "\n")  # fmt: skip
    assert created.returncode == 0, created.stderr


@pytest.fixture
def site(tmp_path: Path, hermes: RealHermes) -> Iterator[Site]:
    with running_site(tmp_path, hermes) as made:
        yield made


@contextmanager
def running_site(tmp_path: Path, hermes: RealHermes) -> Iterator[Site]:
    """A ``Site`` over ``tmp_path`` in front of ``hermes``, closed (every hub and runner it started) at exit."""
    data = tmp_path / "data"
    url = f"http://127.0.0.1:{free_port()}"
    (first, *others) = PEOPLE
    create_user(data, *first)  # makes the data directory; the other commands then only add rows, side by side
    with ThreadPoolExecutor(len(others) + 1) as pool:
        made_config = pool.submit(register_node, tmp_path, url, hermes, "node", NODE_PROFILES)
        for done in [pool.submit(create_user, data, *person) for person in others]:
            done.result()
        config = made_config.result()
    hub = HubProcess(tmp_path, ["--data-dir", str(data), "--port", url.rsplit(":", 1)[1]], clean_env(**LEASE))
    runner: RunnerProcess | None = None
    made: Site | None = None
    try:
        hub.ready()
        runner = RunnerProcess(config, tmp_path / "logs")
        with ThreadPoolExecutor(len(PEOPLE)) as pool:  # argon2 checks while the runner connects
            signing_in = [pool.submit(sign_in, url, username) for username, _, _ in PEOPLE]
            runner.wait_for("runner connected", timeout=30)
            alice, bob, root = (future.result() for future in signing_in)
        made = Site(tmp_path, url, hermes, hub, runner, alice, bob, root, hubs=[hub], runners=[runner])
        yield made
    finally:
        if made is not None:  # the test may have replaced the hub and the runner
            made.close()
        else:
            if runner is not None:
                runner.close()
            hub.close()


def turn_rows(hermes: RealHermes, marker: str, profile: str | None = None) -> list[dict[str, Any]] | None:
    """In Hermes' own history (``profile``'s sessions, else the default profile's): the user row holding ``marker``
    and the rows after it up to the next user row; None if no stored session has that row."""
    headers = {"X-Hermes-Session-Token": hermes.session_token}
    scope: dict[str, str | int] = {} if profile is None else {"profile": profile}
    with httpx.Client(base_url=hermes.url, headers=headers, timeout=10) as client:
        for session in client.get("/api/sessions", params=scope | {"limit": 50}).json()["sessions"]:
            rows: list[dict[str, Any]] = client.get(f"/api/sessions/{session['id']}/messages",
                                                    params=scope).json()["messages"]  # fmt: skip
            for index, row in enumerate(rows):
                if row["role"] == "user" and marker in (row.get("content") or ""):
                    later = [i for i in range(index + 1, len(rows)) if rows[i]["role"] == "user"]
                    return rows[index : later[0] if later else len(rows)]
    return None


def stored_reply(hermes: RealHermes, marker: str, profile: str | None = None) -> str | None:
    """The reply Hermes stored for the run whose user row holds ``marker`` (hermes.md 11: an assistant row with
    ``finish_reason: "stop"`` before the next user row), if any."""
    for row in (turn_rows(hermes, marker, profile) or [])[1:]:
        if row["role"] == "assistant" and row.get("finish_reason") == "stop":
            return str(row["content"])
    return None
