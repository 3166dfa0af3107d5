"""Canonical JSON and digests (lifecycle.md section 1.2)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Built once: ``json.dumps`` with options makes a new encoder on every call (a few microseconds each,
# and the engine encodes about 25 values per job lifecycle).
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def compact_json(value: Any) -> str:
    """Compact JSON text with the keys in their order (team tools' results, team-tools.md 6.1: ids and states
    first), non-ASCII kept."""
    return _COMPACT(value)


def canonical_json(value: Any) -> bytes:
    """UTF-8 bytes of the canonical JSON form: sorted keys, no spaces, no NaN, non-ASCII kept."""
    return _ENCODE(value).encode("utf-8")


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """Lowercase hex SHA-256 of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))
