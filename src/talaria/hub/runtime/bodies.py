"""Strict parsing of Runtime API bodies and queries (lifecycle.md 6.4); any fault is 400
``invalid_request`` naming the field, never echoing its value."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

from talaria.canonical import canonical_json
from talaria.errors import TalariaError
from talaria.lifecycle.binding import FIELDS, Binding
from talaria.limits import (
    MAX_CANCEL_REASON_CHARS,
    MAX_PROGRESS_BYTES,
    MAX_WORKER_INSTANCE_CHARS,
)

_WORKER = re.compile(rf"^[A-Za-z0-9._:-]{{1,{MAX_WORKER_INSTANCE_CHARS}}}$")
_ERROR_CODE = re.compile(r"^[a-z0-9_.]{1,64}\Z")
_LEASE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")
_DIGEST = re.compile(r"^[0-9a-f]{64}\Z")


def bad(message: str) -> TalariaError:
    return TalariaError("invalid_request", message)


def json_object(raw: bytes, content_type: str | None) -> dict[str, Any]:
    if (content_type or "").split(";")[0].strip().lower() != "application/json":
        raise bad("Content-Type must be application/json")
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad("the body is not valid JSON") from exc
    if not isinstance(value, dict):
        raise bad("the body must be a JSON object")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def only_keys(body: Mapping[str, Any], required: set[str], optional: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    missing = sorted(required - set(body))
    if missing:
        raise bad(f"{missing[0]} is missing")
    extra = sorted(set(body) - required - optional)
    if extra:
        raise bad(f"{extra[0]} is not an accepted field")


def text(value: Any, name: str, *, max_chars: int, min_chars: int = 1) -> str:
    if not isinstance(value, str) or not min_chars <= len(value) <= max_chars:
        raise bad(f"{name} must be a string of {min_chars}-{max_chars} characters")
    return value


def integer(value: Any, name: str, *, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise bad(f"{name} must be an integer >= {minimum}")
    return value


def binding(body: Mapping[str, Any]) -> Binding:
    return Binding.parse(body["binding"])


def worker_instance(value: Any) -> str:
    if not isinstance(value, str) or not _WORKER.match(value):
        raise bad("worker_instance must be 1-128 characters of A-Z a-z 0-9 . _ : -")
    return value


def lease(body: Mapping[str, Any]) -> tuple[str, int]:
    lease_id = body["lease_id"]
    if not isinstance(lease_id, str) or not _LEASE_ID.match(lease_id):
        raise bad("lease_id must be an opaque id of 1-128 characters")
    return lease_id, integer(body["lease_epoch"], "lease_epoch")


def progress(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad("progress must be an object")
    if len(canonical_json(value)) > MAX_PROGRESS_BYTES:
        raise bad("progress must be at most 4 KiB of canonical JSON")
    return value


def result(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad("result must be an object")
    only_keys(value, {"outputs", "artifacts", "summary"})
    if not isinstance(value["outputs"], dict):
        raise bad("result.outputs must be an object")
    if not isinstance(value["artifacts"], list):
        raise bad("result.artifacts must be a list")
    for index, artifact in enumerate(value["artifacts"]):
        name = f"result.artifacts[{index}]"
        if not isinstance(artifact, dict):
            raise bad(f"{name} must be an object")
        only_keys(artifact, {"name", "digest", "size"})
        text(artifact["name"], f"{name}.name", max_chars=1024)
        if not isinstance(artifact["digest"], str) or not _DIGEST.match(artifact["digest"]):
            raise bad(f"{name}.digest must be 64 lowercase hex characters")
        integer(artifact["size"], f"{name}.size")
    if not isinstance(value["summary"], str):
        raise bad("result.summary must be a string")
    return value


def error(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad("error must be an object")
    only_keys(value, {"code", "message", "retryable"})
    if not isinstance(value["code"], str) or not _ERROR_CODE.match(value["code"]):
        raise bad("error.code must be 1-64 characters of a-z 0-9 _ .")
    if not isinstance(value["message"], str):
        raise bad("error.message must be a string")
    if not isinstance(value["retryable"], bool):
        raise bad("error.retryable must be a boolean")
    return value


def reason(value: Any) -> str:
    return text(value, "reason", max_chars=MAX_CANCEL_REASON_CHARS)


def query(raw: bytes, *, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, str]:
    """Each named parameter exactly once; no others."""
    try:
        pairs = parse_qsl(raw.decode("ascii"), keep_blank_values=True, strict_parsing=bool(raw))
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad("the query string is malformed") from exc
    out: dict[str, str] = {}
    for name, value in pairs:
        if name not in required and name not in optional:
            raise bad(f"{name} is not an accepted query parameter")
        if name in out:
            raise bad(f"{name} appears more than once")
        out[name] = value
    missing = [name for name in required if name not in out]
    if missing:
        raise bad(f"{missing[0]} is missing")
    return out


def binding_from_query(params: Mapping[str, str]) -> Binding:
    return Binding.parse({name: params[name] for name in FIELDS})
