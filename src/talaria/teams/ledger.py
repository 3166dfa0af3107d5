"""The request ledger of mutating team tools (team-tools.md 3.5 ``team_request``, 6.1 Idempotency).

A call's key is (tenant, owner, ``requestId``), stored as the SHA-256 of the ``requestId``; its fingerprint is the
audit-keyed digest of ``{bot, tool, arguments}`` (the caller's bot id, the tool and its checked arguments). Inside
the call's write transaction: ``replay`` answers the stored result, byte for byte, for the same key and
fingerprint (no effect, audit or evidence follows), 409 ``idempotency_conflict`` for another fingerprint, and None
when the key is new or its entry expired; an applied call then ``keep``s its answer. Failures keep nothing. Entries
last ``TEAM_REQUEST_KEEP_S`` (30 days), across restarts; ``prune`` drops expired ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from talaria.canonical import sha256_hex
from talaria.errors import TalariaError
from talaria.lifecycle.audit_key import AuditKey
from talaria.limits import TEAM_REQUEST_KEEP_S
from talaria.store.interface import Tx


@dataclass(frozen=True)
class Request:
    """One mutating call's ledger key and fingerprint."""

    tenant: str
    owner: str
    request_hash: str
    fingerprint: str
    tool: str
    bot_id: str

    @classmethod
    def of(cls, key: AuditKey, *, tenant: str, owner: str, bot_id: str, tool: str,
           arguments: dict[str, Any]) -> Request:  # fmt: skip
        request_id = str(arguments["requestId"])
        return cls(
            tenant=tenant, owner=owner, request_hash=sha256_hex(request_id), tool=tool, bot_id=bot_id,
            fingerprint=key.digest({"bot": bot_id, "tool": tool, "arguments": arguments}),
        )  # fmt: skip


def replay(tx: Tx, request: Request, now_ms: int) -> str | None:
    """The stored answer of ``request``'s key if it is live and has its fingerprint; None if new or expired;
    409 ``idempotency_conflict`` if live with another fingerprint."""
    row = tx.one("team_request_get", tenant=request.tenant, owner=request.owner, request_hash=request.request_hash)
    if row is None or int(row["expires_at"]) <= now_ms:
        return None
    if row["fingerprint"] != request.fingerprint:
        raise TalariaError("idempotency_conflict", "this requestId was used for another call; use a new one")
    return str(row["result"])


def keep(tx: Tx, request: Request, result: str, now_ms: int) -> None:
    """Store an applied call's answer (the exact text the caller gets) under its key."""
    written = tx.run(
        "team_request_put", tenant=request.tenant, owner=request.owner, request_hash=request.request_hash,
        fingerprint=request.fingerprint, tool=request.tool, bot_id=request.bot_id, result=result, now=now_ms,
        expires_at=now_ms + TEAM_REQUEST_KEEP_S * 1000,
    )  # fmt: skip
    if written != 1:  # a live entry of this key exists: replay should have answered it in this transaction
        raise TalariaError("idempotency_conflict", "this requestId was used for another call; use a new one")


def prune(tx: Tx, now_ms: int) -> int:
    """Drop expired entries; how many."""
    return tx.run("team_request_prune", now=now_ms)
