"""The hub answers what ``/openapi.json`` says (issue 12 item 10, ADR 0029): schemathesis generates requests from the
document and sends them to a live hub on 127.0.0.1 as three callers (anonymous, a signed-in user, an admin); every
answer's status must be documented for its operation, its media type and body must match, no answer may be a 500,
every error's ``code`` must be one the operation lists for that status (``x-codes``), and a refused request (any 4xx)
must change no table (issue 17 part 2; the tables a refusal records itself in, ``MOVING``, aside).

Bounded and deterministic: a fixed number of examples per operation (``EXAMPLES``, valid and invalid ones),
derandomized, no example database, no shrinking (a failure is reported with the request that caused it).
Sign-out runs last, so the caller's session lives through the other operations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from talaria.hub.openapi import RELAYED_NOTE
from talaria.hub.runners.registry import REGISTRATION_BODY
from tests.integration.route_matrix_support import changes, snapshot
from tests.integration.web_support import Web

EXAMPLES = 12
# Valid requests, and requests the document says are invalid (each must still get a documented answer).
MODES = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# 502-504 are documented runner outcomes (runner_offline when a source's node is not connected); a 500 never is.
CONFIG = schemathesis.Config.from_dict(
    {"checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "502", "503", "504"]}}}
)
LAST = "POST /api/auth/logout"
# GET /api/conversations/{conversation_id}/events answers a stream held open (chat.md 4), which a generated request
# would wait on forever. It runs like every operation all the same, because no generated request can open one: its
# first check after the session is that the id names one of the caller's conversations (404 before `after` or
# `Last-Event-ID` is read), and generated ids never equal a minted `cnv_` ULID. Its refusals are still checked.
# A hypothesis setting per generated operation: bounded, the same examples every run, no shrinking, no database.
RUN = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _credentials(web: Web, caller: str) -> tuple[dict[str, str], dict[str, str]]:
    """(cookies, headers) of ``caller``'s requests; an anonymous caller sends what schemathesis generates."""
    if caller == "anonymous":
        return {}, {}
    client = web.admin if caller == "admin" else web.user
    return dict(client.cookies), {"X-CSRF-Token": client.headers["X-CSRF-Token"], "Origin": web.server.url}


def _documented_code(case: schemathesis.Case, response: schemathesis.Response) -> str | None:
    """Why an error answer's code is not one its operation lists for its status, or None."""
    if response.status_code < 400:
        return None
    documented = case.operation.definition.raw["responses"].get(str(response.status_code), {})
    code = response.json().get("code")
    if code in documented.get("x-codes", []) or documented.get("description", "").endswith(RELAYED_NOTE):
        return None
    return f"{case.method} {case.path}: {response.status_code} {code!r} is not listed in {documented.get('x-codes')}"


def _exercise(schema: Any, label: str, cookies: dict[str, str], headers: dict[str, str], data_dir: Path) -> list[str]:
    """Run EXAMPLES generated requests of one operation; the failures, at most one per kind."""
    operation = schema[label.split(" ", 1)[1]][label.split(" ", 1)[0]]
    failures: dict[str, str] = {}
    session = requests.Session()

    @RUN
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        mode = data.draw(st.sampled_from(MODES))
        case = data.draw(operation.as_strategy(mode, cookies=cookies or None, headers=headers or None))
        before = snapshot(data_dir)
        response = case.call(session=session, timeout=30)
        if 400 <= response.status_code < 500 and (changed := changes(data_dir, before)):
            failures.setdefault("refusal changed state", f"{label} ({mode.value}): {response.status_code} "
                                f"{response.text[:200]} changed {sorted(changed)}")  # fmt: skip
        try:
            case.validate_response(response, checks=CHECKS)
        except (AssertionError, BaseExceptionGroup) as exc:  # reported, not shrunk
            found = exc.exceptions if isinstance(exc, BaseExceptionGroup) else [exc]
            for failure in found:
                failures.setdefault(type(failure).__name__, f"{label} ({mode.value}): {failure}")
        wrong = _documented_code(case, response)
        if wrong:
            failures.setdefault("undocumented code", wrong)

    try:
        run()
    finally:
        session.close()
    return list(failures.values())


@pytest.mark.parametrize("caller", ["anonymous", "user", "admin"])
def test_the_hub_answers_what_its_openapi_document_says(web: Web, caller: str) -> None:
    cookies, headers = _credentials(web, caller)  # signed in before any generated sign-in can throttle the peer
    schema = schemathesis.openapi.from_url(f"{web.server.url}/openapi.json", config=CONFIG)
    labels = sorted((op.ok().label for op in schema.get_all_operations()), key=lambda label: label == LAST)
    assert len(labels) >= 29 and labels[-1] == LAST
    data_dir = web.server.settings.data_dir
    failures = [failure for label in labels for failure in _exercise(schema, label, cookies, headers, data_dir)]
    assert failures == [], "\n\n".join(failures)


def test_the_registration_body_is_in_the_document(web: Web) -> None:
    document = web.anon().get("/openapi.json").json()
    body = document["paths"]["/api/admin/runners"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == REGISTRATION_BODY
