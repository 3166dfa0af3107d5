"""The web pages (issue: web UI): server-rendered views of the JSON API, for people.

Every page reads through the same route functions the JSON API answers with, so a page never shows what
the API would not (no runner token, no token hash, no other tenant's objects). Every change is made by
``/static/app.js`` calling the JSON API with the session's CSRF token in ``X-CSRF-Token`` (web-api.md 2),
so the API's checks (session, CSRF and Origin, admin) are the only ones. ``…/live`` routes answer the part
of a page that changes (node status, job and task state) for the page's short polling.

Without a session a page redirects to ``/login?next=<path>``; a live part answers 401 ``unauthenticated``. What
every page shares (the viewer, the sign-in redirect, rendering, the error pages) is ``frame.py``'s; the chat
pages are ``chat_pages.py``'s.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from talaria.errors import TalariaError
from talaria.hub.api import accounts as api_accounts
from talaria.hub.api import jobs as api_jobs
from talaria.hub.api import sources as api_sources
from talaria.hub.api import tasks as api_tasks
from talaria.hub.api.runner_admin import summary
from talaria.hub.api.websession import WebUser
from talaria.hub.resources import Hub
from talaria.hub.web import chat_pages, team_pages
from talaria.hub.web.frame import (
    hub_of,
    link,
    not_found_page,
    page_of,
    page_user,
    pager,
    part_of,
    part_user,
    refused,
    render,
    viewer,
)
from talaria.lifecycle.machine import TASK_FINAL, TERMINAL, JobState, TaskState
from talaria.runner_json import DEFAULT_HERMES_URL

router = APIRouter(include_in_schema=False)

TASK_STATES = [s.name for s in TaskState]
JOB_STATES = [s.name for s in JobState]
PAGE_SIZE = 50


def _safe_next(raw: str | None) -> str:
    """Only a path on this hub (no scheme, no host, no ``//``; no braces, which app.js would fill from the
    sign-in answer): anything else becomes ``/tasks``."""
    if not raw or not raw.startswith("/") or raw.startswith("//") or any(c in raw for c in "\\{}"):
        return "/tasks"
    parts = urlsplit(raw)
    return raw if not parts.scheme and not parts.netloc else "/tasks"


# --- sign-in ---------------------------------------------------------------------------------------------------


@router.get("/favicon.ico")
async def favicon() -> Response:
    """No icon, and no 404 either: a browser asks for this after showing any answer that names no icon (a JSON
    refusal it navigated to, for one), and a 404 there is noise in its console."""
    return Response(status_code=204, headers={"Cache-Control": "max-age=86400"})


@router.get("/")
async def home(request: Request) -> Response:
    user = await viewer(request)
    return RedirectResponse("/tasks" if user else "/login", status_code=303)


@router.get("/login")
async def login_page(request: Request, next: str | None = None) -> Response:
    target = _safe_next(next)
    if await viewer(request) is not None:
        return RedirectResponse(target, status_code=303)
    return render(request, None, "login.html", next=target, title="Sign in")


# --- tasks -----------------------------------------------------------------------------------------------------


async def _task_choices(user: WebUser, hub: Hub) -> dict[str, Any]:
    """The (source, profile) pairs the author may use, for the one ``Profile`` select: ``value`` is the JSON the
    form merges into the task's body (``cell``, ``profile``), ``note`` says why such a task would wait."""
    sources = {s["name"]: s["runner"] for s in (await api_sources.list_sources(user=user, hub=hub))["sources"]}
    choices = []
    for source, profiles in sorted(user.account.allowed_profiles.items()):
        runner = sources.get(source)
        for profile in profiles:
            if runner is None:
                note = "no execution node"
            elif profile not in runner["allowedProfiles"]:
                note = "the node does not allow it"
            else:
                note = "" if runner["online"] else "node offline"
            value = json.dumps({"cell": source, "profile": profile}, sort_keys=True)
            choices.append({"source": source, "profile": profile, "note": note, "value": value})
    return {"choices": choices}


