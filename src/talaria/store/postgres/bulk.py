"""``talaria db copy``'s PostgreSQL side (scale.md 5), in bulk: whether the target holds a table already, one
transaction loading every copied table, and the row counts the copy is verified by."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import psycopg
from psycopg import sql

from talaria.errors import StoreUnavailable
from talaria.store.postgres.store import connect, safe_url

BATCH = 1000


def tables(url: str) -> list[str]:
    """The tables of the target's schema (``current_schema()``)."""
    with connect(url, application_name="talaria/db-copy") as conn:
        rows = conn.execute(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


class Loader:
    """One transaction on a connection of its own; ``commit`` ends it, anything else rolls it back."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn = connect(url, application_name="talaria/db-copy")
        self._conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")

    def table(self, name: str, columns: list[str], rows: Iterator[tuple[Any, ...]]) -> None:
        statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(name),
            sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            sql.SQL(", ").join(sql.Placeholder() for _ in columns),
        )
        try:
            with self._conn.cursor() as cur:
                while batch := list(islice(rows, BATCH)):
                    cur.executemany(statement, batch)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"copying {name} into {safe_url(self._url)} failed: {_first_line(exc)}") from exc

    def head(self, seq: int, digest: str) -> None:
        """The chain head as the source has it (the target's migration made the genesis head)."""
        self._run("UPDATE audit_head SET seq = %s, hash = %s WHERE id = 1", (seq, digest))

    def secret(self, name: str, value: bytes, now_ms: int) -> None:
        self._run("INSERT INTO hub_secret (name, value, created_at) VALUES (%s, %s, %s)", (name, value, now_ms))

    def commit(self) -> None:
        # audit_event.seq is an identity column given explicit values: move its sequence past them
        self._run("SELECT setval(pg_get_serial_sequence('audit_event', 'seq'), GREATEST(MAX(seq), 1), MAX(seq) IS NOT"
                  " NULL) FROM audit_event", ())  # fmt: skip
        self._run("COMMIT", ())

    def close(self) -> None:
        if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._conn.execute("ROLLBACK")
        self._conn.close()

    def _run(self, statement: str, params: tuple[Any, ...]) -> None:
        try:
            self._conn.execute(statement, params)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"copying into {safe_url(self._url)} failed: {_first_line(exc)}") from exc


def counts(url: str, names: list[str]) -> dict[str, int]:
    with connect(url, application_name="talaria/db-copy") as conn:
        return {
            name: int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name))).fetchone()[0])  # type: ignore[index]
            for name in names
        }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
