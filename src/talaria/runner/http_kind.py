"""The ``http`` command: read-only Hermes REST inside the allow-list (runner-protocol.md 7.1, 11)."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from talaria.hermes.rest import HermesRest, ReplyTooLarge
from talaria.runner.errors import CommandError

MAX_REPLY_BYTES = 8 * 1024 * 1024
DOWNLOAD = "/api/files/download"
_FIXED = frozenset({"/api/status", "/api/profiles", "/api/config", DOWNLOAD, "/api/plugins/talaria/capabilities"})
_MESSAGES = re.compile(r"^/api/sessions/([^/]+)/messages\Z")
_NO_PROFILE_CHECK = frozenset({"/api/status", "/api/profiles"})
_KEPT_HEADERS = ("content-type", "content-length", "content-disposition")
_COMPARE_CHUNK = 1024 * 1024
# Directories on the walk are opened only to be walked through: O_PATH needs no read permission on them, as realpath
# and Hermes need none (Linux; elsewhere a plain read-only open).
_DIRECTORY = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC


def _forbidden() -> CommandError:
    return CommandError("runner_http_forbidden", "this request is not on the runner's read-only allow-list")


def check_payload(payload: Any) -> tuple[str, list[tuple[str, str]]]:
    """The path and query pairs of an allowed request; raises ``runner_command_forbidden`` or
    ``runner_http_forbidden``."""
    if not isinstance(payload, dict) or not set(payload) <= {"path", "method", "search", "body"}:
        raise CommandError("runner_command_forbidden", "malformed http payload")
    path, method, search = payload.get("path"), payload.get("method"), payload.get("search", "")
    if not isinstance(path, str) or not isinstance(search, str) or "body" in payload or method != "GET":
        raise _forbidden()
    if search and not search.startswith("?"):
        raise _forbidden()
    if ".." in path or "%" in path or "\\" in path or "//" in path:
        raise _forbidden()
    if path not in _FIXED and not _MESSAGES.match(path):
        raise _forbidden()
    pairs = [(k, v) for k, v in parse_qsl(search[1:], keep_blank_values=True) if k not in ("token", "ticket")]
    return path, pairs


async def run_http(
    payload: Any,
    *,
    rest: HermesRest,
    allowed_profiles: tuple[str, ...],
    artifact_roots: tuple[str, ...],
    session_profile: Callable[[str], str | None],
) -> dict[str, Any]:
    path, pairs = check_payload(payload)
    query = dict(pairs)
    checked = path not in _NO_PROFILE_CHECK and path != DOWNLOAD
    if checked and query.get("profile", "default") not in allowed_profiles:
        raise CommandError("runner_profile_forbidden", "this profile is not allowed on this node")
    match = _MESSAGES.match(path)
    if match:
        stored = match.group(1)
        if session_profile(stored) != query.get("profile", "default"):
            raise CommandError("runner_session_forbidden", "this session was not opened through this runner")
    export = await asyncio.to_thread(open_export, query.get("path"), artifact_roots) if path == DOWNLOAD else None
    try:
        if export is not None:
            pairs = [("path", export.real)]
        target = path + (f"?{urlencode(pairs)}" if pairs else "")
        try:
            reply = await rest.get(target, max_bytes=MAX_REPLY_BYTES)
        except ReplyTooLarge as exc:
            raise CommandError("runner_payload_limit", "Hermes' reply is larger than 8 MiB") from exc
        if export is not None and 200 <= reply.status < 300 and not await asyncio.to_thread(export.holds, reply.body):
            raise CommandError("runner_artifact_forbidden", "the file changed while it was exported")
    finally:
        if export is not None:
            export.close()
    headers = {name: reply.headers[name] for name in _KEPT_HEADERS if name in reply.headers}
    return {"status": reply.status, "headers": headers, "body": base64.b64encode(reply.body).decode()}


def _refused(message: str = "this path is outside the node's artifact roots") -> CommandError:
    return CommandError("runner_artifact_forbidden", message)


@dataclass
class ExportFile:
    """An export's file, opened by the runner itself before Hermes reads it (ADR 0065).

    Hermes reads ``real`` by name, a moment later; between the two, anyone who can write in an artifact root could
    swap a directory of the path for a symbolic link, or the file for another. So the runner holds the file it
    checked open, and a 2xx answer is passed on only when its body is that file's bytes."""

    real: str
    fd: int

    def holds(self, body: bytes) -> bool:
        """True when ``body`` is the held file's bytes from its start (a file that grew since Hermes read it is
        still the same file)."""
        offset = 0
        while offset < len(body):
            chunk = os.pread(self.fd, min(_COMPARE_CHUNK, len(body) - offset), offset)
            if not chunk or chunk != body[offset : offset + len(chunk)]:
                return False
            offset += len(chunk)
        return True

    def close(self) -> None:
        os.close(self.fd)


def export_path(path: str | None, roots: tuple[str, ...]) -> str:
    """The real path of ``path`` when it lies in an artifact root (11.3), else ``runner_artifact_forbidden``."""
    if not path or not roots or not os.path.isabs(path):
        raise _refused()
    try:
        real = os.path.realpath(path, strict=True)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte
        raise _refused() from exc
    for root in roots:
        try:
            real_root = os.path.realpath(root, strict=True)
        except OSError:
            continue
        if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
            return real
    raise _refused()


def open_export(path: str | None, roots: tuple[str, ...]) -> ExportFile:
    """``export_path``, then the file opened without following any symbolic link on the way: it must be a regular
    file with one link (a hard link can bring any file of the file system into a root), else
    ``runner_artifact_forbidden``."""
    real = export_path(path, roots)
    parent = os.open("/", _DIRECTORY)
    try:
        *directories, name = real.strip(os.sep).split(os.sep)
        for part in directories:  # a part swapped for a link since realpath fails here (ELOOP, ENOTDIR)
            child = os.open(part, _DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
            os.close(parent)
            parent = child
        seen = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISREG(seen.st_mode):  # checked before opening: a FIFO or a device is never opened
            raise _refused("only a regular file can be exported")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except PermissionError as exc:
        raise _refused("the runner may not read this file") from exc
    except OSError as exc:
        raise _refused() from exc
    finally:
        os.close(parent)
    held = os.fstat(fd)
    if not stat.S_ISREG(held.st_mode) or (held.st_dev, held.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        raise _refused("the file changed while it was checked")
    if held.st_nlink != 1:
        os.close(fd)
        raise _refused("a file with more than one hard link cannot be exported")
    return ExportFile(real, fd)
