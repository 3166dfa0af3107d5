"""The hub's OpenAPI document (``GET /openapi.json``), made true to what the routes answer (ADR 0029).

FastAPI generates the paths, parameters and pydantic bodies; ``document`` then corrects what it cannot know:

- **Error answers.** The hub never answers 422 (``errors.install`` maps validation to 400 ``invalid_request``), so
  FastAPI's ``HTTPValidationError`` goes. Each operation lists the error statuses it can answer, each with the
  one shared ``Error`` schema and its codes in ``x-codes``: the codes its dependencies and body imply
  (``implied``) plus the codes its handler raises, declared on the route with ``refusals(...)``. A status always
  comes from the code (``talaria.errors.STATUS_BY_CODE``), so the two cannot drift.
- **Bodies parsed by hand** (runner registration, the test turn) are declared with ``refusals(body=...)``.
- **Query and header parameters** cannot be null: ``anyOf [X, null]`` becomes ``X``.
- **Security**: the session cookie and, on writes, the CSRF token header.

Covered: the JSON API for people (``/api/...``) and the operations routes. Not covered: the runner machine API
and the Runtime API (machine-to-machine, specified in runner-protocol.md and lifecycle.md 6) and the HTML pages.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from fastapi import APIRouter, FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from talaria.errors import RELAYED_RUNNER_STATUS, RUNNER_RELAYED, STATUS_BY_CODE
from talaria.hub.api.websession import COOKIE, STATE_CHANGING, WebUserDependency

REFUSALS_KEY: Final = "x-talaria-refusals"
ANSWERS_KEY: Final = "x-talaria-answers"
ERROR_REF: Final = {"$ref": "#/components/schemas/Error"}
ERROR_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "description": "The canonical error answer: a stable code and a message for people (web-api.md 1).",
    "required": ["code", "error"],
    "properties": {
        "code": {"type": "string", "pattern": "^[a-z0-9_.]{1,64}$"},
        "error": {"type": "string"},
    },
    "additionalProperties": True,
}
SECURITY_SCHEMES: Final[Mapping[str, Any]] = {
    "session": {
        "type": "apiKey",
        "in": "cookie",
        "name": COOKIE,
        "description": "The session cookie set by POST /api/auth/login (web-api.md 2).",
    },
    "csrf": {
        "type": "apiKey",
        "in": "header",
        "name": "X-CSRF-Token",
        "description": "The session's csrfToken, on every state-changing request, with an Origin header equal to "
        "the origin of hub.public_url (web-api.md 2).",
    },
}
RELAYED_NOTE: Final = ", or another code the execution node reports"
# A code whose status depends on where it arises, as a web route answers it (talaria.errors._DUAL_STATUS).
_WEB_STATUS: Final = {"runner_connection_closed": 409}
# What a route relaying a runner command's outcome can answer (runner-protocol.md 14, "Where codes surface").
RUNNER_OUTCOMES: Final = (
    "runner_offline",
    "runner_draining",
    "runner_command_uncertain",
    "runner_busy",
    "runner_payload_limit",
    "runner_command_not_admitted",
    "runner_profile_forbidden",
    "runner_http_forbidden",
    *sorted(RUNNER_RELAYED),
)


def status_of(code: str) -> int:
    """The status a web route answers ``code`` with; raises ``ValueError`` for a code nobody answers."""
    if code in _WEB_STATUS:
        return _WEB_STATUS[code]
    if code in RUNNER_RELAYED:
        return RELAYED_RUNNER_STATUS
    if code not in STATUS_BY_CODE:
        raise ValueError(f"unknown error code {code!r}")
    return STATUS_BY_CODE[code]


def refusals(
    *codes: str, body: Mapping[str, Any] | None = None, answers: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A route's ``openapi_extra``: the error codes its handler answers beyond those ``implied`` by its
    dependencies and body; ``body``, the JSON schema of a body the handler parses itself (required); ``answers``,
    success answers that replace FastAPI's default JSON ones. Raises ``ValueError`` for an unknown code."""
    for code in codes:
        status_of(code)
    extra: dict[str, Any] = {REFUSALS_KEY: list(codes)}
    if body is not None:
        extra["requestBody"] = {"required": True, "content": {"application/json": {"schema": dict(body)}}}
    if answers is not None:
        extra[ANSWERS_KEY] = dict(answers)
    return extra


