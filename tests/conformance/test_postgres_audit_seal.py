"""The audit chain under concurrent writers on PostgreSQL (scale.md 2.4, ADR 0042): an audited transaction records
its event as pending; the sealer chains events whose transactions have all ended, in transaction-id order, so an
open transaction holds later commits back instead of letting them overtake it; two sealers chain each event once;
listings show unsealed events first; removing the step is refused while events wait."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from talaria.clock import ManualClock, SystemClock
from talaria.errors import StoreUnavailable
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.audit_sealer import AuditSealer
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.interface import Store
from talaria.store.postgres.store import PostgresStore
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database
from tests.integration.runner_support import metric_value, metrics_text

NOW = 1_784_628_000_000
ACTOR = Actor("acct:default/alice", frozenset(), "web", "default")


@pytest.fixture
def url(postgres_server: PostgresServer) -> Iterator[str]:
    with postgres_database(postgres_server, migrated=True) as made:
        yield made


@pytest.fixture
def stores(url: str) -> Iterator[list[PostgresStore]]:
    """Two stores of one database, as two replicas would hold them."""
    made = [PostgresStore(url), PostgresStore(url)]
    yield made
    for store in made:
        store.close()


def record(store: Store, task: str) -> str:
    with store.write() as tx:
        return audit.append(tx, now_ms=NOW, type="task.created", tenant="default", actor=ACTOR,
                            subject=audit.Subject(task=task))  # fmt: skip


def chained(store: Store) -> list[tuple[int, str | None]]:
    with store.read() as tx:
        return [(int(r["seq"]), r["task_id"]) for r in tx.all("audit_scan", after_seq=0, limit=100)]


def test_an_event_waits_unsealed_and_is_listed_first_until_the_sealer_chains_it(stores: list[PostgresStore]) -> None:
    store = stores[0]
    engine = Engine(store, ManualClock(NOW), Settings())
    record(store, "tsk_a")
    audit.seal_all(store)
    record(store, "tsk_b")
    assert chained(store) == [(1, "tsk_a")]
    listed = engine.list_audit("default", task_id=None, job_id=None, before_seq=None, limit=10)
    top = listed[0]
    assert (top.seq, top.body["subject"]["task"], top.prev_hash, top.hash) == (None, "tsk_b", None, None)
    assert listed[1].seq == 1 and listed[1].hash is not None
    assert audit.seal(store) == 1
    assert chained(store) == [(1, "tsk_a"), (2, "tsk_b")]
    listed = engine.list_audit("default", task_id=None, job_id=None, before_seq=None, limit=10)
    assert [e.seq for e in listed] == [2, 1]
    report = audit.verify(store)
    assert report.ok and report.events == 2 and report.unsealed == 0


def test_an_open_transaction_holds_later_commits_back_and_is_chained_first(stores: list[PostgresStore]) -> None:
    """Below the horizon every transaction has ended: the event of a transaction that began writing first is
    chained first even when it commits last, and nothing after it is chained while it is open."""
    first, second = stores
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def slow() -> None:
        try:
            with first.write() as tx:
                audit.append(tx, now_ms=NOW, type="task.created", tenant="default", actor=ACTOR,
                             subject=audit.Subject(task="tsk_early"))  # fmt: skip
                inside.set()
                release.wait(30)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=slow)
    thread.start()
    try:
        assert inside.wait(30)
        record(second, "tsk_late")  # commits while the first is still open
        assert audit.seal(second) == 0  # held back: the open transaction's id is below it
        report = audit.verify(second)
        assert report.ok and report.line().endswith("(1 not yet sealed)"), report.line()
    finally:
        release.set()
        thread.join(30)
    assert errors == []
    assert audit.seal_all(second) == 2
    assert chained(second) == [(1, "tsk_early"), (2, "tsk_late")]
    assert audit.verify(first).line().startswith("audit chain OK: 2 events")


def test_two_sealers_at_once_chain_each_event_once(stores: list[PostgresStore]) -> None:
    for i in range(60):
        record(stores[i % 2], f"tsk_{i:02d}")
    sealers = [AuditSealer(store, 5000) for store in stores]
    barrier = threading.Barrier(2)

    def seal(index: int) -> None:
        barrier.wait()
        sealers[index].seal_once()

    threads = [threading.Thread(target=seal, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(sealer.sealed for sealer in sealers) == 60
    assert [seq for seq, _ in chained(stores[0])] == list(range(1, 61))
    report = audit.verify(stores[1])
    assert report.ok and report.events == 60


def test_a_round_failing_after_a_committed_batch_counts_the_batch_and_stop_tries_again(
    stores: list[PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the eight-process load test once counted 1,000 events short: a statement timeout behind the other sealers
    # lost the batch committed before it from the count, though the chain held it
    store = stores[0]
    with store.write() as tx:
        for i in range(audit.SEAL_BATCH + 5):
            audit.append(tx, now_ms=NOW, type="task.created", tenant="default", actor=ACTOR,
                         subject=audit.Subject(task=f"tsk_{i:04d}"))  # fmt: skip
    real_batch, calls = audit.seal_batch, []

    def seal_then_fail(
        on: Store, *, limit: int = audit.SEAL_BATCH, wait: bool = True, regardless_of_horizon: bool = False
    ) -> list[int]:  # fmt: skip
        calls.append(on)
        if len(calls) in (2, 3):  # the second batch of the first round, and the first of the stop's round
            raise StoreUnavailable("statement timeout")
        return real_batch(on, limit=limit, wait=wait, regardless_of_horizon=regardless_of_horizon)

    monkeypatch.setattr(audit, "seal_batch", seal_then_fail)
    sealer = AuditSealer(store, 5000)
    assert sealer.seal_once() is None  # the first batch committed, the second failed
    assert sealer.sealed == audit.SEAL_BATCH and sealer.sealed_some.is_set()
    sealer.start()
    sealer.stop()  # its first round fails too; the next seals the rest
    assert len(calls) == 4 and sealer.sealed == audit.SEAL_BATCH + 5
    report = audit.verify(stores[1])
    assert report.ok and report.events == audit.SEAL_BATCH + 5 and report.unsealed == 0


def test_the_sealer_chains_soon_after_an_audited_commit(stores: list[PostgresStore]) -> None:
    store = stores[0]
    sealer = AuditSealer(store, 5000)  # a round far longer than the wait below: only the commit's poke wakes it
    sealer.watch()
    sealer.start()
    try:
        record(store, "tsk_poked")
        assert sealer.sealed_some.wait(3)
        assert chained(store) == [(1, "tsk_poked")]
    finally:
        sealer.stop()


def test_a_regular_round_leaves_a_head_another_sealer_holds_and_the_stop_round_waits_for_it(
    stores: list[PostgresStore],
) -> None:
    record(stores[0], "tsk_held")
    holding, release = threading.Event(), threading.Event()

    def hold_the_head() -> None:
        with stores[1].write() as tx:
            tx.one("audit_head_lock")
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_head)
    holder.start()
    sealer = AuditSealer(stores[0], 5000)
    try:
        assert holding.wait(10)
        assert sealer.seal_once(wait=False) == 0  # no wait behind the other sealer
        assert chained(stores[0]) == []
        threading.Timer(0.2, release.set).start()
        assert sealer.seal_once() == 1  # the stop round waits for the head
    finally:
        release.set()
        holder.join(30)
    assert chained(stores[0]) == [(1, "tsk_held")]


def test_each_sealed_event_s_lag_from_its_occurrence_is_observed(stores: list[PostgresStore]) -> None:
    record(stores[0], "tsk_early")  # both occurred at NOW
    record(stores[1], "tsk_late")
    seen: list[float] = []
    sealer = AuditSealer(stores[0], 5000, clock=ManualClock(NOW + 1500), observe_lag=seen.append, lags_kept=10)
    assert sealer.seal_once() == 2
    assert seen == [1.5, 1.5] and list(sealer.lags_ms) == [(NOW, 1500), (NOW, 1500)]


def test_a_hub_replica_exposes_its_seal_lag(postgres_server: PostgresServer, tmp_path: Path) -> None:
    with postgres_database(postgres_server, migrated=True) as url:
        server = HubServer(tmp_path / "data", SystemClock(), database_url=url).start()
        try:
            record(server.hub.store, "tsk_hub")  # an audited commit through the replica's store pokes its sealer
            assert server.hub.sealer is not None and server.hub.sealer.sealed_some.wait(10)
            count = metric_value(metrics_text(server), "talaria_audit_seal_lag_seconds_count")
            assert count == server.hub.sealer.sealed >= 1
        finally:
            server.stop()


def test_a_stopping_sealer_chains_what_is_left(stores: list[PostgresStore]) -> None:
    store = stores[0]
    sealer = AuditSealer(store, 5000)  # not watching commits: no round comes before the stop
    sealer.start()
    record(store, "tsk_last")
    assert chained(store) == []
    sealer.stop()
    assert chained(store) == [(1, "tsk_last")] and sealer.sealed == 1


def test_removing_the_sealer_step_is_refused_while_events_wait(stores: list[PostgresStore]) -> None:
    store = stores[0]
    migrations.downgrade(store, "team", 0)
    migrations.downgrade(store, "lifecycle", 0)
    record(store, "tsk_waiting")
    with pytest.raises(StoreUnavailable):
        migrations.downgrade(store, "core", 7)
    assert migrations.current(store)["core"] == 8
    assert audit.seal_all(store) == 1
    assert migrations.downgrade(store, "core", 7) == ["core 0008_audit_seal"]
