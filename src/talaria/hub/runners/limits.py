"""Hub-side limits of runner protocol v1 (runner-protocol.md 14), each with the code it produces."""

from __future__ import annotations

from typing import Final

MIB: Final = 1024 * 1024
MAX_PENDING_COMMANDS: Final = 64  # 429 runner_busy
MAX_PENDING_BYTES: Final = 64 * MIB  # 429 runner_busy
MAX_COMMAND_BYTES: Final = 36 * MIB  # 413 runner_payload_limit
MAX_BATCH_BYTES: Final = 38 * MIB  # the rest waits for the next poll
MAX_POST_BYTES: Final = 16 * MIB  # 413 runner_payload_limit
MAX_RPC_PARAMS_BYTES: Final = 15 * MIB  # 413 runner_payload_limit (Hermes takes messages below 16 MiB)
MAX_RETIRED_INSTANCES: Final = 256  # 409 runner_instance_limit
MAX_TOOL_CALLS_PER_GRANT: Final = 128  # 429 runner_call_limit
MAX_ERROR_MESSAGE_CHARS: Final = 1000  # cut
COMMAND_DEADLINE_S: Final = 30  # 504 runner_command_uncertain / 503 runner_offline
GRANT_BIND_DEADLINE_S: Final = 70
REDELIVERY_S: Final = 5  # delivered again
POLL_HOLD_S: Final = 15  # empty batch
WATCHDOG_PERIOD_S: Final = 5
OFFLINE_AFTER_S: Final = 35  # disconnect, 503 runner_offline
ONLINE_WITHIN_S: Final = 35  # summary "online"
# echoed in X-Hub-Features
FEATURES: Final = frozenset({"team-tools-v1", "export-v1", "failover-v1", "drain-v1", "rotate-v1", "trace-v1"})
MAX_EVENT_SEQ: Final = 2**53 - 1  # failover-v1's per-connection event numbers (JSON-safe integers)


def accepted_features(offered: str | None) -> frozenset[str]:
    """The names of ``X-Runner-Features`` this hub implements (what a poll answer echoes)."""
    if offered is None:
        return frozenset()
    return frozenset(name.strip() for name in offered.split(",")) & FEATURES


STOP_CLASS_RPCS: Final = frozenset({"session.interrupt", "session.close", "session.active_list"})
