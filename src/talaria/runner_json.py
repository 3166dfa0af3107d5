"""The runner.json field rules both sides apply (runner-protocol.md 3): the runner when it loads its file, the
hub when it registers a node and builds the file. Standard library only, so the runner stays light; neither side's
package is imported here.

Messages never echo a field's value, so a token or password pasted into the wrong field cannot leak through an
error. URLs must be ASCII without whitespace, control characters or ``\\``; an empty port (``host:``) or port 0 is
rejected; the scheme is lower-cased; the value is kept without its trailing ``/``. ``allowedProfiles`` is
de-duplicated keeping first occurrences and its limit counted after that. ``artifactRoots`` entries are kept as
written (resolved at export time, runner-protocol.md 11.3); a NUL is rejected.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Sequence
from typing import Final
from urllib.parse import urlsplit

from talaria.text_rules import is_control

DEFAULT_HERMES_URL: Final = "http://127.0.0.1:9119"
LOOPBACK_SERVER_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "[::1]"})
HERMES_HOSTS: Final = frozenset({"127.0.0.1", "[::1]"})
UUID_RE: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
# Field limits (runner-protocol.md 3, 14) -> ConfigError naming the field (the runner exits 2, the hub answers 400)
MAX_ALLOWED_PROFILES: Final = 256  # counted after duplicates are removed
MAX_PROFILE_CHARS: Final = 256
MAX_ARTIFACT_ROOTS: Final = 64

_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_PORT = re.compile(r"^[0-9]{1,5}\Z")


class ConfigError(Exception):
    """An invalid runner.json (or registration field). ``str()`` is ``"<field>: <message>"``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _split_url(name: str, value: object) -> tuple[str, str, str]:
    """Check the rules common to serverURL and hermesURL.

    Returns (normalised URL: scheme lower-cased, no trailing slash; scheme; host lower-cased).
    """
    if not isinstance(value, str):
        raise ConfigError(name, "must be a string")
    if not value.isascii() or any(is_control(ch) or ch.isspace() or ch == "\\" for ch in value):
        raise ConfigError(name, "must be an ASCII URL without spaces, control characters or backslashes")
    try:
        parts = urlsplit(value)
    except ValueError:
        raise ConfigError(name, "is not a valid URL") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not value[: len(scheme) + 3].lower() == f"{scheme}://":
        raise ConfigError(name, "must start with http:// or https://")
    if "@" in parts.netloc:
        raise ConfigError(name, "must not contain user information")
    if "?" in value:
        raise ConfigError(name, "must not contain a query")
    if "#" in value:
        raise ConfigError(name, "must not contain a fragment")
    if parts.path not in ("", "/"):
        raise ConfigError(name, "must have no path other than /")
    netloc = parts.netloc
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise ConfigError(name, "has an invalid IPv6 host")
        host, rest = netloc[: end + 1], netloc[end + 1 :]
        inner = host[1:-1]
        if "%" in inner:
            raise ConfigError(name, "has an invalid IPv6 host")
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise ConfigError(name, "has an invalid IPv6 host") from None
    else:
        host, sep, port = netloc.partition(":")
        rest = sep + port
        if not host:
            raise ConfigError(name, "must name a host")
        if not _HOSTNAME.match(host):
            raise ConfigError(name, "has an invalid host")
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ConfigError(name, "has an invalid IPv4 host") from None
    if rest:
        port = rest[1:]
        if not rest.startswith(":") or not _PORT.match(port) or not 1 <= int(port) <= 65535:
            raise ConfigError(name, "has an invalid port (1-65535)")
    return f"{scheme}://{value[len(scheme) + 3 :].removesuffix('/')}", scheme, host.lower()


def check_server_url(value: object, allow_insecure_lan: bool) -> str:
    """``serverURL``: http/https origin; ``http`` only on loopback unless ``allow_insecure_lan``.

    Returns the URL without a trailing slash (scheme lower-cased). Raises ``ConfigError``.
    """
    url, scheme, host = _split_url("serverURL", value)
    if scheme == "http" and host not in LOOPBACK_SERVER_HOSTS and not allow_insecure_lan:
        raise ConfigError(
            "serverURL",
            "http is allowed only for 127.0.0.1, localhost or [::1]; use https or set allowInsecureLan to true",
        )
    return url


def check_hermes_url(value: object) -> str:
    """``hermesURL``: http/https on the literal host 127.0.0.1 or [::1]. Returns it without a trailing slash."""
    url, _, host = _split_url("hermesURL", value)
    if host not in HERMES_HOSTS:
        raise ConfigError("hermesURL", "host must be literally 127.0.0.1 or [::1] (localhost is not accepted)")
    return url


def _string_list(name: str, value: object) -> Sequence[object]:
    if not isinstance(value, list | tuple):
        raise ConfigError(name, "must be an array of strings")
    return value


def check_allowed_profiles(value: object) -> tuple[str, ...]:
    """``allowedProfiles``: 1-256 distinct names of 1-256 characters without ``/``, ``\\`` or control characters.

    Duplicates are removed keeping first occurrences; the count limit applies afterwards.
    """
    items = _string_list("allowedProfiles", value)
    seen: dict[str, None] = {}
    for index, item in enumerate(items):
        where = f"allowedProfiles[{index}]"
        if not isinstance(item, str):
            raise ConfigError(where, "must be a string")
        if not 1 <= len(item) <= MAX_PROFILE_CHARS:
            raise ConfigError(where, f"must be 1-{MAX_PROFILE_CHARS} characters")
        if any(ch in "/\\" or is_control(ch) for ch in item):
            raise ConfigError(where, "must not contain /, \\ or a control character")
        seen.setdefault(item, None)
    if not 1 <= len(seen) <= MAX_ALLOWED_PROFILES:
        raise ConfigError("allowedProfiles", f"must hold 1-{MAX_ALLOWED_PROFILES} profiles")
    return tuple(seen)


def check_artifact_roots(value: object) -> tuple[str, ...]:
    """``artifactRoots``: at most 64 absolute paths, kept as written."""
    items = _string_list("artifactRoots", value)
    if len(items) > MAX_ARTIFACT_ROOTS:
        raise ConfigError("artifactRoots", f"must hold at most {MAX_ARTIFACT_ROOTS} paths")
    for index, item in enumerate(items):
        where = f"artifactRoots[{index}]"
        if not isinstance(item, str):
            raise ConfigError(where, "must be a string")
        if "\0" in item or not os.path.isabs(item):
            raise ConfigError(where, "must be an absolute path")
    return tuple(str(item) for item in items)
