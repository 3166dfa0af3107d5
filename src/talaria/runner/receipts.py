"""Runner receipts: the local record of every command begun, the basis of dedupe and of "uncertain".

runner-protocol.md section 9 (table ``commands``) and 11.2 (table ``sessions``), in
``runner-commands.sqlite3``. The runner keeps this file itself, so this module, like the hub's
``talaria.store.sqlite``, imports ``sqlite3`` (stdlib); driver errors become ``ReceiptsError`` here.

Durability: WAL, ``synchronous=FULL``, each write one ``BEGIN IMMEDIATE`` transaction on the single
connection, guarded by a lock (thread-safe). ``begin`` commits the ``started`` row before it returns,
so a crash between ``begin`` and ``complete`` leaves ``started``, which every later process reports as
uncertain and never replays.

``begin`` outcomes for a command ``{id, kind, payload, expiresAt}``:

- ``Fresh``: no receipt; a ``started`` row was written. Run the command, then ``complete`` it.
- ``Conflict``: the id was begun with another fingerprint -> ``idempotency_conflict``.
- ``Running``: begun by this process and not complete yet; the executor joins the execution it holds
  in memory (the command never runs twice).
- ``Stored``: a ``complete`` receipt; post ``reply`` again.
- ``Uncertain``: ``started`` by an earlier process, or ``retired`` -> ``runner_command_uncertain`` with
  ``UNCERTAIN_MESSAGE``; never replayed.

Compaction (``compact``, at start-up, every 256 handled commands and on the runner's timer, ADR 0019):
``complete`` receipts older than 1 h are retired (their reply dropped, the fingerprint kept), retired receipts
older than 24 h are deleted, and session records not renewed for 24 h are deleted. ``started`` rows are never
compacted. SQLite reuses the freed pages, so the file stays as large as its busiest day needed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from talaria.canonical import canonical_json, digest
from talaria.clock import Clock
from talaria.runner import limits

UNCERTAIN_MESSAGE: Final = "original command needs checking"
SCHEMA_VERSION: Final = 1

SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS commands(id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, "
    "state TEXT NOT NULL CHECK (state IN ('started','complete','retired')), result TEXT, created INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sessions(stored_id TEXT PRIMARY KEY, profile TEXT NOT NULL, created INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS commands_state_created ON commands(state, created)",
)
_SELECT = "SELECT fingerprint, state, result FROM commands WHERE id = ?"
_INSERT = "INSERT INTO commands(id, fingerprint, state, result, created) VALUES (?, ?, 'started', NULL, ?)"
_COMPLETE = "UPDATE commands SET state = 'complete', result = ? WHERE id = ? AND state = 'started'"
_RETIRE = "UPDATE commands SET state = 'retired', result = NULL WHERE state = 'complete' AND created < ?"
_DELETE_RETIRED = "DELETE FROM commands WHERE state = 'retired' AND created < ?"
_DELETE_SESSIONS = "DELETE FROM sessions WHERE created < ?"
# `created` of a session record is when it was last recorded: every open or bind renews it (ADR 0019).
_SESSION_PUT = (
    "INSERT INTO sessions(stored_id, profile, created) VALUES (?, ?, ?) ON CONFLICT(stored_id) DO UPDATE "
    "SET profile = excluded.profile, created = excluded.created"
)
_SESSION_GET = "SELECT profile FROM sessions WHERE stored_id = ?"


class ReceiptsError(Exception):
    """The receipts file cannot be used, or a call broke the contract (e.g. completing an unknown id)."""


class UnrepresentableReply(ValueError):
    """A reply canonical JSON cannot carry (NaN, Infinity, a lone surrogate, a value that is not JSON)."""


@dataclass(frozen=True)
class Fresh:
    pass


@dataclass(frozen=True)
class Conflict:
    pass


@dataclass(frozen=True)
class Running:
    pass


@dataclass(frozen=True)
class Stored:
    reply: dict[str, Any]


@dataclass(frozen=True)
class Uncertain:
    message: str = UNCERTAIN_MESSAGE


Begin = Fresh | Conflict | Running | Stored | Uncertain


@dataclass(frozen=True)
class Compacted:
    """What one compaction did: receipts retired, retired receipts deleted, session records deleted."""

    retired: int
    deleted: int
    sessions: int


def fingerprint(command: dict[str, Any]) -> str:
    """sha256 hex of the canonical JSON of ``{id, kind, payload, expiresAt}`` (other keys ignored).

    Raises ``ValueError`` if one of the four keys is missing or the value is not JSON (e.g. NaN).
    """
    missing = [key for key in ("id", "kind", "payload", "expiresAt") if key not in command]
    if missing:
        raise ValueError(f"a command needs {', '.join(missing)}")
    return digest({key: command[key] for key in ("id", "kind", "payload", "expiresAt")})


def _checked_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """``{result}`` as is, or ``{error: {message, code}}`` with the message cut to 1,000 characters."""
    if set(reply) == {"result"}:
        return {"result": reply["result"]}
    error = reply.get("error")
    if set(reply) == {"error"} and isinstance(error, dict) and set(error) == {"message", "code"}:
        message, code = error["message"], error["code"]
        if isinstance(message, str) and isinstance(code, str) and code:
            return {"error": {"message": message[: limits.MAX_ERROR_MESSAGE_CHARS], "code": code}}
    raise ValueError("a reply is {result} or {error: {message, code}}")


class Receipts:
    """Receipts over one SQLite file. Opening compacts (section 9: "at start-up"). Thread-safe."""

    fingerprint = staticmethod(fingerprint)

    def __init__(self, path: Path, clock: Clock) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._started_here: set[str] = set()
        self._handled = 0
        self._closed = False
        try:
            # The state directory is 0700 already; the file is private as well, and SQLite gives its
            # -wal and -shm files the database file's mode.
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
        except (OSError, sqlite3.Error) as exc:
            raise ReceiptsError(f"cannot open the receipts file {path}: {exc}") from None
        try:
            self._setup()
        except sqlite3.Error as exc:
            self._conn.close()
            raise ReceiptsError(f"cannot use the receipts file {path}: {exc}") from None
        except ReceiptsError:
            self._conn.close()
            raise
        try:
            self.compact()
        except ReceiptsError:
            self.close()
            raise

    def _setup(self) -> None:
        conn = self._conn
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise ReceiptsError(f"cannot enable WAL on {self.path} (journal_mode={mode}); use a local filesystem")
        conn.execute("PRAGMA synchronous=FULL")
        if sys.platform == "darwin":
            conn.execute("PRAGMA fullfsync=ON")
        with self._transaction() as tx:
            version = tx.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ReceiptsError(f"{self.path} was written by a newer runner (schema {version})")
            for statement in SCHEMA:
                tx.execute(statement)
            tx.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction, committed on success; the caller holds ``self._lock``
        (or is the constructor). SQLite errors become ``ReceiptsError``."""
        if self._closed:
            raise ReceiptsError("the receipts file is closed")
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise ReceiptsError(f"receipts file {self.path} failed: {exc}") from None

    def _write(self, sql: str, params: tuple[Any, ...]) -> int:
        """Run one statement in its own transaction; the caller holds ``self._lock``. Returns the row count."""
        with self._transaction() as tx:
            count: int = tx.execute(sql, params).rowcount
        return count

    def _read(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if self._closed:
            raise ReceiptsError("the receipts file is closed")
        try:
            row: tuple[Any, ...] | None = self._conn.execute(sql, params).fetchone()
        except sqlite3.Error as exc:
            raise ReceiptsError(f"receipts read failed: {exc}") from None
        return row

    # ---------------------------------------------------------------- commands

    def begin(self, command: dict[str, Any]) -> Begin:
        """Look the command up and, if it is new, durably insert ``started`` (see the module docstring).

        Raises ``ValueError`` for a command without a string ``id`` or one of the four keys,
        ``ReceiptsError`` if the file fails (then nothing was recorded and the command must not run).
        """
        command_id = command.get("id")
        if not isinstance(command_id, str) or not command_id:
            raise ValueError("a command id is a non-empty string")
        print_ = fingerprint(command)
        with self._lock:
            with self._transaction() as tx:
                row = tx.execute(_SELECT, (command_id,)).fetchone()
                if row is None:
                    tx.execute(_INSERT, (command_id, print_, self._clock.now_ms()))
            if row is None:
                self._started_here.add(command_id)
                return Fresh()
            stored_print, state, result = row
            if stored_print != print_:
                return Conflict()
            if state == "complete":
                try:
                    return Stored(json.loads(result))
                except (TypeError, ValueError):
                    raise ReceiptsError(f"the stored reply in {self.path} is damaged") from None
            if state == "started" and command_id in self._started_here:
                return Running()
            return Uncertain()

    def started_here(self, command_id: str) -> bool:
        """True while ``command_id`` has a ``started`` receipt written by this process (not yet complete)."""
        with self._lock:
            return command_id in self._started_here

    def complete(self, command_id: str, reply: dict[str, Any]) -> dict[str, Any]:
        """Store ``reply`` and mark the receipt ``complete``; returns the reply as stored (message cut).

        Only a receipt begun by this process can be completed. Raises ``UnrepresentableReply`` (a
        ``ValueError``) for a reply canonical JSON refuses, ``ValueError`` for one of the wrong shape (both
        before touching the file: the receipt stays ``started`` and may still be completed with another
        reply), ``ReceiptsError`` for an id not begun here or a failing file.
        """
        stored = _checked_reply(reply)
        try:
            text = canonical_json(stored).decode("utf-8")
        except (ValueError, TypeError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
            raise UnrepresentableReply(f"the reply cannot be stored as JSON: {type(exc).__name__}") from None
        with self._lock:
            if command_id not in self._started_here:
                raise ReceiptsError("no receipt of this command was begun by this process")
            count = self._write(_COMPLETE, (text, command_id))
            if count != 1:
                raise ReceiptsError("the receipt of this command is no longer started")
            self._started_here.discard(command_id)
        return stored

    def compact(self, now: int | None = None) -> Compacted:
        """One transaction, relative to ``now`` (default: the clock): retire ``complete`` receipts created
        more than 1 h before (their ``result`` dropped, the fingerprint kept as a no-replay tombstone), delete
        ``retired`` receipts created more than 24 h before and session records not renewed for 24 h.

        Idempotent; safe from any thread. Raises ``ReceiptsError`` if the file fails (then nothing changed).
        """
        if now is None:
            now = self._clock.now_ms()
        with self._lock, self._transaction() as tx:
            retired = tx.execute(_RETIRE, (now - limits.RECEIPT_RETAIN_MS,)).rowcount
            deleted = tx.execute(_DELETE_RETIRED, (now - limits.RECEIPT_DELETE_AFTER_MS,)).rowcount
            sessions = tx.execute(_DELETE_SESSIONS, (now - limits.SESSION_RECORD_RETAIN_MS,)).rowcount
        return Compacted(retired=retired, deleted=deleted, sessions=sessions)

    def handled(self) -> bool:
        """Count one handled command; every 256th call compacts. Returns whether it compacted."""
        with self._lock:
            self._handled += 1
            due = self._handled % limits.RECEIPT_COMPACT_EVERY == 0
        if due:
            self.compact()
        return due

    # ---------------------------------------------------------------- sessions (section 11.2)

    def record_session(self, stored_id: str, profile: str) -> None:
        """Record that ``stored_id`` was opened or bound through this runner under ``profile``.

        Idempotent apart from renewing the record's time (compaction deletes a record not renewed for
        24 h); recording the same id with another profile replaces it (the latest successful open or bind
        is what Hermes has).
        """
        if not isinstance(stored_id, str) or not stored_id or not isinstance(profile, str) or not profile:
            raise ValueError("a stored session id and a profile are non-empty strings")
        with self._lock:
            self._write(_SESSION_PUT, (stored_id, profile, self._clock.now_ms()))

    def session_profile(self, stored_id: str) -> str | None:
        """The profile recorded for ``stored_id``, or None if it was never recorded."""
        with self._lock:
            row = self._read(_SESSION_GET, (stored_id,))
        return None if row is None else str(row[0])

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Close the file. Idempotent. Receipts still ``started`` stay so (uncertain after a restart)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
