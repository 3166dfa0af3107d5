"""Open chat event streams counted across PostgreSQL replicas (scale.md 3.7): one ``stream_open(id, account,
replica)`` row per open stream, inserted under the account row's lock when the stream opens (so two replicas cannot
both pass the limit) and deleted when it ends. Rows of a replica no longer live count for nothing: a stopping
replica deletes its own, and the maintenance replica sweeps those of replicas that died.

This replica's own counts are kept as well (``ChatStreams``), so that a test awaits them as on SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.chat.streams import ChatStreams
from talaria.hub.replica import LIVE_MS
from talaria.ids import mint
from talaria.limits import MAX_CHAT_STREAMS_PER_ACCOUNT
from talaria.store.interface import Store

log = structlog.get_logger("talaria.chat")


class SharedChatStreams(ChatStreams):
    def __init__(
        self, store: Store, clock: Clock, replica_id: str, *, keepalive_s: float,
        limit: int = MAX_CHAT_STREAMS_PER_ACCOUNT,
    ) -> None:  # fmt: skip
        super().__init__(keepalive_s=keepalive_s, limit=limit)
        self.store, self.clock, self.replica_id = store, clock, replica_id

    def take(self, account: str) -> str | None:
        now = self.clock.now_ms()
        stream_id = mint("str", now)
        with self.store.write() as tx:
            tx.run("account_lock", username=account)
            row = tx.one("stream_open_count", account=account, since=now - LIVE_MS)
            if row is not None and int(row["n"]) >= self.limit:
                return None
            tx.run("stream_open_insert", id=stream_id, account=account, replica=self.replica_id, now=now)
        self._count(account)
        return stream_id

    def give_back(self, account: str, stream_id: str) -> None:
        """The row goes on a worker thread when called on the event loop (a stream's close must not wait)."""
        self._uncount(account)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._delete(stream_id)
            return
        loop.run_in_executor(None, self._delete, stream_id)

    def sweep(self) -> int:
        with self.store.write() as tx:
            return tx.run("stream_open_sweep", since=self.clock.now_ms() - LIVE_MS)

    def close(self) -> None:
        with contextlib.suppress(TalariaError), self.store.write() as tx:  # else they stop counting 20 s later
            tx.run("stream_open_drop_replica", replica=self.replica_id)

    def _delete(self, stream_id: str) -> None:
        try:
            with self.store.write() as tx:
                tx.run("stream_open_delete", id=stream_id)
        except TalariaError as exc:  # it stops counting once this replica is no longer live, or at its stop
            log.warning("chat_stream_close_failed", code=exc.code)
