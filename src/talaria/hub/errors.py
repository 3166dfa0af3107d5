"""The canonical error body everywhere: ``{"code": ..., "error": ...}``, ``application/json``.

Framework answers (unknown path, wrong method, validation) are mapped to the same shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from talaria.canonical import canonical_json
from talaria.errors import TalariaError
from talaria.hub.middleware import HttpOnly

log = structlog.get_logger("talaria.hub")

_FRAMEWORK_CODES = {
    400: ("invalid_request", "invalid request"),
    404: ("not_found", "not found"),
    405: ("method_not_allowed", "method not allowed"),
    413: ("payload_too_large", "payload too large"),
}


NOT_JSON = "request body is not valid JSON"
NotFoundPage = Callable[[Request], Awaitable[Response]]


def wants_html(request: Request) -> bool:
    """A browser navigation: ``Accept`` names ``text/html``."""
    return "text/html" in request.headers.get("accept", "").lower()


def error_response(error: TalariaError) -> Response:
    return Response(
        canonical_json(error.body()),
        status_code=error.status,
        media_type="application/json",
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", **error.headers},
    )


def validation_message(errors: Any) -> str:
    """The first validation problem, naming the field, without echoing the value."""
    for item in errors:
        loc = [str(part) for part in item.get("loc", ()) if part not in ("body", "query", "path")]
        field = ".".join(loc) or "body"
        kind = item.get("type", "")
        if kind == "missing":
            return f"{field} is missing"
        if kind == "extra_forbidden":
            return f"{field} is not an accepted field"
        if kind == "json_invalid":
            return NOT_JSON
        if kind in ("model_attributes_type", "dict_type") and field == "body":
            return "the body must be a JSON object"
        return f"{field}: {item.get('msg', 'invalid')}"
    return "invalid request"


def install(app: FastAPI, *, not_found_page: NotFoundPage | None = None) -> None:
    """Map every error to the canonical body; with ``not_found_page``, an unknown path outside ``/api/`` and
    ``/internal/`` asked for with ``Accept: text/html`` answers that page instead (web-api.md 9)."""

    @app.exception_handler(TalariaError)
    async def talaria_error(request: Request, exc: TalariaError) -> Response:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        path = request.url.path
        if (
            exc.status_code == 404
            and not_found_page is not None
            and not path.startswith(("/api/", "/internal/"))
            and wants_html(request)
        ):
            return await not_found_page(request)
        code, message = _FRAMEWORK_CODES.get(exc.status_code, ("invalid_request", "invalid request"))
        if exc.status_code >= 500:
            code, message = "internal_error", "internal error"
        error = TalariaError(code, message)
        response = error_response(error)
        response.status_code = exc.status_code if exc.status_code in _FRAMEWORK_CODES else error.status
        if exc.status_code == 405 and exc.headers and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(TalariaError("invalid_request", validation_message(exc.errors())))


class InternalErrorGuard(HttpOnly):
    """Pure ASGI middleware: an unexpected exception becomes 500 ``internal_error`` and stops here.

    Starlette's own catch-all answers and then re-raises, and uvicorn then resets the connection,
    sometimes before the client has read the answer; this guard ends the exception instead.
    """

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled_error", path=scope.get("path"))
            if started:
                raise
            response = error_response(TalariaError("internal_error", "internal error; the transaction was rolled back"))
            await response(scope, receive, send)
