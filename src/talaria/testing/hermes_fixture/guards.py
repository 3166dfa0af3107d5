"""Request guards of a loopback-bound Hermes (hermes.md 2 and 3): the session token, the Host header and the
WebSocket Origin; and the redaction that keeps credentials out of the request log.

The fixture is stricter than Hermes on Host and Origin: it accepts only ``127.0.0.1:<port>`` (Hermes also takes
``localhost`` and ``::1`` on any port, and non-web origins such as ``file://``), because the runner always names
the literal address.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

SESSION_HEADER = "x-hermes-session-token"
REDACTED = "<redacted>"

# The routes Hermes 0.19.0 serves without the session token.
PUBLIC_API_PATHS = frozenset(
    {
        "/api/status",
        "/api/config/defaults",
        "/api/config/schema",
        "/api/model/info",
        "/api/dashboard/themes",
        "/api/dashboard/plugins",
        "/api/cron/fire",
    }
)
# Routes that also take the token as ``?token=`` (download links opened outside the app).
QUERY_TOKEN_PATHS = frozenset({"/api/files/download"})

_SECRET_HEADERS = frozenset({SESSION_HEADER, "authorization", "cookie"})
_SECRET_QUERY = frozenset({"token", "ticket"})


def same_secret(given: str, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())


def rest_token_ok(path: str, headers: Mapping[str, str], query: Mapping[str, str], token: str) -> bool:
    """``X-Hermes-Session-Token``, the legacy ``Authorization: Bearer``, or ``?token=`` on the download route."""
    if same_secret(headers.get(SESSION_HEADER, ""), token):
        return True
    if same_secret(headers.get("authorization", ""), f"Bearer {token}"):
        return True
    return path in QUERY_TOKEN_PATHS and same_secret(query.get("token", ""), token)


def needs_token(path: str) -> bool:
    return path.startswith("/api/") and path not in PUBLIC_API_PATHS


def host_ok(host: str, port: int) -> bool:
    return host.strip().lower() == f"127.0.0.1:{port}"


def origin_ok(origin: str | None, port: int) -> bool:
    """An absent Origin passes; a present one must be exactly the server's origin."""
    return origin is None or origin.strip().lower() == f"http://127.0.0.1:{port}"


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): (REDACTED if k.lower() in _SECRET_HEADERS else v) for k, v in headers.items()}


def redact_query(query: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if k in _SECRET_QUERY else v) for k, v in query.items()}
