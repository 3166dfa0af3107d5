"""Trusted-proxy identity (lifecycle.md 6.1, 6.2): loopback peers, five signed headers.

The signature covers ``METHOD\\nTARGET\\nsha256(body)\\nprincipal\\nroles\\ntenant\\ntimestamp`` with
the raw request target as sent. Comparison is constant-time; the secret and signatures never
appear in errors or logs.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from talaria.errors import TalariaError
from talaria.lifecycle.actor import PLATFORM_ADMIN, RUNTIME
from talaria.limits import MAX_PROXY_SKEW_S

ACCEPTED_ROLES = frozenset({RUNTIME, PLATFORM_ADMIN})
_IDENT = re.compile(r"^[A-Za-z0-9._:@/-]{1,256}\Z")
_TIMESTAMP = re.compile(r"^[0-9]{1,20}\Z")
_SIGNATURE = re.compile(r"^[0-9a-f]{64}\Z")
HEADERS = (
    "x-talaria-principal",
    "x-talaria-roles",
    "x-talaria-tenant",
    "x-talaria-proxy-timestamp",
    "x-talaria-proxy-signature",
)


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@dataclass(frozen=True)
class ProxyIdentity:
    principal: str
    roles: frozenset[str]
    tenant: str


def signing_string(
    method: str, target: str, body: bytes, principal: str, roles: str, tenant: str, timestamp: str
) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join([method.upper(), target, digest, principal, roles, tenant, timestamp]).encode("utf-8")


def sign(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def parse_roles(value: str) -> frozenset[str]:
    items = (item.strip(" \t") for item in value.split(","))
    return frozenset(item for item in items if item in ACCEPTED_ROLES)


def verify(
    raw_headers: Sequence[tuple[bytes, bytes]],
    *,
    method: str,
    target: str,
    body: bytes,
    secret: str,
    now_s: float,
) -> ProxyIdentity:
    """Raise 401 with the first failing check (missing, invalid, skew, signature), else the identity."""
    values: dict[str, list[str]] = {name: [] for name in HEADERS}
    for name, value in raw_headers:
        key = name.decode("latin-1").lower()
        if key in values:
            values[key].append(value.decode("latin-1"))
    if any(not values[name] for name in HEADERS):
        raise TalariaError("proxy_identity_missing", "trusted-proxy identity headers are missing")
    if any(len(values[name]) != 1 for name in HEADERS):
        raise TalariaError("proxy_identity_invalid", "an identity header appears more than once")
    principal, roles, tenant, timestamp, signature = (values[name][0] for name in HEADERS)
    if not _IDENT.match(principal) or not _IDENT.match(tenant):
        raise TalariaError("proxy_identity_invalid", "principal or tenant has an invalid syntax")
    if not _TIMESTAMP.match(timestamp) or not _SIGNATURE.match(signature):
        raise TalariaError("proxy_identity_invalid", "timestamp or signature has an invalid syntax")
    if any((ord(ch) < 0x20 and ch != "\t") or ord(ch) > 0x7E for ch in roles):
        raise TalariaError("proxy_identity_invalid", "roles has an invalid syntax")
    if abs(now_s - int(timestamp)) > MAX_PROXY_SKEW_S:
        raise TalariaError("proxy_timestamp_skew", "the proxy timestamp is more than 60 s off")
    expected = sign(secret, signing_string(method, target, body, principal, roles, tenant, timestamp))
    if not hmac.compare_digest(expected, signature):
        raise TalariaError("proxy_signature_invalid", "the proxy signature does not verify")
    return ProxyIdentity(principal, parse_roles(roles), tenant)
