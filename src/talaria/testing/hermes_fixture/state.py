"""The state one fixture shares between its server thread and the test: live sessions, stored transcripts, logs and
knobs, all guarded by one condition variable (``cond``). Every change notifies it, so a test waits with
``HermesFixture.wait_for`` instead of sleeping.

Asyncio objects (events, futures, tasks, timer handles) belong to the server loop and are touched only there; the
test thread reads plain fields under ``cond``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from talaria.testing.hermes_fixture.knobs import Knobs

if TYPE_CHECKING:
    from talaria.testing.hermes_fixture.ws import Connection

PROFILE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-")


class RpcError(Exception):
    """A JSON-RPC error answer with Hermes' code (hermes.md 4)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class RequestRecord:
    """One HTTP request or WebSocket upgrade (method ``WEBSOCKET``); credentials are replaced by ``<redacted>``."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    status: int | None = None


@dataclass(frozen=True)
class RpcRecord:
    """One JSON-RPC request as received (``method`` is ``""`` when it had none)."""

    connection: int
    id: Any
    method: str
    params: dict[str, Any]


@dataclass
class TurnRecord:
    """One turn; ``status`` is running, complete, interrupted, error or abandoned (session closed mid-turn)."""

    runtime_id: str
    stored_id: str
    profile: str
    text: str
    status: str = "running"
    reply: str = ""


@dataclass(frozen=True)
class SessionView:
    """A snapshot of one live session."""

    runtime_id: str
    stored_id: str
    profile: str
    status: str
    running: bool
    attached: bool
    connection: int | None
    close_on_disconnect: bool


class Sink(Protocol):
    """Where a session's events go: the WebSocket connection it is attached to."""

    @property
    def id(self) -> int: ...

    async def send(self, frame: dict[str, Any]) -> bool: ...


@dataclass
class StoredSession:
    """A ``state.db`` session row with its messages; ``continued_by`` names the session compression moved to."""

    id: str
    profile: str
    started_at: float
    title: str | None = None
    source: str = "tui"
    rows: list[dict[str, Any]] = field(default_factory=list)
    continued_by: str | None = None
    last_active: float = 0.0


@dataclass
class Turn:
    text: str
    record: TurnRecord
    interrupted: asyncio.Event
    task: asyncio.Task[None] | None = None
    assistant: str = ""
    approval: asyncio.Future[str] | None = None
    clarify_id: str | None = None


@dataclass
class LiveSession:
    runtime_id: str
    stored_id: str
    profile: str
    close_on_disconnect: bool
    sink: Sink | None
    created_at: float
    model: str
    provider: str | None
    cwd: str
    title: str | None
    agent_ready: asyncio.Event
    history: list[dict[str, Any]] = field(default_factory=list)
    building: bool = True
    running: bool = False
    turn: Turn | None = None
    queued: tuple[str, Sink | None] | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: {"calls": 0, "input": 0, "output": 0, "total": 0, "prompt": 0, "completion": 0}
    )
    last_active: float = 0.0
    reap: asyncio.TimerHandle | None = None
    closed: bool = False
    attachments: int = 0

    @property
    def status(self) -> str:
        if self.turn is not None and (self.turn.approval is not None or self.turn.clarify_id is not None):
            return "waiting"
        if self.building:
            return "starting"
        return "working" if self.running else "idle"


def valid_profile_name(name: str) -> bool:
    return 0 < len(name) <= 64 and name[0] not in "_-" and set(name) <= PROFILE_NAME_CHARS


