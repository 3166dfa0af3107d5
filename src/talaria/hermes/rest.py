"""Read-only REST calls to Hermes with the negotiated credential (hermes.md 5)."""

from __future__ import annotations

from dataclasses import dataclass

from talaria.clock import Clock
from talaria.hermes.auth import HermesAuth, HermesUnavailable
from talaria.wire import WireClient, WireError

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
        credentials: tuple[str, str] | None = None,
        wire: WireClient | None = None,
    ) -> None:
        self.http = wire or WireClient(hermes_url, max_body=MAX_HERMES_BODY_BYTES, timeout=30.0)
        self.auth = HermesAuth(
            self.http, hermes_url=hermes_url, token_file=token_file, clock=clock, credentials=credentials
        )

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
            headers = await self.auth.headers()
            if body is not None:
                headers["Content-Type"] = "application/json"
            try:
                reply = await self.http.request(
                    method, target, headers=headers, body=body, timeout=timeout, max_body=max_bytes
                )
            except WireError as exc:
                if exc.kind == "too_large":
                    raise ReplyTooLarge(target) from exc
                raise HermesUnavailable(f"Hermes is not reachable ({exc})") from exc
            if reply.status == 401 and attempt == 0:
                self.auth.invalidate()
                continue
            return RestReply(reply.status, reply.headers, reply.body)
        raise HermesUnavailable("Hermes refused the runner's credential twice")
