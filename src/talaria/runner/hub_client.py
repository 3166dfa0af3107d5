"""The runner's HTTP client to the hub's machine API (runner-protocol.md 4).

No redirects, 25 s per request, responses over 40 MiB refused, no Origin, no cookies; loopback hub
hosts are reached directly (proxy variables ignored, ``localhost`` as ``127.0.0.1``). Requests go
through the lean ``WireClient``; only a non-loopback hub behind a proxy from the environment
(``HTTPS_PROXY`` and friends, ``NO_PROXY`` honoured) goes through httpx, which speaks to proxies.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from talaria.wire import WireClient, WireError, WireReply

REQUEST_TIMEOUT_S = 25.0
MAX_RESPONSE_BYTES = 40 * 1024 * 1024
TERMINAL_CODES = frozenset(
    {"runner_unauthorized", "runner_protocol_mismatch", "runner_instance_retired", "runner_instance_limit"}
)


class HubError(Exception):
    """A non-200 answer (``status``, ``code``) or a transport failure (status 0, code ``transport``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    @property
    def terminal(self) -> bool:
        return self.code in TERMINAL_CODES


@dataclass
class Identity:
    runner_id: str
    token: str
    instance: str


def _direct_url(server_url: str) -> str:
    """``localhost`` as ``127.0.0.1``; the path prefix is kept, query and fragment dropped."""
    parts = urlsplit(server_url)
    netloc = parts.netloc
    if parts.hostname == "localhost":
        netloc = "127.0.0.1" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Wire(Protocol):
    async def request(
        self, method: str, target: str, *, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> WireReply: ...

    async def aclose(self) -> None: ...


class ProxiedWire:
    """The hub behind a proxy named by the environment: httpx with ``trust_env``, same limits."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S, follow_redirects=False)

    async def request(
        self, method: str, target: str, *, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> WireReply:
        try:
            async with self.http.stream(method, target, headers=headers, content=body) as response:
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        raise WireError("too_large", "the hub's answer is larger than 40 MiB")
                    chunks.append(chunk)
                return WireReply(response.status_code, dict(response.headers), b"".join(chunks))
        except httpx.HTTPError as exc:
            raise WireError("protocol", type(exc).__name__) from exc

    async def aclose(self) -> None:
        await self.http.aclose()


def uses_proxy(server_url: str) -> bool:
    """True when the environment names a proxy for this (non-loopback) hub URL."""
    parts = urlsplit(server_url)
    host = parts.hostname or ""
    if host in ("127.0.0.1", "localhost", "::1"):
        return False
    proxies = urllib.request.getproxies()
    if parts.scheme not in proxies and "all" not in proxies:
        return False
    return not urllib.request.proxy_bypass(host)


def hub_wire(server_url: str, runner_id: str) -> Wire:
    url = f"{_direct_url(server_url).rstrip('/')}/api/runner/v1/{runner_id}"
    if uses_proxy(server_url):
        return ProxiedWire(url)
    return WireClient(url, max_body=MAX_RESPONSE_BYTES, timeout=REQUEST_TIMEOUT_S)


class HubClient:
    def __init__(self, server_url: str, identity: Identity, *, wire: Wire | None = None) -> None:
        self.identity = identity
        self.wire = wire or hub_wire(server_url, identity.runner_id)

    async def close(self) -> None:
        await self.wire.aclose()

    def _headers(self, epoch: str | None) -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self.identity.token}",
            "X-Runner-Instance": self.identity.instance,
            "X-Runner-Protocol": "1",
        }
        if epoch is not None:
            headers["X-Runner-Epoch"] = epoch
        return headers

    async def _send(self, method: str, op: str, headers: dict[str, str], body: Any = None) -> Any:
        content = json.dumps(body).encode() if body is not None else None
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            reply = await self.wire.request(method, f"/{op}", headers=headers, body=content)
        except WireError as exc:
            raise HubError(0, "transport", str(exc)) from exc
        raw, status = reply.body, reply.status
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = None
        if status != 200:
            code = data.get("code") if isinstance(data, dict) else None
            message = data.get("error") if isinstance(data, dict) else None
            raise HubError(status, str(code or f"http_{status}"), str(message or f"HTTP {status}"))
        return data

    async def poll(self, *, reset: bool, features: list[str]) -> dict[str, Any]:
        headers = self._headers(None) | {"X-Runner-Features": ",".join(features)}
        if reset:
            headers["X-Runner-Reset"] = "1"
        data = await self._send("GET", "poll", headers)
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("epoch"), str)
            or not isinstance(data.get("commands"), list)
        ):
            raise HubError(0, "transport", "the hub's poll answer is malformed")
        return data

    async def post(self, op: str, epoch: str, body: dict[str, Any]) -> Any:
        return await self._send("POST", op, self._headers(epoch), body)
