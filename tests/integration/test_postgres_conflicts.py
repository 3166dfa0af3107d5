"""Transactions PostgreSQL gives up for a concurrent one (scale.md 2.3): a deadlock between two writers is
``StoreConflict`` (a 503 ``store_unavailable`` that may be run again), and the lifecycle engine's and chat's write
helpers run such a transaction again, 3 attempts in all, before answering 503."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from talaria.clock import ManualClock, SystemClock
from talaria.errors import StoreConflict, TalariaError
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store.interface import Tx
from talaria.store.postgres.store import PostgresStore
from talaria.testing.hub_server import HubServer
from talaria.testing.postgres_server import PostgresServer
from tests.backends import postgres_database, raw_sql


@pytest.fixture
def url(postgres_server: PostgresServer) -> Iterator[str]:
    with postgres_database(postgres_server, migrated=True) as made:
        yield made


def test_a_deadlock_between_two_writers_is_a_store_conflict_for_one_of_them(url: str) -> None:
    a, b = PostgresStore(url), PostgresStore(url)
    try:
        with a.write() as tx:
            tx.script("INSERT INTO tenant (name, created_at) VALUES ('one', 1), ('two', 1)")
        both_hold = threading.Barrier(2, timeout=20)

        def cross(store: PostgresStore, first: str, second: str) -> BaseException | None:
            try:
                with store.write() as tx:
                    tx.script(f"SELECT name FROM tenant WHERE name = '{first}' FOR UPDATE")
                    both_hold.wait()
                    tx.script(f"SELECT name FROM tenant WHERE name = '{second}' FOR UPDATE")
            except TalariaError as exc:
                return exc
            return None

        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = [pool.submit(cross, a, "one", "two"), pool.submit(cross, b, "two", "one")]
            results = [f.result(30) for f in outcomes]
        conflicts = [r for r in results if r is not None]
        assert len(conflicts) == 1, results  # PostgreSQL chose one victim; the other committed
        [conflict] = conflicts
        assert isinstance(conflict, StoreConflict) and (conflict.code, conflict.status) == ("store_unavailable", 503)
    finally:
        a.close()
        b.close()


class Conflicting:
    """A real store whose next ``conflicts`` write transactions are given up as PostgreSQL gives up a deadlock's
    victim (the store itself is the real one: only the failure is injected): at their start, or with ``at_commit``
    once their statements ran (the real transaction rolls back)."""

    def __init__(self, store: PostgresStore, conflicts: int, *, at_commit: bool = False) -> None:
        self.store, self.conflicts, self.writes, self.at_commit = store, conflicts, 0, at_commit
        self.dialect = store.dialect

    def write(self) -> AbstractContextManager[Tx]:
        self.writes += 1
        if self.conflicts > 0:
            self.conflicts -= 1
            return _rolled_back(self.store) if self.at_commit else _raising()
        return self.store.write()

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


@contextmanager
def _raising() -> Iterator[Tx]:
    raise StoreConflict()
    yield  # pragma: no cover


@contextmanager
def _rolled_back(store: PostgresStore) -> Iterator[Tx]:
    with store.write() as tx:
        yield tx
        raise StoreConflict()  # at the commit: the real transaction rolls back


@pytest.mark.parametrize(("conflicts", "made"), [(2, True), (3, False)])
def test_the_engine_runs_a_given_up_transaction_again_three_attempts_in_all(
    url: str, tmp_path: Path, conflicts: int, made: bool
) -> None:
    real = PostgresStore(url)
    try:
        with real.write() as tx:
            tx.run("tenant_ensure", name="default", now=1)
        store = Conflicting(real, conflicts)
        engine = Engine(store, ManualClock(1_700_000_000_000), Settings(data_dir=tmp_path))  # type: ignore[arg-type]
        author = Actor("acct:default/alice", frozenset(), "web", "default")

        def create() -> object:
            return engine.create_task(author, tenant="default", title="x", spec={"prompt": "hi"}, cell="local",
                                      profile="default", trace="a" * 32)  # fmt: skip

        if made:
            assert create() is not None
        else:
            with pytest.raises(StoreConflict):
                create()
        assert store.writes == 3
        assert raw_sql(Settings(database_url=url), "SELECT count(*) AS n FROM task") == [{"n": 1 if made else 0}]
    finally:
        real.close()


@pytest.mark.parametrize(("conflicts", "made"), [(2, True), (3, False)])
def test_chat_runs_a_given_up_write_again_three_attempts_in_all(
    url: str, tmp_path: Path, conflicts: int, made: bool
) -> None:
    """``ChatContext._write`` (every chat turn's write goes through it): each attempt runs the whole write again; the
    given-up ones leave nothing."""
    server = HubServer(tmp_path / "hub", SystemClock(), database_url=url).start()
    engine = server.hub.chat_engine
    real = engine.store
    assert isinstance(real, PostgresStore)
    store = Conflicting(real, conflicts, at_commit=True)
    tries: list[int] = []

    def write(tx: Tx) -> list[Any]:
        tries.append(len(tries) + 1)
        tx.run("tenant_ensure", name="written-by-chat", now=1)
        return []

    engine.store = store  # type: ignore[assignment]
    try:
        if made:
            engine._write("cnv_01PROBE", write)
        else:
            with pytest.raises(StoreConflict):
                engine._write("cnv_01PROBE", write)
    finally:
        engine.store = real
        server.stop()
    assert store.writes == 3 and tries == [1, 2, 3]
    rows = raw_sql(Settings(database_url=url), "SELECT count(*) AS n FROM tenant WHERE name = 'written-by-chat'")
    assert rows == [{"n": 1 if made else 0}]
