"""The team tools' request ledger on each store backend (team-tools.md 6.1): the same requestId and call replay the
stored answer byte for byte, another call under it is 409 idempotency_conflict, an expired entry runs afresh,
a failed call keeps nothing, and the key is per (tenant, owner)."""

from __future__ import annotations

from typing import Any

import pytest

from talaria.canonical import sha256_hex
from talaria.errors import TalariaError
from talaria.lifecycle.audit_key import AuditKey
from talaria.limits import TEAM_REQUEST_KEEP_S
from talaria.teams import ledger
from talaria.teams.ledger import Request

KEY = AuditKey(b"k" * 32)
ARGS = {"requestId": "R1", "name": "Writer", "profile": "work"}
DAY = TEAM_REQUEST_KEEP_S * 1000


def request(arguments: dict[str, Any] = ARGS, *, owner: str = "alice", bot: str = "bot_lead",
            tool: str = "talaria_create_bot") -> Request:  # fmt: skip
    return Request.of(KEY, tenant="default", owner=owner, bot_id=bot, tool=tool, arguments=arguments)


def test_the_same_call_replays_its_answer_and_another_call_under_the_key_conflicts(store: Any) -> None:
    answer = '{"bot":{"id":"bot_w","name":"Writer"}}'
    with store.write() as tx:
        assert ledger.replay(tx, request(), 1000) is None
        ledger.keep(tx, request(), answer, 1000)
    with store.write() as tx:
        assert ledger.replay(tx, request(), 2000) == answer
    for other in (request({**ARGS, "name": "Other"}), request(bot="bot_lead2"), request(tool="talaria_update_bot")):
        with pytest.raises(TalariaError) as conflict, store.write() as tx:
            ledger.replay(tx, other, 2000)
        assert (conflict.value.code, conflict.value.status) == ("idempotency_conflict", 409)
    with pytest.raises(TalariaError) as conflict, store.write() as tx:
        ledger.keep(tx, request({**ARGS, "name": "Other"}), "{}", 2000)
    assert conflict.value.code == "idempotency_conflict"


def test_keys_are_per_owner_and_stored_as_digests(store: Any) -> None:
    with store.write() as tx:
        ledger.keep(tx, request(), '{"a":1}', 1000)
    with store.write() as tx:
        assert ledger.replay(tx, request(owner="bob"), 1000) is None
    with store.read() as tx:
        row = tx.one("team_request_get", tenant="default", owner="alice", request_hash=request().request_hash)
    assert row is not None and row["request_hash"] == sha256_hex("R1")
    assert row["fingerprint"] == KEY.digest({"bot": "bot_lead", "tool": "talaria_create_bot", "arguments": ARGS})
    assert "R1" not in {row[k] for k in ("request_hash", "fingerprint", "tool", "bot_id")}


def test_an_entry_lasts_thirty_days_then_a_reuse_runs_afresh(store: Any) -> None:
    with store.write() as tx:
        ledger.keep(tx, request(), '{"first":true}', 1000)
    with store.write() as tx:
        assert ledger.replay(tx, request(), 1000 + DAY - 1) == '{"first":true}'
        assert ledger.replay(tx, request({**ARGS, "name": "New"}), 1000 + DAY) is None
        ledger.keep(tx, request({**ARGS, "name": "New"}), '{"second":true}', 1000 + DAY)
    with store.write() as tx:
        assert ledger.replay(tx, request({**ARGS, "name": "New"}), 2000 + DAY) == '{"second":true}'
        assert ledger.prune(tx, 1000 + 2 * DAY - 1) == 0
        assert ledger.prune(tx, 1000 + 2 * DAY) == 1


def test_a_failed_call_keeps_nothing(store: Any) -> None:
    with pytest.raises(RuntimeError), store.write() as tx:
        ledger.keep(tx, request(), '{"a":1}', 1000)
        raise RuntimeError("the effect failed after the ledger row")
    with store.write() as tx:
        assert ledger.replay(tx, request({**ARGS, "name": "Other"}), 1000) is None
