"""Named SQL queries loaded from ``sql/<dialect>/<entity>.sql``.

Each block starts with ``-- name: <entity>_<verb>`` followed by a one-line ``-- `` description,
then the statement. Names are unique across a dialect and start with the file's entity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z][a-z0-9_]*)\s*\Z")


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: str
    entity: str


def parse(entity: str, text: str) -> list[Query]:
    """Parse one ``.sql`` file; raises ValueError on a block without a description or body."""
    out: list[Query] = []
    name: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if name is None:
            if any(line.strip() and not line.startswith("--") for line in lines):
                raise ValueError(f"{entity}.sql: SQL before the first '-- name:'")
            return
        if not lines or not lines[0].startswith("-- ") or not lines[0][3:].strip():
            raise ValueError(f"{entity}.sql: query {name} has no one-line description")
        body = "\n".join(line for line in lines[1:]).strip()
        if not body:
            raise ValueError(f"{entity}.sql: query {name} is empty")
        out.append(Query(name, lines[0][3:].strip(), body.rstrip(";"), entity))

    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            flush()
            name, lines = match.group(1), []
        else:
            lines.append(line)
    flush()
    return out


@cache
def load(dialect: str) -> dict[str, Query]:
    """All named queries of a dialect, loaded once."""
    folder = resources.files("talaria.store") / "sql" / dialect
    queries: dict[str, Query] = {}
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".sql"):
            continue
        entity = item.name.removesuffix(".sql")
        for query in parse(entity, item.read_text(encoding="utf-8")):
            if not query.name.startswith(entity + "_"):
                raise ValueError(f"{item.name}: query {query.name} must start with {entity}_")
            if query.name in queries:
                raise ValueError(f"duplicate query name {query.name}")
            queries[query.name] = query
    return queries
