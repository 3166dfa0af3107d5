"""Shared fixtures: a real hub on 127.0.0.1 with a temporary data directory and a ManualClock; the scripted model
server and the Hermes executable (tests/hermes and tests/browser run real Hermes)."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.clock import ManualClock
from talaria.logs import configure_logging
from talaria.testing.hub_server import HubServer
from talaria.testing.model_server import ModelServer
from talaria.testing.postgres_server import PostgresMissing, PostgresServer, required
from talaria.testing.real_hermes import HermesNotInstalled, hermes_bin
from tests.backends import backend_database, postgres_store  # noqa: F401 - fixtures the tests share
from tests.leak_scan_support import (
    MADE,
    install_recorders,
    message_texts,
    scan,
    scanned_records,
    secrets_of,
    talaria_files,
)

# A synthetic per-run proxy secret (lifecycle.md 11); tests/integration scans files for it.
PROXY_SECRET = "test-" + secrets.token_hex(24)
PASSWORD = "correct horse battery staple"


def pytest_configure(config: pytest.Config) -> None:
    install_recorders()


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """After the test: none of the secrets and message texts it made in its logs, receipts or audit rows
    (tests/leak_scan_support.py). A finding fails the test and shows only the first characters of the value."""
    MADE.clear()
    yield
    tmp = request.node.funcargs.get("tmp_path")
    tmp = tmp if isinstance(tmp, Path) else None
    # the other fixtures' teardown has run by now (this autouse fixture is set up first, so torn down last)
    records = [r for when in ("setup", "call", "teardown") for r in caplog.get_records(when)]  # type: ignore[arg-type]
    files = talaria_files(tmp)
    found = scan(log_text=scanned_records(records), files=files, secret_values=secrets_of(files, MADE.hermes, PASSWORD),
                 texts=message_texts(MADE.hermes, MADE.models))  # fmt: skip
    MADE.clear()
    assert not found, "leaked: " + "; ".join(str(leak) for leak in found)


@pytest.fixture(autouse=True, scope="session")
def _structured_logs_to_pytest() -> None:
    """Route the hub's structured logs through standard logging into pytest's capture (shown on a
    failure, scanned for secrets by the acceptance tests) instead of printing them from threads."""
    configure_logging("INFO", to_stderr=False)


@pytest.fixture(scope="session")
def hermes_executable() -> Path:
    """``hermes`` from .venv-hermes (or TALARIA_HERMES_BIN); without it the test fails saying how to install it."""
    try:
        return hermes_bin()
    except HermesNotInstalled as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL 15+ per test worker, started in a temporary directory on a unix socket (scale.md 2.6). Without
    server binaries the tests using it skip with the reason, unless TALARIA_REQUIRE_POSTGRES=1 (CI): then they fail."""
    try:
        server = PostgresServer.create()
    except PostgresMissing as exc:
        if required():
            pytest.fail(f"TALARIA_REQUIRE_POSTGRES=1 and {exc}", pytrace=False)
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture
def model() -> Iterator[ModelServer]:
    """The scripted OpenAI-compatible model server on 127.0.0.1."""
    with ModelServer() as server:
        yield server


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_hub(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., HubServer]]:
    """``make_hub(**settings)`` starts a hub; every hub made is stopped at teardown."""
    made: list[HubServer] = []

    def factory(**settings: Any) -> HubServer:
        server = HubServer(tmp_path / "data", clock, **settings).start()
        made.append(server)
        return server

    yield factory
    for server in made:
        server.stop()


@pytest.fixture
def runtime_hub(make_hub: Callable[..., HubServer]) -> HubServer:
    """A hub with the Runtime API on."""
    return make_hub(runtime_api_enabled=True, runtime_api_proxy_secret=PROXY_SECRET)


def add_account(server: HubServer, username: str, role: str = "user", **kwargs: Any) -> None:
    server.hub.accounts.create(username=username, password=PASSWORD, role=role, **kwargs)


def login(server: HubServer, username: str, password: str = PASSWORD) -> httpx.Client:
    """A JSON API client signed in as ``username`` that sends Origin and the CSRF token."""
    client = server.client(headers={"Origin": server.url})
    response = client.post("/api/auth/login", json={"username": username, "password": password})
    assert response.status_code == 200, response.text
    client.headers["X-CSRF-Token"] = response.json()["csrfToken"]
    return client


def db_rows(path: Path, sql: str) -> list[dict[str, Any]]:
    """The rows of ``sql`` on a hub's SQLite file (the hub may be serving: a reader of its WAL), as dicts."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute(sql).fetchall()]
    finally:
        conn.close()
