"""The hash-chained audit log (lifecycle.md 8): append inside the change's transaction, verify.

``hash = sha256_hex(prev_hash + "\\n" + C)`` where C is the canonical JSON of the event without
``prev_hash`` and ``hash``; each row stores C, so verification rehashes the stored bytes and also
checks that the row's columns agree with C.

On SQLite an event is chained inline: the transaction reads and moves the head row (``BEGIN IMMEDIATE`` serialises
writers anyway). On PostgreSQL the transaction only records the event as pending, without ``seq``, and the sealer
chains it after commit (scale.md 2.4, ``seal``), so audited writers do not queue on one row.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from talaria.canonical import canonical_json, sha256_hex
from talaria.clock import rfc3339
from talaria.errors import StoreUnavailable
from talaria.ids import mint
from talaria.lifecycle.actor import Actor
from talaria.lifecycle.binding import Binding
from talaria.store.interface import Store, Tx

GENESIS = "0" * 64
# The chain head each open write transaction has moved it to (the transaction object is the key, so an
# entry ends with its transaction; a rolled-back transaction's entry is never read again).
_heads: weakref.WeakKeyDictionary[Tx, tuple[int, str]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Subject:
    """What an event is about: a task, its dispatch and job (lifecycle.md 8); or, for chat (chat.md 8), a
    conversation and its turn, or a bot."""

    task: str | None = None
    dispatch: str | None = None
    job: str | None = None
    conversation: str | None = None
    turn: str | None = None
    bot: str | None = None

    @property
    def is_chat(self) -> bool:
        return self.conversation is not None or self.bot is not None

    def as_json(self) -> dict[str, str | None]:
        if self.conversation is not None:
            return {"conversation": self.conversation, "turn": self.turn}
        if self.bot is not None:
            return {"bot": self.bot}
        return {"task": self.task, "dispatch": self.dispatch, "job": self.job}


@dataclass(frozen=True)
class Evidence:
    """A chat event's evidence, kept in its body (chat.md 8): a kind and the keyed digest of its free text."""

    kind: str
    content_digest: str


def append(
    tx: Tx,
    *,
    now_ms: int,
    type: str,
    tenant: str,
    actor: Actor,
    subject: Subject,
    binding: Binding | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    revision_before: int | None = None,
    revision_after: int | None = None,
    lease_id: str | None = None,
    lease_epoch: int | None = None,
    idempotency_key_hash: str | None = None,
    request_digest: str | None = None,
    reason_code: str | None = None,
    evidence: Evidence | None = None,
    team: Mapping[str, str | None] | None = None,
) -> str:
    """Append one event after the chain head; returns its ``event_id``. Raises on any failure. A chat event
    (``subject.is_chat``) also carries ``evidence`` (or null) in its body; a team event (team-tools.md 10) its
    ``team`` ids."""
    event_id = mint("evt", now_ms)
    event: dict[str, Any] = {
        "event_id": event_id,
        "occurred_at": rfc3339(now_ms),
        "type": type,
        "tenant": tenant,
        "actor": actor.as_json(),
        "subject": subject.as_json(),
        "binding": binding.as_dict() if binding is not None else None,
        "from_state": from_state,
        "to_state": to_state,
        "revision_before": revision_before,
        "revision_after": revision_after,
        "lease_id": lease_id,
        "lease_epoch": lease_epoch,
        "idempotency_key_hash": idempotency_key_hash,
        "request_digest": request_digest,
        "outcome": "applied",
        "reason_code": reason_code,
    }
    if team is not None:
        event["team"] = dict(team)
    if subject.is_chat or team is not None:
        event["evidence"] = (
            {"kind": evidence.kind, "contentDigest": evidence.content_digest} if evidence is not None else None
        )
    columns = {
        "event_id": event_id,
        "occurred_at": now_ms,
        "type": type,
        "tenant": tenant,
        "task_id": subject.task,
        "dispatch_id": subject.dispatch,
        "job_id": subject.job,
        "conversation_id": subject.conversation,
        "bot_id": subject.bot,
        "from_state": from_state,
        "to_state": to_state,
        "revision_before": revision_before,
        "revision_after": revision_after,
        "lease_epoch": lease_epoch,
        "reason_code": reason_code,
    }
    if tx.dialect == "postgresql":
        tx.run("audit_pending_insert", **columns, body=canonical_json(event).decode("utf-8"))
        return event_id
    head = _heads.get(tx)  # a second event of the same transaction follows the first one's head
    if head is None:
        row = tx.one("audit_head_get")
        if row is None:
            raise StoreUnavailable("the audit chain head is missing")
        head = (int(row["seq"]), row["hash"])
    seq, digest = chain(tx, columns, event, head)
    _heads[tx] = (seq, digest)
    return event_id


