"""Read-only REST calls to Hermes with the negotiated credential (hermes.md 5)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from talaria.clock import Clock
from talaria.hermes.auth import HermesAuth, HermesUnavailable
from talaria.runner.wire import LeanTransport

# Hermes answers the runner reads whole (REST replies are capped at 8 MiB by the callers; a file export
# is capped the same way): the transport refuses anything larger outright.
MAX_HERMES_BODY_BYTES = 16 * 1024 * 1024


class ReplyTooLarge(Exception):
    pass


@dataclass(frozen=True)
class RestReply:
    status: int
    headers: dict[str, str]
    body: bytes


class HermesRest:
    """GET requests to one Hermes; no redirects, no proxies, a size cap, one re-authentication on 401."""

    def __init__(
        self,
        hermes_url: str,
        *,
        token_file: str | None,
        clock: Clock,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.http = httpx.AsyncClient(
            base_url=hermes_url,
            timeout=30.0,
            follow_redirects=False,
            trust_env=False,
            transport=transport or LeanTransport(max_body=MAX_HERMES_BODY_BYTES),
        )
        self.auth = HermesAuth(self.http, hermes_url=hermes_url, token_file=token_file, clock=clock)

    async def close(self) -> None:
        await self.http.aclose()

    async def get(self, target: str, *, max_bytes: int) -> RestReply:
        return await self.request("GET", target, max_bytes=max_bytes)

    async def request(
        self, method: str, target: str, *, max_bytes: int, body: bytes | None = None, timeout: float | None = None
    ) -> RestReply:
        """One request with the session token; a 401 re-authenticates once. Raises ``HermesUnavailable``
        (unreachable, or the token refused twice) and ``ReplyTooLarge``."""
        for attempt in range(2):
            headers = {"X-Hermes-Session-Token": await self.auth.token()}
            if body is not None:
                headers["Content-Type"] = "application/json"
            limit: float | httpx.Timeout = self.http.timeout if timeout is None else timeout
            try:
                async with self.http.stream(method, target, headers=headers, content=body, timeout=limit) as response:
                    if response.status_code == 401 and attempt == 0:
                        self.auth.invalidate()
                        continue
                    chunks, size = [], 0
                    async for chunk in response.aiter_bytes():
                        size += len(chunk)
                        if size > max_bytes:
                            raise ReplyTooLarge(target)
                        chunks.append(chunk)
                    return RestReply(response.status_code, dict(response.headers), b"".join(chunks))
            except httpx.HTTPError as exc:
                raise HermesUnavailable(f"Hermes is not reachable ({type(exc).__name__})") from exc
        raise HermesUnavailable("Hermes refused the session token twice")
