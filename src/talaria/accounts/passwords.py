"""Argon2id password hashes (argon2-cffi). Only account passwords: runner tokens are SHA-256."""

from __future__ import annotations

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

_hasher = PasswordHasher()
# Verified against when the username is unknown, so both failures cost the same time.
_DUMMY = _hasher.hash("talaria-dummy-password")


def hash_password(password: str) -> str:
    return str(_hasher.hash(password))


def verify_password(stored: str | None, password: str) -> bool:
    """Constant-cost check; an unknown account (``stored`` None) still spends one verification."""
    try:
        return bool(_hasher.verify(stored or _DUMMY, password)) and stored is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
