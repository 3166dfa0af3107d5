"""One JSON-RPC 2.0 channel to Hermes' ``/api/ws`` (hermes.md 4; runner-protocol.md 10.1). Standard library and
``websockets`` only.

``HermesChannel.connect`` opens ``ws(s)://<hermes>/api/ws?token=…`` with ``Origin`` equal to the Hermes origin, no
proxy, frames up to 36 MiB, and waits at most 20 s in total for the ``gateway.ready`` event (else
``HermesUnavailable``). Then:

- ``request(method, params)`` sends one request with a fresh UUID id and waits at most 30 s for its response:
  the ``result`` value, ``RpcError(code, message)`` for a JSON-RPC error, ``RpcTimeout`` without an answer (the
  request may have run), ``ChannelClosed`` when the connection is gone (``sent`` tells whether the request left).
  ``on_result`` runs synchronously in the reader as the response arrives, before any later frame is handled, so a
  caller can register what the response creates (an owned session, a running mark) before the events that follow it.
- Every event after ``gateway.ready`` goes to ``on_event(params)``, synchronously, in arrival order.
- ``on_lost()`` is called once when the connection ends without ``close()`` (Hermes closed it, the network failed,
  or a frame exceeded 36 MiB). ``close()`` never triggers it.

The session token travels only in the upgrade URL. Nothing here puts the URL or a credential into an exception or a
log line: websockets gets a logger that drops everything, and connection failures are reported by exception type
and HTTP status only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import quote, urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Origin

from talaria.hermes.auth import HermesUnavailable
from talaria.timeouts import within

MAX_FRAME_BYTES: Final = 36 * 1024 * 1024
READY_TIMEOUT_S: Final = 20.0
REQUEST_TIMEOUT_S: Final = 30.0
CLOSE_TIMEOUT_S: Final = 2.0

EventHandler = Callable[[dict[str, Any]], None]
ResultHook = Callable[[Any], None]

# websockets logs the request line (with ``?token=``) at DEBUG; this logger is not attached to the hierarchy and
# lets nothing through, whatever the application's logging configuration.
_QUIET = logging.Logger("talaria.hermes.ws.quiet", level=logging.CRITICAL + 1)
_QUIET.propagate = False
_log = logging.getLogger("talaria.hermes.ws")


class RpcError(Exception):
    """A JSON-RPC error answer of Hermes."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RpcTimeout(Exception):
    """No response within the request timeout; Hermes may have run the request."""


class ChannelClosed(Exception):
    """The connection is closed; ``sent`` is True when the request had been sent (it may have run)."""

    def __init__(self, sent: bool) -> None:
        super().__init__("the Hermes connection is closed")
        self.sent = sent


class AuthRefused(HermesUnavailable):
    """Hermes refused the WebSocket upgrade (401/403): the credential may be stale."""


