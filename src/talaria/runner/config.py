"""runner.json: load and validate the whole file (the per-field rules the hub shares are in ``talaria.runner_json``).

Implements runner-protocol.md section 3 with plain dataclasses and the standard library only (the runner
stays light, DESIGN.md section 6). Every failure is a ``ConfigError`` naming the field; ``talaria runner``
turns it into exit status 2.

Messages never echo a field's value, so a token or password pasted into the wrong field cannot leak
through an error. The only text taken from the input is an unknown key's name, shown only when it looks
like a key and contains no secret of the same document.

Decisions where the specification is silent:

- Unknown keys are reported before any field, then fields in the order of section 3's table.
- ``null`` is not "absent": an optional field given ``null`` is rejected like any other wrong type.
- A JSON object with a repeated key is rejected (the duplicate could hide the value that was checked).
- URLs must be ASCII without whitespace, control characters or ``\\``; an empty port (``host:``) or port 0
  is rejected; the scheme is lower-cased; the value is stored without its trailing ``/``.
- ``allowedProfiles`` is de-duplicated keeping first occurrences and the 256 limit is counted after
  that, exactly as the hub does at registration, so both sides accept the same lists.
- The token must be visible ASCII (it travels in an ``Authorization`` header).
- ``artifactRoots`` entries are kept as written (resolved at export time, section 11.3); a NUL is rejected.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from talaria.runner import limits
from talaria.runner_json import (
    DEFAULT_HERMES_URL,
    UUID_RE,
    ConfigError,
    check_allowed_profiles,
    check_artifact_roots,
    check_hermes_url,
    check_server_url,
)

# Section 3's table, in order.
FIELDS: Final = (
    "protocol",
    "serverURL",
    "runnerId",
    "token",
    "hermesURL",
    "allowedProfiles",
    "artifactRoots",
    "allowInsecureLan",
    "hermesCredentials",
    "hermesTokenFile",
    "caFile",  # operations.md 6
)
REQUIRED: Final = frozenset({"protocol", "serverURL", "runnerId", "token", "allowedProfiles"})
CREDENTIAL_FIELDS: Final = ("username", "password")

# At most 31 characters: never a whole runner token, which has at least 32.
_KEY_SHOWN = re.compile(r"^[A-Za-z0-9_.-]{1,31}\Z")


@dataclass(frozen=True)
class HermesCredentials:
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class RunnerConfig:
    protocol: int
    server_url: str
    runner_id: str
    token: str = field(repr=False)
    hermes_url: str = DEFAULT_HERMES_URL
    allowed_profiles: tuple[str, ...] = ()
    artifact_roots: tuple[str, ...] = ()
    allow_insecure_lan: bool = False
    hermes_credentials: HermesCredentials | None = None
    hermes_token_file: str | None = None
    ca_file: str | None = None  # the CA certificates the runner trusts for the hub, instead of the system's store

    def hub_tls(self) -> ssl.SSLContext:
        """The context both of the runner's paths to the hub verify it with (operations.md 6): exactly ``caFile``'s
        certificates when set, else the system's store; hostname verification always on."""
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()


def _check_ca_file(value: object) -> str:
    """An absolute path to a readable PEM file holding at least one certificate."""
    if not isinstance(value, str) or "\0" in value or not os.path.isabs(value):
        raise ConfigError("caFile", "must be an absolute path")
    try:
        ssl.create_default_context(cafile=value)
    except OSError as exc:  # ssl.SSLError is an OSError: not PEM, or no certificate in it
        reason = exc.strerror if not isinstance(exc, ssl.SSLError) else "no PEM certificate in it"
        raise ConfigError("caFile", f"{value}: {reason}") from None
    return value


