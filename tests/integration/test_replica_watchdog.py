"""The runner watchdog across replicas (scale.md 6 scenario 8, 3.6): a ``talaria hub`` process holds the
``runner_watchdog`` lease; it is SIGKILLed together with the runner process it serves. The other replica (in the
test) takes the lease within 20 s, and disconnects the runner once, 35-45 s after its last request (the watchdog's
35 s and its 5 s period; the seen time is written at most once a second, hence one more second of slack)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from talaria.clock import SystemClock
from talaria.hub.replica import ROLE_TTL_MS
from talaria.settings import Settings
from talaria.testing.hermes_fixture import HermesFixture
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database, raw_sql
from tests.integration.cli_support import HubProcess, clean_env
from tests.integration.replicas_support import port_of, until
from tests.integration.runner_support import RunnerProcess, register_node
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.usefixtures("fast_argon2")

TAKEOVER_MS = 20_000  # scale.md 6.8
OFFLINE_MS = (35_000, 46_000)


def server_now(settings: Settings) -> int:
    """The database server's clock (ms), the one every replica's leases are read against."""
    rows = raw_sql(settings, "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint AS now")
    return int(rows[0]["now"])


def watchdog_holder(settings: Settings) -> str | None:
    rows = raw_sql(settings, "SELECT holder FROM hub_role_lease WHERE role = 'runner_watchdog'")
    return rows[0]["holder"]


def test_the_watchdog_moves_to_the_other_replica_and_disconnects_a_killed_runner_once(
    postgres_server: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="talaria.runners")
    with HermesFixture() as hermes, postgres_database(postgres_server, migrated=True) as url:
        settings = Settings(database_url=url)
        proxy = TcpProxy([]).start()
        (tmp_path / "p").mkdir()
        env = clean_env(TALARIA_DATABASE_URL=url, TALARIA_DATA_DIR=str(tmp_path / "p" / "data"))
        process = HubProcess(tmp_path / "p", ["--port", "0"], env)
        other = None
        runner = None
        try:
            _, process_url = process.ready()
            killed_holder = until(lambda: watchdog_holder(settings))  # the first replica takes every role
            other = HubServer(tmp_path / "b", SystemClock(), database_url=url).start()
            assert other.hub.replica is not None and other.hub.replica.id != killed_holder
            proxy.backends += [("127.0.0.1", int(process_url.rsplit(":", 1)[1])), ("127.0.0.1", port_of(other))]
            path = register_node(other, tmp_path / "node", hermes_url=hermes.url, session_token=hermes.session_token,
                                 serverURL=proxy.url)  # fmt: skip
            runner = RunnerProcess(path, tmp_path / "logs", "runner")
            runner.wait_for("runner connected")
            [state] = raw_sql(settings, "SELECT runner_id, epoch FROM runner_conn")

            process.proc.kill()  # the watchdog's holder and the runner die together
            runner.proc.kill()
            killed_at = server_now(settings)
            process.proc.wait(timeout=10)
            runner.proc.wait(timeout=10)
            proxy.backends.remove(("127.0.0.1", int(process_url.rsplit(":", 1)[1])))
            [expires] = raw_sql(settings, "SELECT expires_at FROM hub_role_lease WHERE role = 'runner_watchdog'")
            assert int(expires["expires_at"]) - killed_at <= ROLE_TTL_MS

            until(lambda: watchdog_holder(settings) == other.hub.replica.id or None, timeout=40)
            assert server_now(settings) - killed_at <= TAKEOVER_MS, "the other replica took the watchdog"

            [seen] = raw_sql(settings, "SELECT seen_at FROM runner_seen WHERE runner_id = ?", state["runner_id"])
            until(lambda: not raw_sql(settings, "SELECT 1 FROM runner_conn") or None, timeout=60)
            gone_after = server_now(settings) - int(seen["seen_at"])
            assert OFFLINE_MS[0] <= gone_after <= OFFLINE_MS[1], gone_after
            disconnects = [r for r in caplog.records if "runner_disconnected" in r.getMessage()]
            assert len(disconnects) == 1 and "watchdog" in disconnects[0].getMessage(), disconnects
        finally:
            if runner is not None:
                runner.close()
            if other is not None:
                other.stop()
            process.close()
            proxy.stop()
