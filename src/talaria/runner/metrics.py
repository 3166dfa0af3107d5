"""The runner's own metrics (operations.md 5.2), written in Prometheus' text exposition format with the standard
library: ``prometheus_client`` stays out of the runner (DESIGN.md 6, the import-rule test).

Names start with ``talaria_node_``, never colliding with the hub's ``talaria_runner_*``. Label values are bounded: a
command kind the runner does not execute is ``other``, an outcome is ``ok`` or a reply's code (``other`` when it is not
a short lower-case code), a disconnect reason an error code or ``transport``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


def bounded_code(value: str) -> str:
    """A code as a label value, or ``other``: no label takes unbounded values (operations.md 5.1)."""
    return value if _CODE.match(value) else "other"


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{name}="{_label_value(value)}"' for name, value in pairs)
    return "{" + body + "}" if body else ""


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        for index, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.counts[index] += 1


@dataclass(frozen=True)
class Gauges:
    """What the runner's state says at a scrape; None: not known (no sample is written)."""

    connected: bool
    draining: bool
    hermes_up: bool | None
    gateway_channels: int
    grants: int
    token_age_seconds: float | None


class NodeMetrics:
    def __init__(self, version: str, kinds: Iterable[str], protocol: int = 1) -> None:
        """``kinds``: the command kinds the runner executes (any other is counted as ``other``)."""
        self.version = version
        self.kinds = frozenset(kinds)
        self.protocol = protocol
        self.epoch_changes = 0
        self.disconnects: dict[str, int] = {}
        self.polls: dict[str, int] = {}
        self.commands: dict[tuple[str, str], int] = {}
        self.command_seconds: dict[str, Histogram] = {}

    def epoch_changed(self) -> None:
        self.epoch_changes += 1

    def disconnected(self, reason: str) -> None:
        key = bounded_code(reason)
        self.disconnects[key] = self.disconnects.get(key, 0) + 1

    def polled(self, outcome: str) -> None:
        key = bounded_code(outcome)
        self.polls[key] = self.polls.get(key, 0) + 1

    def command_done(self, kind: object, outcome: str, seconds: float) -> None:
        """One command answered: ``outcome`` is ``ok`` or the reply's code; ``seconds`` from receipt to reply."""
        label = kind if isinstance(kind, str) and kind in self.kinds else "other"
        key = (label, bounded_code(outcome))
        self.commands[key] = self.commands.get(key, 0) + 1
        self.command_seconds.setdefault(label, Histogram()).observe(seconds)

    def render(self, gauges: Gauges) -> bytes:
        lines: list[str] = []

        def family(name: str, kind: str, text: str) -> None:
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")

        def sample(name: str, value: float, labels: Iterable[tuple[str, str]] = ()) -> None:
            lines.append(f"{name}{_labels(labels)} {_number(value)}")

        family("talaria_node_build_info", "gauge", "The runner's build (always 1)")
        sample("talaria_node_build_info", 1, [("version", self.version), ("protocol", str(self.protocol))])
        for name, text, value in (
            ("talaria_node_connected", "1 while the runner has an adopted epoch", float(gauges.connected)),
            ("talaria_node_draining", "1 while the runner drains", float(gauges.draining)),
            ("talaria_node_gateway_channels", "Open gateway channels", float(gauges.gateway_channels)),
            ("talaria_node_grants", "Open team-tool grants", float(gauges.grants)),
        ):
            family(name, "gauge", text)
            sample(name, value)
        family("talaria_node_hermes_up", "gauge", "1 when the last command that reached Hermes found it available")
        if gauges.hermes_up is not None:
            sample("talaria_node_hermes_up", float(gauges.hermes_up))
        family("talaria_node_token_age_seconds", "gauge", "Age of the token in use, when its issue time is known")
        if gauges.token_age_seconds is not None:
            sample("talaria_node_token_age_seconds", gauges.token_age_seconds)
        family("talaria_node_epoch_changes_total", "counter", "Epochs adopted")
        sample("talaria_node_epoch_changes_total", self.epoch_changes)
        family("talaria_node_disconnects_total", "counter", "Local disconnects by reason")
        for reason, count in sorted(self.disconnects.items()):
            sample("talaria_node_disconnects_total", count, [("reason", reason)])
        family("talaria_node_polls_total", "counter", "Polls by outcome")
        for outcome, count in sorted(self.polls.items()):
            sample("talaria_node_polls_total", count, [("outcome", outcome)])
        family("talaria_node_commands_total", "counter", "Commands answered by kind and outcome")
        for (kind, outcome), count in sorted(self.commands.items()):
            sample("talaria_node_commands_total", count, [("kind", kind), ("outcome", outcome)])
        family("talaria_node_command_seconds", "histogram", "A command's time from receipt to reply")
        for kind, histogram in sorted(self.command_seconds.items()):
            for bound, count in zip(BUCKETS, histogram.counts, strict=True):
                sample("talaria_node_command_seconds_bucket", count, [("kind", kind), ("le", repr(float(bound)))])
            sample("talaria_node_command_seconds_bucket", histogram.count, [("kind", kind), ("le", "+Inf")])
            sample("talaria_node_command_seconds_sum", histogram.total, [("kind", kind)])
            sample("talaria_node_command_seconds_count", histogram.count, [("kind", kind)])
        return ("\n".join(lines) + "\n").encode("utf-8")
