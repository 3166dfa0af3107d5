"""The named-query loader (conventions 4): every file parses, names are unique and entity-prefixed."""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from importlib import resources

import pytest

from talaria.store import migrations
from talaria.store.queries import Query, load, parse

DIALECTS = ["sqlite", "postgresql"]


def sql_files(dialect: str) -> dict[str, str]:
    folder = resources.files("talaria.store") / "sql" / dialect
    return {
        item.name.removesuffix(".sql"): item.read_text(encoding="utf-8")
        for item in folder.iterdir()
        if item.name.endswith(".sql")
    }


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_file_parses_and_has_queries(dialect: str) -> None:
    files = sql_files(dialect)
    assert files, "no query files found"
    for entity, text in files.items():
        parsed = parse(entity, text)
        assert parsed, f"{entity}.sql holds no named query"
        # every '-- name:' header produced one query
        headers = re.findall(r"^--\s*name:", text, flags=re.MULTILINE)
        assert len(parsed) == len(headers), entity


@pytest.mark.parametrize("dialect", DIALECTS)
def test_names_are_unique_and_start_with_the_entity(dialect: str) -> None:
    every: list[Query] = []
    for entity, text in sql_files(dialect).items():
        for query in parse(entity, text):
            assert query.entity == entity
            assert query.name.startswith(entity + "_"), query.name
            assert re.fullmatch(r"[a-z][a-z0-9_]*", query.name)
            every.append(query)
    counts = Counter(q.name for q in every)
    assert [name for name, n in counts.items() if n > 1] == []
    assert set(load(dialect)) == set(counts)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_query_has_a_description_and_a_body(dialect: str) -> None:
    for query in load(dialect).values():
        assert query.description, query.name
        assert "\n" not in query.description
        assert not query.description.startswith("--")
        assert query.sql.strip(), query.name
        assert not query.sql.rstrip().endswith(";"), query.name
        assert "-- name:" not in query.sql, query.name


def test_load_is_cached() -> None:
    assert load("sqlite") is load("sqlite")


def test_names_the_engine_relies_on_exist() -> None:
    names = set(load("sqlite"))
    expected = {
        "job_insert",
        "job_update",
        "job_claim",
        "job_start",
        "job_heartbeat",
        "job_finish",
        "job_get",
        "job_get_bound",
        "audit_insert",
        "audit_head_get",
        "audit_head_set",
        "audit_scan",
        "task_insert",
        "task_update",
        "dispatch_insert",
        "tenant_ensure",
        "schema_tables",
        "schema_version_set",
    }
    assert expected <= names


def _migrated_memory_db(dialect: str) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute(load(dialect)["schema_version_create"].sql)
    conn.execute(load(dialect)["schema_step_create"].sql)
    for set_name in migrations.SETS:
        for migration in migrations.available(dialect, set_name):
            conn.executescript(migration.up)
    return conn


class _AnyParams(dict):  # type: ignore[type-arg]
    """Binds NULL to every named parameter, so that EXPLAIN can prepare any statement."""

    def __missing__(self, key: str) -> None:
        return None


def test_every_sqlite_query_prepares_against_the_migrated_schema() -> None:
    conn = _migrated_memory_db("sqlite")
    try:
        for query in load("sqlite").values():
            try:
                conn.execute("EXPLAIN " + query.sql, _AnyParams())
            except sqlite3.Error as exc:  # pragma: no cover - the assertion message is the point
                pytest.fail(f"{query.name} does not prepare: {exc}")
    finally:
        conn.close()


# ---------------------------------------------------------------- malformed blocks


def test_a_block_without_description_is_refused() -> None:
    with pytest.raises(ValueError, match="description"):
        parse("job", "-- name: job_get\nSELECT 1\n")


def test_a_block_with_an_empty_description_is_refused() -> None:
    with pytest.raises(ValueError, match="description"):
        parse("job", "-- name: job_get\n-- \nSELECT 1\n")


def test_a_block_with_an_empty_body_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        parse("job", "-- name: job_get\n-- One job.\n\n-- name: job_other\n-- Other.\nSELECT 2\n")
    with pytest.raises(ValueError, match="empty"):
        parse("job", "-- name: job_get\n-- One job.\n   \n")


def test_sql_before_the_first_name_is_refused() -> None:
    with pytest.raises(ValueError, match="before the first"):
        parse("job", "SELECT 0;\n-- name: job_get\n-- One job.\nSELECT 1\n")


def test_leading_comments_and_blank_lines_are_fine() -> None:
    parsed = parse(
        "job", "-- Jobs.\n\n-- name: job_get\n-- One job.\nSELECT 1;\n\n-- name: job_two\n-- Two.\nSELECT 2\n"
    )
    assert [(q.name, q.description, q.sql) for q in parsed] == [
        ("job_get", "One job.", "SELECT 1"),
        ("job_two", "Two.", "SELECT 2"),
    ]


def test_a_multi_line_body_is_kept_whole() -> None:
    (query,) = parse("job", "-- name: job_get\n-- One job.\nSELECT *\nFROM hermes_job\nWHERE id = :id\n")
    assert query.sql == "SELECT *\nFROM hermes_job\nWHERE id = :id"


# ---------------------------------------------------------------- both dialects (scale.md 2.2)

_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


def test_every_sqlite_query_exists_in_postgresql_with_the_same_parameters() -> None:
    """Shared code names a query once for both backends: each SQLite name exists on PostgreSQL, with the same
    description and parameters (PostgreSQL may add names of its own)."""
    sqlite, postgresql = load("sqlite"), load("postgresql")
    assert sorted(set(sqlite) - set(postgresql)) == []
    for name, query in sqlite.items():
        other = postgresql[name]
        assert other.description == query.description, name
        assert set(_PARAM.findall(other.sql)) == set(_PARAM.findall(query.sql)), name


def test_both_dialects_have_the_same_migration_steps() -> None:
    for set_name in migrations.SETS:
        sqlite = [(m.version, m.name) for m in migrations.available("sqlite", set_name)]
        assert [(m.version, m.name) for m in migrations.available("postgresql", set_name)] == sqlite


def test_every_step_says_whether_it_is_additive_and_both_dialects_agree() -> None:
    """Scale.md 2.5: the first line of every up step is ``-- additive: true|false``, the same in both dialects."""
    for set_name in migrations.SETS:
        sqlite = migrations.available("sqlite", set_name)
        postgresql = migrations.available("postgresql", set_name)
        for lite, pg in zip(sqlite, postgresql, strict=True):
            assert lite.up.splitlines()[0] == pg.up.splitlines()[0], (set_name, lite.name)
            assert lite.additive == pg.additive
    assert not migrations.available("sqlite", "core")[3].additive  # 0004 adds a rule older writes break
