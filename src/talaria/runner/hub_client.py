"""The runner's HTTP client to the hub's machine API (runner-protocol.md 4). Standard library + httpx.

No redirects, 25 s per request, responses over 40 MiB refused, no Origin, no cookies; loopback hub
hosts are reached directly (proxy variables ignored, ``localhost`` as ``127.0.0.1``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from talaria.runner.wire import LeanTransport

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


def _direct_url(server_url: str) -> tuple[str, bool]:
    parts = urlsplit(server_url)
    host = parts.hostname or ""
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if host == "localhost":
        netloc = "127.0.0.1" + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, "", "", "")), True
    return server_url, loopback


def lean_transport() -> LeanTransport:
    return LeanTransport(max_body=MAX_RESPONSE_BYTES)


class HubClient:
    def __init__(
        self, server_url: str, identity: Identity, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        base, loopback = _direct_url(server_url)
        self.identity = identity
        self.http = httpx.AsyncClient(
            base_url=f"{base}/api/runner/v1/{identity.runner_id}",
            timeout=REQUEST_TIMEOUT_S,
            follow_redirects=False,
            trust_env=not loopback,
            transport=transport or lean_transport(),
        )

    async def close(self) -> None:
        await self.http.aclose()

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
            headers = headers | {"Content-Type": "application/json"}
        try:
            async with self.http.stream(method, f"/{op}", headers=headers, content=content) as response:
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        raise HubError(0, "transport", "the hub's answer is larger than 40 MiB")
                    chunks.append(chunk)
                status = response.status_code
        except httpx.HTTPError as exc:
            raise HubError(0, "transport", type(exc).__name__) from exc
        raw = b"".join(chunks)
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
