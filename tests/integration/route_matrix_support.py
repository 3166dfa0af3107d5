"""The security matrix's statement of the hub's routes (issue 17, part 3), shared by ``test_route_matrix.py`` and
``test_route_matrix_tenants.py``: every (method, path) of the hub app's route table with its kind, the route table
itself, a path with dummy ids, and a snapshot of every table a refused request must not change."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from fastapi.routing import APIRoute, iter_route_contexts

from talaria.hub.app import create_app
from talaria.settings import Settings

# Every route of the hub app's table, by kind (the matrix's own statement of who may call what).
API_USER = """
POST /api/auth/password
GET /api/auth/me
POST /api/auth/logout
POST /api/tasks
GET /api/tasks
GET /api/tasks/{task_id}
POST /api/tasks/{task_id}/submit
POST /api/tasks/{task_id}/cancel
GET /api/jobs
GET /api/jobs/{job_id}
GET /api/audit
GET /api/bots
POST /api/bots
GET /api/bots/{bot_id}
PATCH /api/bots/{bot_id}
GET /api/bot-profiles
GET /api/conversations
POST /api/conversations
GET /api/conversations/{conversation_id}
PATCH /api/conversations/{conversation_id}
POST /api/conversations/{conversation_id}/turns
GET /api/conversations/{conversation_id}/messages
POST /api/conversations/{conversation_id}/turns/{turn_id}/approvals
GET /api/conversations/{conversation_id}/turns/{turn_id}
POST /api/conversations/{conversation_id}/turns/{turn_id}/stop
POST /api/conversations/{conversation_id}/attachments
DELETE /api/conversations/{conversation_id}/attachments/{attachment_id}
GET /api/conversations/{conversation_id}/events
GET /api/teams
GET /api/teams/{team_id}
GET /api/goals
GET /api/goals/{goal_id}
PATCH /api/goals/{goal_id}/criteria
POST /api/goals/{goal_id}/stop
GET /api/sources
GET /api/sources/{source}/profiles
"""
API_ADMIN = """
GET /api/admin/accounts
POST /api/admin/accounts
PATCH /api/admin/accounts/{username}
POST /api/tasks/{task_id}/approve
POST /api/tasks/{task_id}/reject
POST /api/jobs/{job_id}/cancel
GET /api/audit/verify
GET /api/admin/runners
POST /api/admin/runners
DELETE /api/admin/runners/{runner_id}
POST /api/admin/runners/{runner_id}/drain
POST /api/admin/runners/{runner_id}/rotate-token
GET /api/admin/runners/{runner_id}/hermes
POST /api/admin/runners/{runner_id}/test-turn
"""
PAGES = """
GET /tasks
GET /tasks/{task_id}
GET /jobs
GET /jobs/{job_id}
GET /audit
GET /settings/password
GET /chats
GET /bots
GET /chats/{conversation_id}
GET /teams
GET /teams/{team_id}
GET /goals/{goal_id}
"""
ADMIN_PAGES = """
GET /settings/nodes
GET /settings/accounts
GET /settings/accounts/{username}
"""
PARTS = """
GET /chats/{conversation_id}/transcript
GET /chats/{conversation_id}/messages/{message_id}
GET /tasks/{task_id}/live
GET /jobs/live
GET /jobs/{job_id}/live
GET /goals/{goal_id}/progress
"""
ADMIN_PARTS = """
GET /settings/nodes/live
"""
# Anyone: sign-in and its page, health, metrics, the document, the icon, static files; ``/`` and ``/settings`` only
# redirect (to the sign-in page without a session, else to a page that checks it).
PUBLIC = """
POST /api/auth/login
GET /login
GET /healthz
GET /readyz
GET /metrics
GET /openapi.json
GET /favicon.ico
GET /static
GET /
GET /settings
"""
KINDS = {"api_user": API_USER, "api_admin": API_ADMIN, "page": PAGES, "admin_page": ADMIN_PAGES, "part": PARTS,
         "admin_part": ADMIN_PARTS, "public": PUBLIC}  # fmt: skip
MATRIX = {tuple(line.split()): kind for kind, text in KINDS.items() for line in text.strip().splitlines()}
# Tables a refused request may write: the security events it records (web-api.md 9) and a session's last use.
MOVING = ("security_event", "web_session", "login_failure")


def route_table() -> set[tuple[str, str]]:
    """Every (method, path) the hub app's route table serves (a mount as GET of its prefix)."""
    app = create_app(Settings(data_dir=Path("/nonexistent/talaria-route-matrix")), run_reaper=False)
    found: set[tuple[str, str]] = set()
    for context in iter_route_contexts(app.web.routes):
        path = str(context.path or "")
        if isinstance(context.original_route, APIRoute):
            found |= {(method, path) for method in set(context.methods or ()) - {"HEAD", "OPTIONS"}}
        else:
            found.add(("GET", path))
    return found


def dummy(path: str) -> str:
    """The path with a well-formed id in each parameter (one that names nothing)."""
    ids = {"username": "nobody", "runner_id": "00000000-0000-4000-8000-000000000000", "source": "local"}

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        return ids.get(name, f"{name.split('_')[0][:3]}_01JZZZZZZZZZZZZZZZZZZZZZZZ")

    return re.sub(r"{(\w+)}", one, path)


def snapshot(data_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(f"file:{data_dir / 'talaria.sqlite3'}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY rowid').fetchall() for t in tables if t not in MOVING}
    finally:
        conn.close()


def changes(data_dir: Path, before: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """The rows that differ from ``before`` (a :func:`snapshot`), by table (empty when nothing changed)."""
    after = snapshot(data_dir)
    return {table: sorted(set(after.get(table, [])) ^ set(before.get(table, [])), key=repr)
            for table in before.keys() | after.keys() if after.get(table) != before.get(table)}  # fmt: skip
