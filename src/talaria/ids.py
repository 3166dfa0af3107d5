"""Identifiers: prefixed ULIDs for hub-minted ids, 128-bit random hex for lease ids."""

from __future__ import annotations

import base64
import re
import secrets

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
OPAQUE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


_STANDARD_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_TO_CROCKFORD = str.maketrans(_STANDARD_B32, _CROCKFORD)


def ulid(now_ms: int) -> str:
    """A ULID: 48-bit millisecond time then 80 random bits, Crockford base32 (26 characters)."""
    value = (now_ms & ((1 << 48) - 1)) << 80 | secrets.randbits(80)
    # 26 base32 characters are 130 bits: two zero bits, then the 128-bit value; padded to 160 bits
    # so the C base32 encoder can do the work.
    return base64.b32encode((value << 30).to_bytes(20, "big"))[:26].decode().translate(_TO_CROCKFORD)


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
