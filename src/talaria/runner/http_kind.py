"""The ``http`` command: read-only Hermes REST inside the allow-list (runner-protocol.md 7.1, 11)."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from talaria.hermes.rest import HermesRest, ReplyTooLarge
from talaria.runner.errors import CommandError

MAX_REPLY_BYTES = 8 * 1024 * 1024
_FIXED = frozenset(
    {"/api/status", "/api/profiles", "/api/config", "/api/files/download", "/api/plugins/talaria/capabilities"}
)
_MESSAGES = re.compile(r"^/api/sessions/([^/]+)/messages\Z")
_NO_PROFILE_CHECK = frozenset({"/api/status", "/api/profiles"})
_KEPT_HEADERS = ("content-type", "content-length", "content-disposition")


def _forbidden() -> CommandError:
    return CommandError("runner_http_forbidden", "this request is not on the runner's read-only allow-list")


def check_payload(payload: Any) -> tuple[str, list[tuple[str, str]]]:
    """The path and query pairs of an allowed request; raises ``runner_command_forbidden`` or
    ``runner_http_forbidden``."""
    if not isinstance(payload, dict) or not set(payload) <= {"path", "method", "search", "body"}:
        raise CommandError("runner_command_forbidden", "malformed http payload")
    path, method, search = payload.get("path"), payload.get("method"), payload.get("search", "")
    if not isinstance(path, str) or not isinstance(search, str) or "body" in payload or method != "GET":
        raise _forbidden()
    if search and not search.startswith("?"):
        raise _forbidden()
    if ".." in path or "%" in path or "\\" in path or "//" in path:
        raise _forbidden()
    if path not in _FIXED and not _MESSAGES.match(path):
        raise _forbidden()
    pairs = [(k, v) for k, v in parse_qsl(search[1:], keep_blank_values=True) if k not in ("token", "ticket")]
    return path, pairs


async def run_http(
    payload: Any,
    *,
    rest: HermesRest,
    allowed_profiles: tuple[str, ...],
    artifact_roots: tuple[str, ...],
    session_profile: Callable[[str], str | None],
) -> dict[str, Any]:
    path, pairs = check_payload(payload)
    query = dict(pairs)
    checked = path not in _NO_PROFILE_CHECK and path != "/api/files/download"
    if checked and query.get("profile", "default") not in allowed_profiles:
        raise CommandError("runner_profile_forbidden", "this profile is not allowed on this node")
    match = _MESSAGES.match(path)
    if match:
        stored = match.group(1)
        if session_profile(stored) != query.get("profile", "default"):
            raise CommandError("runner_session_forbidden", "this session was not opened through this runner")
    if path == "/api/files/download":
        pairs = [("path", export_path(query.get("path"), artifact_roots))]
    target = path + (f"?{urlencode(pairs)}" if pairs else "")
    try:
        reply = await rest.get(target, max_bytes=MAX_REPLY_BYTES)
    except ReplyTooLarge as exc:
        raise CommandError("runner_payload_limit", "Hermes' reply is larger than 8 MiB") from exc
    headers = {name: reply.headers[name] for name in _KEPT_HEADERS if name in reply.headers}
    return {"status": reply.status, "headers": headers, "body": base64.b64encode(reply.body).decode()}


def export_path(path: str | None, roots: tuple[str, ...]) -> str:
    """The real path of ``path`` when it lies in an artifact root (11.3), else ``runner_artifact_forbidden``."""
    refused = CommandError("runner_artifact_forbidden", "this path is outside the node's artifact roots")
    if not path or not roots or not os.path.isabs(path):
        raise refused
    try:
        real = os.path.realpath(path, strict=True)
    except OSError as exc:
        raise refused from exc
    for root in roots:
        try:
            real_root = os.path.realpath(root, strict=True)
        except OSError:
            continue
        if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
            return real
    raise refused
