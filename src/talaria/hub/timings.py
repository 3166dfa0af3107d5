"""The hub's fixed timings that tests shorten: one frozen value passed to ``open_hub`` (and so to
``create_app`` and ``HubServer``), so a test awaits the event it means instead of waiting out a real 30 s.

Production always uses the defaults, which are the values the specifications pin; none is a setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from talaria.hub.runners import limits


@dataclass(frozen=True)
class HubTimings:
    # a command's deadline (runner-protocol.md 6.1, 14) and grant.bind's
    command_deadline_s: float = limits.COMMAND_DEADLINE_S
    grant_bind_deadline_s: float = limits.GRANT_BIND_DEADLINE_S
    # the dispatcher's scan when nothing woke it
    dispatcher_scan_s: float = 1.0
    # team tools' reconciler: a pass at least this often, and at once on a signal (team-tools.md 4.1)
    team_reconcile_s: float = 1.0
    # the wait before the dispatcher retries a transiently failed heartbeat (ADR 0020)
    heartbeat_retry_s: float = 1.0
    # how often a turn re-checks its account and renews its grant (runner-protocol.md 12.1, ADR 0021)
    grant_renew_s: float = 300.0
    # before anything was submitted: the pause before a job's turn is tried again on its runner, and how often
    # the dispatcher checks that an offline runner is back
    pre_submit_retry_s: float = 1.0
    runner_back_check_s: float = 0.2
    # a node whose Hermes was unavailable: the first pause before its Hermes is asked again, and the longest
    # (the pause doubles; ADR 0030)
    hermes_retry_s: float = 5.0
    hermes_retry_max_s: float = 60.0
    # a chat event stream's silence before its ``: keepalive`` comment and session check (chat.md 4.1)
    chat_keepalive_s: float = 15.0
    # a PostgreSQL replica's renewal of its row and role leases, and how often it compares its clock with the
    # database server's (scale.md 1, 3.6)
    replica_renew_s: float = 5.0
    replica_clock_check_s: float = 60.0
    # a PostgreSQL replica's renewal of the leases of the chat turns it drives (scale.md 4.3: TTL 30 s)
    turn_lease_renew_s: float = 10.0
