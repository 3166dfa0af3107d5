"""Login throttling over a real hub (web-api.md 2): 5 failures in 5 minutes, per account and per TCP peer."""

from __future__ import annotations

import httpx
import pytest

from talaria.clock import ManualClock
from tests.conftest import PASSWORD
from tests.integration.web_support import Web, assert_error

pytestmark = pytest.mark.usefixtures("fast_argon2")


# --- login throttling (web-api.md 2) --------------------------------------------------------------------------
# Each failure below comes from its own loopback address, so only the per-account count is at play, unless the
# test is about the per-peer count.


def assert_throttled(response: httpx.Response, *, at_most: int = 300) -> int:
    assert_error(response, 429, "login_throttled")
    assert "set-cookie" not in response.headers
    retry_after = response.headers["retry-after"]
    assert retry_after.isdigit(), retry_after
    assert 0 < int(retry_after) <= at_most
    return int(retry_after)


def test_five_failures_for_an_account_throttle_even_the_right_password(web: Web) -> None:
    signed_in = web.user
    for i in range(5):
        assert_error(web.attempt("uma", "wrong password!", peer=f"127.0.0.{10 + i}"), 401, "invalid_credentials")
    assert_throttled(web.attempt("uma", PASSWORD, peer="127.0.0.20"))
    assert_throttled(web.attempt("uma", "wrong password!", peer="127.0.0.21"))
    # Only that account: another one signs in from the same peer.
    assert web.attempt("ulf", PASSWORD, peer="127.0.0.20").status_code == 200
    # Sessions made before are not affected.
    assert signed_in.get("/api/auth/me").status_code == 200


def test_throttled_login_works_again_once_the_window_has_passed(web: Web, clock: ManualClock) -> None:
    for i in range(5):
        web.attempt("uma", "wrong password!", peer=f"127.0.0.{10 + i}")
    assert assert_throttled(web.attempt("uma", PASSWORD, peer="127.0.0.20")) == 300
    clock.advance(290)
    assert assert_throttled(web.attempt("uma", PASSWORD, peer="127.0.0.20")) == 10
    clock.advance(11)
    response = web.attempt("uma", PASSWORD, peer="127.0.0.20")
    assert response.status_code == 200, response.text


def test_throttled_answers_do_not_count_as_failures(web: Web, clock: ManualClock) -> None:
    for i in range(5):
        web.attempt("uma", "wrong password!", peer=f"127.0.0.{10 + i}")
    clock.advance(200)
    for i in range(6):
        assert_throttled(web.attempt("uma", "wrong password!", peer=f"127.0.0.{20 + i}"))
    clock.advance(101)  # the five failures are now older than 5 minutes; the 429s were never counted
    response = web.attempt("uma", PASSWORD, peer="127.0.0.30")
    assert response.status_code == 200, response.text


def test_a_success_clears_the_accounts_failure_count(web: Web) -> None:
    for i in range(4):
        assert_error(web.attempt("uma", "wrong password!", peer=f"127.0.0.{10 + i}"), 401, "invalid_credentials")
    assert web.attempt("uma", PASSWORD, peer="127.0.0.14").status_code == 200
    for i in range(4):
        assert_error(web.attempt("uma", "wrong password!", peer=f"127.0.0.{15 + i}"), 401, "invalid_credentials")
    # Eight failures in the window, but only four since the success: the fifth is still judged...
    assert_error(web.attempt("uma", "wrong password!", peer="127.0.0.19"), 401, "invalid_credentials")
    # ...and makes five: now the account is throttled.
    assert_throttled(web.attempt("uma", PASSWORD, peer="127.0.0.20"))


def test_five_failures_from_one_peer_throttle_every_account_from_it(web: Web) -> None:
    for i in range(5):
        assert_error(web.attempt(f"ghost{i}", "wrong password!", peer="127.0.0.50"), 401, "invalid_credentials")
    assert_throttled(web.attempt("uma", PASSWORD, peer="127.0.0.50"))
    assert_throttled(web.attempt("ada", PASSWORD, peer="127.0.0.50"))
    # The accounts themselves are not throttled: from another peer they sign in.
    assert web.attempt("uma", PASSWORD, peer="127.0.0.51").status_code == 200


def test_four_failures_do_not_throttle(web: Web) -> None:
    for i in range(4):
        web.attempt("uma", "wrong password!", peer="127.0.0.60")
    assert web.attempt("uma", PASSWORD, peer="127.0.0.60").status_code == 200
