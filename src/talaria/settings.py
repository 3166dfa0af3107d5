"""Hub settings (lifecycle.md 1.1): flags, then environment, then a TOML file, then defaults.

Every key ``a.b`` can be set by ``TALARIA_A_B``. Settings are read at the edges (the CLI and tests)
and passed to the app factory as one frozen ``Settings`` object; nothing reads them globally.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from talaria.errors import SettingsError
from talaria.limits import MIN_PROXY_SECRET_BYTES


@dataclass(frozen=True)
class ProfileOverride:
    max_lease_life_s: int | None = None
    max_attempts: int | None = None


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path("./talaria-data")
    hub_host: str = "127.0.0.1"
    hub_port: int = 8700
    hub_public_url: str = ""
    hub_trusted_proxies: tuple[str, ...] = ()
    hub_tls_cert: str = ""  # operations.md 6: PEM certificate chain; with hub_tls_key the port speaks only TLS
    hub_tls_key: str = ""
    hub_drain_timeout_s: int = 120  # operations.md 3.4: how long SIGTERM waits for running turns (0: not at all)
    # ADR 0063: how long a client may take to send a request's headers, and then its body (408 request_timeout)
    hub_request_header_timeout_s: int = 10
    hub_request_body_timeout_s: int = 120
    # ADR 0066: how long an answer may stay backed up (the client takes none of it) before the connection is aborted
    hub_response_write_timeout_s: int = 60
    # operations.md 4.1: rotate runner tokens older than this (0: only when an admin asks), and how long an unused
    # next token stays valid
    runners_token_rotate_after_s: int = 0
    runners_token_overlap_s: int = 86400
    runtime_api_enabled: bool = False
    runtime_api_proxy_secret: str = field(default="", repr=False)
    runtime_api_allow_remote_proxy: bool = False
    approval_allow_self_approval: bool = False
    lifecycle_lease_ttl_s: int = 30
    lifecycle_heartbeat_interval_s: int = 10
    lifecycle_reaper_interval_s: int = 5
    lifecycle_max_lease_life_s: int = 3600
    lifecycle_max_attempts: int = 3
    lifecycle_idempotency_retention_s: int = 86400
    lifecycle_dispatcher_principal: str = "talaria-hub"
    security_event_rate_per_minute: int = 60
    database_url: str = field(default="", repr=False)  # may carry a password
    # scale.md 2.1: PostgreSQL only
    database_pool_min: int = 2
    database_pool_max: int = 10
    database_pool_timeout_ms: int = 5000
    database_statement_timeout_ms: int = 15000
    database_listen: bool = True
    database_wake_fallback_ms: int = 1000
    database_max_clock_skew_ms: int = 2000
    audit_seal_interval_ms: int = 200
    storage_sqlite_busy_timeout_ms: int = 5000
    storage_sqlite_wal_limit_bytes: int = 67_108_864
    metrics_public: bool = False
    dispatcher_enabled: bool = True
    dispatcher_per_runner: int = 2
    dispatcher_per_hub: int = 16
    turns_max_turn_s: int = 0  # 0: the profile's max_lease_life_s
    # chat.md 7: live chat turns per account and per hub, running ones per runner, and its waits
    chat_per_account: int = 8
    chat_per_hub: int = 256
    chat_per_runner: int = 32
    chat_pending_wait_s: int = 300
    chat_recovery_wait_s: int = 600
    chat_turn_max_s: int = 1800
    chat_channel_idle_s: int = 30
    profiles: Mapping[str, ProfileOverride] = field(default_factory=dict)

    @property
    def public_url(self) -> str:
        """``hub.public_url``, defaulting to ``http://<host>:<port>`` (``https://`` with TLS)."""
        if self.hub_public_url:
            return self.hub_public_url.rstrip("/")
        host = f"[{self.hub_host}]" if ":" in self.hub_host else self.hub_host
        return f"{'https' if self.tls else 'http'}://{host}:{self.hub_port}"

    @property
    def token_rotate_after_ms(self) -> int:
        """``runners.token_rotate_after_s`` in milliseconds (0: only when an admin asks; operations.md 4.1)."""
        return self.runners_token_rotate_after_s * 1000

    @property
    def token_overlap_ms(self) -> int:
        """``runners.token_overlap_s`` in milliseconds: how long an unused next token stays valid."""
        return self.runners_token_overlap_s * 1000

    @property
    def tls(self) -> bool:
        """The hub serves TLS itself (operations.md 6)."""
        return bool(self.hub_tls_cert and self.hub_tls_key)

    @property
    def public_origin(self) -> str:
        parts = urlsplit(self.public_url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "talaria.sqlite3"

    def max_attempts_for(self, cell: str, profile: str) -> int:
        override = self.profiles.get(f"{cell}/{profile}")
        if override and override.max_attempts is not None:
            return override.max_attempts
        return self.lifecycle_max_attempts

    def max_life_for(self, cell: str, profile: str) -> int:
        override = self.profiles.get(f"{cell}/{profile}")
        if override and override.max_lease_life_s is not None:
            return override.max_lease_life_s
        return self.lifecycle_max_lease_life_s

    def max_turn_for(self, cell: str, profile: str) -> int:
        """``turns.max_turn_s``, defaulting to the profile's ``max_lease_life_s``."""
        return self.turns_max_turn_s or self.max_life_for(cell, profile)


# dotted key -> (Settings attribute, kind)
KEYS: dict[str, tuple[str, type]] = {
    "data_dir": ("data_dir", Path),
    "hub.host": ("hub_host", str),
    "hub.port": ("hub_port", int),
    "hub.public_url": ("hub_public_url", str),
    "hub.trusted_proxies": ("hub_trusted_proxies", tuple),
    "hub.drain_timeout_s": ("hub_drain_timeout_s", int),
    "hub.request_header_timeout_s": ("hub_request_header_timeout_s", int),
    "hub.request_body_timeout_s": ("hub_request_body_timeout_s", int),
    "hub.response_write_timeout_s": ("hub_response_write_timeout_s", int),
    "hub.tls_cert": ("hub_tls_cert", str),
    "hub.tls_key": ("hub_tls_key", str),
    "runners.token_rotate_after_s": ("runners_token_rotate_after_s", int),
    "runners.token_overlap_s": ("runners_token_overlap_s", int),
    "runtime_api.enabled": ("runtime_api_enabled", bool),
    "runtime_api.proxy_secret": ("runtime_api_proxy_secret", str),
    "runtime_api.allow_remote_proxy": ("runtime_api_allow_remote_proxy", bool),
    "approval.allow_self_approval": ("approval_allow_self_approval", bool),
    "lifecycle.lease_ttl_s": ("lifecycle_lease_ttl_s", int),
    "lifecycle.heartbeat_interval_s": ("lifecycle_heartbeat_interval_s", int),
    "lifecycle.reaper_interval_s": ("lifecycle_reaper_interval_s", int),
    "lifecycle.max_lease_life_s": ("lifecycle_max_lease_life_s", int),
    "lifecycle.max_attempts": ("lifecycle_max_attempts", int),
    "lifecycle.idempotency_retention_s": ("lifecycle_idempotency_retention_s", int),
    "lifecycle.dispatcher_principal": ("lifecycle_dispatcher_principal", str),
    "security.event_rate_per_minute": ("security_event_rate_per_minute", int),
    "database.url": ("database_url", str),
    "database.pool_min": ("database_pool_min", int),
    "database.pool_max": ("database_pool_max", int),
    "database.pool_timeout_ms": ("database_pool_timeout_ms", int),
    "database.statement_timeout_ms": ("database_statement_timeout_ms", int),
    "database.listen": ("database_listen", bool),
    "database.wake_fallback_ms": ("database_wake_fallback_ms", int),
    "database.max_clock_skew_ms": ("database_max_clock_skew_ms", int),
    "audit.seal_interval_ms": ("audit_seal_interval_ms", int),
    "storage.sqlite_busy_timeout_ms": ("storage_sqlite_busy_timeout_ms", int),
    "storage.sqlite_wal_limit_bytes": ("storage_sqlite_wal_limit_bytes", int),
    "metrics.public": ("metrics_public", bool),
    "dispatcher.enabled": ("dispatcher_enabled", bool),
    "dispatcher.per_runner": ("dispatcher_per_runner", int),
    "dispatcher.per_hub": ("dispatcher_per_hub", int),
    "turns.max_turn_s": ("turns_max_turn_s", int),
    "chat.per_account": ("chat_per_account", int),
    "chat.per_hub": ("chat_per_hub", int),
    "chat.per_runner": ("chat_per_runner", int),
    "chat.pending_wait_s": ("chat_pending_wait_s", int),
    "chat.recovery_wait_s": ("chat_recovery_wait_s", int),
    "chat.turn_max_s": ("chat_turn_max_s", int),
    "chat.channel_idle_s": ("chat_channel_idle_s", int),
}

_TRUE = {"true", "on", "1"}
_FALSE = {"false", "off", "0"}


def env_name(key: str) -> str:
    return "TALARIA_" + key.upper().replace(".", "_")


def _coerce(key: str, kind: type, value: Any, *, from_env: bool = False) -> Any:
    """``value`` as ``kind``; ``from_env``: a list is then one comma-separated string."""
    if kind is tuple:
        if from_env and isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
            raise SettingsError(f"{key} must be an array of strings (in the environment: comma-separated)")
        return tuple(item.strip() for item in value if item.strip())
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise SettingsError(f"{key} must be one of true/false/on/off/1/0")
    if kind is int:
        if isinstance(value, bool):
            raise SettingsError(f"{key} must be an integer")
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if not text.lstrip("-").isdigit():
            raise SettingsError(f"{key} must be an integer")
        return int(text)
    if kind is Path:
        if not isinstance(value, str | Path) or not str(value):
            raise SettingsError(f"{key} must be a path")
        return Path(value)
    if not isinstance(value, str):
        raise SettingsError(f"{key} must be a string")
    return value


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        if key == "profiles":
            continue
        if isinstance(value, Mapping):
            out.update(_flatten(value, key + "."))
        else:
            out[key] = value
    return out


def _profiles(table: Any) -> dict[str, ProfileOverride]:
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise SettingsError('profiles must be a table of "<source>/<profile>" entries')
    out: dict[str, ProfileOverride] = {}
    for name, entry in table.items():
        if not isinstance(entry, Mapping) or "/" not in name:
            raise SettingsError(f'profiles."{name}" must be a table named "<source>/<profile>"')
        unknown = set(entry) - {"max_lease_life_s", "max_attempts"}
        if unknown:
            raise SettingsError(f'profiles."{name}".{sorted(unknown)[0]} is not a setting')
        values = {k: _coerce(f'profiles."{name}".{k}', int, v) for k, v in entry.items()}
        out[name] = ProfileOverride(**values)
    return out


def _read_file(config_file: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read settings file {config_file}: {exc}") from exc


# what the commands other than ``hub`` read (web-api.md 8, scale.md 5): the data directory and the database
OFFLINE_KEYS: tuple[str, ...] = (
    "data_dir",
    "database.url",
    "database.pool_timeout_ms",
    "database.statement_timeout_ms",
)


def load_offline_settings(
    *,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """The settings of ``OFFLINE_KEYS`` alone, by the same precedence; the others are neither read nor checked."""
    values: dict[str, Any] = {}
    if config_file is not None:
        table = _flatten(_read_file(config_file))
        values.update({key: _coerce(key, KEYS[key][1], table[key]) for key in OFFLINE_KEYS if key in table})
    for key in OFFLINE_KEYS:
        raw = (environ or {}).get(env_name(key))
        if raw is not None and raw != "":
            values[key] = _coerce(key, KEYS[key][1], raw, from_env=True)
    for key, value in (flags or {}).items():
        if key in OFFLINE_KEYS and value is not None:
            values[key] = _coerce(key, KEYS[key][1], value)
    settings = Settings(**{KEYS[k][0]: v for k, v in values.items()})
    _validate_database(settings)
    return settings


def load_settings(
    *,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Merge the sources by precedence and validate; raises ``SettingsError`` naming the key."""
    values: dict[str, Any] = {}
    profiles: dict[str, ProfileOverride] = {}
    if config_file is not None:
        table = _read_file(config_file)
        profiles = _profiles(table.get("profiles"))
        for key, value in _flatten(table).items():
            if key not in KEYS:
                raise SettingsError(f"{key} is not a setting (in {config_file})")
            values[key] = _coerce(key, KEYS[key][1], value)
    for key, (_, kind) in KEYS.items():
        raw = (environ or {}).get(env_name(key))
        if raw is not None and raw != "":
            values[key] = _coerce(key, kind, raw, from_env=True)
    for key, value in (flags or {}).items():
        if key not in KEYS:
            raise SettingsError(f"{key} is not a setting")
        if value is not None:
            values[key] = _coerce(key, KEYS[key][1], value)
    settings = Settings(**{KEYS[k][0]: v for k, v in values.items()}, profiles=profiles)
    validate(settings)
    return settings


def validate(s: Settings) -> None:
    """The rules of lifecycle.md 1.1; raises ``SettingsError`` with one line naming the key."""
    if s.runtime_api_enabled and len(s.runtime_api_proxy_secret.encode("utf-8")) < MIN_PROXY_SECRET_BYTES:
        raise SettingsError("runtime_api.proxy_secret must be at least 32 bytes when runtime_api.enabled is true")
    positive = {
        "lifecycle.lease_ttl_s": s.lifecycle_lease_ttl_s,
        "lifecycle.heartbeat_interval_s": s.lifecycle_heartbeat_interval_s,
        "lifecycle.reaper_interval_s": s.lifecycle_reaper_interval_s,
        "security.event_rate_per_minute": s.security_event_rate_per_minute,
        "storage.sqlite_wal_limit_bytes": s.storage_sqlite_wal_limit_bytes,
        "dispatcher.per_runner": s.dispatcher_per_runner,
        "dispatcher.per_hub": s.dispatcher_per_hub,
        "chat.per_account": s.chat_per_account,
        "chat.per_hub": s.chat_per_hub,
        "chat.per_runner": s.chat_per_runner,
        "chat.pending_wait_s": s.chat_pending_wait_s,
        "chat.recovery_wait_s": s.chat_recovery_wait_s,
        "chat.turn_max_s": s.chat_turn_max_s,
        "chat.channel_idle_s": s.chat_channel_idle_s,
        "runners.token_overlap_s": s.runners_token_overlap_s,
    }
    for key, value in positive.items():
        if value < 1:
            raise SettingsError(f"{key} must be at least 1")
    for entry in s.hub_trusted_proxies:
        try:
            ipaddress.ip_network(entry)
        except ValueError:
            raise SettingsError(f'hub.trusted_proxies: "{entry}" is not an IP address or CIDR') from None
    if s.storage_sqlite_busy_timeout_ms < 0:
        raise SettingsError("storage.sqlite_busy_timeout_ms must not be negative")
    if s.hub_drain_timeout_s < 0:
        raise SettingsError("hub.drain_timeout_s must not be negative")
    for key, value in (
        ("hub.request_header_timeout_s", s.hub_request_header_timeout_s),
        ("hub.request_body_timeout_s", s.hub_request_body_timeout_s),
        ("hub.response_write_timeout_s", s.hub_response_write_timeout_s),
    ):
        if not 1 <= value <= 3600:
            raise SettingsError(f"{key} must be between 1 and 3600")
    if s.runners_token_rotate_after_s < 0:
        raise SettingsError("runners.token_rotate_after_s must not be negative")
    if not 0 <= s.hub_port <= 65535:
        raise SettingsError("hub.port must be between 0 and 65535")
    if s.lifecycle_heartbeat_interval_s >= s.lifecycle_lease_ttl_s:
        raise SettingsError("lifecycle.heartbeat_interval_s must be less than lifecycle.lease_ttl_s")
    lives = {"lifecycle.max_lease_life_s": s.lifecycle_max_lease_life_s} | {
        f'profiles."{n}".max_lease_life_s': p.max_lease_life_s
        for n, p in s.profiles.items()
        if p.max_lease_life_s is not None
    }
    for key, life in lives.items():
        if life < s.lifecycle_lease_ttl_s:
            raise SettingsError(f"{key} must be at least lifecycle.lease_ttl_s")
    attempts = {"lifecycle.max_attempts": s.lifecycle_max_attempts} | {
        f'profiles."{n}".max_attempts': p.max_attempts for n, p in s.profiles.items() if p.max_attempts is not None
    }
    for key, value in attempts.items():
        if value < 1:
            raise SettingsError(f"{key} must be at least 1")
    longest = max(lives.values())
    if s.lifecycle_idempotency_retention_s < max(86400, longest + s.lifecycle_lease_ttl_s):
        raise SettingsError(
            "lifecycle.idempotency_retention_s must be at least 86400 and at least "
            "the longest max_lease_life_s plus lifecycle.lease_ttl_s"
        )
    if s.turns_max_turn_s < 0:
        raise SettingsError("turns.max_turn_s must not be negative (0: the profile's max_lease_life_s)")
    if not s.lifecycle_dispatcher_principal:
        raise SettingsError("lifecycle.dispatcher_principal must not be empty")
    if bool(s.hub_tls_cert) != bool(s.hub_tls_key):
        missing = "hub.tls_key" if s.hub_tls_cert else "hub.tls_cert"
        raise SettingsError(f"hub.tls_cert and hub.tls_key must be set together ({missing} is missing)")
    if s.hub_public_url:
        parts = urlsplit(s.hub_public_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SettingsError("hub.public_url must be an http:// or https:// URL")
        if s.tls and parts.scheme != "https":
            raise SettingsError("hub.public_url must be an https:// URL when hub.tls_cert is set")
    elif s.hub_host in ("0.0.0.0", "::", ""):  # noqa: S104 - this is the refusal of a wildcard host
        raise SettingsError("hub.public_url must be set when hub.host is a wildcard address")
    _validate_database(s)


def _validate_database(s: Settings) -> None:
    """Scale.md 2.1: the ``database.*`` and ``audit.seal_interval_ms`` rules."""
    if s.database_url and not s.database_url.startswith(("postgresql://", "postgres://")):
        raise SettingsError("database.url must be empty (SQLite) or a postgresql:// URL")
    if not 1 <= s.database_pool_min <= s.database_pool_max:
        raise SettingsError("database.pool_min and database.pool_max must satisfy 1 <= pool_min <= pool_max")
    ranges = {
        "database.pool_timeout_ms": (s.database_pool_timeout_ms, 1, 600_000),
        "database.statement_timeout_ms": (s.database_statement_timeout_ms, 1, 3_600_000),
        "database.wake_fallback_ms": (s.database_wake_fallback_ms, 100, 2000),
        "database.max_clock_skew_ms": (s.database_max_clock_skew_ms, 100, 60_000),
        "audit.seal_interval_ms": (s.audit_seal_interval_ms, 10, 5000),
    }
    for key, (value, low, high) in ranges.items():
        if not low <= value <= high:
            raise SettingsError(f"{key} must be between {low} and {high}")
