"""Recovery of a job's turn without replay (hermes.md 11): the prompt was (maybe) submitted, and the
dispatcher lost sight of the turn (the runner's channel dropped, the runner or the hub restarted).

Resume the recorded stored session on the same runner; a turn still running whose ``inflight.user`` holds
the marker is re-attached (its ``message.complete`` awaited on the new channel, until the turn's deadline:
then it is interrupted and ``turn_timeout`` raised); then the history decides: the turn finished if and only if,
after the user row holding the marker and before the next user row, there is an assistant row with
``finish_reason: "stop"``; its content is the reply. Anything else (no such row, the marker absent, the
stored session unknown) is ``runner_command_uncertain``, and the session is never prompted again.

On PostgreSQL replicas the recorded channel comes first (scale.md 4.4 step 3): while it is still open on the runner's
current connection, the job's new holder adopts it (its previous owner died or lost the lease) instead of opening a
second one, receives its frames again from the turn's first, waits for its previous owner's commands to settle, and
asks ``session.active_list``: a turn still running is waited for as a re-attached one, then the history decides.
"""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import structlog

from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.hub.dispatch.job_turns import JobTurn
from talaria.hub.runners.channels import Channels
from talaria.hub.runners.connection_state import AccountRef, Gateway
from talaria.hub.runners.transport import Holding, JobHeld
from talaria.hub.turns.driver import TurnResult, frame_within
from talaria.lifecycle.records import LeaseRef

log = structlog.get_logger("talaria.dispatcher")

PAGE = 500
MAX_PAGES = 20  # runner-protocol.md 13


class Unrecoverable(Exception):
    """The turn's outcome cannot be known: ``runner_command_uncertain``. ``case`` names which (fixed words, for
    logs); the message may quote Hermes."""

    def __init__(self, message: str, *, case: str) -> None:
        super().__init__(message)
        self.case = case


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def reply_after_marker(rows: list[dict[str, Any]], marker: str) -> str | None:
    """The reply of the run whose user row holds ``marker``, or None if that run has no reply."""
    start = next((i for i, row in enumerate(rows) if row.get("role") == "user" and marker in _text(row.get("content"))),
                 None)  # fmt: skip
    if start is None:
        return None
    for row in rows[start + 1 :]:
        if row.get("role") == "user":
            return None
        if row.get("role") == "assistant" and row.get("finish_reason") == "stop":
            return _text(row.get("content"))
    return None


async def history(channels: Channels, runner_id: str, account: AccountRef, stored_id: str, profile: str) -> list[Any]:
    rows: list[Any] = []
    for page in range(MAX_PAGES):
        search = f"?profile={profile}&limit={PAGE}&offset={page * PAGE}"
        reply = await channels.http(
            runner_id, account, f"/api/sessions/{stored_id}/messages", search=search, profile=profile
        )
        if reply.get("status") != 200:
            status = reply.get("status")
            raise Unrecoverable(f"Hermes has no transcript for the session (HTTP {status})", case="no_transcript")
        try:
            body = json.loads(base64.b64decode(reply.get("body", "")))
        except ValueError as exc:
            raise Unrecoverable("Hermes' transcript is not JSON", case="transcript_not_json") from exc
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            raise Unrecoverable("Hermes' transcript is malformed", case="transcript_malformed")
        rows.extend(messages)
        if len(messages) < PAGE:
            return rows
    raise Unrecoverable("the transcript is too long to read", case="transcript_too_long")


def holds_marker(resumed: dict[str, Any], marker: str) -> bool:
    """Whether the running turn of a ``session.resume`` answer is the one carrying ``marker``."""
    inflight = resumed.get("inflight")
    return isinstance(inflight, dict) and marker in _text(inflight.get("user"))


async def _reattach(channels: Channels, gateway: Gateway, runtime_id: str, clock: Clock, deadline_ms: int) -> None:
    """Wait on the new channel for the running turn's ``message.complete``; at ``deadline_ms`` interrupt the
    turn and raise ``turn_timeout``."""
    while True:
        try:
            frame = await frame_within(gateway, clock, deadline_ms)
        except TimeoutError:
            continue
        except TalariaError:  # turn_timeout: stop the turn, then say so
            with contextlib.suppress(TalariaError):
                await channels.rpc(gateway, "session.interrupt", {"session_id": runtime_id})
            raise
        if frame is None:
            raise Unrecoverable("the channel closed while the re-attached turn ran", case="channel_closed")
        if frame.get("session_id") == runtime_id and frame.get("type") == "message.complete":
            return


async def adopt(channels: Channels, account: AccountRef, turn: JobTurn, held: Holding | None) -> Gateway | None:
    """The turn's recorded channel, adopted for the job or chat turn ``held``; None when there is none to adopt."""
    if held is None or turn.connection_id is None or turn.first_seq is None or not turn.runtime_id:
        return None
    return await channels.runners.adopt_gateway(
        turn.runner_id, turn.connection_id, account, held=held, after_seq=turn.first_seq - 1,
        runtime_id=turn.runtime_id, profile=turn.profile,
    )  # fmt: skip


