"""Talaria's Hermes plugin as the runner calls it (runner-protocol.md 12.4, hermes.md 8): the capabilities
re-check before a grant's first bind, ``POST /api/plugins/talaria/bind`` and ``/unbind``.

``HermesRest`` offers GET only; the POSTs here reuse its client (no redirects, no proxies) and its
negotiated session token, with one re-authentication on 401 as ``HermesRest.get`` does. The bind body
carries the grant bearer: it goes to Hermes and nowhere else, and no error message here contains it.
"""

from __future__ import annotations

import json
from typing import Any, Final
from urllib.parse import urlencode

from talaria.hermes.auth import HermesUnavailable
from talaria.hermes.rest import HermesRest, ReplyTooLarge
from talaria.runner.errors import CommandError

CAPABILITIES: Final = "/api/plugins/talaria/capabilities"
BIND: Final = "/api/plugins/talaria/bind"
UNBIND: Final = "/api/plugins/talaria/unbind"
MAX_REPLY_BYTES: Final = 1024 * 1024  # a larger plugin reply -> team_tools_bind_failed / unavailable
BIND_TIMEOUT_S: Final = 65.0  # the plugin's 60 s binding budget; the hub's grant.bind deadline is 70 s
UNBIND_TIMEOUT_S: Final = 5.0  # unbind is best effort
CAPABILITIES_TIMEOUT_S: Final = 30.0
MAX_DETAIL_CHARS: Final = 300


def _unavailable(exc: Exception) -> CommandError:
    return CommandError("hermes_unavailable", str(exc))


async def post_json(
    rest: HermesRest, path: str, body: dict[str, Any], *, timeout: float
) -> tuple[int, dict[str, Any] | None]:
    """POST ``body`` to Hermes with the session token: (status, the JSON object answered or None).

    Raises HermesUnavailable (unreachable, or the token refused twice) and ReplyTooLarge.
    """
    reply = await rest.request(
        "POST", path, max_bytes=MAX_REPLY_BYTES, body=json.dumps(body).encode("utf-8"), timeout=timeout
    )
    try:
        parsed = json.loads(reply.body)
    except ValueError:
        parsed = None
    return reply.status, parsed if isinstance(parsed, dict) else None


async def check_capabilities(rest: HermesRest, profile: str) -> None:
    """Section 12.1's probe: 200 with ``version: 1`` and ``ready``, ``in_process``, ``native_tools`` all true,
    else ``team_tools_unavailable`` (``hermes_unavailable`` when Hermes cannot be reached)."""
    target = f"{CAPABILITIES}?{urlencode({'profile': profile})}"
    try:
        reply = await rest.get(target, max_bytes=MAX_REPLY_BYTES)
    except HermesUnavailable as exc:
        raise _unavailable(exc) from exc
    except ReplyTooLarge as exc:
        raise CommandError("team_tools_unavailable", "the plugin's capabilities reply is too large") from exc
    try:
        caps = json.loads(reply.body) if reply.status == 200 else None
    except ValueError:
        caps = None
    if not isinstance(caps, dict):
        raise CommandError("team_tools_unavailable", f"the Talaria plugin's capabilities answered {reply.status}")
    if not (caps.get("version") == 1 and all(caps.get(k) is True for k in ("ready", "in_process", "native_tools"))):
        missing = caps.get("missing")
        detail = f" (missing: {', '.join(map(str, missing))})" if isinstance(missing, list) and missing else ""
        raise CommandError("team_tools_unavailable", f"the Talaria plugin is not ready for team tools{detail}"[:1000])


async def bind(rest: HermesRest, body: dict[str, Any], *, first: bool) -> None:
    """POST ``/bind``: 200 with ``ok: true`` (else ``team_tools_bind_failed``) and, on the first bind,
    ``native_tools: true`` (else ``team_tools_unavailable``)."""
    try:
        status, answer = await post_json(rest, BIND, body, timeout=BIND_TIMEOUT_S)
    except HermesUnavailable as exc:
        raise _unavailable(exc) from exc
    except ReplyTooLarge as exc:
        raise CommandError("team_tools_bind_failed", "the plugin's bind reply is too large") from exc
    if status != 200 or answer is None or answer.get("ok") is not True:
        detail = _detail(status, answer)
        raise CommandError("team_tools_bind_failed", f"the Talaria plugin refused the binding: {detail}")
    if first and answer.get("native_tools") is not True:
        raise CommandError("team_tools_unavailable", "the Talaria plugin bound no native tools")


async def unbind(rest: HermesRest, session_id: str, generation: str) -> bool:
    """POST ``/unbind`` (idempotent); best effort: True if Hermes answered 200, never raises."""
    try:
        status, _ = await post_json(
            rest, UNBIND, {"session_id": session_id, "generation": generation}, timeout=UNBIND_TIMEOUT_S
        )
    except (HermesUnavailable, ReplyTooLarge):
        return False
    return status == 200


def _detail(status: int, answer: dict[str, Any] | None) -> str:
    if answer is None:
        return f"HTTP {status}"
    code, error = answer.get("code"), answer.get("error")
    text = f"HTTP {status}"
    if isinstance(code, str):
        text += f" {code}"
    if isinstance(error, str):
        text += f": {error}"
    return text[:MAX_DETAIL_CHARS]
