"""Live sessions of the fixture's gateway: create, resume, close, detach on WebSocket loss and the orphan reap, and
the payloads Hermes 0.19.0 answers with (hermes.md 4 and 11). Runs on the server loop only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from talaria.testing.hermes_fixture.knobs import DESKTOP_CONTRACT, HERMES_VERSION
from talaria.testing.hermes_fixture.state import FixtureState, LiveSession, RpcError, Sink, StoredSession


def truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


def history_messages(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The display form of a conversation: ``{role, text}`` for every non-empty user/assistant/system message."""
    out: list[dict[str, Any]] = []
    for message in history:
        role = message.get("role")
        text = message.get("content")
        if role in {"user", "assistant", "system"} and isinstance(text, str) and text.strip():
            out.append({"role": role, "text": text})
    return out


def conversation_of(stored: StoredSession) -> list[dict[str, Any]]:
    return [{"role": r["role"], "content": r["content"]} for r in stored.rows if r.get("active", 1)]


def usage_of(session: LiveSession) -> dict[str, Any]:
    return {"model": session.model, "reasoning": 0, **session.usage}


def create_info(state: FixtureState, session: LiveSession) -> dict[str, Any]:
    """The lightweight ``info`` of a create or cold resume; ``profile_name`` is always the launch profile (0.19.0)."""
    info: dict[str, Any] = {
        "model": session.model,
        "tools": {},
        "skills": {},
        "cwd": session.cwd,
        "branch": None,
        "project": None,
        "lazy": True,
        "desktop_contract": DESKTOP_CONTRACT,
        "profile_name": "default",
    }
    if session.provider:
        info["provider"] = session.provider
    return info


def session_info(state: FixtureState, session: LiveSession) -> dict[str, Any]:
    """The ``session.info`` event payload (after the agent build and at the end of every turn)."""
    return {
        "model": session.model,
        "provider": session.provider or "custom",
        "reasoning_effort": "",
        "service_tier": "",
        "fast": False,
        "yolo": False,
        "approval_mode": "manual",
        "tools": {},
        "skills": {},
        "cwd": session.cwd,
        "branch": None,
        "project": None,
        "personality": "",
        "running": session.running,
        "title": session.title or "",
        "stored_session_id": session.stored_id,
        "desktop_contract": DESKTOP_CONTRACT,
        "version": HERMES_VERSION,
        "release_date": "",
        "update_behind": None,
        "update_command": "",
        "usage": usage_of(session),
        "profile_name": "default",
    }


def inflight_of(session: LiveSession) -> dict[str, Any] | None:
    turn = session.turn
    if turn is None:
        return None
    return {"assistant": turn.assistant, "streaming": True, "user": turn.text.strip()}


def live_payload(state: FixtureState, session: LiveSession) -> dict[str, Any]:
    """The answer of ``session.resume`` for a session already live in the process."""
    payload: dict[str, Any] = {
        "info": create_info(state, session),
        "message_count": len(session.history),
        "messages": history_messages(session.history),
        "running": session.running,
        "session_id": session.runtime_id,
        "session_key": session.stored_id,
        "started_at": session.created_at,
        "status": session.status,
    }
    inflight = inflight_of(session)
    if inflight is not None:
        payload["inflight"] = inflight
    if session.queued is not None:
        payload["queued"] = {"user": session.queued[0]}
    return payload


def active_item(session: LiveSession, current: str) -> dict[str, Any]:
    preview = ""
    for message in reversed(session.history):
        text = str(message.get("content") or "").strip()
        if text:
            preview = " ".join(text.split())[:160]
            break
    inflight = inflight_of(session)
    if session.queued is not None:
        preview = " ".join(session.queued[0].split())[:160]
    elif inflight is not None:
        preview = " ".join(str(inflight["assistant"] or inflight["user"]).split())[:160]
    return {
        "current": session.runtime_id == current,
        "id": session.runtime_id,
        "last_active": session.last_active or session.created_at,
        "message_count": len(session.history),
        "model": session.model,
        "preview": preview,
        "session_key": session.stored_id,
        "started_at": session.created_at,
        "status": session.status,
        "title": session.title or "",
    }


def configured_model(state: FixtureState, profile: str) -> str:
    model = state.configs.get(profile, {}).get("model")
    if isinstance(model, dict):
        return str(model.get("default") or model.get("model") or "scripted")
    return str(model or "scripted")


def live_session(state: FixtureState, params: dict[str, Any]) -> LiveSession:
    session = state.live.get(str(params.get("session_id") or ""))
    if session is None:
        raise RpcError(4001, "session not found")
    return session


def _claim_slot(state: FixtureState) -> None:
    limit = state.knobs.max_sessions
    if limit is not None and len(state.live) >= limit:
        raise RpcError(4090, f"max_concurrent_sessions reached ({limit})")


