"""Hub settings (lifecycle.md 1.1): defaults, sources and their precedence, validation rules."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from talaria.errors import SettingsError
from talaria.settings import KEYS, Settings, env_name, load_settings, validate

SECRET_32 = "s" * 32


def refused(**kwargs: object) -> str:
    """Load settings that must be refused; returns the one-line message."""
    with pytest.raises(SettingsError) as info:
        load_settings(**kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message, "a settings error is one line"
    return message


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "talaria.toml"
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- defaults


def test_defaults_match_the_settings_table() -> None:
    s = load_settings()
    assert s.runtime_api_enabled is False
    assert s.runtime_api_proxy_secret == ""
    assert s.runtime_api_allow_remote_proxy is False
    assert s.approval_allow_self_approval is False
    assert s.lifecycle_lease_ttl_s == 30
    assert s.lifecycle_heartbeat_interval_s == 10
    assert s.lifecycle_reaper_interval_s == 5
    assert s.lifecycle_max_lease_life_s == 3600
    assert s.lifecycle_max_attempts == 3
    assert s.lifecycle_idempotency_retention_s == 86400
    assert s.lifecycle_dispatcher_principal == "talaria-hub"
    assert s.security_event_rate_per_minute == 60
    assert s.data_dir == Path("./talaria-data")
    assert s.hub_host == "127.0.0.1"
    assert s.hub_port == 8700
    assert s.public_url == "http://127.0.0.1:8700"
    assert s.public_origin == "http://127.0.0.1:8700"
    assert s.database_url == ""
    assert s.sqlite_path == Path("./talaria-data") / "talaria.sqlite3"
    assert s.storage_sqlite_busy_timeout_ms == 5000
    assert s.storage_sqlite_wal_limit_bytes == 67_108_864
    assert s.max_attempts_for("local", "default") == 3
    assert s.max_life_for("local", "default") == 3600


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.lifecycle_lease_ttl_s = 5  # type: ignore[misc]


def test_public_url_default_follows_host_and_port() -> None:
    s = load_settings(flags={"hub.host": "::1", "hub.port": 9000})
    assert s.public_url == "http://[::1]:9000"
    s = load_settings(flags={"hub.public_url": "https://talaria.example.org/"})
    assert s.public_url == "https://talaria.example.org"
    assert s.public_origin == "https://talaria.example.org"


def test_the_proxy_secret_is_not_in_the_repr() -> None:
    secret = "x" * 40
    s = load_settings(environ={"TALARIA_RUNTIME_API_ENABLED": "true", "TALARIA_RUNTIME_API_PROXY_SECRET": secret})
    assert s.runtime_api_proxy_secret == secret
    assert secret not in repr(s)


# ---------------------------------------------------------------- environment


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("runtime_api.enabled", "TALARIA_RUNTIME_API_ENABLED"),
        ("runtime_api.proxy_secret", "TALARIA_RUNTIME_API_PROXY_SECRET"),
        ("lifecycle.lease_ttl_s", "TALARIA_LIFECYCLE_LEASE_TTL_S"),
        ("lifecycle.idempotency_retention_s", "TALARIA_LIFECYCLE_IDEMPOTENCY_RETENTION_S"),
        ("data_dir", "TALARIA_DATA_DIR"),
        ("hub.public_url", "TALARIA_HUB_PUBLIC_URL"),
        ("storage.sqlite_busy_timeout_ms", "TALARIA_STORAGE_SQLITE_BUSY_TIMEOUT_MS"),
    ],
)
def test_env_names(key: str, name: str) -> None:
    assert env_name(key) == name


def test_every_key_of_the_settings_table_is_known() -> None:
    spec_keys = {
        "runtime_api.enabled",
        "runtime_api.proxy_secret",
        "runtime_api.allow_remote_proxy",
        "approval.allow_self_approval",
        "lifecycle.lease_ttl_s",
        "lifecycle.heartbeat_interval_s",
        "lifecycle.reaper_interval_s",
        "lifecycle.max_lease_life_s",
        "lifecycle.max_attempts",
        "lifecycle.idempotency_retention_s",
        "lifecycle.dispatcher_principal",
        "security.event_rate_per_minute",
        "data_dir",
        "hub.host",
        "hub.port",
        "hub.public_url",
        "database.url",
        "storage.sqlite_busy_timeout_ms",
        "storage.sqlite_wal_limit_bytes",
        # scale.md 2.1
        "database.pool_min",
        "database.pool_max",
        "database.pool_timeout_ms",
        "database.statement_timeout_ms",
        "database.listen",
        "database.wake_fallback_ms",
        "database.max_clock_skew_ms",
        "audit.seal_interval_ms",
        # operations.md 8
        "hub.drain_timeout_s",
        "hub.tls_cert",
        "hub.tls_key",
        "runners.token_rotate_after_s",
        "runners.token_overlap_s",
    }
    assert spec_keys <= set(KEYS)


@pytest.mark.parametrize(
    "url", ["postgresql://u@db.example/talaria", "postgres://u:pw@127.0.0.1:5432/t?sslmode=require"]
)
def test_a_postgresql_url_is_accepted_and_never_shown(url: str) -> None:
    s = load_settings(environ={"TALARIA_DATABASE_URL": url})
    assert s.database_url == url
    assert url not in repr(s)


@pytest.mark.parametrize("url", ["mysql://u@db/t", "sqlite:///x.db", "postgresql:/nothing"])
def test_another_database_scheme_is_refused_naming_the_key(url: str) -> None:
    message = refused(environ={"TALARIA_DATABASE_URL": url})
    assert message.startswith("database.url") and url not in message


@pytest.mark.parametrize(
    ("key", "low", "high"),
    [("database.wake_fallback_ms", 100, 2000), ("database.max_clock_skew_ms", 100, 60_000),
     ("audit.seal_interval_ms", 10, 5000)],
)  # fmt: skip
def test_database_ranges_hold_at_their_edges(key: str, low: int, high: int) -> None:
    env = "TALARIA_" + key.upper().replace(".", "_")
    for value in (low, high):
        load_settings(environ={env: str(value)})
    for value in (low - 1, high + 1):
        assert refused(environ={env: str(value)}).startswith(key)


@pytest.mark.parametrize(("pool_min", "pool_max", "ok"), [(1, 1, True), (2, 10, True), (0, 10, False), (5, 4, False)])
def test_the_pool_sizes_need_one_at_least_and_min_at_most_max(pool_min: int, pool_max: int, ok: bool) -> None:
    environ = {"TALARIA_DATABASE_POOL_MIN": str(pool_min), "TALARIA_DATABASE_POOL_MAX": str(pool_max)}
    if ok:
        assert load_settings(environ=environ).database_pool_max == pool_max
    else:
        assert "database.pool_min" in refused(environ=environ)


def test_environment_sets_values() -> None:
    s = load_settings(
        environ={
            "TALARIA_RUNTIME_API_ENABLED": "true",
            "TALARIA_RUNTIME_API_PROXY_SECRET": SECRET_32,
            "TALARIA_LIFECYCLE_LEASE_TTL_S": "45",
            "TALARIA_DATA_DIR": "/srv/talaria",
            "TALARIA_APPROVAL_ALLOW_SELF_APPROVAL": "on",
        }
    )
    assert s.runtime_api_enabled is True
    assert s.runtime_api_proxy_secret == SECRET_32
    assert s.lifecycle_lease_ttl_s == 45
    assert s.data_dir == Path("/srv/talaria")
    assert s.sqlite_path == Path("/srv/talaria/talaria.sqlite3")
    assert s.approval_allow_self_approval is True


def test_unrelated_environment_is_ignored() -> None:
    s = load_settings(environ={"TALARIA_NOT_A_SETTING": "1", "LIFECYCLE_LEASE_TTL_S": "5", "PATH": "/bin"})
    assert s == load_settings()


def test_a_bad_integer_in_the_environment_names_the_key() -> None:
    message = refused(environ={"TALARIA_LIFECYCLE_LEASE_TTL_S": "thirty"})
    assert "lifecycle.lease_ttl_s" in message


# ---------------------------------------------------------------- precedence


def test_precedence_flags_then_env_then_file_then_defaults(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[hub]\nport = 1111\n[lifecycle]\nlease_ttl_s = 40\nmax_attempts = 4\n")
    env = {"TALARIA_HUB_PORT": "2222", "TALARIA_LIFECYCLE_LEASE_TTL_S": "50"}

    s = load_settings(flags={"hub.port": 3333}, environ=env, config_file=path)
    assert s.hub_port == 3333  # flag beats env and file
    assert s.lifecycle_lease_ttl_s == 50  # env beats file
    assert s.lifecycle_max_attempts == 4  # file beats default
    assert s.lifecycle_heartbeat_interval_s == 10  # default

    s = load_settings(environ=env, config_file=path)
    assert s.hub_port == 2222
    s = load_settings(config_file=path)
    assert (s.hub_port, s.lifecycle_lease_ttl_s) == (1111, 40)
    assert load_settings().hub_port == 8700


def test_flags_of_none_do_not_override(tmp_path: Path) -> None:
    """The CLI passes None for flags that were not given."""
    s = load_settings(
        flags={"data_dir": None, "hub.host": None, "hub.port": None},
        environ={"TALARIA_DATA_DIR": "/env/dir", "TALARIA_HUB_PORT": "9100"},
    )
    assert s.data_dir == Path("/env/dir")
    assert s.hub_port == 9100
    assert s.hub_host == "127.0.0.1"


def test_data_dir_flag_beats_env() -> None:
    s = load_settings(flags={"data_dir": "/flag/dir"}, environ={"TALARIA_DATA_DIR": "/env/dir"})
    assert s.data_dir == Path("/flag/dir")


def test_validation_applies_to_the_merged_result(tmp_path: Path) -> None:
    """The file's TTL of 5 is broken only together with the default heartbeat; env repairs it."""
    path = write_toml(tmp_path, "[lifecycle]\nlease_ttl_s = 5\nmax_lease_life_s = 3600\n")
    assert "lifecycle.heartbeat_interval_s" in refused(config_file=path)
    s = load_settings(environ={"TALARIA_LIFECYCLE_HEARTBEAT_INTERVAL_S": "1"}, config_file=path)
    assert (s.lifecycle_lease_ttl_s, s.lifecycle_heartbeat_interval_s) == (5, 1)


