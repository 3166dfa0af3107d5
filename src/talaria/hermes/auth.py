"""Hermes authentication (hermes.md 3): the loopback session token, or a password login when Hermes is gated.

Negotiation: probe the public ``GET /api/status``. With ``auth_required: false`` and the Hermes host literally
``127.0.0.1`` or ``::1``, use the dashboard session token: ``HERMES_DASHBOARD_SESSION_TOKEN`` in the runner's
environment, then ``hermesTokenFile``, then the token in ``GET /`` (``hermes dashboard`` only); validate it with
``GET /api/profiles``; send it as ``X-Hermes-Session-Token`` (REST) and ``?token=`` (WebSocket). With
``auth_required: true``, use ``hermesCredentials``: ``GET /api/auth/me`` with the session cookie; on 401/403
``GET /api/auth/providers`` and ``POST /auth/password-login {provider: "basic", username, password, next: ""}``,
keeping the cookies it sets; every WebSocket takes a fresh single-use ticket from ``POST /api/auth/ws-ticket``
(``?ticket=``). Anything else is ``hermes_unavailable``.

A validated credential is reused for 30 s; a 401 makes the caller ask once more (``invalidate``), which re-reads
the token file or page, or logs in again. No redirects, no proxies (the wire client has neither). Tokens,
passwords, cookies and tickets never appear in messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from urllib.parse import urlsplit

from talaria.clock import Clock
from talaria.wire import WireClient, WireError, WireReply

REUSE_MS = 30_000
_PAGE_TOKEN = re.compile(r'window\.__HERMES_SESSION_TOKEN__\s*=\s*"([^"]+)"')
LOOPBACK_HOSTS = ("127.0.0.1", "::1")


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
        credentials: tuple[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._http = http
        self._host = urlsplit(hermes_url).hostname or ""
        self._token_file = token_file
        self._credentials = credentials
        self._clock = clock
        self._environ = os.environ if environ is None else environ
        self._token: str | None = None
        self._cookies: dict[str, str] = {}
        self._gated: bool | None = None
        self._validated_at = 0
        self._lock = asyncio.Lock()

    # --- what callers use ------------------------------------------------------------------------------------

    async def headers(self) -> dict[str, str]:
        """Headers that authenticate a REST request, validated within the last 30 s."""
        async with self._lock:
            await self._validate()
            if self._gated:
                return {"Cookie": self._cookie_header()}
            assert self._token is not None
            return {"X-Hermes-Session-Token": self._token}

    async def ws_credential(self) -> tuple[str, str]:
        """The query credential for one WebSocket: ``("token", …)``, or ``("ticket", …)`` minted now."""
        async with self._lock:
            await self._validate()
            if not self._gated:
                assert self._token is not None
                return "token", self._token
            for attempt in range(2):
                reply = await self._request("POST", "/api/auth/ws-ticket", {"Cookie": self._cookie_header()}, b"{}")
                if reply.status in (401, 403) and attempt == 0:
                    await self._login()
                    continue
                ticket = _field(reply, "ticket") if reply.status == 200 else None
                if ticket is None:
                    raise HermesUnavailable(f"Hermes did not issue a WebSocket ticket ({reply.status})")
                return "ticket", ticket
            raise HermesUnavailable("Hermes did not issue a WebSocket ticket")  # pragma: no cover - loop returns

    async def token(self) -> str:
        """The session token (loopback mode only)."""
        async with self._lock:
            await self._validate()
            if self._gated or self._token is None:
                raise HermesUnavailable("this Hermes uses a password login, not a session token")
            return self._token

    def invalidate(self) -> None:
        self._token = None
        self._cookies = {}
        self._gated = None

    # --- negotiation -----------------------------------------------------------------------------------------

    async def _validate(self) -> None:
        now = self._clock.now_ms()
        fresh = now - self._validated_at < REUSE_MS
        if fresh and ((self._gated is False and self._token) or (self._gated and self._cookies)):
            return
        status = await self._request("GET", "/api/status")
        if status.status != 200:
            raise HermesUnavailable(f"Hermes /api/status answered {status.status}")
        try:
            info = status.json()
        except ValueError:
            info = None
        if not isinstance(info, dict):
            raise HermesUnavailable("Hermes /api/status did not answer a JSON object")
        if info.get("auth_required") is True:
            self._gated = True
            await self._check_session()
        elif info.get("auth_required") is False and self._host in LOOPBACK_HOSTS:
            self._gated = False
            token = await self._find_token()
            check = await self._request("GET", "/api/profiles", {"X-Hermes-Session-Token": token})
            if check.status != 200:
                raise HermesUnavailable(f"Hermes refused the session token ({check.status})")
            self._token = token
        else:
            raise HermesUnavailable("Hermes' authentication mode is not usable from this runner")
        self._validated_at = now

    async def _check_session(self) -> None:
        if self._credentials is None:
            raise HermesUnavailable("Hermes requires a password login: set hermesCredentials in runner.json")
        if self._cookies:
            me = await self._request("GET", "/api/auth/me", {"Cookie": self._cookie_header()})
            if me.status == 200:
                return
            if me.status not in (401, 403):
                raise HermesUnavailable(f"Hermes /api/auth/me answered {me.status}")
        await self._login()

    async def _login(self) -> None:
        assert self._credentials is not None
        providers = await self._request("GET", "/api/auth/providers")
        names = []
        if providers.status == 200:
            try:
                listed = providers.json().get("providers", [])
                names = [p.get("name") for p in listed if isinstance(p, dict) and p.get("supports_password")]
            except (ValueError, AttributeError):
                names = []
        if "basic" not in names:
            raise HermesUnavailable("Hermes offers no username/password login provider")
        username, password = self._credentials
        body = json.dumps({"provider": "basic", "username": username, "password": password, "next": ""}).encode()
        reply = await self._request("POST", "/auth/password-login", {}, body)
        if reply.status == 401:
            raise HermesUnavailable("Hermes refused hermesCredentials (401): check the username and password")
        if reply.status == 429:
            raise HermesUnavailable("Hermes is limiting login attempts (429); the runner will retry later")
        if reply.status != 200:
            raise HermesUnavailable(f"Hermes' password login answered {reply.status}")
        cookies: dict[str, str] = {}
        for line in reply.set_cookies:
            try:
                jar = SimpleCookie()
                jar.load(line)
            except CookieError:
                continue
            cookies.update({name: morsel.value for name, morsel in jar.items()})
        if not cookies:
            raise HermesUnavailable("Hermes' password login set no session cookie")
        self._cookies = cookies

    def _cookie_header(self) -> str:
        return "; ".join(f"{name}={value}" for name, value in self._cookies.items())

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
        page = await self._request("GET", "/")
        match = _PAGE_TOKEN.search(page.text) if page.status == 200 else None
        if match is None:
            raise HermesUnavailable(
                "no Hermes session token: set HERMES_DASHBOARD_SESSION_TOKEN or hermesTokenFile "
                "(a headless `hermes serve` has no dashboard page to read it from)"
            )
        return match.group(1)

    async def _request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> WireReply:
        if body is not None:
            headers = (headers or {}) | {"Content-Type": "application/json"}
        try:
            return await self._http.request(method, path, headers=headers, body=body, max_body=1024 * 1024)
        except WireError as exc:
            raise HermesUnavailable(f"Hermes is not reachable ({exc})") from exc


def _field(reply: WireReply, name: str) -> str | None:
    try:
        value = reply.json().get(name)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None
