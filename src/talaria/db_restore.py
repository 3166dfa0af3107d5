"""``talaria db restore --from FILE --yes`` (operations.md 7.1) and ``talaria db mark-restored --yes`` (7.3): put a
backup in place of a hub's database, offline, and mark it so that the first start treats it as restored
(``hub/restored.py``: sessions end, runners get new epochs, unfinished work ends unless resumed).

SQLite, in this order (each refusal is one line and exit 1, the data directory as it was):

| step | does | refusal |
|---|---|---|
| 1 | takes ``hub.lock`` | ``the hub is running; stop it first`` |
| 2 | ``FILE`` and ``FILE.audit.key`` exist | names the missing one |
| 3 | copies ``FILE``'s pages to ``talaria.sqlite3.restoring`` (0600; ``FILE`` is only read) | names the file |
| 4 | checks the copy: ``integrity_check``, a Talaria schema no newer than this release, audit verify | names it |
| 5 | applies this release's pending migrations to the copy and writes the restore marker into it | |
| 6 | the current database is checkpointed into one file (no ``-wal`` or hot journal may be left beside it, which
      SQLite would apply to the restored file) and keeps its content as ``talaria.sqlite3.before-restore-<ms>`` (a
      hard link, or a copy), ``audit.key`` as ``audit.key.before-restore-<ms>`` | ``move talaria.sqlite3 and its -wal
      and -shm files out of DIR`` |
| 7 | the backup's key is written as ``audit.key.restoring``, the copy renamed to ``talaria.sqlite3`` (the commit
      point), then the key to ``audit.key``, fsynced | |

Until the copy's rename the current database stays in place, whole: an interrupted restore leaves the hub as it was
(run the restore again). The marker records the backup key's sha256, so a start after a restore interrupted between
the two renames finishes the key's. ``secret.key`` stays (the restored hub ends every web session anyway).

PostgreSQL is restored with its own tools into a database no replica uses; ``mark-restored`` then applies pending
migrations, seals every pending audit row in (``xact``, ``pos``) order whatever the horizon (a logical copy carries
the old server's transaction ids), checks the chain and writes the marker, all refused while a replica is live.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from talaria.db_backup import fsync_dir, key_path
from talaria.errors import StoreUnavailable
from talaria.hub import restored
from talaria.hub.replica import LIVE_MS
from talaria.lifecycle.audit import ChainReport, seal_all, verify
from talaria.lifecycle.audit_key import FILE_NAME as AUDIT_KEY_NAME
from talaria.store import data_dir as data_dirs
from talaria.store import hub_lock, migrations
from talaria.store.interface import Store
from talaria.store.open import SQLITE_NAME
from talaria.store.sqlite import SQLiteStore, copy_pages, integrity, self_contained

Say = Callable[[str], None]


class RestoreRefused(Exception):
    """One line for the command line (exit 1); the data directory or database is as it was."""


@dataclass(frozen=True)
class Restored:
    chain: ChainReport
    waiting: restored.Unfinished
    resume_unfinished: bool
    aside: Path | None = None  # the previous database's new name (SQLite)

    def lines(self) -> list[str]:
        """What the first start will do, and what the operator should review (operations.md 7.2)."""
        ends = ["ends every web session", "gives every runner a new epoch"]
        waiting = self.waiting
        if self.resume_unfinished:
            ends.append(f"leaves {waiting.jobs} unfinished job(s), {waiting.turns} queued or pending chat turn(s) and "
                        f"{waiting.goals} team goal(s) to go on (any of them that ran after the backup point may "
                        "run again)")  # fmt: skip
        else:
            ends.append(f"cancels {waiting.jobs} unfinished job(s), ends {waiting.turns} queued or pending chat "
                        f"turn(s) uncertain and stops {waiting.goals} team goal(s), each with the reason "
                        f"{restored.RESTORED}")  # fmt: skip
        return [
            "at its next start the hub " + "; ".join(ends),
            "review accounts and runners: changes made to them after the backup point are lost",
            "a runner whose token was rotated once since the backup falls back to its previous token; one rotated more "
            "often must be registered again",
        ]


def _refuse_newer(schema: migrations.Schema) -> None:
    if schema.ahead:
        newer = ", ".join(f"{name} {version} > {schema.want[name]}" for name, version in schema.ahead.items())
        raise RestoreRefused(f"the backup was made by a newer release ({newer}); restore it with that release")


def _migrate(store: Store, say: Say, *, lock_held: bool = False) -> None:
    for item in migrations.upgrade(store, lock_held=lock_held):
        say(f"applied {item}")


def _check_and_mark(
    copy: Path, source: Path, key: bytes, *, resume_unfinished: bool, now_ms: int, say: Say
) -> Restored:
    checked = integrity(copy)
    if checked != "ok":
        raise RestoreRefused(f"the backup failed integrity_check: {checked}")
    store = SQLiteStore(copy)
    try:
        schema = migrations.schema(store)
        if schema.have.get("core", 0) == 0:
            raise RestoreRefused(f"{source} holds no Talaria schema")
        _refuse_newer(schema)
        chain = verify(store)
        if not chain.ok:
            raise RestoreRefused(f"the backup's {chain.line()}")
        say(f"backup checked: {chain.line()}")
        _migrate(store, say)
        waiting = restored.mark(store, source=source.name, resume_unfinished=resume_unfinished, now_ms=now_ms,
                                audit_key_sha256=hashlib.sha256(key).hexdigest())  # fmt: skip
    finally:
        store.close()
    self_contained(copy)  # the store switched it to WAL
    return Restored(chain, waiting, resume_unfinished)


def _write_private(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)  # a leftover of an interrupted restore
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, data_dirs.FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _check_current(directory: Path) -> None:
    """Before the current database is touched (the checked copy is ready): the current database folded into one file,
    so that it stays whole in place until the copy replaces it, and no ``-wal`` or hot journal left that SQLite would
    apply to the restored file."""
    current = directory / SQLITE_NAME
    move_out = f"move {SQLITE_NAME} and its -wal and -shm files out of {directory}, then restore again"
    if current.exists():
        try:
            self_contained(current)
        except StoreUnavailable as exc:
            raise RestoreRefused(f"the current database cannot be checkpointed ({exc.message}); {move_out}") from None
    for suffix in ("-wal", "-journal"):
        stray = Path(f"{current}{suffix}")
        if stray.exists():
            raise RestoreRefused(f"{stray.name} is left without its database; {move_out}")
    Path(f"{current}-shm").unlink(missing_ok=True)  # an index of a -wal that is gone


def _keep_aside(path: Path, aside: Path) -> bool:
    """``aside`` holds ``path``'s content from now on while ``path`` stays in place: a hard link, or a copy (fsynced)
    where the filesystem has no hard links. False when there is no ``path``."""
    if not path.exists():
        return False
    try:
        os.link(path, aside)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EOPNOTSUPP):
            raise
        _write_private(aside, path.read_bytes())
    return True


def _set_current_aside(directory: Path, now_ms: int, say: Say) -> Path | None:
    """Step 6: the current database and key keep their content under ``.before-restore-<ms>`` names."""
    aside = directory / f"{SQLITE_NAME}.before-restore-{now_ms}"
    kept = _keep_aside(directory / SQLITE_NAME, aside)
    _keep_aside(directory / AUDIT_KEY_NAME, directory / f"{AUDIT_KEY_NAME}.before-restore-{now_ms}")
    if kept:
        say(f"the current database was kept as {aside}")
    return aside if kept else None


def _leftovers(copy: Path) -> list[Path]:
    return [copy, Path(f"{copy}-wal"), Path(f"{copy}-shm"), Path(f"{copy}-journal")]


def restore_sqlite(
    directory: Path, source: Path, *, resume_unfinished: bool, now_ms: int, say: Say = lambda line: None
) -> Restored:
    """Steps 1-7 of the module docstring."""
    source = source.absolute()
    key_file = key_path(source)
    if not source.is_file():
        raise RestoreRefused(f"{source} is not a file")
    if not key_file.is_file():
        raise RestoreRefused(f"the backup's audit key {key_file} is missing")
    try:
        data_dirs.prepare(directory)
        lock = hub_lock.hold(directory)
    except StoreUnavailable as exc:
        held = exc.message == hub_lock.HELD
        raise RestoreRefused("the hub is running; stop it first" if held else exc.message) from None
    copy = directory / f"{SQLITE_NAME}.restoring"
    in_flight = directory / restored.KEY_IN_FLIGHT
    committed = False
    try:
        for leftover in _leftovers(copy):
            leftover.unlink(missing_ok=True)
        key = key_file.read_bytes()
        data_dirs.create_private(copy)
        say(f"copying {source}")
        try:
            copy_pages(source, copy)
        except StoreUnavailable as exc:
            raise RestoreRefused(exc.message) from None
        say("checking the copy (integrity, migrations, audit chain)")
        done = _check_and_mark(copy, source, key, resume_unfinished=resume_unfinished, now_ms=now_ms, say=say)
        with open(copy, "rb") as handle:
            os.fsync(handle.fileno())
        _check_current(directory)  # after the backup's checks: a refused backup leaves the current file untouched
        _write_private(in_flight, key)
        aside = _set_current_aside(directory, now_ms, say)
        os.rename(copy, directory / SQLITE_NAME)
        committed = True  # from here the restored database (and its marker) is the hub's
        try:
            os.rename(in_flight, directory / AUDIT_KEY_NAME)
            fsync_dir(directory)
        except OSError as exc:
            say(f"the backup's audit key could not be renamed ({exc.strerror}); the next start puts it in place")
        say(f"restored {source} into {directory / SQLITE_NAME}")
        return Restored(done.chain, done.waiting, resume_unfinished, aside)
    except OSError as exc:
        raise RestoreRefused(f"cannot restore: {exc.strerror or exc}") from None
    finally:
        for leftover in _leftovers(copy):
            leftover.unlink(missing_ok=True)
        if not committed:
            in_flight.unlink(missing_ok=True)
        lock.release()


def mark_restored(store: Store, *, resume_unfinished: bool, now_ms: int, say: Say = lambda line: None) -> Restored:
    """7.3: a PostgreSQL database restored with its own tools, marked before any replica starts on it. Everything
    runs holding the migration lock, which a starting replica takes to look for the marker."""
    with store.read() as tx:
        found = tx.one("schema_version_exists")
    if found is None or not found["present"]:
        raise RestoreRefused("the database holds no Talaria schema")
    with store.migrating():
        _refuse_live(store, now_ms)
        schema = migrations.schema(store)
        if schema.have.get("core", 0) == 0:
            raise RestoreRefused("the database holds no Talaria schema")
        _refuse_newer(schema)
        sealed = seal_all(store, regardless_of_horizon=True)
        say(f"sealed {sealed} pending audit event(s)")
        chain = verify(store)
        if not chain.ok:
            raise RestoreRefused(f"the restored database's {chain.line()}")
        say(chain.line())
        _migrate(store, say, lock_held=True)
        waiting = restored.mark(store, source="postgresql", resume_unfinished=resume_unfinished, now_ms=now_ms)
    return Restored(chain, waiting, resume_unfinished)


def _refuse_live(store: Store, now_ms: int) -> None:
    with store.read() as tx:
        live = tx.all("hub_replica_live", since=now_ms - LIVE_MS)
    if live:
        raise RestoreRefused("a hub replica uses this database; stop every replica first")
