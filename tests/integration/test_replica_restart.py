"""Two PostgreSQL hub replicas, one runner process behind a round-robin TCP proxy, the Hermes fixture (scale.md 6,
scenarios 6 and 9): a replica restarted while the runner's poll is held on it changes no epoch and the turn in
flight completes; a job run by one replica's dispatcher is cancelled through the other within 5 s."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from talaria.settings import Settings
from talaria.testing.postgres_server import PostgresServer
from tests.backends import raw_sql
from tests.conftest import add_account, login
from tests.hermes.chat_support import messages, wait_turn
from tests.integration.replicas_support import Cluster, cluster, job_of, replica_live, running_job, until

pytestmark = pytest.mark.usefixtures("fast_argon2")


def connection(both: Cluster) -> dict[str, Any]:
    [row] = raw_sql(Settings(database_url=both.url), "SELECT epoch, created_at, poll_replica FROM runner_conn")
    return row


def test_a_replica_restarted_changes_no_runner_epoch_and_the_turn_in_flight_completes(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    text = "hold while a replica restarts"
    with cluster(postgres_server, tmp_path) as both:
        before = connection(both)
        turn_id = both.held_turn("a", text)
        # the replica holding the runner's poll now restarts (if it drives the turn too, the other takes it over)
        held = until(lambda: connection(both)["poll_replica"])
        [name] = [n for n in both.hubs if both.replica_of(n) == held]
        both.stop(name)
        both.start(f"{name}-again", tmp_path)
        assert not replica_live(both.url, held), "it left"
        until(lambda: connection(both)["poll_replica"] not in (None, held) or None)
        both.hermes.delta_delay_for(text, 0)
        other = next(iter(both.clients))
        done = wait_turn(both.clients[other], both.conversation_id, turn_id, timeout=60)
        assert done["state"] == "completed", done
        [reply] = [m for m in messages(both.clients[other], both.conversation_id) if m["role"] == "assistant"]
        assert reply["content"]
        assert both.hermes.prompt_count(text) == 1
        after = connection(both)
        assert (after["epoch"], after["created_at"]) == (before["epoch"], before["created_at"]), "epoch kept"
        assert both.runner.lines.count("runner connected") == 1


@pytest.mark.parametrize("listen", [True, False], ids=["notified", "fallback"])
def test_a_job_run_by_one_replica_is_cancelled_through_the_other_within_five_seconds(
    postgres_server: PostgresServer, tmp_path: Path, listen: bool
) -> None:
    """Through ``talaria_job``, or without LISTEN by the running replica's fallback read of its jobs (the lease's
    heartbeat, every 10 s, would be too late)."""
    prompt = "Summarise the notes, held until cancelled"
    with cluster(postgres_server, tmp_path, database_listen=listen) as both:
        add_account(both.hubs["a"], "bob", "admin", allowed_profiles={"local": ["default"]})
        admins = {name: login(hub, "bob") for name, hub in both.hubs.items()}
        try:
            job_id, runner_replica = running_job(both, admins, prompt, approver="b")
            other = next(name for name in both.hubs if name != runner_replica)
            asked = time.monotonic()
            cancel = admins[other].post(f"/api/jobs/{job_id}/cancel", json={"reason": "not needed"})
            assert cancel.status_code == 200, cancel.text
            done = until(lambda: job_of(admins[other], job_id) if job_of(admins[other], job_id)["state"]
                         in ("CANCELLED", "SUCCEEDED", "FAILED") else None, timeout=5)  # fmt: skip
            assert time.monotonic() - asked < 5
            assert done["state"] == "CANCELLED", done
            assert both.hermes.rpc_requests("session.interrupt"), "the running replica interrupted Hermes"
        finally:
            for client in admins.values():
                client.close()