def chain(tx: Tx, columns: Mapping[str, Any], event: dict[str, Any], head: tuple[int, str]) -> tuple[int, str]:
    """Insert ``event`` as the link after ``head`` (``seq`` added to its body, C) and move the head; returns the new
    head. Raises when the head moved meanwhile (ADR 0003: the conditional update)."""
    new = link(tx, columns, event, head)
    move_head(tx, new, head[0])
    return new


def link(tx: Tx, columns: Mapping[str, Any], event: dict[str, Any], head: tuple[int, str]) -> tuple[int, str]:
    """Insert ``event`` as the link after ``head``, leaving the head row as it is; returns the new head."""
    prev_seq, prev_hash = head
    seq = prev_seq + 1
    event["seq"] = seq
    body = canonical_json(event).decode("utf-8")
    digest = sha256_hex(prev_hash + "\n" + body)
    tx.run("audit_insert", **columns, seq=seq, body=body, prev_hash=prev_hash, hash=digest)
    return seq, digest


def move_head(tx: Tx, head: tuple[int, str], expected_seq: int) -> None:
    if tx.run("audit_head_set", seq=head[0], hash=head[1], expected_seq=expected_seq) != 1:
        raise StoreUnavailable("the audit chain head moved during the transaction")


SEAL_BATCH = 1000  # scale.md 2.4: pending events per sealing transaction


def seal(store: Store, *, limit: int = SEAL_BATCH) -> int:
    """PostgreSQL: chain up to ``limit`` pending events whose transactions have all ended, in (xact, pos) order, in
    one transaction holding the head (scale.md 2.4); returns how many. Two sealers at once are safe: the second
    waits on the head's row lock and then finds the events gone (and the unique seq and event id, and the
    conditional head, refuse a second link)."""
    return len(seal_batch(store, limit=limit))


def seal_batch(
    store: Store, *, limit: int = SEAL_BATCH, wait: bool = True, regardless_of_horizon: bool = False
) -> list[int]:
    """``seal``, returning the sealed events' ``occurred_at`` (ms) once their transaction committed. The batch's
    links are inserted one by one and the head moved once, conditionally, at the end. With ``wait=False`` a head
    another sealer holds is skipped (nothing sealed: that sealer is at it). ``regardless_of_horizon`` (only while
    no replica writes, operations.md 7.3) seals in (xact, pos) order without waiting for the horizon to pass."""
    with store.write() as tx:
        row = tx.one("audit_head_lock" if wait else "audit_head_lock_skip")
        if row is None:
            if not wait:
                return []
            raise StoreUnavailable("the audit chain head is missing")
        start = head = (int(row["seq"]), row["hash"])
        pending = tx.all("audit_pending_all" if regardless_of_horizon else "audit_pending_sealable", limit=limit)
        for event in pending:
            columns = {key: event[key] for key in _PENDING_COLUMNS}
            head = link(tx, columns, json.loads(event["body"]), head)
        if pending:
            move_head(tx, head, start[0])
            tx.run("audit_pending_delete", positions=[int(event["pos"]) for event in pending])
    return [int(event["occurred_at"]) for event in pending]


