"""The modes of the hub's data directory (web-api.md 9): the directory 0700 and every file in it 0600, whatever
the umask. An existing directory is tightened to those modes at start, each change logged; when a mode cannot be
set, ``StoreUnavailable`` names the path and the caller refuses to start.

SQLite creates the database file with the process umask, and its ``-wal`` and ``-shm`` files with the database
file's mode, so the database file is created here, 0600, before SQLite opens it.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Final

import structlog

from talaria.errors import StoreUnavailable

DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600

log = structlog.get_logger("talaria.store")


def prepare(data_dir: Path) -> None:
    """Create ``data_dir`` (its parents with the usual modes) or tighten it and everything in it. Idempotent."""
    try:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(data_dir, DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StoreUnavailable(f"cannot create the data directory {data_dir}: {exc.strerror}") from None
    tighten(data_dir)


def tighten(data_dir: Path) -> None:
    """Set ``data_dir`` (a symbolic link to it is followed) to 0700, and every directory below it to 0700 and every
    regular file to 0600; symbolic links inside are left alone."""
    _set(data_dir, DIR_MODE, follow=True)
    for root, dirs, files in os.walk(data_dir):
        for name in dirs:
            _set(Path(root) / name, DIR_MODE)
        for name in files:
            _set(Path(root) / name, FILE_MODE)


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (an empty file is an empty SQLite database)."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE))
    except OSError as exc:
        raise StoreUnavailable(f"cannot create {path}: {exc.strerror}") from None
    _set(path, FILE_MODE)  # the umask may have removed owner bits


def key_file(path: Path) -> bytes:
    """The 32 bytes kept in ``path`` (``secret.key``, ``audit.key``), made with ``secrets`` and mode 0600 at first
    use. The bytes are never logged."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return path.read_bytes()
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    return key


def _set(path: Path, mode: int, *, follow: bool = False) -> None:
    try:
        st = path.stat() if follow else path.lstat()
    except FileNotFoundError:
        return  # gone meanwhile (SQLite removes -wal and -shm when its last connection closes)
    except OSError as exc:
        raise StoreUnavailable(f"cannot read the mode of {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return
    before = stat.S_IMODE(st.st_mode)
    if before == mode:
        return
    try:
        os.chmod(path, mode)
    except OSError as exc:
        raise StoreUnavailable(f"cannot set mode {mode:04o} on {path}: {exc.strerror}") from None
    log.info("mode_tightened", path=str(path), before=f"{before:04o}", after=f"{mode:04o}")