def text_answer(media_type: str, description: str) -> dict[str, Any]:
    """A 200 answer of ``media_type`` (not JSON), for ``refusals(answers=...)``."""
    return {"200": {"description": description, "content": {media_type: {"schema": {"type": "string"}}}}}


def _calls(dependant: Dependant) -> Iterator[Any]:
    for dependency in dependant.dependencies:
        yield dependency.call
        yield from _calls(dependency)


def implied(route: APIRoute, has_body: bool) -> list[str]:
    """The codes a route answers because of what it depends on: a session (401, and 503 since the session is read
    from the store), CSRF and Origin on a write (403), an admin (403), a body (400, 413)."""
    users = [call for call in _calls(route.dependant) if isinstance(call, WebUserDependency)]
    codes = []
    if users:
        codes += ["unauthenticated", "store_unavailable"]
        if set(route.methods or ()) & STATE_CHANGING:
            codes.append("csrf_failed")
        if any(user.admin for user in users):
            codes.append("admin_required")
    if has_body:
        codes += ["invalid_request", "payload_too_large"]
    return codes


def _error_responses(codes: list[str]) -> dict[str, Any]:
    by_status: dict[int, list[str]] = {}
    for code in dict.fromkeys(codes):
        by_status.setdefault(status_of(code), []).append(code)
    return {
        str(status): {
            "description": ", ".join(f"`{code}`" for code in found)
            + (RELAYED_NOTE if status == RELAYED_RUNNER_STATUS else ""),
            "x-codes": found,
            "content": {"application/json": {"schema": ERROR_REF}},
        }
        for status, found in sorted(by_status.items())
    }


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``anyOf [X, {type: null}]`` as ``X`` (with the outer keywords): a query or header parameter is absent, never
    null."""
    options = schema.get("anyOf")
    if not isinstance(options, list):
        return schema
    kept = [option for option in options if option != {"type": "null"}]
    if len(kept) != 1:
        return schema
    rest = {key: value for key, value in schema.items() if key != "anyOf"}
    return {**kept[0], **rest}


def _correct(route: APIRoute, operation: dict[str, Any]) -> None:
    declared: list[str] = operation.pop(REFUSALS_KEY, [])
    responses: dict[str, Any] = operation.setdefault("responses", {})
    responses.pop("422", None)
    responses.update(operation.pop(ANSWERS_KEY, {}))
    has_body = "requestBody" in operation
    responses.update(_error_responses([*implied(route, has_body), *declared]))
    for parameter in operation.get("parameters", []):
        if parameter.get("in") in ("query", "header"):
            parameter["schema"] = _not_null(parameter["schema"])
    calls = list(_calls(route.dependant))
    if any(isinstance(call, WebUserDependency) for call in calls):
        writes = bool(set(route.methods or ()) & STATE_CHANGING)
        operation["security"] = [{"session": [], "csrf": []} if writes else {"session": []}]


def document(app: FastAPI, routers: Sequence[APIRouter]) -> dict[str, Any]:
    """The corrected document of ``routers``' schema routes (see the module docstring)."""
    routes = [route for router in routers for route in router.routes if isinstance(route, APIRoute)]
    doc = get_openapi(title=app.title, version=app.version, routes=routes, description=app.description)
    for route in routes:
        if route.include_in_schema:
            item = doc["paths"][route.path_format]
            for method in route.methods or ():
                _correct(route, item[method.lower()])
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for generated in ("HTTPValidationError", "ValidationError"):
        schemas.pop(generated, None)
    schemas["Error"] = dict(ERROR_SCHEMA)
    components["securitySchemes"] = dict(SECURITY_SCHEMES)
    return doc


def install(app: FastAPI, routers: Sequence[APIRouter]) -> None:
    """Serve ``document(app, routers)`` as ``/openapi.json``, built on first use."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app, routers)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
