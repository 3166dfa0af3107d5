"""The JSON-RPC methods of ``/api/ws`` that the runner uses (hermes.md 4), with Hermes 0.19.0's error codes:
-32700 parse error, -32600/-32602 malformed request, -32601 unknown method, 4001 session not found, 4007 stored
session not found, 4009 no pending request, 4090 too many sessions. Runs on the server loop only.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from talaria.testing.hermes_fixture import attach, sessions, turns
from talaria.testing.hermes_fixture.state import FixtureState, RpcError, Sink

Handler = Callable[[FixtureState, "Sink | None", dict[str, Any]], dict[str, Any]]


def ok(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def err(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def normalize(request: Any) -> tuple[Any, str, dict[str, Any]] | dict[str, Any]:
    """``(id, method, params)``, or the error answer for a malformed request."""
    if not isinstance(request, dict):
        return err(None, -32600, "invalid request: expected an object")
    rid = request.get("id")
    method = request.get("method")
    if not isinstance(method, str) or not method:
        return err(rid, -32600, "invalid request: method must be a non-empty string")
    params = request.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return err(rid, -32602, "invalid params: expected an object")
    return rid, method, params


def _create(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    return sessions.create(state, sink, params)


def _resume(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    return sessions.resume(state, sink, params)


def _close(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    with state.cond:
        session = state.live.get(str(params.get("session_id") or ""))
        return {"closed": sessions.close(state, session) if session is not None else False}


def _submit(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    with state.cond:
        session = sessions.live_session(state, params)
        text = params.get("text", "")
        return turns.submit(state, sink, session, text if isinstance(text, str) else str(text))


def _interrupt(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    with state.cond:
        return turns.interrupt(state, sessions.live_session(state, params))


def _usage(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    with state.cond:
        return sessions.usage_of(sessions.live_session(state, params))


def _active_list(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    """Every live session of the process, of every connection and profile (``profile`` is ignored)."""
    current = str(params.get("current_session_id") or "")
    with state.cond:
        return {"sessions": [sessions.active_item(s, current) for s in state.live.values() if not s.closed]}


def _history(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    """Reads the launch (default) profile's transcript, as 0.19.0 does: empty for a named profile's session."""
    with state.cond:
        session = sessions.live_session(state, params)
        stored = state.stored.get(("default", session.stored_id))
        history = sessions.conversation_of(stored) if stored is not None else []
        return {"count": len(history), "messages": sessions.history_messages(history)}


def _steer(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    text = str(params.get("text") or "").strip()
    if not text:
        raise RpcError(4002, "text is required")
    with state.cond:
        session = sessions.live_session(state, params)
        if session.building:
            raise RpcError(4010, "agent does not support steer")
        state.steers.append({"session_id": session.runtime_id, "text": text, "running": session.running})
        state.changed()
    return {"status": "queued", "text": text}


def _approval(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    with state.cond:
        return turns.respond_approval(state, sessions.live_session(state, params), params)


def _clarify(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    return turns.respond_clarify(state, params)


def _image(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    with state.cond:
        session = sessions.live_session(state, params)
    return attach.attach_image(state, session, params)


def _file(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    with state.cond:
        session = sessions.live_session(state, params)
    return attach.attach_file(state, session, params)


METHODS: dict[str, Handler] = {
    "session.create": _create,
    "session.resume": _resume,
    "session.close": _close,
    "session.interrupt": _interrupt,
    "session.usage": _usage,
    "session.active_list": _active_list,
    "session.history": _history,
    "session.steer": _steer,
    "prompt.submit": _submit,
    "approval.respond": _approval,
    "clarify.respond": _clarify,
    "image.attach_bytes": _image,
    "file.attach": _file,
}


def dispatch(state: FixtureState, sink: Sink | None, rid: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The answer to one request; a ``fail_method`` knob answers before the method runs."""
    with state.cond:
        failure = state.knobs.method_failures.take(method, "method")
    if failure is not None:
        return err(rid, failure.code, failure.message)
    handler = METHODS.get(method)
    if handler is None:
        return err(rid, -32601, f"unknown method: {method}")
    try:
        return ok(rid, handler(state, sink, params))
    except RpcError as exc:
        return err(rid, exc.code, exc.message)
    except Exception:  # a fixture bug: answer like Hermes' dispatch-crash path, and keep the traceback for the test
        with state.cond:
            state.internal_errors.append(traceback.format_exc())
            state.changed()
        return err(rid, -32603, "internal error")
