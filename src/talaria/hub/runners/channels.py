"""Hub operations that send commands (gateway channels, tool grants, read-only http) and the machine
API's ``admit``, ``event`` and ``tool`` ops (runner-protocol.md 7, 8, 10, 12)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import structlog

from talaria.canonical import canonical_json, sha256_hex
from talaria.errors import TalariaError
from talaria.hub.runners import limits
from talaria.hub.runners.connection_state import AccountRef, ConnState, Gateway, Grant, ToolExecutor
from talaria.hub.runners.connections import gateway_closed
from talaria.hub.runners.transport import RunnerTransport

CREATES_SESSION = frozenset({"session.create", "session.resume"})
CLEANUP_METHODS = frozenset({"session.resume", "session.interrupt", "session.close", "session.active_list"})
log = structlog.get_logger("talaria.hub")


class Channels:
    def __init__(self, runners: RunnerTransport) -> None:
        self.runners = runners
        self._closing: set[asyncio.Task[None]] = set()  # grant closes after a refusal, kept until done

    def _state(self, runner_id: str) -> ConnState:
        state = self.runners.state_of(runner_id)
        if state is None:
            raise TalariaError("runner_offline", "the execution node is not connected")
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
        self, runner_id: str, account: AccountRef, *, cleanup_only: bool = False, bound_stored_id: str | None = None
    ) -> Gateway:
        state = self._state(runner_id)
        gateway = Gateway(str(uuid.uuid4()), runner_id, account, cleanup_only, bound_stored_id)
        state.gateways[gateway.id] = gateway
        valid = self.runners.validity.runner_enabled(runner_id) if cleanup_only else None
        try:
            await self.runners.send(
                runner_id,
                "gateway.open",
                {"connectionId": gateway.id, "cleanupOnly": cleanup_only},
                account=account,
                profile=None,
                connection_id=gateway.id,
                valid=valid,
            )
        except TalariaError:
            gateway.open = False
            state.gateways.pop(gateway.id, None)
            raise
        return gateway

    async def rpc(self, gateway: Gateway, method: str, params: dict[str, Any]) -> Any:
        if not gateway.open:
            raise gateway_closed()
        if gateway.cleanup_only and method == "session.resume" and params.get("session_id") != gateway.bound_stored_id:
            raise TalariaError("runner_cleanup_forbidden", "a cleanup channel resumes only its own stored session")
        if len(canonical_json(params)) > limits.MAX_RPC_PARAMS_BYTES:
            raise TalariaError("runner_payload_limit", "the parameters are larger than 15 MiB")
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
        )
        if method in CREATES_SESSION and isinstance(result, dict) and isinstance(result.get("session_id"), str):
            gateway.profiles[result["session_id"]] = profile or "default"
        return result

    async def close_gateway(self, gateway: Gateway) -> None:
        """Close on the hub side (queued commands fail 409), then tell the runner (admitted whenever pending)."""
        state = self.runners.state_of(gateway.runner_id)
        was_open, gateway.open = gateway.open, False
        if state is None:
            return
        state.gateways.pop(gateway.id, None)
        gateway.events.put_nowait(None)
        await self.runners.fail_gateway(state, gateway.id)
        if was_open:
            await self.runners.send(
                gateway.runner_id, "gateway.close", {"connectionId": gateway.id}, account=gateway.account,
                profile=None, valid=True,
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
    ) -> Grant:
        state = self._state(runner_id)
        if "team-tools-v1" not in state.features:
            raise TalariaError("runner_feature_required", "this execution node does not offer team-tools-v1")
        grant = Grant(str(uuid.uuid4()), runner_id, account, profile, work_id, executor, turn_active)
        state.grants[grant.id] = grant
        payload = {"grantId": grant.id, "profile": profile, "workId": work_id, "session": session, "catalog": catalog}
        try:
            await self.runners.send(
                runner_id, "grant.create", payload, account=account, profile=profile, grant_id=grant.id
            )
        except TalariaError:
            grant.open = False
            state.grants.pop(grant.id, None)
            raise
        return grant

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
        state.grants.pop(grant.id, None)
        if was_open:
            await self.runners.send(
                grant.runner_id, "grant.close", {"grantId": grant.id}, account=grant.account, profile=None, valid=True
            )

    # --- machine API ops (6.3, 10.4, 12.5) ------------------------------------------------------------------

    async def admit(self, state: ConnState, command_id: str) -> bool:
        command = await self.runners.pending_command(state, command_id)
        if command is None or command.expires_at <= self.runners.clock.now_ms():
            return False
        if command.kind in ("gateway.close", "grant.close"):
            return True
        validity = self.runners.validity
        if command.kind in ("gateway.open", "gateway.rpc"):
            gateway = state.gateways.get(command.connection_id or "")
            if gateway is None or not gateway.open:
                return False
            method = command.payload.get("method")
            if gateway.cleanup_only and (command.kind == "gateway.open" or method in CLEANUP_METHODS):
                return validity.runner_enabled(state.runner_id)
            if method in limits.STOP_CLASS_RPCS:
                return True
            ok = validity.check(command.account, state.runner_id, command.profile)
            gateway.revoked = gateway.revoked or not ok
            return ok
        if command.kind in ("grant.create", "grant.bind"):
            grant = state.grants.get(command.grant_id or "")
            if grant is None or not grant.open or not grant.turn_active():
                return False
        return validity.check(command.account, state.runner_id, command.profile)

    async def event(self, state: ConnState, body: dict[str, Any]) -> None:
        gateway = state.gateways.get(body["connectionId"])
        if gateway is None or not gateway.open:
            raise TalariaError("runner_connection_closed", "no such open connection", status=410)
        seq = body.get("seq")
        if seq is not None and seq <= gateway.last_seq:
            return  # a retried post (failover-v1): stored already
        if seq is not None and seq != gateway.last_seq + 1:
            raise TalariaError("runner_event_gap", f"event {gateway.last_seq + 1} of this connection is missing")
        if body.get("closed") is True:
            await self._close_local(state, gateway)
            return
        if not gateway.cleanup_only and not self.runners.validity.check(gateway.account, state.runner_id, None):
            gateway.revoked = True
            await self._close_local(state, gateway)
            raise TalariaError("runner_connection_closed", "the connection's account lost its access", status=410)
        if seq is not None:
            gateway.last_seq = seq
        gateway.events.put_nowait(body["frame"])

    async def _close_local(self, state: ConnState, gateway: Gateway) -> None:
        gateway.open = False
        state.gateways.pop(gateway.id, None)
        gateway.events.put_nowait(None)
        await self.runners.fail_gateway(state, gateway.id)

    async def tool(self, state: ConnState, body: dict[str, Any]) -> Any:
        """Run one tool call of a grant (runner-protocol.md 12.5). Every call re-checks the grant's account
        (enabled, ``auth_version`` unchanged, the profile still allowed): a failed check answers 403
        ``team_tools_forbidden``, runs nothing and marks the grant revoked, which stops its turn. A tool that
        answers ``team_tools_forbidden`` itself (the round lost its team permission) closes the grant once the
        answer is on its way; the turn goes on without tools (team-tools.md 5)."""
        grant = state.grants.get(body["grantId"])
        if grant is None or not grant.open or grant.closing or not grant.turn_active():
            raise TalariaError("runner_grant_expired", "the grant is closed or its turn ended")
        if grant.revoked.is_set() or not self.runners.validity.check(grant.account, state.runner_id, grant.profile):
            grant.revoked.set()
            raise TalariaError("team_tools_forbidden", "the account behind this turn lost its access")
        fingerprint = sha256_hex(canonical_json([body["toolId"], body["arguments"]]))
        known = grant.calls.get(body["callId"])
        if known is not None:
            if known[0] != fingerprint:
                raise TalariaError("idempotency_conflict", "this callId was used with other arguments")
            return await asyncio.shield(known[1])
        if len(grant.calls) >= limits.MAX_TOOL_CALLS_PER_GRANT:
            raise TalariaError("runner_call_limit", "this grant has used its 128 tool calls")
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        grant.calls[body["callId"]] = (fingerprint, outcome)
        try:
            outcome.set_result(await grant.executor(body["toolId"], body["arguments"]))
        except TalariaError as exc:
            outcome.set_exception(exc)
            if exc.code == "team_tools_forbidden" and not grant.closing:
                grant.closing = True
                asyncio.get_running_loop().call_soon(self._close_soon, grant)
        except Exception as exc:  # a tool bug must not leave duplicates waiting forever
            outcome.set_exception(TalariaError("internal_error", f"the tool failed: {type(exc).__name__}"))
        if not grant.open or not grant.turn_active():
            raise TalariaError("runner_grant_expired", "the turn ended during the call")
        return await outcome

    def _close_soon(self, grant: Grant) -> None:
        task = asyncio.get_running_loop().create_task(self._close_refused(grant))
        self._closing.add(task)  # a reference until it is done
        task.add_done_callback(self._closing.discard)

    async def _close_refused(self, grant: Grant) -> None:
        try:
            await self.close_grant(grant)
        except TalariaError as exc:  # the runner went away: its grants died with its connection
            log.info("grant_close_failed", grant=grant.id, code=exc.code)
