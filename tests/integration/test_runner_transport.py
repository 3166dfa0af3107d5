"""The runner machine API over a real hub, driven by raw requests (runner-protocol.md 4-6, 8, 14), against both
``RunnerTransport`` implementations (scale.md 2.6): the in-process one of a SQLite hub and the tables of PostgreSQL.

One test per gate step and code, in the order of section 4. The hub runs on a ManualClock: redelivery, expiry
and the watchdog are driven by advancing it; command deadlines (timers in real time) are shortened in the one test
that waits for them. Commands are queued with ``RunnerHub.send`` on the hub loop (``HubServer.call``).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from talaria.clock import ManualClock
from talaria.errors import TalariaError
from talaria.hub.runners import limits
from talaria.hub.runners.connection_state import AccountRef, Gateway
from talaria.hub.timings import HubTimings
from talaria.testing.hub_server import HubServer
from tests.backends import BackendDatabase
from tests.conftest import PASSWORD, add_account, login
from tests.integration.runner_support import (
    MACHINE,
    OFF_LIST,
    UUID_RE,
    Machine,
    admin_of,
    assert_machine_error,
    assert_machine_ok,
    has_waiter,
    metric_value,
    metrics_text,
    outcome,
    pending_wire,
    raw_post,
    register,
    runner_summary,
    send,
    send_now,
    spawn,
    tick,
    wait_until,
)

MIB = 1024 * 1024
UNKNOWN_RUNNER = "00000000-0000-4000-8000-000000000000"


pytestmark = pytest.mark.usefixtures("fast_argon2")


class Node:
    """A hub with one registered runner (source ``local``) and raw machine clients for it."""

    def __init__(self, server: HubServer, clock: ManualClock) -> None:
        self.server = server
        self.clock = clock
        self.admin = admin_of(server)
        registered = register(self.admin)
        self.id: str = registered["runner"]["id"]
        self.token: str = registered["token"]
        self.machines: list[Machine] = []
        self.pool = ThreadPoolExecutor(max_workers=4)
        self.stopped = False

    def machine(self, instance: str | None = None, token: str | None = None) -> Machine:
        made = Machine(self.server, self.id, token or self.token, instance)
        self.machines.append(made)
        return made

    def twin(self, machine: Machine) -> Machine:
        made = machine.twin()
        self.machines.append(made)
        return made

    def background(self, call: Callable[[], httpx.Response]) -> Future[httpx.Response]:
        return self.pool.submit(call)

    def held_poll(self, machine: Machine) -> Future[httpx.Response]:
        """A poll of ``machine``'s instance on its own connection, returned once the hub holds it."""
        other = self.twin(machine)
        future = self.background(other.poll)
        wait_until(lambda: has_waiter(self.server, self.id) or future.done(), what="a held poll")
        assert not future.done(), future.result().text
        return future

    def summary(self) -> dict[str, Any]:
        return runner_summary(self.admin, self.id)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for machine in self.machines:
            machine.close()
        self.admin.close()


@pytest.fixture
def node(backend_database: BackendDatabase, make_hub: Callable[..., HubServer], clock: ManualClock) -> Iterator[Node]:
    # backend_database first: set up before the hub, so dropped after the hub stopped
    made = Node(make_hub(**backend_database.settings()), clock)
    try:
        yield made
    finally:
        # End any held poll before the pool joins its thread (unless the test stopped the hub).
        if not made.stopped:
            made.server.call(_disconnect(made.server, made.id))
        made.close()


async def _disconnect(server: HubServer, runner_id: str) -> None:
    await server.hub.runners.disconnect(runner_id, "test over")


def connected(node: Node, instance: str | None = None) -> Machine:
    machine = node.machine(instance)
    machine.connect()
    return machine


# --- route and method: no effect on any state -------------------------------------------------------------------


def test_an_unknown_op_is_404_not_found(node: Node) -> None:
    machine = node.machine()
    for op in ("nope", "vm.create", "Poll", "poll/extra", "heartbeat"):
        for method in ("GET", "POST"):
            response = machine.client.request(method, f"/{op}", headers=machine.headers())
            assert_machine_error(response, 404, "not_found", (method, op))
    assert node.summary()["lastSeenAt"] is None, "route matching has no effect on any state"


def test_a_runner_id_that_is_not_a_uuid_is_404_not_found(node: Node) -> None:
    machine = node.machine()
    with httpx.Client(base_url=node.server.url) as client:
        for runner_id in ("not-a-uuid", "00000000-0000-4000-8000-00000000000", node.id.upper()):
            for op in ("poll", "admit"):
                method = "GET" if op == "poll" else "POST"
                response = client.request(method, f"{MACHINE}/{runner_id}/{op}", headers=machine.headers())
                assert_machine_error(response, 404, "not_found", (runner_id, op))
    assert node.summary()["lastSeenAt"] is None


def test_poll_must_be_get_and_every_other_op_post(node: Node) -> None:
    machine = connected(node)
    seen = node.summary()["lastSeenAt"]
    node.clock.advance(1)
    responses = [machine.client.post("/poll", headers=machine.headers(), content=b"{}")]
    responses.append(machine.client.put("/poll", headers=machine.headers()))
    for op in ("admit", "result", "event", "tool", "goodbye"):
        responses.append(machine.client.get(f"/{op}", headers=machine.headers()))
    for response in responses:
        assert_machine_error(response, 405, "method_not_allowed", response.request.url.path)
    summary = node.summary()
    assert summary["lastSeenAt"] == seen, "a 405 has no effect on any state"
    assert summary["online"] is True, "goodbye by GET did not disconnect"


# --- gate 1: Origin, record, bearer -----------------------------------------------------------------------------


def test_an_origin_header_is_403_runner_unauthorized_even_with_the_right_bearer(node: Node) -> None:
    machine = node.machine()
    response = machine.poll(headers={"Origin": node.server.url})
    assert_machine_error(response, 403, "runner_unauthorized")
    assert node.summary()["connectedAt"] is None, "no state was created"
    machine.connect()
    response = machine.post("admit", {"id": "x"}, headers={"Origin": "null"})
    assert_machine_error(response, 403, "runner_unauthorized")


def test_a_browser_session_cookie_alone_is_refused(node: Node) -> None:
    """A signed-in browser (cookie, CSRF token, Origin-less) is no runner: the bearer is the only credential."""
    add_account(node.server, "admin", "admin")
    browser = login(node.server, "admin")
    try:
        machine = node.machine()
        cookie = f"talaria_session={browser.cookies['talaria_session']}"
        extra = {"Authorization": None, "X-CSRF-Token": browser.headers["X-CSRF-Token"], "Cookie": cookie}
        response = machine.client.get("/poll", headers=machine.headers(extra))
        assert_machine_error(response, 403, "runner_unauthorized")
        assert node.summary()["connectedAt"] is None, "no state was created"
    finally:
        browser.close()


def test_a_wrong_or_missing_bearer_is_403_runner_unauthorized(node: Node) -> None:
    machine = node.machine()
    altered = node.token[:-1] + ("A" if node.token[-1] != "A" else "B")  # never the token itself
    wrong = [None, "", "Bearer", "Bearer " + altered, "Basic xyz", node.token, "Bearer " + node.token * 2]
    for value in wrong:
        response = machine.poll(headers={"Authorization": value})
        assert_machine_error(response, 403, "runner_unauthorized", value)
    assert node.summary()["lastSeenAt"] is None


def test_an_unknown_runner_is_403_runner_unauthorized(node: Node) -> None:
    stranger = Machine(node.server, UNKNOWN_RUNNER, node.token)
    node.machines.append(stranger)
    assert_machine_error(stranger.poll(reset=True), 403, "runner_unauthorized")
    assert_machine_error(stranger.post("goodbye", {}), 403, "runner_unauthorized")


def test_another_runners_token_is_403_runner_unauthorized(node: Node) -> None:
    other = register(node.admin, source="lab")
    machine = node.machine(token=other["token"])
    assert_machine_error(machine.poll(), 403, "runner_unauthorized")


