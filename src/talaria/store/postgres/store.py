"""The PostgreSQL store (scale.md 2.2): pooled synchronous psycopg connections, READ COMMITTED writes, REPEATABLE
READ read-only snapshots, client-side parameter binding.

Driver errors become ``StoreUnavailable`` here, as in the SQLite backend: a failed statement, a lost connection, a
statement timeout or no pool connection in time all roll the transaction back and answer 503, never a partial
effect. Queries are ``sql/postgresql/<entity>.sql`` in the shared ``:name`` style (``params.to_psycopg``).

Write transactions run concurrently, within a replica as across replicas: what SQLite's one writer made safe is
held by row locks, conditional updates and lease counters (ADR 0048, 0050), and a transaction PostgreSQL gave up
for a concurrent one is ``StoreConflict`` (ADR 0053 lifts ADR 0041's in-process write lock).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool
import structlog

from talaria.errors import StoreConflict, StoreUnavailable, TalariaError
from talaria.store.interface import FaultHook, Row
from talaria.store.postgres.params import to_psycopg
from talaria.store.queries import load
from talaria.store.timed import TransactionObserver, timed

if TYPE_CHECKING:
    from talaria.store.postgres.signals import PostgresSignals

log = structlog.get_logger("talaria.store")

MIN_SERVER_VERSION = 150000
CONNECT_TIMEOUT_S = 5
# pg_advisory_lock key held while migrations are applied: the bytes of "talariaM" as a bigint
MIGRATION_KEY = int.from_bytes(b"talariaM", "big", signed=True)
_WRITE = "BEGIN ISOLATION LEVEL READ COMMITTED"
_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"  # a consistent snapshot, as the contract says
CONFLICTS = frozenset({"40001", "40P01"})  # serialization failure, deadlock: the transaction may be run again


@dataclass(frozen=True)
class PoolSettings:
    pool_min: int = 2
    pool_max: int = 10
    pool_timeout_ms: int = 5000
    statement_timeout_ms: int = 15000
    application_name: str = "talaria"


class _PostgresTx:
    dialect = "postgresql"

    def __init__(
        self, cur: psycopg.ClientCursor[Any], queries: dict[str, str], fault: FaultHook | None,
        watched: Mapping[str, list[Callable[[], None]]],
    ) -> None:  # fmt: skip
        self._cur = cur
        self._queries = queries
        self._fault = fault
        self._watched = watched
        self.ran: set[str] = set()  # the watched queries this transaction ran

    def _execute(self, query: str, params: dict[str, Any]) -> psycopg.ClientCursor[Any]:
        if self._fault is not None:
            self._fault(query)
        if query in self._watched:
            self.ran.add(query)
        self._cur.execute(self._queries[query], params)
        return self._cur

    def one(self, query: str, /, **params: Any) -> Row | None:
        cur = self._execute(query, params)
        if cur.description is None:
            return None
        row = cur.fetchone()
        if row is None:
            return None
        return {d.name: v for d, v in zip(cur.description, row, strict=True)}

    def all(self, query: str, /, **params: Any) -> list[Row]:
        cur = self._execute(query, params)
        if cur.description is None:
            return []
        names = [d.name for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def run(self, query: str, /, **params: Any) -> int:
        return self._execute(query, params).rowcount

    def script(self, sql: str, /) -> None:
        self._cur.execute(sql)  # no parameters: the whole file in one simple-protocol round trip


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """An autocommit connection outside the pool (locks held for a session, server checks); ``StoreUnavailable``
    with the server's first line of refusal, never the password."""
    try:
        return psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True, **kwargs)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreUnavailable(f"cannot connect to the PostgreSQL database at {safe_url(url)}: {reason}") from exc


def check_version(url: str, version: int) -> None:
    if version < MIN_SERVER_VERSION:
        raise StoreUnavailable(f"the PostgreSQL server at {safe_url(url)} is {version}; Talaria needs 15 or newer")


def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.autocommit = True  # transactions are BEGIN ... COMMIT sent here, as on SQLite


