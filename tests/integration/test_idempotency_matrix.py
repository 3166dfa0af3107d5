"""The security matrix's "replayed Idempotency-Key with another body" column (issue 17, part 3), generated from the
route tables: every web operation whose OpenAPI entry lists ``idempotency_key_reused``, and every POST of the Runtime
API's router (lifecycle.md 6.6: each needs a key), is named below with how to reach a state in which its request is
accepted and with another, well-formed body. Each is sent once (accepted); then with the same key and the other body:
422 ``idempotency_key_reused`` and no table changed; then with the same key and the first body: the first answer byte
for byte, marked ``Idempotent-Replayed: true``, and still nothing changed. A route in the tables and not named here,
or the reverse, fails, so a route added later joins the column when its OpenAPI entry lists the refusal (every
route's declared refusals are checked against its answers by test_openapi_conformance.py) or it is a Runtime POST.

Another account's or principal's key is its own (test_chat_turns_api.py, the lifecycle scenarios); the key's syntax
and absence are the fuzzers' and test_runtime_bad_input.py's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from talaria.hub.runtime.routes import router as runtime_router
from talaria.testing.hub_server import HubServer
from tests.conftest import PROXY_SECRET
from tests.integration.chat_web_support import chat
from tests.integration.route_matrix_support import changes, snapshot
from tests.integration.runner_support import wait_until
from tests.integration.runtime_support import RESULT, Worker, close_clients, dispatched_job
from tests.integration.web_support import Web, assert_error, open_web

pytestmark = pytest.mark.usefixtures("fast_argon2")

KEY = "matrix-key-1"
TURNS = "/api/conversations/{conversation_id}/turns"


Send = Callable[[dict[str, Any]], httpx.Response]
Settled = Callable[[httpx.Response], bool]


@dataclass(frozen=True)
class Replay:
    """How to send one route: ``prepare`` reaches the state in which ``send(body)`` is accepted (with status
    ``accepted``) and returns ``send`` and ``settled``, true once the work the accepted request started has stopped
    moving the tables; ``first`` and ``other`` are two well-formed bodies."""

    prepare: Callable[[Web], tuple[Send, Settled]]
    first: dict[str, Any]
    other: dict[str, Any]
    accepted: int = 200


def _turn(web: Web) -> tuple[Send, Settled]:
    conversation = chat(web)  # its node is not connected: the turn waits for it, pending
    path = TURNS.format(conversation_id=conversation)

    def waiting(first: httpx.Response) -> bool:
        turn = web.user.get(f"{path}/{first.json()['turn']['id']}").json()["turn"]
        return bool(turn["waitingReason"])  # the dispatcher has seen it and said why it waits

    return (lambda body: web.user.post(path, json=body, headers={"Idempotency-Key": KEY})), waiting


def _worker(web: Web, *steps: str) -> Worker:
    """A Runtime worker holding a fresh job of its own cell, after ``steps`` (``claim``, ``start``)."""
    job, binding = dispatched_job(web.server, cell="rt")
    worker = Worker.of(web.server, job, binding, principal="svc:matrix")
    for step in steps:
        answer = worker.claim() if step == "claim" else worker.post(step)
        assert answer.status_code == 200, (step, answer.text)
    return worker


def _runtime(op: str, *steps: str, lease: bool = True) -> Callable[[Web], tuple[Send, Settled]]:
    def prepare(web: Web) -> tuple[Send, Settled]:
        worker = _worker(web, *steps)
        return (lambda body: worker.post(op, body, key=KEY, lease=lease)), lambda _: True  # one transaction

    return prepare


WEB_REPLAYS = {
    ("POST", TURNS): Replay(_turn, {"text": "one"}, {"text": "two"}, accepted=202),
}
RUNTIME_REPLAYS = {
    "claim": Replay(_runtime("claim", lease=False), {"worker_instance": "w-1"}, {"worker_instance": "w-2"}),
    # start's body is its binding and lease only: the other body names another lease epoch (refused by the key
    # before the lease is looked at)
    "start": Replay(_runtime("start", "claim"), {}, {"lease_epoch": 99}),
    "heartbeat": Replay(_runtime("heartbeat", "claim", "start"), {"progress": {"step": 1}}, {"progress": {"step": 2}}),
    "complete": Replay(
        _runtime("complete", "claim", "start"), {"result": RESULT}, {"result": RESULT | {"summary": "another"}}
    ),
    "fail": Replay(
        _runtime("fail", "claim", "start"),
        {"error": {"code": "boom", "message": "m", "retryable": False}},
        {"error": {"code": "bang", "message": "m", "retryable": False}},
    ),
    "cancel": Replay(_runtime("cancel", "claim", "start"), {"reason": "stop"}, {"reason": "halt"}),
}


@pytest.fixture
def web(make_hub: Callable[..., HubServer]) -> Iterator[Web]:
    with ExitStack() as stack:
        yield open_web(make_hub, stack, runtime_api_enabled=True, runtime_api_proxy_secret=PROXY_SECRET)
    close_clients()


def _declaring_reuse(openapi: dict[str, Any]) -> set[tuple[str, str]]:
    found = set()
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            codes = [code for answer in operation.get("responses", {}).values() for code in answer.get("x-codes", [])]
            if "idempotency_key_reused" in codes:
                found.add((method.upper(), path))
    return found


def test_every_route_that_honours_the_key_is_in_the_column(web: Web) -> None:
    openapi = web.anon().get("/openapi.json").json()
    assert _declaring_reuse(openapi) == set(WEB_REPLAYS)
    posts = {route.path.rsplit("/", 1)[-1] for route in runtime_router.routes
             if isinstance(route, APIRoute) and "POST" in route.methods}  # fmt: skip
    assert posts == set(RUNTIME_REPLAYS)


def _replayed(web: Web, replay: Replay) -> None:
    send, settled = replay.prepare(web)
    first = send(replay.first)
    assert first.status_code == replay.accepted, first.text
    wait_until(lambda: settled(first), what="the accepted request's work to settle")
    before = snapshot(web.server.settings.data_dir)
    assert_error(send(replay.other), 422, "idempotency_key_reused")
    assert not (changed := changes(web.server.settings.data_dir, before)), repr(changed)
    again = send(replay.first)
    assert (again.status_code, again.content) == (first.status_code, first.content)
    assert again.headers.get("Idempotent-Replayed") == "true" and "Idempotent-Replayed" not in first.headers
    assert not (changed := changes(web.server.settings.data_dir, before)), repr(changed)


@pytest.mark.parametrize("route", sorted(WEB_REPLAYS), ids=" ".join)
def test_a_web_key_replayed_with_another_body_is_refused_and_changes_nothing(web: Web, route: tuple[str, str]) -> None:
    _replayed(web, WEB_REPLAYS[route])


@pytest.mark.parametrize("op", sorted(RUNTIME_REPLAYS))
def test_a_runtime_key_replayed_with_another_body_is_refused_and_changes_nothing(web: Web, op: str) -> None:
    _replayed(web, RUNTIME_REPLAYS[op])
