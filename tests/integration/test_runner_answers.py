"""The runner answers every command it began (runner-protocol.md 9; ADR 0019), as a real ``talaria runner``
process against a real hub and the Hermes fixture:

- a Hermes answer holding NaN or Infinity (which canonical JSON refuses) reaches the hub as 502
  ``runner_reply_unrepresentable``, is stored as that error, and the runner runs on;
- a receipt the disk refuses (the process's file-size limit, so SQLite's write really fails) still posts the
  command's outcome, then stops the runner with ``runner: receipts_failed: …`` and exit status 4.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import sys
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
from tests.integration.runner_support import RunnerProcess, outcome, register_node, send

CONNECTED = "runner connected"
STOPPED = "runner stopped"
EXIT_RECEIPTS_FAILED = 4


def limited_argv(config_path: Path, max_file_bytes: int) -> list[str]:
    """``talaria runner`` whose files may grow to at most ``max_file_bytes`` (RLIMIT_FSIZE): SQLite then
    really fails to write a larger receipt."""
    launcher = (
        "import os, resource, sys\n"
        "hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({max_file_bytes}, hard))\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'talaria', 'runner', '--config', sys.argv[1]])\n"
    )
    return [sys.executable, "-c", launcher, str(config_path)]


@dataclass
class Node:
    server: HubServer
    hermes: HermesFixture
    tmp: Path
    config_path: Path
    runner_id: str

    @property
    def receipts_path(self) -> Path:
        return self.config_path.parent / "state" / self.runner_id / "runner-commands.sqlite3"

    def account(self) -> AccountRef:
        found = self.server.hub.accounts.get("alice")
        assert found is not None
        return AccountRef(found.username, found.tenant, found.auth_version)

    def rows(self) -> dict[str, tuple[str, Any]]:
        conn = sqlite3.connect(self.receipts_path)
        try:
            found = conn.execute("SELECT id, state, result FROM commands").fetchall()
        finally:
            conn.close()
        return {cid: (state, None if result is None else json.loads(result)) for cid, state, result in found}


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    configs: dict[str, Any] | None = getattr(request, "param", None)
    with HermesFixture(configs=configs) as hermes:
        server = HubServer(tmp_path / "data", SystemClock()).start()
        try:
            add_account(server, "alice", allowed_profiles={"local": ["default"]})
            path = register_node(server, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token)
            runner_id = json.loads(path.read_text(encoding="utf-8"))["runnerId"]
            yield Node(server, hermes, tmp_path, path, runner_id)
        finally:
            server.stop()


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "infinity"])
def test_a_hermes_answer_holding_nan_or_infinity_reaches_the_hub_as_runner_reply_unrepresentable(
    node: Node, value: float
) -> None:
    runner = RunnerProcess(node.config_path, node.tmp / "logs", "runner")
    try:
        runner.wait_for(CONNECTED)
        channels = node.server.hub.channels
        gateway: Gateway = node.server.call(channels.open_gateway(node.runner_id, node.account()))
        created = node.server.call(channels.rpc(gateway, "session.create", {"close_on_disconnect": False}))
        runtime_id = created["session_id"]
        state = node.hermes._state
        with state.cond:
            state.live[runtime_id].usage["cost"] = value  # type: ignore[assignment]  # Hermes sends it as NaN/Infinity

        with pytest.raises(TalariaError) as info:
            node.server.call(channels.rpc(gateway, "session.usage", {"session_id": runtime_id}), timeout=45)
        assert (info.value.code, info.value.status) == ("runner_reply_unrepresentable", 502), info.value.message
        stored = [r for r in node.rows().values() if r[1] and "error" in r[1]]
        assert stored == [
            ("complete", {"error": {"code": "runner_reply_unrepresentable", "message": info.value.message}})
        ]

        # Not a receipts failure: the runner runs on and answers the next command.
        with state.cond:
            state.live[runtime_id].usage["cost"] = 0
        usage = node.server.call(channels.rpc(gateway, "session.usage", {"session_id": runtime_id}))
        assert usage["cost"] == 0
        node.server.call(channels.close_gateway(gateway))
        assert runner.stop() == 0, runner.stderr
        assert runner.lines[-1] == STOPPED
    finally:
        runner.close()


LARGE_CONFIG = {"default": {"padding": "x" * (2 << 20)}}  # its reply, base64, is about 2.7 MiB


@pytest.mark.parametrize("node", [LARGE_CONFIG], indirect=True)
def test_a_receipt_the_disk_refuses_stops_the_runner_with_exit_4_after_posting_the_outcome(node: Node) -> None:
    argv = limited_argv(node.config_path, 1 << 20)
    runner = RunnerProcess(node.config_path, node.tmp / "logs", "limited", argv=argv)
    try:
        runner.wait_for(CONNECTED)
        task = send(node.server, node.runner_id, {"path": "/api/config", "method": "GET", "search": "?profile=default"})
        reply = outcome(node.server, task, timeout=40)
        assert isinstance(reply, dict), reply
        assert reply["status"] == 200
        assert json.loads(base64.b64decode(reply["body"])) == LARGE_CONFIG["default"], "the outcome reached the hub"

        assert runner.wait(20) == EXIT_RECEIPTS_FAILED, runner.stderr
        lines = runner.lines
        assert lines[-1] == STOPPED, runner.stderr
        failed = [line for line in lines if line.startswith("runner: receipts_failed: ")]
        assert len(failed) == 1, runner.stderr
        assert str(node.receipts_path) in failed[0]
        assert "disk I/O error" in failed[0] or "disk is full" in failed[0], failed[0]
        assert "Traceback" not in runner.stderr, runner.stderr
        states = {state for state, _ in node.rows().values()}
        assert states == {"started"}, "never stored: uncertain after a restart, never replayed"
        summary = node.server.hub.runners.summary(node.runner_id)
        assert summary["connectedAt"] is None, "the stopping runner said goodbye"
    finally:
        runner.close()
