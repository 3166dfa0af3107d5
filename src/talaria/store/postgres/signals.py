"""LISTEN/NOTIFY for one replica (scale.md 2.2, 3.3): two autocommit connections outside the pool.

A notification is a latency hint, never the only way a replica learns anything: whoever waits re-reads the store
when woken and runs one fallback query per channel every ``database.wake_fallback_ms``. So every failure here is
logged and survived:

- ``notify`` queues an id; a worker sends what was queued within 5 ms as one ``pg_notify`` per channel, the ids
  joined by commas (each payload under 8,000 bytes), after the business transaction committed (NOTIFY inside one
  would take a global lock at its commit). A lost notify connection is made again on the next send.
- The listener thread LISTENs on every subscribed channel and calls each channel's callbacks with each id. After
  losing its connection it makes a new one and calls the ``on_reconnect`` callbacks: everything waited on is
  re-checked as if every notification had been missed.

With ``database.listen = false`` (a transaction-pooling PgBouncer) nothing listens: waits rely on the fallback.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import structlog

from talaria.errors import StoreUnavailable
from talaria.store.postgres.store import connect

log = structlog.get_logger("talaria.store")

COALESCE_S = 0.0
MAX_PAYLOAD = 7900  # PostgreSQL's limit is 8,000 bytes
RECONNECT_S = 1.0
_STOP = ("", "")


class PostgresSignals:
    def __init__(self, url: str, *, listen: bool, application_name: str) -> None:
        self._url = url
        self._listen = listen
        self._name = application_name
        self._callbacks: dict[str, list[Callable[[str], None]]] = {}
        self._reconnected: list[Callable[[], None]] = []
        self._outbox: queue.Queue[tuple[str, str]] = queue.Queue()
        self._closed = threading.Event()
        self._listening = threading.Event()
        self._threads: list[threading.Thread] = []
        self._notify_conn: psycopg.Connection[Any] | None = None
        self._listen_conn: psycopg.Connection[Any] | None = None
        self.on_sent: Callable[[str], None] | None = None  # a pg_notify sent on a channel (the hub's metrics)

    # ------------------------------------------------------------------ what a waiter uses

    def subscribe(self, channel: str, callback: Callable[[str], None]) -> None:
        """Call ``callback(id)`` for each id notified on ``channel`` (on the listener thread: be quick)."""
        self._callbacks.setdefault(channel, []).append(callback)

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        self._reconnected.append(callback)

    def notify(self, channel: str, ident: str) -> None:
        """Tell every replica listening on ``channel`` about ``ident``, soon (coalesced, after this call returns)."""
        if not self._closed.is_set():
            self._outbox.put((channel, ident))

    @property
    def listening(self) -> bool:
        """Whether the listener holds a connection with every LISTEN done (tests wait on it)."""
        return self._listening.is_set()

    # ------------------------------------------------------------------ start, stop

    def start(self) -> None:
        if self._threads:
            return
        self._threads.append(threading.Thread(target=self._send_loop, name="talaria-notify", daemon=True))
        if self._listen and self._callbacks:
            self._threads.append(threading.Thread(target=self._listen_loop, name="talaria-listen", daemon=True))
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._closed.set()
        self._outbox.put(_STOP)
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    # ------------------------------------------------------------------ the notify side

    def _send_loop(self) -> None:
        while not self._closed.is_set():
            first = self._outbox.get()
            if first == _STOP:
                break
            self._closed.wait(COALESCE_S)
            batch = [first]
            while True:
                try:
                    batch.append(self._outbox.get_nowait())
                except queue.Empty:
                    break
            self._send([item for item in batch if item != _STOP])
        if self._notify_conn is not None:
            self._notify_conn.close()

    def _send(self, batch: list[tuple[str, str]]) -> None:
        by_channel: dict[str, list[str]] = {}
        for channel, ident in batch:
            ids = by_channel.setdefault(channel, [])
            if ident not in ids:
                ids.append(ident)
        payloads = [(channel, payload) for channel, ids in by_channel.items() for payload in _payloads(ids)]
        for attempt in (1, 2):
            try:
                if self._notify_conn is None or self._notify_conn.closed:
                    self._notify_conn = connect(self._url, application_name=f"{self._name}/notify")
                for channel, payload in payloads:
                    self._notify_conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))
                    if self.on_sent is not None:
                        self.on_sent(channel)
                return
            except psycopg.Error as exc:
                log.warning("store_notify_failed", error=type(exc).__name__, attempt=attempt)
                if self._notify_conn is not None:
                    self._notify_conn.close()
                self._notify_conn = None
            except StoreUnavailable:  # the server is away: the fallback covers it
                log.warning("store_notify_failed", error="StoreUnavailable", attempt=attempt)
                return

    # ------------------------------------------------------------------ the listen side

    def _listen_loop(self) -> None:
        first = True
        while not self._closed.is_set():
            try:
                conn = connect(self._url, application_name=f"{self._name}/listen")
            except StoreUnavailable:
                log.warning("store_listen_failed")
                self._closed.wait(RECONNECT_S)
                continue
            self._listen_conn = conn
            try:
                for channel in self._callbacks:
                    conn.execute(f'LISTEN "{channel}"')
                self._listening.set()
                if not first:
                    log.info("store_listen_reconnected")
                    for callback in self._reconnected:
                        callback()
                first = False
                while not self._closed.is_set():
                    for note in conn.notifies(timeout=0.5):
                        self._deliver(note.channel, note.payload)
            except psycopg.Error as exc:
                if not self._closed.is_set():
                    log.warning("store_listen_lost", error=type(exc).__name__)
            finally:
                self._listening.clear()
                self._listen_conn = None
                conn.close()
            self._closed.wait(RECONNECT_S / 4)

    def _deliver(self, channel: str, payload: str) -> None:
        for ident in payload.split(","):
            for callback in self._callbacks.get(channel, ()):
                try:
                    callback(ident)
                except Exception:  # a waiter's bug must not stop the listener
                    log.exception("store_listen_callback_failed", channel=channel)


def _payloads(ids: list[str]) -> list[str]:
    """The ids joined by commas, cut into payloads under ``MAX_PAYLOAD`` bytes."""
    out: list[str] = []
    current = ""
    for ident in ids:
        if current and len(current) + 1 + len(ident) > MAX_PAYLOAD:
            out.append(current)
            current = ""
        current = f"{current},{ident}" if current else ident
    if current:
        out.append(current)
    return out
