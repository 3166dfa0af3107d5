"""A loopback TCP proxy for tests (scale.md 6): each new connection goes to the next backend in turn; it can cut
every connection (reset, and new ones refused by an immediate close) and restore.

It runs its own event loop on a thread, so tests on any thread drive it with plain calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from talaria.testing.fault_proxy import reset_connection


class TcpProxy:
    def __init__(self, backends: list[tuple[str, int]]) -> None:
        self.backends = list(backends)
        self.cut = False
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._live: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        assert self._ready.wait(10), "the proxy did not start"
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        # closed on its own thread: the caller's thread may run a loop of its own (Playwright's sync API does)
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def _call(self, func: Callable[[], None]) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                func()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        assert done.wait(10)

    # --- faults -----------------------------------------------------------------------------------------------

    def cut_all(self) -> None:
        """Reset every open connection; new ones are closed at once until ``restore``."""

        def cut() -> None:
            self.cut = True
            for writer in list(self._live):
                reset_connection(writer)
            self._live.clear()

        self._call(cut)

    def restore(self) -> None:
        def restore() -> None:
            self.cut = False

        self._call(restore)

    @contextmanager
    def outage(self) -> Iterator[None]:
        self.cut_all()
        try:
            yield
        finally:
            self.restore()

    # --- forwarding -------------------------------------------------------------------------------------------

    def _choose(self) -> tuple[str, int] | None:
        if not self.backends:
            return None
        self._next += 1
        return self.backends[(self._next - 1) % len(self.backends)]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend = None if self.cut else self._choose()
        if backend is None:
            reset_connection(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*backend)
        except OSError:
            reset_connection(writer)
            return
        self._live.update((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                self._live.discard(end)
                with contextlib.suppress(Exception):
                    end.close()

    def stop(self) -> None:
        def stop() -> None:
            for writer in list(self._live):
                reset_connection(writer)
            if self._server is not None:
                self._server.close()
            self._loop.stop()

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(stop)
            self._thread.join(10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        reset_connection(writer)
