"""A kept channel (chat.md 5.3 step 4) on PostgreSQL replicas (scale.md 4.3, ADR 0067): each replica keeps the
channel of a turn it drove, in memory. When the conversation's next turn runs on the other replica, that one resumes
the stored session in a channel of its own, and the runner moves the live session's ownership to it; the first
replica's kept channel no longer owns the session. The turn after, on the first replica again, must not submit in
that channel: it did, the runner refused the prompt (``runner_session_forbidden``), and the turn, past its submit
record, ended ``uncertain`` though nothing had reached Hermes (found by the chaos benchmark's PostgreSQL run: about
one chat turn in seven ended so). Now the replica asks the runner whether the kept channel still owns the session
before the submit record, and opens a channel of its own when it does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from talaria.hub.turns.turn_leases import SharedTurnLeases
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer
from tests.hermes.chat_support import send, wait_turn
from tests.integration.replicas_support import cluster

pytestmark = pytest.mark.usefixtures("fast_argon2")


def _refuse_leases(hub: HubServer, patch: pytest.MonkeyPatch) -> None:
    """``hub``'s scans pass every turn by: the other replica drives them."""
    leases = hub.hub.chat_engine.leases
    assert isinstance(leases, SharedTurnLeases)

    def refuse(*_: Any, **__: Any) -> None:
        return None

    patch.setattr(leases, "take", refuse)


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


def test_a_kept_channel_that_lost_its_session_to_the_other_replica_is_not_submitted_in(
    postgres_server: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="talaria.chat")
    with cluster(postgres_server, tmp_path) as both:
        client = both.clients["a"]
        for text, driver, other in (("first on a", "a", "b"), ("second on b", "b", "a"), ("third on a", "a", "b")):
            with pytest.MonkeyPatch.context() as patch:
                _refuse_leases(both.hubs[other], patch)
                sent = send(client, both.conversation_id, text)
                assert sent.status_code == 202, sent.text
                turn_id = sent.json()["turn"]["id"]
                done = wait_turn(client, both.conversation_id, turn_id, timeout=30)
            assert (done["state"], done["code"]) == ("completed", None), (text, done)
            taken = [e["replica"] for e in _events(caplog, "chat_turn_lease_taken") if e["turn"] == turn_id]
            assert taken == [both.replica_of(driver)], (text, taken)
        assert [both.hermes.prompt_count(text) for text in ("first on a", "second on b", "third on a")] == [1, 1, 1]
        # b resumed the session for the second turn; a found its kept channel stale and resumed it for the third
        assert len(both.hermes.rpc_requests("session.resume")) == 2
        stale = _events(caplog, "chat_kept_channel_stale")
        assert [e["code"] for e in stale] == ["runner_session_forbidden"], stale
