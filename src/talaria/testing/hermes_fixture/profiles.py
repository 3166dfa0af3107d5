"""Profiles and their ``config.yaml`` as the fixture reports them (hermes.md 6 and 7)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from talaria.testing.hermes_fixture.state import valid_profile_name


def default_config() -> dict[str, Any]:
    """The test setup of hermes.md 7: scripted model, Tool Search off, Talaria's plugin enabled."""
    return {
        "model": {"provider": "custom", "default": "scripted", "base_url": "http://127.0.0.1:9/v1"},
        "tools": {"tool_search": {"enabled": "off"}},
        "plugins": {"enabled": ["talaria"]},
        "display": {"busy_input_mode": "interrupt"},
        "dashboard": {"turn_isolation": False},
    }


def profile_entries(specs: Sequence[str | Mapping[str, Any]], home: Path) -> list[dict[str, Any]]:
    """``/api/profiles`` entries; ``default`` is always present (first unless listed elsewhere)."""
    entries: list[dict[str, Any]] = []
    for spec in specs:
        given = {"name": spec} if isinstance(spec, str) else dict(spec)
        name = str(given.get("name") or "")
        if not valid_profile_name(name):
            raise ValueError(f"invalid profile name {name!r}")
        entry: dict[str, Any] = {
            "name": name,
            "path": str(home if name == "default" else home / "profiles" / name),
            "is_default": name == "default",
            "model": "scripted",
            "provider": "custom",
            "has_env": False,
            "skill_count": 0,
            "gateway_running": False,
            "description": "",
            "description_auto": False,
            "distribution_name": None,
            "distribution_version": None,
            "distribution_source": None,
            "has_alias": False,
        }
        entry.update(given)
        entries.append(entry)
    if not any(e["name"] == "default" for e in entries):
        entries.insert(0, profile_entries(["default"], home)[0])
    return entries


def profile_configs(
    entries: Sequence[Mapping[str, Any]], given: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    """Each profile's config: the one given for it, else the default test config."""
    configs: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name = str(entry["name"])
        chosen = (given or {}).get(name)
        configs[name] = copy.deepcopy(dict(chosen)) if chosen is not None else default_config()
    return configs
