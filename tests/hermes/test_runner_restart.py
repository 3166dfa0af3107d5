"""A runner killed during a turn and restarted: the turn is reported uncertain, the prompt reached the model
exactly once, and nothing is replayed (runner-protocol.md 9, 13; hermes.md 11)."""

from __future__ import annotations

import time

from talaria.errors import TalariaError
from talaria.testing.model_server import slow, when
from tests.hermes.conftest import Node
from tests.integration.runner_support import RunnerProcess, outcome, wait_until


def test_a_killed_runner_leaves_the_turn_uncertain_and_never_replays_the_prompt(node: Node) -> None:
    node.model.script(when("survive this", slow("still thinking " * 20, first_byte_delay_s=1.0, chunk_delay_s=0.1)))
    task = node.spawn_turn("survive this", tools=False)
    node.model.wait_for(lambda log: any("survive this" in (r.last_user or "") for r in log), timeout=60)
    marker = next(r.last_user for r in node.model.chat_requests() if "survive this" in (r.last_user or ""))
    node.runner.proc.kill()  # SIGKILL mid-turn: no goodbye, no receipts completed
    node.runner.proc.wait(10)
    restarted = RunnerProcess(node.config_path, node.runner.err_path.parent, name="runner-2")
    try:
        restarted.wait_for("runner connected")
        result = outcome(node.server, task, timeout=60)
        assert isinstance(result, TalariaError) and result.code == "runner_command_uncertain", result
        # Hermes finishes the detached turn on its own; nobody submits the prompt again
        deadline = time.monotonic() + 6  # a window in which a replay would show
        while time.monotonic() < deadline and node.model.turn_starts(marker or "") == 1:
            time.sleep(0.5)
        assert marker and node.model.turn_starts(marker) == 1
        wait_until(lambda: node.server.hub.runners.is_connected(node.runner_id), what="the new connection")
        assert node.server.hub.runners.pending_wires(node.runner_id) == []
        restarted.assert_silent_about(node.hermes.session_token)
    finally:
        restarted.stop()
        restarted.close()
