"""The hub's audit key (chat.md 8): every audit digest of free text (anything a person or a model wrote) is
HMAC-SHA256, hex, of its canonical JSON, keyed with 32 random bytes made once and kept beside ``secret.key`` as
``audit.key`` (mode 0600), or on PostgreSQL in a ``hub_secret`` row (``store/hub_keys.py``). A keyed digest cannot
be tested against guessed texts by someone who reads the audit log but not the key. The key is never logged or
shown. Lifecycle evidence digests stay lifecycle.md's (plain SHA-256)."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

from talaria.canonical import canonical_json
from talaria.store.hub_keys import hub_key
from talaria.store.interface import Store

FILE_NAME = "audit.key"


class AuditKey:
    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def load(cls, store: Store, data_dir: Path, now_ms: int) -> AuditKey:
        """The hub's audit key, made at first use."""
        return cls(hub_key(store, data_dir, FILE_NAME, now_ms))

    def digest(self, value: Any) -> str:
        return hmac.new(self._key, canonical_json(value), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return "AuditKey(<hidden>)"
