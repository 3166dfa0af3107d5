"""What a web user may see: their own tasks and jobs, or, for an admin, every one of the tenant.

Anything else answers 404 ``not_found`` (never 403), so ids of others' objects leak nothing.
"""

from __future__ import annotations

from talaria.errors import TalariaError
from talaria.hub.api.websession import WebUser
from talaria.hub.resources import Hub
from talaria.store.interface import Row


def visible_task(hub: Hub, user: WebUser, task_id: str) -> tuple[Row, str | None]:
    """The task with its job id, if ``user`` may see it; else 404 ``not_found``."""
    with hub.store.read() as tx:
        task = tx.one("task_get", tenant=user.account.tenant, id=task_id)
        dispatch = tx.one("dispatch_get_by_task", task_id=task_id) if task else None
    if task is None or (not user.is_admin and task["created_by"] != user.account.principal):
        raise TalariaError("not_found", "no such task")
    return task, dispatch["job_id"] if dispatch else None


def visible_job(hub: Hub, user: WebUser, job_id: str) -> tuple[Row, Row | None]:
    """The job with its stored result, if ``user`` may see it; else 404 ``not_found``."""
    with hub.store.read() as tx:
        job = tx.one("job_get", tenant=user.account.tenant, id=job_id)
        task = tx.one("task_get", tenant=user.account.tenant, id=job["task_id"]) if job else None
        result = tx.one("result_get", job_id=job_id) if job else None
    if job is None or task is None or (not user.is_admin and task["created_by"] != user.account.principal):
        raise TalariaError("not_found", "no such job")
    return job, result