def test_a_disabled_runner_is_403_and_its_state_is_disconnected_at_its_next_request(node: Node) -> None:
    machine = connected(node)
    queued = send(node.server, node.id)  # never delivered
    assert node.server.hub.registry.disable(node.id)  # as `talaria admin runners disable` does: no hub call
    assert node.summary()["connectedAt"] is not None, "the hub learns of it at the runner's next request"
    response = machine.post("admit", {"id": "x"})
    assert_machine_error(response, 403, "runner_unauthorized")
    error = outcome(node.server, queued)
    assert isinstance(error, TalariaError)
    assert (error.code, error.status) == ("runner_offline", 503)
    summary = node.summary()
    assert (summary["online"], summary["connectedAt"]) == (False, None)
    assert_machine_error(machine.poll(reset=True), 403, "runner_unauthorized")


def test_gate_1_comes_before_gate_2(node: Node) -> None:
    machine = node.machine(instance="NOT-A-UUID")
    response = machine.poll(headers={"Authorization": "Bearer nope", "X-Runner-Protocol": "2"})
    assert_machine_error(response, 403, "runner_unauthorized")


# --- gate 2: instance and protocol headers ----------------------------------------------------------------------


BAD_IDENTITY: list[dict[str, str | None]] = [
    {"X-Runner-Instance": None},
    {"X-Runner-Instance": "not-a-uuid"},
    {"X-Runner-Instance": str(uuid.uuid4()).upper()},
    {"X-Runner-Instance": "{" + str(uuid.uuid4()) + "}"},
    {"X-Runner-Protocol": None},
    {"X-Runner-Protocol": "2"},
    {"X-Runner-Protocol": "1.0"},
    {"X-Runner-Protocol": "01"},
    {"X-Runner-Protocol": ""},
]


def test_a_bad_instance_header_or_protocol_is_409_runner_protocol_mismatch(node: Node) -> None:
    machine = node.machine()
    for headers in BAD_IDENTITY:
        assert_machine_error(machine.poll(headers=headers), 409, "runner_protocol_mismatch", headers)
        assert_machine_error(machine.post("goodbye", {}, headers=headers), 409, "runner_protocol_mismatch", headers)
    assert node.summary()["connectedAt"] is None
    machine.connect()
    for headers in BAD_IDENTITY:
        response = machine.post("admit", {"id": "x"}, headers=headers)
        assert_machine_error(response, 409, "runner_protocol_mismatch", headers)


# --- the first poll, gates 3-8 ----------------------------------------------------------------------------------


def test_the_poll_that_creates_a_state_answers_at_once_with_a_new_epoch(node: Node) -> None:
    machine = node.machine()
    started = time.monotonic()
    response = machine.poll()
    assert time.monotonic() - started < 2
    body = assert_machine_ok(response)
    assert set(body) == {"epoch", "commands"}
    assert body["commands"] == []
    if node.server.hub.store.dialect == "sqlite":
        hub_epoch, _, random_part = body["epoch"].rpartition(":")
        assert hub_epoch, body["epoch"]
        assert UUID_RE.match(random_part), "<hubEpoch>:<new UUID>"
    else:  # an epoch belongs to its state's row (scale.md 3.2)
        assert UUID_RE.match(body["epoch"]), "a new UUID"
    summary = node.summary()
    assert summary["online"] is True
    assert summary["connectedAt"] == summary["lastSeenAt"] == node.clock.now_ms()


def test_a_non_poll_request_without_a_state_is_409_runner_instance_changed(node: Node) -> None:
    machine = node.machine()
    for op, body in (("admit", {"id": "x"}), ("result", {"id": "x", "result": 1}), ("goodbye", {})):
        response = machine.post(op, body, epoch="anything")
        assert_machine_error(response, 409, "runner_instance_changed", op)
    connected(node)
    stranger = node.machine()  # another instance than the state's
    assert_machine_error(stranger.post("admit", {"id": "x"}, epoch="x"), 409, "runner_instance_changed")


def test_a_wrong_epoch_is_409_runner_epoch_changed(node: Node) -> None:
    machine = connected(node)
    assert machine.epoch is not None
    for epoch in ("wrong", "", None, machine.epoch + "x", machine.epoch.upper()):
        for op, body in (("admit", {"id": "x"}), ("result", {"id": "x", "result": 1}), ("goodbye", {})):
            response = machine.post(op, body, epoch=epoch)
            assert_machine_error(response, 409, "runner_epoch_changed", (op, epoch))
    # Gate 7 comes before gate 9: a malformed body with a wrong epoch is an epoch error.
    assert_machine_error(machine.post("admit", content=b"{", epoch="wrong"), 409, "runner_epoch_changed")
    assert node.summary()["online"] is True, "a refused goodbye disconnects nothing"


def test_a_poll_from_a_second_instance_retires_the_first(node: Node) -> None:
    first = connected(node)
    old_epoch = first.epoch
    queued = send(node.server, node.id)
    second = node.machine()
    body = assert_machine_ok(second.poll())
    assert body == {"epoch": second.epoch, "commands": []}, "a new state: answered at once"
    assert second.epoch != old_epoch
    error = outcome(node.server, queued)
    assert isinstance(error, TalariaError)
    assert error.code == "runner_offline", "the replaced state's commands fail (never delivered)"
    assert_machine_error(first.poll(), 409, "runner_instance_retired")
    assert_machine_error(first.poll(reset=True), 409, "runner_instance_retired")
    # A non-poll request of the retired instance meets gate 4 first.
    assert_machine_error(first.post("admit", {"id": "x"}), 409, "runner_instance_changed")
    assert assert_machine_ok(second.post("admit", {"id": "x"})) == {"allowed": False}


def test_a_waiting_poll_of_a_replaced_instance_answers_409_runner_instance_changed(node: Node) -> None:
    first = connected(node)
    held = node.held_poll(first)
    node.machine().connect()
    assert_machine_error(held.result(10), 409, "runner_instance_changed")


def test_a_reset_poll_makes_a_new_epoch_and_refuses_the_old_one(node: Node) -> None:
    machine = connected(node)
    old_epoch = machine.epoch
    delivered = send(node.server, node.id)
    assert len(assert_machine_ok(machine.poll())["commands"]) == 1
    started = time.monotonic()
    body = assert_machine_ok(machine.poll(reset=True))
    assert time.monotonic() - started < 2, "the reset poll creates a state: answered at once"
    assert body["commands"] == []
    assert machine.epoch != old_epoch
    error = outcome(node.server, delivered)
    assert isinstance(error, TalariaError)
    assert (error.code, error.status) == ("runner_command_uncertain", 504)
    response = machine.post("result", {"id": "x", "result": 1}, epoch=old_epoch)
    assert_machine_error(response, 409, "runner_epoch_changed")
    assert assert_machine_ok(machine.post("result", {"id": "x", "result": 1})) == {"ok": True}


def test_goodbye_disconnects_and_the_instance_is_not_retired(node: Node) -> None:
    machine = connected(node)
    old_epoch = machine.epoch
    queued = send(node.server, node.id)
    assert assert_machine_ok(machine.post("goodbye", {})) == {"ok": True}
    summary = node.summary()
    assert (summary["online"], summary["connectedAt"], summary["features"]) == (False, None, [])
    error = outcome(node.server, queued)
    assert isinstance(error, TalariaError)
    assert error.code == "runner_offline"
    assert_machine_error(machine.post("admit", {"id": "x"}), 409, "runner_instance_changed")
    body = assert_machine_ok(machine.poll())
    assert body["commands"] == []
    assert body["epoch"] != old_epoch
    # A restart after a goodbye (a new instance finds no state) retires nobody: the old instance may come back.
    assert_machine_ok(machine.post("goodbye", {}))
    restarted = node.machine()
    restarted.connect()
    assert_machine_ok(restarted.post("goodbye", {}))
    assert assert_machine_ok(machine.poll())["commands"] == []


def test_after_256_retired_instances_a_further_replacement_is_409_runner_instance_limit(node: Node) -> None:
    current = connected(node)
    first_instance = current.instance
    for _ in range(limits.MAX_RETIRED_INSTANCES):
        current.instance = str(uuid.uuid4())  # a new process each time (one connection: quicker)
        assert_machine_ok(current.poll())
    one_more = node.machine()
    assert_machine_error(one_more.poll(), 409, "runner_instance_limit")
    assert_machine_error(one_more.poll(reset=True), 409, "runner_instance_limit")
    survivor = node.twin(current)
    assert assert_machine_ok(survivor.post("admit", {"id": "x"})) == {"allowed": False}, "the state was kept"
    # A graceful stop (goodbye) is not a replacement: the survivor may come back; a new instance may start.
    assert_machine_ok(survivor.post("goodbye", {}))
    assert_machine_ok(one_more.poll())
    retired = node.machine(instance=first_instance)
    assert_machine_error(retired.poll(), 409, "runner_instance_retired")


