"""Task routes (web-api.md 5). A user sees only their own tasks; an admin every task of the tenant."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from talaria.accounts.rules import PROFILE, SOURCE
from talaria.accounts.service import Account
from talaria.errors import TalariaError
from talaria.hub.api.deps import AdminDep, HubDep, StrictBody, UserDep, text_field
from talaria.hub.api.views import (
    CursorQuery,
    LimitQuery,
    decode_cursor,
    dispatch_json,
    encode_cursor,
    job_json,
    page_limit,
    task_json,
)
from talaria.hub.api.visibility import visible_task
from talaria.hub.api.waiting import waiting_reason
from talaria.hub.api.websession import WebRoute
from talaria.hub.openapi import refusals
from talaria.ids import trace_id
from talaria.lifecycle.actor import username_of
from talaria.lifecycle.machine import TaskState
from talaria.lifecycle.reads import TaskWithJob
from talaria.limits import MAX_REJECT_REASON_CHARS, MAX_TASK_PROMPT_CHARS, MAX_TASK_TITLE_CHARS
from talaria.text_rules import MULTI_LINE_PATTERN, ONE_LINE_PATTERN, multi_line, one_line

router = APIRouter(prefix="/api/tasks", tags=["tasks"], route_class=WebRoute)
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}\Z")


class CreateTask(StrictBody):
    title: str = Field(min_length=1, max_length=MAX_TASK_TITLE_CHARS, json_schema_extra={"pattern": ONE_LINE_PATTERN})
    prompt: str = Field(
        min_length=1, max_length=MAX_TASK_PROMPT_CHARS, json_schema_extra={"pattern": MULTI_LINE_PATTERN}
    )
    cell: str = Field(json_schema_extra={"pattern": SOURCE.pattern, "description": "a source name"})
    profile: str = Field(json_schema_extra={"pattern": PROFILE.pattern, "description": "a Hermes profile name"})


class RejectTask(StrictBody):
    reason: str = Field(
        min_length=1, max_length=MAX_REJECT_REASON_CHARS, json_schema_extra={"pattern": ONE_LINE_PATTERN}
    )


class CancelTask(StrictBody):
    reason: str | None = Field(
        default=None, min_length=1, max_length=1024, json_schema_extra={"pattern": ONE_LINE_PATTERN}
    )


StateQuery = Annotated[str | None, Query(json_schema_extra={"enum": [s.name for s in TaskState]})]


def _trace(request: Request) -> str:
    match = _TRACEPARENT.match(request.headers.get("traceparent", ""))
    if match and match.group(1) != "0" * 32:
        return match.group(1)
    return trace_id()


def _may_use(account: Account, cell: str, profile: str) -> None:
    """403 ``profile_not_allowed`` unless (cell, profile) is in the account's allowed profiles (web-api.md 9)."""
    if profile not in account.allowed_profiles.get(cell, []):
        raise TalariaError("profile_not_allowed", f"{account.username} may not use profile {profile} on {cell}")


@router.post("", status_code=201, openapi_extra=refusals("profile_not_allowed"))
async def create_task(body: CreateTask, request: Request, user: UserDep, hub: HubDep) -> dict[str, Any]:
    title = text_field(one_line, "title", body.title)
    prompt = text_field(multi_line, "prompt", body.prompt)
    if not SOURCE.fullmatch(body.cell):
        raise TalariaError("invalid_request", "cell must be a source name (a-z 0-9 . _ -, up to 64)")
    if not PROFILE.fullmatch(body.profile):
        raise TalariaError("invalid_request", "profile must be a Hermes profile name")
    _may_use(user.account, body.cell, body.profile)
    task = await run_in_threadpool(
        lambda: hub.engine.create_task(
            user.actor,
            tenant=user.account.tenant,
            title=title,
            spec={"prompt": prompt},
            cell=body.cell,
            profile=body.profile,
            trace=_trace(request),
        )
    )
    return {"task": task_json(task, None)}


