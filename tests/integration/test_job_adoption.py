"""A job's turn taken over by another PostgreSQL replica (scale.md 4.4): two or three replicas, one runner process
behind a round-robin TCP proxy, the Hermes fixture. The replica running a job's turn stops while the turn runs in
Hermes; once the job's lease expires another replica claims the job, adopts the turn's gateway channel (owner counter
+ 1) instead of opening a second one and resuming the session, waits for the running turn on it, takes the reply from
the history and closes the channel. Nothing is submitted or resumed again. With three replicas the two left race for
the job: one adopts the channel, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from talaria.settings import Settings
from talaria.testing.postgres_server import PostgresServer
from tests.backends import raw_sql
from tests.conftest import add_account, login
from tests.integration.replicas_support import Cluster, cluster, job_of, running_job, until

pytestmark = pytest.mark.usefixtures("fast_argon2")

SHORT_LEASE = {"lifecycle_lease_ttl_s": 3, "lifecycle_heartbeat_interval_s": 1}


def turn_channel(both: Cluster, job_id: str) -> dict[str, Any]:
    """The job's recorded turn joined with its gateway's row."""
    [row] = raw_sql(Settings(database_url=both.url),
                    "SELECT t.connection_id, t.first_seq, t.runtime_session_id, g.owner_replica, g.owner_counter,"
                    " g.closed_at FROM job_turn t JOIN runner_gateway g ON g.id = t.connection_id"
                    " WHERE t.job_id = ?", job_id)  # fmt: skip
    return row


@pytest.mark.parametrize("names", [("a", "b"), ("a", "b", "c")], ids=["two", "three"])
def test_a_job_whose_replica_stopped_mid_turn_is_completed_by_another_through_the_same_channel(
    postgres_server: PostgresServer, tmp_path: Path, names: tuple[str, ...]
) -> None:
    prompt = "Summarise the notes, held while its replica stops"
    with cluster(postgres_server, tmp_path, names=names, **SHORT_LEASE) as both:
        add_account(both.hubs["a"], "bob", "admin", allowed_profiles={"local": ["default"]})
        admins = {name: login(hub, "bob") for name, hub in both.hubs.items()}
        try:
            job_id, first = running_job(both, admins, prompt, approver="a")
            before = until(
                lambda: (
                    turn_channel(both, job_id)
                    if raw_sql(
                        Settings(database_url=both.url),
                        "SELECT 1 FROM job_turn WHERE job_id = ? AND state = 'submitted'",
                        job_id,
                    )
                    else None
                )
            )
            assert (before["owner_replica"], before["owner_counter"]) == (both.replica_of(first), 1)
            assert before["first_seq"] >= 1 and before["runtime_session_id"]

            admins.pop(first).close()
            both.stop(first)  # its dispatcher leaves the turn running in Hermes, its channel open
            left = {both.replica_of(name): name for name in both.hubs}

            def adopted_after_sweeps() -> dict[str, Any] | None:
                for hub in both.hubs.values():
                    hub.hub.engine.expire_due()  # the reaper's sweep (in-process replicas run none of their own)
                row = turn_channel(both, job_id)
                return row if row["owner_counter"] >= 2 else None

            adopted = until(adopted_after_sweeps, timeout=60)
            assert adopted["owner_counter"] == 2, "adopted once"
            other = left[adopted["owner_replica"]]
            assert adopted["connection_id"] == before["connection_id"], "the same channel, adopted"
            both.hermes.delta_delay_for(prompt, 0)  # the turn goes on: its message.complete reaches the new owner

            done = until(lambda: job_of(admins[other], job_id) if job_of(admins[other], job_id)["state"]
                         in ("SUCCEEDED", "FAILED") else None, timeout=60)  # fmt: skip
            assert done["state"] == "SUCCEEDED", done
            assert done["attempt"] == 2
            assert both.hermes.prompt_count(prompt) == 1
            assert both.hermes.rpc_requests("session.resume") == [], "adopted, not resumed on a second channel"
            assert both.hermes.rpc_requests("session.active_list"), "the new owner asked whether the turn runs"
            assert both.hermes.rpc_requests("session.interrupt") == []
            closed = until(lambda: turn_channel(both, job_id) if turn_channel(both, job_id)["closed_at"] else None)
            assert closed["owner_counter"] == 2, "closed by its new owner"
            assert both.runner.lines.count("runner connected") == 1
        finally:
            for client in admins.values():
                client.close()
