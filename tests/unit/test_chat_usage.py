"""A turn's usage (chat.md 2): the session's running totals at ``message.complete`` minus the previous turn's, when
the turn resumed that session; shown without the totals kept for the next turn."""

from __future__ import annotations

from typing import Any

from talaria.chat.usage import public, totals_of, turn_usage


def _hermes(calls: int, tokens_in: int, tokens_out: int) -> dict[str, Any]:
    return {"usage": {"model": "m", "input": tokens_in, "output": tokens_out, "total": tokens_in + tokens_out,
                      "calls": calls, "reasoning": 0, "context_used": 9}}  # fmt: skip


def test_a_resumed_session_s_turn_gets_the_difference_of_the_totals() -> None:
    first = turn_usage(totals_of(_hermes(1, 10, 4)) or {}, "m", resumed=False, before=None)
    second = turn_usage(totals_of(_hermes(3, 25, 9)) or {}, "m", resumed=True, before=first)
    assert public(first) == {"model": "m", "inputTokens": 10, "outputTokens": 4, "totalTokens": 14, "calls": 1}
    assert public(second) == {"model": "m", "inputTokens": 15, "outputTokens": 5, "totalTokens": 20, "calls": 2}
    assert second["session"] == {"input": 25, "output": 9, "total": 34, "calls": 3}


def test_a_new_session_or_totals_that_went_down_are_the_turn_s_own() -> None:
    before = turn_usage(totals_of(_hermes(5, 100, 50)) or {}, "m", resumed=False, before=None)
    fresh = turn_usage(totals_of(_hermes(6, 120, 60)) or {}, "m", resumed=False, before=before)
    rebuilt = turn_usage(totals_of(_hermes(1, 120, 60)) or {}, "m", resumed=True, before=before)
    assert public(fresh) == {"model": "m", "inputTokens": 120, "outputTokens": 60, "totalTokens": 180, "calls": 6}
    assert public(rebuilt) == {"model": "m", "inputTokens": 120, "outputTokens": 60, "totalTokens": 180, "calls": 1}


def test_missing_or_malformed_counts_count_as_zero_and_no_usage_object_gives_none() -> None:
    assert totals_of({"text": "x"}) is None
    assert totals_of({"usage": "many"}) is None
    odd = totals_of({"usage": {"input": -3, "output": "7", "total": True, "calls": 2}})
    assert odd == {"input": 0, "output": 0, "total": 0, "calls": 2}
    assert public(None) is None
    assert public(turn_usage(odd or {}, "", resumed=False, before=None))["model"] is None  # type: ignore[index]
