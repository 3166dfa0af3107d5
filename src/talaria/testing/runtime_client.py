"""A Runtime API client that signs its requests like the trusted proxy (lifecycle.md 6.2).

Used by the demo and the tests as "a signed worker". The secret stays in this object; it is never
printed or logged.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import httpx

from talaria.clock import Clock, SystemClock
from talaria.hub.runtime.identity import sign, signing_string

PREFIX = "/internal/runtime/v1/hermes"


class RuntimeClient:
    def __init__(
        self,
        base_url: str,
        secret: str,
        *,
        principal: str,
        roles: str = "runtime",
        tenant: str = "default",
        clock: Clock | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.secret = secret
        self.principal = principal
        self.roles = roles
        self.tenant = tenant
        self.clock = clock or SystemClock()
        self.http = httpx.Client(base_url=base_url, timeout=10.0, transport=transport)

    def close(self) -> None:
        self.http.close()

    def headers(self, method: str, target: str, body: bytes) -> dict[str, str]:
        timestamp = str(self.clock.now_ms() // 1000)
        message = signing_string(method, target, body, self.principal, self.roles, self.tenant, timestamp)
        return {
            "X-Talaria-Principal": self.principal,
            "X-Talaria-Roles": self.roles,
            "X-Talaria-Tenant": self.tenant,
            "X-Talaria-Proxy-Timestamp": timestamp,
            "X-Talaria-Proxy-Signature": sign(self.secret, message),
        }

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        key: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        target = PREFIX + path + (f"?{urlencode(query)}" if query else "")
        raw = json.dumps(body).encode() if body is not None else b""
        headers = self.headers(method, target, raw)
        if body is not None:
            headers["Content-Type"] = "application/json"
        if method == "POST":
            headers["Idempotency-Key"] = key or uuid.uuid4().hex
        headers.update(extra_headers or {})
        return self.http.request(method, target, content=raw, headers=headers)

    def binding(self, job: Mapping[str, Any]) -> dict[str, str]:
        """This worker's binding for a job listed by discovery (its principal filled in)."""
        return dict(job["binding"]) | {"principal": self.principal}

    def discover(self, cell: str, profile: str, state: str = "QUEUED") -> httpx.Response:
        return self.request(
            "GET", "/jobs", query={"tenant": self.tenant, "cell": cell, "profile": profile, "state": state}
        )

    def post(self, job: str, op: str, body: Mapping[str, Any], key: str | None = None) -> httpx.Response:
        return self.request("POST", f"/jobs/{job}/{op}", body=body, key=key)

    def status(self, job: str, binding: Mapping[str, str]) -> httpx.Response:
        return self.request("GET", f"/jobs/{job}", query=dict(binding))