def _new_live(
    state: FixtureState, sink: Sink | None, stored_id: str, profile: str, params: dict[str, Any]
) -> LiveSession:
    model = str(params.get("model") or "").strip()
    now = state.now()
    session = LiveSession(
        runtime_id=state.new_runtime_id(),
        stored_id=stored_id,
        profile=profile,
        close_on_disconnect=truthy(params.get("close_on_disconnect", False)),
        sink=sink,
        created_at=now,
        last_active=now,
        model=model or configured_model(state, profile),
        provider=(str(params.get("provider") or "").strip() or None) if model else None,
        cwd=str(params.get("cwd") or "").strip() or str(state.home),
        title=str(params.get("title") or "").strip() or None,
        agent_ready=asyncio.Event(),
    )
    state.live[session.runtime_id] = session
    state.spawn(build_agent(state, session))
    state.changed()
    return session


async def build_agent(state: FixtureState, session: LiveSession) -> None:
    """The deferred agent build: after ``agent_build_delay`` the session is ready and ``session.info`` goes out."""
    await state.pause(state.knobs.agent_build_delay)
    with state.cond:
        if session.closed:
            return
        session.building = False
        state.changed()
    session.agent_ready.set()
    await state.emit(session, "session.info", session_info(state, session))


def seed_history(value: Any) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for item in value if isinstance(value, list) else []:
        if not isinstance(item, dict) or item.get("role") not in {"user", "assistant", "system"}:
            continue
        content = item.get("content", item.get("text"))
        if isinstance(content, str) and content.strip():
            history.append({"role": item["role"], "content": content})
    return history


def create(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    """``session.create``: answers at once (``info.lazy``); the stored row is written with the first message."""
    with state.cond:
        _claim_slot(state)
        profile = state.effective_profile(params.get("profile"))
        session = _new_live(state, sink, state.new_stored_id(), profile, params)
        session.history = seed_history(params.get("messages"))
        return {
            "session_id": session.runtime_id,
            "stored_session_id": session.stored_id,
            "message_count": len(session.history),
            "messages": history_messages(session.history),
            "info": create_info(state, session),
        }


def resume(state: FixtureState, sink: Sink | None, params: dict[str, Any]) -> dict[str, Any]:
    """``session.resume`` by stored id or title, following compression to the newest session. A session live in
    the process keeps its runtime id and is re-attached to this connection; otherwise a new live session is made."""
    target = str(params.get("session_id") or "").strip()
    if not target:
        raise RpcError(4006, "session_id required")
    with state.cond:
        profile = state.effective_profile(params.get("profile"))
        stored = state.find_stored(profile, target) or state.find_by_title(profile, target)
        if stored is None:
            raise RpcError(4007, "session not found")
        stored = state.tip(stored)
        live = next((s for s in state.live.values() if s.stored_id == stored.id), None)
        if live is not None:
            attach(state, live, sink)
            return {**live_payload(state, live), "resumed": stored.id}
        _claim_slot(state)
        session = _new_live(state, sink, stored.id, profile, params)
        session.history = conversation_of(stored)
        session.title = session.title or stored.title
        messages = history_messages(session.history)
        return {
            "session_id": session.runtime_id,
            "resumed": stored.id,
            "message_count": len(messages),
            "messages": messages,
            "info": create_info(state, session),
            "inflight": None,
            "running": False,
            "session_key": stored.id,
            "started_at": session.created_at,
            "status": "idle",
        }


def attach(state: FixtureState, session: LiveSession, sink: Sink | None) -> None:
    """Point the session's events at ``sink`` (Hermes rebinds on resume and submit), cancelling a pending reap."""
    with state.cond:
        if sink is not None:
            session.sink = sink
            if session.reap is not None:
                session.reap.cancel()
                session.reap = None
        session.last_active = state.now()
        state.changed()


def close(state: FixtureState, session: LiveSession) -> bool:
    """End a live session: its running turn is abandoned without further events; its plugin binding goes."""
    with state.cond:
        if session.closed:
            return False
        session.closed = True
        state.live.pop(session.runtime_id, None)
        if session.reap is not None:
            session.reap.cancel()
            session.reap = None
        turn = session.turn
        if turn is not None:
            if turn.record.status == "running":
                turn.record.status = "abandoned"
            if turn.task is not None:
                turn.task.cancel()
            if turn.clarify_id is not None:
                state.pending_clarify.pop(turn.clarify_id, None)
        session.running = False
        session.queued = None
        state.bindings.pop(session.runtime_id, None)
        state.changed()
    return True


def detach_all(state: FixtureState, sink: Sink) -> None:
    """On WebSocket loss: ``close_on_disconnect`` sessions close at once; the others lose their connection (a
    running turn goes on, its events are lost) and are reaped after the grace if idle then (checked once)."""
    with state.cond:
        owned = [s for s in state.live.values() if s.sink is sink]
        for session in owned:
            if session.queued is not None and session.queued[1] is sink:
                session.queued = (session.queued[0], None)
            if session.close_on_disconnect:
                close(state, session)
                continue
            session.sink = None
            loop = asyncio.get_running_loop()
            session.reap = loop.call_later(max(0.0, state.knobs.reap_grace), _reap_if_orphaned, state, session)
        state.changed()


def _reap_if_orphaned(state: FixtureState, session: LiveSession) -> None:
    with state.cond:
        session.reap = None
        if not session.closed and session.sink is None and not session.running:
            close(state, session)
