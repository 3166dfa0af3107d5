"""Job and audit routes (web-api.md 6)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from talaria.errors import TalariaError
from talaria.hub.api.deps import AdminDep, HubDep, StrictBody, UserDep, text_field
from talaria.hub.api.views import (
    CursorQuery,
    LimitQuery,
    audit_json,
    decode_cursor,
    encode_cursor,
    job_json,
    page_limit,
)
from talaria.hub.api.visibility import visible_bot_events, visible_conversation_events, visible_job, visible_task
from talaria.hub.api.waiting import waiting_reason
from talaria.hub.api.websession import WebRoute, WebUser
from talaria.hub.openapi import refusals
from talaria.hub.resources import Hub
from talaria.lifecycle.machine import JobState
from talaria.lifecycle.reads import AuditEntry, JobWithResult
from talaria.limits import MAX_CANCEL_REASON_CHARS
from talaria.text_rules import ONE_LINE_PATTERN, one_line

router = APIRouter(tags=["jobs", "audit"], route_class=WebRoute)


class CancelJob(StrictBody):
    reason: str = Field(
        min_length=1, max_length=MAX_CANCEL_REASON_CHARS, json_schema_extra={"pattern": ONE_LINE_PATTERN}
    )


StateQuery = Annotated[str | None, Query(json_schema_extra={"enum": [s.name for s in JobState]})]


def job_view(hub: Hub, found: JobWithResult) -> dict[str, Any]:
    return job_json(found.job, found.result, waiting_reason(hub, found.job))


@router.get("/api/jobs", openapi_extra=refusals("invalid_request"))
async def list_jobs(
    user: UserDep,
    hub: HubDep,
    state: StateQuery = None,
    cell: str | None = None,
    limit: LimitQuery = None,
    cursor: CursorQuery = None,
) -> dict[str, Any]:
    found, next_cursor = await jobs_page(user, hub, state=state, cell=cell, limit=limit, cursor=cursor)
    return {"jobs": [job_view(hub, item) for item in found], "nextCursor": next_cursor}


async def jobs_page(
    user: WebUser, hub: Hub, *, state: str | None, cell: str | None, limit: int | None, cursor: str | None
) -> tuple[list[JobWithResult], str | None]:
    """A page of the jobs ``user`` may see (with their tasks' titles) and the cursor of the next page."""
    if state is not None and state not in JobState.__members__:
        raise TalariaError("invalid_request", "state is not a job state")
    size = page_limit(limit)
    after = decode_cursor(cursor, (int, str))

    def read() -> list[JobWithResult]:
        return hub.engine.list_jobs(
            user.account.tenant,
            state=state,
            cell=cell,
            created_by=None if user.is_admin else user.account.principal,
            after=(after[0], after[1]) if after else None,
            limit=size + 1,
        )

    found = await run_in_threadpool(read)
    more, found = len(found) > size, found[:size]
    return found, encode_cursor(found[-1].job.enqueued_at, found[-1].job.id) if more else None


@router.get("/api/jobs/{job_id}", openapi_extra=refusals("not_found"))
async def get_job(job_id: str, user: UserDep, hub: HubDep) -> dict[str, Any]:
    found = await run_in_threadpool(visible_job, hub, user, job_id)
    return {"job": job_view(hub, found)}


@router.post(
    "/api/jobs/{job_id}/cancel",
    openapi_extra=refusals("not_found", "dispatch_missing", "terminal_conflict", "invalid_transition"),
)
async def cancel_job(job_id: str, body: CancelJob, admin: AdminDep, hub: HubDep) -> dict[str, Any]:
    reason = text_field(one_line, "reason", body.reason)

    def run() -> JobWithResult:
        job = visible_job(hub, admin, job_id).job
        dispatch = hub.engine.job_dispatch(job)
        if dispatch is None:
            raise TalariaError("dispatch_missing", "the job's dispatch is missing")
        hub.engine.cancel(admin.actor, job_id=job_id, binding=dispatch.binding(admin.actor.principal), reason=reason)
        return visible_job(hub, admin, job_id)

    found = await run_in_threadpool(run)
    return {"job": job_view(hub, found)}


@router.get("/api/audit", openapi_extra=refusals("invalid_request", "admin_required", "not_found"))
async def list_audit(
    user: UserDep,
    hub: HubDep,
    task: str | None = None,
    job: str | None = None,
    bot: str | None = None,
    conversation: str | None = None,
    team: str | None = None,
    goal: str | None = None,
    limit: LimitQuery = None,
    cursor: CursorQuery = None,
) -> dict[str, Any]:
    """Admins see the tenant's events; a user sees the events of one task, job, bot, conversation, team or goal of
    their own."""
    if not user.is_admin and all(f is None for f in (task, job, bot, conversation, team, goal)):
        raise TalariaError(
            "admin_required",
            "name one of your tasks (task=), jobs (job=), bots (bot=), conversations (conversation=), teams (team=) "
            "or goals (goal=)",
        )
    if task is not None and not user.is_admin:
        await run_in_threadpool(visible_task, hub, user, task)
    if job is not None and not user.is_admin:
        await run_in_threadpool(visible_job, hub, user, job)
    if bot is not None:  # an admin too: a bot of no one of the tenant is 404
        await run_in_threadpool(visible_bot_events, hub, user, bot)
    if conversation is not None:
        await run_in_threadpool(visible_conversation_events, hub, user, conversation)
    if team is not None:  # team-tools.md 11: the owner's, or any of the tenant's for an admin; else 404
        await run_in_threadpool(hub.team_people.team, user.account, team)
    if goal is not None:
        await run_in_threadpool(hub.team_people.goal, user.account, goal)
    size = page_limit(limit)
    after = decode_cursor(cursor, (int,))

    def read() -> list[AuditEntry]:
        return hub.engine.list_audit(
            user.account.tenant, task_id=task, job_id=job, bot_id=bot, conversation_id=conversation, team_id=team,
            goal_id=goal,
            before_seq=after[0] if after else None,
            limit=size + 1,
        )  # fmt: skip

    rows = await run_in_threadpool(read)
    more, rows = len(rows) > size, rows[:size]
    return {
        "events": [audit_json(r) for r in rows],
        "nextCursor": encode_cursor(_cursor_seq(rows[-1])) if more else None,
    }


def _cursor_seq(last: AuditEntry) -> int:
    """Where the next page starts: below the last row's seq; after a page ending among events not yet sealed
    (listed first, scale.md 2.4), the sealed ones from the newest."""
    return last.seq if last.seq is not None else UNSEALED_CURSOR


UNSEALED_CURSOR = 2**62


@router.get("/api/audit/verify")
async def verify_audit(admin: AdminDep, hub: HubDep) -> dict[str, Any]:
    report = await run_in_threadpool(hub.engine.verify_audit)
    if report.ok:
        return {"ok": True, "events": report.events, "head": report.head}
    return {"ok": False, "brokenAt": report.broken_at, "reason": report.reason}