def seal_all(
    store: Store, *, committed: Callable[[list[int]], None] = lambda occurred: None, wait: bool = True,
    regardless_of_horizon: bool = False,
) -> int:  # fmt: skip
    """Seal until a batch comes back short (everything below the horizon then was sealed); returns how many.
    ``committed`` hears each batch (its events' ``occurred_at``) as its transaction commits, so a caller counting
    what it sealed does not lose the batches before one that raised; ``wait=False`` ends at a head another sealer
    holds. Nothing to do on SQLite, which chains inline."""
    if store.dialect != "postgresql":
        return 0
    total = 0
    while True:
        occurred = seal_batch(store, wait=wait, regardless_of_horizon=regardless_of_horizon)
        committed(occurred)
        total += len(occurred)
        if len(occurred) < SEAL_BATCH:
            return total


_PENDING_COLUMNS = (
    "event_id", "occurred_at", "type", "tenant", "task_id", "dispatch_id", "job_id", "conversation_id", "bot_id",
    "from_state", "to_state", "revision_before", "revision_after", "lease_epoch", "reason_code",
)  # fmt: skip


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    events: int
    head: str
    broken_at: int | None = None
    reason: str | None = None
    unsealed: int = 0  # PostgreSQL: events committed but not yet chained when the snapshot was taken

    def line(self) -> str:
        if self.ok:
            later = f" ({self.unsealed} not yet sealed)" if self.unsealed else ""
            return f"audit chain OK: {self.events} events, head {self.head}{later}"
        return f"audit chain BROKEN at seq {self.broken_at}: {self.reason}"


# Row columns that must agree with the stored canonical body.
_COLUMNS = {
    "event_id": "event_id",
    "seq": "seq",
    "type": "type",
    "tenant": "tenant",
    "from_state": "from_state",
    "to_state": "to_state",
    "revision_before": "revision_before",
    "revision_after": "revision_after",
    "lease_epoch": "lease_epoch",
    "reason_code": "reason_code",
}


def _columns_agree(row: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
    if any(row[col] != event.get(key) for col, key in _COLUMNS.items()):
        return False
    subject = event.get("subject") or {}
    # a database not yet upgraded to core 0005 has no chat columns: its events have no chat subject either
    chat = (row.get("conversation_id"), row.get("bot_id"))
    if (row["task_id"], row["dispatch_id"], row["job_id"], *chat) != (
        subject.get("task"),
        subject.get("dispatch"),
        subject.get("job"),
        subject.get("conversation"),
        subject.get("bot"),
    ):
        return False
    return bool(rfc3339(row["occurred_at"]) == event.get("occurred_at"))


def verify(store: Store, *, batch: int = 5000) -> ChainReport:
    """Recompute the whole chain; report the first broken link. Safe on a live hub; on PostgreSQL it first seals
    what it can (scale.md 2.4), and still-pending events are counted, not checked.

    The chain head and every page of the scan are read in one read transaction, so they come from one
    snapshot: an event committed meanwhile is neither counted nor mistaken for a gap (it is in neither
    the head nor the scan). Events are fetched ``batch`` at a time to bound memory, not to let go of
    the snapshot between pages.
    """
    seal_all(store)
    prev, expected_seq, count = GENESIS, 1, 0
    after, unsealed = 0, 0
    with store.read() as tx:
        head = tx.one("audit_head_get")
        if tx.dialect == "postgresql":
            pending = tx.one("audit_pending_count")
            unsealed = int(pending["n"]) if pending else 0
        while rows := tx.all("audit_scan", after_seq=after, limit=batch):
            for row in rows:
                seq = int(row["seq"])
                if seq != expected_seq:
                    return ChainReport(False, count, prev, expected_seq, "seq_gap")
                if row["prev_hash"] != prev:
                    return ChainReport(False, count, prev, seq, "prev_hash_mismatch")
                body = row["body"]
                if sha256_hex(prev + "\n" + body) != row["hash"]:
                    return ChainReport(False, count, prev, seq, "hash_mismatch")
                try:
                    event = json.loads(body)
                except ValueError:
                    return ChainReport(False, count, prev, seq, "hash_mismatch")
                if not _columns_agree(row, event):
                    return ChainReport(False, count, prev, seq, "hash_mismatch")
                prev, expected_seq, count, after = row["hash"], seq + 1, count + 1, seq
    if head is not None and (int(head["seq"]) != count or head["hash"] != prev):
        return ChainReport(False, count, prev, count + 1, "seq_gap")
    return ChainReport(True, count, prev, unsealed=unsealed)
