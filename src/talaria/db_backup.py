"""``talaria db backup --to FILE`` (operations.md 7.1): a consistent copy of a SQLite hub's database while it serves,
and its audit key beside it.

SQLite's online backup API copies every page in one step on a connection of its own: one read snapshot, so the copy
is consistent and never restarted by writes, which go on in the WAL meanwhile. The copy is written to
``FILE.partial`` (0600), switched out of WAL mode (one self-contained file), checked (``integrity_check``, the
migrations readable, the audit chain verified), fsynced and only then linked to ``FILE``, which must not exist. The
audit key (chat.md 8) goes to ``FILE.audit.key`` (0600); ``secret.key`` does not (restoring without it only ends web
sessions). On any failure nothing is left behind.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from talaria.lifecycle.audit import ChainReport, verify
from talaria.lifecycle.audit_key import FILE_NAME as AUDIT_KEY_NAME
from talaria.store import migrations
from talaria.store.open import SQLITE_NAME
from talaria.store.sqlite import SQLiteStore, copy_pages, integrity, self_contained


class BackupRefused(Exception):
    """One line for the command line (exit 1); nothing was written."""


@dataclass(frozen=True)
class Backup:
    path: Path
    size: int
    chain: ChainReport

    def line(self) -> str:
        return f"backup written: {self.path} ({self.size} bytes, {self.chain.line()})"


def key_path(target: Path) -> Path:
    return target.with_name(target.name + ".audit.key")


def _create_private(path: Path) -> int:
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise BackupRefused(f"{path} exists; remove it or choose another file") from None
    except OSError as exc:
        raise BackupRefused(f"cannot write {path}: {exc.strerror}") from None


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check(partial: Path) -> ChainReport:
    """The copy's integrity, its migrations and its audit chain; ``BackupRefused`` when one fails."""
    checked = integrity(partial)
    if checked != "ok":
        raise BackupRefused(f"the copy failed integrity_check: {checked}")
    store = SQLiteStore(partial)
    try:
        if migrations.current(store).get("core", 0) == 0:
            raise BackupRefused("the database holds no Talaria schema")
        chain = verify(store)
    finally:
        store.close()
    self_contained(partial)  # the store switched it to WAL
    if not chain.ok:
        raise BackupRefused(f"the copy's {chain.line()}")
    return chain


def _copy_key(source: Path, target: Path) -> None:
    try:
        key = source.read_bytes()
    except OSError as exc:
        raise BackupRefused(f"cannot read the audit key {source}: {exc.strerror}") from None
    fd = _create_private(target)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _name(partial: Path, target: Path) -> None:
    """Give the checked copy its name, never replacing a file made meanwhile: a hard link where the filesystem has
    them, else (FAT, some network shares) a rename after one more check."""
    try:
        os.link(partial, target)
        return
    except FileExistsError:
        raise BackupRefused(f"{target} exists; remove it or choose another file") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EOPNOTSUPP):
            raise
    if target.exists() or target.is_symlink():
        raise BackupRefused(f"{target} exists; remove it or choose another file")
    os.rename(partial, target)


def _remove(made: list[Path]) -> None:
    for path in made:
        for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
            leftover.unlink(missing_ok=True)


def backup_sqlite(data_dir: Path, target: Path, say: Callable[[str], None] = lambda line: None) -> Backup:
    """Copy the data directory's database to ``target`` and its audit key beside it (operations.md 7.1)."""
    source = data_dir / SQLITE_NAME
    if not source.is_file():
        raise BackupRefused(f"no Talaria database in {data_dir}")
    target = target.absolute()
    key = key_path(target)
    for path in (target, key):
        if path.exists() or path.is_symlink():
            raise BackupRefused(f"{path} exists; remove it or choose another file")
    partial = target.with_name(target.name + ".partial")
    os.close(_create_private(partial))
    made: list[Path] = [partial]
    try:
        say(f"copying {source}")
        copy_pages(source, partial)
        say("checking the copy (integrity, migrations, audit chain)")
        chain = _check(partial)
        with open(partial, "rb") as handle:
            os.fsync(handle.fileno())
        _copy_key(data_dir / AUDIT_KEY_NAME, key)
        made.append(key)
        _name(partial, target)
        made.append(target)
        partial.unlink(missing_ok=True)  # gone already after a rename
        fsync_dir(target.parent)
        return Backup(target, target.stat().st_size, chain)
    except OSError as exc:
        _remove(made)
        raise BackupRefused(f"cannot write the backup: {exc.strerror or exc}") from None
    except BaseException:
        _remove(made)
        raise
    finally:
        partial.unlink(missing_ok=True)
