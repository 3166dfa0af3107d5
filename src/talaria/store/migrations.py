"""Numbered SQL migrations per dialect and set (lifecycle.md 9.3).

Files: ``migrations/<dialect>/<set>/NNNN_<name>.up.sql`` and ``.down.sql``. Sets, in the order they apply: ``core``
(tenants, accounts, sessions, tasks, dispatches, audit, chat), ``lifecycle`` (jobs and their records) and ``team``
(team tools' domain, team-tools.md 3.6: it references core only and nothing references it, so it can be removed
alone). Versions are
tracked in ``schema_version(migration_set, version)``, and each applied step in ``schema_step`` with whether it is
additive (the first line of its up file, ``-- additive: true|false``, scale.md 2.5): a release finding a newer step
that is not additive refuses to run on the database. Each step runs in one write transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from talaria.store.interface import Store

SETS = ("core", "lifecycle", "team")
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql\Z")
_ADDITIVE = {"-- additive: true": True, "-- additive: false": False}


@dataclass(frozen=True)
class Migration:
    set_name: str
    version: int
    name: str
    up: str
    down: str

    @property
    def additive(self) -> bool:
        """Whether an older release may keep running on a database with this step (removals and renames, or new
        rules its writes break, are not); from the up file's first line."""
        return _ADDITIVE[self.up.splitlines()[0]]


def available(dialect: str, set_name: str) -> list[Migration]:
    folder = resources.files("talaria.store") / "migrations" / dialect / set_name
    parts: dict[int, dict[str, str]] = {}
    names: dict[int, str] = {}
    for item in folder.iterdir():
        match = _FILE.match(item.name)
        if not match:
            continue
        version = int(match.group(1))
        names[version] = match.group(2)
        parts.setdefault(version, {})[match.group(3)] = item.read_text(encoding="utf-8")
    out = []
    for expected, version in enumerate(sorted(parts), start=1):
        if version != expected or set(parts[version]) != {"up", "down"}:
            raise ValueError(f"{dialect}/{set_name}: migration {version:04d} is missing or incomplete")
        if next(iter(parts[version]["up"].splitlines()), "") not in _ADDITIVE:
            raise ValueError(f"{dialect}/{set_name}: migration {version:04d} must start with -- additive: true|false")
        out.append(Migration(set_name, version, names[version], parts[version]["up"], parts[version]["down"]))
    return out


def current(store: Store) -> dict[str, int]:
    """The applied version of each set (0 when never applied)."""
    with store.write() as tx:
        tx.run("schema_version_create")
        tx.run("schema_step_create")
    with store.read() as tx:
        rows = tx.all("schema_version_list")
    versions = {name: 0 for name in SETS}
    versions.update({row["migration_set"]: row["version"] for row in rows})
    return versions


def latest(store: Store) -> dict[str, int]:
    return {name: len(available(store.dialect, name)) for name in SETS}


def upgrade(store: Store, set_name: str | None = None, *, lock_held: bool = False) -> list[str]:
    """Apply every pending migration (of one set, or of all); returns what was applied. ``lock_held``: the caller
    holds ``store.migrating()`` already (PostgreSQL's advisory lock is taken on a connection of its own, so a second
    hold would wait for the first forever)."""
    if not lock_held:
        with store.migrating():
            return upgrade(store, set_name, lock_held=True)
    applied: list[str] = []
    for name in [set_name] if set_name else list(SETS):
        applied += _upgrade_set(store, name)
    return applied


def _upgrade_set(store: Store, name: str) -> list[str]:
    applied: list[str] = []
    have = current(store)[name]
    for migration in available(store.dialect, name)[have:]:
        with store.write() as tx:
            tx.script(migration.up)
            tx.run("schema_version_set", migration_set=name, version=migration.version)
            tx.run("schema_step_set", migration_set=name, version=migration.version,
                   additive=int(migration.additive))  # fmt: skip
        applied.append(f"{name} {migration.version:04d}_{migration.name}")
    return applied


def downgrade(store: Store, set_name: str, to_version: int) -> list[str]:
    """Undo migrations of one set down to ``to_version`` (destructive)."""
    if set_name not in SETS:
        raise ValueError(f"unknown migration set {set_name!r} (sets: {', '.join(SETS)})")
    if set_name == "core" and to_version == 0:
        for later in ("team", "lifecycle"):
            if current(store)[later] > 0:
                raise ValueError(f"downgrade the {later} set to 0 before removing the core set")
    have = current(store)[set_name]
    if to_version < 0 or to_version > have:
        raise ValueError(f"{set_name} is at version {have}; cannot downgrade to {to_version}")
    undone: list[str] = []
    for migration in reversed(available(store.dialect, set_name)[to_version:have]):
        with store.write() as tx:
            tx.script(migration.down)
            tx.run("schema_version_set", migration_set=set_name, version=migration.version - 1)
            tx.run("schema_step_delete", migration_set=set_name, version=migration.version)
        undone.append(f"{set_name} {migration.version:04d}_{migration.name}")
    return undone


@dataclass(frozen=True)
class Schema:
    """The database's versions beside this release's, read once: ``have`` and ``want`` per set, and the steps
    ``schema_step`` records with whether each is additive."""

    have: dict[str, int]
    want: dict[str, int]
    recorded: dict[tuple[str, int], bool]

    @property
    def pending(self) -> dict[str, int]:
        """Migrations this release has and the database lacks, per set.

        A database ahead of this release (after a release rollback) is not pending: the older release
        keeps working on the tables it knows (lifecycle.md 9.3)."""
        return {name: self.want[name] - self.have[name] for name in SETS if self.want[name] > self.have[name]}

    @property
    def ahead(self) -> dict[str, int]:
        """Sets whose stored version is newer than this release knows."""
        return {name: self.have[name] for name in SETS if self.have[name] > self.want[name]}

    @property
    def newer_steps(self) -> list[tuple[str, int, bool]]:
        """Steps a newer release applied that this one does not know: (set, version, additive). A step recorded by
        no release (a database older than ``schema_step``) counts as additive."""
        return [(name, version, self.recorded.get((name, version), True))
                for name in SETS for version in range(self.want[name] + 1, self.have[name] + 1)]  # fmt: skip


def schema(store: Store, *, read_only: bool = False) -> Schema:
    """``read_only``: one read transaction (``/readyz``): the bookkeeping tables must exist already (a hub made them
    at start)."""
    have = current(store) if not read_only else None
    with store.read() as tx:
        if have is None:
            have = {name: 0 for name in SETS}
            have.update({row["migration_set"]: row["version"] for row in tx.all("schema_version_list")})
        recorded = {(r["migration_set"], r["version"]): bool(r["additive"]) for r in tx.all("schema_step_list")}
    return Schema(have, latest(store), recorded)
