"""``talaria runner --config PATH`` (runner-protocol.md 3, operations.md 2.3). SIGTERM and SIGINT stop it gracefully,
SIGQUIT drains it (operations.md 3.3). Exit 0 after a stop or a drain, 1 on an
unexpected failure, 2 for an invalid configuration, a state directory in use or a receipts file that cannot be
opened, 3 on a terminal refusal by the hub (a service manager does not restart it), 4 when a receipt cannot be
written while running (ADR 0019)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from talaria.clock import SystemClock
from talaria.runner.agent import DRAIN_TIMEOUT_S, Agent
from talaria.runner.config import load_config
from talaria.runner.credential import CredentialError, CredentialFile
from talaria.runner.receipts import Receipts, ReceiptsError
from talaria.runner.state_dir import StateDir, StateDirError
from talaria.runner_json import ConfigError


def run_runner(config_path: Path, *, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> int:
    """Run until stopped; ``runner stopped`` is the last line of every exit (runner-protocol.md 3)."""
    try:
        return _run(config_path, drain_timeout_s)
    finally:
        print("runner stopped", file=sys.stderr, flush=True)


def _run(config_path: Path, drain_timeout_s: float) -> int:
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"talaria runner: {exc}", file=sys.stderr)
        return 2
    try:
        state = StateDir.open(config_path, config.runner_id)
    except StateDirError as exc:
        print(f"talaria runner: {exc}", file=sys.stderr)
        return 2
    for changed in state.tightened:
        print(f"talaria runner: made {changed} private (mode 0600)", file=sys.stderr)
    try:
        try:
            credential = CredentialFile.open(state.path, config.token)
        except CredentialError as exc:
            print(f"talaria runner: {exc}", file=sys.stderr)
            return 2
        clock = SystemClock()
        try:
            receipts = Receipts(state.receipts_path, clock)
        except ReceiptsError as exc:
            print(f"talaria runner: {exc}", file=sys.stderr)
            return 2
        with receipts:
            agent = Agent(config, receipts, clock, drain_timeout_s=drain_timeout_s, credential=credential)
            return asyncio.run(_serve(config_path, agent))
    finally:
        state.close()


async def _serve(config_path: Path, agent: Agent) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.request_stop)
    loop.add_signal_handler(signal.SIGQUIT, agent.request_drain)
    return await agent.run()
