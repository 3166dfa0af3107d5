"""Hub operations that send commands (gateway channels, tool grants, read-only http) and the machine
API's ``admit``, ``event`` and ``tool`` ops (runner-protocol.md 7, 8, 10, 12)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import structlog

from talaria.canonical import canonical_json, sha256_hex
from talaria.errors import TalariaError
from talaria.hub.runners import limits
from talaria.hub.runners.connection_state import AccountRef, ChannelRow, ConnState, Gateway, Grant, ToolExecutor
from talaria.hub.runners.transport import RunnerTransport, connection_gone, draining, gateway_closed

CREATES_SESSION = frozenset({"session.create", "session.resume"})
CLEANUP_METHODS = frozenset({"session.resume", "session.interrupt", "session.close", "session.active_list"})
log = structlog.get_logger("talaria.hub")
ToolKind = Callable[[str, dict[str, Any]], ToolExecutor]  # (grant id, the grant's tools) -> its executor


class Channels:
    def __init__(self, runners: RunnerTransport, tool_kinds: dict[str, ToolKind] | None = None) -> None:
        self.runners = runners
        # executors by a grant's ``tools["kind"]``, for calls of grants another replica owns (scale.md 4.3)
        self.tool_kinds: dict[str, ToolKind] = dict(tool_kinds or {})
        self._closing: set[asyncio.Task[None]] = set()  # grant closes after a refusal, kept until done

    def _state(self, runner_id: str) -> ConnState:
        state = self.runners.state_of(runner_id)
        if state is None:
            raise TalariaError("runner_offline", "the execution node is not connected")
        return state

    def _taking_work(self, runner_id: str) -> ConnState:
        """The state, for new work: refused while it drains (operations.md 3.2)."""
        state = self._state(runner_id)
        if state.draining_since is not None:
            raise draining()
        return state

    # --- read-only http (7.1, 11) ---------------------------------------------------------------------------

    async def http(
        self, runner_id: str, account: AccountRef, path: str, *, search: str = "", profile: str | None = None
    ) -> dict[str, Any]:
        if path == "/api/files/download" and "export-v1" not in self._state(runner_id).features:
            raise TalariaError("runner_feature_required", "this execution node does not offer export-v1")
        payload: dict[str, Any] = {"path": path, "method": "GET", "search": search}
        reply: dict[str, Any] = await self.runners.send(runner_id, "http", payload, account=account, profile=profile)
        return reply

    # --- gateway channels (7.2-7.4, 10) ---------------------------------------------------------------------

    async def open_gateway(
        self, runner_id: str, account: AccountRef, *, cleanup_only: bool = False, bound_stored_id: str | None = None,
        recovery: bool = False,
    ) -> Gateway:  # fmt: skip
        """``recovery``: the channel re-attaches to or resumes a turn already submitted (operations.md 3.2), so a
        draining node takes it; it is said to the runner only when the runner offers ``drain-v1``."""
        state = self._state(runner_id) if cleanup_only or recovery else self._taking_work(runner_id)
        gateway = Gateway(str(uuid.uuid4()), runner_id, account, cleanup_only, bound_stored_id)
        await self.runners.add_channel(state, gateway)
        valid = self.runners.validity.runner_enabled(runner_id) if cleanup_only else None
        payload: dict[str, Any] = {"connectionId": gateway.id, "cleanupOnly": cleanup_only}
        if recovery and "drain-v1" in state.features:
            payload["recovery"] = True
        try:
            await self.runners.send(
                runner_id,
                "gateway.open",
                payload,
                account=account,
                profile=None,
                connection_id=gateway.id,
                valid=valid,
            )
        except TalariaError:
            gateway.open = False
            await self.runners.end_channel(state, "gateway", gateway.id)
            raise
        return gateway

    async def rpc(self, gateway: Gateway, method: str, params: dict[str, Any]) -> Any:
        if not gateway.open:
            raise gateway_closed()
        if gateway.cleanup_only and method == "session.resume" and params.get("session_id") != gateway.bound_stored_id:
            raise TalariaError("runner_cleanup_forbidden", "a cleanup channel resumes only its own stored session")
        if len(canonical_json(params)) > limits.MAX_RPC_PARAMS_BYTES:
            raise TalariaError("runner_payload_limit", "the parameters are larger than 15 MiB")
        if method == "prompt.submit":
            self._taking_work(gateway.runner_id)
        if method in CREATES_SESSION:
            profile: str | None = params.get("profile") or "default"
        else:
            profile = gateway.profiles.get(str(params.get("session_id")))
        stop = method in limits.STOP_CLASS_RPCS or (gateway.cleanup_only and method in CLEANUP_METHODS)
        valid = self.runners.validity.runner_enabled(gateway.runner_id) if stop else None
        result = await self.runners.send(
            gateway.runner_id,
            "gateway.rpc",
            {"connectionId": gateway.id, "method": method, "params": params},
            account=gateway.account,
            profile=profile,
            connection_id=gateway.id,
            valid=valid,
            owner_counter=gateway.owner_counter,
        )
        if method in CREATES_SESSION and isinstance(result, dict) and isinstance(result.get("session_id"), str):
            gateway.profiles[result["session_id"]] = profile or "default"
        return result

    async def close_gateway(self, gateway: Gateway) -> None:
        """Close on the hub side (queued commands fail 409), then tell the runner (admitted whenever pending)."""
        was_open = gateway.open
        if was_open:  # closed here whatever state holds it now (a replaced state no longer lists it)
            gateway.open = False
            gateway.events.put_nowait(None)
        state = self.runners.state_of(gateway.runner_id)
        if state is None:
            return
        await self.runners.end_channel(state, "gateway", gateway.id, owner_counter=gateway.owner_counter)
        if was_open:
            await self.runners.send(
                gateway.runner_id, "gateway.close", {"connectionId": gateway.id}, account=gateway.account,
                profile=None, valid=True, connection_id=gateway.id, owner_counter=gateway.owner_counter,
            )  # fmt: skip

    # --- tool grants (7.5-7.7, 12) --------------------------------------------------------------------------

    async def create_grant(
        self,
        runner_id: str,
        account: AccountRef,
        *,
        profile: str,
        work_id: str,
        session: dict[str, str],
        catalog: list[dict[str, Any]],
        executor: ToolExecutor,
        turn_active: Any,
        tools: dict[str, Any] | None = None,
    ) -> Grant:
        state = self._taking_work(runner_id)
        if "team-tools-v1" not in state.features:
            raise TalariaError("runner_feature_required", "this execution node does not offer team-tools-v1")
        grant = Grant(str(uuid.uuid4()), runner_id, account, profile, work_id, executor, turn_active)
        await self.runners.add_channel(state, grant)
        if tools is not None:
            await self.runners.describe_grant(state, grant.id, tools)
        payload = {"grantId": grant.id, "profile": profile, "workId": work_id, "session": session, "catalog": catalog}
        try:
            await self.runners.send(
                runner_id, "grant.create", payload, account=account, profile=profile, grant_id=grant.id
            )
        except TalariaError:
            grant.open = False
            await self.runners.end_channel(state, "grant", grant.id)
            raise
        return grant

    async def describe_grant(self, grant: Grant, tools: dict[str, Any]) -> None:
        """What runs the grant's calls on another replica (``tool_kinds``), once known after its creation."""
        state = self.runners.state_of(grant.runner_id)
        if state is not None:
            await self.runners.describe_grant(state, grant.id, tools)

    async def bind_grant(self, grant: Grant, session: dict[str, str]) -> int:
        if not grant.open:
            raise TalariaError("runner_grant_expired", "the grant is closed")
        reply = await self.runners.send(
            grant.runner_id, "grant.bind", {"grantId": grant.id, "session": session}, account=grant.account,
            profile=grant.profile, grant_id=grant.id,
        )  # fmt: skip
        return int(reply["expiresAt"])

    async def close_grant(self, grant: Grant) -> None:
        was_open, grant.open = grant.open, False
        state = self.runners.state_of(grant.runner_id)
        if state is None:
            return
        await self.runners.end_channel(state, "grant", grant.id)
        if was_open:
            await self.runners.send(
                grant.runner_id, "grant.close", {"grantId": grant.id}, account=grant.account, profile=None, valid=True
            )

    # --- machine API ops (6.3, 10.4, 12.5) ------------------------------------------------------------------

    async def admit(self, state: ConnState, command_id: str) -> bool:
        command = await self.runners.pending_command(state, command_id)
        if command is None or command.expires_at <= self.runners.clock.now_ms():
            return False
        if command.stale_owner:  # its sender no longer owns the gateway: another adopted it (scale.md 4.3)
            return False
        if command.kind in ("gateway.close", "grant.close"):
            return True
        validity = self.runners.validity
        if command.kind in ("gateway.open", "gateway.rpc"):
            gateway = await self.runners.channel(state, "gateway", command.connection_id or "")
            if gateway is None:
                return False
            method = command.payload.get("method")
            if gateway.cleanup_only and (command.kind == "gateway.open" or method in CLEANUP_METHODS):
                return validity.runner_enabled(state.runner_id)
            if method in limits.STOP_CLASS_RPCS:
                return True
            ok = validity.check(command.account, state.runner_id, command.profile)
            if not ok:
                await self.runners.revoke_gateway(state, gateway.id)
            return ok
        if command.kind in ("grant.create", "grant.bind"):
            grant = await self.runners.channel(state, "grant", command.grant_id or "")
            if grant is None or (isinstance(grant.here, Grant) and not grant.here.turn_active()):
                return False
        return validity.check(command.account, state.runner_id, command.profile)

    async def event(self, state: ConnState, body: dict[str, Any]) -> None:
        connection_id = body["connectionId"]
        gateway = await self.runners.channel(state, "gateway", connection_id)
        if gateway is None:
            raise connection_gone()
        closing = body.get("closed") is True
        if (
            not closing
            and not gateway.cleanup_only
            and not self.runners.validity.check(gateway.account, state.runner_id, None)
        ):
            await self.runners.end_channel(state, "gateway", connection_id, revoked=True)
            raise TalariaError("runner_connection_closed", "the connection's account lost its access", status=410)
        await self.runners.record_event(state, connection_id, body.get("seq"), None if closing else body["frame"])

    async def tool(self, state: ConnState, body: dict[str, Any]) -> Any:
        """Run one tool call of a grant (runner-protocol.md 12.5) on this hub process, whichever owns the grant
        (scale.md 4.3): the owner with the grant's executor, another with one made from the grant's ``tools``.
        Every call re-checks the grant's account (enabled, ``auth_version`` unchanged, the profile still allowed):
        a failed check answers 403 ``team_tools_forbidden``, runs nothing and marks the grant revoked, which stops
        its turn. A tool that answers ``team_tools_forbidden`` itself (the round lost its team permission) closes
        the grant once the answer is on its way; the turn goes on without tools (team-tools.md 5)."""
        row = await self.runners.channel(state, "grant", body["grantId"])
        grant = row.here if row is not None and isinstance(row.here, Grant) else None
        if row is None or (grant is not None and (grant.closing or not grant.turn_active())):
            raise TalariaError("runner_grant_expired", "the grant is closed or its turn ended")
        revoked = row.revoked or (grant is not None and grant.revoked.is_set())
        if revoked or not self.runners.validity.check(row.account, state.runner_id, row.profile):
            await self.runners.revoke_grant(state, row.id)
            raise TalariaError("team_tools_forbidden", "the account behind this turn lost its access")
        executor = grant.executor if grant is not None else self._executor_of(row)
        tool_id, given = body["toolId"], body["arguments"]

        async def run() -> Any:
            try:
                return await executor(tool_id, given)
            except TalariaError as exc:
                if exc.code == "team_tools_forbidden":
                    self._close_soon(state.runner_id, row, grant)
                raise
            except Exception as exc:  # a tool bug must not leave duplicates waiting forever
                raise TalariaError("internal_error", f"the tool failed: {type(exc).__name__}") from exc

        fingerprint = sha256_hex(canonical_json([tool_id, given]))
        ended = TalariaError("runner_grant_expired", "the turn ended during the call")
        try:
            result = await self.runners.call_once(state, row.id, body["callId"], fingerprint, run)
        except TalariaError:
            if grant is not None and (not grant.open or not grant.turn_active()):
                raise ended from None
            raise
        if grant is not None and (not grant.open or not grant.turn_active()):
            raise ended
        return result

    def _executor_of(self, row: ChannelRow) -> ToolExecutor:
        """The executor of a grant owned elsewhere, made from its ``tools`` (set once its round was captured)."""
        make = self.tool_kinds.get(str((row.tools or {}).get("kind")))
        if make is None or row.tools is None:
            raise TalariaError("runner_grant_expired", "the grant is not ready for tool calls")
        return make(row.id, row.tools)

    def _close_soon(self, runner_id: str, row: ChannelRow, grant: Grant | None) -> None:
        if grant is not None:
            if grant.closing:
                return
            grant.closing = True
        task = asyncio.get_running_loop().create_task(self._close_refused(runner_id, row, grant))
        self._closing.add(task)  # a reference until it is done
        task.add_done_callback(self._closing.discard)

    async def _close_refused(self, runner_id: str, row: ChannelRow, grant: Grant | None) -> None:
        await asyncio.sleep(0)  # the refusal's answer first
        try:
            if grant is not None:
                await self.close_grant(grant)
                return
            state = self.runners.state_of(runner_id)
            if state is None:
                return
            await self.runners.end_channel(state, "grant", row.id)
            await self.runners.send(
                runner_id, "grant.close", {"grantId": row.id}, account=row.account, profile=None, valid=True
            )
        except TalariaError as exc:  # the runner went away: its grants died with its connection
            log.info("grant_close_failed", grant=row.id, code=exc.code)
