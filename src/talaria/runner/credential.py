"""The runner's rotated credential, ``credential.json`` in its state directory (operations.md 4.2).

``{"token": ..., "issuedAt": ..., "previous": ...}``, mode 0600. When present it wins over ``runner.json``'s token,
which is never rewritten (it may be read-only under ``ProtectSystem=strict`` or owned by a config manager).

A write is atomic and durable: a new file in the same directory, created 0600 with ``O_EXCL`` under a random name,
written, fsynced, renamed over ``credential.json``, then the directory fsynced. Leftovers of a crash between the
steps (``.credential-*.tmp``) are removed when the file is opened. Every step leaves a working credential: the old
token stays valid at the hub until the new one is first used, and ``previous`` keeps the old token for the case where
the hub dropped an unused new one (``runners.token_overlap_s``).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

NAME: Final = "credential.json"
_TEMP_PREFIX: Final = ".credential-"
_TEMP_SUFFIX: Final = ".tmp"
MAX_FILE_BYTES: Final = 4096
MAX_TOKEN_CHARS: Final = 512


class CredentialError(Exception):
    """``credential.json`` is not a valid credential (the runner exits with status 2, naming it)."""


@dataclass
class Credential:
    """The token in use and the one before it; ``unconfirmed`` until the hub first answers a request made with it."""

    token: str
    issued_at: int | None = None
    previous: str | None = None
    unconfirmed: bool = False


def _token(value: Any) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= MAX_TOKEN_CHARS and value.isascii() and value.isprintable()


def _parse(path: Path, raw: bytes) -> Credential:
    def bad(why: str) -> CredentialError:
        return CredentialError(f"{path}: invalid credential file: {why}; remove it to use runner.json's token")

    if len(raw) > MAX_FILE_BYTES:
        raise bad(f"larger than {MAX_FILE_BYTES} bytes")
    try:
        body = json.loads(raw)
    except ValueError:
        raise bad("not JSON") from None
    if not isinstance(body, dict) or set(body) != {"token", "issuedAt", "previous"}:
        raise bad("expected exactly the keys token, issuedAt and previous")
    if not _token(body["token"]):
        raise bad("token must be a non-empty printable ASCII string")
    issued = body["issuedAt"]
    if issued is not None and (type(issued) is not int or issued < 0):
        raise bad("issuedAt must be a non-negative integer or null")
    if body["previous"] is not None and not _token(body["previous"]):
        raise bad("previous must be a token or null")
    return Credential(body["token"], issued, body["previous"])


class CredentialFile:
    """``credential.json`` in one runner directory (private, 0700: ``StateDir`` checked it)."""

    def __init__(self, directory: Path, credential: Credential) -> None:
        self.directory = directory
        self.path = directory / NAME
        self.credential = credential

    @classmethod
    def open(cls, directory: Path, config_token: str) -> CredentialFile:
        """Remove a crash's leftovers, then read the file; without one, ``runner.json``'s token is in use."""
        for entry in directory.iterdir():
            if entry.name.startswith(_TEMP_PREFIX) and entry.name.endswith(_TEMP_SUFFIX):
                entry.unlink(missing_ok=True)
        path = directory / NAME
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(directory, Credential(config_token))
        except OSError as exc:
            raise CredentialError(f"{path}: cannot read the credential file: {exc.strerror}") from None
        return cls(directory, _parse(path, raw))

    @property
    def token(self) -> str:
        return self.credential.token

    @property
    def previous(self) -> str | None:
        return self.credential.previous

    def adopt(self, token: str, issued_at: int) -> None:
        """A rotation's new token: written (``previous`` = the token in use) before it is used; unconfirmed until
        the hub first accepts it. Raises ``OSError`` when the file cannot be written (the old token stays)."""
        if not _token(token):
            raise ValueError("the hub's new token is not a printable ASCII string")
        changed = Credential(token, issued_at, self.credential.token, unconfirmed=True)
        self._write(changed)
        self.credential = changed

    def fall_back(self) -> None:
        """The hub refused the token in use and accepted ``previous``: it becomes the token (the hub dropped an
        unused next token). Raises ``OSError`` when the file cannot be written; the token is switched anyway."""
        previous = self.credential.previous
        assert previous is not None
        self.credential = Credential(previous)
        self._write(self.credential)

    def confirm(self) -> bool:
        """The hub answered a request made with the token in use; True the first time after ``adopt``."""
        if not self.credential.unconfirmed:
            return False
        self.credential.unconfirmed = False
        return True

    def _write(self, credential: Credential) -> None:
        body = {"token": credential.token, "issuedAt": credential.issued_at, "previous": credential.previous}
        temp = self.directory / f"{_TEMP_PREFIX}{secrets.token_hex(8)}{_TEMP_SUFFIX}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(json.dumps(body).encode("ascii") + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            self._install(temp)
        finally:
            temp.unlink(missing_ok=True)

    def _install(self, temp: Path) -> None:
        """Rename the written file over ``credential.json`` and make the rename durable."""
        os.replace(temp, self.path)
        directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
