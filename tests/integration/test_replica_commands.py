"""Commands from two PostgreSQL hub replicas to one ``talaria runner`` process behind a round-robin TCP proxy, in
front of the Hermes fixture (scale.md 6, scenarios 3 and 5): 200 commands sent alternately from both replicas each
run once and complete while both replicas serve the runner's polls and results and it connects once; without
LISTEN a command sent by the replica not holding the poll arrives by the fallback query; a listen connection killed
server-side loses nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from talaria.settings import Settings
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer
from tests.backends import raw_sql
from tests.integration.replicas_support import Cluster, cluster, until
from tests.integration.runner_support import metric_value, metrics_text

pytestmark = pytest.mark.usefixtures("fast_argon2")

COMMANDS, WAVE = 200, 20  # a wave stays well under the 64 commands a runner may have pending
SERVED = 'talaria_http_requests_total{door="runner",status="200"}'  # the machine API's door (operations.md 5.1)
FALLBACK = 'talaria_wake_fallback_total{channel="talaria_runner"}'


def fallback_wakes(hub: HubServer) -> float:
    """Held polls the fallback query woke on ``hub``; no sample before the first such wake."""
    try:
        return metric_value(metrics_text(hub), FALLBACK)
    except AssertionError:
        return 0.0


def status(n: int) -> dict[str, str]:
    return {"path": "/api/status", "method": "GET", "search": f"?n={n}"}


def runner_of(both: Cluster) -> dict[str, Any]:
    query = "SELECT runner_id, epoch, created_at, poll_replica FROM runner_conn"
    [row] = raw_sql(Settings(database_url=both.url), query)
    return row


def sent(hub: HubServer, runner_id: str, payloads: list[dict[str, str]]) -> list[Any]:
    """The results of ``payloads`` sent at once through ``hub``, in order (an exception where a send failed)."""

    async def send_all() -> list[Any]:
        runners = hub.hub.runners
        return await asyncio.gather(
            *(runners.send(runner_id, "http", payload, account=None, profile=None) for payload in payloads),
            return_exceptions=True,
        )

    results: list[Any] = hub.call(send_all())
    return results


def runner_requests(hub: HubServer) -> float:
    """Machine API requests this replica answered 200 (no sample before its first)."""
    text = metrics_text(hub)
    return metric_value(text, SERVED) if SERVED in text else 0.0


def test_two_hundred_commands_sent_alternately_through_two_replicas_each_run_once(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    with cluster(postgres_server, tmp_path) as both:
        before = runner_of(both)
        served = {name: runner_requests(hub) for name, hub in both.hubs.items()}
        names = list(both.hubs)
        results: dict[int, Any] = {}
        for wave in range(0, COMMANDS, WAVE):
            if wave == COMMANDS // 2:
                both.proxy.cut_all()  # the runner's connections reset: it polls and posts again, to the next replica
                both.proxy.restore()
            for offset, name in enumerate(names):
                numbers = list(range(wave + offset, wave + WAVE, len(names)))  # even from a, odd from b
                for n, result in zip(numbers, sent(both.hubs[name], before["runner_id"], [status(n) for n in numbers]),
                                     strict=True):  # fmt: skip
                    results[n] = result
        failed = {n: r for n, r in results.items() if isinstance(r, BaseException) or r["status"] != 200}
        assert sorted(results) == list(range(COMMANDS)) and failed == {}, failed
        asked = [r.query["n"] for r in both.hermes.requests("/api/status") if "n" in r.query]
        assert sorted(asked, key=int) == [str(n) for n in range(COMMANDS)], "each command ran once against Hermes"
        for name, hub in both.hubs.items():
            assert runner_requests(hub) - served[name] > COMMANDS / 10, f"{name} served the runner"
        after = runner_of(both)
        assert (after["epoch"], after["created_at"]) == (before["epoch"], before["created_at"])
        assert both.runner.lines.count("runner connected") == 1


@pytest.mark.parametrize("listen", [True, False], ids=["notified", "fallback"])
def test_a_command_from_the_replica_not_holding_the_poll_arrives_and_a_killed_listen_connection_loses_nothing(
    postgres_server: PostgresServer, tmp_path: Path, listen: bool
) -> None:
    with cluster(postgres_server, tmp_path, database_listen=listen) as both:
        ids = {both.replica_of(name): name for name in both.hubs}
        settings = Settings(database_url=both.url)
        for round_ in range(3):
            held = ids[until(lambda: runner_of(both)["poll_replica"])]
            [other] = [name for name in both.hubs if name != held]
            fallback = fallback_wakes(both.hubs[held])
            [result] = sent(both.hubs[other], runner_of(both)["runner_id"], [status(round_)])
            assert result["status"] == 200, result
            woken_by_fallback = fallback_wakes(both.hubs[held]) - fallback
            if not listen:
                assert woken_by_fallback >= 1, "without LISTEN the held poll found the command by its fallback query"
            if listen and round_ == 1:  # the listener of the replica holding the poll is killed by the server
                name = f"talaria/{both.replica_of(held)}/listen"
                killed = raw_sql(settings, "SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity"
                                 " WHERE application_name = ?", name)  # fmt: skip
                assert [row["ok"] for row in killed] == [True], name
        asked = [r.query["n"] for r in both.hermes.requests("/api/status") if "n" in r.query]
        assert asked == ["0", "1", "2"]
        assert both.runner.lines.count("runner connected") == 1
