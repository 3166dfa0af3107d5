"""``talaria db copy --to postgresql://…`` (scale.md 5): move a stopped SQLite hub to PostgreSQL, offline. The source
is never modified; each refusal is one line and exit 1.

| step | does | refusal |
|---|---|---|
| 1 | takes ``hub.lock`` | ``the hub is running; stop it first`` |
| 2 | source at this release's versions, its audit chain verifies, I6 holds | names the check |
| 3 | target reachable, holding no table | ``the target database is not empty`` |
| 4 | migrates the target to the source's versions | (the target is left for inspection) |
| 5 | one transaction: every table but the migration records, parents first; the chain head; the key files as
      ``hub_secret`` rows | rolled back |
| 6 | the target's chain verifies with the source's event count and head, equal row counts, I6 | ``copy verification
      failed: <what>`` |

Runner records keep their token hashes and sessions their rows, so runners and browsers keep working (runners get
new epochs: their connection states are not copied); unfinished jobs continue, as a copy is not a restore.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from talaria.errors import StoreUnavailable
from talaria.lifecycle import audit
from talaria.store import hub_lock, migrations
from talaria.store.hub_keys import KEY_NAMES
from talaria.store.interface import Store
from talaria.store.open import MISSING_DRIVER, SQLITE_NAME
from talaria.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from talaria.store.postgres.bulk import Loader


class CopyRefused(Exception):
    """A check failed: the one line to print (exit 1)."""


@dataclass(frozen=True)
class CopyReport:
    counts: dict[str, int]
    chain: audit.ChainReport


def copy_to_postgres(data_dir: Path, url: str, now_ms: int, say: Callable[[str], None]) -> CopyReport:
    """Steps 1-6 of the table above; ``say`` hears progress lines."""
    try:
        from talaria.store.postgres import bulk as target
        from talaria.store.postgres.admin import check_server
        from talaria.store.postgres.store import PostgresStore
    except ImportError as exc:
        raise CopyRefused(MISSING_DRIVER) from exc
    try:
        lock = hub_lock.hold(data_dir)
    except StoreUnavailable as exc:
        raise CopyRefused("the hub is running; stop it first" if exc.message == hub_lock.HELD else exc.message) from exc
    try:
        if not (data_dir / SQLITE_NAME).is_file():
            raise CopyRefused(f"no SQLite database in {data_dir}")
        source = SQLiteStore(data_dir / SQLITE_NAME)
        try:
            before = _check_source(source)
            say(f"source: {before.line()}")
            check_server(url)
            if target.tables(url):
                raise CopyRefused("the target database is not empty")
            migrated = PostgresStore(url)
            try:
                say(f"target: {len(migrations.upgrade(migrated))} migration(s) applied")
                counts = _load(source, target.Loader(url), data_dir, now_ms, say)
                after = _verify(migrated, before)
                copied = target.counts(url, list(counts))
            finally:
                migrated.close()
        finally:
            source.close()
    finally:
        lock.release()
    differ = sorted(name for name in counts if copied.get(name) != counts[name])
    if differ:
        raise CopyRefused(f"copy verification failed: row counts differ in {', '.join(differ)}")
    return CopyReport(counts, after)


def _check_source(source: Store) -> audit.ChainReport:
    schema = migrations.schema(source)
    if schema.pending:
        raise CopyRefused("the source database needs migrations; run: talaria db upgrade")
    if schema.ahead:
        raise CopyRefused("the source database is newer than this release")
    report = audit.verify(source)
    if not report.ok:
        raise CopyRefused(f"the source {report.line()}")
    broken = _broken_jobs(source)
    if broken:
        raise CopyRefused(f"the source breaks I6 (a job's end and its reconciliation) at job {broken[0]}")
    return report


def _verify(copied: Store, source: audit.ChainReport) -> audit.ChainReport:
    report = audit.verify(copied)
    if not report.ok:
        raise CopyRefused(f"copy verification failed: {report.line()}")
    if (report.events, report.head) != (source.events, source.head):
        raise CopyRefused(f"copy verification failed: {report.events} events, head {report.head}; the source has "
                          f"{source.events}, head {source.head}")  # fmt: skip
    broken = _broken_jobs(copied)
    if broken:
        raise CopyRefused(f"copy verification failed: I6 at job {broken[0]}")
    return report


def _broken_jobs(store: Store) -> list[str]:
    with store.read() as tx:
        return [row["id"] for row in tx.all("reconciliation_broken", limit=5)]


def _load(
    source: SQLiteStore, loader: Loader, data_dir: Path, now_ms: int, say: Callable[[str], None]
) -> dict[str, int]:
    """Step 5, in the loader's one transaction."""
    try:
        with source.read() as tx:
            head = tx.one("audit_head_get")

        def consume(name: str, columns: list[str], rows: Iterator[tuple[Any, ...]]) -> None:
            if name == "audit_head":
                return  # the target's migration made the row: it is moved to the source's head below
            say(f"copying {name} ...")
            loader.table(name, columns, rows)

        counts = source.export(consume)
        counts.pop("audit_head", None)
        if head is not None:
            loader.head(int(head["seq"]), head["hash"])
        for name in KEY_NAMES:
            kept = data_dir / name
            if kept.is_file():
                loader.secret(name, kept.read_bytes(), now_ms)
        loader.commit()
    finally:
        loader.close()
    return counts
