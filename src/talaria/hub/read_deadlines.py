"""Deadlines for reading a request (ADR 0063): a client must send a request's headers within
``hub.request_header_timeout_s`` of its first byte (or of opening the connection) and its body within
``hub.request_body_timeout_s`` of the headers, or the hub answers 408 ``request_timeout`` and closes the connection.

uvicorn's h11 protocol has neither: its keep-alive timer covers only an idle connection between two requests and is
cancelled by the first byte of the next one, so a client that trickles headers (slowloris) or a body holds a
connection, and a request handler, for as long as it likes. Once a request has been read the deadlines end: a held
runner poll or a chat event stream lasts as long as its route decides."""

from __future__ import annotations

import asyncio
import enum

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from talaria.canonical import canonical_json

log = structlog.get_logger("talaria.hub")


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


class ReadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with the two read deadlines; :func:`protocol_with` sets the seconds."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 120.0

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

    def connection_lost(self, exc: Exception | None) -> None:
        self._set(None)
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


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else ""


def protocol_with(header_timeout_s: float, body_timeout_s: float) -> type[H11Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these deadlines."""

    class Configured(ReadDeadlineProtocol):
        pass

    Configured.header_timeout_s = header_timeout_s
    Configured.body_timeout_s = body_timeout_s
    return Configured
