"""Install Talaria's plugin into a Hermes home and enable it (``talaria hermes install-plugin``).

Idempotent: files are written only when their content differs, and ``plugins.enabled`` in the home's
``config.yaml`` gains ``talaria`` only when it lacks it. Without a ``plugins:`` section the section is
appended (the rest of the file is left byte for byte); with one that does not list ``talaria``, Hermes'
own ``hermes plugins enable talaria`` edits it when a Hermes executable is given, else the install stops
and says what to add. A Hermes restart is needed for a change to take effect.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

PLUGIN_NAME = "talaria"
FILES = ("plugin.yaml", "__init__.py", "runtime.py", "dashboard/manifest.json", "dashboard/plugin_api.py")
_SOURCE = Path(__file__).resolve().parent / "files"
_PLUGINS_KEY = re.compile(r"^plugins\s*:")


class InstallError(Exception):
    pass


def plugin_dir(home: Path) -> Path:
    return home / "plugins" / PLUGIN_NAME


def _listed(text: str) -> bool:
    """Whether the ``plugins:`` section's ``enabled`` list names talaria (flow or block style)."""
    in_plugins = in_enabled = False
    for line in text.splitlines():
        if _PLUGINS_KEY.match(line):
            in_plugins, in_enabled = True, False
            continue
        if in_plugins and line and not line[0].isspace() and not line.startswith("#"):
            in_plugins = in_enabled = False
        if not in_plugins:
            continue
        stripped = line.strip()
        if stripped.startswith("enabled:"):
            rest = stripped[len("enabled:") :].strip()
            if rest.startswith("["):
                names = [n.strip().strip("'\"") for n in rest.strip("[]").split(",")]
                return PLUGIN_NAME in names
            in_enabled = True
            continue
        if in_enabled:
            if stripped.startswith("- "):
                if stripped[2:].strip().strip("'\"") == PLUGIN_NAME:
                    return True
            elif stripped and not stripped.startswith("#"):
                in_enabled = False
    return False


def _enable(home: Path, hermes_bin: Path | None) -> str | None:
    config = home / "config.yaml"
    text = config.read_text(encoding="utf-8") if config.exists() else ""
    if _listed(text):
        return None
    if not any(_PLUGINS_KEY.match(line) for line in text.splitlines()):
        addition = ("" if not text or text.endswith("\n") else "\n") + f"plugins:\n  enabled: [{PLUGIN_NAME}]\n"
        config.write_text(text + addition, encoding="utf-8")
        return f"enabled the plugin in {config} (added plugins.enabled: [{PLUGIN_NAME}])"
    if hermes_bin is None:
        raise InstallError(
            f"{config} has a plugins section without {PLUGIN_NAME}: add {PLUGIN_NAME} to plugins.enabled, "
            "or pass --hermes-bin so that `hermes plugins enable talaria` does it"
        )
    env = dict(os.environ, HERMES_HOME=str(home))
    done = subprocess.run(  # noqa: S603 - the operator's own hermes executable, fixed arguments
        [str(hermes_bin), "plugins", "enable", PLUGIN_NAME], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not _listed(config.read_text(encoding="utf-8")):
        raise InstallError(f"`hermes plugins enable {PLUGIN_NAME}` did not enable the plugin in {config}")
    return f"enabled the plugin in {config} (hermes plugins enable {PLUGIN_NAME})"


def install_plugin(home: Path, *, hermes_bin: Path | None = None) -> list[str]:
    """Copy the plugin into ``home`` and enable it; returns one line per change (empty: nothing to do)."""
    if not home.is_dir():
        raise InstallError(f"{home} is not a directory (a Hermes home)")
    changes: list[str] = []
    target = plugin_dir(home)
    for name in FILES:
        source = (_SOURCE / name).read_bytes()
        path = target / name
        if path.exists() and path.read_bytes() == source:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(source)
        changes.append(f"wrote {path}")
    enabled = _enable(home, hermes_bin)
    if enabled is not None:
        changes.append(enabled)
    return changes
