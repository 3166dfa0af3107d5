"""``talaria.runner.gateway_rpc.RpcRules`` without sockets: ``file.attach`` with a ``path`` is refused
``runner_command_forbidden`` before any Hermes call (chat.md 3.4, amending runner-protocol.md 10.2; ADR 0033).

Hermes is faked by an object with ``HermesChannel.request``'s signature that records what it is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from talaria.clock import ManualClock
from talaria.hermes.rest import HermesRest
from talaria.hermes.ws import HermesChannel, ResultHook
from talaria.runner.errors import CommandError
from talaria.runner.gateway_channel import Channel, Ownership
from talaria.runner.gateway_rpc import RpcRules
from talaria.runner.receipts import Receipts

RUNTIME_ID = "rt-owned"
DATA_URL = "data:text/plain;base64,bm90ZXM="  # "notes"


class FakeHermes:
    """Answers every request with ``{"attached": True}`` and records (method, params)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def request(
        self, method: str, params: dict[str, Any], *, on_result: ResultHook | None = None, timeout: float = 30
    ) -> Any:
        self.sent.append((method, dict(params)))
        result = {"attached": True, "ref_text": "@file:/hermes/attachments/notes.txt"}
        if on_result is not None:
            on_result(result)
        return result


def no_rest() -> HermesRest:
    raise AssertionError("file.attach must not use Hermes' REST API")


@pytest.fixture
def receipts(tmp_path: Path) -> Iterator[Receipts]:
    found = Receipts(tmp_path / "runner-commands.sqlite3", ManualClock())
    try:
        yield found
    finally:
        found.close()


@pytest.fixture
def hermes() -> FakeHermes:
    return FakeHermes()


@pytest.fixture
def setup(receipts: Receipts, hermes: FakeHermes) -> tuple[RpcRules, Channel]:
    ownership = Ownership()
    rules = RpcRules(ownership, receipts, ("default",), no_rest)
    channel = Channel(id="c0ffee00-0000-4000-8000-000000000001", cleanup_only=False, epoch="e1")
    channel.ws = cast(HermesChannel, hermes)
    ownership.take(channel, RUNTIME_ID, "default", "20990101_000000_stored", running=False)
    return rules, channel


def call(rules: RpcRules, channel: Channel, params: dict[str, Any]) -> Any:
    return asyncio.run(rules.call(channel, "file.attach", params))


def refusal(rules: RpcRules, channel: Channel, params: dict[str, Any]) -> CommandError:
    with pytest.raises(CommandError) as info:
        call(rules, channel, params)
    return info.value


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "~/.hermes/.env", "", None, 0, [], {}],
    ids=["absolute", "home", "empty", "null", "zero", "list", "object"],
)
def test_file_attach_with_a_path_is_forbidden_and_hermes_is_not_called(
    setup: tuple[RpcRules, Channel], hermes: FakeHermes, path: Any
) -> None:
    rules, channel = setup
    for params in (
        {"session_id": RUNTIME_ID, "path": path},
        {"session_id": RUNTIME_ID, "path": path, "name": "notes.txt"},
        {"session_id": RUNTIME_ID, "data_url": DATA_URL, "name": "notes.txt", "path": path},  # with a data_url too
    ):
        error = refusal(rules, channel, params)
        assert error.code == "runner_command_forbidden", params
        assert error.reply() == {"error": {"code": "runner_command_forbidden", "message": error.message}}
        if isinstance(path, str) and path:
            assert path not in error.message  # the path is not echoed back to the hub
    assert hermes.sent == []


def test_the_path_refusal_comes_before_the_ownership_check(setup: tuple[RpcRules, Channel], hermes: FakeHermes) -> None:
    rules, channel = setup
    for session_id in ("rt-not-owned", None):
        error = refusal(rules, channel, {"session_id": session_id, "path": "/etc/shadow"})
        assert error.code == "runner_command_forbidden"
    error = refusal(rules, channel, {"path": "/etc/shadow"})  # no session at all
    assert error.code == "runner_command_forbidden"
    # without a path, an unowned session is the ownership rule's refusal, as for every other method
    assert refusal(rules, channel, {"session_id": "rt-not-owned", "data_url": DATA_URL}).code == (
        "runner_session_forbidden"
    )
    assert hermes.sent == []


def test_the_path_refusal_comes_before_the_closed_channel_check(
    setup: tuple[RpcRules, Channel], hermes: FakeHermes
) -> None:
    rules, channel = setup
    channel.closed = True
    assert refusal(rules, channel, {"session_id": RUNTIME_ID, "path": "/etc/passwd"}).code == (
        "runner_command_forbidden"
    )
    assert refusal(rules, channel, {"session_id": RUNTIME_ID, "data_url": DATA_URL}).code == (
        "runner_connection_closed"
    )
    assert hermes.sent == []


def test_file_attach_with_a_data_url_and_a_name_is_relayed_unchanged(
    setup: tuple[RpcRules, Channel], hermes: FakeHermes
) -> None:
    rules, channel = setup
    params = {"session_id": RUNTIME_ID, "data_url": DATA_URL, "name": "notes.txt"}
    assert call(rules, channel, params) == {"attached": True, "ref_text": "@file:/hermes/attachments/notes.txt"}
    assert hermes.sent == [("file.attach", params)]