def test_features_are_filtered_and_replaced_by_every_header_even_an_empty_one(node: Node) -> None:
    machine = node.machine()
    assert_machine_ok(machine.poll(features="export-v1 , vm-v1,team-tools-v1,"))
    assert sorted(node.summary()["features"]) == ["export-v1", "team-tools-v1"]
    held = node.held_poll(machine)  # no header on this one: the list stays
    assert sorted(node.summary()["features"]) == ["export-v1", "team-tools-v1"]
    other = node.twin(machine)
    second = node.background(lambda: other.poll(features=""))
    assert assert_machine_ok(held.result(10))["commands"] == []
    wait_until(lambda: node.summary()["features"] == [], what="the empty header to clear the list")
    assert not second.done()


def test_the_runner_version_comes_from_the_user_agent_of_a_poll_with_features(node: Node) -> None:
    machine = node.machine()
    assert node.summary()["runnerVersion"] is None, "not connected"
    agent = {"User-Agent": "talaria-runner/0.1.0+0123456789ab.dirty"}
    assert_machine_ok(machine.poll(features="export-v1", headers=agent))
    assert node.summary()["runnerVersion"] == "0.1.0+0123456789ab.dirty"
    held = node.held_poll(machine)  # without the features header the version stays, whatever the agent says
    assert node.summary()["runnerVersion"] == "0.1.0+0123456789ab.dirty"
    other = node.twin(machine)
    second = node.background(lambda: other.poll(features="", headers={"User-Agent": "curl/8.0 talaria-runner/2"}))
    assert assert_machine_ok(held.result(10))["commands"] == []
    wait_until(lambda: node.summary()["runnerVersion"] is None, what="a foreign agent to clear the version")
    assert not second.done()


def test_every_poll_answer_echoes_the_offered_features_this_hub_accepts(node: Node) -> None:
    """X-Hub-Features (scale.md 3.5): what this poll offered and the hub implements, sorted; empty without an offer."""
    machine = node.machine()
    first = machine.poll(features="failover-v1, vm-v1,team-tools-v1,")
    assert_machine_ok(first)
    assert first.headers["x-hub-features"] == "failover-v1,team-tools-v1"
    again = machine.poll(features="export-v1")
    assert again.headers["x-hub-features"] == "export-v1", "each answer echoes its own poll's offer"
    bare = machine.poll()
    assert bare.headers["x-hub-features"] == ""
    refused = machine.poll(headers={"Authorization": "Bearer no"}, features="failover-v1")
    assert_machine_error(refused, 403, "runner_unauthorized")
    assert "x-hub-features" not in refused.headers, "only a poll's answer echoes"
    assert "x-hub-features" not in machine.post("admit", {"id": "x"}).headers


def open_gateway(node: Node, machine: Machine) -> Gateway:
    """A hub-side gateway of ``machine``'s state, opened by answering its ``gateway.open`` as a runner would."""
    root = node.server.hub.accounts.get("root")
    assert root is not None
    account = AccountRef(root.username, root.tenant, root.auth_version)
    task = spawn(node.server, node.server.hub.channels.open_gateway(node.id, account))
    [command] = assert_machine_ok(machine.poll())["commands"]
    assert command["kind"] == "gateway.open"
    assert assert_machine_ok(machine.post("admit", {"id": command["id"]})) == {"allowed": True}
    assert_machine_ok(machine.post("result", {"id": command["id"], "result": {"ok": True}}))
    gateway = outcome(node.server, task)
    assert isinstance(gateway, Gateway), gateway
    return gateway


def queued_frames(node: Node, gateway: Gateway) -> list[Any]:
    async def read() -> list[Any]:
        frames = []
        while not gateway.events.empty():
            frames.append(gateway.events.get_nowait())
        return frames

    frames: list[Any] = node.server.call(read())
    return frames


def test_numbered_events_are_stored_once_in_order_and_a_gap_is_409_runner_event_gap(node: Node) -> None:
    machine = connected(node)
    gateway = open_gateway(node, machine)

    def event(seq: int, n: int) -> dict[str, Any]:
        return {"connectionId": gateway.id, "seq": seq, "frame": {"type": "message.delta", "payload": {"n": n}}}

    assert assert_machine_ok(machine.post("event", event(1, 1))) == {"ok": True}
    assert assert_machine_ok(machine.post("event", event(1, 1))) == {"ok": True}, "a retry: 200, no effect"
    assert_machine_ok(machine.post("event", event(2, 2)))
    refused = machine.post("event", event(4, 4))
    assert_machine_error(refused, 409, "runner_event_gap")
    assert "3" in refused.json()["error"]
    assert_machine_ok(machine.post("event", event(3, 3)))
    assert_machine_ok(machine.post("event", event(2, 99)))  # stored already, whatever it says now
    assert [f["payload"]["n"] for f in queued_frames(node, gateway)] == [1, 2, 3]
    assert gateway.open, "a gap closes nothing at the hub; the runner closes the connection"
    assert_machine_ok(machine.post("event", {"connectionId": gateway.id, "seq": 4, "closed": True}))
    assert not gateway.open
    again = machine.post("event", {"connectionId": gateway.id, "seq": 4, "closed": True})
    assert_machine_error(again, 410, "runner_connection_closed")


def test_an_event_seq_must_be_a_positive_integer_within_json_s_safe_range(node: Node) -> None:
    machine = connected(node)
    gateway = open_gateway(node, machine)
    frame = {"type": "t"}
    for seq in (0, -1, 1.0, "1", True, None, 2**53):
        body = {"connectionId": gateway.id, "seq": seq, "frame": frame}
        assert_machine_error(machine.post("event", body), 400, "invalid_json", seq)
    assert queued_frames(node, gateway) == []
    largest = {"connectionId": gateway.id, "seq": 2**53 - 1, "frame": frame}
    assert_machine_error(machine.post("event", largest), 409, "runner_event_gap")  # a valid number, out of order
    assert_machine_ok(machine.post("event", {"connectionId": gateway.id, "seq": 1, "frame": frame}))
    assert queued_frames(node, gateway) == [frame]


def test_last_seen_moves_only_for_requests_that_pass_gate_8(node: Node) -> None:
    machine = connected(node)
    first = node.summary()["lastSeenAt"]
    node.clock.advance(2)
    assert_machine_error(machine.post("admit", {"id": "x"}, epoch="wrong"), 409, "runner_epoch_changed")
    assert_machine_error(machine.poll(headers={"Authorization": "Bearer no"}), 403, "runner_unauthorized")
    assert node.summary()["lastSeenAt"] == first
    assert_machine_error(machine.post("admit", {"nope": 1}), 400, "invalid_json")  # passed gate 8, refused at 9
    assert node.summary()["lastSeenAt"] == first + 2000


# --- gate 9: body size and shape ----------------------------------------------------------------------------------


def test_a_body_over_16_mib_is_413_runner_payload_limit(node: Node) -> None:
    machine = connected(node)
    headers = machine.headers()
    status, body = raw_post(node.server.url, f"{MACHINE}/{node.id}/result", headers, 16 * MIB + 1)
    assert status == 413, body
    assert json.loads(body)["code"] == "runner_payload_limit", body
    assert set(json.loads(body)) == {"code", "error"}


def test_a_body_of_exactly_16_mib_is_accepted(node: Node) -> None:
    machine = connected(node)
    shell = json.dumps({"id": "unknown-id", "result": ""}).encode()
    padding = 16 * MIB - len(shell)
    content = json.dumps({"id": "unknown-id", "result": "x" * padding}).encode()
    assert len(content) == 16 * MIB
    assert assert_machine_ok(machine.post("result", content=content)) == {"ok": True}


