"""What every page route shares: who is signed in, the sign-in redirect, rendering with the base context, and the
error pages (ADR 0018).

A page without a session redirects to ``/login?next=<path>``; a part of a page (polled or fetched by
``/static/app.js``) answers the canonical JSON error instead, 401 ``unauthenticated`` without a session. A refused
view becomes the error page with the refusal's status; ``missing`` is the page of an unknown path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from talaria.errors import TalariaError
from talaria.hub.api.websession import COOKIE, WebUser
from talaria.hub.errors import error_response
from talaria.hub.resources import Hub
from talaria.hub.web.render import Pages

NOT_FOUND_MESSAGE = "There is no page at this address."


def link(path: str, **params: str | None) -> str:
    """``path`` with the given query parameters, leaving out the empty ones."""
    query = urlencode({k: v for k, v in params.items() if v})
    return f"{path}?{query}" if query else path


def pager(path: str, cursor: str | None, next_cursor: str | None, **params: str | None) -> dict[str, str | None]:
    """The links of ``parts/pager.html``: older entries (the list's ``nextCursor``) and, on a later page, the
    newest ones; ``params`` (a state filter) are kept."""
    return {
        "older": link(path, **params, cursor=next_cursor) if next_cursor else None,
        "newest": link(path, **params) if cursor else None,
    }


def hub_of(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


def _pages(request: Request) -> Pages:
    pages: Pages = request.app.state.pages
    return pages


async def viewer(request: Request) -> WebUser | None:
    return await run_in_threadpool(hub_of(request).sessions.lookup, request.cookies.get(COOKIE))


def to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def render(request: Request, user: WebUser | None, template: str, status: int = 200, **context: Any) -> Response:
    base = {
        "user": user,
        "csrf": user.csrf_token if user else "",
        "path": request.url.path,
        "section": None,
        "sub": None,
    }
    return _pages(request).render(template, status, **(base | context))


def missing(request: Request, user: WebUser | None) -> Response:
    """The 404 page of an unknown path."""
    return render(request, user, "error.html", 404, code="not_found", message=NOT_FOUND_MESSAGE, title="Not found")


def refused(request: Request, user: WebUser | None, error: TalariaError) -> Response:
    return render(request, user, "error.html", error.status, code=error.code, message=error.message,
                  title="Not possible")  # fmt: skip


async def not_found_page(request: Request) -> Response:
    """The HTML 404 for a browser asking for an unknown path (``errors.install`` calls it)."""
    return missing(request, await viewer(request))


async def page_user(request: Request, admin: bool = False) -> WebUser | Response:
    user = await viewer(request)
    if user is None:
        return to_login(request)
    if admin and not user.is_admin:
        return refused(request, user, TalariaError("admin_required", "this page is for admins"))
    return user


async def part_user(request: Request, admin: bool = False) -> WebUser | Response:
    user = await viewer(request)
    if user is None:
        return error_response(TalariaError("unauthenticated", "sign in first"))
    if admin and not user.is_admin:
        return error_response(TalariaError("admin_required", "this needs an admin account"))
    return user


ViewOf = Callable[[WebUser], Awaitable[dict[str, Any]]]


async def page_of(request: Request, template: str, view_of: ViewOf, **context: Any) -> Response:
    """A page whose view may be refused (not found, a malformed cursor): the refusal becomes the error page.
    The view's own keys (a ``title`` among them) win over ``context``."""
    user = await page_user(request)
    if isinstance(user, Response):
        return user
    try:
        view = await view_of(user)
    except TalariaError as exc:
        return refused(request, user, exc)
    return render(request, user, template, **(context | view))


async def part_of(request: Request, template: str, view_of: ViewOf) -> Response:
    """A part of such a page: a refusal is the canonical JSON error."""
    user = await part_user(request)
    if isinstance(user, Response):
        return user
    try:
        view = await view_of(user)
    except TalariaError as exc:
        return error_response(exc)
    return render(request, user, template, **view)
