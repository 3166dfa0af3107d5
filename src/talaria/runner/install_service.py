"""``talaria runner install-service`` (operations.md 2.1): check the runner's configuration, then print or write
its systemd unit and say how to start it. It never runs ``systemctl``.

Exit statuses: 0 written (or printed, or already as wanted), 1 refused (``--system`` without root, a root-owned
config for a system unit, a different unit without ``--force``, no systemd), 2 an invalid configuration.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from talaria.runner.config import load_config
from talaria.runner.service_unit import UnitSpec, render
from talaria.runner_json import ConfigError

SYSTEM_UNITS = Path("/etc/systemd/system")
SYSTEMD_RUNNING = Path("/run/systemd/system")  # present when systemd is the init system (sd_booted)
PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"))  # noqa: S108 - paths the unit hides, never written
_NAME = re.compile(r"[A-Za-z0-9:_.@-]{1,200}")


class Refused(Exception):
    """The command refuses; the message is its one line."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Request:
    config: Path
    system: bool | None  # None: system as root, else user
    print_only: bool
    name: str | None
    force: bool
    launcher: tuple[str, ...]  # the absolute words that start the runner, before --config
    options: tuple[str, ...] = ()  # runner options for ExecStart, as given


def install_service(request: Request) -> int:
    """Run the command; status lines on stdout (the unit itself with ``--print``), a refusal on stderr."""
    try:
        lines = _install(request)
    except Refused as exc:
        print(f"talaria runner install-service: {exc}", file=sys.stderr)
        return exc.status
    for line in lines:
        print(line)
    return 0


def _install(request: Request) -> list[str]:
    config_path = Path(os.path.abspath(request.config))
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise Refused(str(exc), status=2) from None
    root = os.geteuid() == 0
    system = root if request.system is None else request.system
    if system and not root and not request.print_only:
        raise Refused("--system needs root; use --user for a unit of your own account")
    owner = config_path.stat()
    user = group = None
    if system:
        if owner.st_uid == 0:
            raise Refused("run the runner as an unprivileged user: chown the config")
        user, group = _account(owner.st_uid, owner.st_gid)
    name = _unit_name(request.name, config.runner_id)
    state_dir = config_path.parent / "state"
    command = (*request.launcher, "--config", str(config_path), *request.options)
    unit = render(UnitSpec(name, config.runner_id, command, state_dir, system, user, group))
    if any(config_path.is_relative_to(hidden) for hidden in PRIVATE_TMP):
        print(
            f"warning: {config_path} is under a temporary directory, which PrivateTmp=yes hides from the service;"
            " keep the config elsewhere",
            file=sys.stderr,
        )
    if request.print_only:
        return [unit.rstrip("\n")]
    if not SYSTEMD_RUNNING.is_dir():
        raise Refused(f"systemd is not running here (no {SYSTEMD_RUNNING}); --print shows the unit")
    folder = SYSTEM_UNITS if system else _user_units()
    target = folder / name
    if target.exists() and target.read_text(encoding="utf-8", errors="replace") == unit:
        state_note = _make_state_dir(state_dir, owner.st_uid if system else None, owner.st_gid if system else None)
        return [*state_note, f"{target} is already this unit; nothing to do", *_next_steps(name, system)]
    if target.exists() and not request.force:
        raise Refused(f"{target} exists and differs; --force replaces it")
    state_note = _make_state_dir(state_dir, owner.st_uid if system else None, owner.st_gid if system else None)
    folder.mkdir(parents=True, exist_ok=True)
    _write_atomically(target, unit)
    return [*state_note, f"wrote {target}", *_next_steps(name, system)]


def _account(uid: int, gid: int) -> tuple[str, str]:
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        raise Refused(f"the config's owner {uid} has no account name; chown it to the runner's user") from None
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return user, group


def _unit_name(given: str | None, runner_id: str) -> str:
    if given is None:
        return f"talaria-runner-{runner_id.replace('-', '')[:8]}.service"
    name = given if given.endswith(".service") else f"{given}.service"
    if not _NAME.fullmatch(name) or name.startswith(("-", ".")):
        raise Refused(f"--name {given!r} is not a unit name (letters, digits and :_.@- only)", status=2)
    return name


def _user_units() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def _make_state_dir(path: Path, uid: int | None, gid: int | None) -> list[str]:
    """``<config dir>/state`` (0700, owned by the runner's user) when missing: the unit's one writable path."""
    if path.exists():
        return []
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    if uid is not None and gid is not None:
        os.chown(path, uid, gid)
    return [f"created {path} (mode 0700)"]


def _write_atomically(target: Path, text: str) -> None:
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        partial.chmod(0o644)
        partial.replace(target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _next_steps(name: str, system: bool) -> list[str]:
    user = "" if system else " --user"
    steps = [
        "next steps (run them yourself):",
        f"  systemctl{user} daemon-reload",
        f"  systemctl{user} enable --now {name}",
    ]
    if not system:
        steps.append("  loginctl enable-linger  # so that the runner runs while you are logged out")
    return steps
