"""The hub's two keys (the web-session key ``secret.key``, the audit key ``audit.key``; chat.md 8): on SQLite files
of the data directory, made at first use; on PostgreSQL ``hub_secret`` rows every replica reads, made by the first
one (scale.md 1). A PostgreSQL hub that kept the file before the rows existed brings its bytes to the row, so
sessions and keyed digests carry over. The bytes are never logged."""

from __future__ import annotations

import secrets
from pathlib import Path

from talaria.errors import StoreUnavailable
from talaria.store.data_dir import key_file
from talaria.store.interface import Store

KEY_NAMES = ("secret.key", "audit.key")


def hub_key(store: Store, data_dir: Path, name: str, now_ms: int) -> bytes:
    if store.dialect != "postgresql":
        return key_file(data_dir / name)
    kept = data_dir / name
    value = kept.read_bytes() if kept.is_file() else secrets.token_bytes(32)
    with store.write() as tx:  # the read in the same transaction sees the row, this replica's or the first one's
        tx.run("hub_secret_make", name=name, value=value, now=now_ms)
        row = tx.one("hub_secret_get", name=name)
    if row is None:
        raise StoreUnavailable(f"the hub key {name} is missing")
    return bytes(row["value"])
