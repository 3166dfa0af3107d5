"""A ``talaria hub`` process over a data directory made by the ``talaria`` commands, one runner process in front of
a real Hermes, and two signed-in people (alice, root): for the tests that kill and restart the hub."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from talaria.testing.real_hermes import RealHermes
from tests.integration.cli_support import HubProcess, clean_env, free_port, talaria
from tests.integration.runner_support import RunnerProcess

PASSWORD = "correct horse battery staple"
LEASE = {"TALARIA_LIFECYCLE_LEASE_TTL_S": "3", "TALARIA_LIFECYCLE_HEARTBEAT_INTERVAL_S": "1",
         "TALARIA_LIFECYCLE_REAPER_INTERVAL_S": "1"}  # fmt: skip


@dataclass
class Site:
    """A ``talaria hub`` process, its data directory, one runner process, and two signed-in people."""

    tmp: Path
    url: str
    hub: HubProcess
    runner: RunnerProcess
    alice: httpx.Client
    root: httpx.Client

    def hub_args(self) -> list[str]:
        return ["--data-dir", str(self.tmp / "data"), "--port", self.url.rsplit(":", 1)[1]]

    def kill_hub(self) -> None:
        """SIGKILL (a stopped process too) and wait for it to be gone."""
        self.hub.proc.kill()
        self.hub.proc.wait(10)

    def restart_hub(self) -> None:
        self.hub.close()
        self.hub = HubProcess(self.tmp, self.hub_args(), clean_env(**LEASE))
        self.hub.ready()


def sign_in(url: str, username: str) -> httpx.Client:
    client = httpx.Client(base_url=url, headers={"Origin": url}, timeout=30)
    answer = client.post("/api/auth/login", json={"username": username, "password": PASSWORD})
    assert answer.status_code == 200, answer.text
    client.headers["X-CSRF-Token"] = answer.json()["csrfToken"]
    return client


def register_node(tmp: Path, url: str, hermes: RealHermes, name: str) -> Path:
    """`talaria admin runners register` (source `local`) and the node's Hermes token file; returns runner.json."""
    config = tmp / name / "runner.json"
    config.parent.mkdir()
    node = ["--name", name, "--profile", "default", "--server-url", url, "--hermes-url", hermes.url]
    registered = talaria("admin", "runners", "register", "--data-dir", str(tmp / "data"), *node, "--out", str(config),
                         cwd=tmp)  # fmt: skip
    assert registered.returncode == 0, registered.stderr
    token_file = tmp / name / "hermes-token"
    token_file.write_text(hermes.session_token)
    token_file.chmod(0o600)
    config.write_text(json.dumps(json.loads(config.read_text()) | {"hermesTokenFile": str(token_file)}))
    return config


@pytest.fixture
def site(tmp_path: Path, hermes: RealHermes) -> Iterator[Site]:
    data = str(tmp_path / "data")
    for username, role in (("alice", "user"), ("root", "admin")):
        created = talaria("admin", "create-user", "--data-dir", data, "--username", username, "--role", role,
                          "--allow", "local:default", cwd=tmp_path, stdin=PASSWORD + "\n")  # fmt: skip
        assert created.returncode == 0, created.stderr
    url = f"http://127.0.0.1:{free_port()}"
    config = register_node(tmp_path, url, hermes, "node")
    hub = HubProcess(tmp_path, ["--data-dir", data, "--port", url.rsplit(":", 1)[1]], clean_env(**LEASE))
    hub.ready()
    runner = RunnerProcess(config, tmp_path / "logs")
    made: Site | None = None
    try:
        runner.wait_for("runner connected", timeout=30)
        made = Site(tmp_path, url, hub, runner, sign_in(url, "alice"), sign_in(url, "root"))
        yield made
    finally:
        if made is not None:  # the test may have replaced the hub and the runner
            made.alice.close()
            made.root.close()
            hub, runner = made.hub, made.runner
        runner.close()
        hub.close()


def stored_reply(hermes: RealHermes, marker: str) -> str | None:
    """The assistant's reply that follows the user row holding ``marker`` in Hermes' own history, if any."""
    headers = {"X-Hermes-Session-Token": hermes.session_token}
    with httpx.Client(base_url=hermes.url, headers=headers, timeout=10) as client:
        for session in client.get("/api/sessions", params={"limit": 50}).json()["sessions"]:
            rows = client.get(f"/api/sessions/{session['id']}/messages").json()["messages"]
            for index, row in enumerate(rows):
                if row["role"] == "user" and marker in (row.get("content") or ""):
                    after = rows[index + 1] if index + 1 < len(rows) else None
                    if after is not None and after["role"] == "assistant" and after.get("finish_reason") == "stop":
                        return str(after["content"])
    return None
