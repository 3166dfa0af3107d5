"""SQLite backend (lifecycle.md 9.1): WAL, synchronous=FULL, explicit BEGIN IMMEDIATE, one writer.

The only module that imports ``sqlite3`` for the hub's store. Driver errors become
``StoreUnavailable`` here: busy after the timeout, I/O errors and constraint failures all roll the
transaction back and answer 503, never a partial effect.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import structlog

from talaria.errors import StoreUnavailable, TalariaError
from talaria.store.interface import FaultHook, Row
from talaria.store.queries import Query, load
from talaria.store.timed import TransactionObserver, timed

log = structlog.get_logger("talaria.store")


class _SQLiteTx:
    dialect = "sqlite"

    def __init__(
        self, conn: sqlite3.Connection, queries: dict[str, Query], fault: FaultHook | None,
        watched: Mapping[str, list[Callable[[], None]]] | None = None,
    ) -> None:  # fmt: skip
        self._conn = conn
        self._queries = queries
        self._fault = fault
        self._watched = watched or {}
        self.ran: set[str] = set()  # the watched queries this transaction ran

    def _execute(self, query: str, params: dict[str, Any]) -> sqlite3.Cursor:
        if self._fault is not None:
            self._fault(query)
        if query in self._watched:
            self.ran.add(query)
        return self._conn.execute(self._queries[query].sql, params)

    def one(self, query: str, /, **params: Any) -> Row | None:
        cur = self._execute(query, params)
        row = cur.fetchone()
        if row is None:
            return None
        return {d[0]: v for d, v in zip(cur.description, row, strict=True)}

    def all(self, query: str, /, **params: Any) -> list[Row]:
        cur = self._execute(query, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def run(self, query: str, /, **params: Any) -> int:
        return self._execute(query, params).rowcount

    def script(self, sql: str, /) -> None:
        for statement in split_statements(sql):
            self._conn.execute(statement)


def _parents_first(parents: Mapping[str, set[str]]) -> list[str]:
    """Table names ordered so that each comes after every table it references (by name among equals)."""
    done: list[str] = []
    left = dict(parents)
    while left:
        ready = sorted(n for n, refs in left.items() if not (refs & left.keys()))
        if not ready:
            raise StoreUnavailable(f"foreign keys form a cycle among {sorted(left)}")
        done += ready
        for name in ready:
            del left[name]
    return done


def split_statements(sql: str) -> list[str]:
    """Split a script into complete statements (trigger bodies kept whole)."""
    statements: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(not part.strip() or part.strip().startswith("--") for part in buffer.splitlines()):
        raise ValueError("incomplete SQL statement at the end of a script")
    return statements


class SQLiteStore:
    """The embedded default store. Thread-safe: one writer connection behind a lock, pooled readers."""

    dialect = "sqlite"

    def __init__(self, path: Path, *, busy_timeout_ms: int = 5000, wal_limit_bytes: int = 67_108_864) -> None:
        self.path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._wal_limit = wal_limit_bytes
        self._queries = load("sqlite")
        self._write_lock = threading.Lock()
        self._watched: dict[str, list[Callable[[], None]]] = {}
        self._on_close: list[Callable[[], None]] = []
        # Idle readers; a reader in use is in neither list and is closed when it comes back after close().
        self._idle: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._closed = False
        # A test-only seam: called before each named query and before COMMIT of write transactions.
        self.fault_hook: FaultHook | None = None
        self.observe: TransactionObserver | None = None  # the hub's metrics (operations.md 5.1)
        self._writer = self._connect()

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout_ms / 1000
            )
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.close()
                raise StoreUnavailable(
                    f"cannot enable WAL on {self.path} (journal_mode={mode}); "
                    "the data directory must be on a local filesystem"
                )
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            conn.execute("PRAGMA foreign_keys=ON")
            if sys.platform == "darwin":
                conn.execute("PRAGMA fullfsync=ON")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the database {self.path}: {exc}") from exc
        return conn

    @contextmanager
    def write(self) -> Iterator[_SQLiteTx]:
        with timed(self.observe, "write"), self._write() as tx:
            yield tx

    @contextmanager
    def _write(self) -> Iterator[_SQLiteTx]:
        with self._write_lock:
            if self._closed:
                raise StoreUnavailable("the store is closed")
            conn = self._writer
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                log.warning("store_begin_failed", error=str(exc))
                raise StoreUnavailable() from exc
            tx = _SQLiteTx(conn, self._queries, self.fault_hook, self._watched)
            try:
                yield tx
                if self.fault_hook is not None:
                    self.fault_hook("commit")
                conn.execute("COMMIT")
                for query in tx.ran:
                    for callback in self._watched[query]:
                        callback()
            except TalariaError:
                self._rollback(conn)
                raise
            except sqlite3.Error as exc:
                self._rollback(conn)
                log.warning("store_write_failed", error=str(exc))
                raise StoreUnavailable() from exc
            except BaseException:
                self._rollback(conn)
                raise

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error as exc:  # the connection is unusable; the next BEGIN will say so
            log.error("store_rollback_failed", error=str(exc))

    def _lease(self) -> sqlite3.Connection:
        with self._pool_lock:
            if self._closed:
                raise StoreUnavailable("the store is closed")
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _give_back(self, conn: sqlite3.Connection) -> None:
        """A reader comes back to the pool, or is closed here when the store closed while it was in use: closing
        a connection another thread is reading on crashes the process (sqlite3 is not safe for that)."""
        self._rollback(conn)
        with self._pool_lock:
            if not self._closed:
                self._idle.append(conn)
                return
        with contextlib.suppress(sqlite3.Error):  # closing is best effort
            conn.close()

    @contextmanager
    def read(self) -> Iterator[_SQLiteTx]:
        with timed(self.observe, "read"), self._read() as tx:
            yield tx

    @contextmanager
    def _read(self) -> Iterator[_SQLiteTx]:
        conn = self._lease()
        try:
            conn.execute("BEGIN")
            yield _SQLiteTx(conn, self._queries, None)
        except sqlite3.Error as exc:
            log.warning("store_read_failed", error=str(exc))
            raise StoreUnavailable() from exc
        finally:
            self._give_back(conn)

    def ping(self) -> bool:
        try:
            with self.read() as tx:
                return tx.one("schema_ping") is not None
        except TalariaError:
            return False

    @contextmanager
    def migrating(self) -> Iterator[None]:
        """Nothing more than each step's ``BEGIN IMMEDIATE``: one hub per data directory."""
        yield

    def on_commit_of(self, query: str, callback: Callable[[], None]) -> None:
        self._watched.setdefault(query, []).append(callback)

    def on_close(self, release: Callable[[], None]) -> None:
        """Run ``release`` (say, letting go of ``hub.lock``) when the store closes."""
        self._on_close.append(release)

    def export(self, consume: Callable[[str, list[str], Iterator[tuple[Any, ...]]], None]) -> dict[str, int]:
        """``db copy``'s read (scale.md 5): in one snapshot, every table of the schema except the migration
        records, parents before the tables whose foreign keys name them; ``consume(table, columns, rows)`` reads
        each table's rows in batches. Returns the row count per table, from the same snapshot."""
        counts: dict[str, int] = {}
        conn = self._lease()
        try:
            conn.execute("BEGIN")
            names = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                " AND name NOT IN ('schema_version', 'schema_step') ORDER BY name"
            )]  # fmt: skip
            parents = {n: {r[2] for r in conn.execute(f'PRAGMA foreign_key_list("{n}")')} - {n} for n in names}
            for name in _parents_first(parents):
                cur = conn.execute(f'SELECT * FROM "{name}"')
                columns = [d[0] for d in cur.description]
                counts[name] = 0

                def rows(cur: sqlite3.Cursor = cur, name: str = name) -> Iterator[tuple[Any, ...]]:
                    while batch := cur.fetchmany(1000):
                        counts[name] += len(batch)
                        yield from batch

                consume(name, columns, rows())
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot read {self.path}: {exc}") from exc
        finally:
            self._give_back(conn)
        return counts

    def maintain(self) -> None:
        """WAL guard: truncate the ``-wal`` file once it exceeds the configured size."""
        wal = Path(str(self.path) + "-wal")
        try:
            size = wal.stat().st_size
        except OSError:
            return
        if size > self._wal_limit:
            with self._write_lock:
                try:
                    self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.Error as exc:
                    raise StoreUnavailable(f"WAL checkpoint failed: {exc}") from exc
            log.info("wal_checkpoint", wal_bytes_before=size)

    def close(self) -> None:
        """Close the writer (after the write in progress) and the idle readers; a reader in use is closed when its
        read ends."""
        with self._write_lock, self._pool_lock:
            if self._closed:
                return
            self._closed = True
            for conn in [self._writer, *self._idle]:
                with contextlib.suppress(sqlite3.Error):  # closing is best effort
                    conn.close()
            self._idle.clear()
        for release in self._on_close:
            release()


