"""Runner registration (runner-protocol.md 2): records, one-time tokens, the runner.json offered once.

The token is 32 random bytes, base64url without padding; only its SHA-256 is stored and compared in
constant time. It appears in exactly one answer: the registration's.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from talaria.canonical import sha256_hex
from talaria.clock import Clock
from talaria.errors import TalariaError
from talaria.runner_json import (
    DEFAULT_HERMES_URL,
    MAX_ALLOWED_PROFILES,
    MAX_ARTIFACT_ROOTS,
    MAX_PROFILE_CHARS,
    ConfigError,
    check_allowed_profiles,
    check_artifact_roots,
    check_hermes_url,
    check_server_url,
)
from talaria.store.interface import Row, Store
from talaria.text_rules import ONE_LINE_PATTERN, TextRefused, one_line

SOURCE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")  # $: a JSON Schema pattern too; fullmatch only
log = structlog.get_logger("talaria.runners")
_FIELDS = ("name", "source", "allowedProfiles", "serverURL", "hermesURL", "artifactRoots", "allowInsecureLan")
_URL = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\s/?#@\\]+/?$"
# The body ``parse_registration`` accepts, as the OpenAPI document shows it (ADR 0029).
REGISTRATION_BODY: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "allowedProfiles"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 100, "pattern": ONE_LINE_PATTERN},
        "source": {"type": "string", "pattern": SOURCE.pattern, "default": "local"},
        "allowedProfiles": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_ALLOWED_PROFILES,
            "items": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_PROFILE_CHARS,
                "pattern": r"^[^/\\\u0000-\u001f\u007f-\u009f]+$",
            },
        },
        "serverURL": {
            "type": "string",
            "pattern": _URL,
            "description": "the hub's origin as the runner reaches it; http only on loopback unless allowInsecureLan "
            "(default hub.public_url)",
        },
        "hermesURL": {
            "type": "string",
            "pattern": _URL,
            "description": "Hermes on the node, on the literal host 127.0.0.1 or [::1]",
            "default": DEFAULT_HERMES_URL,
        },
        "artifactRoots": {
            "type": "array",
            "maxItems": MAX_ARTIFACT_ROOTS,
            "items": {"type": "string", "pattern": r"^/[^\u0000]*$"},
        },
        "allowInsecureLan": {"type": "boolean", "default": False},
    },
}


@dataclass(frozen=True)
class RunnerRecord:
    id: str
    tenant: str
    name: str
    source: str
    allowed_profiles: tuple[str, ...]
    token_hash: str
    enabled: bool
    created_at: int
    server_url: str
    hermes_url: str
    artifact_roots: tuple[str, ...]
    allow_insecure_lan: bool
    drain_requested_at: int | None = None  # `talaria admin runners drain` on SQLite (operations.md 3.1)
    # credential rotation (operations.md 4.1); a record older than rotation counts its token from created_at
    token_issued_at: int | None = None
    token_next_hash: str | None = None
    token_next_issued_at: int | None = None
    token_next_replaced_at: int | None = None
    rotate_requested_at: int | None = None

    @classmethod
    def from_row(cls, row: Row) -> RunnerRecord:
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            name=row["name"],
            source=row["source"],
            allowed_profiles=tuple(json.loads(row["allowed_profiles"])),
            token_hash=row["token_hash"],
            enabled=bool(row["enabled"]),
            created_at=int(row["created_at"]),
            server_url=row["server_url"],
            hermes_url=row["hermes_url"],
            artifact_roots=tuple(json.loads(row["artifact_roots"])),
            allow_insecure_lan=bool(row["allow_insecure_lan"]),
            drain_requested_at=row.get("drain_requested_at"),
            token_issued_at=row.get("token_issued_at"),
            token_next_hash=row.get("token_next_hash"),
            token_next_issued_at=row.get("token_next_issued_at"),
            token_next_replaced_at=row.get("token_next_replaced_at"),
            rotate_requested_at=row.get("rotate_requested_at"),
        )

    @property
    def token_issued(self) -> int:
        """When the current token was issued (``tokenIssuedAt``)."""
        return self.token_issued_at if self.token_issued_at is not None else self.created_at

    def next_live(self, now: int, overlap_ms: int) -> bool:
        """An unused next token was issued less than ``runners.token_overlap_s`` ago."""
        issued = self.token_next_issued_at
        return self.token_next_hash is not None and issued is not None and now - issued < overlap_ms

    def presented(self, token: str, *, now: int, overlap_ms: int) -> str | None:
        """Gate 1 (operations.md 4.1): ``current``, ``next`` (an unused next token not yet dropped) or None. Both
        hashes are compared in constant time whatever the first gave."""
        digest = sha256_hex(token)
        current = hmac.compare_digest(digest, self.token_hash)
        following = hmac.compare_digest(digest, self.token_next_hash or "")
        if current:
            return "current"
        return "next" if following and self.next_live(now, overlap_ms) else None

    def rotation_due(self, now: int, rotate_after_ms: int) -> bool:
        """An admin asked, or ``runners.token_rotate_after_s`` (``rotate_after_ms`` > 0) has passed since issue."""
        return self.rotate_requested_at is not None or (0 < rotate_after_ms <= now - self.token_issued)

    def rotation_json(self, now: int, *, overlap_ms: int, rotate_after_ms: int) -> dict[str, Any]:
        """What the node's row shows of rotation (never a hash): the token's age, whether a rotation is pending
        (asked for, due by age, or a next token issued and unused), and when an unused next was last replaced."""
        pending = self.rotation_due(now, rotate_after_ms) or self.next_live(now, overlap_ms)
        return {
            "tokenIssuedAt": self.token_issued,
            "rotationPending": self.enabled and pending,
            "tokenNextReplacedAt": self.token_next_replaced_at,
        }

    def record_json(self) -> dict[str, Any]:
        """The stored record without ``tokenHash``."""
        return {
            "id": self.id,
            "tenant": self.tenant,
            "name": self.name,
            "source": self.source,
            "allowedProfiles": list(self.allowed_profiles),
            "enabled": self.enabled,
            "createdAt": self.created_at,
        }


@dataclass(frozen=True)
class Registration:
    runner: RunnerRecord
    token: str
    config: dict[str, Any]


def _bad(field: str, message: str) -> TalariaError:
    code = "invalid_assigned_profiles" if field == "allowedProfiles" else "invalid_runner_config"
    return TalariaError(code, f"{field}: {message}")


def parse_registration(body: Any, *, default_server_url: str) -> dict[str, Any]:
    """Strict registration body; the first failing field is named (section 3's order after name, source)."""
    if not isinstance(body, dict):
        raise TalariaError("invalid_request", "the body must be a JSON object")
    unknown = [key for key in body if key not in _FIELDS]
    if unknown:
        raise TalariaError("invalid_runner_config", f"{unknown[0]}: not an accepted field")
    name = body.get("name")
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 100:
        raise _bad("name", "must be 1-100 characters")
    try:
        name = one_line("name", name)
    except TextRefused as exc:
        raise _bad("name", str(exc).removeprefix("name ")) from None
    source = body.get("source", "local")
    if not isinstance(source, str) or not SOURCE.fullmatch(source):
        raise _bad("source", "must match ^[a-z0-9][a-z0-9._-]{0,63}$")
    insecure = body.get("allowInsecureLan", False)
    try:
        # Section 3's order: serverURL (judged as if allowInsecureLan were true only when it is), then
        # hermesURL, allowedProfiles, artifactRoots, and allowInsecureLan's own type last.
        server_url = check_server_url(body.get("serverURL", default_server_url), insecure is True)
        hermes_url = check_hermes_url(body.get("hermesURL", DEFAULT_HERMES_URL))
    except ConfigError as exc:
        raise _bad(exc.field, exc.message) from exc
    profiles = body.get("allowedProfiles")
    if isinstance(profiles, list):
        profiles = list(dict.fromkeys(profiles)) if all(isinstance(p, str) for p in profiles) else profiles
    try:
        allowed = check_allowed_profiles(profiles)
    except ConfigError as exc:
        raise _bad("allowedProfiles", exc.message) from exc
    try:
        roots = check_artifact_roots(body.get("artifactRoots", []))
    except ConfigError as exc:
        raise _bad("artifactRoots", exc.message) from exc
    if not isinstance(insecure, bool):
        raise _bad("allowInsecureLan", "must be a boolean")
    return {
        "name": name.strip(),
        "source": source,
        "allowed_profiles": allowed,
        "server_url": server_url,
        "hermes_url": hermes_url,
        "artifact_roots": roots,
        "allow_insecure_lan": insecure,
    }


class RunnerRegistry:
    def __init__(self, store: Store, clock: Clock, *, on_rotated: Callable[[], None] | None = None) -> None:
        """``on_rotated`` is called once per token promoted (the hub's metrics)."""
        self.store = store
        self.clock = clock
        self.on_rotated = on_rotated or (lambda: None)

    def register(self, tenant: str, fields: dict[str, Any]) -> Registration:
        """Create a runner; 409 ``runner_source_in_use`` when the source has an enabled runner."""
        runner_id = str(uuid.uuid4())
        token = secrets.token_urlsafe(32)
        with self.store.write() as tx:
            now = self.clock.now_ms()
            if tx.one("runner_enabled_for_source", tenant=tenant, source=fields["source"]) is not None:
                raise TalariaError("runner_source_in_use", f"source {fields['source']} already has an enabled runner")
            tx.run("tenant_ensure", name=tenant, now=now)
            tx.run("source_ensure", tenant=tenant, name=fields["source"], now=now)
            made = tx.one(
                "runner_insert",
                id=runner_id,
                tenant=tenant,
                name=fields["name"],
                source=fields["source"],
                allowed_profiles=json.dumps(list(fields["allowed_profiles"])),
                token_hash=sha256_hex(token),
                server_url=fields["server_url"],
                hermes_url=fields["hermes_url"],
                artifact_roots=json.dumps(list(fields["artifact_roots"])),
                allow_insecure_lan=int(fields["allow_insecure_lan"]),
                now=now,
            )
            if made is None:  # registered meanwhile by another hub replica
                raise TalariaError("runner_source_in_use", f"source {fields['source']} already has an enabled runner")
            row = tx.one("runner_get", id=runner_id)
        assert row is not None
        record = RunnerRecord.from_row(row)
        config: dict[str, Any] = {
            "protocol": 1,
            "serverURL": record.server_url,
            "runnerId": record.id,
            "token": token,
            "hermesURL": record.hermes_url,
            "allowedProfiles": list(record.allowed_profiles),
            "artifactRoots": list(record.artifact_roots),
        }
        if record.allow_insecure_lan:
            config["allowInsecureLan"] = True
        return Registration(record, token, config)

    def get(self, runner_id: str) -> RunnerRecord | None:
        with self.store.read() as tx:
            row = tx.one("runner_get", id=runner_id)
        return RunnerRecord.from_row(row) if row else None

    def request_drain(self, runner_id: str, tenant: str, now: int) -> bool:
        """Record a drain request for the hub to apply at the runner's next request (the command line on SQLite,
        which cannot reach the hub's memory; operations.md 3.1). False: no enabled runner of that id."""
        with self.store.write() as tx:
            return tx.run("runner_drain_request", id=runner_id, tenant=tenant, now=now) == 1

    def clear_drain_request(self, runner_id: str, requested_at: int) -> None:
        """The request was applied or dropped (a newer request stays)."""
        with self.store.write() as tx:
            tx.run("runner_drain_request_clear", id=runner_id, requested_at=requested_at)

    def request_rotation(self, runner_id: str, tenant: str) -> bool:
        """An admin asks the runner to rotate its token (operations.md 4.1); False: no enabled runner of that id in
        the tenant. Repeating it changes nothing."""
        with self.store.write() as tx:
            return tx.run("runner_rotate_request", id=runner_id, tenant=tenant, now=self.clock.now_ms()) == 1

    def issue_next(self, runner_id: str, overlap_ms: int) -> tuple[str, int, bool] | None:
        """The rotate op: a fresh token made as at registration, its hash stored as the next one. Returns the
        token, its issue time and whether it replaced an unused next (None: the runner is disabled)."""
        token = secrets.token_urlsafe(32)
        with self.store.write() as tx:
            now = self.clock.now_ms()
            row = tx.one("runner_token_next_set", id=runner_id, next_hash=sha256_hex(token), now=now,
                         expired_before=now - overlap_ms)  # fmt: skip
        if row is None:
            return None
        return token, now, row["token_next_replaced_at"] == now

    def promote(self, runner_id: str, token: str) -> RunnerRecord | None:
        """The first request with the next token makes it current (one conditional update). A request whose update
        finds it promoted already (another replica won) passes too; None: neither current nor next any more."""
        digest = sha256_hex(token)
        with self.store.write() as tx:
            promoted = tx.one("runner_token_promote", id=runner_id, next_hash=digest, now=self.clock.now_ms())
            row = tx.one("runner_get", id=runner_id)
        record = RunnerRecord.from_row(row) if row else None
        if record is None or not record.enabled or not hmac.compare_digest(digest, record.token_hash):
            return None
        if promoted is not None:
            log.info("runner_token_rotated", runner_id=runner_id)
            self.on_rotated()
        return record

    def all(self, tenant: str) -> list[RunnerRecord]:
        with self.store.read() as tx:
            return [RunnerRecord.from_row(r) for r in tx.all("runner_list", tenant=tenant)]

    def for_source(self, tenant: str, source: str) -> RunnerRecord | None:
        with self.store.read() as tx:
            row = tx.one("runner_enabled_for_source", tenant=tenant, source=source)
        return RunnerRecord.from_row(row) if row else None

    def sources(self, tenant: str) -> list[str]:
        with self.store.read() as tx:
            return [row["name"] for row in tx.all("source_list", tenant=tenant)]

    def disable(self, runner_id: str, tenant: str | None = None) -> bool:
        """Disable for good; False when no such runner (of this tenant). Idempotent."""
        with self.store.write() as tx:
            row = tx.one("runner_get", id=runner_id)
            if row is None or (tenant is not None and row["tenant"] != tenant):
                return False
            tx.run("runner_disable", id=runner_id, now=self.clock.now_ms())
        return True
