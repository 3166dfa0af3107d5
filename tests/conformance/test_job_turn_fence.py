"""The job turn record fenced by the job's lease (scale.md 4.3; ADR 0055), every backend: a writer presenting a lease
the job no longer carries records, moves and finishes nothing (409 ``stale_lease``); the holder's writes go through,
and the record keeps the turn's channel (connection, first event number, runtime session id)."""

from __future__ import annotations

from typing import Any

import pytest

from talaria.clock import ManualClock
from talaria.errors import TalariaError
from talaria.hub.dispatch.job_turns import JobTurn, JobTurns
from talaria.lifecycle.records import LeaseRef

from .test_store import NOW, get_job, job_update_params, lease_columns, seed_job

HELD = LeaseRef("f" * 32, 2)
MOVED_ON = LeaseRef("f" * 32, 1)  # the same id at an earlier epoch: a holder whose lease was taken again


def leased(store: Any) -> str:
    job_id = seed_job(store)["job"]
    params = job_update_params(get_job(store, job_id), state="LEASED", attempt=1, **lease_columns(HELD.lease_epoch))
    with store.write() as tx:
        assert tx.run("job_update", **params) == 1
    return job_id


def refused(call: Any) -> None:
    with pytest.raises(TalariaError) as caught:
        call()
    assert (caught.value.code, caught.value.status) == ("stale_lease", 409)


def test_only_the_lease_holding_the_job_writes_its_turn_record(store: Any) -> None:
    job_id = leased(store)
    turns = JobTurns(store, ManualClock(NOW))
    turn = JobTurn(job_id=job_id, tenant="default", attempt=1, runner_id="r1", profile="default",
                   stored_session_id="s1", marker="[m]", state="submitting", connection_id="c1", first_seq=4,
                   runtime_id="rt-1")  # fmt: skip
    refused(lambda: turns.begin(turn, MOVED_ON))
    assert turns.get(job_id) is None
    turns.begin(turn, HELD)
    refused(lambda: turns.submitted(job_id, "s2", MOVED_ON))
    turns.submitted(job_id, "s2", HELD)
    refused(lambda: turns.finish(job_id, "interrupted", None, None, MOVED_ON))
    recorded = turns.get(job_id)
    assert recorded is not None and recorded.state == "submitted"
    assert (recorded.connection_id, recorded.first_seq, recorded.runtime_id) == ("c1", 4, "rt-1")
    turns.finish(job_id, "complete", "the reply", "s2", HELD)
    finished = turns.get(job_id)
    assert finished is not None and (finished.state, finished.outcome, finished.reply) == ("finished", "complete",
                                                                                          "the reply")  # fmt: skip
