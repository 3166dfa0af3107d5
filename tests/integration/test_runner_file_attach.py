"""``file.attach`` with a ``path`` is refused by the runner (chat.md 3.4, amending runner-protocol.md 10.2; ADR 0033),
as a real ``talaria runner`` process against a real hub and the Hermes fixture.

The hub relays ``gateway.rpc`` params unchanged, so it stands in for a compromised hub here: it sends ``path`` values
naming a file of the node. The runner answers ``runner_command_forbidden`` (a runner-reported code: 502 on the hub,
runner-protocol.md 14) and stores that outcome as its receipt; the Hermes fixture, which would copy any readable
file named by ``path``, never receives the call. ``file.attach {session_id, data_url, name}`` still reaches Hermes.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from talaria.clock import SystemClock
from talaria.errors import TalariaError
from talaria.hub.runners.connection_state import AccountRef, Gateway
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from tests.conftest import add_account
from tests.integration.runner_support import RunnerProcess, register_node

CONNECTED = "runner connected"
STOPPED = "runner stopped"
SECRET = b"the node's own secret\n"


@dataclass
class Node:
    server: HubServer
    hermes: HermesFixture
    tmp: Path
    config_path: Path
    runner_id: str
    secret: Path

    @property
    def receipts_path(self) -> Path:
        return self.config_path.parent / "state" / self.runner_id / "runner-commands.sqlite3"

    def account(self) -> AccountRef:
        found = self.server.hub.accounts.get("alice")
        assert found is not None
        return AccountRef(found.username, found.tenant, found.auth_version)

    def open(self) -> Gateway:
        gateway: Gateway = self.server.call(self.server.hub.channels.open_gateway(self.runner_id, self.account()))
        return gateway

    def rpc(self, gateway: Gateway, method: str, params: dict[str, Any]) -> Any:
        return self.server.call(self.server.hub.channels.rpc(gateway, method, params))

    def stored_errors(self) -> list[dict[str, Any]]:
        """The ``error`` of every completed receipt, as the runner stored and posted it."""
        conn = sqlite3.connect(self.receipts_path)
        try:
            found = conn.execute("SELECT state, result FROM commands").fetchall()
        finally:
            conn.close()
        replies = [json.loads(result) for state, result in found if state == "complete" and result is not None]
        return [reply["error"] for reply in replies if "error" in reply]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    secret = tmp_path / "node-secret.txt"
    secret.write_bytes(SECRET)
    with HermesFixture() as hermes:
        server = HubServer(tmp_path / "data", SystemClock()).start()
        try:
            add_account(server, "alice", allowed_profiles={"local": ["default"]})
            path = register_node(server, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token)
            runner_id = json.loads(path.read_text(encoding="utf-8"))["runnerId"]
            yield Node(server, hermes, tmp_path, path, runner_id, secret)
        finally:
            server.stop()


def test_file_attach_with_a_path_is_refused_before_hermes_and_a_data_url_is_relayed(node: Node) -> None:
    runner = RunnerProcess(node.config_path, node.tmp / "logs", "runner")
    try:
        runner.wait_for(CONNECTED)
        gateway = node.open()
        created = node.rpc(gateway, "session.create", {"close_on_disconnect": False})
        runtime_id = created["session_id"]
        data_url = "data:text/plain;base64," + base64.b64encode(b"notes").decode()

        refused = [
            {"session_id": runtime_id, "path": str(node.secret)},
            {"session_id": runtime_id, "path": str(node.secret), "name": "notes.txt"},
            {"session_id": runtime_id, "data_url": data_url, "name": "notes.txt", "path": str(node.secret)},
            {"session_id": runtime_id, "path": ""},
            {"session_id": runtime_id, "path": None},
        ]
        for params in refused:
            with pytest.raises(TalariaError) as info:
                node.rpc(gateway, "file.attach", params)
            assert (info.value.code, info.value.status) == ("runner_command_forbidden", 502), params
            assert str(node.secret) not in info.value.message
        # Each refusal was answered before the next command was sent, and the runner answers a Hermes call only
        # after Hermes answered it: a refused call that had reached Hermes would already be in its log.
        assert node.hermes.rpc_requests("file.attach") == []
        assert node.hermes.attachments() == []
        errors = node.stored_errors()
        assert len(errors) == len(refused)
        assert {error["code"] for error in errors} == {"runner_command_forbidden"}

        good = {"session_id": runtime_id, "data_url": data_url, "name": "notes.txt"}
        attached = node.rpc(gateway, "file.attach", good)
        assert attached["attached"] is True and attached["uploaded"] is True
        assert attached["ref_text"].startswith("@file:") and str(node.secret) not in attached["ref_text"]
        assert Path(attached["path"]).read_bytes() == b"notes"
        assert [r.params for r in node.hermes.rpc_requests("file.attach")] == [good]
        assert [(a["kind"], a["name"]) for a in node.hermes.attachments()] == [("file", "notes.txt")]

        node.server.call(node.server.hub.channels.close_gateway(gateway))
        assert runner.stop() == 0, runner.stderr
        assert runner.lines[-1] == STOPPED
    finally:
        runner.close()
