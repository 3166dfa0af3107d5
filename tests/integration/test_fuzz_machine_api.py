"""Issue 17, part 2: a hypothesis fuzzer over the runner machine API (runner-protocol.md 4), with a bounded example
count, against a real hub on 127.0.0.1 whose runner is connected.

Every op gets arbitrary bodies (any JSON, valid shapes with fields replaced, raw bytes) under the runner's valid
headers or with headers broken (a missing or garbled token, instance, epoch or protocol). Whatever arrives: no 5xx,
every refusal in the canonical ``{"code", "error"}`` shape with ``Cache-Control: no-store``, no table changes, and
the runner stays connected in the same epoch. The only requests that could legitimately change state are left out:
a poll under valid headers (it would be held, then deliver), and ``goodbye``/``rotate`` with their valid empty
body."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from talaria.clock import SystemClock
from talaria.hub.runners.machine_api import OPS
from talaria.testing.hub_server import HubServer
from tests.integration.route_matrix_support import snapshot
from tests.integration.runner_support import Machine, connected_machine, outcome
from tests.integration.runner_support import send as send_command

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADERS = ("Authorization", "X-Runner-Instance", "X-Runner-Epoch", "X-Runner-Protocol", "Content-Type", "Origin")

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.sampled_from(["id", "result", "error", "connectionId", "frame", "closed", "seq", "grantId", "toolId",
                          "callId", "arguments", "code", "message"])  # fmt: skip


FRAMES = st.fixed_dictionaries({"type": st.sampled_from(["message.delta", "message.complete", "x"]), "payload": JSON})
ARGS = st.dictionaries(st.text(max_size=8), JSON, max_size=3)


def shaped(op: str) -> st.SearchStrategy[Any]:
    """A body of the op's own shape with some fields replaced by arbitrary JSON (the shape checks' edges)."""
    ids = st.uuids().map(str)
    bases: dict[str, st.SearchStrategy[dict[str, Any]]] = {
        "admit": st.fixed_dictionaries({"id": ids}),
        "result": st.fixed_dictionaries({"id": ids, "result": JSON}),
        "event": st.fixed_dictionaries({"connectionId": ids, "frame": FRAMES}),
        "tool": st.fixed_dictionaries(
            {"grantId": ids, "toolId": st.text(max_size=8), "callId": ids, "arguments": ARGS}
        ),
    }
    base = bases.get(op, st.just({}))
    return st.tuples(base, st.dictionaries(FIELDS, JSON, max_size=2)).map(lambda pair: pair[0] | pair[1])


def body_for(op: str) -> st.SearchStrategy[bytes]:
    as_json = st.one_of(JSON, shaped(op)).map(lambda value: json.dumps(value).encode())
    return st.one_of(as_json, st.binary(max_size=200), st.just(b""), st.just(b"{"))


VISIBLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)  # what a header value may carry at its ends
GARBLED = st.one_of(
    st.none(),
    st.text(VISIBLE, min_size=1, max_size=60),
    st.tuples(st.text(VISIBLE, min_size=1, max_size=20), st.text(VISIBLE, min_size=1, max_size=40)).map(" ".join),
    st.sampled_from(["Bearer x", "2", "1.0", str(uuid.uuid4()).upper(), "null", "Bearer " + "A" * 4097]),
)


@pytest.fixture(scope="module")
def connected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubServer, Machine]]:
    data = tmp_path_factory.mktemp("fuzz") / "data"
    server = HubServer(data, SystemClock()).start()
    try:
        machine = connected_machine(server)
        yield server, machine
        machine.close()
    finally:
        server.stop()


def send(machine: Machine, op: str, raw: bytes, faults: dict[str, str | None]) -> httpx.Response:
    headers = machine.headers({"Content-Type": "application/json"})
    for name, value in faults.items():
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    method = OPS[op].method
    return machine.client.request(method, f"/{op}", content=raw if method == "POST" else None, headers=headers)


def refused_canonically(answer: httpx.Response) -> None:
    assert answer.status_code < 500, (answer.status_code, answer.text)
    assert answer.headers.get("cache-control") == "no-store"
    if answer.status_code >= 400:
        body = answer.json()
        assert set(body) == {"code", "error"} and all(isinstance(v, str) and v for v in body.values()), body


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str | None]]:
    op = draw(st.sampled_from(sorted(OPS)))
    raw = draw(body_for(op))
    faults = draw(st.dictionaries(st.sampled_from(HEADERS), GARBLED, max_size=3))
    ignored = ("Content-Type", "Origin", "X-Runner-Epoch") if op == "poll" else ("Content-Type", "Origin")
    breaks = {name for name in faults if name not in ignored}  # a poll carries no epoch (section 4): not a break
    if op == "poll" and not breaks:  # valid headers: a held poll that may deliver; not a refusal to fuzz
        faults["X-Runner-Protocol"] = "0"
    if op in ("goodbye", "rotate") and not breaks and raw.strip() in (b"{}", b""):
        raw = b"{}{}"
    return op, raw, faults


@EXAMPLES
@given(request=requests())
def test_any_request_is_answered_without_a_5xx_canonically_and_changes_nothing(
    connected: tuple[HubServer, Machine], request: tuple[str, bytes, dict[str, str | None]]
) -> None:
    server, machine = connected
    before = snapshot(server.data_dir)
    epoch = machine.epoch
    op, raw, faults = request
    answer = send(machine, op, raw, faults)
    event(f"{op} {answer.status_code}")
    refused_canonically(answer)
    assert snapshot(server.data_dir) == before
    assert server.hub.runners.is_connected(machine.runner_id) and machine.epoch == epoch


def test_after_the_fuzzing_a_command_still_goes_through(connected: tuple[HubServer, Machine]) -> None:
    server, machine = connected
    task = send_command(server, machine.runner_id)
    [command] = machine.poll().json()["commands"]
    assert machine.post("admit", {"id": command["id"]}).status_code == 200
    assert machine.post("result", {"id": command["id"], "result": {"fine": True}}).status_code == 200
    assert outcome(server, task) == {"fine": True}
