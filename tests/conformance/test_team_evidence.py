"""An applied tool call's audit event and evidence row on each store backend (team-tools.md 10): actor the calling
bot via team_tool, the team ids, keyed digests of the requestId, the arguments and every free-text argument, the
payload's SHA-256 in both places, no text of the call anywhere; the chain verifies."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from talaria.canonical import canonical_json
from talaria.lifecycle import audit
from talaria.lifecycle.audit_key import AuditKey
from talaria.teams.evidence import Call, record_call

KEY = AuditKey(b"k" * 32)
MARK = "mark-5b1e"
CALL = Call(tenant="default", account="alice", bot_id="bot_lead", conversation_id="cnv_1", turn_id="trn_1",
            grant_id="grt_1", runner_id="run_1", tool="talaria_assign")  # fmt: skip
ARGS = {"requestId": f"R4-{MARK}", "goalId": "gol_1", "botId": "bot_w", "title": f"Draft {MARK}",
        "brief": f"write {MARK}", "acceptanceCriteria": [f"has {MARK}"]}  # fmt: skip


def test_a_call_writes_one_event_and_its_evidence_with_digests_only(store: Any) -> None:
    result = json.dumps({"assignment": {"id": "asg_1", "status": "pending", "title": f"Draft {MARK}"}})
    with store.write() as tx:
        event_id = record_call(
            tx, KEY, CALL, event_type="team.assignment.created", now_ms=1000,
            ids={"goalId": "gol_1", "assignmentId": "asg_1", "targetBotId": "bot_w"}, from_state=None,
            to_state="pending", arguments=ARGS, result=result, revision_after=1,
        )  # fmt: skip
    audit.seal_all(store)  # PostgreSQL chains after commit (scale.md 2.4)
    with store.read() as tx:
        rows = [dict(r) for r in tx.all("audit_scan", after_seq=0, limit=100)]
        evidence = dict(tx.one("team_evidence_of_event", audit_event_id=event_id))
    event = json.loads(next(r["body"] for r in rows if r["event_id"] == event_id))
    assert event["actor"] == {"principal": "bot:default/bot_lead", "roles": [], "via": "team_tool"}
    assert event["team"] == {"account": "alice", "botId": "bot_lead", "conversationId": "cnv_1", "turnId": "trn_1",
                             "grantId": "grt_1", "runnerId": "run_1", "tool": "talaria_assign", "teamId": None,
                             "goalId": "gol_1", "assignmentId": "asg_1", "targetBotId": "bot_w"}  # fmt: skip
    assert event["idempotency_key_hash"] == KEY.digest(f"R4-{MARK}")
    assert event["request_digest"] == KEY.digest(ARGS)
    payload = json.loads(evidence["payload"])
    assert payload["fieldDigests"] == {key: KEY.digest(ARGS[key]) for key in ("title", "brief", "acceptanceCriteria")}
    assert payload["resultDigest"] == KEY.digest(result) and payload["argumentsDigest"] == KEY.digest(ARGS)
    digest = hashlib.sha256(canonical_json(payload)).hexdigest()
    assert evidence["content_digest"] == digest == event["evidence"]["contentDigest"]
    assert event["evidence"]["kind"] == "team_tool"
    assert (evidence["tool"], evidence["bot_id"], evidence["turn_id"]) == ("talaria_assign", "bot_lead", "trn_1")
    assert evidence["id"].startswith("tev_")
    assert MARK not in json.dumps(rows) + json.dumps(evidence)
    assert audit.verify(store).ok
