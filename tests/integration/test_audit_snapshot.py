"""``audit.verify`` reads one snapshot (lifecycle.md 8; issue 11, defect 3), deterministically.

A store wrapper commits a new audit event from inside verify's reads, at the moments a live hub could: right after
the scan has reached the end of the chain (before the fix the head was read in a later read transaction, which saw
that event and answered ``seq_gap``), and after every page of a paged scan (one snapshot: the events committed
meanwhile are not counted). Real SQLite in a temporary directory; the writes go through the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from talaria.clock import ManualClock
from talaria.lifecycle import audit
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.engine import Engine
from talaria.settings import Settings
from talaria.store import migrations
from talaria.store.interface import Row, Tx
from talaria.store.sqlite import SQLiteStore

ALICE = Actor("acct:default/alice", frozenset(), "web", "default")


class Chain:
    """A store with tasks created through the engine; ``add()`` commits one more ``task.created`` event."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True)
        self.store = SQLiteStore(data_dir / "talaria.sqlite3")
        migrations.upgrade(self.store)
        self.clock = ManualClock()
        self.engine = Engine(self.store, self.clock, Settings(data_dir=data_dir))
        with self.store.write() as tx:
            tx.run("tenant_ensure", name="default", now=self.clock.now_ms())

    def add(self) -> None:
        self.clock.advance(1)
        self.engine.create_task(
            ALICE, tenant="default", title="t", spec={"prompt": "p"}, cell="local", profile="default", trace="a" * 32
        )

    def head(self) -> Row:
        with self.store.read() as tx:
            head = tx.one("audit_head_get")
        assert head is not None
        return head


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[Chain]:
    made = Chain(tmp_path / "data")
    try:
        yield made
    finally:
        made.store.close()


class _HookedTx:
    def __init__(self, tx: Tx, after: Callable[[str, Any], None]) -> None:
        self._tx = tx
        self._after = after
        self.dialect = tx.dialect

    def one(self, query: str, /, **params: Any) -> Row | None:
        row = self._tx.one(query, **params)
        self._after(query, row)
        return row

    def all(self, query: str, /, **params: Any) -> list[Row]:
        rows = self._tx.all(query, **params)
        self._after(query, rows)
        return rows

    def run(self, query: str, /, **params: Any) -> int:
        return self._tx.run(query, **params)

    def script(self, sql: str, /) -> None:
        self._tx.script(sql)


class HookedStore:
    """The chain's store, whose read transactions call ``after(query, result)`` after each query."""

    def __init__(self, store: SQLiteStore, after: Callable[[str, Any], None]) -> None:
        self.dialect = store.dialect
        self._store = store
        self._after = after
        self.reads = 0

    def write(self) -> AbstractContextManager[Tx]:
        return self._store.write()

    @contextmanager
    def _read(self) -> Iterator[Tx]:
        self.reads += 1
        with self._store.read() as tx:
            yield _HookedTx(tx, self._after)

    def read(self) -> AbstractContextManager[Tx]:
        return self._read()

    def ping(self) -> bool:
        return self._store.ping()

    def migrating(self) -> AbstractContextManager[None]:
        return self._store.migrating()

    def maintain(self) -> None:
        self._store.maintain()

    def close(self) -> None:
        self._store.close()


def test_an_event_committed_after_the_scan_reached_the_end_is_not_a_seq_gap(chain: Chain) -> None:
    for _ in range(5):
        chain.add()
    before = chain.head()
    committed: list[int] = []

    def after(query: str, result: Any) -> None:
        # The scan has found no further event: a live hub commits one now, before verify reads the head.
        if query == "audit_scan" and result == [] and not committed:
            chain.add()
            committed.append(1)

    report = audit.verify(HookedStore(chain.store, after))
    assert committed, "the hook ran"
    assert chain.head()["seq"] == before["seq"] + 1, "the event was committed during verify"
    assert report == audit.ChainReport(True, before["seq"], before["hash"]), report.line()
    assert audit.verify(chain.store) == audit.ChainReport(True, before["seq"] + 1, chain.head()["hash"])


def test_a_paged_scan_reads_one_snapshot_whatever_commits_between_pages(chain: Chain) -> None:
    for _ in range(7):
        chain.add()
    before = chain.head()
    pages: list[int] = []

    def after(query: str, result: Any) -> None:
        # The first three pages of the scan are each followed by a commit.
        if query == "audit_scan" and result:
            pages.append(len(result))
            if len(pages) <= 3:
                chain.add()

    hooked = HookedStore(chain.store, after)
    report = audit.verify(hooked, batch=2)
    assert pages == [2, 2, 2, 1], "the scan paged through the chain as it was when verify began"
    assert report == audit.ChainReport(True, before["seq"], before["hash"]), report.line()
    assert hooked.reads == 1, "head and every page are read in one read transaction"
    assert audit.verify(chain.store, batch=2).events == before["seq"] + 3
