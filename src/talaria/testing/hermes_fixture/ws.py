"""``/api/ws``: the upgrade checks (``?token=``, Host, Origin; a refusal is a close before accept, which uvicorn
answers with HTTP 403), ``gateway.ready``, then JSON-RPC requests in arrival order. Method delays answer from a
separate task, so later requests overtake them, like Hermes' thread-pool handlers. Runs on the server loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from starlette.websockets import WebSocket

from talaria.testing.hermes_fixture import rpc, sessions
from talaria.testing.hermes_fixture.guards import host_ok, origin_ok, redact_headers, redact_query, same_secret
from talaria.testing.hermes_fixture.state import FixtureState, RequestRecord, RpcRecord

# The scope extension under which the fixture's uvicorn protocol exposes the TCP transport, so that a "dropped"
# connection can be aborted without a close frame.
TRANSPORT_EXTENSION = "talaria.transport"


class Connection:
    """One accepted WebSocket. Sends are serialised; ``drop`` aborts the TCP connection (the peer sees 1006)."""

    def __init__(self, ws: WebSocket, transport: asyncio.Transport | None, number: int, drop_after: int | None) -> None:
        self.ws = ws
        self.transport = transport
        self.number = number
        self.drop_after = drop_after
        self.sent = 0
        self.open = True
        self._lock = asyncio.Lock()

    @property
    def id(self) -> int:
        return self.number

    async def send(self, frame: dict[str, Any]) -> bool:
        async with self._lock:
            if not self.open:
                return False
            try:
                await self.ws.send_text(json.dumps(frame, ensure_ascii=False))
            except Exception:  # the peer went away; Hermes marks the transport closed the same way
                self.open = False
                return False
            self.sent += 1
            if self.drop_after is not None and self.sent >= self.drop_after:
                self.drop()
            return True

    def drop(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.abort()
        else:  # no transport exposed: the closest thing is an abnormal close
            asyncio.get_running_loop().create_task(self._close_quietly(1011))

    async def close(self, code: int) -> None:
        """A clean close with ``code`` (1012 is what a restarting Hermes sends)."""
        if self.open:
            self.open = False
            await self._close_quietly(code)

    async def _close_quietly(self, code: int) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close(code)


def _transport_of(ws: WebSocket) -> asyncio.Transport | None:
    extension = (ws.scope.get("extensions") or {}).get(TRANSPORT_EXTENSION) or {}
    transport = extension.get("transport")
    return transport if isinstance(transport, asyncio.Transport) else None


async def serve_gateway(state: FixtureState, ws: WebSocket) -> None:
    headers = {k.lower(): v for k, v in ws.headers.items()}
    query = dict(ws.query_params)
    record = RequestRecord("WEBSOCKET", ws.url.path, redact_query(query), redact_headers(headers), None)
    with state.cond:
        state.requests.append(record)
        token_ok = same_secret(query.get("token", ""), state.token)
        guard_ok = host_ok(headers.get("host", ""), state.port) and origin_ok(headers.get("origin"), state.port)
        record.status = 101 if token_ok and guard_ok else 403
        state.changed()
    if not token_ok:
        await ws.close(code=4401)
        return
    if not guard_ok:
        await ws.close(code=4403)
        return
    await ws.accept()
    with state.cond:
        state.connections_opened += 1
        conn = Connection(ws, _transport_of(ws), state.connections_opened, state.knobs.drop_after_frames)
        state.connections[conn.number] = conn
        state.changed()
    try:
        if state.knobs.send_ready:
            await state.pause(state.knobs.ready_delay)
            await conn.send(
                {
                    "jsonrpc": "2.0",
                    "method": "event",
                    "params": {"type": "gateway.ready", "payload": {"skin": {"name": "default"}}},
                }
            )
        await _serve(state, ws, conn)
    finally:
        conn.open = False
        with state.cond:
            state.connections.pop(conn.number, None)
            sessions.detach_all(state, conn)
            state.changed()


async def _serve(state: FixtureState, ws: WebSocket, conn: Connection) -> None:
    while conn.open:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        raw = message.get("text")
        if raw is None:
            raw = (message.get("bytes") or b"").decode("utf-8", "replace")
        line = raw.strip()
        if not line:
            continue
        try:
            request = json.loads(line)
        except ValueError:
            await conn.send(rpc.err(None, -32700, "parse error"))
            continue
        normalized = rpc.normalize(request)
        if isinstance(normalized, dict):
            await conn.send(normalized)
            continue
        rid, method, params = normalized
        with state.cond:
            state.rpc_log.append(RpcRecord(conn.number, rid, method, params))
            drop = state.knobs.method_drops.take(method, "method")
            delay = state.knobs.method_delays.take(method, "method")
            state.changed()
        if drop is not None and not drop.after_handling:
            conn.drop()
            return
        if delay is not None:
            if delay.seconds is not None:
                state.spawn(_answer_later(state, conn, (rid, method, params), delay.seconds))
            continue
        response = rpc.dispatch(state, conn, rid, method, params)
        if drop is not None:
            conn.drop()
            return
        await conn.send(response)


async def _answer_later(state: FixtureState, conn: Connection, request: tuple[Any, str, Any], seconds: float) -> None:
    """A slow handler: it runs after the delay even if the connection went away meanwhile (its answer is lost)."""
    if await state.pause(seconds):
        return
    rid, method, params = request
    response = rpc.dispatch(state, conn, rid, method, params)
    await conn.send(response)
