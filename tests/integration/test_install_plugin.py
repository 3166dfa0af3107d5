"""``talaria hermes install-plugin``: copies the plugin, enables it, is idempotent, says what it changed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from talaria.hermes_plugin.install import FILES, _listed


def install(home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "talaria", "hermes", "install-plugin", "--hermes-home", str(home), *extra]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)


def test_a_fresh_home_gets_the_files_and_the_enabled_list_then_nothing_changes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("# my settings\nmodel:\n  default: scripted\n")
    first = install(home)
    assert first.returncode == 0, first.stderr
    for name in FILES:
        assert (home / "plugins" / "talaria" / name).is_file()
        assert f"wrote {home / 'plugins' / 'talaria' / name}" in first.stdout
    config = (home / "config.yaml").read_text()
    assert config.startswith("# my settings\nmodel:\n  default: scripted\n")  # the rest is left byte for byte
    assert config.endswith("plugins:\n  enabled: [talaria]\n")
    assert "restart Hermes" in first.stdout
    second = install(home)
    assert second.returncode == 0 and second.stdout.strip() == "nothing to do: the plugin is installed and enabled"
    (home / "plugins" / "talaria" / "runtime.py").write_text("# damaged\n")
    third = install(home)
    assert third.stdout.splitlines()[0] == f"wrote {home / 'plugins' / 'talaria' / 'runtime.py'}"


def test_a_plugins_section_without_talaria_needs_hermes_to_edit_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("plugins:\n  enabled:\n    - other\n")
    refused = install(home)
    assert refused.returncode == 1
    assert "add talaria to plugins.enabled" in refused.stderr
    assert (home / "config.yaml").read_text() == "plugins:\n  enabled:\n    - other\n"


def test_a_missing_home_is_refused(tmp_path: Path) -> None:
    refused = install(tmp_path / "nowhere")
    assert refused.returncode == 1 and "is not a directory" in refused.stderr


def test_the_enabled_list_is_read_in_flow_and_block_styles() -> None:
    assert _listed("plugins:\n  enabled: [a, talaria]\n")
    assert _listed("plugins:\n  enabled:\n    - a\n    - 'talaria'\n")
    assert not _listed("plugins:\n  enabled: [a]\n  disabled: [talaria]\n")
    assert not _listed("plugins:\n  enabled:\n    - a\nother:\n  - talaria\n")
    assert not _listed("model: {}\n")
