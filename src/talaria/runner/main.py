"""``talaria runner --config PATH`` (runner-protocol.md 3, operations.md 2.3). SIGTERM and SIGINT stop it gracefully,
SIGQUIT drains it (operations.md 3.3). Exit 0 after a stop or a drain, 1 on an
unexpected failure, 2 for an invalid configuration, a state directory in use or a receipts file that cannot be
opened, 3 on a terminal refusal by the hub (a service manager does not restart it), 4 when a receipt cannot be
written while running (ADR 0019)."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from pathlib import Path

from talaria.clock import SystemClock
from talaria.runner.agent import DRAIN_TIMEOUT_S, Agent
from talaria.runner.config import load_config
from talaria.runner.credential import CredentialError, CredentialFile
from talaria.runner.receipts import Receipts, ReceiptsError
from talaria.runner.state_dir import StateDir, StateDirError
from talaria.runner.status_log import StatusLog
from talaria.runner_json import ConfigError


@dataclass(frozen=True)
class Options:
    """The runner options of the command line (operations.md 3.3, 5.2, 5.3)."""

    drain_timeout_s: float = DRAIN_TIMEOUT_S
    log_format: str = "text"
    metrics_listen: tuple[str, int] | None = None


def run_runner(config_path: Path, options: Options | None = None) -> int:
    """Run until stopped; ``runner stopped`` is the last line of every exit (runner-protocol.md 3)."""
    options = options or Options()
    status = StatusLog(options.log_format)
    try:
        return _run(config_path, options, status)
    finally:
        status.say("runner stopped")


def _run(config_path: Path, options: Options, status: StatusLog) -> int:
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        status.say(f"talaria runner: {exc}", event="runner_config_invalid")
        return 2
    status.runner_id = config.runner_id
    try:
        state = StateDir.open(config_path, config.runner_id)
    except StateDirError as exc:
        status.say(f"talaria runner: {exc}", event="runner_state_dir_refused")
        return 2
    for changed in state.tightened:
        status.say(f"talaria runner: made {changed} private (mode 0600)", event="runner_state_file_tightened")
    try:
        try:
            credential = CredentialFile.open(state.path, config.token)
        except CredentialError as exc:
            status.say(f"talaria runner: {exc}", event="runner_credential_invalid")
            return 2
        clock = SystemClock()
        try:
            receipts = Receipts(state.receipts_path, clock)
        except ReceiptsError as exc:
            status.say(f"talaria runner: {exc}", event="runner_receipts_refused")
            return 2
        with receipts:
            agent = Agent(config, receipts, clock, drain_timeout_s=options.drain_timeout_s, credential=credential,
                          log_format=options.log_format, metrics_listen=options.metrics_listen)  # fmt: skip
            return asyncio.run(_serve(config_path, agent))
    finally:
        state.close()


async def _serve(config_path: Path, agent: Agent) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.request_stop)
    loop.add_signal_handler(signal.SIGQUIT, agent.request_drain)
    return await agent.run()
