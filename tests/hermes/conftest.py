"""The real-Hermes acceptance suite (issue: real Hermes): ``hermes serve`` (hermes-agent 0.19.0 from
``.venv-hermes``) on 127.0.0.1 with a private home, driven by the scripted model server, behind a real hub
and a real ``talaria runner`` process. Never skipped: without Hermes the suite fails saying how to install it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from talaria.clock import SystemClock
from talaria.hub.runners.connection_state import AccountRef
from talaria.hub.runners.registry import parse_registration
from talaria.hub.timings import HubTimings
from talaria.hub.turns.driver import TurnDriver
from talaria.testing.hub_server import HubServer
from talaria.testing.model_server import ModelServer
from talaria.testing.real_hermes import RealHermes
from tests.conftest import add_account
from tests.hermes.site_support import site  # noqa: F401 - the fixture of the hub-process tests
from tests.integration.runner_support import RunnerProcess, outcome, spawn, wait_until, write_config

PROFILES = ("default", "work")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/hermes/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.hermes)


@pytest.fixture
def hermes(tmp_path: Path, model: ModelServer, hermes_executable: Path) -> Iterator[RealHermes]:
    with RealHermes(tmp_path / "hermes", model.base_url, profiles=("work",)) as process:
        yield process


@dataclass
class Node:
    """A hub with one registered runner process in front of a real Hermes."""

    server: HubServer
    hermes: RealHermes
    model: ModelServer
    runner: RunnerProcess
    runner_id: str
    config_path: Path
    accounts: dict[str, AccountRef] = field(default_factory=dict)

    @property
    def driver(self) -> TurnDriver:
        return TurnDriver(self.server.hub.channels, self.server.hub.registry, self.server.clock)

    def _args(self, prompt: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        deadline = self.server.clock.now_ms() + 120_000
        return {"runner_id": self.runner_id, "account": self.account(), "profile": "default", "work_id": "work-1",
                "prompt": prompt, "deadline_ms": deadline} | kwargs  # fmt: skip

    def account(self, username: str = "alice") -> AccountRef:
        return self.accounts[username]

    def call(self, coro: Any, timeout: float = 120.0) -> Any:
        """Run ``coro`` on the hub loop; its result or the TalariaError it raised."""
        return outcome(self.server, spawn(self.server, coro), timeout=timeout)

    def turn(self, prompt: str, **kwargs: Any) -> Any:
        return self.call(self.driver.run(**self._args(prompt, kwargs)), timeout=130.0)

    def spawn_turn(self, prompt: str, **kwargs: Any) -> asyncio.Task[Any]:
        return spawn(self.server, self.driver.run(**self._args(prompt, kwargs)))


def start_node(
    tmp_path: Path, hermes: RealHermes, model: ModelServer, *, timings: HubTimings | None = None, **config: Any
) -> Node:
    server = HubServer(tmp_path / "data", SystemClock(), timings=timings).start()
    try:
        add_account(server, "alice", allowed_profiles={"local": list(PROFILES)})
        add_account(server, "bob", allowed_profiles={"local": ["default"]})
        accounts = {}
        for name in ("alice", "bob"):
            created = server.hub.accounts.get(name)
            assert created is not None
            accounts[name] = AccountRef(name, created.tenant, created.auth_version)
        local_only = {k: config.pop(k) for k in ("hermesCredentials", "hermesTokenFile") if k in config}
        fields = parse_registration(
            {"name": "node", "allowedProfiles": list(PROFILES), "hermesURL": hermes.url} | config,
            default_server_url=server.url,
        )
        registration = server.hub.registry.register("default", fields)
        node_dir = tmp_path / "node"
        node_dir.mkdir(exist_ok=True)
        extra: dict[str, Any] = {}
        if "hermesCredentials" not in local_only:
            token_file = node_dir / "hermes-token"
            token_file.write_text(hermes.session_token)
            token_file.chmod(0o600)
            extra["hermesTokenFile"] = str(token_file)
        path = write_config(node_dir, registration.config | extra | local_only)
        runner = RunnerProcess(path, tmp_path / "logs")
        runner.wait_for("runner connected")
        runner_id = registration.runner.id
        wait_until(lambda: server.hub.runners.is_connected(runner_id), what="the hub state")
    except BaseException:
        server.stop()
        raise
    return Node(server, hermes, model, runner, runner_id, path, accounts)


@contextmanager
def running_node(
    tmp_path: Path, hermes: RealHermes, model: ModelServer, *, timings: HubTimings | None = None, **config: Any
) -> Iterator[Node]:
    """``start_node``, and at exit the runner stopped (if still running) and the hub stopped."""
    made = start_node(tmp_path, hermes, model, timings=timings, **config)
    try:
        yield made
    finally:
        if made.runner.proc.poll() is None:
            made.runner.stop()
        made.runner.close()
        made.server.stop()


@pytest.fixture
def node(tmp_path: Path, hermes: RealHermes, model: ModelServer) -> Iterator[Node]:
    with running_node(tmp_path, hermes, model) as made:
        yield made