# ------------------------------------------------------------------ backups (operations.md 7.1, db_backup.py)


def _read_only(path: Path, timeout: float = 5.0) -> sqlite3.Connection:
    """A read-only connection to ``path`` (its characters escaped in the URI: ``?``, ``#`` or ``%`` in a name
    must not open another file)."""
    return sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=timeout)


def copy_pages(source: Path, target: Path) -> None:
    """Every page of ``source`` into ``target`` in one step, from a read-only connection of its own (one read
    snapshot: consistent, never restarted by writes, which go on in the WAL), then ``target`` out of WAL mode.
    ``StoreUnavailable`` names what failed."""
    try:
        reader = _read_only(source, timeout=30)
        try:
            writer = sqlite3.connect(target)
            try:
                reader.backup(writer, pages=-1)
                writer.execute("PRAGMA journal_mode=DELETE")
            finally:
                writer.close()
        finally:
            reader.close()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot copy {source}: {exc}") from None


def self_contained(path: Path) -> None:
    """``path`` in rollback-journal mode: one file, no ``-wal`` or ``-shm`` beside it."""
    try:
        writer = sqlite3.connect(path)
        try:
            writer.execute("PRAGMA journal_mode=DELETE")
        finally:
            writer.close()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot finish {path}: {exc}") from None


def integrity(path: Path) -> str:
    """``PRAGMA integrity_check`` of ``path``, read-only: ``ok`` or the first problem."""
    try:
        reader = _read_only(path)
        try:
            row = reader.execute("PRAGMA integrity_check").fetchone()
        finally:
            reader.close()
    except sqlite3.Error as exc:
        return str(exc)
    return str(row[0]) if row else "no answer"