async def still_running(channels: Channels, gateway: Gateway, turn: JobTurn) -> bool:
    """Whether the adopted channel's session runs a turn now (``session.active_list``: any status but idle)."""
    runtime_id = str(turn.runtime_id)
    listed = await channels.rpc(gateway, "session.active_list", {"profile": turn.profile,
                                                                "current_session_id": runtime_id})  # fmt: skip
    sessions = listed.get("sessions") if isinstance(listed, dict) else None
    mine = [s for s in (sessions or []) if isinstance(s, dict) and s.get("id") == runtime_id]
    return bool(mine) and mine[0].get("status") not in (None, "idle")


async def from_history(channels: Channels, account: AccountRef, turn: JobTurn, stored: str) -> str:
    """The reply of the marked run in the history of ``stored`` (or of the recorded session, which a compression
    made its parent); ``Unrecoverable`` when it has none."""
    assert turn.stored_session_id is not None
    rows = await history(channels, turn.runner_id, account, stored, turn.profile)
    reply = reply_after_marker(rows, turn.marker)
    if reply is None and stored != turn.stored_session_id:  # compressed since: the marker may be in the parent
        rows = await history(channels, turn.runner_id, account, turn.stored_session_id, turn.profile)
        reply = reply_after_marker(rows, turn.marker)
    if reply is None:
        raise Unrecoverable("the turn left no reply (interrupted, or lost in a Hermes restart)", case="no_reply")
    return reply


async def recover(
    channels: Channels, account: AccountRef, turn: JobTurn, *, clock: Clock, deadline_ms: int,
    lease: LeaseRef | None = None,
) -> TurnResult:  # fmt: skip
    """The turn's result from Hermes, or ``Unrecoverable`` (or ``turn_timeout`` when a re-attached turn
    reaches ``deadline_ms``); never submits anything. Given the job's ``lease``, the turn's channel is adopted
    when it is still open (module docstring)."""
    if not turn.stored_session_id:
        raise Unrecoverable("no stored session was recorded for the turn", case="no_stored_session")
    adopted = await adopt(channels, account, turn, JobHeld(turn.job_id, lease) if lease is not None else None)
    if adopted is not None:
        log.info("dispatcher_channel_adopted", job_id=turn.job_id, connection=adopted.id)
        try:
            runtime_id = str(turn.runtime_id)
            if await still_running(channels, adopted, turn):
                await _reattach(channels, adopted, runtime_id, clock, deadline_ms)
            reply = await from_history(channels, account, turn, turn.stored_session_id)
            return TurnResult("complete", reply, runtime_id, turn.stored_session_id, turn.marker)
        finally:
            with contextlib.suppress(TalariaError):
                await channels.close_gateway(adopted)
    gateway = await channels.open_gateway(turn.runner_id, account, recovery=True)  # passes a drain (operations 3.2)
    try:
        params: dict[str, Any] = {"session_id": turn.stored_session_id}
        if turn.profile != "default":
            params["profile"] = turn.profile
        try:
            resumed = await channels.rpc(gateway, "session.resume", params)
        except TalariaError as exc:
            if exc.code == "gateway_rejected":  # 4007: never persisted
                message = f"Hermes does not know the stored session ({exc.message})"
                raise Unrecoverable(message, case="session_unknown") from exc
            raise
        runtime_id = str(resumed.get("session_id", ""))
        if resumed.get("running") and holds_marker(resumed, turn.marker):
            await _reattach(channels, gateway, runtime_id, clock, deadline_ms)
        # running without the marker in flight: another prompt runs in the session; only the history can say
        # whether this turn finished, and nothing is re-attached or submitted
        stored = str(resumed.get("resumed") or turn.stored_session_id)
        reply = await from_history(channels, account, turn, stored)
        return TurnResult("complete", reply, runtime_id, stored, turn.marker)
    finally:
        with contextlib.suppress(TalariaError):
            await channels.close_gateway(gateway)


def from_record(turn: JobTurn) -> TurnResult:
    """The result a finished turn's record keeps (nothing is asked of Hermes)."""
    return TurnResult(turn.outcome or "interrupted", turn.reply or "", "", turn.stored_session_id, turn.marker)


def kept_reply(result: TurnResult) -> str | None:
    """What the record keeps of a finished turn: the reply, or Hermes' error text."""
    return result.text if result.status in ("complete", "error") else None


async def interrupt_for_cleanup(channels: Channels, turn: JobTurn, author: AccountRef) -> None:
    """Interrupt the recorded turn through a cleanup-only channel (admitted although the author lost access)."""
    if not turn.stored_session_id:
        return
    try:
        gateway = await channels.open_gateway(
            turn.runner_id, author, cleanup_only=True, bound_stored_id=turn.stored_session_id
        )
    except TalariaError as exc:
        log.info("dispatcher_cleanup_refused", job_id=turn.job_id, code=exc.code)
        return
    try:
        resumed = await channels.rpc(gateway, "session.resume", {"session_id": turn.stored_session_id})
        await channels.rpc(gateway, "session.interrupt", {"session_id": resumed["session_id"]})
    except TalariaError as exc:
        log.info("dispatcher_cleanup_failed", job_id=turn.job_id, code=exc.code)
    finally:
        with contextlib.suppress(TalariaError):
            await channels.close_gateway(gateway)