class PostgresStore:
    """A hub's PostgreSQL store; ``url`` is a libpq URL (its password is never logged: ``safe_url``)."""

    dialect = "postgresql"

    def __init__(self, url: str, settings: PoolSettings | None = None) -> None:
        self.settings = settings or PoolSettings()
        self._url = url
        self._queries = {name: to_psycopg(q.sql) for name, q in load("postgresql").items()}
        self._closed = False
        self._on_close: list[Callable[[], None]] = []
        self._watched: dict[str, list[Callable[[], None]]] = {}
        self.fault_hook: FaultHook | None = None
        self.observe: TransactionObserver | None = None  # the hub's metrics (operations.md 5.1)
        self._signals: PostgresSignals | None = None
        s = self.settings
        options = (f"-c statement_timeout={int(s.statement_timeout_ms)} "
                   "-c idle_in_transaction_session_timeout=60000 -c TimeZone=UTC")  # fmt: skip
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = psycopg_pool.ConnectionPool(
            url,
            min_size=s.pool_min,
            max_size=s.pool_max,
            timeout=s.pool_timeout_ms / 1000,
            kwargs={"options": options, "application_name": s.application_name},
            configure=_configure,
            open=False,
            name="talaria",
        )
        try:
            self._pool.open(wait=True, timeout=s.pool_timeout_ms / 1000)
            with self._pool.connection() as conn:
                check_version(url, conn.info.server_version)
        except psycopg_pool.PoolTimeout as exc:
            self._pool.close()
            connect(url).close()  # raises with the server's reason when there is one
            raise StoreUnavailable(f"cannot connect to the PostgreSQL database at {safe_url(url)}") from exc
        except BaseException:
            self._pool.close()
            raise

    @contextmanager
    def _transaction(self, begin: str, kind: str, fault: FaultHook | None) -> Iterator[_PostgresTx]:
        if self._closed:
            raise StoreUnavailable("the store is closed")
        try:
            with self._pool.connection() as conn:
                cur = psycopg.ClientCursor(conn)
                tx = _PostgresTx(cur, self._queries, fault, self._watched)
                try:
                    cur.execute(begin)
                    yield tx
                    if fault is not None:
                        fault("commit")
                    cur.execute("COMMIT")
                except BaseException:
                    self._rollback(conn)
                    raise
            for query in tx.ran:  # after the connection went back to the pool
                for callback in self._watched[query]:
                    callback()
        except psycopg_pool.PoolTimeout as exc:
            log.warning("store_pool_timeout", timeout_ms=self.settings.pool_timeout_ms)
            raise StoreUnavailable() from exc
        except psycopg.Error as exc:
            log.warning(f"store_{kind}_failed", error=type(exc).__name__, sqlstate=exc.sqlstate)
            if exc.sqlstate in CONFLICTS:
                raise StoreConflict() from exc
            raise StoreUnavailable() from exc

    @staticmethod
    def _rollback(conn: psycopg.Connection[Any]) -> None:
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error as exc:  # the connection is unusable: the pool discards it
            log.error("store_rollback_failed", error=type(exc).__name__)

    @contextmanager
    def write(self) -> Iterator[_PostgresTx]:
        with timed(self.observe, "write"), self._write() as tx:
            yield tx

    @contextmanager
    def _write(self) -> Iterator[_PostgresTx]:
        with self._transaction(_WRITE, "write", self.fault_hook) as tx:
            yield tx

    @contextmanager
    def read(self) -> Iterator[_PostgresTx]:
        with timed(self.observe, "read"), self._read() as tx:
            yield tx

    @contextmanager
    def _read(self) -> Iterator[_PostgresTx]:
        with self._transaction(_READ, "read", None) as tx:
            yield tx

    def ping(self) -> bool:
        try:
            with self.read() as tx:
                return tx.one("schema_ping") is not None
        except TalariaError:
            return False

    @contextmanager
    def migrating(self) -> Iterator[None]:
        """A session advisory lock on a connection of its own while migrations are applied (scale.md 2.5)."""
        conn = connect(self._url, application_name="talaria/migrations")
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_KEY,))
            yield
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_KEY,))
            conn.close()

    def on_commit_of(self, query: str, callback: Callable[[], None]) -> None:
        self._watched.setdefault(query, []).append(callback)

    def maintain(self) -> None:
        """Nothing: autovacuum keeps the tables (scale.md 2.3)."""

    def signals(self, *, listen: bool) -> PostgresSignals:
        """This store's LISTEN/NOTIFY connections (made once; closed with the store; started by the caller)."""
        if self._signals is None:
            from talaria.store.postgres.signals import PostgresSignals

            self._signals = PostgresSignals(self._url, listen=listen, application_name=self.settings.application_name)
        return self._signals

    def pool_connections(self) -> dict[str, int]:
        """The pool's connections by state, for ``talaria_db_pool_connections`` (operations.md 5.1)."""
        stats = self._pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        return {"idle": idle, "busy": max(0, size - idle), "waiting": stats.get("requests_waiting", 0)}

    def on_close(self, release: Callable[[], None]) -> None:
        """Run ``release`` when the store closes."""
        self._on_close.append(release)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._signals is not None:
            self._signals.close()
        self._pool.close()
        for release in self._on_close:
            release()


def safe_url(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "(an unparsable database.url)"
    host = info.get("host", "")
    where = f"{info.get('user', '')}@{host}:{info.get('port', '5432')}" if host else "the default socket"
    return f"postgresql://{where}/{info.get('dbname', '')}"
