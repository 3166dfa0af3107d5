"""The runner's state directory and its single-instance lock (runner-protocol.md section 3).

``<directory of the config file>/state/<runnerId>``, mode 0700, holds ``runner-commands.sqlite3`` and
``runner.lock``. An exclusive, non-blocking ``flock`` on ``runner.lock`` is held for the lifetime of the
``StateDir``; the operating system drops it when the process ends, however it ends, so a crash never
leaves a stale lock behind. POSIX only (``fcntl``), like the rest of the runner.

Decisions where the specification is silent:

- An existing runner directory that is a symbolic link, is not owned by this user, or gives any
  permission bit to group or other is refused, never repaired: a looser directory may have been
  read or tampered with, and the operator should look before it is used again (``chmod 700``).
- The ``state`` directory is created with mode 0700 when missing; an existing one is refused if group
  or other may write to it (they could replace the runner directory).
- The lock file records the holder's process id, shown in the "busy" message.
- Every regular file in the runner directory is made 0600 at open (the receipts file of an older release, a
  restored backup): the directory is private already, so a looser file there is repaired, not refused, and
  ``StateDir.tightened`` lists what changed. New files are created 0600 whatever the umask.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from talaria.runner_json import UUID_RE

LOCK_NAME: Final = "runner.lock"
RECEIPTS_NAME: Final = "runner-commands.sqlite3"


class StateDirError(Exception):
    """The state directory cannot be used (the CLI exits with status 2)."""


class StateDirBusy(StateDirError):
    """Another runner holds the directory's lock."""


def _mkdir_private(path: Path) -> bool:
    """Create ``path`` with mode 0700; False if it already exists."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    os.chmod(path, 0o700)  # the umask may have removed owner bits
    return True


def _check_parent(path: Path) -> None:
    st = path.stat()  # follows a symbolic link: an operator may place `state` on another disk
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"{path} is not a directory")
    if st.st_mode & 0o022:
        raise StateDirError(f"{path} is writable by group or other; run chmod 700 {path}")


def _check_private(path: Path) -> None:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"{path} must be a directory, not a symbolic link or a file")
    if st.st_uid != os.geteuid():
        raise StateDirError(f"{path} belongs to another user")
    if st.st_mode & 0o077:
        raise StateDirError(
            f"{path} gives permissions to group or other (mode {stat.S_IMODE(st.st_mode):04o}); run chmod 700 {path}"
        )


def _private_files(path: Path) -> list[str]:
    """Set every regular file directly in ``path`` to 0600; the paths changed."""
    changed: list[str] = []
    for entry in os.scandir(path):
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != 0o600:
            os.chmod(entry.path, 0o600)
            changed.append(entry.path)
    return changed


class StateDir:
    """An open, locked state directory. Use ``StateDir.open``; ``close()`` releases the lock (idempotent)."""

    def __init__(self, path: Path, lock_fd: int, tightened: list[str] | None = None) -> None:
        self.path = path
        self._fd: int | None = lock_fd
        self._close_lock = threading.Lock()
        self.tightened = tightened or []

    @classmethod
    def open(cls, config_path: Path, runner_id: str) -> StateDir:
        """Create (if needed), check and lock ``<dir of config_path>/state/<runner_id>``.

        Raises ``StateDirBusy`` if another runner (in any process) holds it, ``StateDirError`` for a
        directory that cannot be used. Not retried: the caller exits.
        """
        if not UUID_RE.match(runner_id):
            raise StateDirError("the runner id must be a lower-case UUID")
        parent = Path(os.path.abspath(config_path)).parent / "state"
        path = parent / runner_id
        try:
            if not _mkdir_private(parent):
                _check_parent(parent)
            if not _mkdir_private(path):
                _check_private(path)
            tightened = _private_files(path)
            fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateDirError(f"cannot use the state directory {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f" (process {holder})" if holder else ""
            raise StateDirBusy(f"another runner uses the state directory {path}{who}") from None
        except OSError as exc:
            os.close(fd)
            raise StateDirError(f"cannot lock {path / LOCK_NAME}: {exc.strerror}") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the pid is only a hint for the busy message
        return cls(path, fd, tightened)

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_NAME

    @property
    def receipts_path(self) -> Path:
        return self.path / RECEIPTS_NAME

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        """Release the lock. Idempotent; safe from any thread."""
        with self._close_lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StateDir({str(self.path)!r}, {'closed' if self.closed else 'locked'})"


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
