"""The payloads of ``grant.create``, ``grant.bind`` and ``grant.close`` (runner-protocol.md 7.5-7.7).

Strict shapes: a missing, extra or mistyped key gives ``runner_command_forbidden`` (section 7). Ids and the work
id are strings of 1-256 characters; the catalog is checked by ``grant_tools.check_catalog``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from talaria.runner.errors import CommandError
from talaria.runner.grant_tools import check_catalog

MAX_TEXT_CHARS: Final = 256  # workId, runtimeId, storedId; longer -> runner_command_forbidden


def forbidden(message: str = "malformed grant payload") -> CommandError:
    return CommandError("runner_command_forbidden", message)


def expired(message: str = "the grant is closed or expired") -> CommandError:
    return CommandError("runner_grant_expired", message)


@dataclass(frozen=True)
class CreatePayload:
    grant_id: str
    profile: str
    work_id: str
    runtime_id: str
    stored_id: str
    catalog: list[dict[str, Any]]


def _text(value: Any) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= MAX_TEXT_CHARS


def _session(value: Any) -> tuple[str, str]:
    if not isinstance(value, dict) or set(value) != {"runtimeId", "storedId"}:
        raise forbidden("session must be exactly {runtimeId, storedId}")
    if not _text(value["runtimeId"]) or not _text(value["storedId"]):
        raise forbidden("session ids must be strings of 1-256 characters")
    return value["runtimeId"], value["storedId"]


def _payload(command: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    payload = command.get("payload")
    if not isinstance(payload, dict) or set(payload) != keys:
        raise forbidden(f"the payload must be exactly {{{', '.join(sorted(keys))}}}")
    if not isinstance(payload["grantId"], str):
        raise forbidden("grantId must be a string")
    return payload


def parse_create(command: dict[str, Any]) -> CreatePayload:
    """``{grantId, profile, workId, session: {runtimeId, storedId}, catalog}``."""
    payload = _payload(command, {"grantId", "profile", "workId", "session", "catalog"})
    if not isinstance(payload["profile"], str) or not _text(payload["workId"]):
        raise forbidden("profile and workId must be strings")
    runtime_id, stored_id = _session(payload["session"])
    try:
        catalog = check_catalog(payload["catalog"])
    except ValueError as exc:
        raise forbidden(str(exc)) from exc
    return CreatePayload(payload["grantId"], payload["profile"], payload["workId"], runtime_id, stored_id, catalog)


def parse_bind(command: dict[str, Any]) -> tuple[str, str, str]:
    """``{grantId, session: {runtimeId, storedId}}`` -> (grant id, runtime id, stored id)."""
    payload = _payload(command, {"grantId", "session"})
    runtime_id, stored_id = _session(payload["session"])
    return payload["grantId"], runtime_id, stored_id


def parse_close(command: dict[str, Any]) -> str:
    """``{grantId}`` -> the grant id."""
    grant_id: str = _payload(command, {"grantId"})["grantId"]
    return grant_id
