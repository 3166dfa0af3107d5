"""The systemd unit of a runner (operations.md 2.2): restart on a crash only, a sandbox in which the runner writes
nothing but its state directory, and lines straight to the journal.

Rendering is pure: the paths, the account and the mode come in, the unit's text goes out (golden-file tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_SPECIAL = set(" \t\n\"'\\;$%")


@dataclass(frozen=True, slots=True)
class UnitSpec:
    name: str  # the unit's file name, ``….service``
    runner_id: str
    command: tuple[str, ...]  # ExecStart: absolute interpreter and archive, or talaria and ``runner``, and options
    state_dir: Path  # ``<config dir>/state``, the one writable path
    system: bool  # a system unit (User=/Group=, no capabilities) or a user unit
    user: str | None = None  # system units: the config's owner
    group: str | None = None


def quote(word: str) -> str:
    """One ExecStart word as systemd reads it: ``%`` and ``$`` doubled (no specifier, no variable), and a word with
    a space, a quote, a backslash or a semicolon in double quotes with ``\\`` and ``"`` escaped."""
    text = word.replace("%", "%%").replace("$", "$$")
    if not text or _SPECIAL & set(word) - {"%", "$"}:
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def render(spec: UnitSpec) -> str:
    unit_name = spec.name.removesuffix(".service")
    lines = [
        "# Written by `talaria runner install-service` (operations.md 2). Edit the runner's options by running it",
        "# again with --force; systemctl stop is a graceful stop, systemctl kill -s SIGQUIT a drain.",
        "[Unit]",
        f"Description=Talaria runner {unit_name} ({spec.runner_id})",
        "After=network-online.target",
        "Wants=network-online.target",
        "StartLimitIntervalSec=300",
        "StartLimitBurst=10",
        "",
        "[Service]",
        "Type=exec",
        f"ExecStart={_command(spec.command)}",
    ]
    if spec.system:
        lines += [f"User={spec.user}", f"Group={spec.group}"]
    lines += [
        "Restart=on-failure",
        "RestartSec=5",
        "RestartPreventExitStatus=2 3",
        "TimeoutStopSec=30",
        "Environment=PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ReadWritePaths={quote(str(spec.state_dir))}",
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "SystemCallArchitectures=native",
        "UMask=0077",
    ]
    if spec.system:
        lines.append("CapabilityBoundingSet=")
    lines += ["", "[Install]", f"WantedBy={'multi-user.target' if spec.system else 'default.target'}", ""]
    return "\n".join(lines)


def _command(words: Sequence[str]) -> str:
    return " ".join(quote(word) for word in words)
