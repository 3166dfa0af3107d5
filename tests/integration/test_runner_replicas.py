"""Two PostgreSQL hub replicas of one database serving one runner (scale.md 3.1, 3.3, 4.1; ADR 0047): raw machine
requests to either replica, hub operations started on one of them. A gateway or grant opened on replica A is a row
that replica B reads for ``admit`` and writes ``event`` frames to; A's gateway queue receives them in ``seq`` order.

The last tests show what else two replicas share: the reaper's table-wide attachment sweep and the team
reconciler's passes run on the replica holding ``maintenance``; failed sign-ins count across replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from talaria.canonical import canonical_json, sha256_hex
from talaria.clock import ManualClock
from talaria.hub.runners.connection_state import AccountRef, Gateway, Grant
from talaria.hub.runners.shared_connections import ORPHAN_CLOSE_MS, SharedRunnerHub
from talaria.hub.runners.transport import JobHeld
from talaria.lifecycle.records import LeaseRef
from talaria.limits import LOGIN_MAX_FAILURES
from talaria.settings import Settings
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database, raw_sql
from tests.conftest import PASSWORD, add_account, login
from tests.integration.grant_support import ProbeTools, account_ref, answered, call, probe_grant, take
from tests.integration.runner_support import (
    OFF_LIST,
    Machine,
    admin_of,
    assert_machine_error,
    assert_machine_ok,
    metric_value,
    metrics_text,
    outcome,
    register,
    send,
    spawn,
    wait_until,
)
from tests.integration.writers_support import claimed_jobs

pytestmark = pytest.mark.usefixtures("fast_argon2")


class Pair:
    """Replicas ``a`` and ``b`` of one database, a runner registered through ``a``, and its instance's machine
    clients on each replica (one instance, one epoch)."""

    def __init__(self, a: HubServer, b: HubServer) -> None:
        self.a, self.b = a, b
        self.admin = admin_of(a)
        registered = register(self.admin)
        self.id: str = registered["runner"]["id"]
        self.on_a = Machine(a, self.id, registered["token"])
        assert_machine_ok(self.on_a.poll(reset=True, features="team-tools-v1,failover-v1"))
        self.on_b = Machine(b, self.id, registered["token"], self.on_a.instance)
        self.on_b.epoch = self.on_a.epoch

    def account(self, username: str = "root") -> AccountRef:
        return account_ref(self.a, username)

    def close(self) -> None:
        for client in (self.on_a, self.on_b):
            client.close()
        self.admin.close()


@contextmanager
def replicas(server: PostgresServer, tmp_path: Path, clock: ManualClock, **settings: Any) -> Iterator[Pair]:
    with postgres_database(server, migrated=True) as url:
        made: list[HubServer] = []
        try:
            for name in ("a", "b"):
                made.append(HubServer(tmp_path / name, clock, database_url=url, **settings).start())
            both = Pair(*made)
            try:
                yield both
            finally:
                made[0].call(made[0].hub.runners.disconnect(both.id, "test over"))
                both.close()
        finally:
            for hub in made:
                hub.stop()


@pytest.fixture
def pair(postgres_server: PostgresServer, tmp_path: Path, clock: ManualClock) -> Iterator[Pair]:
    with replicas(postgres_server, tmp_path, clock) as both:
        yield both


def opened_on_a(pair: Pair, account: AccountRef | None = None) -> Gateway:
    """A gateway opened by replica A, its ``gateway.open`` taken, admitted and answered through replica B."""
    task = spawn(pair.a, pair.a.hub.channels.open_gateway(pair.id, account or pair.account()))
    gateway = answered_through_b(pair, task, "gateway.open")
    assert isinstance(gateway, Gateway), gateway
    return gateway


def answered_through_b(pair: Pair, task: asyncio.Task[Any], kind: str) -> Any:
    """The outcome at A of ``task``, whose one command (of ``kind``) is taken, admitted (B reads A's row) and
    answered through B."""
    return answered(pair.a, pair.on_b, task, kind)


def drained(server: HubServer, gateway: Gateway) -> list[Any]:
    async def read() -> list[Any]:
        frames = []
        while not gateway.events.empty():
            frames.append(gateway.events.get_nowait())
        return frames

    frames: list[Any] = server.call(read())
    return frames


def frame(gateway: Gateway, seq: int, n: int) -> dict[str, Any]:
    return {"connectionId": gateway.id, "seq": seq, "frame": {"type": "message.delta", "payload": {"n": n}}}


def latest_poll(pair: Pair) -> tuple[str, str]:
    """The token and replica of the runner's latest poll (each poll writes a new token)."""
    [row] = raw_sql(Settings(database_url=pair.a.settings.database_url),
                    "SELECT poll_token, poll_replica FROM runner_conn WHERE runner_id = ?", pair.id)  # fmt: skip
    return row["poll_token"], row["poll_replica"]


def held_on(pair: Pair, server: HubServer, after: tuple[str, str]) -> bool:
    token, replica = latest_poll(pair)
    return token != after[0] and replica == replica_id(server)


def replica_id(server: HubServer) -> str:
    assert server.hub.replica is not None
    return server.hub.replica.id


def test_a_poll_of_the_same_instance_on_the_other_replica_supersedes_the_held_one(
    pair: Pair, clock: ManualClock
) -> None:
    """scale.md 6 scenario 4: the older poll answers 200 ``commands: []`` well before its 15 s hold ends, and a
    command delivered to the newer poll is not delivered again before its redelivery time (5 s)."""
    older_at_a, newer_at_b = pair.on_a.twin(), pair.on_b.twin()
    with ThreadPoolExecutor(2) as pool:
        before = latest_poll(pair)
        older = pool.submit(older_at_a.poll)
        wait_until(lambda: held_on(pair, pair.a, before), what="the poll held on A")
        at_a = latest_poll(pair)
        newer = pool.submit(newer_at_b.poll)
        answered = older.result(timeout=5)  # superseded, not held for its 15 s
        assert assert_machine_ok(answered) == {"epoch": pair.on_a.epoch, "commands": []}
        assert held_on(pair, pair.b, at_a), "the newer poll is held on B"
        task = send(pair.a, pair.id, OFF_LIST)
        [command] = assert_machine_ok(newer.result(timeout=10))["commands"]
        clock.advance(4.9)
        second = send(pair.a, pair.id, OFF_LIST | {"search": "?second=1"})
        [again] = assert_machine_ok(pair.on_a.poll())["commands"]  # the first is not due again yet
        assert again["id"] != command["id"] and again["payload"]["search"] == "?second=1"
        for answered_id, task_ in ((command["id"], task), (again["id"], second)):
            assert_machine_ok(pair.on_a.post("result", {"id": answered_id, "result": {"status": 200}}))
            assert outcome(pair.a, task_) == {"status": 200}
    older_at_a.close()
    newer_at_b.close()


def test_frames_posted_to_either_replica_reach_the_owner_once_in_seq_order(pair: Pair) -> None:
    gateway = opened_on_a(pair)
    assert_machine_ok(pair.on_b.post("event", frame(gateway, 1, 1)))
    assert_machine_ok(pair.on_a.post("event", frame(gateway, 2, 2)))
    assert_machine_ok(pair.on_a.post("event", frame(gateway, 1, 99)))  # a retry through the other replica
    gap = pair.on_a.post("event", frame(gateway, 4, 4))
    assert_machine_error(gap, 409, "runner_event_gap")
    assert "event 3 " in gap.json()["error"]
    assert_machine_ok(pair.on_b.post("event", frame(gateway, 3, 3)))
    assert_machine_ok(pair.on_b.post("event", frame(gateway, 3, 98)))
    received: list[Any] = []

    def three() -> bool:
        received.extend(drained(pair.a, gateway))
        return len(received) >= 3

    wait_until(three, what="three frames at A")
    assert [f["payload"]["n"] for f in received] == [1, 2, 3]
    assert gateway.open
    assert_machine_ok(pair.on_b.post("event", {"connectionId": gateway.id, "seq": 4, "closed": True}))
    wait_until(lambda: not gateway.open, what="the close marker posted to B to close A's gateway")
    assert drained(pair.a, gateway) == [None]
    late = pair.on_a.post("event", frame(gateway, 5, 5))
    assert_machine_error(late, 410, "runner_connection_closed")


def test_without_notifications_the_owner_finds_frames_by_its_fallback_query(
    postgres_server: PostgresServer, tmp_path: Path, clock: ManualClock
) -> None:
    settings = {"database_listen": False, "database_wake_fallback_ms": 100}
    with replicas(postgres_server, tmp_path, clock, **settings) as pair:
        gateway = opened_on_a(pair)
        before = fallback_wakes(pair.a)
        assert_machine_ok(pair.on_b.post("event", frame(gateway, 1, 1)))
        wait_until(lambda: not gateway.events.empty(), what="the frame posted to B at A")
        assert [f["payload"]["n"] for f in drained(pair.a, gateway)] == [1]
        assert fallback_wakes(pair.a) == before + 1


def fallback_wakes(server: HubServer) -> float:
    """``talaria_wake_fallback_total{channel="talaria_event"}``; no sample before the first such wake."""
    try:
        return metric_value(metrics_text(server), 'talaria_wake_fallback_total{channel="talaria_event"}')
    except AssertionError:
        return 0.0


def test_a_fallback_query_meeting_a_notification_on_its_way_is_not_counted(pair: Pair) -> None:
    """``talaria_wake_fallback_total`` means notifications lost: a command settled under ``NOTIFIED_WITHIN_MS``
    ago (by the replicas' shared manual clock: always, here) wakes its sender, by the fallback query or a recheck,
    and is not counted while A listens (B notifies nothing, so only A's own queries find it)."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(pair.b.hub.runners.signals, "notify", lambda channel, ident: None)
    try:
        wait_until(lambda: pair.a.hub.runners.signals.listening, what="A listening")
        before = command_fallbacks(pair.a)
        task = send(pair.a, pair.id, OFF_LIST)
        command = take(pair.on_b, "http")
        assert_machine_ok(pair.on_b.post("result", {"id": command["id"], "result": {"status": 200}}))
        assert outcome(pair.a, task) == {"status": 200}
        assert command_fallbacks(pair.a) == before
    finally:
        monkeypatch.undo()


def command_fallbacks(server: HubServer) -> float:
    try:
        return metric_value(metrics_text(server), 'talaria_wake_fallback_total{channel="talaria_command"}')
    except AssertionError:
        return 0.0


def test_a_gateway_closed_by_its_owner_is_closed_for_the_other_replica(pair: Pair) -> None:
    gateway = opened_on_a(pair)
    rpc = spawn(pair.a, pair.a.hub.channels.rpc(gateway, "session.create", {}))
    command = take(pair.on_b, "gateway.rpc")
    closing = spawn(pair.a, pair.a.hub.channels.close_gateway(gateway))
    failed = outcome(pair.a, rpc)
    assert getattr(failed, "code", None) == "runner_connection_closed", failed
    assert assert_machine_ok(pair.on_b.post("admit", {"id": command["id"]})) == {"allowed": False}
    assert_machine_error(pair.on_b.post("event", frame(gateway, 1, 1)), 410, "runner_connection_closed")
    close = take(pair.on_b, "gateway.close")
    assert assert_machine_ok(pair.on_b.post("admit", {"id": close["id"]})) == {"allowed": True}
    assert_machine_ok(pair.on_b.post("result", {"id": close["id"], "result": {"ok": True}}))
    assert outcome(pair.a, closing) is None


def test_an_account_that_lost_its_access_is_refused_through_the_other_replica(pair: Pair) -> None:
    body = {"username": "uma", "password": PASSWORD, "role": "user", "allowedProfiles": {"local": ["default"]}}
    assert pair.admin.post("/api/admin/accounts", json=body).status_code == 201
    gateway = opened_on_a(pair, pair.account("uma"))
    rpc = spawn(pair.a, pair.a.hub.channels.rpc(gateway, "session.create", {}))
    command = take(pair.on_b, "gateway.rpc")
    assert pair.admin.patch("/api/admin/accounts/uma", json={"canManageTeam": True}).status_code == 200
    assert assert_machine_ok(pair.on_b.post("admit", {"id": command["id"]})) == {"allowed": False}, "auth_version"
    assert_machine_ok(pair.on_b.post("result", {"id": command["id"], "error": {"code": "x_y", "message": "no"}}))
    assert getattr(outcome(pair.a, rpc), "code", None) == "x_y"
    refused = pair.on_b.post("event", frame(gateway, 1, 1))
    assert_machine_error(refused, 410, "runner_connection_closed")
    wait_until(lambda: not gateway.open, what="A's gateway to close")
    assert gateway.revoked, "the owner learns why: its turn ends as access revoked"
    assert drained(pair.a, gateway) == [None]


def test_a_state_ended_through_one_replica_closes_the_gateways_the_other_owns(pair: Pair) -> None:
    gateway = opened_on_a(pair)
    assert_machine_ok(pair.on_b.post("goodbye", {}))
    wait_until(lambda: not gateway.open, what="A's gateway to close after a goodbye through B")
    assert drained(pair.a, gateway) == [None]


def held_job(pair: Pair) -> tuple[str, LeaseRef]:
    """A job claimed by a worker (through replica A's engine; of a cell no runner serves, so no dispatcher takes it)
    and the lease it holds."""
    [(job_id, _)] = claimed_jobs(pair.a.hub.engine, 1, cell="elsewhere")
    [row] = raw_sql(Settings(database_url=pair.a.settings.database_url),
                    "SELECT lease_id, lease_epoch FROM hermes_job WHERE id = ?", job_id)  # fmt: skip
    return job_id, LeaseRef(row["lease_id"], int(row["lease_epoch"]))


def gateway_row(pair: Pair, connection_id: str) -> dict[str, Any]:
    [row] = raw_sql(Settings(database_url=pair.a.settings.database_url),
                    "SELECT owner_replica, owner_counter, closed_at, orphaned_at FROM runner_gateway WHERE id = ?",
                    connection_id)  # fmt: skip
    return row


def adopt_on_b(
    pair: Pair, gateway: Gateway, job_id: str, lease: LeaseRef, after_seq: int = 0, server: HubServer | None = None
) -> asyncio.Task[Any]:
    """Replica B (or ``server``) adopting the gateway for the job held under ``lease``."""
    on = server or pair.b
    return spawn(on, on.hub.runners.adopt_gateway(
        pair.id, gateway.id, pair.account(), held=JobHeld(job_id, lease), after_seq=after_seq, runtime_id="rt-1",
        profile="default"))  # fmt: skip


def test_a_gateway_adopted_by_another_replica_replays_its_frames_and_fences_its_previous_owner(pair: Pair) -> None:
    gateway = opened_on_a(pair)
    for seq in (1, 2, 3):
        assert_machine_ok(pair.on_b.post("event", frame(gateway, seq, seq)))
    wait_until(lambda: gateway.last_seq == 3, what="A to receive its frames")
    assert [f["payload"]["n"] for f in drained(pair.a, gateway)] == [1, 2, 3]
    old_rpc = spawn(pair.a, pair.a.hub.channels.rpc(gateway, "session.interrupt", {"session_id": "rt-1"}))
    job_id, lease = held_job(pair)
    adopting = adopt_on_b(pair, gateway, job_id, lease, after_seq=1)
    wait_until(lambda: gateway_row(pair, gateway.id)["owner_counter"] == 2, what="the adoption's commit")
    old = take(pair.on_b, "gateway.rpc")
    assert assert_machine_ok(pair.on_b.post("admit", {"id": old["id"]})) == {"allowed": False}, "the old owner's"
    assert not adopting.done(), "the adoption waits for the previous owner's command to settle"
    refused = {"code": "runner_command_not_admitted", "message": "not admitted"}
    assert_machine_ok(pair.on_b.post("result", {"id": old["id"], "error": refused}))
    adopted = outcome(pair.b, adopting)
    assert isinstance(adopted, Gateway), adopted
    assert getattr(outcome(pair.a, old_rpc), "code", None) == "runner_command_not_admitted"
    assert adopted.owner_counter == 2 and gateway_row(pair, gateway.id)["owner_replica"] == replica_id(pair.b)
    wait_until(lambda: adopted.last_seq == 3, what="the frames after the turn's first to be replayed")
    assert [f["payload"]["n"] for f in drained(pair.b, adopted)] == [2, 3]
    wait_until(lambda: not gateway.open, what="A to drop its object (fallback round)")
    assert drained(pair.a, gateway) == [None]

    # the previous owner's command and close under its old counter change nothing
    state = pair.a.hub.runners.state_of(pair.id)
    assert state is not None
    late = spawn(pair.a, pair.a.hub.runners.send(
        pair.id, "gateway.rpc", {"connectionId": gateway.id, "method": "session.interrupt", "params": {}},
        account=pair.account(), profile=None, connection_id=gateway.id, valid=True, owner_counter=1))  # fmt: skip
    late_error = outcome(pair.a, late)
    assert (getattr(late_error, "code", None), getattr(late_error, "status", None)) == ("runner_connection_closed", 409)
    pair.a.call(pair.a.hub.runners.end_channel(state, "gateway", gateway.id, owner_counter=1))
    assert gateway_row(pair, gateway.id)["closed_at"] is None, "an old owner's close closes nothing"

    assert_machine_ok(pair.on_a.post("event", frame(gateway, 4, 4)))  # through A: stored for its new owner
    wait_until(lambda: adopted.last_seq == 4, what="B to receive a frame posted through A")
    closing = spawn(pair.b, pair.b.hub.channels.close_gateway(adopted))
    close = take(pair.on_a, "gateway.close")
    assert assert_machine_ok(pair.on_a.post("admit", {"id": close["id"]})) == {"allowed": True}
    assert_machine_ok(pair.on_a.post("result", {"id": close["id"], "result": {"ok": True}}))
    assert outcome(pair.b, closing) is None
    assert gateway_row(pair, gateway.id)["closed_at"] is not None


def test_a_gateway_is_adopted_only_open_on_the_current_state_and_for_the_lease_holding_the_job(pair: Pair) -> None:
    gateway = opened_on_a(pair)
    job_id, lease = held_job(pair)
    stale = LeaseRef(lease.lease_id, lease.lease_epoch + 1)
    assert outcome(pair.b, adopt_on_b(pair, gateway, job_id, stale)) is None, "another lease epoch"
    assert outcome(pair.b, adopt_on_b(pair, gateway, "job_01NOSUCHJOB", lease)) is None, "another job"
    assert gateway_row(pair, gateway.id)["owner_counter"] == 1
    assert isinstance(outcome(pair.b, adopt_on_b(pair, gateway, job_id, lease)), Gateway)
    again = adopt_on_b(pair, gateway, job_id, lease, server=pair.a)
    assert isinstance(outcome(pair.a, again), Gateway), "adopted again"
    assert gateway_row(pair, gateway.id)["owner_counter"] == 3
    closed = opened_on_a(pair)
    pair.a.call(pair.a.hub.runners.end_channel(pair.a.hub.runners.state_of(pair.id), "gateway", closed.id))
    assert outcome(pair.b, adopt_on_b(pair, closed, job_id, lease)) is None, "a closed gateway"


def maintained(pair: Pair) -> None:
    """One watchdog and maintenance pass on each replica (the one holding ``maintenance`` acts)."""
    for server in (pair.a, pair.b):
        server.call(server.hub.runners.tick())


def test_maintenance_closes_a_dead_owner_s_gateway_nothing_adopted_within_60_s_but_a_running_job_s(
    pair: Pair,
) -> None:
    settings = Settings(database_url=pair.a.settings.database_url)
    orphan, kept = opened_on_a(pair), opened_on_a(pair)
    job_id, _ = held_job(pair)
    raw_sql(settings, "INSERT INTO job_turn (job_id, tenant, attempt, runner_id, profile, marker, state, created_at,"
            " updated_at, connection_id, first_seq, runtime_session_id) VALUES (?, 'default', 1, ?, 'default', 'm',"
            " 'submitted', 1, 1, ?, 1, 'rt-1')", job_id, pair.id, kept.id)  # fmt: skip
    raw_sql(settings, "UPDATE runner_gateway SET owner_replica = 'rep_dead' WHERE id IN (?, ?)", orphan.id, kept.id)
    maintained(pair)
    found = gateway_row(pair, orphan.id)
    assert found["orphaned_at"] is not None and found["closed_at"] is None, "found, not closed yet"
    assert gateway_row(pair, kept.id)["orphaned_at"] is None, "the channel of a job not terminal stays"
    raw_sql(settings, "UPDATE runner_gateway SET orphaned_at = orphaned_at - ? WHERE id = ?", ORPHAN_CLOSE_MS - 1000,
            orphan.id)  # fmt: skip
    maintained(pair)
    assert gateway_row(pair, orphan.id)["closed_at"] is None, "59 s after it was found"
    raw_sql(settings, "UPDATE runner_gateway SET orphaned_at = orphaned_at - 2000 WHERE id = ?", orphan.id)
    maintained(pair)
    assert gateway_row(pair, orphan.id)["closed_at"] is not None
    close = take(pair.on_b, "gateway.close")
    assert close["payload"] == {"connectionId": orphan.id}
    assert assert_machine_ok(pair.on_b.post("admit", {"id": close["id"]})) == {"allowed": True}
    assert_machine_ok(pair.on_b.post("result", {"id": close["id"], "result": {"ok": True}}))
    raw_sql(settings, "UPDATE hermes_job SET state = 'CANCELLED', lease_id = NULL, lease_owner_principal = NULL,"
            " lease_owner_instance = NULL, lease_acquired_at = NULL, lease_expires_at = NULL WHERE id = ?",
            job_id)  # fmt: skip
    maintained(pair)
    assert gateway_row(pair, kept.id)["orphaned_at"] is not None, "once its job is terminal"


def granted_on_a(pair: Pair, tools: ProbeTools, account: AccountRef | None = None) -> Grant:
    """A grant opened by replica A (executor and ``tools`` of kind ``probe``), its ``grant.create`` taken, admitted
    and answered through replica B."""
    return probe_grant(pair.a, pair.on_b, tools, account or pair.account())


def test_a_tool_call_runs_on_the_replica_it_reached_once_for_its_call_id(pair: Pair) -> None:
    tools = ProbeTools(pair.a, pair.b)
    grant = granted_on_a(pair, tools)
    first = assert_machine_ok(pair.on_b.post("tool", call(grant, "c1")))
    assert first == {"result": {"ran": "probe.echo", "on": "b", "grant": grant.id, "tools": {"kind": "probe", "n": 1}}}
    assert assert_machine_ok(pair.on_a.post("tool", call(grant, "c1"))) == first, "the first outcome, from A too"
    assert_machine_error(pair.on_a.post("tool", call(grant, "c1", other=1)), 409, "idempotency_conflict")
    own = assert_machine_ok(pair.on_a.post("tool", call(grant, "c2")))
    assert own["result"]["on"] == "a", "the owner runs with the grant's own executor"
    assert tools.ran == [("b", "probe.echo"), ("a", "probe.echo")]


def test_a_duplicate_on_another_replica_waits_for_the_running_call(pair: Pair) -> None:
    tools = ProbeTools(pair.a, pair.b)
    grant = granted_on_a(pair, tools)
    other = pair.on_a.twin()
    with ThreadPoolExecutor(max_workers=2) as pool:
        running = pool.submit(pair.on_b.post, "tool", call(grant, "c1", hold=True))
        wait_until(lambda: tools.ran == [("b", "probe.echo")], what="the call to run on B")
        duplicate = pool.submit(other.post, "tool", call(grant, "c1", hold=True))
        runners = pair.a.hub.runners
        assert isinstance(runners, SharedRunnerHub)
        wait_until(lambda: runners.waiting_calls() == 1, what="the duplicate to wait on A")
        tools.release.set()
        assert assert_machine_ok(duplicate.result(10)) == assert_machine_ok(running.result(10))
    other.close()
    assert tools.ran == [("b", "probe.echo")], "run once"


def test_a_call_left_running_by_a_replica_no_longer_live_is_taken_over_and_run_once(pair: Pair) -> None:
    tools = ProbeTools(pair.a, pair.b)
    grant = granted_on_a(pair, tools)
    fingerprint = sha256_hex(canonical_json(["probe.echo", {}]))
    raw_sql(pair.a.settings, "INSERT INTO runner_tool_call (grant_id, call_id, fingerprint, status, replica, "
            "started_at) VALUES (?, 'c1', ?, 'running', 'rep_gone', 0)", grant.id, fingerprint)  # fmt: skip
    assert assert_machine_ok(pair.on_b.post("tool", call(grant, "c1")))["result"]["on"] == "b"
    assert assert_machine_ok(pair.on_a.post("tool", call(grant, "c1")))["result"]["on"] == "b"
    [row] = raw_sql(pair.a.settings, "SELECT status, attempt, replica FROM runner_tool_call WHERE grant_id = ?",
                    grant.id)  # fmt: skip
    replica = pair.b.hub.replica
    assert replica is not None
    assert row == {"status": "done", "attempt": 2, "replica": replica.id}
    assert tools.ran == [("b", "probe.echo")]


def test_the_128_call_limit_holds_across_replicas(pair: Pair) -> None:
    tools = ProbeTools(pair.a, pair.b)
    grant = granted_on_a(pair, tools)
    for n in range(128):
        assert_machine_ok((pair.on_a if n % 2 else pair.on_b).post("tool", call(grant, f"c{n}")))
    assert_machine_error(pair.on_b.post("tool", call(grant, "c128")), 429, "runner_call_limit")
    assert_machine_error(pair.on_a.post("tool", call(grant, "c129")), 429, "runner_call_limit")
    assert assert_machine_ok(pair.on_a.post("tool", call(grant, "c5")))["result"]["on"] == "a", "a repeat still answers"
    assert len(tools.ran) == 128


def test_an_account_that_lost_its_access_stops_the_owner_s_turn_from_the_other_replica(pair: Pair) -> None:
    body = {"username": "uma", "password": PASSWORD, "role": "user", "allowedProfiles": {"local": ["default"]}}
    assert pair.admin.post("/api/admin/accounts", json=body).status_code == 201
    tools = ProbeTools(pair.a, pair.b)
    grant = granted_on_a(pair, tools, pair.account("uma"))
    assert pair.admin.patch("/api/admin/accounts/uma", json={"canManageTeam": True}).status_code == 200
    assert_machine_error(pair.on_b.post("tool", call(grant, "c1")), 403, "team_tools_forbidden")
    wait_until(grant.revoked.is_set, what="A's grant to be revoked")
    assert_machine_error(pair.on_b.post("tool", call(grant, "c2")), 403, "team_tools_forbidden")
    assert tools.ran == []


def test_a_tool_refusing_its_round_on_the_other_replica_closes_the_grant_and_the_turn_goes_on(pair: Pair) -> None:
    tools = ProbeTools(pair.a, pair.b)
    grant = granted_on_a(pair, tools)
    assert_machine_error(pair.on_b.post("tool", call(grant, "c1", refuse=True)), 403, "team_tools_forbidden")
    closing = take(pair.on_a, "grant.close")
    wait_until(lambda: not grant.open, what="A's grant to close")
    assert not grant.revoked.is_set(), "the turn goes on without tools"
    assert_machine_error(pair.on_a.post("tool", call(grant, "c2")), 410, "runner_grant_expired")
    assert_machine_ok(pair.on_b.post("result", {"id": closing["id"], "result": {"ok": True}}))


def test_a_grant_closed_by_its_owner_refuses_calls_on_the_other_replica(pair: Pair) -> None:
    tools = ProbeTools(pair.a, pair.b)
    grant = granted_on_a(pair, tools)
    closed = spawn(pair.a, pair.a.hub.channels.close_grant(grant))
    closing = take(pair.on_b, "grant.close")
    assert assert_machine_ok(pair.on_b.post("admit", {"id": closing["id"]})) == {"allowed": True}
    assert_machine_ok(pair.on_b.post("result", {"id": closing["id"], "result": {"ok": True}}))
    assert outcome(pair.a, closed) is None
    assert_machine_error(pair.on_b.post("tool", call(grant, "c1")), 410, "runner_grant_expired")
    assert tools.ran == []


def test_the_reapers_attachment_sweep_is_the_maintenance_replicas_alone(pair: Pair, clock: ManualClock) -> None:
    a, b = pair.a, pair.b
    assert a.hub.replica is not None and b.hub.replica is not None
    assert a.hub.replica.holds("maintenance") and not b.hub.replica.holds("maintenance")
    add_account(a, "uma", allowed_profiles={"local": ["default"]})
    uma = login(b, "uma")
    bot = uma.post("/api/bots", json={"name": "Helper", "source": "local", "profile": "default"})
    assert bot.status_code == 201, bot.text
    made = uma.post("/api/conversations", json={"botId": bot.json()["bot"]["id"]})
    conversation_id = made.json()["conversation"]["id"]
    upload = uma.post(f"/api/conversations/{conversation_id}/attachments", content=b"notes",
                      params={"name": "notes.txt"}, headers={"Content-Type": "text/plain"})  # fmt: skip
    assert upload.status_code == 201, upload.text
    settings = Settings(database_url=pair.a.settings.database_url)

    def state() -> str:
        [row] = raw_sql(settings, "SELECT state FROM chat_attachment")
        return str(row["state"])

    clock.advance(3600.001)
    b.hub.tick()
    assert state() == "uploaded", "not the maintenance replica: its reaper leaves the table-wide sweep"
    a.hub.tick()
    assert state() == "expired"
    uma.close()


def test_failed_sign_ins_on_one_replica_throttle_the_other(pair: Pair) -> None:
    add_account(pair.a, "uma")
    clients = {name: hub.client(headers={"Origin": hub.url}) for name, hub in (("a", pair.a), ("b", pair.b))}
    try:
        for _ in range(LOGIN_MAX_FAILURES):
            wrong = clients["a"].post("/api/auth/login", json={"username": "uma", "password": "not it"})
            assert wrong.status_code == 401, wrong.text
        refused = clients["b"].post("/api/auth/login", json={"username": "uma", "password": PASSWORD})
        assert refused.status_code == 429 and refused.json()["code"] == "login_throttled", refused.text
        assert 1 <= int(refused.headers["Retry-After"]) <= 300
        keys = raw_sql(Settings(database_url=pair.a.settings.database_url), "SELECT key FROM login_failure")
        assert keys and not any("uma" in row["key"] or "127.0.0.1" in row["key"] for row in keys)
    finally:
        for client in clients.values():
            client.close()


def test_team_reconciler_passes_run_on_the_maintenance_replica_alone(pair: Pair) -> None:
    a, b = pair.a.hub.team_reconciler, pair.b.hub.team_reconciler
    assert a is not None and b is not None
    before = a.reconcile.passes
    wait_until(lambda: a.reconcile.passes >= before + 2, what="two passes on the maintenance replica", timeout=10)
    assert b.reconcile.passes == 0
    assert b.run_once().signals == [] and b.reconcile.passes == 0