def ws_origin(hermes_url: str) -> tuple[str, str]:
    """``(origin, ws base URL)`` of a Hermes base URL, e.g. ``("http://127.0.0.1:9119", "ws://127.0.0.1:9119")``."""
    parts = urlsplit(hermes_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    scheme = "wss" if parts.scheme == "https" else "ws"
    return origin, f"{scheme}://{parts.netloc}"


class HermesChannel:
    def __init__(self, ws: ClientConnection, on_event: EventHandler, on_lost: Callable[[], None]) -> None:
        self._ws = ws
        self._on_event = on_event
        self._on_lost = on_lost
        self._pending: dict[str, tuple[asyncio.Future[Any], ResultHook | None]] = {}
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closing = False
        self._ended = False
        self._reader: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(
        cls,
        hermes_url: str,
        credential: tuple[str, str],
        *,
        on_event: EventHandler,
        on_lost: Callable[[], None],
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> HermesChannel:
        """Connect and wait for ``gateway.ready``; ``credential`` is ``("token" | "ticket", value)``.

        Raises ``AuthRefused`` for a refused upgrade (401/403) and ``HermesUnavailable`` for every other failure.
        """
        origin, base = ws_origin(hermes_url)
        name, value = credential
        uri = f"{base}/api/ws?{name}={quote(value, safe='')}"
        channel: HermesChannel | None = None
        try:
            async with asyncio.timeout(ready_timeout):
                ws = await connect(
                    uri,
                    origin=Origin(origin),
                    proxy=None,
                    max_size=MAX_FRAME_BYTES,
                    open_timeout=None,
                    close_timeout=CLOSE_TIMEOUT_S,
                    logger=_QUIET,
                )
                channel = cls(ws, on_event, on_lost)
                await asyncio.shield(channel._ready)
        except TimeoutError:
            await cls._abandon(channel)
            raise HermesUnavailable("Hermes did not send gateway.ready within 20 s") from None
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise AuthRefused(f"Hermes refused the WebSocket ({status})") from None
            raise HermesUnavailable(f"Hermes refused the WebSocket ({status})") from None
        except (OSError, ConnectionClosed) as exc:
            await cls._abandon(channel)
            raise HermesUnavailable(f"Hermes' WebSocket is not reachable ({type(exc).__name__})") from None
        except asyncio.CancelledError:
            await cls._abandon(channel)
            raise
        except Exception as exc:  # handshake errors of every other kind; their text may hold the URL
            await cls._abandon(channel)
            raise HermesUnavailable(f"Hermes' WebSocket failed ({type(exc).__name__})") from None
        return channel

    @staticmethod
    async def _abandon(channel: HermesChannel | None) -> None:
        if channel is not None:
            await channel.close()

    @property
    def closed(self) -> bool:
        return self._closing or self._ended

    async def request(
        self,
        method: str,
        params: dict[str, Any],
        *,
        on_result: ResultHook | None = None,
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> Any:
        if self.closed:
            raise ChannelClosed(sent=False)
        request_id = str(uuid.uuid4())
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, on_result)
        text = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        try:
            try:
                await self._ws.send(text)
            except ConnectionClosed:
                raise ChannelClosed(sent=False) from None
            try:
                return await within(asyncio.shield(future), timeout)
            except TimeoutError:
                raise RpcTimeout(f"Hermes did not answer {method} within {timeout:g} s") from None
        finally:
            self._pending.pop(request_id, None)
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved, even when this request was itself cancelled

    async def close(self) -> None:
        """Close the WebSocket (at most ``CLOSE_TIMEOUT_S`` for the closing handshake); ``on_lost`` is not called."""
        self._closing = True
        with contextlib.suppress(Exception):
            await self._ws.close()
        if not self._reader.done():
            self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader

    # --- the reader --------------------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                self._dispatch(message)
        except ConnectionClosed:
            pass
        finally:
            self._ended = True
            for future, _ in self._pending.values():
                if not future.done():
                    future.set_exception(ChannelClosed(sent=True))
            if not self._ready.done():
                self._ready.set_exception(ConnectionClosed(None, None))
                self._ready.exception()  # retrieved here: nobody may be waiting any more
            if not self._closing:
                self._on_lost()

    def _dispatch(self, message: str | bytes) -> None:
        try:
            frame = json.loads(message)
        except ValueError:
            return
        if not isinstance(frame, dict):
            return
        if frame.get("method") == "event":
            params = frame.get("params")
            if not isinstance(params, dict):
                return
            if not self._ready.done():
                if params.get("type") == "gateway.ready":
                    self._ready.set_result(None)
                return
            try:
                self._on_event(params)
            except Exception as exc:  # a consumer bug must not end the reader
                _log.warning("hermes_event_handler_failed", extra={"error": type(exc).__name__})
            return
        request_id = frame.get("id")
        if not isinstance(request_id, str):
            return
        pending = self._pending.get(request_id)
        if pending is None or pending[0].done():
            return
        future, on_result = pending
        error = frame.get("error")
        if "result" not in frame and isinstance(error, dict):
            code = error.get("code")
            message_text = error.get("message")
            future.set_exception(
                RpcError(code if isinstance(code, int) else 0, message_text if isinstance(message_text, str) else "")
            )
            return
        result = frame.get("result")
        if on_result is not None:
            try:
                on_result(result)
            except Exception as exc:  # reported to the requester
                future.set_exception(exc)
                return
        future.set_result(result)
