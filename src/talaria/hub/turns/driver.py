"""The minimal turn driver: one Hermes turn through a runner (the dispatcher issue grows it into the
turn engine).

Steps: open a gateway channel for the account; ``session.create`` for the profile (omitted for
``default``, ``close_on_disconnect: false``); optionally probe the plugin's capabilities, create a tool
grant carrying the team tools and bind it while the session is idle (runner-protocol.md 12.1); submit
the prompt prefixed with its run marker; collect the session's streamed events up to
``message.complete``; then close the grant and the channel. ``work_id`` names the work the turn
serves (a job id, a conversation id) and is what ``talaria_whoami`` reports.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import structlog

from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.runners import hermes_probe
from talaria.hub.runners.channels import Channels
from talaria.hub.runners.connection_state import AccountRef, Gateway, Grant
from talaria.hub.runners.registry import RunnerRegistry
from talaria.hub.turns import team_tools
from talaria.timeouts import within

log = structlog.get_logger("talaria.turns")

TURN_TIMEOUT = "turn_timeout"  # the turn reached its deadline; it was interrupted (retryable false)
ACCESS_REVOKED = "access_revoked"  # the turn's account lost its access; it was interrupted
STOPPED = "stopped"  # a stopped turn whose interrupt Hermes did not confirm within STOP_GRACE_S
SESSION_INFO_WAIT_S = 1.0  # chat.md 5.3 step 10: the end-of-turn session.info comes about 20 ms after the reply
STOP_GRACE_S = 4.0  # chat.md 5.6: without Hermes' message.complete 4 s after the interrupt, the hub ends the turn
RESUME_REFUSALS = frozenset({"gateway_rejected", "runner_payload_limit"})  # chat.md 5.3 step 5
GRANT_RENEW_S = 300.0  # runner-protocol.md 12.1: re-check the turn and the account, renew with grant.bind
# How often a waiting turn re-reads the clock (an injected clock may move without an event arriving).
DEADLINE_CHECK_S = 0.5


@dataclass
class TurnResult:
    status: str  # message.complete status: complete | interrupted | error
    text: str
    runtime_id: str
    stored_id: str | None
    marker: str
    events: list[dict[str, Any]] = field(default_factory=list)
    resumed: bool = False  # the turn ran in a resumed stored session
    resume_refused: str | None = None  # the code refusing the asked resume (a new session was created instead)
    gateway: Gateway | None = None  # the turn's channel while it runs (chat answers approvals through it)
    error: str | None = None  # Hermes' error event that ended the turn without a message.complete

    def deltas(self) -> list[str]:
        return [str(e.get("payload", {}).get("text", "")) for e in self.events if e.get("type") == "message.delta"]


@dataclass(frozen=True)
class LiveChannel:
    """A gateway channel kept open with a live, idle Hermes session in it (chat keeps one per conversation between
    its turns, chat.md 5.3 step 4): a turn run in it skips ``gateway.open`` and ``session.resume``."""

    gateway: Gateway
    runtime_id: str
    stored_id: str | None


@dataclass
class TurnHooks:
    """Calls around ``prompt.submit``: ``before_submit(result)`` must have durably recorded where the turn
    goes before it returns (an exception stops the turn, nothing submitted); ``after_submit(result)``
    runs once Hermes accepted the prompt."""

    before_submit: Callable[[TurnResult], Awaitable[None]] | None = None
    after_submit: Callable[[TurnResult], Awaitable[None]] | None = None
    # whether a submitted turn the driver abandons (cancelled, timed out) is interrupted; a hub shutting
    # down leaves it running so that the next attempt can take its reply from Hermes' history
    interrupt_abandoned: Callable[[], bool] | None = None
    # awaited before the turn's grant and channel close (chat: answers to approvals still in flight)
    before_close: Callable[[], Awaitable[None]] | None = None
    # chat.md 5.3 step 10: awaited once the reply is in (Hermes' message.complete, or its error) and the answers
    # in flight settled, before the grant closes: chat stores the turn's end here, before the channel's cleanup
    on_result: Callable[[TurnResult], Awaitable[None]] | None = None
    # chat.md 5.3 step 10: then read on until the end-of-turn session.info (at most SESSION_INFO_WAIT_S) before
    # the channel closes
    read_session_info: bool = False


async def frame_within(gateway: Gateway, clock: Clock, deadline_ms: int) -> dict[str, Any] | None:
    """The channel's next frame (None: the channel closed), waited for at most ``DEADLINE_CHECK_S``, since an
    injected clock may move without a frame arriving: ``TimeoutError`` when that slice passed without one, and
    ``turn_timeout`` once ``deadline_ms`` has passed."""
    left = (deadline_ms - clock.now_ms()) / 1000
    if left <= 0:
        raise TalariaError(TURN_TIMEOUT, "the turn reached its time limit (turns.max_turn_s) and was stopped")
    return await next_frame(gateway, min(left, DEADLINE_CHECK_S))


async def next_frame(gateway: Gateway, seconds: float) -> dict[str, Any] | None:
    """The channel's next frame within ``seconds`` (``TimeoutError`` after); a cancel arriving as the frame does
    cancels the wait and leaves the frame queued (``timeouts.within``). The queue holds the channel's frames in
    event-number order, one per number, so counting them keeps ``gateway.read_seq`` the number of the frame
    returned (what a chat turn's frame cursor records, scale.md 4.1)."""
    frame = await within(gateway.events.get(), seconds)
    if frame is not None:
        gateway.read_seq += 1
    return frame


def run_marker(run_id: str, work_id: str) -> str:
    return f"[talaria-run:{run_id}:{work_id}]"


class ToolSet(Protocol):
    """A turn's own tools for its grant (chat's team catalog): ``opened(grant_id)`` once the grant exists, before
    any call can arrive; ``call`` for each call the grant forwards."""

    @property
    def catalog(self) -> list[dict[str, Any]]: ...

    async def opened(self, grant_id: str) -> None: ...

    async def call(self, tool_id: str, arguments: dict[str, Any]) -> Any: ...

    def descriptor(self) -> dict[str, Any]:
        """The grant's ``tools`` once opened: what runs its calls on another replica (``Channels.tool_kinds``)."""
        ...

    async def valid(self) -> bool:
        """Whether the round still holds (team-tools.md 5: the renewal's checks 4-6)."""
        ...


class TurnDriver:
    def __init__(
        self, channels: Channels, registry: RunnerRegistry, clock: Clock, *, grant_renew_s: float = GRANT_RENEW_S
    ) -> None:
        self.channels = channels
        self.registry = registry
        self.clock = clock
        self.grant_renew_s = grant_renew_s

    async def capabilities(self, runner_id: str, account: AccountRef, profile: str) -> dict[str, Any]:
        """The plugin's capabilities for ``profile``; ``team_tools_unavailable`` unless it is ready."""
        status, body = await hermes_probe.plugin_capabilities(self.channels, runner_id, account, profile)
        if not hermes_probe.plugin_ready(status, body):
            missing = body.get("missing") if body is not None else None
            raise TalariaError(
                "team_tools_unavailable",
                f"the Talaria plugin on this node is not ready (status {status}, missing {missing})",
            )
        assert body is not None
        return body

    async def run(
        self,
        *,
        runner_id: str,
        account: AccountRef,
        profile: str,
        work_id: str,
        prompt: str,
        run_id: str | None = None,
        tools: bool = True,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        deadline_ms: int,
        hooks: TurnHooks | None = None,
        resume_id: str | None = None,
        marker: str | None = None,
        on_frame: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
        stop: asyncio.Event | None = None,
        prompt_for: Callable[[TurnResult], Awaitable[str]] | None = None,
        channel: LiveChannel | None = None,
        keep: Callable[[TurnResult], bool] | None = None,
        probed: bool = False,
        toolset: ToolSet | None = None,
    ) -> TurnResult:
        """Run one turn; ``deadline_ms`` (on the injected clock) bounds the submitted turn: reaching it
        interrupts the turn and raises ``turn_timeout``. Raises ``runner_command_uncertain`` when the channel is
        lost after the prompt was submitted, and ``access_revoked`` (the turn interrupted, its grant closed) when
        a tool call or the grant's renewal finds the account without access.

        Chat's turns also give ``resume_id`` (``session.resume`` of that stored session first; refused with
        ``gateway_rejected`` or ``runner_payload_limit``, a new session is created and ``resume_refused`` says
        why), their own ``marker``, ``on_frame`` (awaited for each of the session's frames, in order),
        ``stop`` (once set: ``session.interrupt``, then Hermes' ``message.complete`` is awaited for
        ``STOP_GRACE_S`` before ``stopped`` is raised) and ``prompt_for`` (the prompt, made once the session is
        known: whether it was resumed decides what it holds). ``channel``: run in that kept channel's live session
        (resumed, no ``gateway.open`` or ``session.resume``); ``keep(result)``, asked once the turn finished, leaves
        the channel open (the caller then owns it) instead of closing it; ``probed``: the caller has found the
        plugin ready (``capabilities``) for this turn's tools; ``toolset``: the grant offers these tools instead of the
        diagnostic ``talaria_whoami``."""
        record = self.registry.get(runner_id)
        if record is None:
            raise TalariaError("not_found", "no such execution node")
        marker = marker or run_marker(run_id or str(uuid.uuid4()), work_id)
        gateway = channel.gateway if channel is not None else await self.channels.open_gateway(runner_id, account)
        grant: Grant | None = None
        renewal: asyncio.Task[None] | None = None
        active = True
        submitted = finished = settled = False
        runtime_id = channel.runtime_id if channel is not None else ""
        try:
            if channel is not None:
                stored = channel.stored_id
                result = TurnResult("", "", channel.runtime_id, stored, marker, resumed=True, gateway=gateway)
            else:
                result = await self._open_session(gateway, profile, marker, resume_id)
            runtime_id = result.runtime_id
            if tools:
                if not probed:  # the caller found the plugin ready for this turn already
                    await self.capabilities(runner_id, account, profile)
                identity = team_tools.GrantIdentity(account.username, account.tenant, record.source, profile, work_id)

                async def execute(tool_id: str, arguments: dict[str, Any]) -> Any:
                    assert grant is not None
                    if toolset is not None:
                        return await toolset.call(tool_id, arguments)
                    return await team_tools.call(replace(identity, grant_id=grant.id), tool_id, arguments)

                session = {"runtimeId": runtime_id, "storedId": str(result.stored_id or "")}
                catalog = toolset.catalog if toolset is not None else team_tools.catalog()
                described = team_tools.descriptor(identity) if toolset is None else None
                grant = await self.channels.create_grant(
                    runner_id, account, profile=profile, work_id=work_id, session=session,
                    catalog=catalog, executor=execute, turn_active=lambda: active, tools=described,
                )  # fmt: skip
                if toolset is not None:
                    await toolset.opened(grant.id)
                    await self.channels.describe_grant(grant, toolset.descriptor())
                await self.channels.bind_grant(grant, session)
                renewal = asyncio.get_running_loop().create_task(self._renew(grant, result, profile, toolset))
            if prompt_for is not None:  # before the submit record: it may send attachments (chat.md 5.3 step 7)
                prompt = await prompt_for(result)
            if hooks is not None and hooks.before_submit is not None:
                await hooks.before_submit(result)
            text = f"{prompt}\n{marker}"  # the run marker on its own line at the end (runner-protocol.md 13)
            await self.channels.rpc(gateway, "prompt.submit", {"session_id": runtime_id, "text": text})
            submitted = True
            if hooks is not None and hooks.after_submit is not None:
                await hooks.after_submit(result)
            await self.collect(
                gateway, result, on_event, deadline_ms=deadline_ms, grant=grant, on_frame=on_frame, stop=stop
            )
            finished = True
            if hooks is not None:
                settled = True
                if hooks.before_close is not None:
                    await hooks.before_close()
                if hooks.on_result is not None:
                    await hooks.on_result(result)
                if hooks.read_session_info:
                    active = False
                    if grant is not None:
                        await self._quietly(self.channels.close_grant(grant))
                    await self._session_info(gateway, result, on_frame)
            return result
        finally:
            active = False
            if renewal is not None:
                renewal.cancel()
            interrupt = hooks is None or hooks.interrupt_abandoned is None or hooks.interrupt_abandoned()
            if submitted and not finished and gateway.open and interrupt:  # cancelled or timed out: stop it
                await self._quietly(self.channels.rpc(gateway, "session.interrupt", {"session_id": runtime_id}))
            if hooks is not None and hooks.before_close is not None and not settled:
                await hooks.before_close()
            if grant is not None and grant.open:
                await self._quietly(self.channels.close_grant(grant))
            # a submitted turn left running (the hub stops, or another replica drives it now) keeps its channel:
            # closing it would interrupt the session that recovery re-attaches to (runner-protocol.md 10.5)
            left_running = submitted and not finished and not interrupt
            if not left_running and not (finished and keep is not None and gateway.open and keep(result)):
                await self._quietly(self.channels.close_gateway(gateway))

    async def _open_session(self, gateway: Gateway, profile: str, marker: str, resume_id: str | None) -> TurnResult:
        refused: str | None = None
        if resume_id is not None:
            params: dict[str, Any] = {"session_id": resume_id}
            if profile != "default":
                params["profile"] = profile
            try:
                resumed = await self.channels.rpc(gateway, "session.resume", params)
            except TalariaError as exc:
                if exc.code not in RESUME_REFUSALS:
                    raise
                refused = exc.code
            else:
                stored = resumed.get("resumed") or resume_id
                runtime = str(resumed["session_id"])
                return TurnResult("", "", runtime, str(stored), marker, resumed=True, gateway=gateway)
        params = {"close_on_disconnect": False}
        if profile != "default":
            params["profile"] = profile
        created = await self.channels.rpc(gateway, "session.create", params)
        stored_id = created.get("stored_session_id")
        runtime = str(created["session_id"])
        return TurnResult("", "", runtime, stored_id, marker, resume_refused=refused, gateway=gateway)

    async def collect(
        self,
        gateway: Gateway,
        result: TurnResult,
        on_event: Callable[[dict[str, Any]], None] | None,
        *,
        deadline_ms: int,
        grant: Grant | None = None,
        on_frame: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
        stop: asyncio.Event | None = None,
        through: int | None = None,
    ) -> None:
        """The submitted turn's frames on ``gateway`` until Hermes' ``message.complete`` or ``error`` (kept in
        ``result``); ``stop`` (``session.interrupt``, then ``stopped`` after ``STOP_GRACE_S``), ``deadline_ms``
        (``turn_timeout``), a revoked grant or channel (``access_revoked``) and a channel ending without a reply
        (``runner_command_uncertain``) as ``run`` says. A chat turn's new owner also collects an adopted channel:
        ``through`` returns without Hermes' end once the frame of that event number was handled."""
        stop_by: int | None = None
        while through is None or gateway.read_seq < through:
            if stop is not None and stop.is_set():
                if stop_by is None:
                    stop_by = self.clock.now_ms() + int(STOP_GRACE_S * 1000)
                    await self._quietly(
                        self.channels.rpc(gateway, "session.interrupt", {"session_id": result.runtime_id})
                    )
                elif self.clock.now_ms() >= stop_by:
                    raise TalariaError(STOPPED, "the turn was stopped; Hermes did not confirm in time")
            if grant is not None and grant.revoked.is_set():
                raise TalariaError(ACCESS_REVOKED, "the account behind this turn lost its access; the turn was stopped")
            try:
                frame = await frame_within(gateway, self.clock, deadline_ms)
            except TimeoutError:
                continue
            if frame is None and (gateway.revoked or (grant is not None and grant.revoked.is_set())):
                raise TalariaError(ACCESS_REVOKED, "the account behind this turn lost its access; the turn was stopped")
            if frame is None:  # the prompt was submitted: the turn may have run, and no reply arrived
                raise TalariaError(
                    "runner_command_uncertain", "the connection to Hermes was lost during the turn; it may have run"
                )
            if frame.get("session_id") not in (None, result.runtime_id):
                continue
            result.events.append(frame)
            if on_event is not None:
                on_event(frame)
            if on_frame is not None:
                await on_frame(frame)
            raw = frame.get("payload")
            payload: dict[str, Any] = raw if isinstance(raw, dict) else {}
            kind = frame.get("type")
            if kind == "session.info" and isinstance(payload.get("stored_session_id"), str):
                result.stored_id = payload["stored_session_id"]
            if kind == "message.complete":
                result.status = str(payload.get("status", "complete"))
                result.text = str(payload.get("text", ""))
                return
            if kind == "error":  # hermes.md: Hermes' error ends the prompt's run; no message.complete follows
                result.status = "error"
                result.error = str(payload.get("message", "")) or "Hermes reported an error"
                return

    async def _session_info(
        self, gateway: Gateway, result: TurnResult, on_frame: Callable[[dict[str, Any]], Awaitable[None]] | None
    ) -> None:
        """The end-of-turn ``session.info`` (its stored id, usage), waited for at most ``SESSION_INFO_WAIT_S``."""
        loop = asyncio.get_running_loop()
        until = loop.time() + SESSION_INFO_WAIT_S
        while (left := until - loop.time()) > 0:
            try:
                frame = await next_frame(gateway, left)
            except TimeoutError:
                return
            if frame is None:
                return
            if frame.get("session_id") not in (None, result.runtime_id):
                continue
            if on_frame is not None:
                await on_frame(frame)
            raw = frame.get("payload")
            if frame.get("type") == "session.info":
                if isinstance(raw, dict) and isinstance(raw.get("stored_session_id"), str):
                    result.stored_id = raw["stored_session_id"]
                return

    async def _renew(self, grant: Grant, result: TurnResult, profile: str, toolset: ToolSet | None) -> None:
        """Every ``grant_renew_s`` while the turn runs: re-check the account and renew the grant with
        ``grant.bind`` for the session's current stored id; a failed check or renewal marks the grant revoked
        (the turn then stops). A ``toolset`` whose round no longer holds closes the grant; the turn goes on."""
        validity = self.channels.runners.validity
        while grant.open and grant.turn_active():
            await asyncio.sleep(self.grant_renew_s)
            if not grant.open or not grant.turn_active():
                return
            try:
                allowed = await asyncio.to_thread(validity.check, grant.account, grant.runner_id, profile)
                if allowed and toolset is not None and not await toolset.valid():
                    await self.channels.close_grant(grant)
                    return
                if allowed:
                    session = {"runtimeId": result.runtime_id, "storedId": str(result.stored_id or "")}
                    await self.channels.bind_grant(grant, session)
            except TalariaError as exc:
                log.info("grant_renewal_failed", grant=grant.id, code=exc.code)
                allowed = False
            if not allowed:
                grant.revoked.set()
                return

    @staticmethod
    async def _quietly(closing: Any) -> None:
        try:
            await closing
        except TalariaError as exc:
            log.info("turn_cleanup_failed", code=exc.code)
