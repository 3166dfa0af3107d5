"""The runner's HTTP client to the hub's machine API (runner-protocol.md 4).

No redirects, 25 s per request, responses over 40 MiB refused, no Origin, no cookies; loopback hub
hosts are reached directly (proxy variables ignored, ``localhost`` as ``127.0.0.1``). Requests go
through the lean ``WireClient``; only a non-loopback hub behind a proxy from the environment
(``HTTPS_PROXY`` and friends, ``NO_PROXY`` honoured) goes through httpx, which speaks to proxies.

``hub_features`` is what the last poll answer's ``X-Hub-Features`` listed; a feature is used only while it is
listed. With ``failover-v1`` (scale.md 3.5) a poll's read timeout is 17 s (the 15 s hold + 2 s), and ``admit``,
``result``, ``event`` and ``tool`` posts failing by transport are sent again, the same body, after 0.25 s doubling
to 2 s (full jitter), until ``retry_window_s`` (20 s) after the first send. With a ``credential`` (rotate-v1,
operations.md 4.2) a 403 ``runner_unauthorized`` is sent once more with the token now in use, or with ``previous``.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from talaria.release import user_agent
from talaria.runner.credential import CredentialFile
from talaria.wire import WireClient, WireError, WireReply

REQUEST_TIMEOUT_S = 25.0
MAX_RESPONSE_BYTES = 40 * 1024 * 1024
FAILOVER = "failover-v1"
POLL_READ_TIMEOUT_S = 17.0  # with failover-v1: the hold (15 s) + 2 s
RETRY_WINDOW_S = 20.0
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 2.0
RETRIED_OPS = frozenset({"admit", "result", "event", "tool"})  # idempotent at the hub (scale.md 3.5)
TERMINAL_CODES = frozenset(
    {"runner_unauthorized", "runner_protocol_mismatch", "runner_instance_retired", "runner_instance_limit"}
)


class HubError(Exception):
    """A non-200 answer (``status``, ``code``) or a transport failure (status 0, code ``transport``)."""

    def __init__(self, status: int, code: str, message: str, epoch: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.epoch = epoch  # the epoch a post was sent under (None for a poll)

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
        self,
        method: str,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout: float | None = None,
    ) -> WireReply: ...

    async def aclose(self) -> None: ...


class ProxiedWire:
    """The hub behind a proxy named by the environment: httpx with ``trust_env``, same limits. It trusts the
    system's certificate store, as the direct path does (operations.md 6), never certifi's bundle, which a
    single-file runner would have to extract to read."""

    def __init__(self, base_url: str, tls: ssl.SSLContext | None = None) -> None:
        self.http = httpx.AsyncClient(
            base_url=base_url,
            timeout=REQUEST_TIMEOUT_S,
            follow_redirects=False,
            headers={"User-Agent": user_agent()},
            verify=tls or ssl.create_default_context(),
        )

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout: float | None = None,
    ) -> WireReply:
        try:
            limit = httpx.Timeout(timeout) if timeout is not None else httpx.USE_CLIENT_DEFAULT
            async with self.http.stream(method, target, headers=headers, content=body, timeout=limit) as response:
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


def hub_wire(server_url: str, runner_id: str, tls: ssl.SSLContext | None = None) -> Wire:
    """``tls``: how an https hub is verified on either path (default: the system's store; operations.md 6)."""
    url = f"{_direct_url(server_url).rstrip('/')}/api/runner/v1/{runner_id}"
    if uses_proxy(server_url):
        return ProxiedWire(url, tls)
    return WireClient(url, max_body=MAX_RESPONSE_BYTES, timeout=REQUEST_TIMEOUT_S, ssl_context=tls)


def retry_delays(first: float = RETRY_FIRST_S, most: float = RETRY_MAX_S) -> Callable[[], float]:
    """Successive pauses between attempts: full jitter over a ceiling from ``first`` doubling to ``most``."""
    ceiling = 0.0

    def pause() -> float:
        nonlocal ceiling
        ceiling = first if ceiling == 0 else min(most, ceiling * 2)
        return random.uniform(0, ceiling)  # noqa: S311 - jitter, not a secret

    return pause


class HubClient:
    def __init__(
        self, server_url: str, identity: Identity, *, wire: Wire | None = None, retry_window_s: float = RETRY_WINDOW_S,
        monotonic: Callable[[], float] = time.monotonic, delays: Callable[[], Callable[[], float]] = retry_delays,
        credential: CredentialFile | None = None, say: Callable[[str], None] = lambda line: None,
        tls: ssl.SSLContext | None = None,
    ) -> None:  # fmt: skip
        self.identity = identity
        self.credential = credential  # rotate-v1 (operations.md 4.2): the token in use is its token
        self._say = say
        self.wire = wire or hub_wire(server_url, identity.runner_id, tls)
        self.hub_features: frozenset[str] = frozenset()
        self.retry_window_s = retry_window_s
        self._monotonic = monotonic
        self._delays = delays
        self.retries = 0  # posts sent again after a transport failure

    @property
    def failover(self) -> bool:
        """True while the last poll answer listed ``failover-v1``."""
        return FAILOVER in self.hub_features

    async def close(self) -> None:
        await self.wire.aclose()

    def _headers(self, epoch: str | None) -> dict[str, str]:
        headers = {
            "X-Runner-Instance": self.identity.instance,
            "X-Runner-Protocol": "1",
        }
        if epoch is not None:
            headers["X-Runner-Epoch"] = epoch
        return headers

    def switch_token(self, token: str) -> None:
        """Use ``token`` from the next request on (a rotation wrote it to ``credential.json`` first)."""
        self.identity.token = token

    async def _send(
        self, method: str, op: str, headers: dict[str, str], body: Any = None, *, timeout: float | None = None
    ) -> tuple[Any, dict[str, str]]:
        """One request with the token in use. Operations.md 4.2: a 403 ``runner_unauthorized`` to a request sent
        with a token no longer in use is sent once more with the one in use; one to the token in use while
        ``previous`` is set is sent once more with ``previous``, which becomes the token if the hub accepts it."""
        token = self.identity.token
        try:
            answer = await self._attempt(method, op, headers, body, token, timeout)
        except HubError as exc:
            if exc.status != 403 or exc.code != "runner_unauthorized":
                raise
            if token != self.identity.token:
                token = self.identity.token
                answer = await self._attempt(method, op, headers, body, token, timeout)
            elif self.credential is not None and self.credential.previous is not None:
                previous = self.credential.previous
                answer = await self._attempt(method, op, headers, body, previous, timeout)
                await self._fell_back(previous)
                return answer
            else:
                raise
        if self.credential is not None and token == self.credential.token and self.credential.confirm():
            self._say("runner credential rotated")
        return answer

    async def _fell_back(self, previous: str) -> None:
        if self.credential is None or self.identity.token == previous:
            return
        self.identity.token = previous
        try:
            await asyncio.to_thread(self.credential.fall_back)
        except OSError as exc:
            self._say(f"runner credential restore failed: cannot write {self.credential.path}: {exc.strerror}; "
                      "the previous token is in use")  # fmt: skip
            return
        self._say("runner credential restored: the hub refused the new token and accepted the previous one")

    async def _attempt(
        self, method: str, op: str, headers: dict[str, str], body: Any, token: str, timeout: float | None
    ) -> tuple[Any, dict[str, str]]:
        headers = headers | {"Authorization": f"Bearer {token}"}
        content = json.dumps(body).encode() if body is not None else None
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            reply = await self.wire.request(method, f"/{op}", headers=headers, body=content, timeout=timeout)
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
        return data, reply.headers

    async def poll(self, *, reset: bool, features: list[str], draining: bool = False) -> dict[str, Any]:
        """``draining``: ``X-Runner-Draining: 1``, so the hub marks the state at once (operations.md 3.1)."""
        headers = self._headers(None) | {"X-Runner-Features": ",".join(features)}
        if reset:
            headers["X-Runner-Reset"] = "1"
        if draining:
            headers["X-Runner-Draining"] = "1"
        timeout = POLL_READ_TIMEOUT_S if self.failover else None
        data, answered = await self._send("GET", "poll", headers, timeout=timeout)
        echoed = answered.get("x-hub-features", "")
        self.hub_features = frozenset(name.strip() for name in echoed.split(",") if name.strip())
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("epoch"), str)
            or not isinstance(data.get("commands"), list)
        ):
            raise HubError(0, "transport", "the hub's poll answer is malformed")
        return data

    async def post(self, op: str, epoch: str, body: dict[str, Any]) -> Any:
        try:
            return await self._post(op, epoch, body)
        except HubError as exc:
            exc.epoch = epoch  # so a late failure of an ended connection is told from one of the current
            raise

    async def _post(self, op: str, epoch: str, body: dict[str, Any]) -> Any:
        if not (self.failover and op in RETRIED_OPS):
            return (await self._send("POST", op, self._headers(epoch), body))[0]
        ends = self._monotonic() + self.retry_window_s
        delays = self._delays()
        while True:
            try:
                return (await self._send("POST", op, self._headers(epoch), body))[0]
            except HubError as exc:
                pause = delays()
                if exc.status != 0 or self._monotonic() + pause >= ends:
                    raise
            self.retries += 1
            await asyncio.sleep(pause)
