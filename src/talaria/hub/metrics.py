"""Prometheus metrics of one hub process (a registry per app, never the global one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from talaria.hub.runners.transport import RunnerTransport


class HubMetrics:
    def observe_request(self, path: str, status: int, elapsed_s: float) -> str:
        """Count one answered request by door (runtime, api, other); returns the door."""
        door = "runtime" if path.startswith("/internal/") else "api" if path.startswith("/api/") else "other"
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
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=self.registry,
        )  # fmt: skip
        self.wake_fallback = Counter(
            "talaria_wake_fallback", "Waits ended by the fallback query, not a notification (PostgreSQL, scale.md 3.3)",
            ["channel"], registry=self.registry,
        )  # fmt: skip

    def watch_runners(self, runners: RunnerTransport) -> None:
        self.runners_online.set_function(runners.connected_count)
        self.commands_pending.set_function(runners.pending_count)

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
