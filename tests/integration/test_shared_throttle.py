"""Login throttling in the ``login_failure`` table (scale.md 3.7, web-api.md 2) on a real PostgreSQL database, at
its edges: 4 failures of an account or a peer within 5 minutes leave sign-in open, the 5th closes it until the
oldest of the newest five is 5 minutes old; a success forgets the account's failures, not the peer's."""

from __future__ import annotations

from talaria.accounts.shared_throttle import SharedLoginThrottle
from talaria.clock import ManualClock
from talaria.limits import LOGIN_MAX_FAILURES, LOGIN_WINDOW_S
from talaria.store.postgres.store import PostgresStore


def test_the_fifth_failure_in_the_window_closes_sign_in_until_the_oldest_leaves_it(
    postgres_store: PostgresStore,
) -> None:
    clock = ManualClock(1_700_000_000_000)
    throttle = SharedLoginThrottle(postgres_store, clock)
    for n in range(LOGIN_MAX_FAILURES - 1):
        throttle.failed(username="uma", peer=f"10.0.0.{n}")
        clock.advance(1)
    assert throttle.retry_after(username="uma", peer="10.0.0.9") is None, "four failures: still open"
    throttle.failed(username="uma", peer="10.0.0.9")
    assert throttle.retry_after(username="uma", peer="10.0.0.8") == LOGIN_WINDOW_S - 4  # the first was 4 s ago
    assert throttle.retry_after(username="ida", peer="10.0.0.8") is None, "another account, another peer"
    clock.advance(LOGIN_WINDOW_S - 4 - 0.001)
    assert throttle.retry_after(username="uma", peer="10.0.0.8") == 1
    clock.advance(0.001)
    assert throttle.retry_after(username="uma", peer="10.0.0.8") is None, "the oldest failure left the window"


def test_a_success_forgets_the_accounts_failures_but_not_the_peers(postgres_store: PostgresStore) -> None:
    clock = ManualClock(1_700_000_000_000)
    throttle = SharedLoginThrottle(postgres_store, clock)
    for _ in range(LOGIN_MAX_FAILURES):
        throttle.failed(username="uma", peer="10.0.0.1")
    throttle.succeeded(username="uma")
    assert throttle.retry_after(username="uma", peer="10.0.0.2") is None
    assert throttle.retry_after(username="ida", peer="10.0.0.1") is not None