def test_gate_1_refuses_an_oversized_body_of_a_wrong_bearer_as_unauthorized(node: Node) -> None:
    machine = connected(node)
    headers = machine.headers({"Authorization": "Bearer wrong"})
    status, body = raw_post(node.server.url, f"{MACHINE}/{node.id}/result", headers, 16 * MIB + 1)
    assert (status, json.loads(body)["code"]) == (403, "runner_unauthorized"), body


MALFORMED: dict[str, list[Any]] = {
    "admit": [{}, {"id": 5}, {"id": "x", "extra": 1}, {"id": None}, [], None, "x"],
    "result": [
        {"id": "x"},
        {"result": 1},
        {"id": "x", "result": 1, "error": {"message": "m", "code": "c"}},
        {"id": "x", "error": {"message": "m"}},
        {"id": "x", "error": {"code": "c"}},
        {"id": "x", "error": {"message": 1, "code": "c"}},
        {"id": "x", "error": {"message": "m", "code": "c", "more": 1}},
        {"id": "x", "error": "boom"},
        {"id": 1, "result": 1},
        [],
    ],
    "event": [
        {"connectionId": "c"},
        {"connectionId": "c", "frame": "text"},
        {"connectionId": "c", "frame": {"payload": {}}},
        {"connectionId": "c", "frame": {"type": "t", "extra": 1}},
        {"connectionId": "c", "frame": {"type": "t"}, "closed": True},
        {"connectionId": "c", "closed": False},
        {"connectionId": 5, "closed": True},
        {"closed": True},
    ],
    "tool": [
        {"grantId": str(uuid.uuid4()), "toolId": "t", "callId": "c"},
        {"grantId": str(uuid.uuid4()), "toolId": "t", "callId": "c", "arguments": []},
        {"grantId": str(uuid.uuid4()), "toolId": 1, "callId": "c", "arguments": {}},
        {"grantId": str(uuid.uuid4()), "toolId": "t", "callId": "c", "arguments": {}, "extra": 1},
    ],
    "goodbye": [{"x": 1}, [], None, "bye"],
}


def test_malformed_bodies_of_each_op_are_400_invalid_json(node: Node) -> None:
    machine = connected(node)
    for op, bodies in MALFORMED.items():
        for body in bodies:
            response = machine.post(op, content=json.dumps(body).encode())
            assert_machine_error(response, 400, "invalid_json", (op, body))
        for content in (b"", b"{", b"not json", b'{"id": "x",}', b"\xff\xfe"):
            assert_machine_error(machine.post(op, content=content), 400, "invalid_json", (op, content))
    assert node.summary()["online"] is True


def test_an_event_for_an_unknown_connection_is_410_runner_connection_closed(node: Node) -> None:
    machine = connected(node)
    for body in (
        {"connectionId": str(uuid.uuid4()), "frame": {"type": "event", "session_id": "s", "payload": {}}},
        {"connectionId": str(uuid.uuid4()), "closed": True},
    ):
        assert_machine_error(machine.post("event", body), 410, "runner_connection_closed", body)


def test_a_tool_call_for_an_unknown_grant_is_410_runner_grant_expired(node: Node) -> None:
    machine = connected(node)
    body = {"grantId": str(uuid.uuid4()), "toolId": "t", "callId": "c1", "arguments": {"q": 1}}
    assert_machine_error(machine.post("tool", body), 410, "runner_grant_expired")


def test_every_machine_answer_carries_no_store(node: Node) -> None:
    machine = connected(node)
    answers = [
        machine.poll(reset=True),
        machine.post("admit", {"id": "x"}),
        machine.post("result", {"id": "x", "result": None}),
        machine.post("event", {"connectionId": "c", "closed": True}),
        machine.post("admit", {}),
        machine.client.get("/nope"),
        machine.client.post("/poll"),
        machine.post("goodbye", {}),
    ]
    for response in answers:
        assert response.headers.get("cache-control") == "no-store", (response.request.url.path, response.status_code)
        if response.status_code != 200:
            assert set(response.json()) == {"code", "error"}


# --- long poll and delivery (6.2) ----------------------------------------------------------------------------


def test_a_second_poll_ends_the_waiting_one_with_an_empty_batch(node: Node) -> None:
    machine = connected(node)
    held = node.held_poll(machine)
    other = node.twin(machine)
    second = node.background(other.poll)
    first = held.result(5)
    assert assert_machine_ok(first) == {"epoch": machine.epoch, "commands": []}
    wait_until(lambda: has_waiter(node.server, node.id), what="the second poll to wait")
    assert not second.done()
    assert_machine_ok(machine.post("goodbye", {}))
    assert_machine_error(second.result(5), 409, "runner_instance_changed")


def test_a_waiting_poll_ended_by_an_admin_disable_is_403(node: Node) -> None:
    machine = connected(node)
    held = node.held_poll(machine)
    assert node.admin.delete(f"/api/admin/runners/{node.id}").json() == {"ok": True}
    assert_machine_error(held.result(5), 403, "runner_unauthorized")
    assert node.summary()["connectedAt"] is None


def test_an_admin_disable_disconnects_at_once_and_fails_pending_commands(node: Node) -> None:
    machine = connected(node)
    delivered = send(node.server, node.id)
    assert len(assert_machine_ok(machine.poll())["commands"]) == 1
    undelivered = send(node.server, node.id)
    assert node.admin.delete(f"/api/admin/runners/{node.id}").json() == {"ok": True}
    codes = [(e.code, e.status) for e in (outcome(node.server, delivered), outcome(node.server, undelivered))]
    assert codes == [("runner_command_uncertain", 504), ("runner_offline", 503)]
    assert node.summary()["connectedAt"] is None
    assert_machine_error(machine.post("result", {"id": "x", "result": 1}), 403, "runner_unauthorized")


def test_a_waiting_poll_ended_by_hub_shutdown_answers_503_hub_shutting_down_at_once(node: Node) -> None:
    machine = connected(node)
    delivered = send(node.server, node.id)
    assert len(assert_machine_ok(machine.poll())["commands"]) == 1
    held = node.held_poll(machine)
    started = time.monotonic()
    node.stopped = True
    node.server.stop()
    assert_machine_error(held.result(5), 503, "hub_shutting_down")
    assert time.monotonic() - started < 5, "shutdown did not wait out the 15 s hold"
    assert delivered.done()
    error = delivered.exception()
    assert isinstance(error, TalariaError)
    assert error.code == "runner_command_uncertain"


def test_a_held_poll_is_answered_at_once_by_an_enqueued_command(node: Node) -> None:
    machine = connected(node)
    held = node.held_poll(machine)
    started = time.monotonic()
    root = node.server.hub.accounts.get("root")
    assert root is not None
    account = AccountRef(root.username, root.tenant, root.auth_version)
    task = spawn(node.server, node.server.hub.channels.http(node.id, account, "/api/status"))
    body = assert_machine_ok(held.result(5))
    assert time.monotonic() - started < 2
    assert body["epoch"] == machine.epoch
    [command] = body["commands"]
    assert set(command) == {"id", "kind", "payload", "expiresAt"}
    assert UUID_RE.match(command["id"])
    assert command["kind"] == "http"
    assert command["payload"] == {"path": "/api/status", "method": "GET", "search": ""}
    assert command["expiresAt"] == node.clock.now_ms() + 30_000
    assert assert_machine_ok(machine.post("admit", {"id": command["id"]})) == {"allowed": True}
    reply = {"status": 200, "headers": {"content-type": "application/json"}, "body": "e30="}
    assert assert_machine_ok(machine.post("result", {"id": command["id"], "result": reply})) == {"ok": True}
    assert outcome(node.server, task) == reply
    assert assert_machine_ok(machine.post("admit", {"id": command["id"]})) == {"allowed": False}
    again = machine.post("result", {"id": command["id"], "error": {"message": "late", "code": "x"}})
    assert assert_machine_ok(again) == {"ok": True}, "an already completed id changes nothing"


