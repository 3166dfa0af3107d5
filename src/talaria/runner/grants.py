"""Team-tool grants on the runner (runner-protocol.md 7.5-7.7, 12.2-12.4): the ``grant.create``,
``grant.bind`` and ``grant.close`` command kinds, one loopback listener per grant, expiry and disposal.

Disposal (``grant.close``, expiry, local disconnect, close of the owning connection) is one operation: stop the
listener, answer waiting calls ``runner_grant_expired``, POST ``unbind`` (best effort, only if a bind was
tried), and tombstone the id for at least 60 s. It is idempotent.

Decisions where the specification is silent:

- ``grant.bind`` and tool calls of an unknown, closed or expired grant give ``runner_grant_expired``.
- ``grant.close`` of an unknown id tombstones it, so a ``grant.create`` delivered late cannot resurrect it.
- A listener that cannot start gives ``team_tools_unavailable``.
- A plugin answer of ``ok: true`` without ``native_tools: true`` on the first bind is unbound again.
- A bind that outlives its grant is unbound again and answers ``runner_grant_expired``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from talaria.clock import Clock
from talaria.hermes.rest import HermesRest
from talaria.runner import grant_plugin as plugin
from talaria.runner.config import RunnerConfig
from talaria.runner.errors import CommandError
from talaria.runner.executor import Handler
from talaria.runner.grant_listener import ToolListener
from talaria.runner.grant_payload import expired, forbidden, parse_bind, parse_close, parse_create
from talaria.runner.grant_tools import ToolCalls, ToolError
from talaria.runner.hub_client import HubClient, HubError
from talaria.runner_json import UUID_RE

MAX_GRANTS: Final = 64  # open (or opening) grants per runner -> runner_busy
GRANT_LIFETIME_MS: Final = 30 * 60 * 1000  # after creation or the last successful bind -> disposed
TOMBSTONE_MS: Final = 60 * 1000  # a closed grant id is refused (runner_command_forbidden) at least this long
CLOSE_GRACE_S: Final = 1.0  # answers being written when a listener stops get this long

_log = logging.getLogger("talaria.runner.grants")


class SessionOwnership(Protocol):
    """What the gateway module tells grants about the Hermes sessions its connections own."""

    def profile_of(self, runtime_id: str) -> str | None:
        """The owning connection's profile for an owned runtime session id, else None."""
        ...


@dataclass(eq=False)
class Grant:
    id: str
    profile: str
    work_id: str
    runtime_id: str
    stored_id: str
    epoch: str
    generation: str  # "<workId>:<uuid>", one per grant
    bearer: str = field(repr=False)
    tools: ToolCalls = field(repr=False)
    listener: ToolListener | None = None
    expires_at: int = 0
    state: str = "creating"  # creating | open | closed
    bound: bool = False  # a first bind succeeded
    bind_tried: bool = False
    bind_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    disposal: asyncio.Task[None] | None = field(default=None, repr=False)


