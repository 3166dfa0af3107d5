"""runner.json validation (runner-protocol.md section 3): every rejection case, the accepted edges, the
file mode rule, secrets kept out of messages, and the runner's import lightness (DESIGN.md section 6)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import talaria.runner
from talaria.runner.config import HermesCredentials, RunnerConfig, load_config, parse_config
from talaria.runner_json import (
    DEFAULT_HERMES_URL,
    ConfigError,
    check_allowed_profiles,
    check_artifact_roots,
    check_hermes_url,
    check_server_url,
)

TOKEN = "Zq3vT9xYk2LmN8pR4sW6uA0bC5dE7fG1hJ_-oIaQwEr"  # 43 characters, like a hub-made token
PASSWORD = "hermes-operator-password-9f8e7d"
RUNNER_ID = "0b6f1b9e-7c55-4f0c-9a53-3f1de1c7a2b4"
MISSING = object()


def valid() -> dict[str, Any]:
    return {
        "protocol": 1,
        "serverURL": "https://hub.example.com",
        "runnerId": RUNNER_ID,
        "token": TOKEN,
        "allowedProfiles": ["default", "coder"],
    }


def with_(key: str, value: object, base: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = valid() if base is None else base
    if value is MISSING:
        obj.pop(key, None)
    else:
        obj[key] = value
    return obj


def creds(value: object) -> dict[str, Any]:
    return with_("hermesCredentials", value)


def reject(obj: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(obj)
    text = f"{info.value} {info.value!r}"
    assert TOKEN not in text
    assert PASSWORD not in text
    return info.value


def lan(**extra: Any) -> dict[str, Any]:
    return {**valid(), "allowInsecureLan": True, **extra}


# (case id, document, field named by the error) — one row per rule of section 3's table.
REJECTIONS: list[tuple[str, object, str]] = [
    # the object itself is strict
    ("not-an-object-list", [], "runner.json"),
    ("not-an-object-null", None, "runner.json"),
    ("not-an-object-string", "runner.json", "runner.json"),
    ("unknown-key-command", with_("command", "rm -rf /"), "runner.json"),
    ("unknown-key-case", with_("serverUrl", "https://hub.example.com"), "runner.json"),
    # protocol: integer, exactly 1
    ("protocol-missing", with_("protocol", MISSING), "protocol"),
    ("protocol-2", with_("protocol", 2), "protocol"),
    ("protocol-0", with_("protocol", 0), "protocol"),
    ("protocol-string", with_("protocol", "1"), "protocol"),
    ("protocol-true", with_("protocol", True), "protocol"),
    ("protocol-float", with_("protocol", 1.0), "protocol"),
    # serverURL
    ("server-missing", with_("serverURL", MISSING), "serverURL"),
    ("server-not-string", with_("serverURL", 8700), "serverURL"),
    ("server-null", with_("serverURL", None), "serverURL"),
    ("server-ftp", with_("serverURL", "ftp://hub.example.com"), "serverURL"),
    ("server-ws", with_("serverURL", "wss://hub.example.com"), "serverURL"),
    ("server-no-scheme", with_("serverURL", "hub.example.com"), "serverURL"),
    ("server-one-slash", with_("serverURL", "https:/hub.example.com"), "serverURL"),
    ("server-userinfo", with_("serverURL", "https://admin@hub.example.com"), "serverURL"),
    ("server-user-password", with_("serverURL", "https://admin:pw@hub.example.com"), "serverURL"),
    ("server-query", with_("serverURL", "https://hub.example.com/?x=1"), "serverURL"),
    ("server-empty-query", with_("serverURL", "https://hub.example.com?"), "serverURL"),
    ("server-fragment", with_("serverURL", "https://hub.example.com/#top"), "serverURL"),
    ("server-path", with_("serverURL", "https://hub.example.com/talaria"), "serverURL"),
    ("server-path-slashes", with_("serverURL", "https://hub.example.com//"), "serverURL"),
    ("server-no-host", with_("serverURL", "https://"), "serverURL"),
    ("server-bad-port", with_("serverURL", "https://hub.example.com:99999"), "serverURL"),
    ("server-port-0", with_("serverURL", "https://hub.example.com:0"), "serverURL"),
    ("server-empty-port", with_("serverURL", "https://hub.example.com:"), "serverURL"),
    ("server-space", with_("serverURL", "https://hub.example.com /"), "serverURL"),
    ("server-newline", with_("serverURL", "https://hub.example.com\n"), "serverURL"),
    ("server-backslash", with_("serverURL", "https://evil.example\\@hub.example.com"), "serverURL"),
    ("server-bad-ipv6", with_("serverURL", "https://[::1"), "serverURL"),
    ("server-http-lan", with_("serverURL", "http://192.168.1.20:8700"), "serverURL"),
    ("server-http-name", with_("serverURL", "http://hub.example.com"), "serverURL"),
    ("server-http-127.0.0.2", with_("serverURL", "http://127.0.0.2:8700"), "serverURL"),
    ("server-http-0.0.0.0", with_("serverURL", "http://0.0.0.0:8700"), "serverURL"),
    ("server-http-lan-flag-false", {**valid(), "serverURL": "http://10.0.0.5", "allowInsecureLan": False}, "serverURL"),
    # runnerId: lower-case canonical UUID
    ("runner-id-missing", with_("runnerId", MISSING), "runnerId"),
    ("runner-id-upper", with_("runnerId", RUNNER_ID.upper()), "runnerId"),
    ("runner-id-no-dashes", with_("runnerId", RUNNER_ID.replace("-", "")), "runnerId"),
    ("runner-id-braces", with_("runnerId", "{" + RUNNER_ID + "}"), "runnerId"),
    ("runner-id-short", with_("runnerId", RUNNER_ID[:-1]), "runnerId"),
    ("runner-id-not-hex", with_("runnerId", "0b6f1b9e-7c55-4f0c-9a53-3f1de1c7a2bz"), "runnerId"),
    ("runner-id-int", with_("runnerId", 12), "runnerId"),
    # token: 32-4,096 characters
    ("token-missing", with_("token", MISSING), "token"),
    ("token-31", with_("token", "a" * 31), "token"),
    ("token-4097", with_("token", "a" * 4097), "token"),
    ("token-empty", with_("token", ""), "token"),
    ("token-not-string", with_("token", 12345678901234567890123456789012345), "token"),
    ("token-null", with_("token", None), "token"),
    ("token-space", with_("token", "a" * 20 + " " + "b" * 20), "token"),
    # hermesURL: literal 127.0.0.1 or [::1]
    ("hermes-localhost", with_("hermesURL", "http://localhost:9119"), "hermesURL"),
    ("hermes-lan", with_("hermesURL", "http://192.168.1.20:9119"), "hermesURL"),
    ("hermes-name", with_("hermesURL", "https://hermes.example.com"), "hermesURL"),
    ("hermes-127.0.0.2", with_("hermesURL", "http://127.0.0.2:9119"), "hermesURL"),
    ("hermes-0.0.0.0", with_("hermesURL", "http://0.0.0.0:9119"), "hermesURL"),
    ("hermes-mapped-v6", with_("hermesURL", "http://[::ffff:127.0.0.1]:9119"), "hermesURL"),
    ("hermes-long-v6", with_("hermesURL", "http://[0:0:0:0:0:0:0:1]:9119"), "hermesURL"),
    ("hermes-bare-v6", with_("hermesURL", "http://::1:9119"), "hermesURL"),
    ("hermes-ftp", with_("hermesURL", "ftp://127.0.0.1:9119"), "hermesURL"),
    ("hermes-userinfo", with_("hermesURL", "http://u:p@127.0.0.1:9119"), "hermesURL"),
    ("hermes-query", with_("hermesURL", "http://127.0.0.1:9119/?token=x"), "hermesURL"),
    ("hermes-fragment", with_("hermesURL", "http://127.0.0.1:9119#x"), "hermesURL"),
    ("hermes-path", with_("hermesURL", "http://127.0.0.1:9119/api"), "hermesURL"),
    ("hermes-bad-port", with_("hermesURL", "http://127.0.0.1:70000"), "hermesURL"),
    ("hermes-null", with_("hermesURL", None), "hermesURL"),
    ("hermes-not-string", with_("hermesURL", 9119), "hermesURL"),
    # allowedProfiles: 1-256 strings of 1-256 characters, no /, \ or control character
    ("profiles-missing", with_("allowedProfiles", MISSING), "allowedProfiles"),
    ("profiles-empty", with_("allowedProfiles", []), "allowedProfiles"),
    ("profiles-257", with_("allowedProfiles", [f"p{i}" for i in range(257)]), "allowedProfiles"),
    ("profiles-string", with_("allowedProfiles", "default"), "allowedProfiles"),
    ("profiles-object", with_("allowedProfiles", {"default": True}), "allowedProfiles"),
    ("profiles-null", with_("allowedProfiles", None), "allowedProfiles"),
    ("profile-not-string", with_("allowedProfiles", ["default", 7]), "allowedProfiles[1]"),
    ("profile-null", with_("allowedProfiles", [None]), "allowedProfiles[0]"),
    ("profile-empty", with_("allowedProfiles", [""]), "allowedProfiles[0]"),
    ("profile-257-chars", with_("allowedProfiles", ["p" * 257]), "allowedProfiles[0]"),
    ("profile-slash", with_("allowedProfiles", ["a/b"]), "allowedProfiles[0]"),
    ("profile-dotdot-slash", with_("allowedProfiles", ["../etc"]), "allowedProfiles[0]"),
    ("profile-backslash", with_("allowedProfiles", ["a\\b"]), "allowedProfiles[0]"),
    ("profile-newline", with_("allowedProfiles", ["ok", "a\nb"]), "allowedProfiles[1]"),
    ("profile-nul", with_("allowedProfiles", ["a\0"]), "allowedProfiles[0]"),
    ("profile-del", with_("allowedProfiles", ["a\x7f"]), "allowedProfiles[0]"),
    ("profile-c1", with_("allowedProfiles", ["a\x85"]), "allowedProfiles[0]"),
    # artifactRoots: at most 64 absolute paths
    ("roots-65", with_("artifactRoots", [f"/srv/a{i}" for i in range(65)]), "artifactRoots"),
    ("roots-string", with_("artifactRoots", "/srv/out"), "artifactRoots"),
    ("roots-null", with_("artifactRoots", None), "artifactRoots"),
    ("root-relative", with_("artifactRoots", ["/srv/ok", "out"]), "artifactRoots[1]"),
    ("root-dot", with_("artifactRoots", ["./out"]), "artifactRoots[0]"),
    ("root-home", with_("artifactRoots", ["~/out"]), "artifactRoots[0]"),
    ("root-empty", with_("artifactRoots", [""]), "artifactRoots[0]"),
    ("root-nul", with_("artifactRoots", ["/srv/\0out"]), "artifactRoots[0]"),
    ("root-not-string", with_("artifactRoots", [42]), "artifactRoots[0]"),
    # allowInsecureLan: boolean
    ("lan-string", with_("allowInsecureLan", "true"), "allowInsecureLan"),
    ("lan-int", with_("allowInsecureLan", 1), "allowInsecureLan"),
    ("lan-null", with_("allowInsecureLan", None), "allowInsecureLan"),
    ("lan-string-with-http-lan", lan(serverURL="http://10.0.0.5", allowInsecureLan="true"), "serverURL"),
    # hermesCredentials: exactly {username, password}, non-empty strings
    ("creds-not-object", creds(["u", PASSWORD]), "hermesCredentials"),
    ("creds-null", creds(None), "hermesCredentials"),
    ("creds-extra-key", creds({"username": "u", "password": PASSWORD, "otp": "1"}), "hermesCredentials"),
    ("creds-no-password", creds({"username": "u"}), "hermesCredentials.password"),
    ("creds-no-username", creds({"password": PASSWORD}), "hermesCredentials.username"),
    ("creds-empty-username", creds({"username": "", "password": PASSWORD}), "hermesCredentials.username"),
    ("creds-empty-password", creds({"username": "u", "password": ""}), "hermesCredentials.password"),
    ("creds-int-password", creds({"username": "u", "password": 1234}), "hermesCredentials.password"),
    # hermesTokenFile: absolute path (existence and mode: see the tests below)
    ("token-file-relative", with_("hermesTokenFile", "hermes.token"), "hermesTokenFile"),
    ("token-file-empty", with_("hermesTokenFile", ""), "hermesTokenFile"),
    ("token-file-null", with_("hermesTokenFile", None), "hermesTokenFile"),
    ("token-file-int", with_("hermesTokenFile", 7), "hermesTokenFile"),
    ("token-file-missing", with_("hermesTokenFile", "/nonexistent/talaria/hermes.token"), "hermesTokenFile"),
]


@pytest.mark.parametrize(("document", "field"), [pytest.param(d, f, id=i) for i, d, f in REJECTIONS])
def test_every_section_3_rule_rejects(document: object, field: str) -> None:
    assert reject(document).field == field


def test_unknown_keys_are_named() -> None:
    error = reject(with_("command", "x"))
    assert "'command'" in str(error)
    error = reject(creds({"username": "u", "password": PASSWORD, "otp": "1"}))
    assert "'otp'" in str(error)


def test_unknown_keys_come_before_fields() -> None:
    error = reject({**with_("protocol", 2), "extra": 1})
    assert error.field == "runner.json"
    assert "'extra'" in str(error)


def test_the_first_failing_field_in_table_order_is_named() -> None:
    document = {**valid(), "token": "short", "runnerId": "nope", "allowedProfiles": []}
    assert reject(document).field == "runnerId"


# ---------------------------------------------------------------- secrets never in messages


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(with_("runnerId", TOKEN), id="token-as-runner-id"),
        pytest.param(with_("serverURL", TOKEN), id="token-as-server-url"),
        pytest.param(with_("serverURL", f"https://{TOKEN}@hub.example.com"), id="token-as-userinfo"),
        pytest.param(with_("hermesURL", f"http://127.0.0.1:9119/?token={TOKEN}"), id="token-in-hermes-query"),
        pytest.param(with_("allowedProfiles", [TOKEN + "/x"]), id="token-in-profile"),
        pytest.param(with_("artifactRoots", [TOKEN]), id="token-as-root"),
        pytest.param(with_("hermesTokenFile", "/" + TOKEN), id="token-as-token-file"),
        pytest.param(with_(TOKEN, "x"), id="token-as-key"),
        pytest.param(with_("token", TOKEN + " "), id="token-with-space"),
        pytest.param(with_("token", TOKEN * 100), id="token-too-long"),
        pytest.param(creds({"username": "u", "password": PASSWORD, PASSWORD: 1}), id="password-as-key"),
        pytest.param(
            {**with_("runnerId", PASSWORD), "hermesCredentials": {"username": "u", "password": PASSWORD}},
            id="password-as-runner-id",
        ),
        pytest.param(creds({"username": PASSWORD, "password": 5}), id="password-as-username"),
    ],
)
def test_messages_never_contain_the_token_or_password(document: object) -> None:
    reject(document)  # reject() asserts neither secret is in str() or repr()


def test_repr_hides_the_token_and_password() -> None:
    config = parse_config({**valid(), "hermesCredentials": {"username": "op", "password": PASSWORD}})
    assert TOKEN not in repr(config)
    assert PASSWORD not in repr(config)
    assert "'op'" in repr(config)


# ---------------------------------------------------------------- accepted documents and edges


def test_a_minimal_config_gets_the_defaults() -> None:
    config = parse_config(valid())
    assert config == RunnerConfig(
        protocol=1,
        server_url="https://hub.example.com",
        runner_id=RUNNER_ID,
        token=TOKEN,
        hermes_url=DEFAULT_HERMES_URL,
        allowed_profiles=("default", "coder"),
        artifact_roots=(),
        allow_insecure_lan=False,
        hermes_credentials=None,
        hermes_token_file=None,
    )
    assert DEFAULT_HERMES_URL == "http://127.0.0.1:9119"


def test_a_full_config(tmp_path: Path) -> None:
    token_file = tmp_path / "hermes.token"
    token_file.write_text("session-token\n")
    token_file.chmod(0o600)
    config = parse_config(
        {
            **valid(),
            "serverURL": "http://192.168.1.20:8700/",
            "hermesURL": "http://[::1]:9119/",
            "artifactRoots": ["/srv/out", "/srv/out"],
            "allowInsecureLan": True,
            "hermesCredentials": {"username": "op", "password": PASSWORD},
            "hermesTokenFile": str(token_file),
        }
    )
    assert config.server_url == "http://192.168.1.20:8700"
    assert config.hermes_url == "http://[::1]:9119"
    assert config.artifact_roots == ("/srv/out", "/srv/out")
    assert config.allow_insecure_lan is True
    assert config.hermes_credentials == HermesCredentials("op", PASSWORD)
    assert config.hermes_token_file == str(token_file)


@pytest.mark.parametrize("length", [32, 4096])
def test_token_length_bounds(length: int) -> None:
    assert parse_config(with_("token", "t" * length)).token == "t" * length


def test_256_profiles_of_256_characters() -> None:
    profiles = [f"{i:03d}".ljust(256, "p") for i in range(256)]
    assert parse_config(with_("allowedProfiles", profiles)).allowed_profiles == tuple(profiles)


def test_duplicate_profiles_are_dropped_and_not_counted() -> None:
    profiles = [f"p{i}" for i in range(256)]
    config = parse_config(with_("allowedProfiles", [*profiles, "p0", "p1", *profiles]))
    assert config.allowed_profiles == tuple(profiles)
    assert check_allowed_profiles(["b", "a", "b"]) == ("b", "a")


def test_profile_names_may_hold_spaces_dots_and_unicode() -> None:
    names = ["my bot", "v1.2", "..", "профиль", "🦉"]
    assert parse_config(with_("allowedProfiles", names)).allowed_profiles == tuple(names)


def test_64_artifact_roots() -> None:
    roots = [f"/srv/out{i}" for i in range(64)]
    assert parse_config(with_("artifactRoots", roots)).artifact_roots == tuple(roots)


@pytest.mark.parametrize(
    ("url", "stored"),
    [
        ("http://[::1]", "http://[::1]"),
        ("http://[::1]/", "http://[::1]"),
        ("http://[::1]:9119", "http://[::1]:9119"),
        ("https://[::1]:9443/", "https://[::1]:9443"),
        ("http://127.0.0.1", "http://127.0.0.1"),
        ("http://127.0.0.1:9119/", "http://127.0.0.1:9119"),
    ],
)
def test_hermes_url_on_loopback_literals(url: str, stored: str) -> None:
    assert parse_config(with_("hermesURL", url)).hermes_url == stored
    assert check_hermes_url(url) == stored


@pytest.mark.parametrize(
    ("url", "stored"),
    [
        ("http://localhost:8700", "http://localhost:8700"),
        ("http://localhost:8700/", "http://localhost:8700"),
        ("http://127.0.0.1:8700", "http://127.0.0.1:8700"),
        ("http://[::1]:8700/", "http://[::1]:8700"),
        ("https://192.168.1.20:8443", "https://192.168.1.20:8443"),
        ("https://hub.example.com/", "https://hub.example.com"),
        ("https://hub_1.internal", "https://hub_1.internal"),
        ("HTTPS://Hub.Example.com", "https://Hub.Example.com"),
        ("https://[2001:db8::5]:8443", "https://[2001:db8::5]:8443"),
    ],
)
def test_server_url_accepted(url: str, stored: str) -> None:
    assert parse_config(with_("serverURL", url)).server_url == stored


@pytest.mark.parametrize("url", ["http://192.168.1.20:8700", "http://hub.lan", "http://[fd00::5]:8700"])
def test_allow_insecure_lan_permits_http_anywhere(url: str) -> None:
    assert parse_config(lan(serverURL=url)).server_url == url
    with pytest.raises(ConfigError):
        check_server_url(url, False)
    assert check_server_url(url, True) == url


def test_field_checks_for_the_hub() -> None:
    assert check_server_url("https://hub.example.com/", False) == "https://hub.example.com"
    assert check_artifact_roots([]) == ()
    assert check_artifact_roots(["/a", "/b"]) == ("/a", "/b")
    for check, bad in [
        (check_hermes_url, "http://localhost:9119"),
        (check_allowed_profiles, []),
        (check_artifact_roots, ["rel"]),
        (lambda v: check_server_url(v, True), "https://x/?q"),
    ]:
        with pytest.raises(ConfigError):
            check(bad)


# ---------------------------------------------------------------- hermesTokenFile on disk


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_token_file_private_modes_pass(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "hermes.token"
    path.write_text("abc\n")
    path.chmod(mode)
    assert parse_config(with_("hermesTokenFile", str(path))).hermes_token_file == str(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o610, 0o601])
def test_token_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "hermes.token"
    path.write_text("abc\n")
    path.chmod(mode)
    error = reject(with_("hermesTokenFile", str(path)))
    assert error.field == "hermesTokenFile"
    assert "chmod 600" in str(error)


def test_token_file_must_be_a_file(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    assert reject(with_("hermesTokenFile", str(tmp_path))).field == "hermesTokenFile"


# ---------------------------------------------------------------- the file (load_config)


def write(path: Path, content: str | bytes, mode: int = 0o600) -> Path:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    path.chmod(mode)
    return path


def test_load_a_private_file(tmp_path: Path) -> None:
    path = write(tmp_path / "runner.json", json.dumps(valid(), indent=2))
    assert load_config(path) == parse_config(valid())


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606, 0o620, 0o602, 0o610, 0o601, 0o777])
def test_a_file_open_to_group_or_other_is_refused(tmp_path: Path, mode: int) -> None:
    path = write(tmp_path / "runner.json", json.dumps(valid()), mode)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "chmod 600" in str(info.value)
    assert TOKEN not in str(info.value)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("", "not valid UTF-8 JSON"),
        ("{", "not valid UTF-8 JSON"),
        (f'{{"token": "{TOKEN}", oops}}', "not valid UTF-8 JSON"),
        (b'{"a": "\xff"}', "not valid UTF-8 JSON"),
        ('{"protocol": NaN}', "not valid UTF-8 JSON"),
        ("[" * 100_000, "not valid UTF-8 JSON"),
        ('{"protocol": 1, "protocol": 1}', "appears twice"),
        ("[]", "must be a JSON object"),
        ('"runner"', "must be a JSON object"),
        ("null", "must be a JSON object"),
    ],
)
def test_a_file_that_is_not_a_json_object_is_refused(tmp_path: Path, content: str | bytes, words: str) -> None:
    path = write(tmp_path / "runner.json", content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert words in str(info.value)
    assert TOKEN not in str(info.value)


def test_a_duplicate_key_in_credentials_is_refused(tmp_path: Path) -> None:
    text = json.dumps(valid())[:-1] + ', "hermesCredentials": {"username": "u", "password": "x", "password": "y"}}'
    with pytest.raises(ConfigError, match="appears twice"):
        load_config(write(tmp_path / "runner.json", text))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.json")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "runner.json"
    folder.mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(folder)


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "runner.json"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(fifo)


def test_a_path_through_a_file_is_unreadable(tmp_path: Path) -> None:
    parent = write(tmp_path / "file", "x")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(parent / "runner.json")


def test_a_huge_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "runner.json", " " * (1024 * 1024 + 1))
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path)


def test_field_errors_pass_through_load_config(tmp_path: Path) -> None:
    path = write(tmp_path / "runner.json", json.dumps(with_("runnerId", TOKEN)))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == "runnerId"
    assert TOKEN not in str(info.value)


# ---------------------------------------------------------------- the runner stays light

RUNNER = Path(talaria.runner.__file__).resolve().parent
MINE = ("__init__.py", "config.py", "state_dir.py", "receipts.py", "limits.py")
ALLOWED_TALARIA = {"talaria.clock", "talaria.canonical", "talaria.limits", "talaria.runner_json", "talaria.text_rules"}


@pytest.mark.parametrize("name", MINE)
def test_these_runner_modules_import_only_the_standard_library(name: str) -> None:
    tree = ast.parse((RUNNER / name).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports hide what is imported"
            imported.add(node.module or "")
    for module in imported:
        top = module.split(".")[0]
        assert (
            top in sys.stdlib_module_names
            or module in ALLOWED_TALARIA
            or module == "talaria.runner"
            or module.startswith("talaria.runner.")
        ), f"{name} imports {module}"


def test_importing_them_loads_no_heavy_package() -> None:
    code = (
        "import sys\n"
        "import talaria.runner.config, talaria.runner.state_dir, talaria.runner.receipts\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'fastapi', 'starlette', 'structlog')"
        " or m.startswith(('talaria.hub', 'talaria.store', 'talaria.lifecycle', 'talaria.accounts')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""
