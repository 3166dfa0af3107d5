"""The fixture's ASGI app: the REST routes the runner reads (hermes.md 5) and Talaria's plugin routes (hermes.md 8),
behind Hermes' guards in Hermes' order: the session token (401), the plugin gate (404), the Host header (400).
A ``delay_route`` or ``hold_route`` knob waits before the guards, a ``fail_route`` knob answers after them. WebSocket
scopes go to ``ws.serve_gateway``. Every request is logged before it is answered.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from talaria.testing.hermes_fixture import plugin
from talaria.testing.hermes_fixture.guards import (
    host_ok,
    needs_token,
    redact_headers,
    redact_query,
    rest_token_ok,
)
from talaria.testing.hermes_fixture.knobs import HERMES_VERSION
from talaria.testing.hermes_fixture.state import FixtureState, RequestRecord, valid_profile_name
from talaria.testing.hermes_fixture.ws import serve_gateway

_MESSAGES = re.compile(r"^/api/sessions/([^/]+)/messages\Z")
_SENSITIVE_NAMES = frozenset({"auth.json", "auth.lock", "credentials", "config.yaml", ".git-credentials"})
_SENSITIVE_DIRS = frozenset({"mcp-tokens", "pairing"})


def detail(status: int, message: Any) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def _missing(field: str) -> JSONResponse:
    return detail(422, [{"type": "missing", "loc": ["query", field], "msg": "Field required", "input": None}])


def _not_int(field: str, value: str) -> JSONResponse:
    message = "Input should be a valid integer, unable to parse string as an integer"
    return detail(422, [{"type": "int_parsing", "loc": ["query", field], "msg": message, "input": value}])


class HermesApp:
    def __init__(self, state: FixtureState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            ws = WebSocket(scope, receive, send)
            if scope["path"] == "/api/ws":
                await serve_gateway(self.state, ws)
            else:
                await ws.close(code=4404)
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        raw = await request.body()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in request.headers.items()}
        query = dict(request.query_params)
        record = RequestRecord(request.method, request.url.path, redact_query(query), redact_headers(headers), body)
        with self.state.cond:
            self.state.requests.append(record)
            self.state.changed()
        response = await self._answer(request, headers, query, body)
        with self.state.cond:
            record.status = response.status_code
            self.state.changed()
        await response(scope, receive, send)

    async def _answer(self, request: Request, headers: dict[str, str], query: dict[str, str], body: Any) -> Response:
        state = self.state
        path = request.url.path
        with state.cond:
            delay = state.knobs.route_delays.take(path, "pattern", glob=True)
        if delay is not None and delay.gate is not None:
            delay.gate.reached.set()
            deadline = asyncio.get_running_loop().time() + delay.seconds
            while not delay.gate.released.is_set() and asyncio.get_running_loop().time() < deadline:
                if await state.pause(0.01):
                    break
        elif delay is not None:
            await state.pause(delay.seconds)
        with state.cond:
            token = state.token
        if needs_token(path) and not rest_token_ok(path, headers, query, token):
            return detail(401, "Unauthorized")
        plugin_served = path.startswith("/api/plugins/talaria/") and state.knobs.plugin_enabled
        if path.startswith("/api/plugins/") and not plugin_served:
            return detail(404, "Plugin not found")
        if not host_ok(headers.get("host", ""), state.port):
            return detail(400, "Invalid Host header. Dashboard requests must use the hostname the server was bound to.")
        with state.cond:
            failure = state.knobs.route_failures.take(path, "pattern", glob=True)
        if failure is not None:
            content = failure.body if failure.body is not None else {"detail": f"fixture failure {failure.status}"}
            return JSONResponse(content, status_code=failure.status)
        return self._route(request.method, path, query, body)

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> Response:
        gets = {
            "/": self._index,
            "/api/status": self._status,
            "/api/profiles": self._profiles,
            "/api/config": self._config,
            "/api/sessions": self._sessions,
            "/api/files/download": self._download,
            "/api/plugins/talaria/capabilities": self._capabilities,
        }
        posts = {"/api/plugins/talaria/bind": plugin.bind, "/api/plugins/talaria/unbind": plugin.unbind}
        match = _MESSAGES.match(path)
        if method == "GET" and path in gets:
            return gets[path](query)
        if method == "GET" and match is not None:
            return self._messages(match.group(1), query)
        if method == "POST" and path in posts:
            return posts[path](self.state, body if isinstance(body, dict) else {})
        if path in gets or path in posts or match is not None:
            return detail(405, "Method Not Allowed")
        return detail(404, "Not Found")

    # --- routes

    def _index(self, query: dict[str, str]) -> Response:
        """``hermes dashboard`` injects the session token into its page; ``hermes serve`` has no page."""
        if not self.state.knobs.dashboard_page:
            return detail(404, "Not Found")
        with self.state.cond:
            token = self.state.token
        html = f'<!doctype html><html><head><script>window.__HERMES_SESSION_TOKEN__="{token}";</script></head></html>'
        return HTMLResponse(html)

    def _status(self, query: dict[str, str]) -> Response:
        with self.state.cond:
            body: dict[str, Any] = {
                "version": HERMES_VERSION,
                "release_date": "",
                "gateway_running": False,
                "gateway_state": None,
                "gateway_platforms": {},
                "active_agents": 0,
                "active_sessions": len(self.state.live),
                "auth_required": False,
                "auth_providers": [],
            }
            body.update(self.state.knobs.status_overrides)
        return JSONResponse(body)

    def _profiles(self, query: dict[str, str]) -> Response:
        with self.state.cond:
            return JSONResponse({"profiles": [dict(p) for p in self.state.profiles]})

    def _profile_error(self, profile: str | None) -> Response | None:
        """Hermes' profile resolution for REST reads: 400 for a malformed name, 404 for an unknown one."""
        name = (profile or "").strip()
        if not name or name == "current":
            return None
        if not valid_profile_name(name):
            return detail(400, f"Invalid profile name '{name}'")
        if not self.state.profile_known(name):
            return detail(404, f"Profile '{name}' does not exist.")
        return None

    def _config(self, query: dict[str, str]) -> Response:
        error = self._profile_error(query.get("profile"))
        if error is not None:
            return error
        name = (query.get("profile") or "").strip()
        name = "default" if name in {"", "current"} else name
        with self.state.cond:
            config = self.state.configs.get(name, {})
            return JSONResponse({k: v for k, v in config.items() if not k.startswith("_")})

    def _ints(self, query: dict[str, str], **defaults: int | None) -> dict[str, int | None] | Response:
        values: dict[str, int | None] = {}
        for name, default in defaults.items():
            raw = query.get(name)
            if raw is None:
                values[name] = default
                continue
            try:
                values[name] = int(raw)
            except ValueError:
                return _not_int(name, raw)
        return values

    def _sessions(self, query: dict[str, str]) -> Response:
        error = self._profile_error(query.get("profile"))
        if error is not None:
            return error
        ints = self._ints(query, limit=20, offset=0)
        if isinstance(ints, Response):
            return ints
        limit, offset = ints["limit"] or 20, ints["offset"] or 0
        profile = (query.get("profile") or "").strip() or "default"
        with self.state.cond:
            live = {s.stored_id for s in self.state.live.values()}
            rows = [s for (p, _), s in self.state.stored.items() if p == profile and s.continued_by is None]
            order = query.get("order", "created")
            rows.sort(key=lambda s: s.last_active if order == "recent" else s.started_at, reverse=True)
            page = [
                {
                    "id": s.id,
                    "title": s.title,
                    "source": s.source,
                    "started_at": s.started_at,
                    "last_active": s.last_active,
                    "message_count": len(s.rows),
                    "is_active": s.id in live,
                }
                for s in rows[offset : offset + limit]
            ]
            return JSONResponse({"sessions": page, "total": len(rows), "limit": limit, "offset": offset})

    def _messages(self, session_id: str, query: dict[str, str]) -> Response:
        """Oldest first; ``limit`` capped at 500; ``{id}`` may be a unique prefix and resolves to the newest session of
        its compression chain."""
        error = self._profile_error(query.get("profile"))
        if error is not None:
            return error
        ints = self._ints(query, limit=None, offset=0)
        if isinstance(ints, Response):
            return ints
        limit, offset = ints["limit"], ints["offset"] or 0
        profile = (query.get("profile") or "").strip()
        profile = "default" if profile in {"", "current"} else profile
        with self.state.cond:
            stored = self.state.find_stored(profile, session_id, prefix=True)
            if stored is None:
                return detail(404, "Session not found")
            stored = self.state.tip(stored)
            capped = min(limit, 500) if limit is not None else None
            rows = [dict(r) for r in stored.rows if r.get("active", 1)]
            start = max(offset, 0)
            page = rows[start:] if capped is None else rows[start : start + max(capped, 0)]
            pagination = {"limit": capped, "offset": offset, "returned": len(page)}
            return JSONResponse({"session_id": stored.id, "messages": page, "pagination": pagination})

    def _download(self, query: dict[str, str]) -> Response:
        raw = query.get("path")
        if raw is None:
            return _missing("path")
        candidate = Path(raw).expanduser()
        if not raw.strip() or not candidate.is_absolute():
            return detail(400, "Path must be absolute")
        if ".." in candidate.parts:
            return detail(400, "Path cannot contain '..'")
        try:
            target = candidate.resolve(strict=True)
        except FileNotFoundError:
            return detail(404, "Path not found")
        except (OSError, RuntimeError):
            return detail(400, "Invalid path")
        if not target.is_file():
            return detail(400, "Path is not a file")
        name = target.name.lower()
        if name in _SENSITIVE_NAMES or name in {".env", ".envrc"} or name.startswith(".env."):
            return detail(403, "Access to sensitive files is not allowed")
        if any(part.lower() in _SENSITIVE_DIRS for part in target.parts):
            return detail(403, "Access to sensitive files is not allowed")
        if target.stat().st_size > self.state.knobs.max_download_bytes:
            return detail(413, "File is too large")
        return FileResponse(target, filename=target.name, content_disposition_type="attachment")

    def _capabilities(self, query: dict[str, str]) -> Response:
        error = self._profile_error(query.get("profile"))
        if error is not None:
            return error
        with self.state.cond:
            return JSONResponse(dict(self.state.knobs.capabilities))
