"""Prometheus metrics of one hub process (a registry per app, never the global one); operations.md 5.1.

No label takes unbounded values (runner, job, tenant or account ids): those belong to logs and the API. Values that
cost a store read (jobs per state, unsealed audit events) are read at most every 5 s, at a scrape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from talaria.errors import TalariaError
from talaria.lifecycle.machine import JobState

if TYPE_CHECKING:
    from talaria.hub.replica import Replica
    from talaria.hub.runners.transport import RunnerTransport
    from talaria.store.interface import Store

log = structlog.get_logger("talaria.hub")
READ_EVERY_S = 5.0  # operations.md 5.1: gauges that cost a store read are read at most this often
RUNNER_PREFIX = "/api/runner/"


class Cached:
    """A value read at most every ``READ_EVERY_S`` seconds (the last one when a read fails)."""

    def __init__(self, read: Callable[[], dict[str, float]], monotonic: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._monotonic = monotonic
        self._value: dict[str, float] = {}
        self._at: float | None = None

    def get(self) -> dict[str, float]:
        now = self._monotonic()
        if self._at is None or now - self._at >= READ_EVERY_S:
            self._at = now
            try:
                self._value = self._read()
            except TalariaError as exc:  # a scrape never fails on the store: the last value stays
                log.warning("metrics_read_failed", code=exc.code)
        return self._value


class _Family(Collector):
    """One gauge family whose samples come from a function at each scrape."""

    def __init__(
        self, name: str, documentation: str, label: str | None, values: Callable[[], dict[str, float]]
    ) -> None:
        self._name, self._documentation, self._label, self._values = name, documentation, label, values

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._documentation, labels=[self._label] if self._label else None)
        for key, value in sorted(self._values().items()):
            family.add_metric([key] if self._label else [], value)
        yield family


def jobs_by_state(store: Store) -> dict[str, float]:
    counts: dict[str, float] = {state.value: 0 for state in JobState}
    with store.read() as tx:
        for row in tx.all("job_count_by_state"):
            counts[str(row["state"])] = int(row["n"])
    return counts


class HubMetrics:
    def observe_request(self, path: str, status: int, elapsed_s: float) -> str:
        """Count one answered request by door (runtime, runner, api, other); returns the door."""
        if path.startswith("/internal/"):
            door = "runtime"
        elif path.startswith(RUNNER_PREFIX):
            door = "runner"  # the machine API's 15 s polls would distort the API's latency
        elif path.startswith("/api/"):
            door = "api"
        else:
            door = "other"
        self.requests.labels(door, str(status)).inc()
        self.latency.labels(door).observe(elapsed_s)
        return door

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "talaria_http_requests", "HTTP requests answered", ["door", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "talaria_http_request_seconds", "HTTP request latency", ["door"], registry=self.registry
        )
        self.job_signals = Counter(
            "talaria_job_signals", "Committed job lifecycle signals", ["signal"], registry=self.registry
        )
        self.security_events = Counter(
            "talaria_runtime_rejections", "Runtime API rejections", ["code"], registry=self.registry
        )

        self.runner_commands = Counter(
            "talaria_runner_commands", "Runner commands by outcome", ["outcome"], registry=self.registry
        )
        self.runner_roundtrip = Histogram(
            "talaria_runner_command_seconds",
            "Round trip of a runner command, enqueue to result",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.team_tool_calls = Counter(
            "talaria_team_tool_calls", "Team tool calls by tool and outcome (applied, replayed, refused)",
            ["tool", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.runners_online = Gauge("talaria_runners_online", "Runners with a connection state", registry=self.registry)
        self.commands_pending = Gauge("talaria_runner_commands_pending", "Commands queued", registry=self.registry)
        self.audit_seal_lag = Histogram(
            "talaria_audit_seal_lag_seconds", "PostgreSQL: an audit event's time from occurring to its seal",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=None,
        )  # fmt: skip
        self.wake_fallback = Counter(
            "talaria_wake_fallback", "Waits ended by the fallback query, not a notification (PostgreSQL, scale.md 3.3)",
            ["channel"], registry=None,
        )  # fmt: skip
        self.notify_sent = Counter("talaria_notify_sent", "pg_notify calls sent by channel", ["channel"], registry=None)
        # the three above are registered by watch_postgres: on SQLite they would only ever read 0

        self.build_info = Gauge("talaria_build_info", "This hub's build (always 1)", ["version", "backend", "replica"],
                                registry=self.registry)  # fmt: skip
        self.turns_running = Gauge("talaria_dispatcher_turns_running", "Job turns this hub's dispatcher runs",
                                   registry=self.registry)  # fmt: skip
        self.runners_draining = Gauge("talaria_runners_draining", "Runners whose connection drains",
                                      registry=self.registry)  # fmt: skip
        self.polls_held = Gauge("talaria_runner_polls_held", "Runner polls this hub holds", registry=self.registry)
        self.hub_draining = Gauge("talaria_hub_draining", "1 while this hub drains for a restart",
                                  registry=self.registry)  # fmt: skip
        self.store_seconds = Histogram(
            "talaria_store_transaction_seconds", "A store transaction's time, from asking to its end", ["mode"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15),
            registry=self.registry,
        )  # fmt: skip
        self.store_unavailable = Counter("talaria_store_unavailable", "Store transactions that ended unavailable",
                                         registry=self.registry)  # fmt: skip
        self.token_rotations = Counter("talaria_runner_token_rotations", "Runner tokens rotated (next promoted)",
                                       registry=self.registry)  # fmt: skip

    def watch_runners(self, runners: RunnerTransport) -> None:
        self.runners_online.set_function(runners.connected_count)
        self.commands_pending.set_function(runners.pending_count)
        self.runners_draining.set_function(runners.draining_count)
        self.polls_held.set_function(runners.held_count)

    def watch_store(self, store: Store) -> None:
        """Every transaction of ``store`` is timed, and jobs are counted by state at a scrape."""
        store.observe = self.observe_transaction
        jobs = Cached(lambda: jobs_by_state(store))
        self.registry.register(_Family("talaria_jobs", "Jobs by state (read at most every 5 s)", "state", jobs.get))

    def watch_hub(self, version: str, backend: str, replica: str, running: Callable[[], int],
                  draining: Callable[[], bool]) -> None:  # fmt: skip
        self.build_info.labels(version, backend, replica).set(1)
        self.turns_running.set_function(running)
        self.hub_draining.set_function(lambda: float(draining()))

    def watch_postgres(self, pool: Callable[[], dict[str, int]], replica: Replica, roles: tuple[str, ...],
                       unsealed: Callable[[], dict[str, float]]) -> None:  # fmt: skip
        """The PostgreSQL-only metrics of operations.md 5.1."""
        for metric in (self.audit_seal_lag, self.wake_fallback, self.notify_sent):
            self.registry.register(metric)
        self.registry.register(_Family("talaria_db_pool_connections", "The store pool's connections by state", "state",
                                       lambda: {k: float(v) for k, v in pool().items()}))  # fmt: skip
        self.registry.register(_Family("talaria_role_lease_held", "1 while this replica holds the role", "role",
                                       lambda: {role: float(replica.holds(role)) for role in roles}))  # fmt: skip
        cached = Cached(unsealed)
        self.registry.register(_Family("talaria_audit_unsealed", "Audit events waiting for the sealer", None,
                                       lambda: {"": cached.get().get("n", 0.0)}))  # fmt: skip
        self.registry.register(_Family("talaria_clock_skew_seconds", "This host's clock minus the server's, last seen",
                                       None, lambda: {"": (replica.last_skew_ms or 0) / 1000}))  # fmt: skip

    def observe_notify(self, channel: str) -> None:
        self.notify_sent.labels(channel).inc()

    def observe_transaction(self, mode: str, seconds: float, unavailable: bool) -> None:
        self.store_seconds.labels(mode).observe(seconds)
        if unavailable:
            self.store_unavailable.inc()

    def observe_rotation(self) -> None:
        self.token_rotations.inc()

    def observe_command(self, outcome: str, seconds: float | None) -> None:
        self.runner_commands.labels(outcome).inc()
        if seconds is not None:
            self.runner_roundtrip.observe(seconds)

    def observe_fallback_wake(self, channel: str) -> None:
        self.wake_fallback.labels(channel).inc()

    def observe_team_call(self, tool: str, outcome: str) -> None:
        self.team_tool_calls.labels(tool, outcome).inc()

    def on_signal(self, signal: str, job_id: str) -> None:
        self.job_signals.labels(signal).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
