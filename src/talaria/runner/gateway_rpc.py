"""``gateway.rpc``: the allow-list and the per-method rules of runner-protocol.md 10.2 and 10.3.

Order of the checks: the method is on the allow-list and, on a cleanup-only channel, one of the four stop methods,
and a ``file.attach`` holds no ``path`` (all three ``runner_command_forbidden``); then the method's own rule
(profile, ownership, pending clarification, busy session); only then is Hermes called. Outcomes of the Hermes call:
a JSON-RPC error is ``gateway_rejected`` with Hermes' message; no answer within 30 s, or the connection lost after
the request left, is ``runner_command_uncertain``; a connection already closed is ``runner_connection_closed``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Final

from talaria.hermes.auth import HermesUnavailable
from talaria.hermes.rest import HermesRest, ReplyTooLarge
from talaria.hermes.ws import ChannelClosed, ResultHook, RpcError, RpcTimeout
from talaria.runner.errors import CommandError
from talaria.runner.gateway_channel import Channel, Ownership
from talaria.runner.receipts import Receipts, ReceiptsError

ALLOWED: Final = frozenset(
    {
        "session.create",
        "session.resume",
        "session.close",
        "session.usage",
        "session.interrupt",
        "session.active_list",
        "prompt.submit",
        "session.steer",
        "image.attach_bytes",
        "file.attach",
        "approval.respond",
        "clarify.respond",
    }
)
CLEANUP_ONLY: Final = frozenset({"session.resume", "session.interrupt", "session.close", "session.active_list"})
OPENS_SESSION: Final = frozenset({"session.create", "session.resume"})
MAX_PROFILES_REPLY_BYTES: Final = 8 * 1024 * 1024

_log = logging.getLogger("talaria.runner.gateway")


def forbidden(message: str) -> CommandError:
    return CommandError("runner_command_forbidden", message)


def session_forbidden() -> CommandError:
    return CommandError("runner_session_forbidden", "this session is not owned by this gateway connection")


def connection_closed() -> CommandError:
    return CommandError("runner_connection_closed", "the gateway connection is closed")


def uncertain(message: str) -> CommandError:
    return CommandError("runner_command_uncertain", message)


async def hermes_call(
    channel: Channel, method: str, params: dict[str, Any], on_result: ResultHook | None = None
) -> Any:
    """One JSON-RPC request on the channel's WebSocket, with the outcomes mapped to command errors."""
    ws = channel.ws
    if ws is None or channel.closed:
        raise connection_closed()
    try:
        return await ws.request(method, params, on_result=on_result)
    except RpcError as exc:
        raise CommandError("gateway_rejected", exc.message or f"Hermes refused {method} ({exc.code})") from None
    except RpcTimeout:
        raise uncertain(f"Hermes did not answer {method} within 30 s; it may have run") from None
    except ChannelClosed as exc:
        if exc.sent:
            raise uncertain(f"the Hermes connection closed before it answered {method}; it may have run") from None
        raise connection_closed() from None


async def record_session(receipts: Receipts, stored_id: str, profile: str) -> None:
    """Section 11.2: remember that ``stored_id`` was opened through this runner under ``profile`` (best effort)."""
    try:
        await asyncio.to_thread(receipts.record_session, stored_id, profile)
    except (ValueError, ReceiptsError) as exc:
        _log.warning("record_session_failed", extra={"error": type(exc).__name__})