async def _tasks_view(request: Request, user: WebUser, state: str | None, cursor: str | None) -> dict[str, Any]:
    hub = hub_of(request)
    chosen = state if state in TASK_STATES else None
    listed = await api_tasks.list_tasks(user=user, hub=hub, state=chosen, limit=PAGE_SIZE, cursor=cursor)
    links = pager("/tasks", cursor, listed["nextCursor"], state=chosen)
    return {"tasks": listed["tasks"], "state": chosen, **links, **await _task_choices(user, hub)}


@router.get("/tasks")
async def tasks_page(request: Request, state: str | None = None, cursor: str | None = None) -> Response:
    return await page_of(request, "tasks.html", lambda user: _tasks_view(request, user, state, cursor),
                          title="Tasks", section="tasks", states=TASK_STATES)  # fmt: skip


async def _task_view(request: Request, user: WebUser, task_id: str) -> dict[str, Any]:
    hub = hub_of(request)
    task = (await api_tasks.get_task(task_id=task_id, user=user, hub=hub))["task"]
    job = (await api_jobs.get_job(job_id=task["jobId"], user=user, hub=hub))["job"] if task["jobId"] else None
    live = task["state"] not in TASK_FINAL or (job is not None and job["state"] not in TERMINAL)
    approver = None
    if task["approval"] is not None:  # team-tools.md 12: the coordinator, a bot of the task's owner, by name
        approver = await run_in_threadpool(hub.team_people.bot_name, user.account.tenant, task["createdBy"],
                                           task["approval"]["coordinatorBotId"])  # fmt: skip
    return {"task": task, "job": job, "live": live, "title": task["title"], "approver_bot": approver}


@router.get("/tasks/{task_id}")
async def task_page(request: Request, task_id: str) -> Response:
    return await page_of(request, "task.html", lambda user: _task_view(request, user, task_id), section="tasks")


@router.get("/tasks/{task_id}/live")
async def task_live(request: Request, task_id: str) -> Response:
    return await part_of(request, "parts/task_state.html", lambda user: _task_view(request, user, task_id))


# --- jobs and audit --------------------------------------------------------------------------------------------


async def _jobs_view(request: Request, user: WebUser, state: str | None, cursor: str | None) -> dict[str, Any]:
    chosen = state if state in JOB_STATES else None
    hub = hub_of(request)
    found, next_cursor = await api_jobs.jobs_page(user, hub, state=chosen, cell=None, limit=PAGE_SIZE, cursor=cursor)
    jobs = [api_jobs.job_view(hub, item) | {"taskTitle": item.task_title} for item in found]
    live_url = link("/jobs/live", state=chosen, cursor=cursor)
    links = pager("/jobs", cursor, next_cursor, state=chosen)
    return {"jobs": jobs, "state": chosen, "live_url": live_url, **links}


@router.get("/jobs")
async def jobs_page(request: Request, state: str | None = None, cursor: str | None = None) -> Response:
    return await page_of(request, "jobs.html", lambda user: _jobs_view(request, user, state, cursor),
                          title="Jobs", section="jobs", states=JOB_STATES)  # fmt: skip


@router.get("/jobs/live")
async def jobs_live(request: Request, state: str | None = None, cursor: str | None = None) -> Response:
    return await part_of(request, "parts/jobs.html", lambda user: _jobs_view(request, user, state, cursor))


async def _job_view(request: Request, user: WebUser, job_id: str) -> dict[str, Any]:
    hub = hub_of(request)
    job = (await api_jobs.get_job(job_id=job_id, user=user, hub=hub))["job"]
    task = (await api_tasks.get_task(task_id=job["taskId"], user=user, hub=hub))["task"]
    audit = await api_jobs.list_audit(user=user, hub=hub, task=None, job=job_id, limit=100, cursor=None)
    live = job["state"] not in TERMINAL
    return {"job": job, "task": task, "events": audit["events"], "live": live, "title": f"Job {job_id}"}


@router.get("/jobs/{job_id}")
async def job_page(request: Request, job_id: str) -> Response:
    return await page_of(request, "job.html", lambda user: _job_view(request, user, job_id), section="jobs")


@router.get("/jobs/{job_id}/live")
async def job_live(request: Request, job_id: str) -> Response:
    return await part_of(request, "parts/job_state.html", lambda user: _job_view(request, user, job_id))


