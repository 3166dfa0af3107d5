"""A password-protected (gated) Hermes: the runner logs in with ``hermesCredentials``, uses a fresh WebSocket
ticket per channel, and the password never reaches a log line, an error, a file or a hub request (hermes.md 3)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.hub.runners import machine_api
from talaria.hub.turns.driver import TurnResult
from talaria.testing.model_server import ModelServer, ToolSelector, reply, tool_call, when
from talaria.testing.real_hermes import RealHermes
from tests.hermes.conftest import Node, running_node

PASSWORD = "pw-" + secrets.token_urlsafe(18)


@pytest.fixture
def seen_by_hub(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every machine-API request the hub receives: its headers and body, raw."""
    seen: list[bytes] = []
    original = machine_api.serve

    async def tap(hub: Any, scope: Any, receive: Any, send: Any) -> None:
        seen.append(b"\n".join(name + b": " + value for name, value in scope["headers"]))

        async def recording() -> Any:
            message = await receive()
            seen.append(message.get("body", b""))
            return message

        await original(hub, scope, recording, send)

    monkeypatch.setattr(machine_api, "serve", tap)
    return seen


@pytest.fixture
def gated(tmp_path: Path, model: ModelServer, hermes_executable: Path, seen_by_hub: list[bytes]) -> Iterator[Node]:
    basic = f'dashboard:\n  basic_auth:\n    username: operator\n    password: "{PASSWORD}"\n'
    with RealHermes(tmp_path / "hermes", model.base_url, host="0.0.0.0", config_extra=basic) as hermes:
        status = httpx.get(f"{hermes.url}/api/status", timeout=5).json()
        assert status["auth_required"] is True
        with running_node(
            tmp_path, hermes, model, hermesCredentials={"username": "operator", "password": PASSWORD}
        ) as made:
            yield made


def test_the_runner_logs_in_and_the_password_goes_nowhere(
    gated: Node, tmp_path: Path, seen_by_hub: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    gated.model.script(when("gated hello", tool_call(ToolSelector("team_", "talaria_whoami"), {}), reply("gated ok")))
    result = gated.turn("gated hello")
    assert isinstance(result, TurnResult), result
    assert result.text == "gated ok"
    tool_messages = [m for r in gated.model.chat_requests() for m in r.body["messages"] if m.get("role") == "tool"]
    assert json.loads(tool_messages[-1]["content"])["account"] == "alice"  # the plugin bound through the cookie
    secret = PASSWORD.encode()
    assert seen_by_hub and not any(secret in chunk for chunk in seen_by_hub)
    assert PASSWORD not in caplog.text
    gated.runner.assert_silent_about(PASSWORD)
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path
    for path in (tmp_path / "node" / "state").rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path


def test_a_wrong_password_is_hermes_unavailable_without_the_password(
    tmp_path: Path, model: ModelServer, hermes_executable: Path
) -> None:
    basic = f'dashboard:\n  basic_auth:\n    username: operator\n    password: "{PASSWORD}"\n'
    wrong = "wrong-" + secrets.token_urlsafe(12)
    with RealHermes(tmp_path / "hermes", model.base_url, host="0.0.0.0", config_extra=basic) as hermes:
        credentials = {"username": "operator", "password": wrong}
        with running_node(tmp_path, hermes, model, hermesCredentials=credentials) as node:
            answer = node.call(node.server.hub.channels.open_gateway(node.runner_id, node.account()))
            assert getattr(answer, "code", None) == "hermes_unavailable", answer
            assert "401" in answer.message and wrong not in answer.message and PASSWORD not in answer.message
            node.runner.assert_silent_about(wrong, PASSWORD)
