"""Serve the hub with uvicorn: bind first, print the ready line once serving, drain then stop on SIGTERM or SIGINT
(operations.md 3.4); SIGUSR1 writes every thread's stack to stderr (a hub that stops answering can be asked where it
waits)."""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import signal
import socket
import sys
from types import FrameType
from typing import Any, TextIO

import structlog
import uvicorn

from talaria.clock import Clock, SystemClock
from talaria.errors import SettingsError, TalariaError
from talaria.hub.app import create_app
from talaria.hub.connection_deadlines import protocol_for
from talaria.hub.resources import open_hub
from talaria.hub.tls import check_tls
from talaria.lifecycle.recovery import RecoveryError
from talaria.settings import Settings
from talaria.store.open import check_database

DRAIN_CHECK_S = 0.1  # how often a draining hub looks whether its turns have finished
log = structlog.get_logger("talaria.hub")


class HubUvicorn(uvicorn.Server):
    """uvicorn waits for open requests before the lifespan ends; held runner polls must first be told
    ``hub_shutting_down`` (runner-protocol.md 6.2), or shutdown would wait out their 15 s holds, and open chat
    event streams ended (chat.md 4.1), which would otherwise never end.

    The first SIGTERM or SIGINT drains (operations.md 3.4): no new turn starts, the running ones finish (at most
    ``hub.drain_timeout_s``), everything else serves on; then the stop as before. A second signal stops at once."""

    drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        hub = getattr(getattr(self.config.app, "state", None), "hub", None)
        timeout = hub.settings.hub_drain_timeout_s if hub is not None else 0
        if self.drain_task is not None or self.should_exit or timeout <= 0 or not self.started:
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)
        try:
            loop = asyncio.get_running_loop()  # the signal arrives on the loop's own thread, between its callbacks
        except RuntimeError:
            super().handle_exit(sig, frame)
            return
        self.drain_task = loop.create_task(self._drain(hub, timeout))  # marks the drain begun at once
        loop.call_soon_threadsafe(lambda: None)  # wake the selector so that the task starts now

    async def _drain(self, hub: Any, timeout: float) -> None:
        running = hub.begin_drain()
        deadline = asyncio.get_running_loop().time() + timeout
        while running and asyncio.get_running_loop().time() < deadline and not self.should_exit:
            await asyncio.sleep(DRAIN_CHECK_S)
            running = hub.turns_running()
        log.info("hub_drained" if not running else "hub_drain_timed_out", running_turns=running)
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        hub = getattr(getattr(self.config.app, "state", None), "hub", None)
        if hub is not None:
            hub.runners.begin_shutdown()
            hub.chat_events.close_all()
        await super().shutdown(sockets)


def bind(host: str, port: int) -> socket.socket:
    """Bind (not yet listen) so that ``--port 0`` learns its port before the ready line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only for sockets that say so,
    # and without it every small reply waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str, *, tls: bool = False) -> str:
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


async def _serve(server: uvicorn.Server, sock: socket.socket, out: TextIO, url: str) -> bool:
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            break
        await asyncio.sleep(0.02)
    if server.started:
        print(f"talaria hub listening on {url}", file=out, flush=True)
    await task
    return bool(server.started)


def run_hub(settings: Settings, *, clock: Clock | None = None, out: TextIO = sys.stdout) -> int:
    """Run until SIGTERM/SIGINT; 0 after a clean stop, 1 when start-up failed (one line on stderr).

    Order (lifecycle.md 10): bind (not listen), open the store, migrate, recover, then serve; the
    listener opens only when all of that succeeded."""
    try:
        check_database(settings)  # a wrong, unreachable or driverless database.url stops the hub before it binds
        if settings.tls:
            check_tls(settings.hub_tls_cert, settings.hub_tls_key)
    except TalariaError as exc:
        print(f"talaria hub: {exc.message}", file=sys.stderr)
        return 1
    try:
        sock = bind(settings.hub_host, settings.hub_port)
    except OSError as exc:
        print(f"talaria hub: cannot bind {settings.hub_host}:{settings.hub_port}: {exc.strerror}", file=sys.stderr)
        return 1
    url = url_of(sock, settings.hub_host, tls=settings.tls)
    if settings.hub_port == 0 and not settings.hub_public_url:
        # the browser origin must name the port actually bound
        settings = _with_port(settings, sock.getsockname()[1])
    try:
        hub = open_hub(settings, clock or SystemClock())
    except (TalariaError, RecoveryError, SettingsError) as exc:
        sock.close()
        print(f"talaria hub: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 1
    app = create_app(settings, clock=hub.clock, hub=hub)
    # proxy_headers off: uvicorn would otherwise believe X-Forwarded-For from loopback peers; the hub derives
    # the client address itself (hub/client_address.py) and peer rules use the TCP peer.
    tls = {"ssl_certfile": settings.hub_tls_cert, "ssl_keyfile": settings.hub_tls_key} if settings.tls else {}
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
        proxy_headers=False,
        http=protocol_for(settings),
        ws="none",  # the hub serves no WebSocket (ADR 0063)
        **tls,  # type: ignore[arg-type]
    )
    server = HubUvicorn(config)
    # uvicorn re-raises the signal it caught once it has stopped; a no-op handler makes that a clean exit.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        started = asyncio.run(_serve(server, sock, out, url))
    finally:
        faulthandler.unregister(signal.SIGUSR1)
        sock.close()
    return 0 if started else 1


def _with_port(settings: Settings, port: int) -> Settings:
    return dataclasses.replace(settings, hub_port=port)
