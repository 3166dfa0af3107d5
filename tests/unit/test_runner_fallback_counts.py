"""Which fallback wakes count as lost notifications (``SharedRunnerHub._missed``, scale.md 3.3): every one while
this replica does not listen; while it listens, only what happened ``NOTIFIED_WITHIN_MS`` or longer ago."""

from __future__ import annotations

from typing import Any

import pytest

from talaria.clock import ManualClock
from talaria.hub.runners.shared_connections import NOTIFIED_WITHIN_MS, SharedRunnerHub
from talaria.hub.runners.validity import Validity

NOW = 1_784_628_000_000


class Signals:
    def __init__(self, listening: bool) -> None:
        self.listening = listening

    def subscribe(self, channel: str, callback: Any) -> None: ...
    def on_reconnect(self, callback: Any) -> None: ...
    def notify(self, channel: str, ident: str) -> None: ...
    def start(self) -> None: ...


def hub(listening: bool) -> SharedRunnerHub:
    return SharedRunnerHub(None, Signals(listening), ManualClock(NOW), Validity.__new__(Validity),  # type: ignore[arg-type]
                           replica_id="rep_test", may_act=lambda role: True)  # fmt: skip


@pytest.mark.parametrize(
    ("listening", "ago_ms", "counted"),
    [
        (True, 0, False),
        (True, NOTIFIED_WITHIN_MS - 1, False),
        (True, NOTIFIED_WITHIN_MS, True),
        (False, 0, True),
        (True, None, True),  # a state changed without a time to judge by
    ],
)
def test_a_fallback_wake_counts_once_a_notification_would_have_come(
    listening: bool, ago_ms: int | None, counted: bool
) -> None:
    since = None if ago_ms is None else NOW - ago_ms
    assert hub(listening)._missed(since) is counted
