"""Open the store named by the settings: SQLite in the data directory, or PostgreSQL."""

from __future__ import annotations

from talaria.settings import Settings
from talaria.store.interface import Store
from talaria.store.sqlite import SQLiteStore


def open_store(settings: Settings) -> Store:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(
        settings.sqlite_path,
        busy_timeout_ms=settings.storage_sqlite_busy_timeout_ms,
        wal_limit_bytes=settings.storage_sqlite_wal_limit_bytes,
    )
