"""``HermesFixture``: the fake Hermes on 127.0.0.1 in a background thread (uvicorn over a socket the fixture binds),
its knob methods, its simulations (dropped connections, restart, crash) and its thread-safe reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import uvicorn

from talaria.testing.hermes_fixture import sessions
from talaria.testing.hermes_fixture.controls import FixtureControls
from talaria.testing.hermes_fixture.knobs import Knobs
from talaria.testing.hermes_fixture.profiles import profile_configs, profile_entries
from talaria.testing.hermes_fixture.protocols import ExposingWebSocketProtocol, QuietHTTPProtocol
from talaria.testing.hermes_fixture.rest import HermesApp
from talaria.testing.hermes_fixture.state import FixtureState

T = TypeVar("T")


class _Server(uvicorn.Server):
    """uvicorn's server, telling ``start`` when it listens and woken at once by ``request_exit`` (uvicorn itself
    polls ``should_exit`` every 0.1 s)."""

    def __init__(self, config: uvicorn.Config, started: threading.Event) -> None:
        super().__init__(config)
        self._started_event = started
        self._wake: asyncio.Event | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._wake = asyncio.Event()
        await super().startup(sockets=sockets)
        self._started_event.set()

    async def main_loop(self) -> None:
        wake = self._wake or asyncio.Event()
        ticks = 0
        while not await self.on_tick(ticks):
            ticks = (ticks + 10) % 864000  # a multiple of 10: every tick refreshes the Date header
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), 1.0)

    def request_exit(self) -> None:
        """On the server loop."""
        self.should_exit = True
        if self._wake is not None:
            self._wake.set()


class HermesFixture(FixtureControls):
    """A fake Hermes 0.19.0 (``hermes serve`` on a loopback bind) for tests. See the package docstring."""

    def __init__(
        self,
        *,
        session_token: str | None = None,
        profiles: Sequence[str | Mapping[str, Any]] = ("default",),
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        home: Path | None = None,
        dashboard: bool = False,
        knobs: Knobs | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._token_given = session_token is not None
        self._profile_specs = list(profiles)
        profile_entries(self._profile_specs, Path())  # invalid names fail here, not at start
        self._configs_given = configs
        self._home_given = home
        self._state = FixtureState(
            token=session_token or secrets.token_urlsafe(32),
            home=home or Path(),
            profiles=[],
            configs={},
            knobs=knobs or Knobs(),
            now=now,
        )
        if dashboard:
            self._state.knobs.dashboard_page = True
        self._initial_knobs = copy.deepcopy(self._state.knobs)
        self._lifecycle = threading.Lock()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._thread: threading.Thread | None = None
        self._server: _Server | None = None
        self._error: BaseException | None = None
        self.restarts = 0

    # --- lifecycle

    def __enter__(self) -> HermesFixture:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> HermesFixture:
        """Bind ``127.0.0.1:0`` and serve in a background thread. Idempotent; raises RuntimeError if it cannot."""
        with self._lifecycle:
            if self._thread is not None:
                return self
            if self._home_given is None and self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="hermes-fixture-")
            home = self._home_given or Path(self._tmp.name if self._tmp is not None else ".")
            with self._state.cond:
                self._state.home = home
                self._state.profiles = profile_entries(self._profile_specs, home)
                self._state.configs = profile_configs(self._state.profiles, self._configs_given)
            # IPPROTO_TCP explicitly: asyncio turns Nagle off only for sockets that say so.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            self._state.port = sock.getsockname()[1]
            app = HermesApp(self._state)
            config = uvicorn.Config(
                app,
                log_config=None,
                lifespan="off",
                http=QuietHTTPProtocol,
                ws=ExposingWebSocketProtocol,
                timeout_graceful_shutdown=5,
            )
            started = threading.Event()
            server = _Server(config, started)
            thread = threading.Thread(
                target=self._run, args=(server, sock, started), name=f"hermes-fixture-{self.port}", daemon=True
            )
            self._server, self._thread, self._error = server, thread, None
            thread.start()
            started.wait(timeout=30)
            if not server.started:
                server.should_exit = True
                thread.join(timeout=30)
                self._server = self._thread = None
                raise RuntimeError(f"the Hermes fixture did not start: {self._error!r}")
            return self

    def _run(self, server: _Server, sock: socket.socket, started: threading.Event) -> None:
        async def serve() -> None:
            self._state.loop = asyncio.get_running_loop()
            self._state.stopping = asyncio.Event()
            await server.serve(sockets=[sock])

        try:
            asyncio.run(serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
        finally:
            sock.close()
            started.set()

    def stop(self) -> None:
        """Close every live session and connection and stop serving. Idempotent; safe before ``start``. Stored
        transcripts and logs stay readable; ``start`` again serves on a new port (a restarted Hermes)."""
        with self._lifecycle:
            thread, server = self._thread, self._server
            if thread is not None and server is not None:
                try:
                    if thread.is_alive() and self._state.loop is not None:
                        self._on_loop(self._quiesce)
                finally:
                    server.should_exit = True
                    thread.join(timeout=30)
            self._thread = self._server = None
            self._state.loop = None
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    async def _quiesce(self) -> None:
        state = self._state
        if state.stopping is not None:
            state.stopping.set()
        with state.cond:
            for session in list(state.live.values()):
                sessions.close(state, session)
        tasks = [t for t in state.tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            self._server.request_exit()

    def _on_loop(self, make: Callable[[], Awaitable[T]]) -> T:
        loop = self._state.loop
        if loop is None or self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the Hermes fixture is not running")

        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=30)

    # --- where it is

    @property
    def port(self) -> int:
        return self._state.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._state.port}"

    @property
    def origin(self) -> str:
        return self.url

    @property
    def session_token(self) -> str:
        with self._state.cond:
            return self._state.token

    @property
    def ws_url(self) -> str:
        """``ws://127.0.0.1:<port>/api/ws?token=<session token>``."""
        return f"ws://127.0.0.1:{self._state.port}/api/ws?token={self.session_token}"

    @property
    def home(self) -> Path:
        """The fixture's Hermes home (set by ``start``)."""
        return self._state.home

    @property
    def knobs(self) -> Knobs:
        return self._state.knobs

    def auth_headers(self) -> dict[str, str]:
        return {"X-Hermes-Session-Token": self.session_token}

    # --- simulations

    def drop_connections(self) -> int:
        """Abort every open ``/api/ws`` connection (no close frame); returns how many there were."""

        async def drop() -> int:
            with self._state.cond:
                open_now = list(self._state.connections.values())
            for conn in open_now:
                conn.drop()
            return len(open_now)

        return self._on_loop(drop)

    def restart(self, *, crash: bool = False, new_token: bool | None = None) -> None:
        """What a Hermes restart does to clients, without a new port: every live session ends (runtime ids become
        unknown, running turns are lost), every WebSocket closes with 1012 (``crash``: aborted without a close
        frame), stored transcripts remain. A new session token is minted unless one was given to the constructor
        (``new_token`` overrides)."""

        async def restart() -> None:
            state = self._state
            with state.cond:
                if new_token if new_token is not None else not self._token_given:
                    state.token = secrets.token_urlsafe(32)
                for session in list(state.live.values()):
                    sessions.close(state, session)
                open_now = list(state.connections.values())
                self.restarts += 1
                state.changed()
            for conn in open_now:
                if crash:
                    conn.drop()
                else:
                    await conn.close(1012)

        self._on_loop(restart)

    def seed_session(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        profile: str = "default",
        title: str | None = None,
        stored_id: str | None = None,
    ) -> str:
        """Store a session as if it had run earlier (``{role, content, finish_reason?}`` rows); returns its id."""
        state = self._state
        with state.cond:
            sid = stored_id or state.new_stored_id()
            state.ensure_stored(profile, sid, title)
            for message in messages:
                extra = {k: v for k, v in message.items() if k not in {"role", "content"}}
                state.append_row(profile, sid, str(message["role"]), str(message.get("content") or ""), **extra)
            return sid
