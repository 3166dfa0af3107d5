"""Turns: ``prompt.submit`` and what streams after it (hermes.md 4 and 11). Runs on the server loop only.

A turn writes the user row (after ``persist_delay``), sends ``message.start``, optionally an ``approval.request``
or ``clarify.request`` and waits for the answer, then ``message.delta`` pieces of the scripted reply and
``message.complete`` followed by ``session.info``. A completed turn adds an assistant row with
``finish_reason: "stop"``; an interrupted or failed one adds none. A prompt submitted to a running session is
queued and interrupts the live turn (``display.busy_input_mode: interrupt``); it runs as the next turn.
"""

from __future__ import annotations

import asyncio
import time
import traceback
import uuid
from typing import Any

from talaria.testing.hermes_fixture.knobs import split_reply
from talaria.testing.hermes_fixture.sessions import session_info, usage_of
from talaria.testing.hermes_fixture.state import FixtureState, LiveSession, RpcError, Sink, Turn, TurnRecord


def submit(state: FixtureState, sink: Sink | None, session: LiveSession, text: str) -> dict[str, Any]:
    with state.cond:
        if sink is not None:
            session.sink = sink
        session.last_active = state.now()
        if session.running:
            session.queued = (text, sink)
            _stop_turn(session)
            state.changed()
            return {"status": "queued"}
        start(state, session, text)
    return {"status": "streaming"}


def interrupt(state: FixtureState, session: LiveSession) -> dict[str, Any]:
    with state.cond:
        session.queued = None
        _stop_turn(session)
        state.changed()
    return {"status": "interrupted"}


def _stop_turn(session: LiveSession) -> None:
    """Abandon the model call: pending approvals are denied, a pending clarification gets an empty answer."""
    turn = session.turn
    if turn is None:
        return
    turn.interrupted.set()
    if turn.approval is not None and not turn.approval.done():
        turn.approval.set_result("deny")


def start(state: FixtureState, session: LiveSession, text: str) -> None:
    with state.cond:
        record = TurnRecord(session.runtime_id, session.stored_id, session.profile, text)
        state.turns.append(record)
        turn = Turn(text=text, record=record, interrupted=asyncio.Event())
        session.turn = turn
        session.running = True
        turn.task = state.spawn(_run(state, session, turn))
        state.changed()


def respond_approval(state: FixtureState, session: LiveSession, params: dict[str, Any]) -> dict[str, Any]:
    choice = str(params.get("choice") or "deny")
    with state.cond:
        state.approval_choices.append({"session_id": session.runtime_id, "choice": choice, "all": params.get("all")})
        turn = session.turn
        resolved = 0
        if turn is not None and turn.approval is not None and not turn.approval.done():
            turn.approval.set_result(choice)
            resolved = 1
        state.changed()
    return {"resolved": resolved}


def respond_clarify(state: FixtureState, params: dict[str, Any]) -> dict[str, Any]:
    request_id = str(params.get("request_id") or "")
    with state.cond:
        pending = state.pending_clarify.pop(request_id, None)
        if pending is None:
            raise RpcError(4009, "no pending answer request")
        runtime_id, future = pending
        answer = str(params.get("answer") or "")
        state.clarify_answers.append({"request_id": request_id, "session_id": runtime_id, "answer": answer})
        if not future.done():
            future.set_result(answer)
        state.changed()
    return {"status": "ok"}


async def _wait_or_interrupt(future: asyncio.Future[str], turn: Turn, timeout: float) -> str:
    interrupted: asyncio.Future[Any] = asyncio.ensure_future(turn.interrupted.wait())
    waits: list[asyncio.Future[Any]] = [future, interrupted]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        interrupted.cancel()
    return future.result() if future.done() and not future.cancelled() else ""


async def _interaction(state: FixtureState, session: LiveSession, turn: Turn) -> None:
    """An approval or clarification the knobs ask for; the turn waits for its answer."""
    loop = asyncio.get_running_loop()
    with state.cond:
        approval = state.knobs.approvals.take(turn.text, "substring", contains=True)
        clarify = state.knobs.clarifications.take(turn.text, "substring", contains=True)
    if approval is not None:
        with state.cond:
            turn.approval = loop.create_future()
            state.changed()
        await state.emit(session, "approval.request", dict(approval.payload))
        await _wait_or_interrupt(turn.approval, turn, timeout=state.knobs.clarify_timeout)
        with state.cond:
            turn.approval = None
            state.changed()
    if clarify is not None and not turn.interrupted.is_set():
        request_id = uuid.uuid4().hex[:8]
        future: asyncio.Future[str] = loop.create_future()
        with state.cond:
            turn.clarify_id = request_id
            state.pending_clarify[request_id] = (session.runtime_id, future)
            state.changed()
        payload = {"question": clarify.question, "choices": list(clarify.choices), "request_id": request_id}
        await state.emit(session, "clarify.request", payload)
        await _wait_or_interrupt(future, turn, timeout=state.knobs.clarify_timeout)
        with state.cond:
            state.pending_clarify.pop(request_id, None)
            turn.clarify_id = None
            state.changed()


