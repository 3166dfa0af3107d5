"""Deadlines on a connection: for reading a request (ADR 0063) and for writing an answer (ADR 0066).

Reading: a client must send a request's headers within ``hub.request_header_timeout_s`` of its first byte (or of
opening the connection) and its body within ``hub.request_body_timeout_s`` of the headers, or the hub answers 408
``request_timeout`` and closes the connection. uvicorn's h11 protocol has neither: its keep-alive timer covers only an
idle connection between two requests and is cancelled by the first byte of the next one, so a client that trickles
headers (slowloris) or a body holds a connection, and a request handler, for as long as it likes. Once a request has
been read the read deadlines end: a held runner poll or a chat event stream lasts as long as its route decides.

Writing: once the answer backs up (the transport's buffer is above its high-water mark, so the route waits to write
more), or an answer is complete with over 64 KiB unsent, the client must keep taking it: if it acknowledges nothing
of it for ``hub.response_write_timeout_s``, the hub aborts the connection (nginx's ``send_timeout``). uvicorn waits
for ever: a runner that never reads a 38 MiB poll answer, or a stalled reader of an event stream, held that memory, a
connection and a stream slot for as long as its kernel kept the connection."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import socket
import struct
import termios

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from talaria.canonical import canonical_json
from talaria.settings import Settings

log = structlog.get_logger("talaria.hub")

# struct tcp_info (linux/tcp.h): tcpi_bytes_acked is the __u64 at offset 120 (Linux 4.2 and later)
_TCP_INFO_BYTES = 256
_BYTES_ACKED_AT = 120
_BYTES_ACKED_END = _BYTES_ACKED_AT + 8
_WATCH_AFTER_BYTES = 64 * 1024  # asyncio's default high-water mark for a transport's buffer


class Phase(enum.Enum):
    HEADERS = "headers"
    BODY = "body"


def timeout_answer(phase: Phase, seconds: float) -> bytes:
    """The whole 408 answer, written past h11: h11 will not answer a request it has not finished reading."""
    body = canonical_json(
        {"code": "request_timeout", "error": f"the request's {phase.value} did not arrive within {seconds:g} s"}
    )
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with the two read deadlines and the write deadline; :func:`protocol_with` sets the
    seconds."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 120.0
    write_timeout_s: float = 60.0

    _write_deadline: asyncio.TimerHandle | None = None
    _progress: tuple[int, float] = (0, 0.0)  # ``_acknowledged()`` at the last progress, and when that was
    _deadline: asyncio.TimerHandle | None = None
    _phase: tuple[Phase, int] | None = None  # the phase and the request cycle it belongs to
    _received: bool = False  # any byte of the current request

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        if data and self.conn.their_state is h11.IDLE:
            self._received = True
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()
        # under TLS a large answer may never pause the app: watch what is left to send, when it is more than a small
        # answer's bytes just sent (every answer leaves some unacknowledged for a moment; no timer on the hot path)
        if self._write_deadline is None and self._queued() > _WATCH_AFTER_BYTES:
            self._watch_writes()

    def connection_lost(self, exc: Exception | None) -> None:
        self._set(None)
        self._stop_write_deadline()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Run the deadline of the phase the client is in: its request's headers (unless uvicorn's keep-alive
        timer already watches an idle connection), its body, or none once the request has been read."""
        state = self.conn.their_state
        phase: tuple[Phase, int] | None = None
        if self.transport.is_closing():
            phase = None
        elif state is h11.IDLE and self.timeout_keep_alive_task is None:
            phase = (Phase.HEADERS, 0)
        elif state is h11.SEND_BODY:
            phase = (Phase.BODY, id(self.cycle))  # a pipelined request's body gets its own deadline
        if state is not h11.IDLE:
            self._received = False
        self._set(phase)

    def _set(self, phase: tuple[Phase, int] | None) -> None:
        if phase == self._phase:
            return  # a deadline runs from the phase's start, not from the last byte
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is not None:
            seconds = self.header_timeout_s if phase[0] is Phase.HEADERS else self.body_timeout_s
            self._deadline = self.loop.call_later(seconds, self._expired, phase[0], seconds)

    def _expired(self, phase: Phase, seconds: float) -> None:
        self._deadline = None
        self._phase = None
        if self.transport.is_closing():
            return
        # a body deadline reached after the route began its answer (even finished it) only closes
        answered = phase is Phase.BODY and self.cycle is not None and self.cycle.response_started
        if phase is Phase.BODY and self.cycle is not None:
            self.cycle.disconnected = True  # the handler reading the body sees the client gone
            self.cycle.message_event.set()
        if phase is Phase.BODY or self._received:  # a connection silent since its last answer is only closed
            if not answered:
                self.transport.write(timeout_answer(phase, seconds))
            log.info("request_timed_out", phase=phase.value, client=_peer(self.client))
        self.transport.close()

    def pause_writing(self) -> None:
        """The answer backed up: from now on the client must keep taking it."""
        super().pause_writing()
        self._watch_writes()

    def resume_writing(self) -> None:
        self._stop_write_deadline()
        super().resume_writing()

    def _watch_writes(self) -> None:
        if self._write_deadline is None:
            self._progress = (self._acknowledged(), self.loop.time())
            self._write_deadline = self.loop.call_later(self.write_timeout_s / 4, self._write_check)

    def _stop_write_deadline(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _acknowledged(self) -> int:
        """A count that grows only as the client takes the answer: the bytes it acknowledged (``TCP_INFO``'s
        ``tcpi_bytes_acked``), else minus the bytes still queued (the transport's buffer and the socket's send
        queue). The transport's buffer alone stands still for seconds while a slow client reads: the kernel's send
        buffer holds megabytes and a socket is reported writable again only once half of it has drained; and under
        TLS a third buffer sits between the two."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
                if len(info) >= _BYTES_ACKED_END:
                    acked: int = struct.unpack_from("Q", info, _BYTES_ACKED_AT)[0]
                    return acked
        return -self._queued()

    def _queued(self) -> int:
        """The answer's bytes not yet sent: the transport's buffer and the socket's send queue."""
        queued = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                queued += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        return queued

    def _write_check(self) -> None:
        """A quarter of the deadline has passed since the watch began or last looked: the client took some of the
        answer (progress), or nothing is left to send (the watch ends), or it has taken nothing for the whole
        deadline and the connection is aborted. A transport that is closing is watched too: its close waits to
        flush a buffer this client does not read (a ``Connection: close`` answer, or uvicorn's keep-alive timer
        firing first). Aborted with a reset (``SO_LINGER`` 0), so that the kernel drops its send queue too; uvicorn's
        ``connection_lost`` then marks the request's cycle disconnected and lets a route waiting to write see the
        client gone."""
        self._write_deadline = None
        taken, since = self._progress
        now, acknowledged = self.loop.time(), self._acknowledged()
        if acknowledged > taken:
            self._progress = (acknowledged, now)
        elif not self.flow.write_paused and self._queued() == 0:
            return
        elif now - since >= self.write_timeout_s:
            log.info("response_write_timed_out", seconds=self.write_timeout_s, client=_peer(self.client))
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()
            return
        self._write_deadline = self.loop.call_later(self.write_timeout_s / 4, self._write_check)


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else ""


def protocol_with(header_timeout_s: float, body_timeout_s: float, write_timeout_s: float) -> type[H11Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these deadlines."""

    class Configured(DeadlineProtocol):
        pass

    Configured.header_timeout_s = header_timeout_s
    Configured.body_timeout_s = body_timeout_s
    Configured.write_timeout_s = write_timeout_s
    return Configured


def protocol_for(settings: Settings) -> type[H11Protocol]:
    """The protocol class with the hub's configured deadlines."""
    return protocol_with(
        settings.hub_request_header_timeout_s,
        settings.hub_request_body_timeout_s,
        settings.hub_response_write_timeout_s,
    )