def check_secret_file(name: str, path: Path) -> None:
    """A file holding a secret must exist, be a regular file and give no permission bit to group or other.

    Ignored on non-POSIX systems, which have no such bits. Raises ``ConfigError`` naming ``name``.
    """
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(name, f"cannot read the file ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(name, "is not a regular file")
    _check_mode(name, st.st_mode)


def _check_mode(name: str, mode: int) -> None:
    if os.name == "posix" and mode & 0o077:
        raise ConfigError(
            name,
            f"the file gives permissions to group or other (mode {stat.S_IMODE(mode):04o}); run chmod 600 on it",
        )


# ---------------------------------------------------------------- the whole document


def _secrets_of(obj: dict[Any, Any]) -> list[str]:
    found = [obj["token"]] if isinstance(obj.get("token"), str) else []
    creds = obj.get("hermesCredentials")
    if isinstance(creds, dict) and isinstance(creds.get("password"), str):
        found.append(creds["password"])
    return [s for s in found if s]


def _key_name(key: object, secrets: list[str]) -> str:
    if isinstance(key, str) and _KEY_SHOWN.match(key) and not any(s in key for s in secrets):
        return repr(key)
    return "(name not shown)"


def _reject_unknown(where: str, obj: dict[Any, Any], allowed: Sequence[str], secrets: list[str]) -> None:
    for key in obj:
        if key not in allowed:
            raise ConfigError(where, f"unknown key {_key_name(key, secrets)}")


def _check_credentials(value: object, secrets: list[str]) -> HermesCredentials:
    if not isinstance(value, dict):
        raise ConfigError("hermesCredentials", "must be an object {username, password}")
    _reject_unknown("hermesCredentials", value, CREDENTIAL_FIELDS, secrets)
    for key in CREDENTIAL_FIELDS:
        if key not in value:
            raise ConfigError(f"hermesCredentials.{key}", "is required")
        if not isinstance(value[key], str) or not value[key]:
            raise ConfigError(f"hermesCredentials.{key}", "must be a non-empty string")
    return HermesCredentials(username=value["username"], password=value["password"])


def _check_token(value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError("token", "must be a string")
    if not limits.TOKEN_MIN_CHARS <= len(value) <= limits.TOKEN_MAX_CHARS:
        raise ConfigError("token", f"must be {limits.TOKEN_MIN_CHARS}-{limits.TOKEN_MAX_CHARS} characters")
    if not all("!" <= ch <= "~" for ch in value):
        raise ConfigError("token", "must be visible ASCII characters without spaces")
    return value


def parse_config(obj: object) -> RunnerConfig:
    """Validate a decoded runner.json. Checks the ``hermesTokenFile`` on disk. Raises ``ConfigError``."""
    if not isinstance(obj, dict):
        raise ConfigError("runner.json", "must be a JSON object")
    secrets = _secrets_of(obj)
    _reject_unknown("runner.json", obj, FIELDS, secrets)
    for name in FIELDS:
        if name in REQUIRED and name not in obj:
            raise ConfigError(name, "is required")

    protocol = obj["protocol"]
    if type(protocol) is not int or protocol != limits.CONFIG_PROTOCOL:
        raise ConfigError("protocol", f"must be the integer {limits.CONFIG_PROTOCOL}")
    lan = obj.get("allowInsecureLan", False)
    server_url = check_server_url(obj["serverURL"], lan is True)
    runner_id = obj["runnerId"]
    if not isinstance(runner_id, str) or not UUID_RE.match(runner_id):
        raise ConfigError("runnerId", "must be a lower-case UUID")
    token = _check_token(obj["token"])
    hermes_url = check_hermes_url(obj.get("hermesURL", DEFAULT_HERMES_URL))
    profiles = check_allowed_profiles(obj["allowedProfiles"])
    roots = check_artifact_roots(obj.get("artifactRoots", []))
    if not isinstance(lan, bool):
        raise ConfigError("allowInsecureLan", "must be true or false")
    credentials = _check_credentials(obj["hermesCredentials"], secrets) if "hermesCredentials" in obj else None
    token_file = obj.get("hermesTokenFile")
    if "hermesTokenFile" in obj:
        if not isinstance(token_file, str) or "\0" in token_file or not os.path.isabs(token_file):
            raise ConfigError("hermesTokenFile", "must be an absolute path")
        check_secret_file("hermesTokenFile", Path(token_file))
    ca_file = _check_ca_file(obj["caFile"]) if "caFile" in obj else None
    return RunnerConfig(
        protocol=protocol,
        server_url=server_url,
        runner_id=runner_id,
        token=token,
        hermes_url=hermes_url,
        allowed_profiles=profiles,
        artifact_roots=roots,
        allow_insecure_lan=lan,
        hermes_credentials=credentials,
        hermes_token_file=token_file,
        ca_file=ca_file,
    )


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def load_config(path: Path) -> RunnerConfig:
    """Read and validate runner.json. Raises ``ConfigError`` (the CLI exits with status 2).

    On POSIX the file is refused, before its content is read, if group or other has any permission bit.
    """
    where = str(path)
    try:
        # O_NONBLOCK: a FIFO put in place of the file must not hang the start; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ConfigError(where, f"cannot read the config file ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(where, "the config file is not a regular file")
        if os.name == "posix" and st.st_mode & 0o077:
            raise ConfigError(
                where,
                f"the config file gives permissions to group or other (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"run chmod 600 {path}",
            )
        raw = _read_at_most(fd, limits.MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(where, f"cannot read the config file ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(raw) > limits.MAX_CONFIG_FILE_BYTES:
        raise ConfigError(where, f"the config file is larger than {limits.MAX_CONFIG_FILE_BYTES} bytes")
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _DuplicateKey as dup:
        raise ConfigError(where, f"the key {_key_name(dup.key, [])} appears twice") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        # ValueError covers JSONDecodeError; its text quotes the document, which may hold the token.
        raise ConfigError(where, "the config file is not valid UTF-8 JSON") from None
    return parse_config(obj)
