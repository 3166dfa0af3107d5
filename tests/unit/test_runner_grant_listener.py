"""The grant listener's pre-checks and the grant's tool calls, without sockets (runner-protocol.md 12.3, 12.5).

The hub is faked by one object implementing ``HubClient.post``; the listener's checks are a pure function.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import uuid
from typing import Any

import pytest

from talaria.canonical import canonical_json
from talaria.clock import ManualClock
from talaria.runner.config import RunnerConfig
from talaria.runner.errors import CommandError
from talaria.runner.grant_listener import MAX_BODY_BYTES, Refusal, RequestHead, ToolListener, parse_head, precheck
from talaria.runner.grant_tools import ToolCalls, ToolError, depth, failure, opaque_tool_id, success
from talaria.runner.grants import Grant, Grants
from talaria.runner.hub_client import HubError

BEARER = "b" * 43
PORT = 45678
CATALOG = [
    {"id": "form_team", "name": "form_team", "description": "Form a team", "inputSchema": {"type": "object"}},
    {"id": "report_back", "name": "report_back", "description": "Report", "inputSchema": {"type": "object"}},
]


def head(method: str = "POST", target: str = "/tools/call", **overrides: str | list[str] | None) -> RequestHead:
    headers: dict[str, str | list[str] | None] = {
        "host": f"127.0.0.1:{PORT}",
        "authorization": f"Bearer {BEARER}",
        "content-type": "application/json",
        "content-length": "2",
    }
    headers.update({name.replace("_", "-"): value for name, value in overrides.items()})
    pairs: list[tuple[str, str]] = []
    for name, value in headers.items():
        for item in [value] if isinstance(value, str) else value or []:
            pairs.append((name, item))
    return RequestHead(method, target, pairs)


def check(request: RequestHead, peer: str = "127.0.0.1") -> Refusal | int:
    return precheck(request, peer=peer, port=PORT, bearer=BEARER)


def code_of(outcome: Refusal | int) -> tuple[int, str] | int:
    return (outcome.status, outcome.code) if isinstance(outcome, Refusal) else outcome


# --- pre-checks, in order ------------------------------------------------------------------------------------


def test_a_good_request_passes_with_its_body_length() -> None:
    assert check(head()) == 2
    assert check(head(content_length=None)) == 0  # no Content-Length: an empty body


def test_each_check_fails_first_in_the_specified_order() -> None:
    """Break every check, then repair them one at a time: each answer is the next check in order."""
    broken = dict(
        host="localhost:1", origin="http://evil.example", authorization="Bearer wrong", content_type="text/plain"
    )
    expected = [
        ("peer", (403, "peer_not_allowed")),
        ("host", (403, "host_not_allowed")),
        ("origin", (403, "origin_not_allowed")),
        ("authorization", (401, "unauthenticated")),
        ("method", (405, "method_not_allowed")),
        ("content_type", (415, "unsupported_media_type")),
        ("length", (413, "runner_payload_limit")),
    ]
    state = dict(broken, content_length=str(MAX_BODY_BYTES + 1))
    peer, method = "127.0.0.2", "GET"
    for repaired, answer in expected:
        assert code_of(check(head(method, **state), peer=peer)) == answer, repaired
        if repaired == "peer":
            peer = "127.0.0.1"
        elif repaired == "method":
            method = "POST"
        elif repaired == "length":
            state["content_length"] = str(MAX_BODY_BYTES)
        else:
            state.pop(repaired)
            if repaired != "origin":
                state[repaired] = head().values(repaired.replace("_", "-"))[0]
    assert check(head(method, **state), peer=peer) == MAX_BODY_BYTES


def test_the_body_limit_is_256_kib() -> None:
    assert check(head(content_length=str(256 * 1024))) == 256 * 1024
    assert code_of(check(head(content_length=str(256 * 1024 + 1)))) == (413, "runner_payload_limit")


@pytest.mark.parametrize("peer", ["127.0.0.2", "::1", "10.0.0.1", ""])
def test_only_the_peer_127_0_0_1_is_served(peer: str) -> None:
    assert code_of(check(head(), peer=peer)) == (403, "peer_not_allowed")


@pytest.mark.parametrize(
    "host", [f"localhost:{PORT}", "127.0.0.1", f"127.0.0.1:{PORT + 1}", f"[::1]:{PORT}", "", [f"127.0.0.1:{PORT}"] * 2]
)
def test_the_host_must_be_the_listener_address(host: str | list[str]) -> None:
    assert code_of(check(head(host=host))) == (403, "host_not_allowed")


def test_a_missing_host_is_refused() -> None:
    assert code_of(check(head(host=None))) == (403, "host_not_allowed")


@pytest.mark.parametrize("origin", ["http://127.0.0.1:9119", "null", ""])
def test_any_origin_is_refused(origin: str) -> None:
    assert code_of(check(head(origin=origin))) == (403, "origin_not_allowed")


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        f"Basic {BEARER}",
        f"Bearer {BEARER}x",
        f"Bearer {BEARER[:-1]}",
        "Bearer",
        f"Bearer  {BEARER}",
        [f"Bearer {BEARER}"] * 2,
    ],
)
def test_the_grant_bearer_is_required(authorization: str | list[str] | None) -> None:
    assert code_of(check(head(authorization=authorization))) == (401, "unauthenticated")


def test_the_bearer_scheme_is_case_insensitive() -> None:
    assert check(head(authorization=f"bearer {BEARER}")) == 2


@pytest.mark.parametrize("method", ["GET", "PUT", "OPTIONS", "post"])
def test_only_post_is_allowed(method: str) -> None:
    assert code_of(check(head(method))) == (405, "method_not_allowed")


@pytest.mark.parametrize("content_type", ["text/plain", "application/jsonx", "", ["application/json"] * 2])
def test_the_body_must_be_json(content_type: str | list[str]) -> None:
    assert code_of(check(head(content_type=content_type))) == (415, "unsupported_media_type")


def test_json_with_a_charset_is_json() -> None:
    assert check(head(content_type="Application/JSON; charset=utf-8")) == 2


@pytest.mark.parametrize("length", ["-1", "1e3", "0x10", "", "١٢"])
def test_a_malformed_content_length_is_refused(length: str) -> None:
    assert code_of(check(head(content_length=length))) == (400, "invalid_request")


def test_transfer_encoding_is_refused() -> None:
    assert code_of(check(head(transfer_encoding="chunked"))) == (400, "invalid_request")


def test_parse_head() -> None:
    raw = b"POST /tools/list HTTP/1.1\r\nHost: 127.0.0.1:1\r\nX-A:  b \r\n\r\n"
    parsed = parse_head(raw)
    assert parsed == RequestHead("POST", "/tools/list", [("host", "127.0.0.1:1"), ("x-a", "b")])
    assert parse_head(b"POST /tools/list\r\n\r\n") is None
    assert parse_head(b"POST /x HTTP/2\r\n\r\n") is None
    assert parse_head(b"POST /x HTTP/1.1\r\nBad Header: x\r\n\r\n") is None
    assert parse_head(b"POST /x HTTP/1.1\r\nNoColon\r\n\r\n") is None


# --- tool ids and listing ------------------------------------------------------------------------------------


def test_opaque_tool_ids() -> None:
    expected = "team_" + hashlib.sha256(f"{BEARER}:form_team".encode()).hexdigest()[:32]
    assert opaque_tool_id(BEARER, "form_team") == expected
    assert re.fullmatch(r"team_[0-9a-f]{32}", expected)
    assert opaque_tool_id("c" * 43, "form_team") != expected  # unguessable without the bearer


def test_listing_shows_opaque_ids_only() -> None:
    tools = ToolCalls(BEARER, CATALOG, fake_forward([]))
    listing = tools.listing()
    assert listing["warnings"] == []
    assert [t["id"] for t in listing["tools"]] == [opaque_tool_id(BEARER, t["id"]) for t in CATALOG]
    assert listing["tools"][0] == {
        "id": opaque_tool_id(BEARER, "form_team"),
        "name": "form_team",
        "description": "Form a team",
        "inputSchema": {"type": "object"},
    }
    assert "form_team" not in json.dumps([t["id"] for t in listing["tools"]])


def test_serve_routes() -> None:
    tools = ToolCalls(BEARER, CATALOG, fake_forward([]))
    assert asyncio.run(tools.serve("/tools/list", b"{}")) == (200, tools.listing())
    assert asyncio.run(tools.serve("/tools/list", b"[]"))[0] == 400
    assert asyncio.run(tools.serve("/tools/list", b"nope")) == (
        400,
        {"error": "the body must be a JSON object", "code": "invalid_json"},
    )
    assert asyncio.run(tools.serve("/tools/other", b"{}"))[0] == 404
    status, answer = asyncio.run(tools.serve("/tools/call", b"nope"))
    assert status == 200 and error_code(answer) == "invalid_request"


# --- calls -----------------------------------------------------------------------------------------------------


def fake_forward(log: list[tuple[str, str, dict[str, Any]]], result: Any = None) -> Any:
    async def forward(real_id: str, call_id: str, arguments: dict[str, Any]) -> Any:
        log.append((real_id, call_id, arguments))
        await asyncio.sleep(0)
        return {"tool": real_id, "args": arguments} if result is None else result

    return forward


def body(tool: str, arguments: Any, call_id: str) -> bytes:
    return json.dumps({"toolId": tool, "arguments": arguments, "callId": call_id}).encode()


def error_code(answer: dict[str, Any]) -> str:
    assert answer["isError"] is True
    parsed = json.loads(answer["content"][0]["text"])
    assert set(parsed) == {"error", "code"}
    return str(parsed["code"])


FORM = opaque_tool_id(BEARER, "form_team")


def test_a_call_is_forwarded_with_the_real_id_and_answered_mcp_style() -> None:
    log: list[tuple[str, str, dict[str, Any]]] = []
    tools = ToolCalls(BEARER, CATALOG, fake_forward(log))
    answer = asyncio.run(tools.call(body(FORM, {"b": 1, "a": "é"}, "call-1")))
    result = {"tool": "form_team", "args": {"b": 1, "a": "é"}}
    # compact JSON in the hub's key order (team-tools.md 6.1: ids first; ADR 0038), non-ASCII kept
    assert answer == {"content": [{"type": "text", "text": '{"tool":"form_team","args":{"b":1,"a":"é"}}'}],
                      "structuredContent": result}  # fmt: skip
    assert answer == success(result)
    assert log == [("form_team", "call-1", {"b": 1, "a": "é"})]


def test_the_same_call_id_and_arguments_reach_the_hub_once() -> None:
    log: list[tuple[str, str, dict[str, Any]]] = []
    tools = ToolCalls(BEARER, CATALOG, fake_forward(log))

    async def scenario() -> list[dict[str, Any]]:
        concurrent = await asyncio.gather(*(tools.call(body(FORM, {"x": [1, 2]}, "c")) for _ in range(3)))
        later = await tools.call(body(FORM, {"x": [1, 2]}, "c"))
        return [*concurrent, later]

    answers = asyncio.run(scenario())
    assert len(log) == 1
    assert all(answer == answers[0] for answer in answers)
    assert tools.call_count == 1


def test_the_same_call_id_with_other_arguments_is_a_conflict() -> None:
    log: list[tuple[str, str, dict[str, Any]]] = []
    tools = ToolCalls(BEARER, CATALOG, fake_forward(log))

    async def scenario() -> list[dict[str, Any]]:
        first = await tools.call(body(FORM, {"x": 1}, "c"))
        other_args = await tools.call(body(FORM, {"x": 2}, "c"))
        other_tool = await tools.call(body(opaque_tool_id(BEARER, "report_back"), {"x": 1}, "c"))
        return [first, other_args, other_tool]

    first, other_args, other_tool = asyncio.run(scenario())
    assert "structuredContent" in first
    assert error_code(other_args) == "idempotency_conflict"
    assert error_code(other_tool) == "idempotency_conflict"
    assert len(log) == 1


def test_key_order_does_not_change_the_fingerprint() -> None:
    log: list[tuple[str, str, dict[str, Any]]] = []
    tools = ToolCalls(BEARER, CATALOG, fake_forward(log))

    async def scenario() -> None:
        await tools.call(b'{"toolId": "%s", "arguments": {"a": 1, "b": 2}, "callId": "c"}' % FORM.encode())
        again = await tools.call(b'{"callId": "c", "arguments": {"b": 2, "a": 1}, "toolId": "%s"}' % FORM.encode())
        assert "structuredContent" in again

    asyncio.run(scenario())
    assert len(log) == 1


class FakeHub:
    """Implements ``HubClient.post`` for the ``tool`` op."""

    def __init__(self, fail: HubError | None = None) -> None:
        self.posts: list[tuple[str, str, dict[str, Any]]] = []
        self.fail = fail

    async def post(self, op: str, epoch: str, body: dict[str, Any]) -> Any:
        self.posts.append((op, epoch, body))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return {"result": {"n": len(self.posts)}}


def hub_forward(hub: FakeHub) -> Any:
    async def forward(real_id: str, call_id: str, arguments: dict[str, Any]) -> Any:
        answer = await hub.post("tool", "epoch-1", {"toolId": real_id, "callId": call_id, "arguments": arguments})
        return answer["result"]

    return forward


def test_128_calls_per_grant_then_the_call_limit() -> None:
    hub = FakeHub()
    tools = ToolCalls(BEARER, CATALOG, hub_forward(hub))

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
        answers = [await tools.call(body(FORM, {}, f"call-{i}")) for i in range(128)]
        over = await tools.call(body(FORM, {}, "call-128"))
        repeat = await tools.call(body(FORM, {}, "call-5"))  # a known callId is still answered
        return answers, over, repeat

    answers, over, repeat = asyncio.run(scenario())
    assert all("structuredContent" in answer for answer in answers)
    assert error_code(over) == "runner_call_limit"
    assert repeat == answers[5]
    assert len(hub.posts) == 128


@pytest.mark.parametrize(("levels", "ok"), [(30, True), (31, False)])
def test_arguments_nest_at_most_30_levels(levels: int, ok: bool) -> None:
    arguments: Any = {}
    for _ in range(levels - 1):
        arguments = {"a": arguments}
    assert depth(arguments) == levels
    hub = FakeHub()
    answer = asyncio.run(ToolCalls(BEARER, CATALOG, hub_forward(hub)).call(body(FORM, arguments, "c")))
    if ok:
        assert "structuredContent" in answer and len(hub.posts) == 1
    else:
        assert error_code(answer) == "invalid_request" and hub.posts == []


def test_depth_counts_lists_too() -> None:
    assert depth({}) == 1
    assert depth({"a": [1, {"b": []}]}) == 4
    assert depth(7) == 0


def test_absurd_nesting_is_refused_without_a_crash() -> None:
    raw = b'{"toolId": "t", "callId": "c", "arguments": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = asyncio.run(ToolCalls(BEARER, CATALOG, fake_forward([])).call(raw))
    assert error_code(answer) == "invalid_request"


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        (body(FORM, {}, "c" * 200), True),
        (body(FORM, {}, "c" * 201), False),
        (body(FORM, {}, ""), False),
        (body(FORM, [], "c"), False),
        (json.dumps({"toolId": FORM, "arguments": {}, "callId": "c", "extra": 1}).encode(), False),
        (json.dumps({"toolId": FORM, "arguments": {}}).encode(), False),
        (json.dumps({"toolId": 5, "arguments": {}, "callId": "c"}).encode(), False),
        (b'{"toolId": "t", "arguments": {"a": NaN}, "callId": "c"}', False),
        (b'{"toolId": "t", "arguments": {"a": "\\ud800"}, "callId": "c"}', False),
        (b"\xff", False),
    ],
)
def test_call_body_validation(raw: bytes, ok: bool) -> None:
    answer = asyncio.run(ToolCalls(BEARER, CATALOG, fake_forward([])).call(raw))
    assert ("structuredContent" in answer) is ok
    if not ok:
        assert error_code(answer) == "invalid_request"


def test_an_unknown_tool_id_is_not_found_and_counts() -> None:
    log: list[tuple[str, str, dict[str, Any]]] = []
    tools = ToolCalls(BEARER, CATALOG, fake_forward(log))
    answer = asyncio.run(tools.call(body("form_team", {}, "c")))  # the real id is not a listener id
    assert error_code(answer) == "not_found"
    assert log == [] and tools.call_count == 1


def test_hub_errors_keep_their_code() -> None:
    hub = FakeHub(HubError(410, "runner_grant_expired", "the grant is closed"))
    tools = ToolCalls(BEARER, CATALOG, grants_forward(hub))
    answer = asyncio.run(tools.call(body(FORM, {}, "c")))
    assert error_code(answer) == "runner_grant_expired"


def test_an_uncertain_call_is_forgotten_so_a_retry_is_forwarded_again() -> None:
    hub = FakeHub(HubError(0, "transport", "ReadTimeout"))
    tools = ToolCalls(BEARER, CATALOG, grants_forward(hub))

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        first = await tools.call(body(FORM, {}, "c"))
        hub.fail = None
        return first, await tools.call(body(FORM, {}, "c"))

    first, retry = asyncio.run(scenario())
    assert error_code(first) == "runner_command_uncertain"
    assert retry == success({"n": 2})
    assert [post[2]["callId"] for post in hub.posts] == ["c", "c"]


def test_close_fails_waiting_calls_with_grant_expired() -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        gate = asyncio.Event()

        async def forward(real_id: str, call_id: str, arguments: dict[str, Any]) -> Any:
            await gate.wait()
            return {}

        tools = ToolCalls(BEARER, CATALOG, forward)
        waiting = asyncio.ensure_future(tools.call(body(FORM, {}, "c")))
        await asyncio.sleep(0.01)
        tools.close()
        return await waiting, await tools.call(body(FORM, {}, "d"))

    waiting, after = asyncio.run(scenario())
    assert error_code(waiting) == "runner_grant_expired"
    assert error_code(after) == "runner_grant_expired"


def test_failure_text_is_canonical_json() -> None:
    answer = failure("not_found", "no such tool")
    assert answer == {"content": [{"type": "text", "text": '{"code":"not_found","error":"no such tool"}'}],
                      "isError": True}  # fmt: skip
    assert len(json.loads(failure("x", "m" * 5000)["content"][0]["text"])["error"]) == 1000


def test_tool_errors_cut_their_message() -> None:
    assert len(ToolError("code", "m" * 5000).message) == 1000


# --- the Grants forwarding path, with a fake hub and no socket -----------------------------------------------


class Owned:
    def __init__(self, sessions: dict[str, str]) -> None:
        self.sessions = sessions

    def profile_of(self, runtime_id: str) -> str | None:
        return self.sessions.get(runtime_id)


class NoSocketGrants(Grants):
    async def _start_listener(self, grant: Grant) -> ToolListener:
        return ToolListener(grant.bearer, grant.tools.serve)  # never started: no socket in a unit test


def config() -> RunnerConfig:
    return RunnerConfig(
        protocol=1,
        server_url="http://127.0.0.1:1",
        runner_id=str(uuid.uuid4()),
        token="t" * 43,
        allowed_profiles=("default", "work"),
    )


def grants_forward(hub: FakeHub) -> Any:
    """A forward through ``Grants._forward`` (the real mapping to the hub's ``tool`` body)."""
    grants, grant = open_grant(hub)

    async def forward(real_id: str, call_id: str, arguments: dict[str, Any]) -> Any:
        return await grants._forward(grant, real_id, call_id, arguments)

    return forward


def open_grant(hub: FakeHub) -> tuple[NoSocketGrants, Grant]:
    clock = ManualClock()
    grants = NoSocketGrants(config(), hub, lambda: None, clock, Owned({"rt1": "default"}), lambda: "epoch-1")
    grant = Grant(
        id=str(uuid.uuid4()), profile="default", work_id="w", runtime_id="rt1", stored_id="s1", epoch="epoch-1",
        generation="w:g", bearer=BEARER, tools=ToolCalls(BEARER, CATALOG, fake_forward([])), state="open",
        expires_at=clock.now_ms() + 60_000,
    )  # fmt: skip
    return grants, grant


def create_command(grant_id: str, **payload: Any) -> dict[str, Any]:
    base = {
        "grantId": grant_id,
        "profile": "default",
        "workId": "work-1",
        "session": {"runtimeId": "rt1", "storedId": "s1"},
        "catalog": CATALOG,
    }
    return {"id": str(uuid.uuid4()), "kind": "grant.create", "payload": base | payload}


def test_grants_forward_the_real_id_under_the_grant_epoch() -> None:
    hub = FakeHub()
    clock = ManualClock()
    grants = NoSocketGrants(config(), hub, lambda: None, clock, Owned({"rt1": "default"}), lambda: "epoch-1")

    async def scenario() -> dict[str, Any]:
        grant_id = str(uuid.uuid4())
        assert await grants.handlers()["grant.create"](create_command(grant_id)) == {"ok": True}
        grant = grants._grants[grant_id]
        answer = await grant.tools.call(body(opaque_tool_id(grant.bearer, "report_back"), {"q": 1}, "c1"))
        await grants.dispose_all()
        return {"answer": answer, "grant_id": grant_id}

    out = asyncio.run(scenario())
    assert out["answer"] == success({"n": 1})
    assert hub.posts == [
        (
            "tool",
            "epoch-1",
            {"grantId": out["grant_id"], "toolId": "report_back", "callId": "c1", "arguments": {"q": 1}},
        )
    ]


def test_a_call_after_expiry_is_refused_without_a_hub_call() -> None:
    hub = FakeHub()
    clock = ManualClock()
    grants = NoSocketGrants(config(), hub, lambda: None, clock, Owned({"rt1": "default"}), lambda: "epoch-1")

    async def scenario() -> dict[str, Any]:
        grant_id = str(uuid.uuid4())
        await grants.handlers()["grant.create"](create_command(grant_id))
        grant = grants._grants[grant_id]
        clock.advance(30 * 60)
        answer = await grant.tools.call(body(opaque_tool_id(grant.bearer, "form_team"), {}, "c1"))
        assert grants.open_ids() == [] and grants.tombstoned(grant_id)
        return answer

    assert error_code(asyncio.run(scenario())) == "runner_grant_expired"
    assert hub.posts == []


def test_create_rules_in_order() -> None:
    hub = FakeHub()
    grants = NoSocketGrants(
        config(), hub, lambda: None, ManualClock(), Owned({"rt1": "default", "rt2": "work"}), lambda: "e"
    )
    create = grants.handlers()["grant.create"]

    async def refused(command: dict[str, Any]) -> str:
        with pytest.raises(CommandError) as caught:
            await create(command)
        return caught.value.code

    async def scenario() -> None:
        gid = str(uuid.uuid4())
        assert await refused(create_command(gid, profile="secret")) == "runner_profile_forbidden"
        assert await refused(create_command(gid.upper())) == "runner_command_forbidden"
        assert await refused(create_command("not-a-uuid")) == "runner_command_forbidden"
        assert await refused(create_command(gid, session={"runtimeId": "rt2", "storedId": "s"})) == (
            "runner_session_forbidden"
        )
        assert await refused(create_command(gid, session={"runtimeId": "nobody", "storedId": "s"})) == (
            "runner_session_forbidden"
        )
        assert await refused(create_command(gid, extra=1)) == "runner_command_forbidden"
        assert await refused(create_command(gid, catalog=[CATALOG[0], CATALOG[0]])) == "runner_command_forbidden"
        assert await create(create_command(gid)) == {"ok": True}
        assert await refused(create_command(gid)) == "runner_command_forbidden"  # in use
        await grants.handlers()["grant.close"]({"payload": {"grantId": gid}})
        assert await refused(create_command(gid)) == "runner_command_forbidden"  # tombstoned
        for _ in range(64):
            await create(create_command(str(uuid.uuid4())))
        assert await refused(create_command(str(uuid.uuid4()))) == "runner_busy"
        await grants.dispose_all()
        assert grants.open_ids() == []

    asyncio.run(scenario())


def test_tombstones_last_60_seconds() -> None:
    clock = ManualClock()
    grants = NoSocketGrants(config(), FakeHub(), lambda: None, clock, Owned({"rt1": "default"}), lambda: "e")

    async def scenario() -> None:
        gid = str(uuid.uuid4())
        assert await grants.handlers()["grant.close"]({"payload": {"grantId": gid}}) == {"ok": True}
        clock.advance(59.999)
        assert grants.tombstoned(gid)
        clock.advance(0.001)
        assert not grants.tombstoned(gid)
        assert await grants.handlers()["grant.create"](create_command(gid)) == {"ok": True}
        await grants.dispose_all()

    asyncio.run(scenario())


def test_expiry_is_30_minutes_after_creation() -> None:
    clock = ManualClock()
    grants = NoSocketGrants(config(), FakeHub(), lambda: None, clock, Owned({"rt1": "default"}), lambda: "e")

    async def scenario() -> None:
        gid = str(uuid.uuid4())
        await grants.handlers()["grant.create"](create_command(gid))
        assert grants.expires_at(gid) == clock.now_ms() + 30 * 60 * 1000
        clock.advance(30 * 60 - 0.001)
        assert grants.expire_due() == 0
        clock.advance(0.001)
        assert grants.expire_due() == 1
        assert grants.open_ids() == []
        with pytest.raises(CommandError) as caught:
            await grants.handlers()["grant.bind"](
                {"payload": {"grantId": gid, "session": {"runtimeId": "rt1", "storedId": "s1"}}}
            )
        assert caught.value.code == "runner_grant_expired"
        await grants.dispose_all()

    asyncio.run(scenario())


def test_the_bearer_is_not_in_reprs() -> None:
    _, grant = open_grant(FakeHub())
    assert BEARER not in repr(grant)
    assert BEARER not in repr(grant.tools)
    assert canonical_json(grant.tools.listing()).find(BEARER.encode()) == -1


def test_an_epoch_change_on_a_tool_post_tells_the_agent_without_blocking_the_call() -> None:
    hub = FakeHub(HubError(409, "runner_epoch_changed", "the connection state changed; poll again"))
    told: list[str] = []

    async def on_hub_error(exc: HubError) -> None:
        told.append(exc.code)
        await grants.dispose_all()  # what the agent's local disconnect does

    grants = NoSocketGrants(
        config(), hub, lambda: None, ManualClock(), Owned({"rt1": "default"}), lambda: "e", on_hub_error=on_hub_error
    )

    async def scenario() -> dict[str, Any]:
        gid = str(uuid.uuid4())
        await grants.handlers()["grant.create"](create_command(gid))
        grant = grants._grants[gid]
        answer = await grant.tools.call(body(opaque_tool_id(grant.bearer, "form_team"), {}, "c"))
        await asyncio.sleep(0.01)
        await grants.dispose_all()
        return answer

    assert error_code(asyncio.run(scenario())) == "runner_epoch_changed"
    assert told == ["runner_epoch_changed"]
    assert grants.open_ids() == []


def test_a_call_under_another_epoch_is_refused() -> None:
    hub = FakeHub()
    epoch = ["e1"]
    grants = NoSocketGrants(config(), hub, lambda: None, ManualClock(), Owned({"rt1": "default"}), lambda: epoch[0])

    async def scenario() -> dict[str, Any]:
        gid = str(uuid.uuid4())
        await grants.handlers()["grant.create"](create_command(gid))
        grant = grants._grants[gid]
        epoch[0] = "e2"
        answer = await grant.tools.call(body(opaque_tool_id(grant.bearer, "form_team"), {}, "c"))
        await grants.dispose_all()
        return answer

    assert error_code(asyncio.run(scenario())) == "runner_grant_expired"
    assert hub.posts == []
