"""Identifiers: prefixed ULIDs for hub-minted ids, 128-bit random hex for lease ids."""

from __future__ import annotations

import re
import secrets

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
OPAQUE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")


# Every pair of Crockford characters, indexed by the 10 bits they encode.
_PAIRS = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)
_MASK48 = (1 << 48) - 1


def ulid(now_ms: int) -> str:
    """A ULID: 48-bit millisecond time then 80 random bits, Crockford base32 (26 characters)."""
    value = (now_ms & _MASK48) << 80 | secrets.randbits(80)
    # 26 characters are 130 bits: the first holds two zero bits and the top 3 bits, then 12 pairs of
    # 10 bits and the last 5 bits (a table lookup per pair: the engine mints 15 ids per job lifecycle).
    pairs = _PAIRS
    return "".join(
        (
            _CROCKFORD[value >> 125],
            pairs[(value >> 115) & 1023],
            pairs[(value >> 105) & 1023],
            pairs[(value >> 95) & 1023],
            pairs[(value >> 85) & 1023],
            pairs[(value >> 75) & 1023],
            pairs[(value >> 65) & 1023],
            pairs[(value >> 55) & 1023],
            pairs[(value >> 45) & 1023],
            pairs[(value >> 35) & 1023],
            pairs[(value >> 25) & 1023],
            pairs[(value >> 15) & 1023],
            pairs[(value >> 5) & 1023],
            _CROCKFORD[value & 31],
        )
    )


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
