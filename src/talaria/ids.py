"""Identifiers: prefixed ULIDs for hub-minted ids, 128-bit random hex for lease ids."""

from __future__ import annotations

import re
import secrets

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
OPAQUE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def ulid(now_ms: int) -> str:
    """A ULID: 48-bit millisecond time then 80 random bits, Crockford base32 (26 characters)."""
    value = (now_ms & ((1 << 48) - 1)) << 80 | secrets.randbits(80)
    out = []
    for _ in range(26):
        out.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(out))


def mint(prefix: str, now_ms: int) -> str:
    """``tsk_01J...``: a prefixed ULID (prefixes: tsk, dsp, run, job, evt, evd, ...)."""
    return f"{prefix}_{ulid(now_ms)}"


def lease_id() -> str:
    """128 bits from a CSPRNG as 32 lowercase hex characters."""
    return secrets.token_hex(16)


def trace_id() -> str:
    """A W3C trace-id: 32 lowercase hex characters, not all zero."""
    while True:
        value = secrets.token_hex(16)
        if value != "0" * 32:
            return value