def test_a_pending_command_is_answered_by_the_next_poll_in_enqueue_order(node: Node) -> None:
    machine = connected(node)
    tasks = [send(node.server, node.id, dict(OFF_LIST, search=f"?n={i}")) for i in range(3)]
    started = time.monotonic()
    commands = assert_machine_ok(machine.poll())["commands"]
    assert time.monotonic() - started < 2
    assert [c["payload"]["search"] for c in commands] == ["?n=0", "?n=1", "?n=2"]
    for command in commands:
        machine.post("result", {"id": command["id"], "result": command["payload"]["search"]})
    assert [outcome(node.server, t) for t in tasks] == ["?n=0", "?n=1", "?n=2"]


def test_a_delivered_command_is_delivered_again_after_5_s_without_a_result(node: Node) -> None:
    machine = connected(node)
    task = send(node.server, node.id)
    [command] = assert_machine_ok(machine.poll())["commands"]
    node.clock.advance(4.999)
    assert assert_machine_ok(machine.poll())["commands"] == [], "not before 5 s"
    node.clock.advance(0.001)
    started = time.monotonic()
    [again] = assert_machine_ok(machine.poll())["commands"]
    assert time.monotonic() - started < 2
    assert again == command, "the same id, payload and expiresAt"
    node.clock.advance(4.9)
    assert assert_machine_ok(machine.poll())["commands"] == [], "the redelivery restarted the 5 s"
    node.clock.advance(0.1)
    assert assert_machine_ok(machine.poll())["commands"] == [command]
    assert_machine_ok(machine.post("result", {"id": command["id"], "result": "done"}))
    assert outcome(node.server, task) == "done"


def test_result_for_an_unknown_id_is_200_ok(node: Node) -> None:
    machine = connected(node)
    for body in (
        {"id": str(uuid.uuid4()), "result": {"anything": True}},
        {"id": "not-even-a-uuid", "error": {"message": "m", "code": "hermes_unavailable"}},
    ):
        assert assert_machine_ok(machine.post("result", body)) == {"ok": True}


def test_a_result_error_reaches_the_hub_operation_with_the_runners_code(node: Node) -> None:
    machine = connected(node)
    relayed = send(node.server, node.id)
    own_status = send(node.server, node.id)
    commands = assert_machine_ok(machine.poll())["commands"]
    error = {"message": "m" * 5000, "code": "hermes_unavailable"}
    assert_machine_ok(machine.post("result", {"id": commands[0]["id"], "error": error}))
    forbidden = {"message": "no", "code": "runner_profile_forbidden"}
    assert_machine_ok(machine.post("result", {"id": commands[1]["id"], "error": forbidden}))
    first = outcome(node.server, relayed)
    assert isinstance(first, TalariaError)
    assert (first.code, first.status, first.message) == ("hermes_unavailable", 502, "m" * 1000)
    second = outcome(node.server, own_status)
    assert isinstance(second, TalariaError)
    assert (second.code, second.status) == ("runner_profile_forbidden", 403)


def test_admit_refuses_an_expired_or_unknown_command(node: Node) -> None:
    machine = connected(node)
    send(node.server, node.id)
    [command] = assert_machine_ok(machine.poll())["commands"]
    assert assert_machine_ok(machine.post("admit", {"id": str(uuid.uuid4())})) == {"allowed": False}
    node.clock.advance(29.999)
    assert assert_machine_ok(machine.post("admit", {"id": command["id"]})) == {"allowed": True}
    node.clock.advance(0.001)
    assert assert_machine_ok(machine.post("admit", {"id": command["id"]})) == {"allowed": False}


def test_admit_rechecks_the_validity_of_the_account_that_caused_the_command(node: Node) -> None:
    """Section 8: enabled account, unchanged auth_version, profile in the account's and the runner's lists."""
    profiles = {"local": ["default", "research"]}
    body = {"username": "uma", "password": PASSWORD, "role": "user", "allowedProfiles": profiles}
    assert node.admin.post("/api/admin/accounts", json=body).status_code == 201
    uma = node.server.hub.accounts.get("uma")
    assert uma is not None
    account = AccountRef(uma.username, uma.tenant, uma.auth_version)
    channels = node.server.hub.channels
    machine = connected(node)
    research = channels.http(node.id, account, "/api/config", search="?profile=research", profile="research")
    not_admitted = outcome(node.server, spawn(node.server, research))
    assert isinstance(not_admitted, TalariaError)
    assert (not_admitted.code, not_admitted.status) == ("runner_command_not_admitted", 403), "not in the runner's list"
    task = spawn(
        node.server, channels.http(node.id, account, "/api/config", search="?profile=default", profile="default")
    )
    [command] = assert_machine_ok(machine.poll())["commands"]
    assert assert_machine_ok(machine.post("admit", {"id": command["id"]})) == {"allowed": True}
    response = node.admin.patch("/api/admin/accounts/uma", json={"canManageTeam": True})
    assert response.status_code == 200, response.text
    assert assert_machine_ok(machine.post("admit", {"id": command["id"]})) == {"allowed": False}, "auth_version"
    assert_machine_ok(machine.post("result", {"id": command["id"], "error": {"message": "no", "code": "x_y"}}))
    refused = outcome(node.server, task)
    assert isinstance(refused, TalariaError)
    assert (refused.code, refused.status) == ("x_y", 502), "any other runner code is relayed as 502"


# --- outcomes of hub operations (6.1) ---------------------------------------------------------------------------


