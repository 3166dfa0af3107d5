"""What ``/openapi.json`` says (issue 12 item 10, ADR 0029), read from the app without serving it: no 422, every
operation's error answers with the one Error schema and the codes its checks imply, the bodies parsed by hand, the
documented limits, and patterns that never promise what the text rules refuse."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.accounts.rules import USERNAME, check_username
from talaria.hub.api.runner_admin import TEST_TURN_BODY
from talaria.hub.app import create_app
from talaria.hub.openapi import ERROR_REF, refusals, status_of
from talaria.hub.runners.registry import REGISTRATION_BODY
from talaria.settings import Settings
from talaria.text_rules import MULTI_LINE_PATTERN, ONE_LINE_PATTERN, multi_line, one_line

METHODS = {"get", "post", "patch", "put", "delete"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    app = create_app(Settings(data_dir=Path("/nonexistent/talaria-openapi-test")), run_reaper=False)
    doc: dict[str, Any] = app.web.openapi()
    return doc


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, item in document["paths"].items() for m, op in item.items() if m in METHODS]


def body_schema(document: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = operation["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        return dict(document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]])
    return schema


def codes(operation: dict[str, Any], status: int) -> list[str]:
    return list(operation["responses"].get(str(status), {}).get("x-codes", []))


def test_nothing_answers_422_or_names_fastapi_s_validation_schema(document: dict[str, Any]) -> None:
    text = json.dumps(document)
    assert "HTTPValidationError" not in text
    assert "ValidationError" not in text
    # 422 only for a reused Idempotency-Key (chat.md 3.3), never FastAPI's validation answer
    assert all(codes(op, 422) in ([], ["idempotency_key_reused"]) for _, _, op in operations(document))


def test_the_document_covers_the_web_api_and_the_operations_routes_only(document: dict[str, Any]) -> None:
    paths = set(document["paths"])
    assert {p for p in paths if not p.startswith("/api/")} == {"/healthz", "/readyz", "/metrics"}
    assert not any(p.startswith(("/api/runner/", "/internal/")) for p in paths)
    # 29, five bot and four conversation routes, the live stream, messages, four turn and two attachment routes,
    # team tools' two team and four goal routes (team-tools.md 11), a runner's drain and its token's
    # rotation (operations.md 3.1, 4.1)
    assert len(operations(document)) == 54
    assert {"/api/teams", "/api/teams/{team_id}", "/api/goals", "/api/goals/{goal_id}", "/api/goals/{goal_id}/criteria",
            "/api/goals/{goal_id}/stop"} <= paths  # fmt: skip


def test_the_error_schema_is_the_canonical_body(document: dict[str, Any]) -> None:
    error = document["components"]["schemas"]["Error"]
    assert error["required"] == ["code", "error"]
    assert error["properties"]["code"]["type"] == error["properties"]["error"]["type"] == "string"
    assert error["additionalProperties"] is True


def test_every_error_answer_is_the_error_schema_with_codes_of_its_status(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        errors = {status: answer for status, answer in operation["responses"].items() if int(status) >= 400}
        assert errors or path == "/healthz", (method, path)  # healthz answers 200 whenever it answers
        for status, answer in errors.items():
            assert answer["content"] == {"application/json": {"schema": ERROR_REF}}, (method, path, status)
            assert answer["x-codes"], (method, path, status)
            assert {status_of(code) for code in answer["x-codes"]} == {int(status)}, (method, path, status)


def test_the_checks_of_a_route_appear_as_its_error_answers(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        security = operation.get("security", [])
        where = (method, path)
        if security:
            assert "unauthenticated" in codes(operation, 401), where
            assert "store_unavailable" in codes(operation, 503), where
            assert ("csrf_failed" in codes(operation, 403)) == (method != "get"), where
            assert security == [{"session": [], "csrf": []} if method != "get" else {"session": []}], where
        else:
            assert path in {"/api/auth/login", "/healthz", "/readyz", "/metrics"}, where
        if path.startswith("/api/admin/") or path == "/api/audit/verify":
            assert "admin_required" in codes(operation, 403), where
        if "requestBody" in operation:
            assert "invalid_request" in codes(operation, 400), where
            assert "payload_too_large" in codes(operation, 413), where
        if "{" in path:
            assert "not_found" in codes(operation, 404), where


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/api/auth/login", 429, "login_throttled"),
        ("/api/auth/password", 429, "login_throttled"),
        ("/api/auth/login", 403, "csrf_failed"),
        ("/api/admin/accounts", 409, "account_exists"),
        ("/api/admin/accounts/{username}", 409, "last_admin"),
        ("/api/tasks/{task_id}/approve", 409, "invalid_transition"),
        ("/api/admin/runners", 409, "runner_source_in_use"),
        ("/api/sources/{source}/profiles", 503, "runner_offline"),
        ("/api/admin/runners/{runner_id}/test-turn", 503, "runner_offline"),
        ("/api/admin/runners/{runner_id}/test-turn", 503, "runner_draining"),
        ("/api/admin/runners/{runner_id}/drain", 503, "runner_offline"),
        ("/api/admin/runners/{runner_id}/drain", 404, "not_found"),
    ],
)
def test_state_conflicts_throttles_and_runner_outcomes_are_listed(
    document: dict[str, Any], path: str, status: int, code: str
) -> None:
    (operation,) = [op for _, p, op in operations(document) if p == path and str(status) in op["responses"]][:1]
    assert code in codes(operation, status)


def test_the_bodies_parsed_by_hand_are_documented(document: dict[str, Any]) -> None:
    register = document["paths"]["/api/admin/runners"]["post"]
    assert register["requestBody"]["required"] is True
    assert body_schema(document, register) == REGISTRATION_BODY
    assert REGISTRATION_BODY["additionalProperties"] is False
    assert REGISTRATION_BODY["required"] == ["name", "allowedProfiles"]
    turn = document["paths"]["/api/admin/runners/{runner_id}/test-turn"]["post"]
    assert body_schema(document, turn) == TEST_TURN_BODY
    assert TEST_TURN_BODY["properties"]["prompt"]["maxLength"] == 4000
    assert set(turn["responses"]["200"]["content"]) == {"text/event-stream"}


def test_every_pydantic_body_refuses_unknown_fields(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        if "requestBody" in operation:
            schema = body_schema(document, operation)
            if "anyOf" in schema:  # an optional body: the object or null
                ref = next(option["$ref"] for option in schema["anyOf"] if "$ref" in option)
                schema = document["components"]["schemas"][ref.rsplit("/", 1)[-1]]
            assert schema["additionalProperties"] is False, (method, path)


def test_account_creation_shows_the_username_and_password_rules(document: dict[str, Any]) -> None:
    create = body_schema(document, document["paths"]["/api/admin/accounts"]["post"])
    username = create["properties"]["username"]
    assert username["pattern"] == "^[a-z0-9][a-z0-9._-]{0,63}$" == USERNAME.pattern
    assert username["not"] == {"enum": [".", ".."]}
    assert create["properties"]["password"]["minLength"] == 12
    assert create["properties"]["role"]["enum"] == ["admin", "user"]
    patch = body_schema(document, document["paths"]["/api/admin/accounts/{username}"]["patch"])
    assert "anyOf" not in json.dumps(patch), "a PATCH field may be left out but is never null"


def test_list_limits_are_1_to_100(document: dict[str, Any]) -> None:
    lists = ["/api/admin/accounts", "/api/tasks", "/api/jobs", "/api/audit"]
    for path in lists:
        (limit,) = [p for p in document["paths"][path]["get"]["parameters"] if p["name"] == "limit"]
        assert (limit["schema"]["type"], limit["schema"]["minimum"], limit["schema"]["maximum"]) == ("integer", 1, 100)


def test_task_and_job_state_filters_are_enums(document: dict[str, Any]) -> None:
    for path in ("/api/tasks", "/api/jobs"):
        (state,) = [p for p in document["paths"][path]["get"]["parameters"] if p["name"] == "state"]
        assert "DISPATCHED" in state["schema"]["enum"] or "QUEUED" in state["schema"]["enum"]


def test_a_route_cannot_declare_an_unknown_code() -> None:
    with pytest.raises(ValueError, match="unknown error code"):
        refusals("no_such_code")


@settings(max_examples=200, derandomize=True, database=None)
@given(st.from_regex(ONE_LINE_PATTERN, fullmatch=True))
def test_what_the_one_line_pattern_admits_the_rule_accepts(value: str) -> None:
    one_line("title", value)


@settings(max_examples=200, derandomize=True, database=None)
@given(st.from_regex(MULTI_LINE_PATTERN, fullmatch=True))
def test_what_the_multi_line_pattern_admits_the_rule_accepts(value: str) -> None:
    multi_line("prompt", value)


@settings(max_examples=200, derandomize=True, database=None)
@given(st.from_regex(USERNAME, fullmatch=True))
def test_what_the_username_pattern_admits_the_rule_accepts(value: str) -> None:
    assert value not in (".", "..")
    check_username(value)


def test_the_patterns_refuse_what_the_rules_refuse() -> None:
    for refused in ("", "   ", "a\u202eb", "a\x00b", "a\x85b"):
        assert not re.match(ONE_LINE_PATTERN, refused)
        assert not re.match(MULTI_LINE_PATTERN, refused)
    assert not re.match(ONE_LINE_PATTERN, "two\nlines")
    assert re.match(MULTI_LINE_PATTERN, "two\nlines\tand a tab")