async def _audit_view(request: Request, user: WebUser, cursor: str | None) -> dict[str, Any]:
    """An admin's view of the whole log; a user is pointed at their jobs' pages."""
    if not user.is_admin:
        return {"report": None, "events": [], "older": None, "newest": None}
    hub = hub_of(request)
    listed = await api_jobs.list_audit(user=user, hub=hub, task=None, job=None, limit=PAGE_SIZE, cursor=cursor)
    report = await api_jobs.verify_audit(admin=user, hub=hub)
    return {"report": report, "events": listed["events"], **pager("/audit", cursor, listed["nextCursor"])}


@router.get("/audit")
async def audit_page(request: Request, cursor: str | None = None) -> Response:
    return await page_of(request, "audit.html", lambda user: _audit_view(request, user, cursor),
                          title="Audit", section="audit")  # fmt: skip


# --- settings (admins) -----------------------------------------------------------------------------------------


@router.get("/settings")
async def settings_page(request: Request) -> Response:
    user = await page_user(request)
    if isinstance(user, Response):
        return user
    if not user.is_admin:  # a user's settings are their own account's
        return RedirectResponse("/settings/password", status_code=303)
    nodes = await _nodes(request, user)
    accounts = await api_accounts.list_accounts(admin=user, hub=hub_of(request), limit=100, cursor=None)
    return render(request, user, "settings.html", title="Settings", section="settings", sub=None,
                   nodes=nodes, accounts=accounts["accounts"])  # fmt: skip


async def _nodes(request: Request, user: WebUser) -> list[dict[str, Any]]:
    hub = hub_of(request)
    records = await run_in_threadpool(hub.registry.all, user.account.tenant)
    listed = [summary(hub, record) for record in records]
    return sorted(listed, key=lambda n: (not n["enabled"], -n["createdAt"]))


@router.get("/settings/password")
async def password_page(request: Request, changed: int = 0) -> Response:
    """Settings → Your password, for everyone signed in (``POST /api/auth/password``)."""
    user = await page_user(request)
    if isinstance(user, Response):
        return user
    return render(request, user, "password.html", title="Your password", section="settings", sub="password",
                   changed=changed == 1)  # fmt: skip


@router.get("/settings/nodes")
async def nodes_page(request: Request) -> Response:
    user = await page_user(request, admin=True)
    if isinstance(user, Response):
        return user
    hub = hub_of(request)
    return render(request, user, "nodes.html", title="Execution nodes", section="settings", sub="nodes",
                   nodes=await _nodes(request, user), hub_url=hub.settings.public_url,
                   hermes_url=DEFAULT_HERMES_URL)  # fmt: skip


@router.get("/settings/nodes/live")
async def nodes_live(request: Request) -> Response:
    user = await part_user(request, admin=True)
    if isinstance(user, Response):
        return user
    return render(request, user, "parts/nodes.html", nodes=await _nodes(request, user))


@router.get("/settings/accounts")
async def accounts_page(request: Request) -> Response:
    user = await page_user(request, admin=True)
    if isinstance(user, Response):
        return user
    listed = await api_accounts.list_accounts(admin=user, hub=hub_of(request), limit=100, cursor=None)
    return render(request, user, "accounts.html", title="Accounts", section="settings", sub="accounts",
                   accounts=listed["accounts"])  # fmt: skip


@router.get("/settings/accounts/{username}")
async def account_page(request: Request, username: str) -> Response:
    user = await page_user(request, admin=True)
    if isinstance(user, Response):
        return user
    hub = hub_of(request)
    account = await run_in_threadpool(hub.accounts.get, username)
    if account is None or account.tenant != user.account.tenant:
        return refused(request, user, TalariaError("not_found", "no such account"))
    return render(request, user, "account.html", title=f"Account {username}", section="settings",
                   sub="accounts", account=account.as_json(), me=user.account.username)  # fmt: skip


# The chat pages (chat.md 6) are their own module; the app includes this one router.
router.include_router(chat_pages.router)
router.include_router(team_pages.router)

__all__ = ["not_found_page", "router"]
