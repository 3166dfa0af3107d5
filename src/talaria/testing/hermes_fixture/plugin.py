"""Talaria's Hermes plugin routes as the fixture plays them (hermes.md 8): ``bind`` checks what the real plugin
checks before it touches an agent and records the binding per runtime id; ``unbind`` is idempotent. No tools are
fetched from the bridge. Failures answer ``{ok: false, error, code}`` with these codes: 400 ``invalid_request``,
409 ``not_ready``, 404 ``session_not_found``, 409 ``stored_session_mismatch`` / ``profile_mismatch`` /
``session_running``.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.responses import JSONResponse

from talaria.testing.hermes_fixture.state import FixtureState

_BRIDGE = re.compile(r"^http://127\.0\.0\.1:([0-9]{1,5})\Z")
MAX_GRANT_AHEAD_MS = 30 * 60 * 1000


def _refuse(status: int, code: str, error: str) -> JSONResponse:
    return JSONResponse({"ok": False, "error": error, "code": code}, status_code=status)


def _invalid(state: FixtureState, body: dict[str, Any]) -> str | None:
    bridge = _BRIDGE.match(str(body.get("bridge_url") or ""))
    if bridge is None or not 0 < int(bridge.group(1)) < 65536:
        return "bridge_url must be http://127.0.0.1:<port>"
    token = body.get("token")
    if not isinstance(token, str) or len(token) < 32:
        return "token must have at least 32 characters"
    if not isinstance(body.get("generation"), str) or not body["generation"]:
        return "generation is required"
    expires = body.get("expires_at")
    now_ms = int(state.now() * 1000)
    if not isinstance(expires, int) or isinstance(expires, bool) or not now_ms < expires <= now_ms + MAX_GRANT_AHEAD_MS:
        return "expires_at must be in the future and at most 30 minutes ahead"
    return None


def bind(state: FixtureState, body: dict[str, Any]) -> JSONResponse:
    with state.cond:
        state.binds.append(dict(body))
        state.changed()
        invalid = _invalid(state, body)
        if invalid is not None:
            return _refuse(400, "invalid_request", invalid)
        if not state.knobs.capabilities.get("ready"):
            return _refuse(409, "not_ready", "the plugin is not ready")
        session = state.live.get(str(body.get("session_id") or ""))
        if session is None:
            return _refuse(404, "session_not_found", "no live session with this runtime id")
        if body.get("stored_session_id") != session.stored_id:
            return _refuse(409, "stored_session_mismatch", f"the session's stored id is {session.stored_id}")
        if (body.get("profile") or "default") != session.profile:
            return _refuse(409, "profile_mismatch", "the session runs under another profile")
        current = state.bindings.get(session.runtime_id)
        if (current is None or current["generation"] != body["generation"]) and session.running:
            return _refuse(409, "session_running", "a running session cannot be bound")
        state.bindings[session.runtime_id] = dict(body)
        state.changed()
        return JSONResponse(
            {
                "ok": True,
                "native_tools": state.knobs.bind_native_tools,
                "tools": list(state.knobs.bind_tools),
                "stored_session_id": session.stored_id,
                "expires_at": body["expires_at"],
            }
        )


def unbind(state: FixtureState, body: dict[str, Any]) -> JSONResponse:
    with state.cond:
        state.unbinds.append(dict(body))
        runtime_id = str(body.get("session_id") or "")
        current = state.bindings.get(runtime_id)
        removed = 0
        if current is not None and current.get("generation") == body.get("generation"):
            del state.bindings[runtime_id]
            removed = 1
        state.changed()
        return JSONResponse({"ok": True, "removed": removed})
