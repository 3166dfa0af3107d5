"""Validation of account fields (web-api.md 3): usernames, passwords, roles, allowed profiles."""

from __future__ import annotations

import re
from typing import Any

from talaria.errors import TalariaError
from talaria.limits import MAX_PASSWORD_CHARS, MIN_PASSWORD_CHARS

# "$" in these: they are also JSON Schema patterns (ECMA, no "\Z"), so every check of them is a fullmatch, which a
# trailing line break cannot pass. Usernames are never "." or ".." (web-api.md 3).
USERNAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")  # $: a JSON Schema pattern too; fullmatch only
SOURCE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")  # $: a JSON Schema pattern too; fullmatch only
PROFILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,255}$")  # $: a JSON Schema pattern too; fullmatch only
TENANT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")  # $: a JSON Schema pattern too; fullmatch only
ROLES = ("admin", "user")


def check_username(value: str) -> str:
    if not USERNAME.fullmatch(value):
        raise TalariaError("invalid_request", "username must be 1-64 of a-z 0-9 . _ -, starting with a letter or digit")
    return value


def check_password(value: str) -> str:
    if not MIN_PASSWORD_CHARS <= len(value) <= MAX_PASSWORD_CHARS:
        raise TalariaError("weak_password", "password must be 12-1024 characters")
    return value


def check_role(value: str) -> str:
    if value not in ROLES:
        raise TalariaError("invalid_request", "role must be admin or user")
    return value


def check_tenant(value: str) -> str:
    if not TENANT.fullmatch(value):
        raise TalariaError("invalid_request", "tenant must be 1-64 characters of a-z 0-9 . _ - (not first)")
    return value


def check_allowed_profiles(value: Any) -> dict[str, list[str]]:
    """``{source: [profile, ...]}``; duplicates dropped keeping the first; empty lists removed."""
    if not isinstance(value, dict):
        raise TalariaError("invalid_request", "allowedProfiles must map a source to a list of profiles")
    out: dict[str, list[str]] = {}
    for source, profiles in value.items():
        if not isinstance(source, str) or not SOURCE.fullmatch(source):
            raise TalariaError("invalid_request", f"allowedProfiles: {source!r} is not a valid source name")
        if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
            raise TalariaError("invalid_request", f"allowedProfiles.{source} must be a list of profile names")
        seen: list[str] = []
        for profile in profiles:
            if not PROFILE.fullmatch(profile):
                raise TalariaError("invalid_request", f"allowedProfiles.{source}: {profile!r} is not a profile name")
            if profile not in seen:
                seen.append(profile)
        if len(seen) > 256:
            raise TalariaError("invalid_request", f"allowedProfiles.{source} has more than 256 profiles")
        if seen:
            out[source] = seen
    return out


def parse_allow_flags(items: list[str]) -> dict[str, list[str]]:
    """``SOURCE:PROFILE`` command-line items to an allowed-profiles map."""
    table: dict[str, list[str]] = {}
    for item in items:
        source, sep, profile = item.partition(":")
        if not sep:
            raise TalariaError("invalid_request", f"--allow {item!r} must be SOURCE:PROFILE")
        table.setdefault(source, []).append(profile)
    return check_allowed_profiles(table)
