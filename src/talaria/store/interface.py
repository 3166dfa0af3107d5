"""The store contract the lifecycle engine and the hub depend on.

A backend offers write transactions (serialised: ``BEGIN IMMEDIATE`` on SQLite) and read
transactions (a consistent snapshot). Inside a transaction, queries are named blocks loaded from
the backend's ``.sql`` files (``talaria.store.queries``); parameters are passed by name. Every
driver error becomes ``StoreUnavailable`` at the backend boundary; a ``TalariaError`` raised by
the caller inside a transaction rolls it back and propagates unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from talaria.store.timed import TransactionObserver

Row = dict[str, Any]
# Called with a query name (or "commit") before it runs; a test may raise to inject a fault.
FaultHook = Callable[[str], None]


class Tx(Protocol):
    dialect: str  # the store's: code that differs per backend (the audit chain, scale.md 2.4) asks here

    def one(self, query: str, /, **params: Any) -> Row | None:
        """Run a named query and return its first row, or None."""
        ...

    def all(self, query: str, /, **params: Any) -> list[Row]:
        """Run a named query and return every row."""
        ...

    def run(self, query: str, /, **params: Any) -> int:
        """Run a named statement and return the number of rows it changed."""
        ...

    def script(self, sql: str, /) -> None:
        """Run a migration script (several statements) inside this transaction."""
        ...


class Signals(Protocol):
    """Wake-ups between replicas (PostgreSQL's LISTEN/NOTIFY, scale.md 3.3): a latency hint only. Whoever waits
    re-reads the store when woken and also checks on its own schedule, so a lost notification delays, never loses."""

    def subscribe(self, channel: str, callback: Callable[[str], None]) -> None:
        """Call ``callback(id)`` for every id notified on ``channel`` (on another thread; quick, never raising)."""
        ...

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after the listen connection was lost and made again (notifications may be missed)."""
        ...

    def notify(self, channel: str, ident: str) -> None:
        """Tell every replica about ``ident`` on ``channel``; call it after the transaction committed."""
        ...

    @property
    def listening(self) -> bool:
        """Whether notifications reach this replica now (False with ``database.listen = false``)."""
        ...

    def start(self) -> None: ...


class Store(Protocol):
    dialect: str
    observe: TransactionObserver | None  # called after every read() and write() (the hub's metrics)

    def write(self) -> AbstractContextManager[Tx]:
        """One serialised write transaction: commit on normal exit, roll back on any exception."""
        ...

    def read(self) -> AbstractContextManager[Tx]:
        """A read-only snapshot."""
        ...

    def ping(self) -> bool:
        """True when the store answers a trivial query."""
        ...

    def migrating(self) -> AbstractContextManager[None]:
        """Held while migrations are applied, so that processes upgrading at once apply each step once (scale.md
        2.5: a session advisory lock on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` per step is all it has)."""
        ...

    def on_commit_of(self, query: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` after each write transaction that ran ``query`` has committed (outside the
        transaction, on the committing thread; it must be quick and must not raise)."""
        ...

    def maintain(self) -> None:
        """Periodic upkeep run by the reaper (the SQLite WAL guard)."""
        ...

    def close(self) -> None: ...
