"""Prometheus metrics of one hub process (a registry per app, never the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest


class HubMetrics:
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

    def on_signal(self, signal: str, job_id: str) -> None:
        self.job_signals.labels(signal).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