class FixtureState:
    def __init__(
        self,
        *,
        token: str,
        home: Path,
        profiles: list[dict[str, Any]],
        configs: dict[str, dict[str, Any]],
        knobs: Knobs,
        now: Callable[[], float],
    ) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.token = token
        self.home = home
        self.profiles = profiles
        self.configs = configs
        self.knobs = knobs
        self.now = now
        self.port = 0
        self.live: dict[str, LiveSession] = {}
        self.stored: dict[tuple[str, str], StoredSession] = {}
        self.row_seq = 0
        self.internal_errors: list[str] = []
        self.requests: list[RequestRecord] = []
        self.rpc_log: list[RpcRecord] = []
        self.turns: list[TurnRecord] = []
        self.binds: list[dict[str, Any]] = []
        self.unbinds: list[dict[str, Any]] = []
        self.bindings: dict[str, dict[str, Any]] = {}
        self.steers: list[dict[str, Any]] = []
        self.approval_choices: list[dict[str, Any]] = []
        self.clarify_answers: list[dict[str, Any]] = []
        self.attachments: list[dict[str, Any]] = []
        self.connections: dict[int, Connection] = {}
        self.connections_opened = 0
        self.pending_clarify: dict[str, tuple[str, asyncio.Future[str]]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping: asyncio.Event | None = None

    # --- coordination

    def changed(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` on the server loop as a tracked task (cancelled by ``stop``)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def pause(self, seconds: float, event: asyncio.Event | None = None) -> bool:
        """Sleep ``seconds`` unless ``event`` (or the fixture's stop) fires first; True when it was cut short."""
        waits = [e for e in (event, self.stopping) if e is not None]
        if any(e.is_set() for e in waits):
            return True
        if seconds <= 0:
            await asyncio.sleep(0)
            return any(e.is_set() for e in waits)
        waiters = [asyncio.ensure_future(e.wait()) for e in waits]
        try:
            done, _ = await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        return bool(done)

    async def emit(self, session: LiveSession, kind: str, payload: dict[str, Any] | None = None) -> None:
        """Send an event to the session's current connection; lost when the session is detached."""
        params: dict[str, Any] = {"type": kind, "session_id": session.runtime_id}
        if payload is not None:
            params["payload"] = payload
        sink = session.sink
        if sink is not None and not session.closed:
            await sink.send({"jsonrpc": "2.0", "method": "event", "params": params})

    # --- ids and profiles

    def new_runtime_id(self) -> str:
        while True:
            candidate = uuid.uuid4().hex[:8]
            if candidate not in self.live:
                return candidate

    def new_stored_id(self) -> str:
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(self.now()))
        return f"{stamp}_{uuid.uuid4().hex[:6]}"

    def profile_known(self, name: str) -> bool:
        return any(p.get("name") == name for p in self.profiles)

    def effective_profile(self, requested: Any) -> str:
        """Hermes 0.19.0 silently runs an unknown profile under the launch profile (hermes.md 6)."""
        name = str(requested or "").strip()
        return name if name and self.profile_known(name) else "default"

    # --- stored sessions

    def find_stored(self, profile: str, key: str, *, prefix: bool = False) -> StoredSession | None:
        found = self.stored.get((profile, key))
        if found is None and prefix and key:
            matches = [s for (p, sid), s in self.stored.items() if p == profile and sid.startswith(key)]
            found = matches[0] if len(matches) == 1 else None
        return found

    def find_by_title(self, profile: str, title: str) -> StoredSession | None:
        for (p, _), stored in self.stored.items():
            if p == profile and stored.title == title:
                return stored
        return None

    def tip(self, stored: StoredSession) -> StoredSession:
        """The newest session of a compression chain."""
        seen = {stored.id}
        while stored.continued_by is not None:
            nxt = self.stored.get((stored.profile, stored.continued_by))
            if nxt is None or nxt.id in seen:
                break
            seen.add(nxt.id)
            stored = nxt
        return stored

    def ensure_stored(self, profile: str, stored_id: str, title: str | None = None) -> StoredSession:
        """A session's ``state.db`` row, written with its first message. A named profile's session also leaves a
        0-message stub in the default profile (the 0.19.0 quirk of hermes.md 6)."""
        stored = self.stored.get((profile, stored_id))
        if stored is None:
            now = self.now()
            stored = StoredSession(stored_id, profile, now, title, last_active=now)
            self.stored[(profile, stored_id)] = stored
            if profile != "default" and ("default", stored_id) not in self.stored:
                self.stored[("default", stored_id)] = StoredSession(
                    stored_id, "default", now, source="unknown", last_active=now
                )
        return stored

    def append_row(self, profile: str, stored_id: str, role: str, content: str, **extra: Any) -> dict[str, Any]:
        stored = self.ensure_stored(profile, stored_id)
        now = self.now()
        self.row_seq += 1
        row: dict[str, Any] = {
            "id": self.row_seq,
            "session_id": stored.id,
            "role": role,
            "content": content,
            "tool_call_id": None,
            "tool_calls": None,
            "tool_name": None,
            "timestamp": now,
            "token_count": None,
            "finish_reason": None,
            "reasoning": None,
            "active": 1,
        }
        row.update(extra)
        stored.rows.append(row)
        stored.last_active = now
        self.changed()
        return row