def _compress(state: FixtureState, session: LiveSession) -> None:
    """Context compression: the stored session ends and continues in a new one; the runtime id stays."""
    old = state.stored.get((session.profile, session.stored_id))
    if old is None:
        return
    session.stored_id = state.new_stored_id()
    fresh = state.ensure_stored(session.profile, session.stored_id, old.title)
    old.continued_by = fresh.id
    if session.turn is not None:
        session.turn.record.stored_id = fresh.id


async def _run(state: FixtureState, session: LiveSession, turn: Turn) -> None:
    try:
        await session.agent_ready.wait()
        await state.pause(state.knobs.persist_delay, turn.interrupted)
        with state.cond:
            if state.knobs.compressions.take(turn.text, "substring", contains=True) is not None:
                _compress(state, session)
            state.ensure_stored(session.profile, session.stored_id, session.title)
            state.append_row(session.profile, session.stored_id, "user", turn.text)
            failure = state.knobs.turn_failures.take(turn.text, "substring", contains=True)
            reply = state.knobs.reply_to(turn.text)
        await state.emit(session, "message.start")
        if not turn.interrupted.is_set():
            await _interaction(state, session, turn)
        for piece in split_reply(reply, state.knobs.delta_count) if failure is None else []:
            if await _before_delta(state, turn):
                break
            with state.cond:
                turn.assistant += piece
            await state.emit(session, "message.delta", {"text": piece})
        if turn.interrupted.is_set():
            await state.pause(state.knobs.interrupt_delay)
        if failure is not None and failure.event_only and not turn.interrupted.is_set():
            await _error_event(state, session, turn, failure.message)
            return
        await _finish(state, session, turn, reply, None if failure is None else failure.message)
    except asyncio.CancelledError:
        raise
    except Exception:  # a fixture bug: make it visible to the test, and end the turn
        with state.cond:
            state.internal_errors.append(traceback.format_exc())
            session.running = False
            session.turn = None
            turn.record.status = "error"
            state.changed()


async def _before_delta(state: FixtureState, turn: Turn) -> bool:
    """Wait the turn's delta delay, re-read every 50 ms (a test lets a held turn go by lowering it); True when the
    turn was interrupted meanwhile."""
    started = time.monotonic()
    while True:
        with state.cond:
            left = state.knobs.delta_delay_of(turn.text) - (time.monotonic() - started)
        if left <= 0:
            return await state.pause(0, turn.interrupted)
        if await state.pause(min(left, 0.05), turn.interrupted):
            return True


async def _error_event(state: FixtureState, session: LiveSession, turn: Turn, message: str) -> None:
    with state.cond:
        session.history.append({"role": "user", "content": turn.text})
        turn.record.status = "error"
        session.turn = None
        session.running = False
        session.last_active = state.now()
        state.changed()
    await state.emit(session, "error", {"message": message})


async def _finish(state: FixtureState, session: LiveSession, turn: Turn, reply: str, error: str | None) -> None:
    with state.cond:
        if turn.interrupted.is_set():
            status, text = "interrupted", turn.assistant
            session.history.append({"role": "user", "content": turn.text})
        elif error is not None:
            status, text = "error", f"Error: {error}"
            session.history.append({"role": "user", "content": turn.text})
        else:
            status, text = "complete", reply
            state.append_row(session.profile, session.stored_id, "assistant", reply, finish_reason="stop")
            session.history += [{"role": "user", "content": turn.text}, {"role": "assistant", "content": reply}]
            usage = session.usage
            usage["calls"] += 1
            usage["input"] += len(turn.text)
            usage["output"] += len(reply)
            usage["prompt"], usage["completion"] = usage["input"], usage["output"]
            usage["total"] = usage["input"] + usage["output"]
        turn.record.status, turn.record.reply = status, text
        queued, session.queued = session.queued, None
        session.turn = None
        session.running = False
        session.last_active = state.now()
        state.changed()
    await state.emit(session, "message.complete", {"text": text, "status": status, "usage": usage_of(session)})
    await state.pause(state.knobs.end_info_delay)
    await state.emit(session, "session.info", session_info(state, session))
    if queued is not None:
        with state.cond:
            if not session.closed and not session.running:
                if queued[1] is not None:
                    session.sink = queued[1]
                start(state, session, queued[0])