@router.get("", openapi_extra=refusals("invalid_request"))
async def list_tasks(
    user: UserDep, hub: HubDep, state: StateQuery = None, limit: LimitQuery = None, cursor: CursorQuery = None
) -> dict[str, Any]:
    if state is not None and state not in TaskState.__members__:
        raise TalariaError("invalid_request", "state is not a task state")
    size = page_limit(limit)
    after = decode_cursor(cursor, (int, str))

    def read() -> list[TaskWithJob]:
        return hub.engine.list_tasks(
            user.account.tenant,
            created_by=None if user.is_admin else user.account.principal,
            state=state,
            after=(after[0], after[1]) if after else None,
            limit=size + 1,
        )

    rows = await run_in_threadpool(read)
    more, rows = len(rows) > size, rows[:size]
    return {
        "tasks": [task_json(r.task, r.job_id) for r in rows],
        "nextCursor": encode_cursor(rows[-1].task.created_at, rows[-1].task.id) if more else None,
    }


@router.get("/{task_id}", openapi_extra=refusals("not_found"))
async def get_task(task_id: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    found = await run_in_threadpool(visible_task, hub, user, task_id)
    return {"task": task_json(found.task, found.job_id)}


@router.post(
    "/{task_id}/submit", openapi_extra=refusals("not_found", "not_author", "profile_not_allowed", "invalid_transition")
)
async def submit_task(task_id: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    found = await run_in_threadpool(visible_task, hub, user, task_id)
    _may_use(user.account, found.task.cell, found.task.profile)  # the author's access may have changed
    task = await run_in_threadpool(
        lambda: hub.engine.submit_task(user.actor, tenant=user.account.tenant, task_id=task_id)
    )
    return {"task": task_json(task, None)}


@router.post(
    "/{task_id}/approve",
    openapi_extra=refusals(
        "not_found", "profile_not_allowed", "self_approval_forbidden", "invalid_transition", "not_approved"
    ),
)
async def approve_task(task_id: str, admin: AdminDep, hub: HubDep) -> dict[str, Any]:
    found = await run_in_threadpool(visible_task, hub, admin, task_id)
    author = await run_in_threadpool(hub.accounts.get, username_of(found.task.created_by) or "")
    if author is None or not author.enabled:
        raise TalariaError("profile_not_allowed", "the task's author no longer has an enabled account")
    _may_use(author, found.task.cell, found.task.profile)  # the author's, not the approver's, allowed profiles
    task, dispatch, job = await run_in_threadpool(
        lambda: hub.engine.approve_and_dispatch(admin.actor, tenant=admin.account.tenant, task_id=task_id)
    )
    return {
        "task": task_json(task, job.id),
        "dispatch": dispatch_json(dispatch),
        "job": job_json(job, None, waiting_reason(hub, job)),
    }


@router.post("/{task_id}/reject", openapi_extra=refusals("not_found", "self_approval_forbidden", "invalid_transition"))
async def reject_task(task_id: str, body: RejectTask, admin: AdminDep, hub: HubDep) -> dict[str, Any]:
    await run_in_threadpool(visible_task, hub, admin, task_id)
    reason = text_field(one_line, "reason", body.reason)
    task = await run_in_threadpool(
        lambda: hub.engine.reject_task(admin.actor, tenant=admin.account.tenant, task_id=task_id, reason=reason)
    )
    return {"task": task_json(task, None)}


@router.post(
    "/{task_id}/cancel",
    openapi_extra=refusals("not_found", "invalid_transition", "dispatch_missing", "terminal_conflict"),
)
async def cancel_task(task_id: str, user: UserDep, hub: HubDep, body: CancelTask | None = None) -> dict[str, Any]:
    await run_in_threadpool(visible_task, hub, user, task_id)
    reason = (
        text_field(one_line, "reason", body.reason) if body and body.reason else f"cancelled by {user.account.username}"
    )
    await run_in_threadpool(
        lambda: hub.engine.cancel_task(user.actor, tenant=user.account.tenant, task_id=task_id, reason=reason)
    )
    found = await run_in_threadpool(visible_task, hub, user, task_id)
    return {"task": task_json(found.task, found.job_id)}
