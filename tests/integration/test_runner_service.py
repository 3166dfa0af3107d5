"""``talaria runner install-service`` (operations.md 2; scenario 9.3): both rendered units against golden files
(paths normalised), ``systemd-analyze verify`` on them, and each refusal with its exit status.

Writing a unit needs systemd as init, which this machine's containers lack: those tests run the command in-process
with the marker directory and the unit directories pointed at temporary ones.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from talaria.clock import SystemClock
from talaria.runner import cli as runner_cli
from talaria.runner import install_service
from talaria.testing.hub_server import HubServer
from tests.integration.runner_support import write_config

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
LAUNCHER = (os.path.abspath(sys.executable), "-m", "talaria", "runner")
NOBODY = 65534


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A runner.json as registration writes it (a stopped hub is enough: install-service never connects)."""
    from talaria.hub.runners.registry import parse_registration

    data = tmp_path_factory.mktemp("hub")
    server = HubServer(data / "data", SystemClock()).start()
    try:
        fields = parse_registration({"name": "node", "allowedProfiles": ["default"]}, default_server_url=server.url)
        config: dict[str, object] = server.hub.registry.register("default", fields).config
    finally:
        server.stop()
    return config


def config_in(directory: Path, config: dict[str, object], *, owner: int | None = None, mode: int = 0o600) -> Path:
    path = write_config(directory, config, mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def command(*args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m talaria runner install-service …`` as a real process (as ``user`` when given)."""
    argv = [sys.executable, "-m", "talaria", "runner", "install-service", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
    return subprocess.run(argv, capture_output=True, text=True, env=env, user=user, timeout=60, check=False)


def normalised(unit: str, config: Path, runner_id: str) -> str:
    """The unit with this run's paths, interpreter, ids and account replaced by fixed words."""
    text = unit.replace(" ".join(LAUNCHER), "/opt/talaria/bin/talaria runner")
    text = text.replace(str(config.parent), "/srv/talaria-node")
    text = text.replace(runner_id, "00000000-1111-4222-8333-444444444444")
    text = text.replace(runner_id.replace("-", "")[:8], "00000000")
    owner = config.stat()
    import grp
    import pwd

    text = text.replace(f"User={pwd.getpwuid(owner.st_uid).pw_name}\n", "User=talaria\n")
    return text.replace(f"Group={grp.getgrgid(owner.st_gid).gr_name}\n", "Group=talaria\n")


@pytest.mark.parametrize("mode", ["system", "user"])
def test_print_renders_the_golden_unit_and_touches_nothing(
    registered: dict[str, object], tmp_path: Path, mode: str
) -> None:
    owner = NOBODY if mode == "system" and os.geteuid() == 0 else None  # a system unit never runs as root
    config = config_in(tmp_path / "node", registered, owner=owner)
    before = sorted(p.name for p in config.parent.iterdir())
    done = command("--config", str(config), f"--{mode}", "--print")
    assert done.returncode == 0, done.stderr
    runner_id = str(registered["runnerId"])
    golden = (GOLDEN / f"runner-{mode}.service").read_text(encoding="utf-8")
    assert normalised(done.stdout, config, runner_id) == golden
    assert sorted(p.name for p in config.parent.iterdir()) == before, "--print creates no state directory"
    assert "PrivateTmp=yes hides" in done.stderr, "a config under /tmp is invisible to the service: said"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
@pytest.mark.parametrize("mode", ["system", "user"])
def test_systemd_analyze_verify_accepts_both_units(registered: dict[str, object], tmp_path: Path, mode: str) -> None:
    owner = NOBODY if mode == "system" and os.geteuid() == 0 else None
    config = config_in(tmp_path / "node", registered, owner=owner)
    (tmp_path / "node" / "state").mkdir(mode=0o700)
    done = command("--config", str(config), f"--{mode}", "--print", "--name", "talaria-runner-verify")
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "talaria-runner-verify.service"
    unit.write_text(done.stdout, encoding="utf-8")
    verified = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert verified.returncode == 0, verified.stderr
    complaints = [line for line in verified.stderr.splitlines() if "Special user nobody" not in line]
    assert complaints == [], verified.stderr


def test_a_config_readable_by_others_exits_2_and_writes_nothing(registered: dict[str, object], tmp_path: Path) -> None:
    config = config_in(tmp_path / "node", registered, mode=0o644)
    done = command("--config", str(config), "--user", "--print")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "chmod 600" in done.stderr, done.stderr
    assert str(registered["token"]) not in done.stderr


def test_system_as_a_user_without_root_exits_1(
    registered: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In-process with another effective uid: the account nobody cannot run this checkout's interpreter.
    config = config_in(tmp_path / "node", registered)
    monkeypatch.setattr(install_service.os, "geteuid", lambda: 1000)
    assert runner_cli.main(["install-service", "--config", str(config), "--system"], launcher=LAUNCHER) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "talaria runner install-service: --system needs root; use --user for a unit of your own account"
    )
    assert not (tmp_path / "node" / "state").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a root-owned config here")
def test_a_system_unit_for_a_root_owned_config_is_refused(registered: dict[str, object], tmp_path: Path) -> None:
    config = config_in(tmp_path / "node", registered)
    done = command("--config", str(config), "--system", "--print")
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1] == (
        "talaria runner install-service: run the runner as an unprivileged user: chown the config"
    )


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """systemd as init (its marker directory) and the user's unit directory, both in ``tmp_path``."""
    marker = tmp_path / "run-systemd-system"
    marker.mkdir()
    monkeypatch.setattr(install_service, "SYSTEMD_RUNNING", marker)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "systemd" / "user"


def test_a_user_unit_is_written_once_and_a_different_one_only_with_force(
    registered: dict[str, object], tmp_path: Path, systemd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_in(tmp_path / "node", registered)
    args = ["install-service", "--config", str(config), "--user"]
    assert runner_cli.main([*args, "--print"], launcher=LAUNCHER) == 0
    printed = capsys.readouterr().out

    assert runner_cli.main(args, launcher=LAUNCHER) == 0
    out = capsys.readouterr().out
    name = f"talaria-runner-{str(registered['runnerId']).replace('-', '')[:8]}.service"
    unit = systemd / name
    assert unit.read_text(encoding="utf-8") == printed, "the file is what --print shows"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    state = config.parent / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert out.splitlines() == [
        f"created {state} (mode 0700)",
        f"wrote {unit}",
        "next steps (run them yourself):",
        "  systemctl --user daemon-reload",
        f"  systemctl --user enable --now {name}",
        "  loginctl enable-linger  # so that the runner runs while you are logged out",
    ]
    assert sorted(p.name for p in systemd.iterdir()) == [name], "no partial file left"

    assert runner_cli.main(args, launcher=LAUNCHER) == 0
    assert f"{unit} is already this unit; nothing to do" in capsys.readouterr().out

    unit.write_text("[Service]\nExecStart=/bin/true\n", encoding="utf-8")
    assert runner_cli.main(args, launcher=LAUNCHER) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"talaria runner install-service: {unit} exists and differs; --force replaces it"
    )
    assert unit.read_text(encoding="utf-8") == "[Service]\nExecStart=/bin/true\n", "unchanged without --force"
    assert runner_cli.main([*args, "--force"], launcher=LAUNCHER) == 0
    assert unit.read_text(encoding="utf-8") == printed


def test_a_named_system_unit_goes_to_the_system_directory_with_the_state_owned_by_the_runner_s_user(
    registered: dict[str, object], tmp_path: Path, systemd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("a system unit is written by root only")
    config = config_in(tmp_path / "node", registered, owner=NOBODY)
    units = tmp_path / "etc-systemd-system"
    monkeypatch.setattr(install_service, "SYSTEM_UNITS", units)
    assert runner_cli.main(["install-service", "--config", str(config), "--name", "edge"], launcher=LAUNCHER) == 0
    unit = (units / "edge.service").read_text(encoding="utf-8")
    assert "\nUser=nobody\n" in unit and "\nCapabilityBoundingSet=\n" in unit
    assert "Description=Talaria runner edge (" in unit
    state = (config.parent / "state").stat()
    assert (state.st_uid, stat.S_IMODE(state.st_mode)) == (NOBODY, 0o700)


def test_without_systemd_writing_is_refused(
    registered: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_in(tmp_path / "node", registered)
    monkeypatch.setattr(install_service, "SYSTEMD_RUNNING", tmp_path / "missing")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert runner_cli.main(["install-service", "--config", str(config), "--user"], launcher=LAUNCHER) == 1
    assert "systemd is not running here" in capsys.readouterr().err
    assert not (tmp_path / "xdg").exists()
    assert not (config.parent / "state").exists()


@pytest.mark.parametrize("name", ["../evil", "-x", "a b", "", "x" * 201])
def test_a_bad_unit_name_exits_2(registered: dict[str, object], tmp_path: Path, name: str) -> None:
    config = config_in(tmp_path / "node", registered)
    done = command("--config", str(config), "--user", "--print", f"--name={name}")
    assert done.returncode == 2, done.stderr
    assert "is not a unit name" in done.stderr
    assert done.stdout == ""


def test_runner_options_go_into_exec_start(registered: dict[str, object], tmp_path: Path) -> None:
    config = config_in(tmp_path / "node", registered)
    done = command("--config", str(config), "--user", "--print", "--drain-timeout", "60")
    assert done.returncode == 0, done.stderr
    assert f"\nExecStart={' '.join(LAUNCHER)} --config {config} --drain-timeout 60\n" in done.stdout
    every = command("--config", str(config), "--user", "--print", "--metrics-listen", "[::1]:9100", "--log-format",
                    "json")  # fmt: skip
    assert every.returncode == 0, every.stderr
    assert f" --config {config} --metrics-listen [::1]:9100 --log-format json\n" in every.stdout


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", ""])
def test_a_drain_timeout_that_is_not_whole_seconds_exits_2(
    registered: dict[str, object], tmp_path: Path, value: str
) -> None:
    config = config_in(tmp_path / "node", registered)
    argv = [sys.executable, "-m", "talaria", "runner", "--config", str(config), f"--drain-timeout={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "is not a whole number of seconds" in done.stderr
    assert not (tmp_path / "node" / "state").exists(), "refused before anything started"
