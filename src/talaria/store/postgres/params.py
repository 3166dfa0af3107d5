"""Named parameters of the shared query style (``:name``) in psycopg's style (``%(name)s``), with every literal
``%`` doubled; a ``::type`` cast, a quoted string or identifier and a comment are left alone apart from ``%``."""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def to_psycopg(sql: str) -> str:
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in ("'", '"'):
            end = i + 1
            while end < n:
                if sql[end] == c:
                    if end + 1 < n and sql[end + 1] == c:  # '' or "" inside the quoted text
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i : end + 1].replace("%", "%%"))
            i = end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif sql.startswith("::", i):
            out.append("::")
            i += 2
        elif c == ":":
            match = _NAME.match(sql, i + 1)
            if match is None:
                raise ValueError(f"a ':' that is neither a cast nor a parameter at {i}: {sql[i : i + 20]!r}")
            out.append(f"%({match.group(0)})s")
            i = match.end()
        elif c == "%":
            out.append("%%")
            i += 1
        elif c == "$":
            raise ValueError("dollar quoting is not allowed in a named query")
        else:
            out.append(c)
            i += 1
    return "".join(out)
