"""One SQLite directory, one hub (scale.md 1): ``talaria hub`` holds an exclusive ``flock`` on
``<data_dir>/hub.lock`` for its life; a second hub on the same directory stops with one line. The lock is the
kernel's, so it ends with the process however it ends (a SIGKILLed hub leaves no stale lock), and it is per open
file, so two hubs in one process (tests) exclude each other too."""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from talaria.errors import StoreUnavailable
from talaria.store.data_dir import FILE_MODE

LOCK_NAME = "hub.lock"
HELD = "another hub uses this data directory"


@dataclass
class HubLock:
    fd: int | None

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def hold(data_dir: Path) -> HubLock:
    """Take ``hub.lock`` in ``data_dir`` (which exists); ``StoreUnavailable`` saying so when another hub has it."""
    path = data_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        raise StoreUnavailable(f"cannot open {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreUnavailable(HELD) from None
    except OSError as exc:
        os.close(fd)
        raise StoreUnavailable(f"cannot lock {path}: {exc.strerror}") from None
    return HubLock(fd)
