"""The job turn record's pure table and what an attempt does with a record (issue 11, defect 9), and the
recovery's in-flight marker check (runner-protocol.md 13)."""

from __future__ import annotations

import pytest

from talaria.hub.dispatch.job_turns import (
    FINISHED,
    SUBMITTED,
    SUBMITTING,
    JobTurn,
    NextStep,
    TurnEvent,
    TurnMoveRefused,
    next_step,
    next_turn_state,
)
from talaria.hub.dispatch.turn_recovery import holds_marker


def test_the_table_allows_only_forward_moves() -> None:
    assert next_turn_state(None, TurnEvent.BEGIN) == SUBMITTING
    assert next_turn_state(SUBMITTING, TurnEvent.SUBMITTED) == SUBMITTED
    assert next_turn_state(SUBMITTING, TurnEvent.FINISHED) == FINISHED
    assert next_turn_state(SUBMITTED, TurnEvent.FINISHED) == FINISHED
    refused = [(SUBMITTING, TurnEvent.BEGIN), (SUBMITTED, TurnEvent.BEGIN), (FINISHED, TurnEvent.BEGIN),
               (SUBMITTED, TurnEvent.SUBMITTED), (FINISHED, TurnEvent.SUBMITTED), (FINISHED, TurnEvent.FINISHED),
               (None, TurnEvent.SUBMITTED), (None, TurnEvent.FINISHED)]  # fmt: skip
    for state, event in refused:
        with pytest.raises(TurnMoveRefused):
            next_turn_state(state, event)


def _turn(state: str, outcome: str | None = None) -> JobTurn:
    return JobTurn("job_1", "default", 1, "r1", "default", "s1", "[talaria-run:x:job_1]", state, outcome)


def test_an_attempt_recovers_an_open_turn_and_ends_a_finished_one_from_its_record() -> None:
    assert next_step(None) is NextStep.FRESH_TURN
    assert next_step(_turn(SUBMITTING)) is NextStep.RECOVER
    assert next_step(_turn(SUBMITTED)) is NextStep.RECOVER
    assert next_step(_turn(FINISHED, "complete")) is NextStep.FROM_RECORD


def test_only_a_running_turn_holding_the_marker_is_re_attached() -> None:
    marker = "[talaria-run:r:job_1]"
    assert holds_marker({"running": True, "inflight": {"user": f"do it\n{marker}"}}, marker)
    assert not holds_marker({"running": True, "inflight": {"user": "another prompt\n[talaria-run:r:job_2]"}}, marker)
    assert not holds_marker({"running": True}, marker)
    assert not holds_marker({"running": True, "inflight": None}, marker)
