"""Open the store named by the settings: SQLite in the data directory, or PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from talaria.errors import StoreUnavailable
from talaria.settings import Settings
from talaria.store import data_dir as modes
from talaria.store import hub_lock
from talaria.store.interface import Signals, Store
from talaria.store.sqlite import SQLiteStore

SQLITE_NAME = "talaria.sqlite3"
MISSING_DRIVER = "database.url names PostgreSQL but its driver is missing: pip install 'talaria[postgresql]'"


def open_sqlite(data_dir: Path, *, busy_timeout_ms: int = 5000, wal_limit_bytes: int = 67_108_864) -> SQLiteStore:
    """The SQLite store of ``data_dir``, creating the directory (0700) and the database (0600) when missing and
    tightening existing ones; raises ``StoreUnavailable`` naming the path it cannot make private."""
    modes.prepare(data_dir)
    path = data_dir / SQLITE_NAME
    modes.create_private(path)
    store = SQLiteStore(path, busy_timeout_ms=busy_timeout_ms, wal_limit_bytes=wal_limit_bytes)
    try:
        modes.tighten(data_dir)  # -wal and -shm, which SQLite has just created
    except BaseException:
        store.close()
        raise
    return store


def open_store(settings: Settings, *, application_name: str = "talaria", hub: bool = False) -> Store:
    """The store ``database.url`` names: empty, the SQLite file of the data directory; else PostgreSQL (the
    ``talaria[postgresql]`` extra), reached and checked here so that a hub stops before it binds, with one line.
    ``hub``: the store of a running hub, which holds ``hub.lock`` of its SQLite directory (on PostgreSQL replicas
    share the database: nothing is held)."""
    if not settings.database_url:
        lock = None
        if hub:  # one SQLite directory, one hub (scale.md 1)
            modes.prepare(settings.data_dir)
            lock = hub_lock.hold(settings.data_dir)
        return _holding(lock, lambda: open_sqlite(
            settings.data_dir,
            busy_timeout_ms=settings.storage_sqlite_busy_timeout_ms,
            wal_limit_bytes=settings.storage_sqlite_wal_limit_bytes,
        ))  # fmt: skip
    return open_postgres(settings, application_name=application_name)


def check_database(settings: Settings) -> None:
    """Before a hub binds (scale.md 6.2): on PostgreSQL, the driver is installed and the server answers (15 or
    newer); else ``StoreUnavailable`` with one line. Nothing to check for SQLite."""
    if not settings.database_url:
        return
    try:
        from talaria.store.postgres.admin import check_server
    except ImportError as exc:
        raise StoreUnavailable(MISSING_DRIVER) from exc
    check_server(settings.database_url)


def open_postgres(settings: Settings, *, application_name: str = "talaria") -> Store:
    """The pool's first connection checks the server (``PostgresStore``); ``check_database`` is for a caller that
    must know before it binds."""
    try:
        from talaria.store.postgres.store import PoolSettings, PostgresStore
    except ImportError as exc:
        raise StoreUnavailable(MISSING_DRIVER) from exc

    modes.prepare(settings.data_dir)  # private as on SQLite: a key file kept from before hub_secret may be read
    pool = PoolSettings(
        pool_min=settings.database_pool_min,
        pool_max=settings.database_pool_max,
        pool_timeout_ms=settings.database_pool_timeout_ms,
        statement_timeout_ms=settings.database_statement_timeout_ms,
        application_name=application_name,
    )
    return PostgresStore(settings.database_url, pool)  # replicas share the database (scale.md 1; ADR 0053)


def signals_of(store: Store, *, listen: bool) -> Signals:
    """The wake-ups between the replicas of a PostgreSQL store (scale.md 3.3): LISTEN/NOTIFY, or with
    ``listen=False`` notify only (every waiter then relies on its fallback query)."""
    from talaria.store.postgres.store import PostgresStore

    if not isinstance(store, PostgresStore):
        raise TypeError("only a PostgreSQL store has replicas to wake")
    return store.signals(listen=listen)


class _Closing(Protocol):
    def on_close(self, release: Callable[[], None]) -> None: ...


class _Lock(Protocol):
    def release(self) -> None: ...


S = TypeVar("S", bound=_Closing)


def _holding(lock: _Lock | None, make: Callable[[], S]) -> S:
    """``make()`` holding ``lock`` until the store closes; the lock is let go at once when opening fails."""
    try:
        store = make()
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if lock is not None:
        store.on_close(lock.release)
    return store
