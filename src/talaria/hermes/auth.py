"""Hermes authentication for a loopback-bound Hermes (hermes.md 3): the dashboard session token.

Order: ``HERMES_DASHBOARD_SESSION_TOKEN`` in the runner's environment, then ``hermesTokenFile``, then the
token embedded in ``GET /`` (``hermes dashboard`` only). A validated token is reused for 30 s; a 401
makes the caller ask once more (``invalidate``), which re-reads the file or the page. Gated Hermes
(``auth_required: true``, password login and WebSocket tickets) is not handled yet: it answers
``hermes_unavailable`` with a message that says so.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from talaria.clock import Clock
from talaria.runner.wire import WireClient, WireError, WireReply

REUSE_MS = 30_000
_PAGE_TOKEN = re.compile(r'window\.__HERMES_SESSION_TOKEN__\s*=\s*"([^"]+)"')


class HermesUnavailable(Exception):
    """Hermes cannot be reached or authenticated; the message never holds a credential."""


class HermesAuth:
    def __init__(
        self,
        http: WireClient,
        *,
        hermes_url: str,
        token_file: str | None,
        clock: Clock,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._http = http
        self._host = urlsplit(hermes_url).hostname or ""
        self._token_file = token_file
        self._clock = clock
        self._environ = os.environ if environ is None else environ
        self._token: str | None = None
        self._validated_at = 0
        self._lock = asyncio.Lock()

    async def token(self) -> str:
        """A session token validated within the last 30 s."""
        async with self._lock:
            now = self._clock.now_ms()
            if self._token is not None and now - self._validated_at < REUSE_MS:
                return self._token
            status = await self._get("/api/status")
            if status.status != 200:
                raise HermesUnavailable(f"Hermes /api/status answered {status.status}")
            try:
                info = status.json()
            except ValueError:
                info = None
            if not isinstance(info, dict):
                raise HermesUnavailable("Hermes /api/status did not answer a JSON object")
            if info.get("auth_required") is not False or self._host not in ("127.0.0.1", "::1"):
                raise HermesUnavailable("Hermes requires a password login, which this runner does not support yet")
            token = await self._find_token()
            check = await self._get("/api/profiles", headers={"X-Hermes-Session-Token": token})
            if check.status != 200:
                raise HermesUnavailable(f"Hermes refused the session token ({check.status})")
            self._token, self._validated_at = token, now
            return token

    def invalidate(self) -> None:
        self._token = None

    async def _find_token(self) -> str:
        from_env = self._environ.get("HERMES_DASHBOARD_SESSION_TOKEN")
        if from_env:
            return from_env
        if self._token_file:
            try:
                text = Path(self._token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise HermesUnavailable(f"cannot read hermesTokenFile: {exc.strerror}") from exc
            if text:
                return text
        page = await self._get("/")
        match = _PAGE_TOKEN.search(page.text) if page.status == 200 else None
        if match is None:
            raise HermesUnavailable(
                "no Hermes session token: set HERMES_DASHBOARD_SESSION_TOKEN or hermesTokenFile "
                "(a headless `hermes serve` has no dashboard page to read it from)"
            )
        return match.group(1)

    async def _get(self, path: str, headers: dict[str, str] | None = None) -> WireReply:
        try:
            return await self._http.request("GET", path, headers=headers, max_body=1024 * 1024)
        except WireError as exc:
            raise HermesUnavailable(f"Hermes is not reachable ({exc})") from exc