class RpcRules:
    def __init__(
        self,
        ownership: Ownership,
        receipts: Receipts,
        allowed_profiles: tuple[str, ...],
        rest: Callable[[], HermesRest],
    ) -> None:
        self.ownership = ownership
        self.receipts = receipts
        self.allowed_profiles = frozenset(allowed_profiles)
        self.rest = rest

    async def call(self, channel: Channel, method: str, params: dict[str, Any]) -> Any:
        if method not in ALLOWED:
            raise forbidden(f"{method} is not on the runner's gateway allow-list")
        if channel.cleanup_only and method not in CLEANUP_ONLY:
            raise forbidden("a cleanup-only connection accepts only resume, interrupt, close and active_list")
        if method == "file.attach" and "path" in params:
            # chat.md 3.4, amending 10.2: the hub never sends node paths, attachments travel as ``data_url``. Hermes
            # copies whatever file it can read on the node into the session's workspace, so a ``path`` (any value,
            # even null or empty) would let a compromised hub read any file of the node through Hermes. Refused
            # here, whatever the hub sent, before the ownership check and before any Hermes call.
            raise forbidden("file.attach takes data_url; a path on the node is refused")
        if channel.closed or channel.ws is None:
            raise connection_closed()
        if method in OPENS_SESSION:
            return await self._open_session(channel, method, params)
        if method == "session.active_list":
            return await self._active_list(channel, params)
        session_id = params.get("session_id")
        if not channel.owns(session_id):
            raise session_forbidden()
        assert isinstance(session_id, str)
        if method == "clarify.respond":
            return await self._clarify(channel, session_id, params)
        if method == "prompt.submit":
            return await self._submit(channel, session_id, params)
        result = await hermes_call(channel, method, params)
        if method == "session.close":
            channel.running.discard(session_id)  # Hermes abandons a closed session's turn without events
        return result

    # --- session.create / session.resume ---------------------------------------------------------------------

    async def _open_session(self, channel: Channel, method: str, params: dict[str, Any]) -> Any:
        requested = params.get("profile")
        profile = "default" if requested is None or requested == "" else requested
        if not isinstance(profile, str) or profile not in self.allowed_profiles:
            raise CommandError("runner_profile_forbidden", "this profile is not allowed on this node")
        if profile != "default" and profile not in await self._hermes_profiles():
            raise CommandError("runner_profile_forbidden", "Hermes does not list this profile")
        resumed = params.get("session_id") if method == "session.resume" else None
        recorded: list[str] = []

        def own(result: Any) -> None:
            if channel.closed or not isinstance(result, dict):
                return
            runtime_id = result.get("session_id")
            if not isinstance(runtime_id, str) or not runtime_id:
                return
            stored = result.get("stored_session_id") if method == "session.create" else resumed
            stored = stored if isinstance(stored, str) and stored else None
            running = method == "session.resume" and result.get("running") is True
            self.ownership.take(channel, runtime_id, profile, stored, running=running)
            if stored is not None:
                recorded.append(stored)

        result = await hermes_call(channel, method, params, own)
        if channel.closed:
            raise uncertain("the gateway connection closed while the session opened")
        for stored in recorded:
            await record_session(self.receipts, stored, profile)
        return result

    async def _hermes_profiles(self) -> set[str]:
        """Names listed by Hermes' ``GET /api/profiles``; ``hermes_unavailable`` when it cannot say."""
        unavailable = CommandError("hermes_unavailable", "Hermes did not list its profiles")
        try:
            reply = await self.rest().get("/api/profiles", max_bytes=MAX_PROFILES_REPLY_BYTES)
        except HermesUnavailable as exc:
            raise CommandError("hermes_unavailable", str(exc)) from None
        except ReplyTooLarge:
            raise unavailable from None
        if reply.status != 200:
            raise unavailable
        try:
            body = json.loads(reply.body)
        except ValueError:
            raise unavailable from None
        entries = body.get("profiles") if isinstance(body, dict) else None
        if not isinstance(entries, list):
            raise unavailable
        return {e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)}

    # --- the other methods ----------------------------------------------------------------------------------

    async def _active_list(self, channel: Channel, params: dict[str, Any]) -> Any:
        if set(params) != {"profile", "current_session_id"}:
            raise session_forbidden()
        current = params["current_session_id"]
        if not channel.owns(current) or channel.sessions[current] != params["profile"]:
            raise session_forbidden()
        result = await hermes_call(channel, "session.active_list", params)
        entries = result.get("sessions") if isinstance(result, dict) else None
        mine = [
            {"id": entry["id"], "status": entry.get("status")}
            for entry in (entries if isinstance(entries, list) else [])
            if isinstance(entry, dict) and entry.get("id") == current
        ]
        return {"sessions": mine[:1]}

    async def _clarify(self, channel: Channel, session_id: str, params: dict[str, Any]) -> Any:
        request_id = params.get("request_id")
        pending = channel.clarify.get(session_id, set())
        if not isinstance(request_id, str) or request_id not in pending:
            raise CommandError("runner_session_forbidden", "no such clarification is pending on this session")
        body: dict[str, Any] = {key: params[key] for key in ("request_id", "answer") if key in params}
        try:
            result = await hermes_call(channel, "clarify.respond", body)
        except CommandError as exc:
            if exc.code == "gateway_rejected":
                pending.discard(request_id)
            raise
        pending.discard(request_id)
        return result

    async def _submit(self, channel: Channel, session_id: str, params: dict[str, Any]) -> Any:
        if channel.busy(session_id):
            raise CommandError("runner_session_busy", "a turn is running in this session; steer it instead")
        channel.submitting.add(session_id)

        def started(_: Any) -> None:
            channel.submitting.discard(session_id)
            if channel.owns(session_id):
                channel.running.add(session_id)

        try:
            return await hermes_call(channel, "prompt.submit", params, started)
        except CommandError as exc:
            if exc.code == "runner_command_uncertain" and channel.owns(session_id):
                channel.running.add(session_id)  # it may be running: never submit over it
            raise
        finally:
            channel.submitting.discard(session_id)
