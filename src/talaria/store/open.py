"""Open the store named by the settings: SQLite in the data directory, or PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from talaria.settings import Settings
from talaria.store import data_dir as modes
from talaria.store.interface import Store
from talaria.store.sqlite import SQLiteStore

SQLITE_NAME = "talaria.sqlite3"


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


def open_store(settings: Settings) -> Store:
    return open_sqlite(
        settings.data_dir,
        busy_timeout_ms=settings.storage_sqlite_busy_timeout_ms,
        wal_limit_bytes=settings.storage_sqlite_wal_limit_bytes,
    )
