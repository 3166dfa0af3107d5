"""The web pages (issue: web UI): server-rendered views of the JSON API, for people.

Every page reads through the same route functions the JSON API answers with, so a page never shows what
the API would not (no runner token, no token hash, no other tenant's objects). Every change is made by
``/static/app.js`` calling the JSON API with the session's CSRF token in ``X-CSRF-Token`` (web-api.md 2),
so the API's checks (session, CSRF and Origin, admin) are the only ones. ``…/live`` routes answer the part
of a page that changes (node status, job and task state) for the page's short polling.

Without a session a page redirects to ``/login?next=<path>``; a live part answers 401 ``unauthenticated``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from talaria.errors import TalariaError
from talaria.hub import api_accounts, api_jobs, api_sources, api_tasks
from talaria.hub.errors import error_response
from talaria.hub.runners.admin_api import summary
from talaria.hub.runners.registry import DEFAULT_HERMES_URL
from talaria.hub.state import Hub
from talaria.hub.web.render import Pages
from talaria.hub.websession import COOKIE, WebUser
from talaria.lifecycle.machine import TASK_FINAL, TERMINAL, JobState, TaskState

router = APIRouter(include_in_schema=False)

TASK_STATES = [s.name for s in TaskState]
JOB_STATES = [s.name for s in JobState]
PAGE_SIZE = 50


def _link(path: str, **params: str | None) -> str:
    """``path`` with the given query parameters, leaving out the empty ones."""
    query = urlencode({k: v for k, v in params.items() if v})
    return f"{path}?{query}" if query else path


def _hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


def _pages(request: Request) -> Pages:
    pages: Pages = request.app.state.pages
    return pages


async def _viewer(request: Request) -> WebUser | None:
    return await run_in_threadpool(_hub(request).sessions.lookup, request.cookies.get(COOKIE))


def _to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def _safe_next(raw: str | None) -> str:
    """Only a path on this hub (no scheme, no host, no ``//``; no braces, which app.js would fill from the
    sign-in answer): anything else becomes ``/tasks``."""
    if not raw or not raw.startswith("/") or raw.startswith("//") or any(c in raw for c in "\\{}"):
        return "/tasks"
    parts = urlsplit(raw)
    return raw if not parts.scheme and not parts.netloc else "/tasks"


def _render(request: Request, user: WebUser | None, template: str, status: int = 200, **context: Any) -> Response:
    base = {
        "user": user,
        "csrf": user.csrf_token if user else "",
        "path": request.url.path,
        "section": None,
        "sub": None,
    }
    return _pages(request).render(template, status, **(base | context))


def _refused(request: Request, user: WebUser | None, error: TalariaError) -> Response:
    return _render(request, user, "error.html", error.status, code=error.code, message=error.message,
                   title="Not possible")  # fmt: skip


async def _page(request: Request, admin: bool = False) -> WebUser | Response:
    user = await _viewer(request)
    if user is None:
        return _to_login(request)
    if admin and not user.is_admin:
        return _refused(request, user, TalariaError("admin_required", "this page is for admins"))
    return user


async def _part(request: Request, admin: bool = False) -> WebUser | Response:
    user = await _viewer(request)
    if user is None:
        return error_response(TalariaError("unauthenticated", "sign in first"))
    if admin and not user.is_admin:
        return error_response(TalariaError("admin_required", "this needs an admin account"))
    return user


# --- sign-in ---------------------------------------------------------------------------------------------------


@router.get("/")
async def home(request: Request) -> Response:
    user = await _viewer(request)
    return RedirectResponse("/tasks" if user else "/login", status_code=303)


@router.get("/login")
async def login_page(request: Request, next: str | None = None) -> Response:
    target = _safe_next(next)
    if await _viewer(request) is not None:
        return RedirectResponse(target, status_code=303)
    return _render(request, None, "login.html", next=target, title="Sign in")


# --- tasks -----------------------------------------------------------------------------------------------------


async def _task_choices(user: WebUser, hub: Hub) -> dict[str, Any]:
    sources = (await api_sources.list_sources(user=user, hub=hub))["sources"]
    names = sorted({s["name"] for s in sources} | set(user.account.allowed_profiles))
    profiles = sorted({p for listed in user.account.allowed_profiles.values() for p in listed})
    return {"source_names": names, "profile_names": profiles}


@router.get("/tasks")
async def tasks_page(request: Request, state: str | None = None, cursor: str | None = None) -> Response:
    user = await _page(request)
    if isinstance(user, Response):
        return user
    hub = _hub(request)
    chosen = state if state in TASK_STATES else None
    try:
        listed = await api_tasks.list_tasks(user=user, hub=hub, state=chosen, limit=PAGE_SIZE, cursor=cursor)
    except TalariaError as exc:  # a malformed cursor
        return _refused(request, user, exc)
    older = _link("/tasks", state=chosen, cursor=listed["nextCursor"]) if listed["nextCursor"] else None
    newest = _link("/tasks", state=chosen) if cursor else None
    return _render(request, user, "tasks.html", title="Tasks", section="tasks", tasks=listed["tasks"],
                   states=TASK_STATES, state=chosen, older=older, newest=newest,
                   **await _task_choices(user, hub))  # fmt: skip


async def _task_view(request: Request, user: WebUser, task_id: str) -> dict[str, Any]:
    hub = _hub(request)
    task = (await api_tasks.get_task(task_id=task_id, user=user, hub=hub))["task"]
    job = (await api_jobs.get_job(job_id=task["jobId"], user=user, hub=hub))["job"] if task["jobId"] else None
    live = task["state"] not in TASK_FINAL or (job is not None and job["state"] not in TERMINAL)
    return {"task": task, "job": job, "live": live}


@router.get("/tasks/{task_id}")
async def task_page(request: Request, task_id: str) -> Response:
    user = await _page(request)
    if isinstance(user, Response):
        return user
    try:
        view = await _task_view(request, user, task_id)
    except TalariaError as exc:
        return _refused(request, user, exc)
    return _render(request, user, "task.html", title=view["task"]["title"], section="tasks", **view)


@router.get("/tasks/{task_id}/live")
async def task_live(request: Request, task_id: str) -> Response:
    user = await _part(request)
    if isinstance(user, Response):
        return user
    try:
        view = await _task_view(request, user, task_id)
    except TalariaError as exc:
        return error_response(exc)
    return _render(request, user, "parts/task_state.html", **view)


# --- jobs and audit --------------------------------------------------------------------------------------------


async def _jobs_view(request: Request, user: WebUser, state: str | None, cursor: str | None) -> dict[str, Any]:
    chosen = state if state in JOB_STATES else None
    hub = _hub(request)
    listed = await api_jobs.list_jobs(user=user, hub=hub, state=chosen, cell=None, limit=PAGE_SIZE, cursor=cursor)
    return {
        "jobs": listed["jobs"],
        "state": chosen,
        "live_url": _link("/jobs/live", state=chosen, cursor=cursor),
        "older": _link("/jobs", state=chosen, cursor=listed["nextCursor"]) if listed["nextCursor"] else None,
        "newest": _link("/jobs", state=chosen) if cursor else None,
    }


@router.get("/jobs")
async def jobs_page(request: Request, state: str | None = None, cursor: str | None = None) -> Response:
    user = await _page(request)
    if isinstance(user, Response):
        return user
    try:
        view = await _jobs_view(request, user, state, cursor)
    except TalariaError as exc:  # a malformed cursor
        return _refused(request, user, exc)
    return _render(request, user, "jobs.html", title="Jobs", section="jobs", states=JOB_STATES, **view)


@router.get("/jobs/live")
async def jobs_live(request: Request, state: str | None = None, cursor: str | None = None) -> Response:
    user = await _part(request)
    if isinstance(user, Response):
        return user
    try:
        view = await _jobs_view(request, user, state, cursor)
    except TalariaError as exc:
        return error_response(exc)
    return _render(request, user, "parts/jobs.html", **view)


async def _job_view(request: Request, user: WebUser, job_id: str) -> dict[str, Any]:
    hub = _hub(request)
    job = (await api_jobs.get_job(job_id=job_id, user=user, hub=hub))["job"]
    task = (await api_tasks.get_task(task_id=job["taskId"], user=user, hub=hub))["task"]
    audit = await api_jobs.list_audit(user=user, hub=hub, task=None, job=job_id, limit=100, cursor=None)
    return {"job": job, "task": task, "events": audit["events"], "live": job["state"] not in TERMINAL}


@router.get("/jobs/{job_id}")
async def job_page(request: Request, job_id: str) -> Response:
    user = await _page(request)
    if isinstance(user, Response):
        return user
    try:
        view = await _job_view(request, user, job_id)
    except TalariaError as exc:
        return _refused(request, user, exc)
    return _render(request, user, "job.html", title=f"Job {job_id}", section="jobs", **view)


@router.get("/jobs/{job_id}/live")
async def job_live(request: Request, job_id: str) -> Response:
    user = await _part(request)
    if isinstance(user, Response):
        return user
    try:
        view = await _job_view(request, user, job_id)
    except TalariaError as exc:
        return error_response(exc)
    return _render(request, user, "parts/job_state.html", **view)


@router.get("/audit")
async def audit_page(request: Request, cursor: str | None = None) -> Response:
    user = await _page(request)
    if isinstance(user, Response):
        return user
    hub = _hub(request)
    context: dict[str, Any] = {"report": None, "events": [], "older": None, "newest": None}
    if user.is_admin:
        try:
            listed = await api_jobs.list_audit(user=user, hub=hub, task=None, job=None, limit=PAGE_SIZE,
                                               cursor=cursor)  # fmt: skip
        except TalariaError as exc:  # a malformed cursor
            return _refused(request, user, exc)
        context["report"] = await api_jobs.verify_audit(admin=user, hub=hub)
        context["events"] = listed["events"]
        context["older"] = _link("/audit", cursor=listed["nextCursor"]) if listed["nextCursor"] else None
        context["newest"] = "/audit" if cursor else None
    return _render(request, user, "audit.html", title="Audit", section="audit", **context)


# --- settings (admins) -----------------------------------------------------------------------------------------


@router.get("/settings")
async def settings_page(request: Request) -> Response:
    user = await _page(request, admin=True)
    if isinstance(user, Response):
        return user
    nodes = await _nodes(request, user)
    accounts = await api_accounts.list_accounts(admin=user, hub=_hub(request), limit=100, cursor=None)
    return _render(request, user, "settings.html", title="Settings", section="settings", sub=None,
                   nodes=nodes, accounts=accounts["accounts"])  # fmt: skip


async def _nodes(request: Request, user: WebUser) -> list[dict[str, Any]]:
    hub = _hub(request)
    records = await run_in_threadpool(hub.registry.all, user.account.tenant)
    listed = [summary(hub, record) for record in records]
    return sorted(listed, key=lambda n: (not n["enabled"], -n["createdAt"]))


@router.get("/settings/nodes")
async def nodes_page(request: Request) -> Response:
    user = await _page(request, admin=True)
    if isinstance(user, Response):
        return user
    hub = _hub(request)
    return _render(request, user, "nodes.html", title="Execution nodes", section="settings", sub="nodes",
                   nodes=await _nodes(request, user), hub_url=hub.settings.public_url,
                   hermes_url=DEFAULT_HERMES_URL)  # fmt: skip


@router.get("/settings/nodes/live")
async def nodes_live(request: Request) -> Response:
    user = await _part(request, admin=True)
    if isinstance(user, Response):
        return user
    return _render(request, user, "parts/nodes.html", nodes=await _nodes(request, user))


@router.get("/settings/accounts")
async def accounts_page(request: Request) -> Response:
    user = await _page(request, admin=True)
    if isinstance(user, Response):
        return user
    listed = await api_accounts.list_accounts(admin=user, hub=_hub(request), limit=100, cursor=None)
    return _render(request, user, "accounts.html", title="Accounts", section="settings", sub="accounts",
                   accounts=listed["accounts"])  # fmt: skip


@router.get("/settings/accounts/{username}")
async def account_page(request: Request, username: str) -> Response:
    user = await _page(request, admin=True)
    if isinstance(user, Response):
        return user
    hub = _hub(request)
    account = await run_in_threadpool(hub.accounts.get, username)
    if account is None or account.tenant != user.account.tenant:
        return _refused(request, user, TalariaError("not_found", "no such account"))
    return _render(request, user, "account.html", title=f"Account {username}", section="settings",
                   sub="accounts", account=account.as_json(), me=user.account.username)  # fmt: skip
