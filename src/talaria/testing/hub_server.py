"""A real hub on 127.0.0.1 in a background thread, for tests: uvicorn, a real socket, a temporary
data directory and an injected clock. ``restart()`` builds a new app over the same directory and
clock, as the acceptance scenarios of lifecycle.md 11 require.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn

from talaria.clock import Clock
from talaria.hub.app import create_app
from talaria.hub.connection_deadlines import protocol_for
from talaria.hub.resources import Hub
from talaria.hub.server import HubUvicorn, bind
from talaria.hub.timings import HubTimings
from talaria.settings import Settings, validate

T = TypeVar("T")


class HubServer:
    def __init__(self, data_dir: Path, clock: Clock, *, timings: HubTimings | None = None, **settings: Any) -> None:
        self.data_dir = data_dir
        self.timings = timings
        self.clock = clock
        self.settings = Settings(data_dir=data_dir, **settings)
        validate(self.settings)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._app: Any = None
        self.url = ""
        self._port = 0
        self.startup_error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> HubServer:
        """Serve on 127.0.0.1: a free port the first time, the same port after ``restart`` (so runners and
        clients reach the restarted hub where they reached it before)."""
        sock = bind("127.0.0.1", self._port)
        port = self._port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        settings = dataclasses.replace(self.settings, hub_port=port, hub_public_url=self.url)
        self._app = create_app(settings, clock=self.clock, run_reaper=False, timings=self.timings)
        http = protocol_for(settings)
        config = uvicorn.Config(
            self._app, log_config=None, access_log=False, lifespan="on", proxy_headers=False, http=http, ws="none"
        )
        server = HubUvicorn(config)
        self._server = server

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await server.serve(sockets=[sock])

        def run() -> None:
            try:
                asyncio.run(serve())
            except BaseException as exc:  # surfaced by start()
                self.startup_error = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="hub-server", daemon=True)
        self._thread.start()
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the hub did not start: {self.startup_error!r}")
            self._thread.join(0.01)
        return self

    @property
    def hub(self) -> Hub:
        hub: Hub = self._app.state.hub
        return hub

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run ``coro`` on the hub's event loop (where runner states and their futures live)."""
        assert self._loop is not None, "the hub is not running"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10.0, **kwargs)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._server = None
        self._thread = None

    def restart(self) -> HubServer:
        self.stop()
        return self.start()