# ---------------------------------------------------------------- booleans


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("false", False), ("on", True), ("off", False), ("1", True), ("0", False)],
)
def test_boolean_words(text: str, value: bool) -> None:
    s = load_settings(
        environ={"TALARIA_RUNTIME_API_ALLOW_REMOTE_PROXY": text, "TALARIA_APPROVAL_ALLOW_SELF_APPROVAL": text}
    )
    assert s.runtime_api_allow_remote_proxy is value
    assert s.approval_allow_self_approval is value


def test_boolean_words_as_flags() -> None:
    assert load_settings(flags={"approval.allow_self_approval": "on"}).approval_allow_self_approval is True
    assert load_settings(flags={"approval.allow_self_approval": "0"}).approval_allow_self_approval is False


@pytest.mark.parametrize("text", ["yes", "no", "2", "enabled", "tru"])
def test_a_bad_boolean_is_refused_naming_the_key(text: str) -> None:
    message = refused(environ={"TALARIA_RUNTIME_API_ENABLED": text})
    assert "runtime_api.enabled" in message


def test_toml_booleans_and_a_toml_string_boolean(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[approval]\nallow_self_approval = true\n[metrics]\npublic = "off"\n')
    s = load_settings(config_file=path)
    assert s.approval_allow_self_approval is True
    assert s.metrics_public is False


# ---------------------------------------------------------------- validation rules


def test_proxy_secret_of_31_bytes_is_refused_when_enabled() -> None:
    secret = "s" * 31
    message = refused(environ={"TALARIA_RUNTIME_API_ENABLED": "true", "TALARIA_RUNTIME_API_PROXY_SECRET": secret})
    assert "runtime_api.proxy_secret" in message
    assert secret not in message


def test_proxy_secret_missing_is_refused_when_enabled() -> None:
    assert "runtime_api.proxy_secret" in refused(environ={"TALARIA_RUNTIME_API_ENABLED": "true"})


def test_proxy_secret_of_32_bytes_is_accepted() -> None:
    s = load_settings(environ={"TALARIA_RUNTIME_API_ENABLED": "true", "TALARIA_RUNTIME_API_PROXY_SECRET": SECRET_32})
    assert s.runtime_api_enabled is True


def test_proxy_secret_length_counts_utf8_bytes() -> None:
    sixteen_two_byte_chars = "é" * 16  # 16 characters, 32 UTF-8 bytes
    assert len(sixteen_two_byte_chars.encode("utf-8")) == 32
    s = load_settings(
        environ={"TALARIA_RUNTIME_API_ENABLED": "true", "TALARIA_RUNTIME_API_PROXY_SECRET": sixteen_two_byte_chars}
    )
    assert s.runtime_api_proxy_secret == sixteen_two_byte_chars

    thirty_one_bytes = "é" * 15 + "a"  # 16 characters, 31 bytes
    message = refused(
        environ={"TALARIA_RUNTIME_API_ENABLED": "true", "TALARIA_RUNTIME_API_PROXY_SECRET": thirty_one_bytes}
    )
    assert "runtime_api.proxy_secret" in message


def test_a_short_proxy_secret_is_fine_while_the_api_is_off() -> None:
    s = load_settings(environ={"TALARIA_RUNTIME_API_PROXY_SECRET": "short"})
    assert s.runtime_api_enabled is False


def test_heartbeat_must_be_less_than_ttl() -> None:
    message = refused(flags={"lifecycle.lease_ttl_s": 30, "lifecycle.heartbeat_interval_s": 30})
    assert "lifecycle.heartbeat_interval_s" in message
    message = refused(flags={"lifecycle.lease_ttl_s": 5, "lifecycle.heartbeat_interval_s": 10})
    assert "lifecycle.heartbeat_interval_s" in message
    s = load_settings(flags={"lifecycle.lease_ttl_s": 30, "lifecycle.heartbeat_interval_s": 29})
    assert s.lifecycle_heartbeat_interval_s == 29


def test_max_lease_life_must_be_at_least_ttl() -> None:
    message = refused(flags={"lifecycle.max_lease_life_s": 29})
    assert "lifecycle.max_lease_life_s" in message
    assert load_settings(flags={"lifecycle.max_lease_life_s": 30}).lifecycle_max_lease_life_s == 30


@pytest.mark.parametrize("value", [0, -1])
def test_max_attempts_must_be_at_least_one(value: int) -> None:
    assert "lifecycle.max_attempts" in refused(flags={"lifecycle.max_attempts": value})


def test_max_attempts_of_one_is_accepted() -> None:
    assert load_settings(flags={"lifecycle.max_attempts": 1}).lifecycle_max_attempts == 1


def test_idempotency_retention_at_least_a_day() -> None:
    message = refused(flags={"lifecycle.idempotency_retention_s": 86399})
    assert "lifecycle.idempotency_retention_s" in message
    assert load_settings(flags={"lifecycle.idempotency_retention_s": 86400}).lifecycle_idempotency_retention_s == 86400


def test_idempotency_retention_at_least_max_life_plus_ttl() -> None:
    flags = {"lifecycle.max_lease_life_s": 86400, "lifecycle.idempotency_retention_s": 86429}
    assert "lifecycle.idempotency_retention_s" in refused(flags=flags)
    flags["lifecycle.idempotency_retention_s"] = 86430
    assert load_settings(flags=flags).lifecycle_idempotency_retention_s == 86430


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_wildcard_host_needs_a_public_url(host: str) -> None:
    assert "hub.public_url" in refused(flags={"hub.host": host})
    s = load_settings(flags={"hub.host": host, "hub.public_url": "https://hub.example.org"})
    assert s.public_origin == "https://hub.example.org"


def test_a_specific_host_needs_no_public_url() -> None:
    assert load_settings(flags={"hub.host": "192.0.2.10"}).public_url == "http://192.0.2.10:8700"


def test_validate_alone_checks_a_hand_built_settings_object() -> None:
    validate(Settings())
    with pytest.raises(SettingsError, match=r"runtime_api\.proxy_secret"):
        validate(Settings(runtime_api_enabled=True, runtime_api_proxy_secret="s" * 31))


# ---------------------------------------------------------------- the settings file


def test_file_values_and_per_profile_overrides(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        """
data_dir = "/var/lib/talaria"

[runtime_api]
enabled = true
proxy_secret = "0123456789abcdef0123456789abcdef"

[lifecycle]
max_attempts = 2
max_lease_life_s = 600

[profiles."local/default"]
max_attempts = 1
max_lease_life_s = 120

[profiles."lab/research"]
max_lease_life_s = 7200
""",
    )
    s = load_settings(config_file=path)
    assert s.data_dir == Path("/var/lib/talaria")
    assert s.runtime_api_enabled is True
    assert s.max_attempts_for("local", "default") == 1
    assert s.max_life_for("local", "default") == 120
    # an override of one field leaves the other at the default
    assert s.max_attempts_for("lab", "research") == 2
    assert s.max_life_for("lab", "research") == 7200
    # other profiles, and the same profile name on another source, use the defaults
    assert s.max_attempts_for("local", "research") == 2
    assert s.max_life_for("lab", "default") == 600
    assert s.max_attempts_for("other", "default") == 2


def test_per_profile_max_attempts_zero_is_refused(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[profiles."local/default"]\nmax_attempts = 0\n')
    message = refused(config_file=path)
    assert "local/default" in message
    assert "max_attempts" in message


def test_per_profile_max_lease_life_below_ttl_is_refused(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[profiles."local/default"]\nmax_lease_life_s = 10\n')
    message = refused(config_file=path)
    assert "local/default" in message
    assert "max_lease_life_s" in message


def test_retention_covers_the_longest_per_profile_life(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[profiles."local/default"]\nmax_lease_life_s = 90000\n')
    assert "lifecycle.idempotency_retention_s" in refused(config_file=path)
    s = load_settings(flags={"lifecycle.idempotency_retention_s": 90030}, config_file=path)
    assert s.max_life_for("local", "default") == 90000


def test_an_unknown_key_in_the_file_is_refused(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[lifecycle]\nlease_ttl = 5\n")
    assert "lifecycle.lease_ttl" in refused(config_file=path)


def test_an_unknown_top_level_key_in_the_file_is_refused(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'colour = "blue"\n')
    assert "colour" in refused(config_file=path)


def test_an_unknown_per_profile_key_is_refused(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[profiles."local/default"]\nlease_ttl_s = 5\n')
    message = refused(config_file=path)
    assert "local/default" in message
    assert "lease_ttl_s" in message


def test_a_profile_entry_must_name_source_and_profile(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[profiles.default]\nmax_attempts = 1\n")
    assert "profiles" in refused(config_file=path)


def test_a_mistyped_file_value_is_refused(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[lifecycle]\nlease_ttl_s = "soon"\n')
    assert "lifecycle.lease_ttl_s" in refused(config_file=path)


def test_a_broken_file_is_refused(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[lifecycle\nlease_ttl_s = 5\n")
    refused(config_file=path)
    refused(config_file=tmp_path / "missing.toml")


def test_flags_name_only_known_keys() -> None:
    with pytest.raises(SettingsError):
        load_settings(flags={"lifecycle.lease_ttl": 5})
