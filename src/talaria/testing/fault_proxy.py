"""A loopback TCP proxy that injects network faults between runners and a hub (issue 17, ``bench/chaos.py``).

    proxy = FaultProxy(("127.0.0.1", hub_port)).start()   # runners use proxy.url as their serverURL
    proxy = FaultProxy(replica_a, replica_b).start()      # a balancer: new connections go to each in turn
    proxy.set_latency(0.05)      # every forwarded chunk waits 50 ms, both ways
    proxy.reset_all()            # every open connection is reset (RST), as a crashed host's kernel answers
    proxy.half_open()            # every open connection goes silent both ways and stays open: neither end is told
    proxy.partition(True)        # like half_open, and new connections are accepted but never forwarded
    proxy.partition(False)       # healed: new connections forward again (silenced ones stay silent)

With several backends it balances as a load balancer in front of hub replicas does (scale.md 4): each new
connection goes to the next backend in turn, and to the one after when that one refuses the connection (a replica
that is down), so a client is refused only when every backend is.

It runs its own event loop on a thread, so callers on any thread drive it with plain calls. A silenced connection
is reset after ``silent_limit_s`` (an end that never gives up would otherwise hold it for ever); ``counts`` says how
many of each fault were injected.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

SILENT_LIMIT_S = 300.0


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream connection."""

    ends: list[asyncio.StreamWriter] = field(default_factory=list)
    silent: bool = False


class FaultProxy:
    def __init__(self, *backends: tuple[str, int], silent_limit_s: float = SILENT_LIMIT_S) -> None:
        if not backends:
            raise ValueError("a fault proxy needs at least one backend")
        self.backends = backends
        self._next = 0
        self.silent_limit_s = silent_limit_s
        self.latency_s = 0.0
        self.partitioned = False
        self.counts: Counter[str] = Counter()
        self.port = 0
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
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
        if not done.wait(10):
            raise RuntimeError("the fault proxy did not answer")

    # --- faults -----------------------------------------------------------------------------------------------

    def set_latency(self, seconds: float) -> None:
        def apply() -> None:
            if seconds > 0 and self.latency_s == 0:
                self.counts["latency"] += 1
            self.latency_s = seconds

        self._call(apply)

    def reset_all(self) -> int:
        """Reset every open connection (silenced ones too); returns how many."""
        reset = 0

        def apply() -> None:
            nonlocal reset
            for link in list(self._links):
                _close(link, reset=True)
                reset += 1
            self._links.clear()
            self.counts["reset"] += 1

        self._call(apply)
        return reset

    def half_open(self) -> int:
        """Silence every open connection: nothing more is forwarded either way, and neither end hears of it."""
        silenced = 0

        def apply() -> None:
            nonlocal silenced
            silenced = self._silence_all()
            self.counts["half_open"] += 1

        self._call(apply)
        return silenced

    def partition(self, on: bool) -> None:
        """On: silence every open connection and every new one. Off: new connections forward again."""

        def apply() -> None:
            if on and not self.partitioned:
                self._silence_all()
                self.counts["partition"] += 1
            self.partitioned = on

        self._call(apply)

    def _silence_all(self) -> int:
        silenced = 0
        for link in self._links:
            if not link.silent:
                self._silence(link)
                silenced += 1
        return silenced

    def _silence(self, link: _Link) -> None:
        link.silent = True
        self._loop.call_later(self.silent_limit_s, self._expire, link)

    def _expire(self, link: _Link) -> None:
        if link in self._links:
            self._links.discard(link)
            _close(link, reset=True)

    # --- forwarding -------------------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(ends=[writer])
        self._links.add(link)
        if self.partitioned:
            self._silence(link)
            await _swallow(reader)
            return
        upstream = await self._connect()
        if upstream is None:
            self._links.discard(link)
            _close(link, reset=True)
            return
        up_reader, up_writer = upstream
        link.ends.append(up_writer)
        try:
            await asyncio.gather(self._pipe(link, reader, up_writer), self._pipe(link, up_reader, writer))
        finally:
            if not link.silent:
                self._links.discard(link)
                _close(link, reset=False)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the next backend in turn that accepts one; None when none does."""
        first = self._next
        self._next = (first + 1) % len(self.backends)
        for k in range(len(self.backends)):
            try:
                return await asyncio.open_connection(*self.backends[(first + k) % len(self.backends)])
            except OSError:
                continue
        return None

    async def _pipe(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                if self.latency_s > 0:
                    await asyncio.sleep(self.latency_s)
                if link.silent:
                    await _swallow(reader)
                    return
                writer.write(chunk)
                await writer.drain()
            if link.silent:
                return  # an end's close is not passed on either
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            if not link.silent:
                reset_connection(writer)

    def stop(self) -> None:
        def stop() -> None:
            for link in list(self._links):
                _close(link, reset=True)
            self._links.clear()
            if self._server is not None:
                self._server.close()
            self._loop.stop()

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(stop)
            self._thread.join(10)


async def _swallow(reader: asyncio.StreamReader) -> None:
    """Read and drop until the end closes (a silenced connection's bytes go nowhere)."""
    with contextlib.suppress(ConnectionError, OSError):
        while await reader.read(65536):
            pass


def _close(link: _Link, *, reset: bool) -> None:
    for end in link.ends:
        if reset:
            reset_connection(end)
        else:
            with contextlib.suppress(Exception):
                end.close()


def reset_connection(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed host's kernel would answer."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(Exception):
        writer.close()