def test_a_command_fails_at_its_deadline_offline_if_never_delivered_uncertain_if_delivered(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 30 s deadline runs on a real-time timer; this test shortens it to 1 s (expiresAt follows)."""
    monkeypatch.setattr(node.server.hub.runners, "timings", HubTimings(command_deadline_s=1))
    machine = connected(node)
    delivered = send(node.server, node.id)
    [command] = assert_machine_ok(machine.poll())["commands"]
    assert command["expiresAt"] == node.clock.now_ms() + 1000
    undelivered = send(node.server, node.id)
    late = outcome(node.server, delivered, timeout=5)
    never = outcome(node.server, undelivered, timeout=5)
    assert isinstance(late, TalariaError)
    assert (late.code, late.status) == ("runner_command_uncertain", 504)
    assert isinstance(never, TalariaError)
    assert (never.code, never.status) == ("runner_offline", 503)
    assert assert_machine_ok(machine.post("result", {"id": command["id"], "result": 1})) == {"ok": True}
    assert pending_wire(node.server, node.id) == []


def test_a_disconnect_fails_pending_commands_by_whether_they_were_delivered(node: Node) -> None:
    machine = connected(node)
    delivered = send(node.server, node.id)
    assert len(assert_machine_ok(machine.poll())["commands"]) == 1
    undelivered = send(node.server, node.id)
    assert_machine_ok(machine.post("goodbye", {}))
    codes = [(e.code, e.status) for e in (outcome(node.server, delivered), outcome(node.server, undelivered))]
    assert codes == [("runner_command_uncertain", 504), ("runner_offline", 503)]


def test_enqueue_refusals_come_in_order(node: Node) -> None:
    refused = send_now(node.server, node.id)
    assert isinstance(refused, TalariaError)
    assert (refused.code, refused.status) == ("runner_offline", 503)
    node.server.hub.registry.disable(node.id)
    refused = send_now(node.server, node.id)
    assert isinstance(refused, TalariaError)
    assert (refused.code, refused.status) == ("runner_command_not_admitted", 403), "validity before offline"


def test_the_64th_pending_command_is_accepted_and_the_65th_is_429_runner_busy(node: Node) -> None:
    machine = connected(node)
    tasks = [send(node.server, node.id, dict(OFF_LIST, search=f"?n={i}")) for i in range(64)]
    assert all(not isinstance(t, TalariaError) for t in tasks)
    assert len(pending_wire(node.server, node.id)) == 64
    refused = send_now(node.server, node.id)
    assert isinstance(refused, TalariaError)
    assert (refused.code, refused.status) == ("runner_busy", 429)
    commands = assert_machine_ok(machine.poll())["commands"]
    assert [c["payload"]["search"] for c in commands] == [f"?n={i}" for i in range(64)]
    assert_machine_ok(machine.post("result", {"id": commands[0]["id"], "result": "first"}))
    assert outcome(node.server, tasks[0]) == "first"
    extra = send_now(node.server, node.id)
    assert not isinstance(extra, TalariaError), "63 pending: room again"
    assert_machine_ok(machine.post("goodbye", {}))
    codes = {outcome(node.server, t).code for t in tasks[1:]}
    assert codes == {"runner_command_uncertain"}
    assert outcome(node.server, extra).code == "runner_offline"


def test_command_size_and_pending_bytes_limits(node: Node) -> None:
    connected(node)
    big = send_now(node.server, node.id, dict(OFF_LIST, search="?" + "x" * (36 * MIB)))
    assert isinstance(big, TalariaError)
    assert (big.code, big.status) == ("runner_payload_limit", 413)
    first = send_now(node.server, node.id, dict(OFF_LIST, search="?" + "a" * (33 * MIB)))
    assert not isinstance(first, TalariaError), "a 33 MiB command fits"
    second = send_now(node.server, node.id, dict(OFF_LIST, search="?" + "b" * (33 * MIB)))
    assert isinstance(second, TalariaError)
    assert (second.code, second.status) == ("runner_busy", 429), "64 MiB pending in total"
    small = send_now(node.server, node.id)
    assert not isinstance(small, TalariaError)


# --- liveness (6.3) --------------------------------------------------------------------------------------------


def test_the_watchdog_disconnects_a_state_unseen_for_more_than_35_s(node: Node) -> None:
    machine = connected(node)
    task = send(node.server, node.id)
    assert len(assert_machine_ok(machine.poll())["commands"]) == 1
    node.clock.advance(35)
    tick(node.server)
    summary = node.summary()
    assert (summary["online"], summary["connectedAt"] is not None) == (True, True), "35 s is not more than 35 s"
    node.clock.advance(0.001)
    assert node.summary()["online"] is False, "online means seen within the last 35 s"
    tick(node.server)
    summary = node.summary()
    assert (summary["online"], summary["connectedAt"]) == (False, None)
    error = outcome(node.server, task)
    assert isinstance(error, TalariaError)
    assert error.code == "runner_command_uncertain"
    assert_machine_error(machine.post("admit", {"id": "x"}), 409, "runner_instance_changed")
    old_epoch = machine.epoch
    started = time.monotonic()
    assert assert_machine_ok(machine.poll())["commands"] == []
    assert time.monotonic() - started < 2, "a new state: answered at once"
    assert machine.epoch != old_epoch


def test_a_request_keeps_the_state_alive(node: Node) -> None:
    machine = connected(node)
    node.clock.advance(30)
    assert_machine_ok(machine.post("admit", {"id": "x"}))
    node.clock.advance(30)
    tick(node.server)
    assert node.summary()["online"] is True


# --- metrics -------------------------------------------------------------------------------------------------


def test_metrics_expose_runner_gauges_counters_and_round_trips(node: Node) -> None:
    text = metrics_text(node.server)
    assert metric_value(text, "talaria_runners_online") == 0
    assert metric_value(text, "talaria_runner_commands_pending") == 0
    machine = connected(node)
    task = send(node.server, node.id)
    text = metrics_text(node.server)
    assert metric_value(text, "talaria_runners_online") == 1
    assert metric_value(text, "talaria_runner_commands_pending") == 1
    [command] = assert_machine_ok(machine.poll())["commands"]
    assert_machine_ok(machine.post("result", {"id": command["id"], "result": "ok"}))
    assert outcome(node.server, task) == "ok"
    lost = send(node.server, node.id)
    assert_machine_ok(machine.post("goodbye", {}))
    assert isinstance(outcome(node.server, lost), TalariaError)
    text = metrics_text(node.server)
    assert metric_value(text, "talaria_runners_online") == 0
    assert metric_value(text, "talaria_runner_commands_pending") == 0
    assert metric_value(text, "talaria_runner_command_seconds_count") == 1
    assert metric_value(text, 'talaria_runner_commands_total{outcome="ok"}') == 1
    assert metric_value(text, 'talaria_runner_commands_total{outcome="runner_offline"}') == 1


# --- drain (operations.md 3.1, 3.2) ----------------------------------------------------------------------------------


def drain_api(node: Node, runner_id: str | None = None) -> httpx.Response:
    return node.admin.post(f"/api/admin/runners/{runner_id or node.id}/drain")


def test_an_admin_drain_ends_the_held_poll_with_drain_and_refuses_new_work_but_not_recovery(node: Node) -> None:
    machine = node.machine()
    assert_machine_ok(machine.poll(features="drain-v1"))
    before = node.summary()
    assert (before["draining"], before["drainingSince"]) == (False, None)
    held = node.held_poll(machine)
    answer = drain_api(node)
    assert (answer.status_code, answer.json()) == (200, {"ok": True})
    polled = assert_machine_ok(held.result(10))
    assert (polled["commands"], polled["drain"]) == ([], True), "the held poll ends at once, saying so"
    since = node.clock.now_ms()
    assert (node.summary()["draining"], node.summary()["drainingSince"]) == (True, since)
    node.clock.advance(5)
    assert drain_api(node).json() == {"ok": True}, "repeated"
    assert node.summary()["drainingSince"] == since, "a repeat changes nothing"

    account = AccountRef("root", "default", 1)
    channels = node.server.hub.channels
    with pytest.raises(TalariaError) as refused:
        node.server.call(channels.open_gateway(node.id, account))
    assert (refused.value.code, refused.value.status) == ("runner_draining", 503)
    with pytest.raises(TalariaError) as no_grant:
        node.server.call(channels.create_grant(node.id, account, profile="default", work_id="w", session={},
                                               catalog=[], executor=None, turn_active=None))  # type: ignore[arg-type]  # fmt: skip
    assert no_grant.value.code == "runner_draining"
    assert pending_wire(node.server, node.id) == [], "nothing was sent"

    recovering = spawn(node.server, channels.open_gateway(node.id, account, recovery=True))
    cleanup = spawn(node.server, channels.open_gateway(node.id, account, cleanup_only=True))
    wait_until(lambda: len(pending_wire(node.server, node.id)) == 2, what="both opens queued")
    payloads = [wire["payload"] for wire in pending_wire(node.server, node.id)]
    assert all(set(p) <= {"connectionId", "cleanupOnly", "recovery"} for p in payloads)
    assert sorted((p["cleanupOnly"], p.get("recovery", False)) for p in payloads) == [(False, True), (True, False)]
    for task in (recovering, cleanup):
        node.server.call(_cancel(task))


async def _cancel(task: Any) -> None:
    task.cancel()


def test_recovery_is_said_only_to_a_runner_offering_drain_v1(node: Node) -> None:
    machine = node.machine()
    assert_machine_ok(machine.poll(features="team-tools-v1"))
    held = node.held_poll(machine)
    assert drain_api(node).status_code == 200
    assert "drain" not in assert_machine_ok(held.result(10)), "no drain-v1 offered: nothing said"
    assert node.summary()["draining"] is True
    task = spawn(node.server, node.server.hub.channels.open_gateway(node.id, AccountRef("root", "default", 1),
                                                                     recovery=True))  # fmt: skip
    wait_until(lambda: len(pending_wire(node.server, node.id)) == 1, what="the recovery open queued while draining")
    assert set(pending_wire(node.server, node.id)[0]["payload"]) == {"connectionId", "cleanupOnly"}
    node.server.call(_cancel(task))


def test_a_runner_saying_it_drains_marks_its_state_and_a_new_state_is_not_draining(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "POLL_HOLD_S", 1)  # a draining runner's polls are held as any other's
    machine = node.machine()
    assert_machine_ok(machine.poll(features="drain-v1"))
    answer = assert_machine_ok(machine.poll(headers={"X-Runner-Draining": "1"}))
    assert answer["drain"] is True
    assert node.summary()["draining"] is True
    assert assert_machine_ok(machine.poll())["drain"] is True, "every poll answer of the state says it"
    assert node.server.hub.runners.accepts_work(node.id) is False
    # the runner restarted: a new instance's state takes work again (there is no undrain)
    restarted = node.machine()
    assert_machine_ok(restarted.poll(features="drain-v1"))
    assert_machine_ok(restarted.poll(features="drain-v1"))
    assert (node.summary()["draining"], node.summary()["drainingSince"]) == (False, None)
    assert "drain" not in assert_machine_ok(restarted.poll(features="drain-v1"))


def test_draining_an_offline_or_unknown_runner(node: Node) -> None:
    offline = drain_api(node)
    assert offline.status_code == 503 and offline.json()["code"] == "runner_offline", offline.text
    unknown = drain_api(node, UNKNOWN_RUNNER)
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found", unknown.text
    other = admin_of(node.server, "eve", tenant="other")
    try:
        assert_machine_ok(node.machine().poll(features="drain-v1"))
        response = other.post(f"/api/admin/runners/{node.id}/drain")
        assert response.status_code == 404 and response.json()["code"] == "not_found", "another tenant's runner"
        assert node.summary()["draining"] is False
    finally:
        other.close()


def test_the_command_line_drains_the_runner_at_its_next_request(
    node: Node, backend_database: BackendDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    if not backend_database.url:  # SQLite: the request waits for the runner's next request
        monkeypatch.setattr(limits, "POLL_HOLD_S", 2)
    machine = node.machine()
    assert_machine_ok(machine.poll(features="drain-v1"))
    held = node.held_poll(machine)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
    if backend_database.url:
        env["TALARIA_DATABASE_URL"] = backend_database.url
    command = [sys.executable, "-m", "talaria", "admin", "runners", "drain", node.id,
               "--data-dir", str(node.server.data_dir)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    if backend_database.url:  # the state row drains at once and the holding replica is woken
        assert done.stdout.strip().startswith(f"runner {node.id} is draining")
        assert assert_machine_ok(held.result(10))["drain"] is True
    else:  # recorded on the runner row, applied at the runner's next request
        assert done.stdout.strip() == (
            f"drain requested for runner {node.id}; the hub applies it at the runner's next request"
        )
        assert "drain" not in assert_machine_ok(held.result(20)), "the held poll knew nothing yet"
        assert assert_machine_ok(machine.poll())["drain"] is True
    assert node.summary()["draining"] is True
    unknown = subprocess.run([*command[:6], UNKNOWN_RUNNER, *command[7:]], capture_output=True, text=True, env=env,
                             timeout=60, check=False)  # fmt: skip
    assert unknown.returncode == 1
    assert f"no enabled runner {UNKNOWN_RUNNER}" in unknown.stderr


def test_a_command_line_drain_request_older_than_the_state_is_dropped(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "POLL_HOLD_S", 1)
    node.server.hub.registry.request_drain(node.id, "default", node.clock.now_ms())
    node.clock.advance(1)
    machine = node.machine()
    assert_machine_ok(machine.poll(features="drain-v1"))  # a state newer than the request
    assert "drain" not in assert_machine_ok(machine.poll())
    assert node.summary()["draining"] is False
    record = node.server.hub.registry.get(node.id)
    assert record is not None and record.drain_requested_at is None, "dropped"


def test_a_held_poll_woken_more_than_a_second_later_delivers(node: Node) -> None:
    # On PostgreSQL the woken poll writes the state's seen time again (at most once a second): that write once lacked
    # a parameter and failed the poll.
    machine = node.machine()
    assert_machine_ok(machine.poll(features="drain-v1"))
    held = node.held_poll(machine)
    node.clock.advance(2)
    task = send(node.server, node.id, OFF_LIST)
    polled = assert_machine_ok(held.result(10))
    assert [wire["kind"] for wire in polled["commands"]] == ["http"]
    node.server.call(_cancel(task))


# --- credential rotation (operations.md 4.1) -------------------------------------------------------------------------


def rotate_api(node: Node, runner_id: str | None = None) -> httpx.Response:
    return node.admin.post(f"/api/admin/runners/{runner_id or node.id}/rotate-token")


def same_instance(node: Node, machine: Machine, token: str) -> Machine:
    """``machine``'s instance and epoch, sending ``token``."""
    made = node.machine(machine.instance, token)
    made.epoch = machine.epoch
    return made


def works(machine: Machine) -> bool:
    response = machine.post("admit", {"id": str(uuid.uuid4())})
    if response.status_code == 403:
        assert_machine_error(response, 403, "runner_unauthorized")
        return False
    assert_machine_ok(response)
    return True


def test_an_admin_rotation_is_said_to_the_held_poll_and_the_next_token_promotes_at_first_use(node: Node) -> None:
    machine = node.machine()
    assert "rotate" not in assert_machine_ok(machine.poll(features="rotate-v1"))
    created = node.summary()["createdAt"]
    before = node.summary()
    assert (before["tokenIssuedAt"], before["rotationPending"], before["tokenNextReplacedAt"]) == (created, False, None)
    held = node.held_poll(machine)
    asked = rotate_api(node)
    assert (asked.status_code, asked.json()) == (200, {"ok": True}), asked.text
    polled = assert_machine_ok(held.result(10))
    assert (polled["commands"], polled["rotate"]) == ([], True), "the held poll ends at once, saying so"
    assert rotate_api(node).json() == {"ok": True}, "repeated"
    assert node.summary()["rotationPending"] is True

    node.clock.advance(3)
    rotated = assert_machine_ok(machine.post("rotate", {}))
    assert set(rotated) == {"token", "issuedAt"} and rotated["issuedAt"] == node.clock.now_ms()
    new = rotated["token"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", new) and new != node.token
    assert works(machine), "the old token works until the new one is first used"
    assert node.summary()["tokenIssuedAt"] == created

    node.clock.advance(2)
    renamed = same_instance(node, machine, new)
    assert works(renamed), "the next token promotes"
    after = node.summary()
    assert (after["tokenIssuedAt"], after["rotationPending"]) == (node.clock.now_ms(), False)
    assert not works(machine), "the old token is refused once the new one was used"
    assert "rotate" not in assert_machine_ok(renamed.poll(reset=True, features="rotate-v1"))
    assert assert_machine_ok(renamed.poll(features="rotate-v1"), "epoch")["epoch"] == renamed.epoch
    # a second replica's promotion finds it done and passes; an unknown token does not
    registry = node.server.hub.registry
    assert registry.promote(node.id, new) is not None
    assert registry.promote(node.id, node.token) is None
    listed = node.admin.get("/api/admin/runners").text
    assert new not in listed and node.token not in listed


def test_rotate_needs_rotate_v1_a_due_rotation_and_an_empty_body(node: Node) -> None:
    machine = node.machine()
    assert_machine_ok(machine.poll(features="drain-v1"))
    assert rotate_api(node).status_code == 200
    assert_machine_error(machine.post("rotate", {}), 409, "runner_feature_required")
    assert "rotate" not in assert_machine_ok(machine.poll(reset=True, features="drain-v1")), "not offered: not said"
    other = node.machine()
    assert_machine_ok(other.poll(features="rotate-v1"))
    assert_machine_error(other.post("rotate", {"token": "x"}), 400, "invalid_json")
    assert works(other)
    assert_machine_ok(other.post("rotate", {}))
    # once the next token was used, no rotation is due
    promoted = assert_machine_ok(other.post("rotate", {}))["token"]
    user = same_instance(node, other, promoted)
    assert works(user)
    assert_machine_error(user.post("rotate", {}), 409, "runner_rotation_not_due")


def test_a_second_rotate_replaces_the_unused_next_shows_it_and_disabling_ends_both(node: Node) -> None:
    machine = node.machine()
    assert_machine_ok(machine.poll(features="rotate-v1"))
    assert rotate_api(node).status_code == 200
    first = assert_machine_ok(machine.post("rotate", {}))["token"]
    assert node.summary()["tokenNextReplacedAt"] is None
    node.clock.advance(1)
    second = assert_machine_ok(machine.post("rotate", {}))["token"]
    assert node.summary()["tokenNextReplacedAt"] == node.clock.now_ms(), "a second party rotating is visible"
    assert not works(same_instance(node, machine, first)), "the replaced next token"
    assert works(same_instance(node, machine, second))
    assert node.admin.delete(f"/api/admin/runners/{node.id}").status_code == 200
    for token in (node.token, second):
        assert_machine_error(same_instance(node, machine, token).poll(), 403, "runner_unauthorized")
    assert rotate_api(node).status_code == 404, "a disabled runner cannot be asked"


def test_an_unused_next_token_is_dropped_after_the_overlap(node: Node) -> None:
    machine = node.machine()
    assert_machine_ok(machine.poll(features="rotate-v1"))
    assert rotate_api(node).status_code == 200
    new = assert_machine_ok(machine.post("rotate", {}))["token"]
    node.clock.advance(86_400 - 0.001)  # a day: the admin's session has expired, so the record is read directly
    record = node.server.hub.registry.get(node.id)
    assert record is not None and record.next_live(node.clock.now_ms(), 86_400_000)
    node.clock.advance(0.001)
    assert_machine_error(same_instance(node, machine, new).poll(reset=True), 403, "runner_unauthorized")
    assert assert_machine_ok(machine.poll(reset=True, features="rotate-v1"))["rotate"] is True, "still asked"
    again = assert_machine_ok(machine.post("rotate", {}))["token"]
    record = node.server.hub.registry.get(node.id)
    assert record is not None and record.token_next_replaced_at is None, "a dropped next is not reported as replaced"
    assert works(same_instance(node, machine, again))


def test_rotation_by_age(
    backend_database: BackendDatabase, make_hub: Callable[..., HubServer], clock: ManualClock
) -> None:
    node = Node(make_hub(**backend_database.settings(), runners_token_rotate_after_s=5), clock)
    try:
        machine = node.machine()
        assert "rotate" not in assert_machine_ok(machine.poll(features="rotate-v1"))
        clock.advance(4.999)
        assert "rotate" not in assert_machine_ok(machine.poll(reset=True, features="rotate-v1"))
        assert node.summary()["rotationPending"] is False
        clock.advance(0.001)
        assert assert_machine_ok(machine.poll(reset=True, features="rotate-v1"))["rotate"] is True
        assert node.summary()["rotationPending"] is True
        new = assert_machine_ok(machine.post("rotate", {}))["token"]
        renamed = same_instance(node, machine, new)
        assert works(renamed)
        assert "rotate" not in assert_machine_ok(renamed.poll(reset=True, features="rotate-v1")), "a fresh token"
        clock.advance(5)
        assert assert_machine_ok(renamed.poll(reset=True, features="rotate-v1"))["rotate"] is True
    finally:
        node.server.call(_disconnect(node.server, node.id))
        node.close()


def test_rotation_requests_for_unknown_and_other_tenants_runners_and_the_command_line(
    node: Node, backend_database: BackendDatabase
) -> None:
    import subprocess
    import sys

    assert rotate_api(node, UNKNOWN_RUNNER).status_code == 404
    other = admin_of(node.server, "eve", tenant="other")
    try:
        refused = other.post(f"/api/admin/runners/{node.id}/rotate-token")
        assert (refused.status_code, refused.json()["code"]) == (404, "not_found")
    finally:
        other.close()
    machine = node.machine()
    assert "rotate" not in assert_machine_ok(machine.poll(features="rotate-v1"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
    if backend_database.url:
        env["TALARIA_DATABASE_URL"] = backend_database.url
    command = [sys.executable, "-m", "talaria", "admin", "runners", "rotate-token", node.id,
               "--data-dir", str(node.server.data_dir)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (
        0, f"rotation requested for runner {node.id}; it takes a new token at its next poll"
    ), done.stderr  # fmt: skip
    assert assert_machine_ok(machine.poll(reset=True, features="rotate-v1"))["rotate"] is True
    unknown = subprocess.run([*command[:6], UNKNOWN_RUNNER, *command[7:]], capture_output=True, text=True, env=env,
                             timeout=60, check=False)  # fmt: skip
    assert unknown.returncode == 1 and f"no enabled runner {UNKNOWN_RUNNER}" in unknown.stderr


# --- the hub's metrics (operations.md 5.1; scenario 9.12, the hub's half) ------------------------------------------

HUB_METRICS = {
    # name: (type, label names of its samples)
    "talaria_http_requests": ("counter", {"door", "status"}),
    "talaria_http_request_seconds": ("histogram", {"door"}),
    "talaria_job_signals": ("counter", {"signal"}),
    "talaria_runtime_rejections": ("counter", {"code"}),
    "talaria_runner_commands": ("counter", {"outcome"}),
    "talaria_runner_command_seconds": ("histogram", set()),
    "talaria_runners_online": ("gauge", set()),
    "talaria_runner_commands_pending": ("gauge", set()),
    "talaria_build_info": ("gauge", {"version", "backend", "replica"}),
    "talaria_jobs": ("gauge", {"state"}),
    "talaria_dispatcher_turns_running": ("gauge", set()),
    "talaria_runners_draining": ("gauge", set()),
    "talaria_runner_polls_held": ("gauge", set()),
    "talaria_hub_draining": ("gauge", set()),
    "talaria_store_transaction_seconds": ("histogram", {"mode"}),
    "talaria_store_unavailable": ("counter", set()),
    "talaria_runner_token_rotations": ("counter", set()),
}
POSTGRES_METRICS = {
    "talaria_db_pool_connections": ("gauge", {"state"}),
    "talaria_wake_fallback": ("counter", {"channel"}),
    "talaria_notify_sent": ("counter", {"channel"}),
    "talaria_role_lease_held": ("gauge", {"role"}),
    "talaria_audit_unsealed": ("gauge", set()),
    "talaria_audit_seal_lag_seconds": ("histogram", set()),
    "talaria_clock_skew_seconds": ("gauge", set()),
}


def scraped(node: Node) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name: family for family in text_string_to_metric_families(metrics_text(node.server))}


def sample(found: dict[str, Any], name: str, **labels: str) -> float:
    family = found[re.sub(r"_(total|count|sum|bucket)$", "", name)]
    values = [
        s.value for s in family.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert values, (name, labels, family.samples)
    return float(sum(values))


def test_the_hub_s_metrics_names_labels_and_the_runner_door(node: Node, backend_database: BackendDatabase) -> None:
    machine = node.machine()
    assert_machine_ok(machine.poll(features="rotate-v1,drain-v1"))
    held = node.held_poll(machine)
    found = scraped(node)
    assert sample(found, "talaria_runner_polls_held") == 1
    assert rotate_api(node).status_code == 200
    assert_machine_ok(held.result(10))
    new = assert_machine_ok(machine.post("rotate", {}))["token"]
    assert works(same_instance(node, machine, new))
    assert drain_api(node).status_code == 200
    found = scraped(node)
    expected = HUB_METRICS | (POSTGRES_METRICS if backend_database.url else {})
    for name, (kind, labels) in expected.items():
        assert name in found and found[name].type == kind, (name, found.get(name))
        for one in found[name].samples:
            assert set(one.labels) - {"le"} == labels, (name, one)
    if not backend_database.url:
        assert not set(POSTGRES_METRICS) & set(found), "PostgreSQL's metrics only on PostgreSQL"
    build = found["talaria_build_info"].samples[0]
    assert build.labels["backend"] == ("postgresql" if backend_database.url else "sqlite") and build.value == 1
    assert sample(found, "talaria_http_requests_total", door="runner", status="200") >= 4
    assert sample(found, "talaria_http_request_seconds_count", door="runner") >= 4
    assert sample(found, "talaria_http_requests_total", door="api", status="200") >= 2, "the admin's requests"
    assert sample(found, "talaria_runner_token_rotations_total") == 1
    assert sample(found, "talaria_runners_draining") == 1 and sample(found, "talaria_hub_draining") == 0
    assert sample(found, "talaria_runner_polls_held") == 0
    assert {s.labels["state"] for s in found["talaria_jobs"].samples} == {
        "QUEUED", "LEASED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"
    }  # fmt: skip
    assert sample(found, "talaria_store_transaction_seconds_count", mode="write") >= 1
    assert sample(found, "talaria_store_transaction_seconds_count", mode="read") >= 1
    if backend_database.url:
        assert sample(found, "talaria_role_lease_held", role="maintenance") == 1
        assert sample(found, "talaria_db_pool_connections", state="idle") >= 1
        signals = node.server.hub.store.signals(listen=True)  # type: ignore[attr-defined]
        signals.notify("talaria_runner", str(uuid.uuid4()))
        wait_until(lambda: any(s.labels == {"channel": "talaria_runner"} and s.value >= 1
                               for s in scraped(node)["talaria_notify_sent"].samples),
                   timeout=5, what="the notification counted")  # fmt: skip
    for family in found.values():  # no label holds an id
        for one in family.samples:
            assert node.id not in str(one.labels), one