class Grants:
    """The runner's grants. Command handlers run on the agent's event loop; nothing here blocks."""

    def __init__(
        self,
        config: RunnerConfig,
        hub: HubClient,
        rest_factory: Callable[[], HermesRest],
        clock: Clock,
        ownership: SessionOwnership,
        epoch: Callable[[], str | None],
        *,
        stored_of: Callable[[str], str | None] | None = None,
        record_session: Callable[[str, str], None] | None = None,
        on_hub_error: Callable[[HubError], Awaitable[None]] | None = None,
    ) -> None:
        """``epoch()`` is the current epoch while connected, else None. Optional: ``stored_of(runtime_id)``,
        the stored id last seen in a ``session.info`` frame (a change during a bind triggers one more bind);
        ``record_session(stored_id, profile)``, section 11.2's record, written on ``grant.bind`` (called in a
        thread, best effort); ``on_hub_error``, told of ``runner_epoch_changed``/``runner_instance_changed`` on
        a ``tool`` post (the agent's local disconnect).
        """
        self.config = config
        self.hub = hub
        self.rest_factory = rest_factory
        self.clock = clock
        self.ownership = ownership
        self.epoch = epoch
        self.stored_of = stored_of
        self.record_session = record_session
        self.on_hub_error = on_hub_error
        self._grants: dict[str, Grant] = {}
        self._tombstones: dict[str, int] = {}  # grant id -> refused until (ms)
        self._disposing: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Future[None]] = set()

    def handlers(self) -> dict[str, Handler]:
        return {"grant.create": self._create, "grant.bind": self._bind, "grant.close": self._close}

    # --- views (diagnostics and tests; never the bearer) ----------------------------------------------------

    def open_ids(self) -> list[str]:
        """Ids of the grants that exist (opening ones included)."""
        return list(self._grants)

    def listener_port(self, grant_id: str) -> int | None:
        grant = self._grants.get(grant_id)
        return grant.listener.port if grant is not None and grant.listener is not None else None

    def expires_at(self, grant_id: str) -> int | None:
        grant = self._grants.get(grant_id)
        return grant.expires_at if grant is not None and grant.state == "open" else None

    def tombstoned(self, grant_id: str) -> bool:
        self._prune_tombstones()
        return grant_id in self._tombstones

    # --- grant.create (7.5, 12.2) ---------------------------------------------------------------------------

    async def _create(self, command: dict[str, Any]) -> dict[str, Any]:
        request = parse_create(command)
        grant_id, profile, runtime_id = request.grant_id, request.profile, request.runtime_id
        if profile not in self.config.allowed_profiles:
            raise CommandError("runner_profile_forbidden", "this profile is not in the runner's allowedProfiles")
        if not UUID_RE.match(grant_id) or self.tombstoned(grant_id) or grant_id in self._grants:
            raise forbidden("grantId must be a new UUID")
        if len(self._grants) >= MAX_GRANTS:
            raise CommandError("runner_busy", f"this runner has {MAX_GRANTS} grants open")
        if self.ownership.profile_of(runtime_id) != profile:
            raise CommandError("runner_session_forbidden", "the session is not owned by a connection of this profile")
        epoch = self.epoch()
        if epoch is None:
            raise expired("the runner disconnected before the grant was created")
        bearer = secrets.token_urlsafe(32)
        grant_ref: list[Grant] = []

        async def forward(real_id: str, call_id: str, arguments: dict[str, Any]) -> Any:
            return await self._forward(grant_ref[0], real_id, call_id, arguments)

        try:
            tools = ToolCalls(bearer, request.catalog, forward)
        except ValueError as exc:
            raise forbidden(str(exc)) from exc
        grant = Grant(
            id=grant_id,
            profile=profile,
            work_id=request.work_id,
            runtime_id=runtime_id,
            stored_id=request.stored_id,
            epoch=epoch,
            generation=f"{request.work_id}:{uuid.uuid4()}",
            bearer=bearer,
            tools=tools,
        )
        grant_ref.append(grant)
        self._grants[grant_id] = grant  # from here on a grant.close or a local disconnect can overtake us
        try:
            grant.listener = await self._start_listener(grant)
        except OSError as exc:
            self._dispose(grant)
            raise CommandError("team_tools_unavailable", "the loopback tool listener could not start") from exc
        except BaseException:  # cancelled (an immediate stop): leave no half-made grant behind
            self._dispose(grant)
            raise
        if grant.state == "closed":  # overtaken: disposal ran before the listener existed
            await grant.listener.wait_closed(CLOSE_GRACE_S)
            raise expired("the grant was closed while it was being created")
        grant.state = "open"
        self._extend(grant, self.clock.now_ms() + GRANT_LIFETIME_MS)
        return {"ok": True}

    async def _start_listener(self, grant: Grant) -> ToolListener:
        listener = ToolListener(grant.bearer, grant.tools.serve)
        await listener.start()
        return listener

    # --- grant.bind (7.6, 12.2, 12.4) -----------------------------------------------------------------------

    async def _bind(self, command: dict[str, Any]) -> dict[str, Any]:
        grant_id, runtime_id, stored_id = parse_bind(command)
        grant = self._live(grant_id)
        if runtime_id != grant.runtime_id or self.ownership.profile_of(runtime_id) != grant.profile:
            raise CommandError("runner_session_forbidden", "the session is not this grant's owned session")
        async with grant.bind_lock:
            grant = self._live(grant_id)
            grant.stored_id = stored_id
            await self._record(grant)
            rest = self.rest_factory()
            if not grant.bound:
                await plugin.check_capabilities(rest, grant.profile)
            expires_at = self.clock.now_ms() + GRANT_LIFETIME_MS
            try:
                refused = await self._bind_once(rest, grant, expires_at)
                latest = self.stored_of(grant.runtime_id) if self.stored_of is not None else None
                if latest is not None and latest != grant.stored_id:  # session.info changed it during the bind
                    grant.stored_id = latest
                    await self._record(grant)
                    refused = await self._bind_once(rest, grant, expires_at)
                if refused is not None:
                    raise refused
            except CommandError as exc:
                if exc.code == "team_tools_unavailable" and grant.bind_tried and not grant.bound:
                    await plugin.unbind(rest, grant.runtime_id, grant.generation)
                raise CommandError(exc.code, exc.message.replace(grant.bearer, "[grant bearer]")) from None
            if grant.state != "open":
                await plugin.unbind(rest, grant.runtime_id, grant.generation)  # disposal may have run before us
                raise expired("the grant closed during the bind")
            grant.bound = True
            self._extend(grant, expires_at)
            return {"ok": True, "expiresAt": grant.expires_at}

    async def _bind_once(self, rest: HermesRest, grant: Grant, expires_at: int) -> CommandError | None:
        """One ``/bind``: None when bound, the ``team_tools_bind_failed`` refusal; raises any other error."""
        body = {
            "native_tools": True,
            "session_id": grant.runtime_id,
            "stored_session_id": grant.stored_id,
            "profile": grant.profile,
            "generation": grant.generation,
            "bridge_url": grant.listener.url if grant.listener is not None else "",
            "token": grant.bearer,
            "expires_at": expires_at,
        }
        grant.bind_tried = True
        try:
            await plugin.bind(rest, body, first=not grant.bound)
        except CommandError as exc:
            if exc.code == "team_tools_bind_failed":
                return exc
            raise
        return None

    async def _record(self, grant: Grant) -> None:
        if self.record_session is None:
            return
        try:
            await asyncio.to_thread(self.record_session, grant.stored_id, grant.profile)
        except Exception as exc:  # best effort, as for the gateway's record: the bind itself is unaffected
            _log.warning("record_session_failed", extra={"error": type(exc).__name__})

    def _live(self, grant_id: str) -> Grant:
        """The open grant ``grant_id``; an expired one is disposed. Raises ``runner_grant_expired``."""
        grant = self._grants.get(grant_id)
        if grant is None or grant.state != "open":
            raise expired()
        if self.clock.now_ms() >= grant.expires_at:
            self._dispose(grant)
            raise expired("the grant expired")
        return grant

    # --- grant.close (7.7) and disposal (12.2) --------------------------------------------------------------

    async def _close(self, command: dict[str, Any]) -> dict[str, Any]:
        grant_id = parse_close(command)
        grant = self._grants.get(grant_id)
        if grant is None:
            self._tombstone(grant_id)
            return {"ok": True}
        await self._dispose(grant)
        return {"ok": True}

    def session_closed(self, runtime_id: str) -> None:
        """The owning connection of ``runtime_id`` closed: dispose that session's grants (in the background;
        they stop taking calls at once)."""
        for grant in [g for g in self._grants.values() if g.runtime_id == runtime_id]:
            self._dispose(grant)

    async def dispose_all(self) -> None:
        """Local disconnect (section 5.2): dispose every grant, opening ones included, and wait for every
        disposal to finish (those already under way too). Idempotent."""
        for grant in list(self._grants.values()):
            self._dispose(grant)
        if self._disposing:
            await asyncio.gather(*self._disposing, return_exceptions=True)

    def expire_due(self) -> int:
        """Dispose every grant whose expiry has passed by the clock; how many. Timers call this too."""
        now = self.clock.now_ms()
        due = [g for g in self._grants.values() if g.state == "open" and now >= g.expires_at]
        for grant in due:
            self._dispose(grant)
        return len(due)

    def _dispose(self, grant: Grant) -> asyncio.Task[None]:
        """Disposal's immediate part (no more calls, binds or connections); the rest runs in a task."""
        if grant.disposal is not None:
            return grant.disposal
        grant.state = "closed"
        self._grants.pop(grant.id, None)
        self._tombstone(grant.id)
        if grant.timer is not None:
            grant.timer.cancel()
        if grant.listener is not None:
            grant.listener.close()
        grant.tools.close()
        grant.disposal = asyncio.get_running_loop().create_task(self._finish_disposal(grant))
        self._disposing.add(grant.disposal)
        grant.disposal.add_done_callback(self._disposing.discard)
        return grant.disposal

    async def _finish_disposal(self, grant: Grant) -> None:
        if grant.listener is not None:
            await grant.listener.wait_closed(CLOSE_GRACE_S)
        if grant.bind_tried:
            with contextlib.suppress(Exception):  # best effort: the plugin also unbinds on expiry
                await plugin.unbind(self.rest_factory(), grant.runtime_id, grant.generation)

    def _tombstone(self, grant_id: str) -> None:
        self._prune_tombstones()
        self._tombstones[grant_id] = self.clock.now_ms() + TOMBSTONE_MS

    def _prune_tombstones(self) -> None:
        now = self.clock.now_ms()
        for grant_id in [g for g, until in self._tombstones.items() if until <= now]:
            del self._tombstones[grant_id]

    def _extend(self, grant: Grant, expires_at: int) -> None:
        grant.expires_at = max(grant.expires_at, expires_at)
        if grant.timer is not None:
            grant.timer.cancel()
        delay = max(0.0, (grant.expires_at - self.clock.now_ms()) / 1000)
        grant.timer = asyncio.get_running_loop().call_later(delay, self._timer_fired, grant)

    def _timer_fired(self, grant: Grant) -> None:
        if grant.state != "open":
            return
        if self.clock.now_ms() >= grant.expires_at:
            self._dispose(grant)
        else:  # the clock is behind the timer (an injected clock): look again later
            self._extend(grant, grant.expires_at)

    # --- tool calls (12.3, 12.5) ----------------------------------------------------------------------------

    async def _forward(self, grant: Grant, real_id: str, call_id: str, arguments: dict[str, Any]) -> Any:
        """Post one call to the hub's ``tool`` op with the real tool id; ToolError on failure."""
        if grant.state != "open" or self.clock.now_ms() >= grant.expires_at or self.epoch() != grant.epoch:
            if grant.state == "open":
                self._dispose(grant)
            raise ToolError("runner_grant_expired", "the grant is closed or expired")
        body = {"grantId": grant.id, "toolId": real_id, "callId": call_id, "arguments": arguments}
        try:
            answer = await self.hub.post("tool", grant.epoch, body)
        except HubError as exc:
            if exc.code in ("runner_epoch_changed", "runner_instance_changed") and self.on_hub_error is not None:
                # in its own task: the local disconnect it causes disposes this grant, which cancels this call
                task = asyncio.ensure_future(self.on_hub_error(exc))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            if exc.status == 0:
                raise ToolError(
                    "runner_command_uncertain", "the hub did not answer; the call may have run", final=False
                ) from exc
            raise ToolError(exc.code, exc.message, final=exc.status < 500) from exc
        if not isinstance(answer, dict) or set(answer) != {"result"}:
            raise ToolError("runner_internal_error", "the hub's tool answer is malformed", final=False)
        return answer["result"]
